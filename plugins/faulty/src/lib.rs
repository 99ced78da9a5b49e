//! A plugin that misbehaves on request, so tests can check that the host
//! contains it. The request body selects the behaviour: `trap` panics,
//! `loop` never returns, `alloc` asks for 1 GiB, `sleep:MS` answers like
//! `ok` after MS milliseconds, `wait:NAME` answers like `ok` once the file
//! NAME exists in its model version folder (so a test holds a request in
//! flight until it creates the file, instead of guessing a duration), `bad`
//! returns a bad-input error, `sandbox` reports what the plugin can reach
//! (as the message of a bad-input error, JSON); anything
//! else yields a zero-filled input tensor (variable dimensions set to 1) and
//! the default JSON postprocess, except for the composition behaviours of
//! `postprocess`: `call:MODEL/REST` answers with MODEL's answer to a
//! `/predict` whose body is REST (so `call:a/call:b/ok` nests), and
//! `self-infer` runs its own model once more through the host and answers
//! with those outputs.
//!
//! With the parameter `faulty.init_wait: "NAME"`, `init` returns only once
//! the file NAME exists in the model version folder, so a test holds a
//! load in LOADING until it creates the file.

use plinth_plugin_sdk::{Error, ModelInfo, Plugin, Prompt, Request, Response, Tensor, export_plugin};

struct Faulty {
    info: ModelInfo,
}

impl Plugin for Faulty {
    fn init(info: &ModelInfo) -> Result<Self, Error> {
        if let Some(name) = info.parameter("faulty.init_wait") {
            wait_for_file(name);
        }
        Ok(Faulty { info: info.clone() })
    }

    fn preprocess(&mut self, req: &Request) -> Result<Vec<Tensor>, Error> {
        match req.body.as_slice() {
            b"trap" => panic!("deliberate trap requested by the test"),
            b"loop" => loop {
                std::hint::black_box(());
            },
            b"alloc" => {
                let big = vec![1u8; 1 << 30];
                std::hint::black_box(&big);
                Err(Error::internal("allocated 1 GiB, which the host should have refused"))
            }
            b"bad" => Err(Error::bad_input("deliberate bad input")),
            b"sandbox" => Err(Error::bad_input(sandbox_report().to_string())),
            body => {
                let body = String::from_utf8_lossy(body);
                if let Some(ms) = body.strip_prefix("sleep:") {
                    let ms = ms.parse().map_err(|_| Error::bad_input(format!("sleep:MS needs a number, got {ms}")))?;
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                } else if let Some(name) = body.strip_prefix("wait:") {
                    wait_for_file(name);
                }
                Ok(vec![self.zero_input()?])
            }
        }
    }

    fn postprocess(&mut self, req: &Request, outputs: Vec<Tensor>) -> Result<Response, Error> {
        let body = String::from_utf8_lossy(&req.body);
        let outputs = if let Some(call) = body.strip_prefix("call:") {
            let (model, rest) = call.split_once('/').unwrap_or((call, "ok"));
            let inner = Request { content_type: req.content_type.clone(), body: rest.into(), parameters: Vec::new() };
            return plinth_plugin_sdk::predict(model, None, &inner);
        } else if body == "self-infer" {
            plinth_plugin_sdk::infer(&self.info.name, None, &[self.zero_input()?], &[])?
        } else {
            outputs
        };
        let outputs: Result<Vec<_>, Error> = outputs.iter().map(Tensor::to_json).collect();
        Ok(Response::json(&serde_json::json!({ "outputs": outputs? })))
    }

    fn encode(&mut self, prompt: &Prompt) -> Result<Vec<u32>, Error> {
        if self.info.parameter("faulty.generation") != Some("true") {
            return Err(Error::bad_input(
                "this plugin does not tokenize prompts unless its model sets faulty.generation",
            ));
        }
        match prompt {
            Prompt::Text(text) if text == "trap" => Ok(COUNT.to_vec()),
            Prompt::Text(text) => Ok(text.bytes().map(|b| BYTE_IDS + u32::from(b)).collect()),
            Prompt::Chat(_) => Err(Error::bad_input("this test plugin encodes text prompts only")),
        }
    }

    fn decode(&mut self, ids: &[u32]) -> Result<String, Error> {
        if ids.contains(&TRAP_ID) {
            panic!("deliberate trap in the middle of a stream");
        }
        Ok(ids.iter().map(|id| format!("<{id}>")).collect())
    }

    fn stop_token_ids(&self) -> Vec<u32> {
        Vec::new()
    }
}

impl Faulty {
    fn zero_input(&self) -> Result<Tensor, Error> {
        let input = self.info.first_input()?;
        let mut shape: Vec<i64> = input.dims.iter().map(|&d| if d < 0 { 1 } else { d }).collect();
        if self.info.max_batch_size > 0 {
            shape.insert(0, 1);
        }
        let count = shape.iter().product::<i64>() as usize;
        Ok(Tensor::from_slice(&input.name, &shape, &vec![0.0f32; count]))
    }
}

/// Returns once `/model/NAME` exists (the test creates it).
fn wait_for_file(name: &str) {
    let file = format!("/model/{name}");
    while std::fs::metadata(&file).is_err() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Tries what a sandboxed plugin must and must not be able to do.
fn sandbox_report() -> serde_json::Value {
    let ok = |r: std::io::Result<()>| r.is_ok();
    serde_json::json!({
        "read_own_model_file": ok(std::fs::read("/model/model.onnx").map(drop)),
        "list_own_folder": ok(std::fs::read_dir("/model").map(drop)),
        "write_own_folder": ok(std::fs::write("/model/written-by-plugin", b"x")),
        "read_outside": ok(std::fs::read("/model/../config.pbtxt").map(drop)),
        "read_host_file": ok(std::fs::read("/etc/passwd").map(drop)),
        "environment": std::env::vars().count(),
        "arguments": std::env::args().count(),
        "tcp_connect": ok(std::net::TcpStream::connect("127.0.0.1:80").map(drop)),
    })
}

// The generation export, kept below the request handler so that the
// panic of `trap` keeps the line the tests name.
// As a generative model's plugin (for SmolLM2; only where the model sets
// the parameter `faulty.generation: "true"`, else it refuses to tokenize
// as a plugin that does not generate does) it encodes a prompt's
// bytes as token ids (each byte plus `BYTE_IDS`) and decodes an id as
// `<ID>`; the prompt `trap` is "Count: 1, 2, 3, 4, 5, 6, 7," in SmolLM2's
// ids, which the model goes on counting, and decoding a window that holds
// the digit 9 (`TRAP_ID`) panics: a trap a few tokens into that stream.

/// Where the ids of a prompt's bytes start.
const BYTE_IDS: u32 = 1000;
/// "Count: 1, 2, 3, 4, 5, 6, 7," in SmolLM2's token ids.
const COUNT: [u32; 23] =
    [9825, 42, 216, 33, 28, 216, 34, 28, 216, 35, 28, 216, 36, 28, 216, 37, 28, 216, 38, 28, 216, 39, 28];
/// The digit 9 in SmolLM2's ids: decoding it traps.
const TRAP_ID: u32 = 41;

export_plugin!(Faulty);
