use super::*;

fn config_of(text: &str) -> ModelConfig {
    config::parse(&format!("name: \"m\" {text}")).unwrap()
}

/// The example repository's direction classifier (`make setup` places it).
fn classifier() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../model_repository/ocr_cls/1/model.onnx")
}

#[test]
fn a_model_without_platform_and_onnx_file_is_named_by_what_its_folder_holds() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("model.onnx");
    std::fs::write(dir.path().join("model.py"), "").unwrap();
    assert_eq!(
        not_onnx("m", dir.path(), &config_of(""), &missing).unwrap(),
        "config.pbtxt names no platform or backend, so Plinth looks for an ONNX model, but the version folder \
         holds model.py, a model of Triton's 'python' backend, which Plinth does not ship"
    );
    assert_eq!(not_onnx("m", dir.path(), &config_of(r#"backend: "onnxruntime""#), &missing), None);
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(not_onnx("m", empty.path(), &config_of(""), &missing), None);
    let custom = not_onnx("m.identity", empty.path(), &config_of(""), &missing).unwrap();
    assert!(custom.contains("does not pick backend 'identity' here"), "{custom}");
    assert!(custom.contains("backend: \"identity\""), "{custom}");
}

#[test]
fn bound_runs_answer_as_plain_runs_and_gpus_need_the_cuda_provider() {
    let ort = runtime();
    let plain = ort.load(&classifier(), SessionOptions::default(), Placement::Cpu).unwrap();
    let mut bound = ort.load(&classifier(), SessionOptions::default(), Placement::Cpu).unwrap();
    bound.io_binding = true;
    let data: Vec<u8> = (0..2 * 3 * 48 * 192).flat_map(|i| ((i % 97) as f32 / 48.0 - 1.0).to_le_bytes()).collect();
    let input = Tensor { name: "x".into(), datatype: DataType::Fp32, shape: vec![2, 3, 48, 192], data };
    let expected = plain.execute(vec![input.clone()]).unwrap();
    assert_eq!(expected[0].shape, [2, 2]);
    assert_eq!(bound.execute(vec![input]).unwrap(), expected);

    if std::path::Path::new("/dev/nvidiactl").exists() {
        return; // bench/gpu.sh checks sessions on a GPU
    }
    let why = ort.cuda().unwrap_err().to_owned();
    let named = [CUDA_PROVIDER_LIBRARY, "libcuda.so.1", "libcublasLt.so.13"].iter().any(|l| why.contains(l));
    assert!(named, "the missing library is named: {why}");
    let refused = ort.load(&classifier(), SessionOptions::default(), Placement::Gpu(0)).err().unwrap();
    assert!(refused.starts_with("cannot run on GPU 0: ") && refused.ends_with(&why), "{refused}");
}

/// ONNX Runtime from `ORT_DYLIB_PATH`, started once per test process (ONNX
/// Runtime has one environment per process).
pub(crate) fn runtime() -> &'static OnnxRuntime {
    static RUNTIME: std::sync::OnceLock<OnnxRuntime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        let library = std::env::var_os("ORT_DYLIB_PATH").expect("ORT_DYLIB_PATH (`make test` sets it)");
        OnnxRuntime::init(Path::new(&library)).unwrap()
    })
}
