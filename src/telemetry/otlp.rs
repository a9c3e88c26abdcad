//! Traces over OTLP/HTTP with protobuf bodies. The SDK's batch processor runs on a thread of
//! its own, outside the runtime; each export is handed to the runtime that started envlens and
//! sent with hyper, so no second HTTP stack is built.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::TracerProvider;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::registry::LookupSpan;

/// An export that takes longer is dropped, and counted by the SDK as failed.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// A collector's answer is a small status message; anything larger is not read.
const MAX_ANSWER: usize = 64 * 1024;

type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

#[derive(Debug, Clone)]
struct Sender {
    client: Client<Https, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for Sender {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let exchange = async move {
            let response = client.request(request.map(Full::new)).await?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_ANSWER).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        let task = self
            .runtime
            .spawn(async move { tokio::time::timeout(EXPORT_TIMEOUT, exchange).await });
        match task.await? {
            Ok(answer) => answer,
            Err(_) => Err("the OTLP collector did not answer in time".into()),
        }
    }
}

/// The tracing layer that exports spans to `endpoint` (the full URL, e.g.
/// `http://collector:4318/v1/traces`), and its provider.
pub fn layer<S>(
    endpoint: &str,
) -> anyhow::Result<(
    tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>,
    SdkTracerProvider,
)>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()?
        .https_or_http()
        .enable_http1()
        .build();
    let sender = Sender {
        client: Client::builder(TokioExecutor::new()).build(connector),
        runtime: tokio::runtime::Handle::try_current()
            .map_err(|_| anyhow::anyhow!("traces are exported from within the runtime"))?,
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(endpoint)
        .with_timeout(EXPORT_TIMEOUT)
        .with_http_client(sender)
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name("envlens").build())
        .build();
    let tracer = provider.tracer("envlens");
    Ok((tracing_opentelemetry::layer().with_tracer(tracer), provider))
}
