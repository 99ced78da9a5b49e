//! Plinth's own `config.pbtxt` `parameters` keys, parsed in one place with
//! one set of rules: a value is trimmed; a flag is `true`/`1` or
//! `false`/`0`; a number is a whole decimal number. The validation
//! ([`super::validate`]) parses them, so `plinth check` names every bad
//! parameter before any model file is read, and the parts of the server
//! that act on a key read its typed field from [`Parameters`].
//!
//! A key outside [`KEYS`] belongs to the model's plugin, which sees every
//! parameter as written; only the prefixes in [`FAMILIES`] are Plinth's
//! alone, so a misspelt key under them is refused.

use std::time::Duration;

use super::ModelConfig;

/// Every key Plinth reads, as `docs/model-repository.md` lists them.
pub const KEYS: &[&str] = &[
    PLUGIN,
    "plugin.timeout_ms",
    "plugin.memory_limit",
    "plugin.instances",
    "plugin.warmup",
    "plugin.warmup_content_type",
    "intra_op_thread_count",
    "inter_op_thread_count",
    "session.intra_op.allow_spinning",
    "pinned",
    "rollout",
    "gpu_swap_policy",
    "openai.embeddings",
    "remote.url",
    "remote.model",
    "remote.version",
    "remote.timeout_ms",
    "remote.retries",
    "remote.repository_control",
    "execute_delay_ms",
    "generation.context_length",
    "generation.max_sequences",
    "generation.max_queue",
    "generation.prefill_chunk",
    "generation.max_tokens",
    MISSING_FILES_HINT,
];

/// The prefixes whose keys are all Plinth's: a key under one that is not in
/// [`KEYS`] is a misspelling, refused rather than passed to the plugin.
pub const FAMILIES: &[&str] = &["plugin.", "remote.", "generation."];

/// The key whose text is added to a load error when files are missing.
pub const MISSING_FILES_HINT: &str = "missing_files_hint";

/// The key naming a model's plugin (a `.wasm` file in the model folder).
pub const PLUGIN: &str = "plugin";

/// The largest `plugin.memory_limit`, in bytes: a 32-bit linear memory.
pub const PLUGIN_MAX_MEMORY_BYTES: u64 = 4 << 30;
/// The longest `plugin.timeout_ms`: 10 minutes.
pub const PLUGIN_MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// The largest `plugin.instances`: the plugin pool's instances in all.
pub const PLUGIN_MAX_INSTANCES: usize = 256;
/// The most `remote.retries`.
pub const REMOTE_MAX_RETRIES: usize = 10;

/// Plinth's parameters of one model, each with its default when unset.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parameters {
    /// `plugin` and the `plugin.*` keys; `None` when the model has no
    /// plugin.
    pub plugin: Option<PluginParameters>,
    /// `pinned`: never evicted by the residency budget.
    pub pinned: bool,
    /// `rollout`: the JSON plan every new version rolls out by (checked
    /// here to be a JSON object; the rollout reads its fields).
    pub rollout: Option<String>,
    /// `gpu_swap_policy`.
    pub gpu_swap_policy: GpuSwapPolicy,
    /// `openai.embeddings`: the model serves OpenAI's `/v1/embeddings`.
    pub openai_embeddings: bool,
    /// The ONNX Runtime session's keys.
    pub onnx: OnnxParameters,
    /// The `remote.*` keys.
    pub remote: RemoteParameters,
    /// `execute_delay_ms`: how long the identity backend's execution waits.
    pub execute_delay: Duration,
    /// `missing_files_hint`: a sentence saying how to place missing files.
    pub missing_files_hint: Option<String>,
    /// The `generation.*` keys of a generative model.
    pub generation: GenerationParameters,
}

/// A generative model's limits (`generation.*`), each with its default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenerationParameters {
    /// `generation.context_length`: tokens a sequence holds at most, prompt
    /// and output together (default 2048, at most the model's own).
    pub context_length: usize,
    /// `generation.max_sequences`: sequences generating at once, each with
    /// a KV cache slot of `context_length` tokens (default 8).
    pub max_sequences: usize,
    /// `generation.max_queue`: requests waiting for a slot at most; past
    /// it a request is refused as overloaded (default 64).
    pub max_queue: usize,
    /// `generation.prefill_chunk`: prompt tokens one iteration reads for a
    /// new sequence (default 256); running streams wait at most one
    /// chunk's prefill per token.
    pub prefill_chunk: usize,
    /// `generation.max_tokens`: the `max_tokens` of a request that gives
    /// none (default 16, vLLM's and OpenAI's completions').
    pub max_tokens: usize,
}

