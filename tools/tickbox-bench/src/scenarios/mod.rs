//! The scenarios: what one command measures.

mod backlog;
mod big_inbox;
mod latency;
mod scheduled;
mod throughput;

use crate::backend::BenchBackend;
use crate::cli::{Args, Scenario};
use crate::place::Place;
use crate::report::Json;
use crate::Res;

/// Runs the scenario `args` chose on backend `B`; returns its JSON object.
pub(crate) async fn run<B: BenchBackend>(place: &Place, args: &Args) -> Res<Json> {
    match args.scenario {
        Scenario::Throughput => throughput::run::<B>(place, args).await,
        Scenario::Latency => latency::run::<B>(place, args).await,
        Scenario::Backlog => backlog::run::<B>(place, args).await,
        Scenario::BigInbox => big_inbox::run::<B>(place, args).await,
        Scenario::Scheduled => scheduled::run::<B>(place, args).await,
    }
}
