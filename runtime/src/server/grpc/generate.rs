//! A generative model on `ModelStreamInfer`, with the tensor interface of
//! Triton's vLLM backend (`triton-inference-server/vllm_backend`), so that
//! tritonclient's LLM examples run unchanged: the inputs `text_input`
//! (BYTES, one element: the prompt), `stream` and `exclude_input_in_output`
//! (BOOL, one element each) and `sampling_parameters` (BYTES, one element:
//! a JSON object of vLLM's sampling parameters), the output `text_output`
//! (BYTES `[1]`). A streamed request is answered with each piece of text as
//! it is generated; one that is not, with the whole text once. As Triton
//! does for a decoupled model, every response carries the parameter
//! `triton_final_response`, and a request with
//! `triton_enable_empty_final_response` gets an empty last response that
//! says the stream of the request is over.

use tokio::sync::mpsc::Sender;
use tonic::Status;

use crate::drain::Hold;
use crate::error::Error;
use crate::generate::text::{self, TextEvent, TextStream};
use crate::lifecycle::Accepted;
use crate::plugin::Prompt;
use crate::protocol::grpc::proto::infer_parameter::ParameterChoice;
use crate::protocol::grpc::proto::model_infer_response::InferOutputTensor;
use crate::protocol::grpc::{self as codec, proto as pb};
use crate::server::generation;
use crate::server::service::Service;
use crate::tensor::{DataType, Tensor, bytes_elements, push_bytes_element};

/// The one output of a generative model.
const TEXT_OUTPUT: &str = "text_output";

/// A request's generation, started: what [`respond`] streams back.
pub struct Generation {
    /// Keeps the model routed and the request counted in flight until the
    /// last response is sent.
    accepted: Accepted,
    _counted: Hold,
    stream: TextStream,
    id: String,
    streaming: bool,
    /// The prompt, sent before the text of a request that is not streamed
    /// unless it asked for `exclude_input_in_output`.
    prefix: String,
    empty_final: bool,
}

/// The one element of a BYTES or BOOL input.
fn one_element(t: &Tensor, datatype: DataType) -> Result<&[u8], Error> {
    let bad = || {
        Error::InvalidArgument(format!(
            "input '{}' must be {datatype} with one element, got {} with shape {:?}",
            t.name, t.datatype, t.shape
        ))
    };
    if t.datatype != datatype {
        return Err(bad());
    }
    let elements = match datatype {
        DataType::Bytes => bytes_elements(&t.data).unwrap_or_default(),
        _ => t.data.chunks(1).collect(),
    };
    match elements[..] {
        [element] => Ok(element),
        _ => Err(bad()),
    }
}

fn text(t: &Tensor) -> Result<&str, Error> {
    std::str::from_utf8(one_element(t, DataType::Bytes)?)
        .map_err(|e| Error::InvalidArgument(format!("input '{}' is not valid UTF-8: {e}", t.name)))
}

fn flag(t: &Tensor) -> Result<bool, Error> {
    Ok(one_element(t, DataType::Bool)?[0] != 0)
}

