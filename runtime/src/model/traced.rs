//! The spans of a traced request inside one model (see [`crate::trace`]):
//! the model's span, with Triton's attributes and events, and its `queue`
//! and `compute` spans, recorded from the scheduler's [`Timing`] once the
//! request is answered (the scheduler's threads never touch a span).

use opentelemetry::KeyValue;

use super::Model;
use crate::error::Error;
use crate::scheduler::Timing;
use crate::scheduler::policy::RequestOptions;
use crate::tensor::Tensor;
use crate::trace::Span;

/// The span of `model` under `parent` for a request with `options` and
/// `inputs` (its batch size is their first dimension when the model
/// batches, else 1), started now.
pub(super) fn model_span(parent: &Span, model: &Model, options: &RequestOptions, inputs: &[Tensor]) -> Span {
    let batching = model.signature.max_batch_size > 0;
    let batch_size = inputs.first().and_then(|t| t.shape.first().copied()).filter(|_| batching).unwrap_or(1);
    let mut attributes = vec![
        KeyValue::new("model_name", model.name.clone()),
        KeyValue::new("model_version", model.version as i64),
        KeyValue::new("batch_size", batch_size),
    ];
    if let Some(id) = &options.request_id {
        attributes.push(KeyValue::new("request_id", id.clone()));
    }
    let span = parent.child(model.name.clone(), attributes);
    span.event("REQUEST_START");
    span
}

/// Records where a request's time went in the scheduler, as children of
/// `span`: `queue` up to the execution's start, then `compute` with
/// `compute_input`, `compute_infer` and `compute_output` (Triton's
/// phases), and Triton's events on both. Anchored at the wall-clock time
/// the execution began, so two executions' spans never seem to overlap
/// when they did not.
pub(super) fn scheduled(span: &Span, timing: &Timing) {
    let submitted = timing.started.checked_sub(timing.queue).unwrap_or(timing.started);
    span.event_at("QUEUE_START", submitted);
    span.record("queue", submitted, timing.queue);
    let phases = [
        ("compute_input", timing.compute.input),
        ("compute_infer", timing.compute.infer),
        ("compute_output", timing.compute.output),
    ];
    let start = submitted + timing.queue;
    let compute = span.child_at("compute", start, Vec::new());
    compute.event_at("COMPUTE_START", start);
    let mut at = start;
    for (name, length) in phases {
        compute.record(name, at, length);
        at += length;
        match name {
            "compute_input" => compute.event_at("COMPUTE_INPUT_END", at),
            "compute_infer" => compute.event_at("COMPUTE_OUTPUT_START", at),
            _ => compute.event_at("COMPUTE_END", at),
        }
    }
    compute.end_at(at);
}

/// Ends `span` now, failed with the error's message when `result` is one.
pub(super) fn end<T>(span: &Span, result: &Result<T, Error>) {
    if let Err(e) = result {
        span.fail(&e.to_string());
    }
    span.event("REQUEST_END");
    span.end();
}

/// Ends the span of one plugin stage (`preprocess`, `postprocess`), failed
/// when `result` is an error.
pub(super) fn end_stage<T, E: std::fmt::Display>(span: &Span, result: &Result<T, E>) {
    if let Err(e) = result {
        span.fail(&e.to_string());
    }
    span.end();
}
