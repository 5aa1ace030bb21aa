//! What a tracing backend sees of a run: the span it executes in, tagged with its metadata.

use opentelemetry::{KeyValue, Value as Attribute};
use serde_json::Value;
use spindle_storage::{JsonObject, Run};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The span a run executes in. Each key of the run's metadata becomes the attribute
/// `trace.metadata.<key>`, as LangGraph Platform tags a run's trace, so runs can be found by
/// their metadata in the operator's tracing backend (exported when the binary is given
/// `OTEL_EXPORTER_OTLP_ENDPOINT`). `tracing` fields are fixed when a span is declared, so the
/// attributes go on the span's OpenTelemetry side; without an exporter they cost nothing.
pub fn run_span(run: &Run) -> Span {
    let span = tracing::info_span!(
        "run",
        run_id = %run.run_id,
        thread_id = %run.thread_id,
        assistant_id = %run.assistant_id,
        attempt = run.attempt
    );
    tag_with_metadata(&span, &run.metadata);
    span
}

/// Sets `trace.metadata.<key>` on `span` for each key of a run's metadata.
pub fn tag_with_metadata(span: &Span, metadata: &JsonObject) {
    for attribute in metadata_attributes(metadata) {
        span.set_attribute(attribute.key, attribute.value);
    }
}

/// `trace.metadata.<key>` for each key with a value. The interface keeps run metadata to
/// primitives; a null has no attribute form and is left out.
fn metadata_attributes(metadata: &JsonObject) -> impl Iterator<Item = KeyValue> + '_ {
    metadata.iter().filter_map(|(key, value)| {
        let value = match value {
            Value::Null => return None,
            Value::Bool(b) => Attribute::Bool(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Attribute::I64(i),
                None => Attribute::F64(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => Attribute::String(s.clone().into()),
            other => Attribute::String(other.to_string().into()),
        };
        Some(KeyValue::new(format!("trace.metadata.{key}"), value))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TracerProvider;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use serde_json::json;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn each_metadata_key_is_an_attribute_of_the_run_span() {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let metadata = json!({"user": "ada", "turn": 3, "score": 0.5, "vip": true, "none": null});
        let Value::Object(metadata) = metadata else {
            unreachable!()
        };

        tracing::subscriber::with_default(subscriber, || {
            tag_with_metadata(&tracing::info_span!("run"), &metadata);
        });

        let spans = exporter.get_finished_spans().unwrap();
        assert_eq!(spans.len(), 1);
        let attribute = |key: &str| {
            spans[0]
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == key)
                .map(|kv| kv.value.clone())
        };
        assert_eq!(attribute("trace.metadata.user"), Some("ada".into()));
        assert_eq!(attribute("trace.metadata.turn"), Some(3i64.into()));
        assert_eq!(attribute("trace.metadata.score"), Some(0.5f64.into()));
        assert_eq!(attribute("trace.metadata.vip"), Some(true.into()));
        assert_eq!(attribute("trace.metadata.none"), None);
    }
}
