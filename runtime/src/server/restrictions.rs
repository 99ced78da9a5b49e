//! Restricted APIs, Triton's `--http-restricted-api` and
//! `--grpc-restricted-protocol` ("Limit Endpoint Access",
//! `docs/customization_guide/inference_protocols.md`): a group of APIs
//! answers only requests that carry a header with a shared secret value,
//! e.g. model loading for operators only. Each flag is
//! `<api>,<api>,...:<key>=<value>`; over gRPC the header is
//! `triton-grpc-protocol-<key>`, over HTTP `<key>`.

use std::collections::BTreeMap;

/// The API groups a restriction names (Triton's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Api {
    /// Liveness and readiness (and gRPC's `grpc.health.v1.Health`).
    Health,
    /// Server and model metadata.
    Metadata,
    /// Inference (`infer`, `predict`, `ModelInfer`, `ModelStreamInfer`).
    Inference,
    /// The shared-memory extension.
    SharedMemory,
    /// The model configuration extension.
    ModelConfig,
    /// The model repository extension (index, load, unload).
    ModelRepository,
    /// The statistics extension.
    Statistics,
    /// Trace settings.
    Trace,
    /// The logging extension.
    Logging,
}

impl Api {
    const ALL: [Api; 9] = [
        Api::Health,
        Api::Metadata,
        Api::Inference,
        Api::SharedMemory,
        Api::ModelConfig,
        Api::ModelRepository,
        Api::Statistics,
        Api::Trace,
        Api::Logging,
    ];

    /// The group's name in the flags.
    pub fn name(self) -> &'static str {
        match self {
            Api::Health => "health",
            Api::Metadata => "metadata",
            Api::Inference => "inference",
            Api::SharedMemory => "shared-memory",
            Api::ModelConfig => "model-config",
            Api::ModelRepository => "model-repository",
            Api::Statistics => "statistics",
            Api::Trace => "trace",
            Api::Logging => "logging",
        }
    }
}

/// The header and value one group of APIs requires.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Secret {
    header: String,
    value: String,
}

/// Which APIs require which header; empty restricts nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restrictions(BTreeMap<Api, Secret>);

/// Which front end a set of restrictions is for: the flag name, what
/// Triton calls a group, and the prefix of the header.
#[derive(Clone, Copy, Debug)]
pub enum Front {
    /// `--http-restricted-api`; the header is the key.
    Http,
    /// `--grpc-restricted-protocol`; the header is
    /// `triton-grpc-protocol-<key>`.
    Grpc,
}

impl Front {
    fn flag(self) -> &'static str {
        match self {
            Front::Http => "--http-restricted-api",
            Front::Grpc => "--grpc-restricted-protocol",
        }
    }

    fn group(self) -> &'static str {
        match self {
            Front::Http => "api",
            Front::Grpc => "protocol",
        }
    }

    fn header(self, key: &str) -> String {
        match self {
            Front::Http => key.to_ascii_lowercase(),
            Front::Grpc => format!("triton-grpc-protocol-{}", key.to_ascii_lowercase()),
        }
    }
}

impl Restrictions {
    /// The restrictions of the flags `specs`, each
    /// `<api>,<api>,...:<key>=<value>`, for `front`.
    ///
    /// # Errors
    /// A message naming the flag for a malformed value, an unknown group
    /// (Triton's text: `unknown restricted protocol 'x'`), or a group named
    /// in two flags (`protocol 'health' can not be specified in multiple
    /// config groups`).
    pub fn parse(specs: &[String], front: Front) -> Result<Restrictions, String> {
        let mut restrictions = BTreeMap::new();
        for spec in specs {
            let malformed = || format!("{} expects <{}>,...:<key>=<value>, got '{spec}'", front.flag(), front.group());
            let (groups, secret) = spec.rsplit_once(':').ok_or_else(malformed)?;
            let (key, value) = secret.split_once('=').ok_or_else(malformed)?;
            if key.is_empty() || groups.is_empty() {
                return Err(malformed());
            }
            for name in groups.split(',').map(str::trim) {
                let api = Api::ALL.into_iter().find(|a| a.name() == name).ok_or_else(|| {
                    format!("{}: unknown restricted {} '{name}'; the groups are {:?}", front.flag(), front.group(), {
                        Api::ALL.map(Api::name)
                    })
                })?;
                let secret = Secret { header: front.header(key), value: value.to_owned() };
                if restrictions.insert(api, secret).is_some() {
                    return Err(format!(
                        "{}: {} '{name}' can not be specified in multiple config groups",
                        front.flag(),
                        front.group()
                    ));
                }
            }
        }
        Ok(Restrictions(restrictions))
    }

    /// Whether requests to `api` need a header.
    pub fn restricts(&self, api: Api) -> bool {
        self.0.contains_key(&api)
    }

    /// Whether a request to `api` whose headers `header` looks up may pass.
    ///
    /// # Errors
    /// The header it lacks (or carries with another value).
    pub fn check<'a>(&self, api: Api, header: impl Fn(&str) -> Option<&'a str>) -> Result<(), String> {
        match self.0.get(&api) {
            Some(secret) if header(&secret.header) != Some(secret.value.as_str()) => Err(secret.header.clone()),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(specs: &[&str], front: Front) -> Result<Restrictions, String> {
        Restrictions::parse(&specs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(), front)
    }

    #[test]
    fn a_group_needs_its_header_and_value() {
        let r =
            parse(&["model-repository:admin-key=admin-value", "inference,health:infer-key=v=1"], Front::Grpc).unwrap();
        let headers = |pairs: &'static [(&'static str, &'static str)]| {
            move |h: &str| pairs.iter().find(|(k, _)| *k == h).map(|(_, v)| *v)
        };
        assert_eq!(r.check(Api::Inference, headers(&[])), Err("triton-grpc-protocol-infer-key".into()));
        assert!(r.check(Api::Inference, headers(&[("triton-grpc-protocol-infer-key", "v=1")])).is_ok());
        assert!(r.check(Api::Health, headers(&[("triton-grpc-protocol-infer-key", "wrong")])).is_err());
        assert!(r.check(Api::ModelRepository, headers(&[("triton-grpc-protocol-infer-key", "v=1")])).is_err());
        assert!(r.check(Api::Statistics, headers(&[])).is_ok(), "groups not named stay open");
        let http = parse(&["statistics:Admin-Key=s"], Front::Http).unwrap();
        assert!(http.check(Api::Statistics, headers(&[("admin-key", "s")])).is_ok());
    }

    #[test]
    fn bad_flags_are_refused_with_triton_texts() {
        let unknown = parse(&["model-reposit,health:k1=v1"], Front::Grpc).unwrap_err();
        assert!(unknown.contains("unknown restricted protocol 'model-reposit'"), "{unknown}");
        let twice = parse(&["model-repository,health:k1=v1", "metadata,health:k2=v2"], Front::Grpc).unwrap_err();
        assert!(twice.contains("protocol 'health' can not be specified in multiple config groups"), "{twice}");
        for bad in ["health", "health:novalue", ":k=v", "health:=v"] {
            let e = parse(&[bad], Front::Http).unwrap_err();
            assert!(e.starts_with("--http-restricted-api expects <api>,...:<key>=<value>"), "{bad}: {e}");
        }
    }
}
