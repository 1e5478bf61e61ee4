//! A Prometheus endpoint for tickbox's metrics (feature `prometheus`).

use crate::error::{Error, Result};
use crate::metrics::LATENCY_BUCKETS;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::net::SocketAddr;

/// A running Prometheus endpoint, installed as the process's metrics
/// recorder by [`install_prometheus`].
#[derive(Clone)]
pub struct PrometheusExporter {
    handle: PrometheusHandle,
    addr: SocketAddr,
}

impl std::fmt::Debug for PrometheusExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrometheusExporter")
            .field("addr", &self.addr)
            .finish()
    }
}

impl PrometheusExporter {
    /// The address the endpoint listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The exposition text the endpoint serves now.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

/// Installs a Prometheus recorder as the process's [`metrics`] recorder and
/// serves its exposition over HTTP at `addr` (any path, e.g.
/// `http://HOST:PORT/metrics`). Durations (`*_seconds`) are histograms with
/// buckets from 0.5 ms to 10 s.
///
/// Call it from within the actix (or tokio) runtime, before starting modules:
/// modules register their metrics when they start. Fails if the address
/// cannot be bound or another recorder is installed.
pub fn install_prometheus(addr: SocketAddr) -> Result<PrometheusExporter> {
    let bad =
        |e: &dyn std::fmt::Display| Error::Config(format!("prometheus endpoint at {addr}: {e}"));
    let (recorder, exporter) = PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS)
        .map_err(|e| bad(&e))?
        .build()
        .map_err(|e| bad(&e))?;
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .map_err(|_| bad(&"another metrics recorder is already installed"))?;
    crate::metrics::describe_to_recorder();
    tokio::spawn(async move {
        if let Err(error) = exporter.await {
            tracing::error!(?error, "the Prometheus endpoint stopped");
        }
    });
    tracing::info!(%addr, "serving Prometheus metrics");
    Ok(PrometheusExporter { handle, addr })
}
