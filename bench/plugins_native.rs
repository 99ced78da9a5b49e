//! Each plugin's `preprocess` and `postprocess` in the WebAssembly sandbox
//! against the same Rust code compiled natively into this benchmark, as a
//! ratio, measured in the same run (see `plugin_stages`). Plugins that
//! compose (`ocr`, `vad`) call the host, so they are left out.
//!
//! Usage: cargo run --release -p plinth-bench --bin plugins_native (after `make setup`)

mod plugin_stages;

use plinth_client::Client;
use plinth_tests::{Server, example_repository, fixture, sample_photo};
use plugin_stages::measure;

fn main() {
    let server = Server::start(&example_repository(), &[]);
    let client = Client::new(server.base());
    println!("{:<14} {:<12} {:>10} {:>10} {:>8}", "model", "stage", "wasm µs", "native µs", "ratio");
    let print = |model: &str, stages: [plugin_stages::Stage; 2]| {
        for stage in stages {
            let (w, n) = (stage.wasm.as_secs_f64() * 1e6, stage.native.as_secs_f64() * 1e6);
            println!("{model:<14} {:<12} {w:>10.1} {n:>10.1} {:>7.1}x", stage.name, w / n.max(0.001));
        }
    };
    print(
        "ocr_cls",
        measure::<ocr_cls::ExportedPlugin>(&server, &client, "ocr_cls", "image/png", fixture("cls_rotated.png")),
    );
    print(
        "ocr_rec",
        measure::<ocr_rec::ExportedPlugin>(&server, &client, "ocr_rec", "image/png", fixture("line_invoice.png")),
    );
    // SAFETY: set before any thread of this process reads the environment.
    let folder = example_repository().join("mobilenet_v2/1");
    unsafe { std::env::set_var("PLINTH_MODEL_DIR", &folder) };
    let photo = sample_photo("china.jpg");
    print(
        "mobilenet_v2",
        measure::<image_classification::ExportedPlugin>(&server, &client, "mobilenet_v2", "image/jpeg", photo),
    );
}
