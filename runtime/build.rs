//! Compiles `proto/model_config.proto` (Triton's `ModelConfig` field names and
//! numbers) and `proto/grpc_service.proto` (the KServe v2 gRPC service) with
//! protox, a pure-Rust protobuf compiler, so no `protoc` is needed. The
//! descriptor set is kept for prost-reflect's text-format parser.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["model_config.proto", "grpc_service.proto"], ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("model_config.bin"), prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure().build_client(false).compile_fds(fds)?;
    Ok(())
}
