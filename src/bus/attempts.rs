//! Attempts along a route: retried with backoff until the route takes the
//! message, or given up on as a dead letter; and waiting that ends when the
//! bus stops.

use crate::bus::core::BusCore;
use crate::bus::route::Route;
use crate::error::outcome::FailureKind;
use crate::message::Envelope;
use crate::module::dead_letters;
use crate::module::handle::ModuleHandle;
use crate::store::backend::Backend;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

/// The longest wait before a keyed message that came before an earlier
/// message of its key tries again.
const EARLY_AGAIN_WITHIN: Duration = Duration::from_secs(1);

/// How delivering a message to one handler ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RouteEnd {
    /// Handled, or found a duplicate.
    Handled,
    /// Given up on and recorded as a dead letter.
    DeadLettered,
    /// The bus stopped first.
    Stopped,
}

/// Delivers to one handler until it has handled the message or found it a
/// duplicate, retrying failures with backoff, or gives up and records a dead
/// letter.
pub(crate) async fn deliver_to_route<B: Backend>(
    bus: &BusCore<B>,
    route: &Route<B>,
    source: &ModuleHandle<B>,
    envelope: &Arc<Envelope>,
) -> RouteEnd {
    let policy = route.retry(&bus.config);
    // A keyed message waits for the earlier ones of its key on this route,
    // and holds its key while it retries; one without a key takes no turn.
    let lane = match envelope.keyed {
        Some(_) => route.lane(),
        None => String::new(),
    };
    // The keyed paths' waits are boxed: the future of every delivery,
    // keyed or not, would otherwise make room for the largest of them.
    let mut turn = match envelope.keyed {
        Some(_) => {
            match Box::pin(until_stopped(&bus.stop, bus.lanes.turn(&lane, envelope))).await {
                Some(turn) => turn,
                None => return RouteEnd::Stopped,
            }
        }
        None => None,
    };
    let mut attempt = 0;
    let mut failures = 0;
    let mut early = 0;
    loop {
        attempt += 1;
        // Waiting for a slot stops with the bus; a running attempt is let
        // finish. Some attempts need no slot (`Route::takes_slot`).
        let slot = if route.takes_slot(attempt) {
            match until_stopped(&bus.stop, bus.permits.acquire()).await {
                Some(slot) => Some(slot),
                None => return RouteEnd::Stopped,
            }
        } else {
            None
        };
        let outcome = route
            .deliver(source.name(), envelope.clone(), attempt)
            .await;
        drop(slot);
        let error = match outcome {
            Ok(_) => return RouteEnd::Handled,
            Err(error) => error,
        };
        if error.kind == FailureKind::Early {
            // An earlier message of the key is not done with yet by this
            // handler: it is on its way (claimed by another process, or
            // still in the broker's queue) or retrying elsewhere. Keep the
            // key (the later ones would only fail the same way) and try
            // again when that message joins this lane — then it goes first
            // — or after a while, in case it is handled elsewhere. Not an
            // attempt: the handler did not run.
            early += 1;
            attempt -= 1;
            let delay = policy.delay(early).min(EARLY_AGAIN_WITHIN);
            let earlier_came = async {
                match &turn {
                    Some(turn) => turn.earlier_came().await,
                    None => std::future::pending().await,
                }
            };
            let Some(came) = Box::pin(until_stopped(&bus.stop, async {
                tokio::select! {
                    () = sleep(delay) => false,
                    () = earlier_came => true,
                }
            }))
            .await
            else {
                return RouteEnd::Stopped;
            };
            if came {
                drop(turn);
                let Some(again) =
                    Box::pin(until_stopped(&bus.stop, bus.lanes.turn(&lane, envelope))).await
                else {
                    return RouteEnd::Stopped;
                };
                turn = again;
            }
            continue;
        }
        if error.counts_as_attempt() {
            failures += 1;
        }
        let exhausted = policy.max_attempts.is_some_and(|max| failures >= max);
        if !error.is_retryable() || exhausted {
            let reason = format!("after {attempt} attempt(s): {error}");
            let module = route.dead_letters(source);
            let recorded = record_dead_letter(
                bus,
                module,
                envelope,
                route.name(),
                attempt,
                &reason,
                error.parked_behind,
            )
            .await;
            return if recorded {
                RouteEnd::DeadLettered
            } else {
                RouteEnd::Stopped
            };
        }
        // A failure of the database or the broker (an outage) says nothing
        // about the message: it is tried again at least every few seconds,
        // so that delivery resumes soon after the outage ends.
        let delay = if error.counts_as_attempt() {
            policy.delay(attempt)
        } else {
            policy.delay(attempt).min(OUTAGE_RETRY_MAX)
        };
        bus.note_retry(
            envelope.id,
            format!(
                "handler `{}` of module `{}` failed attempt {attempt} ({error}); next attempt in {delay:?}",
                route.name(),
                route.module_name()
            ),
        );
        if until_stopped(&bus.stop, sleep(delay)).await.is_none() {
            return RouteEnd::Stopped;
        }
    }
}

/// The longest wait before trying a delivery again after a failure that
/// uses up no attempt (a lost connection, a call past its deadline, an
/// unreachable broker): each try is bounded by its deadlines, so trying
/// every few seconds costs little, and delivery resumes within this long
/// of an outage's end.
const OUTAGE_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Records a dead letter, retrying while the database fails. False if the
/// bus stopped first.
pub(crate) async fn record_dead_letter<B: Backend>(
    bus: &BusCore<B>,
    module: &ModuleHandle<B>,
    envelope: &Envelope,
    handler: &str,
    attempts: u32,
    reason: &str,
    parked_behind: Option<uuid::Uuid>,
) -> bool {
    // Boxed: the work behind it is a large future, and every delivery's
    // future would otherwise make room for it (3,232 bytes for one route's
    // attempts, allocated per message and copied), though few messages
    // are ever dead-lettered.
    Box::pin(until_done(bus, module, "recording a dead letter", || {
        dead_letters::record(module, envelope, handler, attempts, reason, parked_behind)
    }))
    .await
}

/// Runs `work` until it succeeds, with the bus's backoff between tries.
/// False if the bus stopped first.
pub(crate) async fn until_done<B: Backend, F, Fut>(
    bus: &BusCore<B>,
    module: &ModuleHandle<B>,
    what: &str,
    mut work: F,
) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = crate::error::Result<()>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match work().await {
            Ok(()) => return true,
            Err(error) => {
                tracing::warn!(module = %module.name(), %error, "{what} failed; will retry");
            }
        }
        let delay = bus.config.retry.delay(tries);
        if until_stopped(&bus.stop, sleep(delay)).await.is_none() {
            return false;
        }
    }
}

/// Runs `work` unless `stop` is cancelled first (or already was). `work`
/// is polled first: on the delivery path it is most often ready at once (a
/// free slot), and then no waiter is registered on the token.
pub(crate) async fn until_stopped<T>(
    stop: &CancellationToken,
    work: impl Future<Output = T>,
) -> Option<T> {
    if stop.is_cancelled() {
        return None;
    }
    tokio::select! {
        biased;
        value = work => Some(value),
        () = stop.cancelled() => None,
    }
}
