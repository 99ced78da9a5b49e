//! Request tracing with OpenTelemetry, exported over OTLP (HTTP/protobuf
//! or gRPC): Triton's `--trace-config mode=opentelemetry` and its trace
//! extension (`docs/user_guide/trace.md`, `docs/protocol/extension_trace.md`).
//!
//! A traced request is a tree of spans, in Triton's shape: a root span
//! `InferRequest` for the HTTP or gRPC request (continuing the W3C
//! `traceparent` it carries, if any), one span per model it reaches, named
//! after the model, and under each model's span its `queue` and `compute`
//! (with `compute_input`, `compute_infer` and `compute_output`), its
//! plugin's `preprocess` and `postprocess`, and the model spans of the
//! ensemble steps and composed calls it makes. Model spans carry Triton's
//! events (`REQUEST_START`, `QUEUE_START`, `REQUEST_END`; `COMPUTE_START`
//! ... `COMPUTE_END` on `compute`) and attributes (`model_name`,
//! `model_version`, `request_id`, `batch_size`).
//!
//! Which requests are traced: none while the level is OFF (the default);
//! otherwise every request whose `traceparent` is sampled, none whose
//! `traceparent` is not, and one in every `rate` of the rest, until
//! `count` of them were traced. A request not traced carries no span: the
//! cost of tracing off is one atomic load per request.

mod settings;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider};
use parking_lot::Mutex;
use serde_json::{Value, json};

pub use settings::{Export, Level, Overrides, Protocol, Settings, TraceConfig, Update};

/// The service name spans carry unless `resource=service.name=...` or
/// `OTEL_SERVICE_NAME` names another.
const SERVICE_NAME: &str = "plinth";

/// Where a traced request came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Front {
    /// An HTTP request (`POST .../infer` or `.../predict`).
    Http,
    /// A gRPC call of this method of `inference.GRPCInferenceService`.
    Grpc(&'static str),
}

/// The server's tracing: the settings in force and the exporter.
pub struct Tracing {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    scopes: Mutex<Scopes>,
    /// Whether any scope's level is other than OFF: the only thing a
    /// request looks at while tracing is off.
    on: AtomicBool,
}

/// The global settings and each model's overrides, with the counts that
/// `rate` and `count` apply to.
struct Scopes {
    global: Scope,
    models: HashMap<String, (Overrides, Scope)>,
}

/// The sampling state of one scope.
struct Scope {
    settings: Settings,
    /// Requests seen without a `traceparent`, for `rate`.
    seen: u64,
    /// Requests still to trace by rate: `count`, counted down (-1: no
    /// limit).
    remaining: i64,
}

impl Scope {
    fn new(settings: Settings) -> Scope {
        Scope { settings, seen: 0, remaining: settings.count }
    }

    /// Whether the next request without a `traceparent` is traced.
    fn sample(&mut self) -> bool {
        if self.settings.level == Level::Off || self.settings.rate == 0 || self.remaining == 0 {
            return false;
        }
        self.seen += 1;
        if !self.seen.is_multiple_of(self.settings.rate) {
            return false;
        }
        if self.remaining > 0 {
            self.remaining -= 1;
        }
        true
    }
}

impl Tracing {
    /// Tracing as `config` says, exporting to its collector. Must be called
    /// inside the server's tokio runtime (the gRPC exporter's connection
    /// lives there). Nothing is sent before a span ends.
    ///
    /// # Errors
    /// A message when the exporter cannot be built (a malformed URL).
    pub fn new(config: &TraceConfig) -> Result<Tracing, String> {
        let export = &config.export;
        let builder = opentelemetry_otlp::SpanExporter::builder();
        let exporter = match export.protocol {
            Protocol::HttpProtobuf => builder.with_http().with_endpoint(export.endpoint()).build(),
            Protocol::Grpc => builder.with_tonic().with_endpoint(export.endpoint()).build(),
        }
        .map_err(|e| format!("--trace-config opentelemetry,url={}: {e}", export.endpoint()))?;
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(export.max_queue_size)
            .with_scheduled_delay(export.schedule_delay)
            .with_max_export_batch_size(export.max_export_batch_size)
            .build();
        let processor = BatchSpanProcessor::builder(exporter).with_batch_config(batches).build();
        let provider =
            SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource(export)).build();
        let tracer = provider.tracer("plinth");
        let tracing = Tracing {
            tracer,
            provider,
            scopes: Mutex::new(Scopes { global: Scope::new(config.settings), models: HashMap::new() }),
            on: AtomicBool::new(false),
        };
        tracing.refresh(&tracing.lock());
        Ok(tracing)
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Scopes> {
        self.scopes.lock()
    }

