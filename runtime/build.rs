//! Compiles `proto/model_config.proto` (Triton's `ModelConfig` field names and
//! numbers), `proto/grpc_service.proto` (the KServe v2 gRPC service) and
//! `proto/model_runtime.proto` (ModelMesh's `mmesh.ModelRuntime`) with
//! protox, a pure-Rust protobuf compiler, so no `protoc` is needed. The
//! descriptor set is kept for prost-reflect's text-format parser.
//!
//! With the `libtorch` feature, also compiles `src/backend/empty_cache.cpp`
//! against `$LIBTORCH/include` and records `$ORIGIN/../lib` (the bundle of
//! `make dist`) and `$LIBTORCH/lib` as the binary's run path, so it starts
//! without `LD_LIBRARY_PATH` (which, where set, still wins: that is how a
//! machine's full PyTorch, with CUDA, is used instead).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["model_config.proto", "grpc_service.proto", "model_runtime.proto"], ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("model_config.bin"), prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure().build_client(false).compile_fds(fds)?;
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
