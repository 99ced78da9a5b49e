//! The backends Plinth serves, listed once: which `platform` and `backend`
//! names of a configuration select each (Triton's names), what a refusal
//! lists, and the kind the loader dispatches on.

use super::ModelConfig;

/// Which backend serves a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// ONNX Runtime: platform `onnxruntime_onnx`, backend `onnxruntime`
    /// (the default when the configuration names neither).
    OnnxRuntime,
    /// libtorch: platform `pytorch_libtorch`, backend `pytorch`.
    Pytorch,
    /// A model of a remote KServe v2 server: backend `remote`.
    Remote,
    /// Each output a copy of its input: Triton's backend `identity`.
    Identity,
}

/// Every backend served: its kind, Triton's platform name where it has one,
/// and its backend name.
const SERVED: &[(BackendKind, Option<&str>, &str)] = &[
    (BackendKind::OnnxRuntime, Some("onnxruntime_onnx"), "onnxruntime"),
    (BackendKind::Pytorch, Some("pytorch_libtorch"), "pytorch"),
    (BackendKind::Remote, None, "remote"),
    (BackendKind::Identity, None, "identity"),
];

/// The platform of ensemble models.
pub const ENSEMBLE_PLATFORM: &str = "ensemble";

impl BackendKind {
    /// The backend a `platform` and `backend` pair names: each may be empty,
    /// and neither given is ONNX Runtime; `None` for a pair Plinth does not
    /// serve (an ensemble's included: it has no backend).
    pub fn named(platform: &str, backend: &str) -> Option<BackendKind> {
        if platform.is_empty() && backend.is_empty() {
            return Some(BackendKind::OnnxRuntime);
        }
        let matches = |(_, p, b): &(BackendKind, Option<&str>, &str)| {
            (platform.is_empty() || Some(platform) == *p) && (backend.is_empty() || backend == *b)
        };
        SERVED.iter().find(|entry| matches(entry)).map(|(kind, _, _)| *kind)
    }

    /// The backend `config` names.
    ///
    /// # Errors
    /// A message naming both names and listing what Plinth serves, for a
    /// pair it does not.
    pub fn of(config: &ModelConfig) -> Result<BackendKind, String> {
        let (platform, backend) = (config.platform.as_str(), config.backend.as_str());
        BackendKind::named(platform, backend).ok_or_else(|| {
            format!("platform '{platform}' / backend '{backend}' is not a pair Plinth serves: {}", served())
        })
    }

    /// Triton's backend name, as the served configuration's `backend` field
    /// gives it.
    pub fn name(self) -> &'static str {
        SERVED.iter().find(|(kind, _, _)| *kind == self).map_or("", |(_, _, name)| name)
    }

    /// Triton's platform name, for the backends that have one.
    pub fn platform(self) -> Option<&'static str> {
        SERVED.iter().find(|(kind, _, _)| *kind == self).and_then(|(_, platform, _)| *platform)
    }
}

/// What Plinth serves, as every message that refuses a platform or backend
/// lists it.
pub fn served() -> String {
    let each = SERVED.iter().map(|(_, platform, backend)| match platform {
        Some(platform) => format!("platform '{platform}' (backend '{backend}')"),
        None => format!("backend '{backend}'"),
    });
    let listed: Vec<String> = each.collect();
    format!("{}, or platform '{ENSEMBLE_PLATFORM}'", listed.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_or_pair_selects_its_backend() {
        let cases = [
            ("", "", Some(BackendKind::OnnxRuntime)),
            ("onnxruntime_onnx", "", Some(BackendKind::OnnxRuntime)),
            ("", "onnxruntime", Some(BackendKind::OnnxRuntime)),
            ("pytorch_libtorch", "pytorch", Some(BackendKind::Pytorch)),
            ("", "pytorch", Some(BackendKind::Pytorch)),
            ("", "remote", Some(BackendKind::Remote)),
            ("", "identity", Some(BackendKind::Identity)),
            ("onnxruntime_onnx", "pytorch", None),
            ("remote", "", None),
            ("tensorflow_savedmodel", "", None),
            (ENSEMBLE_PLATFORM, "", None),
        ];
        for (platform, backend, kind) in cases {
            assert_eq!(BackendKind::named(platform, backend), kind, "{platform} / {backend}");
        }
        assert_eq!(BackendKind::Pytorch.name(), "pytorch");
        assert_eq!(BackendKind::OnnxRuntime.platform(), Some("onnxruntime_onnx"));
        assert_eq!(BackendKind::Identity.platform(), None);
    }

    #[test]
    fn the_list_names_every_backend_once() {
        assert_eq!(
            served(),
            "platform 'onnxruntime_onnx' (backend 'onnxruntime'), platform 'pytorch_libtorch' (backend 'pytorch'), \
             backend 'remote', backend 'identity', or platform 'ensemble'"
        );
    }
}