impl Default for GenerationParameters {
    fn default() -> Self {
        GenerationParameters {
            context_length: 2048,
            max_sequences: 8,
            max_queue: 64,
            prefill_chunk: 256,
            max_tokens: 16,
        }
    }
}

/// A model's plugin and the limits and warm-up it sets for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginParameters {
    /// `plugin`: the `.wasm` file, relative to the model folder.
    pub file: String,
    /// `plugin.memory_limit` (e.g. `512MiB`), in bytes; `None` keeps the
    /// server's.
    pub memory_bytes: Option<u64>,
    /// `plugin.timeout_ms`; `None` keeps the server's.
    pub timeout: Option<Duration>,
    /// `plugin.instances`: the most instances of this model's plugin.
    pub instances: Option<usize>,
    /// `plugin.warmup`: files of the model folder's `warmup/`.
    pub warmup: Vec<String>,
    /// `plugin.warmup_content_type`: the warm-up bodies' `Content-Type`.
    pub warmup_content_type: Option<String>,
}

/// What a hot swap does when the new version and the serving ones do not
/// fit on a GPU together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuSwapPolicy {
    /// `refuse` (default): the load fails and the serving versions go on.
    #[default]
    Refuse,
    /// `unload_first`: the versions serving are unloaded first; requests
    /// get 503 until the new version is READY.
    UnloadFirst,
}

/// Triton's ONNX Runtime backend's session keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnnxParameters {
    /// `intra_op_thread_count`; `None`: the cores divided among instances.
    pub intra_op_threads: Option<usize>,
    /// `inter_op_thread_count`; `None`: ONNX Runtime's default.
    pub inter_op_threads: Option<usize>,
    /// `session.intra_op.allow_spinning` (default on, as ONNX Runtime's).
    pub allow_spinning: bool,
}

impl Default for OnnxParameters {
    fn default() -> Self {
        OnnxParameters { intra_op_threads: None, inter_op_threads: None, allow_spinning: true }
    }
}

/// Where a remote model lives (the remote backend requires `url`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteParameters {
    /// `remote.url`: `http://host:port[/path]`, without a trailing `/`.
    pub url: Option<String>,
    /// `remote.model`: the model's name there; `None`: this model's name.
    pub model: Option<String>,
    /// `remote.version`; `None` lets the remote choose.
    pub version: Option<u64>,
    /// `remote.timeout_ms`: the limit on each HTTP exchange (default 5 s).
    pub timeout: Duration,
    /// `remote.retries` (default 2, at most [`REMOTE_MAX_RETRIES`]).
    pub retries: usize,
    /// `remote.repository_control`: loading this model loads the remote's.
    pub repository_control: bool,
}

impl Default for RemoteParameters {
    fn default() -> Self {
        RemoteParameters {
            url: None,
            model: None,
            version: None,
            timeout: Duration::from_millis(5000),
            retries: 2,
            repository_control: false,
        }
    }
}

impl Parameters {
    /// Parses Plinth's keys of `config`.
    ///
    /// # Errors
    /// One message per bad parameter, naming it: an unknown `plugin.*` or
    /// `remote.*` key, a value that does not parse or is out of range, a
    /// `plugin.*` key without `plugin`.
    pub fn parse(config: &ModelConfig) -> Result<Parameters, Vec<String>> {
        let mut r = Reader { config, problems: Vec::new() };
        r.unknown_keys();
        let parameters = Parameters {
            plugin: r.plugin(),
            pinned: r.flag("pinned", false),
            rollout: r.rollout(),
            gpu_swap_policy: r.gpu_swap_policy(),
            openai_embeddings: r.flag("openai.embeddings", false),
            onnx: OnnxParameters {
                intra_op_threads: r.number("intra_op_thread_count").map(to_usize),
                inter_op_threads: r.number("inter_op_thread_count").map(to_usize),
                allow_spinning: r.flag("session.intra_op.allow_spinning", true),
            },
            remote: r.remote(),
            execute_delay: Duration::from_millis(r.number("execute_delay_ms").unwrap_or(0)),
            missing_files_hint: r.text(MISSING_FILES_HINT).filter(|h| !h.is_empty()).map(str::to_owned),
            generation: r.generation(),
        };
        if r.problems.is_empty() { Ok(parameters) } else { Err(r.problems) }
    }

