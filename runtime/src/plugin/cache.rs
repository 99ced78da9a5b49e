//! On-disk cache of compiled plugins, so a restart or a second model using
//! the same `.wasm` skips the compile (about 0.5 s per plugin).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;

use wasmtime::Engine;
use wasmtime::component::Component;

/// Compiles `wasm`, or loads the artefact a previous compile left in `dir`.
/// The file name hashes the component bytes and the engine's compatibility
/// settings, so an artefact is only ever loaded into an engine that can run
/// it. A cache that cannot be written is skipped with a warning.
///
/// # Errors
/// wasmtime's message when the component does not compile.
pub fn compile_cached(engine: &Engine, wasm: &[u8], dir: &Path) -> Result<Component, String> {
    let path = artefact(engine, wasm, dir);
    if path.is_file() {
        // SAFETY: the file was written by `precompile_component` below into
        // Plinth's own cache folder and is keyed on this engine's settings.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => return Ok(component),
            Err(e) => tracing::warn!(path = %path.display(), "ignoring an unusable compiled plugin: {e}"),
        }
    }
    let compiled = precompile_apart(engine, wasm)?;
    match std::fs::create_dir_all(dir).and_then(|()| write_atomically(&path, &compiled)) {
        // Loaded as a later load will find it, so the first load of a
        // plugin holds (and measures) what every later one does.
        // SAFETY: written from this engine's compile a moment ago.
        Ok(()) => unsafe { Component::deserialize_file(engine, &path) },
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "cannot cache a compiled plugin: {e}");
            // SAFETY: `compiled` was produced by this engine a moment ago.
            unsafe { Component::deserialize(engine, &compiled) }
        }
    }
    .map_err(|e| format!("cannot load the compiled plugin: {e}"))
}

/// Compiles `wasm` into `dir` unless a previous compile left it there, and
/// loads nothing: a load then finds the artefact as any later load would.
///
/// # Errors
/// wasmtime's message when the component does not compile; an I/O message
/// when the artefact cannot be written.
pub fn ensure_cached(engine: &Engine, wasm: &[u8], dir: &Path) -> Result<(), String> {
    let path = artefact(engine, wasm, dir);
    if path.is_file() {
        return Ok(());
    }
    let compiled = precompile_apart(engine, wasm)?;
    std::fs::create_dir_all(dir)
        .and_then(|()| write_atomically(&path, &compiled))
        .map_err(|e| format!("cannot cache a compiled plugin in {}: {e}", dir.display()))
}

/// Where the artefact of `wasm` for `engine` lives in `dir`: the file name
/// hashes the component bytes and the engine's compatibility settings.
fn artefact(engine: &Engine, wasm: &[u8], dir: &Path) -> std::path::PathBuf {
    let mut hasher = DefaultHasher::new();
    wasm.hash(&mut hasher);
    engine.precompile_compatibility_hash().hash(&mut hasher);
    dir.join(format!("{:016x}.cwasm", hasher.finish()))
}

/// Compiles `wasm` on a thread of its own and returns the artefact. The
/// compiler's working memory is touched by that thread, not the loading
/// one, so it is not counted in the model's footprint (which is measured
/// on the loading thread, see `lifecycle::loader`): it is freed when the
/// compile ends, and a load from the cache never needs it.
///
/// # Errors
/// wasmtime's message when the component does not compile.
pub fn precompile_apart(engine: &Engine, wasm: &[u8]) -> Result<Vec<u8>, String> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("plinth-compile".into())
            .spawn_scoped(scope, || engine.precompile_component(wasm))
            .map_err(|e| format!("cannot start a compile thread: {e}"))?
            .join()
            .map_err(|_| "the compiler panicked".to_owned())?
            .map_err(|e| format!("cannot compile: {e}"))
    })
}

/// Writes through a temporary file and a rename, so that a concurrent reader
/// never sees half an artefact.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
