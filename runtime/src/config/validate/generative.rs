//! The rules of a generative model: `model_transaction_policy { decoupled:
//! true }` (Triton's name for a model that answers one request with many
//! responses), which in Plinth is a decode loop over an ONNX Runtime GenAI
//! export with a tokenizer plugin (`docs/generative.md`).

use super::{Kind, Problems};
use crate::config::ModelConfig;
use crate::config::parameters::PLUGIN;

/// What `model_transaction_policy.decoupled` needs, and the `generation.*`
/// keys only a generative model takes.
pub(super) fn check(config: &ModelConfig, p: &mut Problems) {
    let decoupled = config.model_transaction_policy.as_ref().is_some_and(|t| t.decoupled);
    if !decoupled {
        let mut keys: Vec<&String> = config.parameters.keys().filter(|k| k.starts_with("generation.")).collect();
        keys.sort();
        for key in keys {
            p.add(format!(
                "parameter '{key}' is for generative models, and this one is not \
                 (model_transaction_policy {{ decoupled: true }} makes one)"
            ));
        }
        return;
    }
    let field = "model_transaction_policy.decoupled";
    let mut needs = |ok: bool, what: &str| {
        if !ok {
            p.add(format!("'{field}' is set, so this is a generative model, which {what}"));
        }
    };
    let onnx = matches!(config.platform.as_str(), "" | "onnxruntime_onnx")
        && matches!(config.backend.as_str(), "" | "onnxruntime");
    needs(onnx, "Plinth runs with ONNX Runtime (platform \"onnxruntime_onnx\" or backend \"onnxruntime\")");
    needs(config.parameters.contains_key(PLUGIN), "needs its tokenizer plugin (parameter 'plugin')");
    needs(config.max_batch_size == 0, "batches per decode step by itself: set max_batch_size 0");
    needs(
        config.input.is_empty() && config.output.is_empty(),
        "declares no inputs or outputs: its tensors are text_input and text_output (Triton's vLLM interface)",
    );
    needs(config.scheduling_choice.is_none(), "takes no dynamic_batching, sequence_batching or ensemble_scheduling");
    needs(config.response_cache.is_none(), "caches no responses (remove response_cache)");
    let cpu =
        |g: &&crate::config::proto::ModelInstanceGroup| matches!(Kind::try_from(g.kind), Ok(Kind::Cpu)) && g.count <= 1;
    let one_cpu = config.instance_group.iter().all(|g| cpu(&g)) && config.instance_group.len() <= 1;
    needs(one_cpu, "runs as one instance on the CPU (an instance_group of KIND_CPU, count 1, or none)");
}