    /// `reason`, a load failure because files are missing, followed by the
    /// model's `missing_files_hint` when it has one.
    pub fn with_missing_files_hint(&self, reason: String) -> String {
        match &self.missing_files_hint {
            Some(hint) => format!("{reason}; {hint}"),
            None => reason,
        }
    }
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Reads keys of one configuration, collecting a problem per bad value.
struct Reader<'a> {
    config: &'a ModelConfig,
    problems: Vec<String>,
}

impl<'a> Reader<'a> {
    /// The trimmed value of `key`, if set.
    fn text(&self, key: &str) -> Option<&'a str> {
        self.config.parameters.get(key).map(|p| p.string_value.trim())
    }

    fn bad(&mut self, key: &str, what: &str, value: &str) {
        self.problems.push(format!("parameter '{key}' must be {what}, got '{value}'"));
    }

    fn unknown_keys(&mut self) {
        let family = |key: &str| FAMILIES.iter().copied().find(|f| key.starts_with(f));
        let mut unknown: Vec<&String> =
            self.config.parameters.keys().filter(|k| family(k).is_some() && !KEYS.contains(&k.as_str())).collect();
        unknown.sort();
        for key in unknown {
            let prefix = family(key).unwrap_or_default();
            let known: Vec<&str> = KEYS.iter().copied().filter(|k| k.starts_with(prefix)).collect();
            self.problems.push(format!("unknown parameter '{key}'; the {prefix}* parameters are {known:?}"));
        }
    }

    /// `true`/`1` or `false`/`0`; `default` when unset.
    fn flag(&mut self, key: &str, default: bool) -> bool {
        match self.text(key) {
            None => default,
            Some("true" | "1") => true,
            Some("false" | "0") => false,
            Some(v) => {
                self.bad(key, "\"true\" or \"false\" (or \"1\" or \"0\")", v);
                default
            }
        }
    }

    /// A whole decimal number, if set and valid.
    fn number(&mut self, key: &str) -> Option<u64> {
        let v = self.text(key)?;
        let n = v.parse::<u64>().ok();
        if n.is_none() {
            self.bad(key, "a whole number", v);
        }
        n
    }

    /// A whole number from 1 to `max`, if set and valid.
    fn bounded(&mut self, key: &str, max: u64) -> Option<u64> {
        let v = self.text(key)?;
        match v.parse::<u64>() {
            Ok(n @ 1..) if n <= max => Some(n),
            _ => {
                self.bad(key, &format!("a whole number from 1 to {max}"), v);
                None
            }
        }
    }

    fn plugin(&mut self) -> Option<PluginParameters> {
        let Some(file) = self.text(PLUGIN) else {
            let mut about: Vec<&String> = self
                .config
                .parameters
                .keys()
                .filter(|k| k.starts_with("plugin.") && KEYS.contains(&k.as_str()))
                .collect();
            about.sort();
            for key in about {
                self.problems
                    .push(format!("parameter '{key}' is about a plugin, but the model names none ('{PLUGIN}')"));
            }
            return None;
        };
        if file.is_empty() {
            self.problems.push(format!(
                "parameter '{PLUGIN}' is empty; name the plugin's .wasm file or leave the parameter out"
            ));
        }
        let memory_bytes = self.text("plugin.memory_limit").and_then(|v| match v.parse::<bytesize::ByteSize>() {
            Ok(size) if size.as_u64() <= PLUGIN_MAX_MEMORY_BYTES => Some(size.as_u64()),
            Ok(_) => {
                self.bad("plugin.memory_limit", "at most 4GiB (a plugin's 32-bit memory)", v);
                None
            }
            Err(_) => {
                self.bad("plugin.memory_limit", "a size such as 512MiB", v);
                None
            }
        });
        let max_ms = PLUGIN_MAX_TIMEOUT.as_millis() as u64;
        let timeout = self.bounded("plugin.timeout_ms", max_ms).map(Duration::from_millis);
        let instances = self.bounded("plugin.instances", PLUGIN_MAX_INSTANCES as u64).map(to_usize);
        Some(PluginParameters {
            file: file.to_owned(),
            memory_bytes,
            timeout,
            instances,
            warmup: self.warmup(),
            warmup_content_type: self.text("plugin.warmup_content_type").map(str::to_owned),
        })
    }

    /// `plugin.warmup`: file names of `warmup/`, comma-separated.
    fn warmup(&mut self) -> Vec<String> {
        let Some(names) = self.text("plugin.warmup") else { return Vec::new() };
        let files: Vec<String> = names.split(',').map(|f| f.trim().to_owned()).collect();
        let outside = |f: &String| f.is_empty() || f.contains(['/', '\\']) || f == "..";
        if files.iter().any(outside) {
            self.bad("plugin.warmup", "files of warmup/ separated by commas", names);
            return Vec::new();
        }
        files
    }

    fn generation(&mut self) -> GenerationParameters {
        let d = GenerationParameters::default();
        let mut get = |key: &str, max: u64, default: usize| self.bounded(key, max).map_or(default, to_usize);
        GenerationParameters {
            context_length: get("generation.context_length", 1 << 20, d.context_length),
            max_sequences: get("generation.max_sequences", 256, d.max_sequences),
            max_queue: get("generation.max_queue", 1 << 16, d.max_queue),
            prefill_chunk: get("generation.prefill_chunk", 1 << 20, d.prefill_chunk),
            max_tokens: get("generation.max_tokens", 1 << 20, d.max_tokens),
        }
    }

    fn rollout(&mut self) -> Option<String> {
        let json = self.text("rollout")?;
        match serde_json::from_str::<serde_json::Value>(json) {
            Ok(serde_json::Value::Object(_)) => {}
            Ok(_) => self.bad("rollout", "a JSON object (a rollout plan)", json),
            Err(e) => self.problems.push(format!("parameter 'rollout' is not valid JSON: {e}")),
        }
        Some(json.to_owned())
    }

    fn gpu_swap_policy(&mut self) -> GpuSwapPolicy {
        match self.text("gpu_swap_policy") {
            None | Some("refuse") => GpuSwapPolicy::Refuse,
            Some("unload_first") => GpuSwapPolicy::UnloadFirst,
            Some(v) => {
                self.bad("gpu_swap_policy", "\"refuse\" or \"unload_first\"", v);
                GpuSwapPolicy::Refuse
            }
        }
    }

    fn remote(&mut self) -> RemoteParameters {
        let defaults = RemoteParameters::default();
        let set = |v: &&str| !v.is_empty();
        let url = self.text("remote.url").filter(set).and_then(|url| {
            let host = url.get(..7).filter(|scheme| scheme.eq_ignore_ascii_case("http://")).map(|_| &url[7..]);
            match host.filter(|h| !h.is_empty() && !h.starts_with('/') && !h.contains(['?', '#', ' '])) {
                Some(host) => Some(format!("http://{}", host.trim_end_matches('/'))),
                None => {
                    let what = "an http:// URL of a server (http://host:port, an optional path, no query)";
                    self.bad("remote.url", what, url);
                    None
                }
            }
        });
        let version = self.text("remote.version").filter(set).and_then(|v| {
            let parsed = v.parse::<u64>().ok().filter(|_| v == "0" || !v.starts_with('0'));
            if parsed.is_none() {
                self.bad("remote.version", "a version number without leading zeros", v);
            }
            parsed
        });
        RemoteParameters {
            url,
            model: self.text("remote.model").filter(set).map(str::to_owned),
            version,
            timeout: self.number("remote.timeout_ms").map_or(defaults.timeout, |ms| Duration::from_millis(ms.max(1))),
            retries: self.number("remote.retries").map_or(defaults.retries, |n| to_usize(n).min(REMOTE_MAX_RETRIES)),
            repository_control: self.flag("remote.repository_control", false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> ModelConfig {
        let mut config = ModelConfig::default();
        for (k, v) in pairs {
            let value = super::super::proto::ModelParameter { string_value: (*v).to_owned() };
            config.parameters.insert((*k).to_owned(), value);
        }
        config
    }

    #[test]
    fn unset_keys_take_their_defaults() {
        assert_eq!(Parameters::parse(&config(&[("labels", "labels.txt")])).unwrap(), Parameters::default());
    }

    #[test]
    fn every_key_parses_to_its_field() {
        let p = Parameters::parse(&config(&[
            ("plugin", "p.wasm"),
            ("plugin.memory_limit", "512MiB"),
            ("plugin.timeout_ms", " 300 "),
            ("plugin.instances", "2"),
            ("plugin.warmup", "a.png, b.png"),
            ("plugin.warmup_content_type", "image/png"),
            ("pinned", "true"),
            ("rollout", r#"{"steps": [50, 100]}"#),
            ("gpu_swap_policy", "unload_first"),
            ("openai.embeddings", "1"),
            ("intra_op_thread_count", "3"),
            ("session.intra_op.allow_spinning", "0"),
            ("remote.url", "http://host:8000/"),
            ("remote.version", "7"),
            ("remote.retries", "40"),
            ("remote.repository_control", "1"),
            ("execute_delay_ms", "25"),
            ("missing_files_hint", "run make models"),
        ]))
        .unwrap();
        let plugin = p.plugin.clone().unwrap();
        assert_eq!((plugin.file.as_str(), plugin.memory_bytes), ("p.wasm", Some(512 << 20)));
        assert_eq!((plugin.timeout, plugin.instances), (Some(Duration::from_millis(300)), Some(2)));
        assert_eq!(plugin.warmup, ["a.png", "b.png"]);
        assert!(p.pinned && p.openai_embeddings && !p.onnx.allow_spinning && p.remote.repository_control);
        assert_eq!(p.gpu_swap_policy, GpuSwapPolicy::UnloadFirst);
        assert_eq!((p.onnx.intra_op_threads, p.onnx.inter_op_threads), (Some(3), None));
        assert_eq!(p.remote.url.as_deref(), Some("http://host:8000"));
        assert_eq!((p.remote.version, p.remote.retries), (Some(7), REMOTE_MAX_RETRIES));
        assert_eq!(p.execute_delay, Duration::from_millis(25));
        assert_eq!(p.with_missing_files_hint("no model.onnx".into()), "no model.onnx; run make models");
    }

    #[test]
    fn every_bad_parameter_is_named() {
        let problems = Parameters::parse(&config(&[
            ("plugin.timeout_ms", "5"),
            ("plugin.timout_ms", "5"),
            ("pinned", "yes"),
            ("rollout", "[1]"),
            ("gpu_swap_policy", "swap"),
            ("intra_op_thread_count", "many"),
            ("remote.url", "https://host"),
            ("remote.version", "01"),
        ]))
        .unwrap_err();
        let named = |key: &str| problems.iter().any(|p| p.contains(&format!("'{key}'")));
        for key in [
            "plugin.timeout_ms",
            "plugin.timout_ms",
            "pinned",
            "rollout",
            "gpu_swap_policy",
            "intra_op_thread_count",
            "remote.url",
            "remote.version",
        ] {
            assert!(named(key), "{key} not named in {problems:?}");
        }
        assert!(problems.iter().any(|p| p.contains("names none")), "{problems:?}");
    }

    #[test]
    fn plugin_limits_are_bounded() {
        let problems = Parameters::parse(&config(&[
            ("plugin", "p.wasm"),
            ("plugin.memory_limit", "5GiB"),
            ("plugin.timeout_ms", "0"),
            ("plugin.instances", "257"),
            ("plugin.warmup", "../x"),
        ]))
        .unwrap_err();
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(Parameters::parse(&config(&[("plugin", " ")])).unwrap_err()[0].contains("empty"));
    }

    /// The table of keys in docs/model-repository.md is the list Plinth
    /// reads, no more and no fewer.
    #[test]
    fn the_docs_table_lists_every_key() {
        let page =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/model-repository.md")).unwrap();
        let mut documented = std::collections::BTreeSet::new();
        let mut in_table = false;
        for line in page.lines() {
            if line.starts_with("| parameter |") {
                in_table = true;
            } else if !line.starts_with('|') {
                in_table = false;
            } else if in_table && !line.starts_with("|---") {
                let first = line.split('|').nth(1).unwrap_or_default();
                documented.extend(first.split('`').skip(1).step_by(2).map(str::to_owned));
            }
        }
        let keys: std::collections::BTreeSet<String> = KEYS.iter().map(|k| (*k).to_owned()).collect();
        assert_eq!(documented, keys);
    }
}