/// Reads a request's inputs and starts generating on the accepted model.
///
/// # Errors
/// [`Error::InvalidArgument`] for an input or output the interface does not
/// have, one of the wrong type or size, a missing `text_input`, a
/// `sampling_parameters` field that is unknown or out of range, and the
/// errors of [`text::start`].
pub async fn start(
    service: &Service,
    accepted: Accepted,
    r: pb::ModelInferRequest,
    counted: Hold,
) -> Result<Generation, Error> {
    let m = accepted.model().clone();
    let Some((generator, plugin)) = m.generative() else {
        unreachable!("start is only called for a generative model");
    };
    let empty_final =
        codec::parameters(&r.parameters).bool("triton_enable_empty_final_response", "request")?.unwrap_or(false);
    if let Some(o) = r.outputs.iter().find(|o| o.name != TEXT_OUTPUT) {
        return Err(Error::InvalidArgument(format!(
            "unexpected inference output '{}' for model '{}': it has the one output '{TEXT_OUTPUT}'",
            o.name, m.name
        )));
    }
    let decode = |reads: &dyn crate::protocol::shared_memory::Regions| {
        codec::decode(&m.name, &r.parameters, r.inputs, r.raw_input_contents, &r.outputs, reads)
    };
    let (decoded, _) = service.shared_memory.decode(decode, |d| &d.head.outputs)?;
    let (mut prompt, mut streaming, mut exclude_input) = (None, false, false);
    let mut request = text::TextRequest::default();
    for t in &decoded.tensors {
        match t.name.as_str() {
            "text_input" => prompt = Some(text(t)?.to_owned()),
            "stream" => streaming = flag(t)?,
            "exclude_input_in_output" => exclude_input = flag(t)?,
            "sampling_parameters" => request = sampling(text(t)?)?,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unexpected inference input '{other}' for model '{}': a generative model takes text_input, \
                     stream, sampling_parameters and exclude_input_in_output",
                    m.name
                )));
            }
        }
    }
    let prompt = prompt.ok_or_else(|| {
        Error::InvalidArgument(format!("expected input 'text_input' (the prompt) for model '{}'", m.name))
    })?;
    request.prompt = Some(Prompt::Text(prompt.clone()));
    let stream = text::start(plugin, generator, request).await?;
    let prefix = if streaming || exclude_input { String::new() } else { prompt };
    Ok(Generation { accepted, _counted: counted, stream, id: r.id, streaming, prefix, empty_final })
}

/// `sampling_parameters`: a JSON object of the shared generation fields.
fn sampling(json: &str) -> Result<text::TextRequest, Error> {
    let bad = |m: String| Error::InvalidArgument(format!("input 'sampling_parameters': {m}"));
    let value: serde_json::Value = serde_json::from_str(json).map_err(|e| bad(format!("not JSON: {e}")))?;
    let serde_json::Value::Object(mut fields) = value else {
        return Err(bad(format!("must be a JSON object, got {value}")));
    };
    let request = generation::read(&mut fields).map_err(|e| bad(e.message))?;
    generation::nothing_left(&fields).map_err(|e| bad(e.message))?;
    Ok(request)
}

/// Sends `g`'s responses on `answers` until its text ends, it fails (its
/// error, with the request's id, ends it) or the client goes away (which
/// drops the stream and so frees its sequence's slot).
pub async fn respond(mut g: Generation, answers: Sender<Result<pb::ModelStreamInferResponse, Status>>) {
    let mut whole = std::mem::take(&mut g.prefix);
    loop {
        let (answer, last) = match g.stream.next().await {
            Some(TextEvent::Chunk(chunk)) if g.streaming => (response(&g, Some(&chunk.text), false), false),
            Some(TextEvent::Chunk(chunk)) => {
                whole.push_str(&chunk.text);
                continue;
            }
            Some(TextEvent::End(..)) | None if !g.streaming => (response(&g, Some(&whole), true), true),
            Some(TextEvent::End(..)) | None if g.empty_final => (response(&g, None, true), true),
            Some(TextEvent::End(..)) | None => return,
            Some(TextEvent::Failed(e)) => (super::codec::stream_error(g.id.clone(), &e.to_string()), true),
        };
        if answers.send(Ok(answer)).await.is_err() || last {
            return;
        }
    }
}

/// A response of `g`: a piece of text, or none (an empty final response).
fn response(g: &Generation, text: Option<&str>, last: bool) -> pb::ModelStreamInferResponse {
    let m = g.accepted.model();
    let mut r = pb::ModelInferResponse {
        model_name: m.name.clone(),
        model_version: m.version.to_string(),
        ..Default::default()
    };
    r.id.clone_from(&g.id);
    let flag = pb::InferParameter { parameter_choice: Some(ParameterChoice::BoolParam(last)) };
    r.parameters.insert("triton_final_response".to_owned(), flag);
    if let Some(text) = text {
        r.outputs.push(InferOutputTensor {
            name: TEXT_OUTPUT.into(),
            datatype: DataType::Bytes.name().into(),
            shape: vec![1],
            ..Default::default()
        });
        let mut data = Vec::with_capacity(4 + text.len());
        push_bytes_element(&mut data, text.as_bytes());
        r.raw_output_contents.push(data);
    }
    pb::ModelStreamInferResponse { error_message: String::new(), infer_response: Some(r) }
}
