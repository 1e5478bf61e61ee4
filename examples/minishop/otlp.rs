//! `--otlp-endpoint URL` (feature `opentelemetry`): the spans of this
//! process — each order's `place_order`, and tickbox's `create`, `send` and
//! `process` spans — exported over OTLP/HTTP (protobuf) to a collector, so
//! that one order's spans form one trace across the processes of a split
//! shop (see "Tracing across modules" in the README).
//!
//! The exporter posts through a small HTTP/1.1 client of its own (plain
//! TCP, one request per connection): an example needs no more, and no TLS.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use std::future::Future;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::pin::Pin;
use std::time::Duration;
use tracing::Subscriber;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The exporter, while this process runs: [`Exporting::finish`] sends
/// what is left before the process ends.
pub struct Exporting(SdkTracerProvider);

impl Exporting {
    /// Exports the spans still waiting, then stops the exporter.
    pub fn finish(self) {
        if let Err(error) = self.0.shutdown() {
            tracing::warn!(%error, "the last spans could not be exported");
        }
    }
}

/// The layer that hands this process's spans (minishop's and tickbox's, at
/// info level) to an exporter posting them to `endpoint`, the collector's
/// OTLP/HTTP traces URL (`http://HOST:4318/v1/traces`), as service
/// `service`.
pub fn layer<S>(endpoint: &str, service: String) -> Result<(impl Layer<S>, Exporting), String>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(PlainHttp)
        .with_endpoint(endpoint)
        .with_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| format!("--otlp-endpoint {endpoint}: {e}"))?;
    // Sent every 200 ms: a process killed loses at most that much.
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_scheduled_delay(Duration::from_millis(200))
                .build(),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service)
                .build(),
        )
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("minishop"))
        .with_filter(
            Targets::new()
                .with_target("tickbox", tracing::Level::INFO)
                .with_target("minishop", tracing::Level::INFO),
        );
    Ok((layer, Exporting(provider)))
}

/// An HTTP/1.1 client for the exporter's POSTs: one connection per request,
/// the response's status read back.
#[derive(Debug)]
struct PlainHttp;

impl HttpClient for PlainHttp {
    fn send_bytes<'life0, 'async_trait>(
        &'life0 self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        // The SDK exports from a thread of its own: a blocking socket is
        // fine there.
        Box::pin(async move { post(&request) })
    }
}

/// Sends `request` and reads the response's status line and body.
fn post(request: &Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
    let uri = request.uri();
    let host = uri.host().ok_or("the OTLP endpoint has no host")?;
    let port = uri.port_u16().unwrap_or(80);
    if uri.scheme_str() != Some("http") {
        return Err("the OTLP endpoint must be http:// (this client speaks no TLS)".into());
    }
    let address = (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or("the OTLP endpoint's host has no address")?;
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut head = format!(
        "{} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {}\r\nConnection: close\r\n",
        request.method(),
        request.body().len()
    );
    for (name, value) in request.headers() {
        head.push_str(&format!("{name}: {}\r\n", value.to_str()?));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(request.body())?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let text = String::from_utf8_lossy(&answer);
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or("the collector's answer is not HTTP")?;
    let body = match answer.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) => Bytes::copy_from_slice(&answer[at + 4..]),
        None => Bytes::new(),
    };
    Ok(Response::builder().status(status).body(body)?)
}
