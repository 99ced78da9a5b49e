//! `ModelStreamInfer`: the requests of one bidirectional stream, each run
//! as it arrives and answered in the order of the requests, with the sequences a stream
//! opens kept in order and ended with it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::FuturesOrdered;
use tokio::sync::oneshot::error::TryRecvError;
use tonic::{Status, Streaming};

use super::generate::{self, Generation};
use super::infer::{Caller, Outcome, TraceHeaders, traced_infer, version};
use super::layers;
use crate::protocol::grpc::{self as codec, proto as pb};
use crate::protocol::request;
use crate::scheduler::sequence::{CorrelationId, Owner, new_owner};
use crate::server::service::Service;

/// Answers buffered on a stream before its requests wait for the client to
/// read them.
pub const STREAM_BUFFER: usize = 64;

/// A sequence a stream carries: model name, version field, correlation id.
type StreamSequence = (String, String, CorrelationId);

/// Serves one `ModelStreamInfer` call: reads requests until the client ends
/// its side and runs each as it arrives, in the order read (so requests
/// sent together join a batch in that order), while sending the answers in
/// the order of the requests, as Triton does for a model that is not
/// decoupled (`src/grpc/stream_infer_handler.cc`: one answer per request,
/// queued in the order received). Requests of one sequence run one after
/// another, each after the one before was answered. The requests still
/// running are dropped (their queued requests taken out, which cancels
/// their sequences) when the client cancels or stops reading; when the
/// stream ends, the sequences it opened and left open end. A request to a
/// generative model answers with a stream of its own ([`generate`]):
/// its responses go out as its text is generated, between the others'.
pub async fn serve_stream(
    service: Arc<Service>,
    mut requests: Streaming<pb::ModelInferRequest>,
    answers: tokio::sync::mpsc::Sender<Result<pb::ModelStreamInferResponse, Status>>,
    headers: TraceHeaders,
) {
    let owner = new_owner();
    // Polled on this task, first in the order pushed; answered in order.
    let mut running = FuturesOrdered::new();
    // Each sequence's last request so far: its answer has been sent when
    // the receiver reports its sender gone.
    let mut sequences: HashMap<StreamSequence, tokio::sync::oneshot::Receiver<()>> = HashMap::new();
    // The sequences the stream sent requests of and did not see end.
    let mut opened: HashSet<StreamSequence> = HashSet::new();
    // The generations started, each sending its own responses.
    let mut generating = tokio::task::JoinSet::new();
    let mut reading = true;
    while reading || !running.is_empty() || !generating.is_empty() {
        tokio::select! {
            next = requests.message(), if reading => match next {
                Ok(Some(request)) => {
                    let (service, headers) = (&*service, &headers);
                    let turn = match request::sequence(&codec::parameters(&request.parameters)) {
                        Ok(Some(sequence)) => {
                            // Sequences whose last request has been answered
                            // need no entry, unless still open.
                            sequences.retain(|_, done| matches!(done.try_recv(), Err(TryRecvError::Empty)));
                            let id = CorrelationId::from(sequence.id);
                            let key = (request.model_name.clone(), request.model_version.clone(), id);
                            let (answered, done) = tokio::sync::oneshot::channel();
                            let previous = sequences.insert(key.clone(), done);
                            opened.insert(key.clone());
                            Some((previous, answered, key, sequence.end))
                        }
                        _ => None,
                    };
                    running.push_back(async move {
                        let Some((previous, answered, key, end)) = turn else {
                            return (stream_answer(service, request, owner, headers).await, None);
                        };
                        if let Some(turn) = previous {
                            let _ = turn.await;
                        }
                        (stream_answer(service, request, owner, headers).await, Some((answered, key, end)))
                    });
                }
                Ok(None) => reading = false,
                // A message over the limit ends the stream with its status.
                Err(status) if let Some(exhausted) = layers::over_the_limit(&status) => {
                    let _ = answers.send(Err(exhausted)).await;
                    break;
                }
                // The client cancelled the call or the connection broke.
                Err(_) => break,
            },
            Some(_) = generating.join_next(), if !generating.is_empty() => {},
            Some((answer, sequence)) = running.next() => {
                let answer = match answer {
                    StreamAnswer::Response(answer) => answer,
                    StreamAnswer::Generation(g) => {
                        generating.spawn(generate::respond(g, answers.clone()));
                        continue;
                    }
                };
                let succeeded = answer.error_message.is_empty();
                let sent = answers.send(Ok(answer)).await;
                // The sequence's next request may run now that this answer
                // is on its way, so the answers keep the requests' order.
                if let Some((answered, key, end)) = sequence {
                    if end && succeeded {
                        opened.remove(&key);
                    }
                    drop(answered);
                }
                if sent.is_err() {
                    break;
                }
            },
            () = answers.closed() => break,
        }
    }
    // Requests still running are cancelled, and with them their sequences
    // and generations.
    drop(running);
    generating.abort_all();
    for (model, version_field, id) in opened {
        // Never loads: a model that is not resident holds no sequences. A
        // sequence that ended, or that another client opened since under
        // the same id, is left alone.
        if let Ok(m) = version(&version_field).and_then(|v| service.registry().resolve(&model, v)) {
            m.release_sequence(&id, owner);
        }
    }
}

/// What a request on the stream comes to: one answer, or a generation that
/// sends its own.
enum StreamAnswer {
    Response(pb::ModelStreamInferResponse),
    Generation(Generation),
}

/// The stream's answer to one request: its response, or its error with its
/// id, as Triton answers on the stream, or a generation. `owner` is the
/// stream.
async fn stream_answer(
    service: &Service,
    request: pb::ModelInferRequest,
    owner: Owner,
    headers: &TraceHeaders,
) -> StreamAnswer {
    let id = request.id.clone();
    let answer = match service.begin_inference() {
        Ok(counted) => {
            traced_infer(service, request, Caller::Stream(owner, counted), ("ModelStreamInfer", headers)).await
        }
        Err(e) => Err(e.into()),
    };
    StreamAnswer::Response(match answer {
        Ok(Outcome::Response(response)) => {
            pb::ModelStreamInferResponse { error_message: String::new(), infer_response: Some(response) }
        }
        Ok(Outcome::Generation(g)) => return StreamAnswer::Generation(g),
        Err(status) => super::codec::stream_error(id, status.message()),
    })
}
