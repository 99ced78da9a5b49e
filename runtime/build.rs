//! Compiles `proto/model_config.proto` (Triton's `ModelConfig` field names and
//! numbers) into `config/`, and `proto/grpc_service.proto` (the KServe v2 gRPC
//! service) and `proto/model_runtime.proto` (ModelMesh's `mmesh.ModelRuntime`)
//! into `wire/`, with protox, a pure-Rust protobuf compiler, so no `protoc` is
//! needed. The model configuration's descriptor set is kept for
//! prost-reflect's text-format parser.
//!
//! With the `libtorch` feature, also compiles `src/backend/empty_cache.cpp`
//! against `$LIBTORCH/include` and records `$ORIGIN/../lib` (the bundle of
//! `make dist`) and `$LIBTORCH/lib` as the binary's run path, so it starts
//! without `LD_LIBRARY_PATH` (which, where set, still wins: that is how a
//! machine's full PyTorch, with CUDA, is used instead).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    // The model configuration (`config::proto`), and its descriptor set.
    let config = protox::compile(["model_config.proto"], ["proto"])?;
    std::fs::write(out.join("model_config.bin"), prost::Message::encode_to_vec(&config))?;
    let config_dir = out.join("config");
    std::fs::create_dir_all(&config_dir)?;
    tonic_prost_build::configure().build_server(false).build_client(false).out_dir(&config_dir).compile_fds(config)?;
    // The wire protocols (`protocol::grpc::proto`, `server::modelmesh::proto`):
    // the KServe v2 service shares the package `inference` with the model
    // configuration's messages, which it takes from `config::proto` rather
    // than generating them again (prost skips extern types).
    let wire = protox::compile(["grpc_service.proto", "model_runtime.proto"], ["proto"])?;
    let wire_dir = out.join("wire");
    std::fs::create_dir_all(&wire_dir)?;
    let mut builder = tonic_prost_build::configure().build_client(false).out_dir(&wire_dir);
    for file in wire.file.iter().filter(|f| f.name() == "model_config.proto") {
        let messages = file.message_type.iter().map(|m| m.name());
        for name in messages.chain(file.enum_type.iter().map(|e| e.name())) {
            builder = builder.extern_path(format!(".inference.{name}"), format!("crate::config::proto::{name}"));
        }
    }
    builder.compile_fds(wire)?;
    #[cfg(feature = "libtorch")]
    libtorch()?;
    Ok(())
}

#[cfg(feature = "libtorch")]
fn libtorch() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=src/backend/empty_cache.cpp");
    let root = std::path::PathBuf::from(
        std::env::var("LIBTORCH")
            .map_err(|_| "the libtorch feature needs LIBTORCH (scripts/setup.sh makes one in .cache/libtorch)")?,
    );
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .include(root.join("include"))
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .warnings(false)
        .file("src/backend/empty_cache.cpp")
        .compile("plinth_empty_cache");
    // The bundle's lib/ first (`make dist`), then the build machine's.
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/../lib");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", root.join("lib").display());
    Ok(())
}