    /// Recomputes the fast-path flag after a settings change.
    fn refresh(&self, scopes: &Scopes) {
        let on = scopes.global.settings.level != Level::Off
            || scopes.models.values().any(|(_, scope)| scope.settings.level != Level::Off);
        self.on.store(on, Ordering::Release);
    }

    /// Whether any request may be traced now (some level is not OFF).
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// The root span of a request for `model` that came in through
    /// `front`, when the request is traced; `traceparent` and `tracestate`
    /// are the W3C headers (or gRPC metadata) it carries.
    pub fn start(
        &self,
        model: &str,
        front: Front,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> Option<Span> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        let parent = traceparent.map(|p| remote_parent(p, tracestate));
        let remote = parent.as_ref().map(|cx| cx.span().span_context().clone()).filter(|c| c.is_valid());
        {
            let mut scopes = self.lock();
            let scopes = &mut *scopes;
            let scope = scopes.models.get_mut(model).map_or(&mut scopes.global, |(_, scope)| scope);
            let traced = match &remote {
                Some(_) if scope.settings.level == Level::Off => false,
                Some(context) => context.is_sampled(),
                None => scope.sample(),
            };
            if !traced {
                return None;
            }
        }
        let parent = parent.filter(|_| remote.is_some()).unwrap_or_default();
        let mut attributes = vec![KeyValue::new("model_name", model.to_owned())];
        let event = match front {
            Front::Http => {
                attributes.push(KeyValue::new("http.request.method", "POST"));
                "HTTP_RECV_START"
            }
            Front::Grpc(method) => {
                attributes.push(KeyValue::new("rpc.system", "grpc"));
                attributes.push(KeyValue::new("rpc.service", "inference.GRPCInferenceService"));
                attributes.push(KeyValue::new("rpc.method", method));
                "GRPC_WAITREAD_END"
            }
        };
        let builder = self.tracer.span_builder("InferRequest").with_kind(SpanKind::Server).with_attributes(attributes);
        let span = self.tracer.build_with_context(builder, &parent);
        let root = Span { cx: parent.with_span(span), tracer: self.tracer.clone() };
        root.event(event);
        Some(root)
    }

    /// The trace extension's settings: the server's, or those in force for
    /// `model` (Triton's names; values as strings, the level as a list).
    pub fn settings(&self, model: Option<&str>) -> Value {
        let scopes = self.lock();
        let settings = match model.and_then(|m| scopes.models.get(m)) {
            Some((overrides, _)) => overrides.over(scopes.global.settings),
            None => scopes.global.settings,
        };
        json!({
            "trace_level": [settings.level.name()],
            "trace_rate": settings.rate.to_string(),
            "trace_count": settings.count.to_string(),
            "trace_mode": "opentelemetry",
        })
    }

    /// Changes the server's settings, or `model`'s (whose settings not
    /// given follow the server's), and returns those now in force. An empty
    /// update of a model removes its settings.
    ///
    /// # Errors
    /// A message naming the setting, as [`settings::update`] gives it.
    pub fn update(&self, model: Option<&str>, update: &Update) -> Result<Value, String> {
        {
            let mut scopes = self.lock();
            let global = scopes.global.settings;
            match model {
                None => {
                    let mut all =
                        Overrides { level: Some(global.level), rate: Some(global.rate), count: Some(global.count) };
                    settings::update(&mut all, update, true)?;
                    scopes.global = Scope::new(all.over(global));
                    // A model's settings not its own follow the new ones.
                    let global = scopes.global.settings;
                    for (overrides, scope) in scopes.models.values_mut() {
                        *scope = Scope::new(overrides.over(global));
                    }
                }
                Some(model) if update.is_empty() => {
                    scopes.models.remove(model);
                }
                Some(model) => {
                    let mut overrides = scopes.models.get(model).map(|(o, _)| *o).unwrap_or_default();
                    settings::update(&mut overrides, update, false)?;
                    scopes.models.insert(model.to_owned(), (overrides, Scope::new(overrides.over(global))));
                }
            }
            self.refresh(&scopes);
        }
        Ok(self.settings(model))
    }

    /// Sends every span that ended and has not been exported yet; called at
    /// shutdown. Blocks until the exporter answered or gave up.
    pub fn flush(&self) {
        if let Err(e) = self.provider.force_flush() {
            tracing::warn!("exporting the last trace spans failed: {e}");
        }
    }
}

