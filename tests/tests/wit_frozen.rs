//! The released plugin contracts never change: each frozen folder of `wit/`
//! hashes to the digest it had when it was released. A change to a released
//! contract belongs in a new version folder beside it, never in the old one
//! (plugins built against it must keep running).

use std::path::Path;

use sha2::{Digest, Sha256};

/// Each released version's folder and the SHA-256 of every file in it, by
/// path inside the folder.
const FROZEN: &[(&str, &[(&str, &str)])] = &[
    ("v0.1", &[("plugin.wit", "f7afed229863fd1a10c62186b57920b2eee50f88067bc5b9859b44195d7855e7")]),
    ("v0.2", &[("plugin.wit", "4328d1af85bfe4f604c5984d8ac2e01da904bd5d310bb5d87700d7ad0d1488a6")]),
    ("v0.3", &[("plugin.wit", "130e34c1a2237852ec3f5386150b901aa03d6995b94896c2f7e13e03533f1caa")]),
    ("v0.4", &[("plugin.wit", "bfc08973f6606b01ea34e719337e6f5c1aaf4ef2c834b40a54b0dbf675f262a6")]),
];

/// Every file under `dir`, as (path relative to `dir`, SHA-256 in hex), sorted.
fn digests(dir: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let digest = Sha256::digest(std::fs::read(&path).unwrap());
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            found.push((path.strip_prefix(dir).unwrap().to_string_lossy().into_owned(), hex));
        }
    }
    found.sort();
    found
}

#[test]
fn every_released_contract_is_byte_for_byte_what_was_released() {
    let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit");
    for (version, files) in FROZEN {
        let expected: Vec<(String, String)> = files.iter().map(|(f, d)| (f.to_string(), d.to_string())).collect();
        assert_eq!(
            digests(&wit.join(version)),
            expected,
            "wit/{version} is a released contract and must not change; add a new version folder beside it instead"
        );
    }
}

#[test]
fn every_version_folder_of_wit_is_listed_as_frozen() {
    let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit");
    let mut folders: Vec<String> =
        std::fs::read_dir(&wit).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    folders.sort();
    let listed: Vec<&str> = FROZEN.iter().map(|(v, _)| *v).collect();
    assert_eq!(folders, listed, "a new wit/ version is released once it is listed here with its digests");
}
