//! Compiles `proto/model_config.proto` (Triton's `ModelConfig` field names and
//! numbers) with protox, a pure-Rust protobuf compiler, so no `protoc` is
//! needed. The descriptor set is kept for prost-reflect's text-format parser.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["model_config.proto"], ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("model_config.bin"), prost::Message::encode_to_vec(&fds))?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
