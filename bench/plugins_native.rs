//! Each plugin's `preprocess` and `postprocess` in the WebAssembly sandbox
//! against the same Rust code compiled natively into this benchmark, as a
//! ratio, measured in the same run. The sandboxed times are the
//! `Server-Timing` entries of `/predict` on the example repository (host
//! conversions and call included); the native ones call the plugin types
//! directly, with the same model information, request and model outputs.
//! Plugins that compose (`ocr`, `vad`, `spam_classifier`) call the host, so
//! they are left out. For `minilm` (text-embedding) preprocess is the
//! tokenizer (`tokenizers` compiled to wasm32-wasip2 against natively) and
//! postprocess tokenizes again and pools.
//!
//! Usage: cargo run --release -p plinth-bench --bin plugins_native [MODEL...]
//! (after `make setup`; every model when none is named)

mod plugin_stages;

use plinth_client::Client;
use plinth_tests::{Server, example_repository, fixture, sample_photo};
use plugin_stages::measure;

fn main() {
    let named: Vec<String> = std::env::args().skip(1).collect();
    let wanted = |model: &str| named.is_empty() || named.iter().any(|n| n == model);
    let server = Server::start(&example_repository(), &[]);
    let client = Client::new(server.base());
    println!("{:<14} {:<12} {:>10} {:>10} {:>8}", "model", "stage", "wasm µs", "native µs", "ratio");
    let print = |model: &str, stages: [plugin_stages::Stage; 2]| {
        for stage in stages {
            let (w, n) = (stage.wasm.as_secs_f64() * 1e6, stage.native.as_secs_f64() * 1e6);
            println!("{model:<14} {:<12} {w:>10.1} {n:>10.1} {:>7.1}x", stage.name, w / n.max(0.001));
        }
    };
    if wanted("ocr_cls") {
        let image = fixture("cls_rotated.png");
        print("ocr_cls", measure::<ocr_cls::ExportedPlugin>(&server, &client, "ocr_cls", "image/png", image));
    }
    if wanted("ocr_rec") {
        let image = fixture("line_invoice.png");
        print("ocr_rec", measure::<ocr_rec::ExportedPlugin>(&server, &client, "ocr_rec", "image/png", image));
    }
    if wanted("mobilenet_v2") {
        // SAFETY: set before any other thread of this process reads the environment.
        unsafe { std::env::set_var("PLINTH_MODEL_DIR", example_repository().join("mobilenet_v2/1")) };
        let photo = sample_photo("china.jpg");
        let stages =
            measure::<image_classification::ExportedPlugin>(&server, &client, "mobilenet_v2", "image/jpeg", photo);
        print("mobilenet_v2", stages);
    }
    if wanted("minilm") {
        // SAFETY: as above; the plugins read it in `init` only.
        unsafe { std::env::set_var("PLINTH_MODEL_DIR", example_repository().join("minilm/1")) };
        // 16 texts of 3 to 59 tokens: the 50 test sentences, every third.
        let sentences = String::from_utf8(fixture("sentences.txt")).expect("UTF-8 sentences");
        let texts: Vec<&str> = sentences.lines().step_by(3).take(16).collect();
        let body = serde_json::to_vec(&serde_json::json!({ "input": texts })).expect("JSON");
        print(
            "minilm",
            measure::<text_embedding::ExportedPlugin>(&server, &client, "minilm", "application/json", body),
        );
    }
}
