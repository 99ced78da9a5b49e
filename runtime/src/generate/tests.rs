//! The decode loop on the exported SmolLM2 (`make setup-models`), against
//! transformers' greedy continuations: alone and among others in one batch.

use std::path::{Path, PathBuf};

use super::{Event, FinishReason, GenerationRequest, Generator, Sampling};
use crate::backend::Placement;
use crate::backend::onnx::SessionOptions;
use crate::config::parameters::GenerationParameters;

fn smollm2() -> (PathBuf, serde_json::Value) {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cache/smollm2");
    let reference = std::fs::read(cache.join("reference.json"))
        .unwrap_or_else(|e| panic!("{}/reference.json: {e}: run `make setup-models` first", cache.display()));
    (cache.join("fp32"), serde_json::from_slice(&reference).unwrap())
}

fn generator(limits: GenerationParameters) -> Generator {
    let ort = crate::backend::onnx::tests::runtime();
    let options = SessionOptions { intra_op_threads: 2, intra_op_spinning: false, ..SessionOptions::default() };
    let (dir, _) = smollm2();
    let metrics = crate::metrics::Metrics::new().for_generation("smollm2", 1);
    Generator::load(ort, &dir, options, Placement::Cpu, limits, metrics).unwrap()
}

/// Greedy ids of `case`, at most `tokens` of them, and why it ended.
fn request(case: &serde_json::Value, tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt: serde_json::from_value(case["prompt_ids"].clone()).unwrap(),
        max_tokens: tokens,
        sampling: Sampling { temperature: 0.0, ..Sampling::default() },
        stop_ids: vec![2],
    }
}

async fn collect(mut events: tokio::sync::mpsc::UnboundedReceiver<Event>) -> (Vec<u32>, FinishReason) {
    let mut ids = Vec::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Token(choice) => ids.push(choice.token),
            Event::Finished(reason) => return (ids, reason),
            Event::Failed(e) => panic!("{e}"),
        }
    }
    panic!("the stream ended without its end");
}

/// The reference's first `tokens` ids and finish reason at that length.
fn expected(case: &serde_json::Value, tokens: usize) -> (Vec<u32>, FinishReason) {
    let ids: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
    if ids.len() < tokens && case["finish_reason"] == "stop" {
        return (ids, FinishReason::Stop);
    }
    (ids[..tokens.min(ids.len())].to_vec(), FinishReason::Length)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_tokens_equal_transformers_alone_and_batched_with_small_prefill_chunks() {
    let (_, reference) = smollm2();
    let cases = reference["cases"].as_array().unwrap();
    let tokens = 12;
    // Three slots for six requests: later ones wait, join the running
    // batch mid-way, and read their prompts in chunks of 8 tokens.
    let limits = GenerationParameters {
        context_length: 128,
        max_sequences: 3,
        prefill_chunk: 8,
        ..GenerationParameters::default()
    };
    let generator = generator(limits);
    let alone = collect(generator.submit(request(&cases[10], tokens)).unwrap()).await;
    assert_eq!(alone, expected(&cases[10], tokens), "a chat, alone");
    let picked = [0, 1, 2, 10, 13, 19];
    let streams: Vec<_> = picked.iter().map(|&i| generator.submit(request(&cases[i], tokens)).unwrap()).collect();
    for (stream, &i) in streams.into_iter().zip(&picked) {
        assert_eq!(collect(stream).await, expected(&cases[i], tokens), "case {i}, batched");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_long_or_too_many_requests_are_refused_and_a_dropped_stream_frees_its_slot() {
    let (_, reference) = smollm2();
    let case = &reference["cases"][0];
    let limits =
        GenerationParameters { context_length: 32, max_sequences: 1, max_queue: 1, ..GenerationParameters::default() };
    let generator = generator(limits);
    let long = generator.submit(request(case, 30)).unwrap_err();
    assert!(long.to_string().contains("5 tokens and max_tokens 30 exceed the model's context of 32"), "{long}");
    let mut first = generator.submit(request(case, 20)).unwrap();
    assert!(matches!(first.recv().await, Some(Event::Token(_))), "the first holds the only slot");
    let second = generator.submit(request(case, 4)).unwrap();
    let full = generator.submit(request(case, 4)).unwrap_err();
    assert!(matches!(full, crate::error::Error::Overloaded(_)), "{full}");
    drop(first);
    let (ids, _) = collect(second).await;
    assert_eq!(ids, expected(case, 4).0, "the dropped stream's slot served the waiting one");
}
