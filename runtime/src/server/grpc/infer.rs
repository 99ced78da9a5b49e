//! One `ModelInferRequest` through the service core, for `ModelInfer` and
//! for each request of a `ModelStreamInfer` stream: decoded by the
//! protocol's gRPC codec, traced when the trace settings say so.

use opentelemetry::KeyValue;
use tonic::Status;
use tonic::metadata::MetadataMap;

use super::generate::{self, Generation};
use crate::drain::Hold;
use crate::error::Error;
use crate::lifecycle::InferCall;
use crate::protocol::grpc::{self as codec, OutputPlace, proto as pb};
use crate::protocol::shared_memory::Regions;
use crate::scheduler::sequence::Owner;
use crate::server::service::{self, Service};
use crate::trace::{Front, Span};

/// An empty version field means "the server's choice".
pub fn version(v: &str) -> Result<Option<u64>, Error> {
    if v.is_empty() { Ok(None) } else { service::parse_version(v).map(Some) }
}

/// What a call's metadata says about its requests: the W3C trace
/// context, and every entry (a sticky rollout keys on one).
#[derive(Clone, Default)]
pub struct TraceHeaders {
    traceparent: Option<String>,
    tracestate: Option<String>,
    metadata: MetadataMap,
}

impl TraceHeaders {
    /// The trace context of a call's `metadata`.
    pub fn of(metadata: &MetadataMap) -> TraceHeaders {
        let get = |key: &str| metadata.get(key).and_then(|v| v.to_str().ok()).map(str::to_owned);
        TraceHeaders { traceparent: get("traceparent"), tracestate: get("tracestate"), metadata: metadata.clone() }
    }
}

/// What a request comes to: its response, or (on a `ModelStreamInfer`
/// stream) the generation it started on a generative model, whose
/// responses follow.
pub enum Outcome {
    Response(pb::ModelInferResponse),
    Generation(Generation),
}

/// Where a request comes from: a `ModelStreamInfer` stream (which owns the
/// sequences it starts, and counts the request in flight until its last
/// response), or `ModelInfer`.
pub enum Caller {
    Stream(Owner, Hold),
    Unary,
}

/// [`infer`] under the request's root span when it is traced: `call` is
/// the method it came on and the call's trace context.
pub async fn traced_infer(
    service: &Service,
    r: pb::ModelInferRequest,
    stream: Caller,
    call: (&'static str, &TraceHeaders),
) -> Result<Outcome, Status> {
    let (method, headers) = call;
    let front = Front::Grpc(method);
    let span = service.start_trace(&r.model_name, front, headers.traceparent.as_deref(), headers.tracestate.as_deref());
    let Some(span) = span else { return infer(service, r, stream, None, headers).await };
    let outcome = |result: &Result<Outcome, Status>| {
        let code = result.as_ref().map_or_else(Status::code, |_| tonic::Code::Ok);
        // OpenTelemetry's gRPC conventions: the codes that fail a server span.
        use tonic::Code as C;
        let fails = matches!(
            code,
            C::Unknown | C::DeadlineExceeded | C::Unimplemented | C::Internal | C::Unavailable | C::DataLoss
        );
        let failure = result.as_ref().err().filter(|_| fails).map(|status| status.message().to_owned());
        (KeyValue::new("rpc.grpc.status_code", code as i64), failure)
    };
    span.run_root(front, infer(service, r, stream, Some(span.clone()), headers), outcome).await
}

/// Runs one `ModelInferRequest` through the service core; `caller` says
/// where it came from; `trace` is its root span, when it is traced;
/// `headers` the call's metadata. A generative model's request starts its
/// generation on a stream and is refused on `ModelInfer` (as Triton refuses
/// a decoupled model there).
async fn infer(
    service: &Service,
    r: pb::ModelInferRequest,
    caller: Caller,
    trace: Option<Span>,
    headers: &TraceHeaders,
) -> Result<Outcome, Status> {
    let header = |key: &str| headers.metadata.get(key).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let named = version(&r.model_version)?;
    let accepted = service.accept(&r.model_name, named, &header).await?;
    // A stream's request stays counted in flight until it is answered.
    let (stream, _counted) = match caller {
        Caller::Stream(_, counted) if accepted.model().generative().is_some() => {
            return Ok(Outcome::Generation(generate::start(service, accepted, r, counted).await?));
        }
        Caller::Unary if accepted.model().generative().is_some() => {
            return Err(Status::invalid_argument(format!(
                "ModelInfer does not serve model '{}': it is decoupled (generative); use ModelStreamInfer",
                r.model_name
            )));
        }
        Caller::Stream(owner, counted) => (Some(owner), Some(counted)),
        Caller::Unary => (None, None),
    };
    let (parameters, inputs, raw, outputs) = (r.parameters, r.inputs, r.raw_input_contents, r.outputs);
    let id = (!r.id.is_empty()).then(|| r.id.clone());
    let inferred = accepted
        .infer(trace, |m| {
            let decode = |reads: &dyn Regions| codec::decode(&m.name, &parameters, inputs, raw, &outputs, reads);
            let (decoded, regions) = service.shared_memory.decode(decode, |d| &d.head.outputs)?;
            let sequence = decoded.head.parameters.sequence.clone();
            Ok((InferCall::new(decoded.tensors, &decoded.head, id, stream), (regions, sequence)))
        })
        .await?;
    let m = inferred.model;
    let (regions, sequence) = inferred.request;
    let outputs = inferred
        .outputs
        .into_iter()
        .map(|t| {
            let place = if regions.write(&t)? { OutputPlace::SharedMemory } else { OutputPlace::Raw };
            Ok((t, place))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(Outcome::Response(codec::encode((&m.name, m.version), r.id, sequence.as_ref(), outputs)))
}
