//! `plinth plugin new`: a plugin crate that builds as is, against the
//! bundle's `plugin-sdk` (`share/plinth/plugin-sdk` beside `bin/`) or, for a
//! binary run from a checkout, the checkout's.

use std::path::{Path, PathBuf};

/// Where `plugin-sdk` was when this binary was built.
const BUILT_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugin-sdk");

/// The SDK the bundle (`make dist`) ships: `share/plinth/plugin-sdk` in
/// the folder above the running binary's `bin/`.
fn bundled_sdk() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let sdk = exe.parent()?.parent()?.join("share/plinth/plugin-sdk");
    sdk.join("Cargo.toml").is_file().then_some(sdk)
}

/// The SDK `plinth plugin new` uses without `--sdk`: the bundle's, else
/// the checkout this binary was built from.
pub fn default_sdk() -> PathBuf {
    bundled_sdk().unwrap_or_else(|| PathBuf::from(BUILT_SDK))
}

/// What a new plugin does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The `handler` export: a request's body into input tensors, the
    /// outputs into the answer (it feeds a JSON body's numbers to the model).
    Handler,
    /// The `generation` export of a generative model: prompts and chats to
    /// token ids, generated ids to text (with `tokenizers` and `minijinja`).
    Generation,
}

/// Creates the crate folder `parent/name`: `Cargo.toml`, `.cargo/config.toml`
/// (target `wasm32-wasip2`) and a `src/lib.rs` plugin of `kind`. `sdk` is
/// the `plugin-sdk` folder (default: [`default_sdk`]). Returns the crate's
/// folder.
///
/// # Errors
/// A message when `name` is not a crate name (lower-case letters, digits,
/// `-`, `_`, starting with a letter), the folder already exists, the SDK is
/// not found, or a file cannot be written.
pub fn new_crate(name: &str, parent: &Path, sdk: Option<&Path>, kind: Kind) -> Result<PathBuf, String> {
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        return Err(format!(
            "'{name}' is not a crate name: use lower-case letters, digits, '-' and '_', starting with a letter"
        ));
    }
    let sdk = sdk.map_or_else(default_sdk, Path::to_path_buf);
    let sdk =
        sdk.canonicalize().ok().filter(|p| p.join("Cargo.toml").is_file()).ok_or_else(|| {
            format!("no plugin-sdk at {}: pass --sdk PATH to Plinth's plugin-sdk folder", sdk.display())
        })?;
    let dir = parent.join(name);
    if dir.exists() {
        return Err(format!("{} already exists", dir.display()));
    }
    let crate_name = name.replace('-', "_");
    let type_name: String = crate_name
        .split('_')
        .filter(|part| !part.is_empty())
        .map(|part| part[..1].to_ascii_uppercase() + &part[1..])
        .collect();
    let fill = |template: &str| {
        template
            .replace("{name}", name)
            .replace("{crate}", &crate_name)
            .replace("{type_name}", &type_name)
            .replace("{sdk}", &sdk.display().to_string())
    };
    let (manifest, lib) = match kind {
        Kind::Handler => (include_str!("template/Cargo.toml.tmpl"), include_str!("template/lib.rs.tmpl")),
        Kind::Generation => {
            (include_str!("template/generation/Cargo.toml.tmpl"), include_str!("template/generation/lib.rs.tmpl"))
        }
    };
    let files = [
        ("Cargo.toml", fill(manifest)),
        (".cargo/config.toml", fill(include_str!("template/config.toml.tmpl"))),
        ("src/lib.rs", fill(lib)),
    ];
    for (file, text) in files {
        let path = dir.join(file);
        let parent = path.parent().expect("files are inside the crate folder");
        std::fs::create_dir_all(parent)
            .and_then(|()| std::fs::write(&path, text))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crate_is_written_with_its_names_filled_in_and_bad_names_are_refused() {
        let parent = tempfile::tempdir().unwrap();
        let dir = new_crate("my-tokenizer", parent.path(), None, Kind::Handler).unwrap();
        let lib = std::fs::read_to_string(dir.join("src/lib.rs")).unwrap();
        assert!(lib.contains("struct MyTokenizer") && lib.contains("export_plugin!(MyTokenizer)"));
        assert!(lib.contains("release/my_tokenizer.wasm"));
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(manifest.contains("name = \"my-tokenizer\"") && manifest.contains("plugin-sdk\" }"));
        assert!(new_crate("my-tokenizer", parent.path(), None, Kind::Handler).unwrap_err().contains("already exists"));
        assert!(new_crate("Bad Name", parent.path(), None, Kind::Handler).unwrap_err().contains("not a crate name"));
        let dir = new_crate("my-llm", parent.path(), None, Kind::Generation).unwrap();
        let lib = std::fs::read_to_string(dir.join("src/lib.rs")).unwrap();
        assert!(lib.contains("impl Plugin for MyLlm") && lib.contains("fn encode") && lib.contains("fn decode"));
        assert!(std::fs::read_to_string(dir.join("Cargo.toml")).unwrap().contains("tokenizers"));
    }
}
