//! Logs to stderr and, when the operator asks for it through the standard OpenTelemetry
//! variables, traces to an OTLP collector.
//!
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) turns the export on;
//! `OTEL_EXPORTER_OTLP_PROTOCOL` picks `http/protobuf` (the default) or `http/json`;
//! `OTEL_SERVICE_NAME` names the service (default `spindle`). The exporter reads its other
//! standard variables (headers, timeout) itself.

use anyhow::{Context, Result};
use opentelemetry::trace::TracerProvider;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Keeps the trace pipeline alive; dropping it flushes the spans not exported yet.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(err) = provider.shutdown() {
                eprintln!("warning: cannot flush the last traces: {err}");
            }
        }
    }
}

pub fn init() -> Result<Telemetry> {
    let filter = EnvFilter::try_from_env("SPINDLE_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    // Logs go to stderr (stdout carries the start-up banner), coloured only on a terminal.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let provider = otlp_provider()?;
    let traces = provider.as_ref().map(|provider| {
        // Spans at info and above: requests and runs, not the engine's inner steps.
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("spindle"))
            .with_filter(EnvFilter::new("info,sqlx=off,hyper=off,reqwest=off"))
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .init();
    Ok(Telemetry { provider })
}

fn otlp_provider() -> Result<Option<SdkTracerProvider>> {
    let configured = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
    if !configured {
        return Ok(None);
    }
    let protocol = match std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").as_deref() {
        Ok("http/json") => Protocol::HttpJson,
        Ok("http/protobuf") | Err(_) => Protocol::HttpBinary,
        Ok(other) => anyhow::bail!(
            "OTEL_EXPORTER_OTLP_PROTOCOL={other} is not supported: use http/protobuf or http/json"
        ),
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .build()
        .context("cannot set up the OTLP trace exporter")?;
    let service =
        std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| env!("CARGO_PKG_NAME").to_owned());
    Ok(Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name(service).build())
            .build(),
    ))
}