/// The span context a W3C `traceparent` (and `tracestate`) header gives,
/// as the parent of a root span; an invalid header gives none.
fn remote_parent(traceparent: &str, tracestate: Option<&str>) -> Context {
    let mut carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    if let Some(state) = tracestate {
        carrier.insert("tracestate".to_owned(), state.to_owned());
    }
    TraceContextPropagator::new().extract(&carrier)
}

/// The resource attributes of every span: `service.name` (`plinth`, or
/// `OTEL_SERVICE_NAME`), `OTEL_RESOURCE_ATTRIBUTES`, and then the
/// `resource=KEY=VALUE` settings, which win.
fn resource(export: &Export) -> opentelemetry_sdk::Resource {
    let named_in_environment = std::env::var_os("OTEL_SERVICE_NAME").is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.contains("service.name="));
    let mut builder = opentelemetry_sdk::Resource::builder();
    if !named_in_environment {
        builder = builder.with_service_name(SERVICE_NAME);
    }
    builder.with_attributes(export.resource.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone()))).build()
}

/// A span of a traced request, ended or still open: what happens inside it
/// becomes its children. Cheap to clone (clones share the span).
#[derive(Clone)]
pub struct Span {
    cx: Context,
    tracer: SdkTracer,
}

impl PartialEq for Span {
    /// The same span (clones of one another).
    fn eq(&self, other: &Span) -> bool {
        self.cx.span().span_context() == other.cx.span().span_context()
    }
}

impl Eq for Span {}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Span({})", self.trace_id())
    }
}

impl Span {
    /// A child span that starts now.
    pub fn child(&self, name: impl Into<Cow<'static, str>>, attributes: Vec<KeyValue>) -> Span {
        self.child_at(name, SystemTime::now(), attributes)
    }

    /// A child span that started at `start`.
    pub fn child_at(&self, name: impl Into<Cow<'static, str>>, start: SystemTime, attributes: Vec<KeyValue>) -> Span {
        let builder = self.tracer.span_builder(name).with_start_time(start).with_attributes(attributes);
        let span = self.tracer.build_with_context(builder, &self.cx);
        Span { cx: self.cx.with_span(span), tracer: self.tracer.clone() }
    }

    /// A child span from `start` for `length`, already ended (an ended span
    /// takes no more events or attributes).
    pub fn record(&self, name: &'static str, start: SystemTime, length: Duration) {
        self.child_at(name, start, Vec::new()).end_at(start + length);
    }

    /// An event (one of Triton's timestamps) now.
    pub fn event(&self, name: &'static str) {
        self.cx.span().add_event(name, Vec::new());
    }

    /// An event at `at`.
    pub fn event_at(&self, name: &'static str, at: SystemTime) {
        self.cx.span().add_event_with_timestamp(name, at, Vec::new());
    }

    /// Sets an attribute.
    pub fn set(&self, attribute: KeyValue) {
        self.cx.span().set_attribute(attribute);
    }

    /// Marks the span failed, with the error's message.
    pub fn fail(&self, message: &str) {
        self.cx.span().set_status(Status::error(message.to_owned()));
    }

    /// Ends the span now.
    pub fn end(&self) {
        self.cx.span().end();
    }

    /// Ends the span at `at`.
    pub fn end_at(&self, at: SystemTime) {
        self.cx.span().end_with_timestamp(at);
    }

    /// Runs `work`, a request under this root span, its log lines carrying
    /// the trace id (`--log-format json`), then ends the span: the status
    /// attribute `outcome` gives for the result (OpenTelemetry's
    /// `http.response.status_code` or `rpc.grpc.status_code`), failed with
    /// its message when the status fails a server span by the front's
    /// conventions, and Triton's closing events.
    pub async fn run_root<T>(
        &self,
        front: Front,
        work: impl Future<Output = T>,
        outcome: impl FnOnce(&T) -> (KeyValue, Option<String>),
    ) -> T {
        use tracing::Instrument;
        let log = tracing::info_span!("request", trace_id = %self.trace_id());
        let result = work.instrument(log).await;
        let (status, failure) = outcome(&result);
        self.set(status);
        if let Some(message) = failure {
            self.fail(&message);
        }
        self.event("INFER_RESPONSE_COMPLETE");
        self.event(match front {
            Front::Http => "HTTP_SEND_START",
            Front::Grpc(_) => "GRPC_SEND_START",
        });
        self.end();
        result
    }

    /// The trace's id, 32 hex digits (as in `traceparent`), for logs.
    pub fn trace_id(&self) -> String {
        self.cx.span().span_context().trace_id().to_string()
    }
}
