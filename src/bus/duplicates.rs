//! Duplicates on purpose: a test hook that delivers a handled message once
//! more, to watch the inbox skip it. Compiled only with the `testing`
//! feature.

use crate::bus::core::BusCore;
use crate::bus::route::Route;
use crate::message::Envelope;
use crate::module::handle::ModuleHandle;
use crate::store::backend::Backend;
use futures_util::future::join_all;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// For demonstrations and tests ([`BusBuilder::duplicate_rate`](crate::BusBuilder::duplicate_rate)):
/// with that probability, delivers the message once more to the handlers
/// among `handled` that handled it (a broker route is no handler: over a
/// broker, each handler's consumer injects its own duplicates). A test
/// hook: only with the `testing` feature.
pub(crate) async fn maybe_inject_duplicate<B: Backend>(
    bus: &BusCore<B>,
    handled: Vec<&Route<B>>,
    source: &ModuleHandle<B>,
    envelope: &Arc<Envelope>,
) {
    let handlers: Vec<&Route<B>> = handled.into_iter().filter(|r| r.is_handler()).collect();
    let rate = bus
        .config
        .duplicate_rate
        .max(source.outbox().trackers.duplicate_rate());
    if handlers.is_empty() || rate <= 0.0 || fastrand::f64() >= rate {
        return;
    }
    bus.duplicates_injected.fetch_add(1, Relaxed);
    join_all(
        handlers
            .into_iter()
            .map(|route| route.deliver(source.name(), envelope.clone(), 1)),
    )
    .await;
}
