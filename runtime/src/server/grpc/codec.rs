//! The server's answers and settings as gRPC messages: model metadata,
//! statistics, and the trace and log settings of Triton's extensions. The
//! inference tensors have their own codec (`protocol::grpc`).

use std::collections::HashMap;

use crate::metrics::{ModelStatistics, Total};
use crate::protocol::grpc::proto as pb;
use crate::protocol::json::{ModelMetadata, TensorMetadata};
use crate::trace::Update;

/// Model metadata as `ModelMetadataResponse`.
pub fn model_metadata(m: ModelMetadata) -> pb::ModelMetadataResponse {
    let tensors = |list: Vec<TensorMetadata>| {
        list.into_iter()
            .map(|t| pb::model_metadata_response::TensorMetadata {
                name: t.name,
                datatype: t.datatype.into(),
                shape: t.shape,
            })
            .collect()
    };
    pb::ModelMetadataResponse {
        name: m.name,
        versions: m.versions,
        platform: m.platform,
        inputs: tensors(m.inputs),
        outputs: tensors(m.outputs),
    }
}

/// A `TraceSettingRequest`'s `settings` as an update: a setting with no
/// values clears a model's.
pub fn trace_update(settings: HashMap<String, pb::trace_setting_request::SettingValue>) -> Update {
    settings.into_iter().map(|(key, v)| (key, v.value)).collect()
}

/// The trace settings (as the HTTP extension's JSON object) as
/// `TraceSettingResponse`: each value a list of strings.
pub fn trace_settings(settings: serde_json::Value) -> pb::TraceSettingResponse {
    use pb::trace_setting_response::SettingValue;
    let settings = settings.as_object().into_iter().flatten().map(|(key, value)| {
        let value = match value {
            serde_json::Value::Array(items) => items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect(),
            other => vec![other.as_str().map_or_else(|| other.to_string(), str::to_owned)],
        };
        (key.clone(), SettingValue { value })
    });
    pb::TraceSettingResponse { settings: settings.collect() }
}

/// A `LogSettingsRequest`'s `settings` as the JSON object the logging
/// extension reads (a setting with no value is `null`).
pub fn log_update(
    settings: HashMap<String, pb::log_settings_request::SettingValue>,
) -> serde_json::Map<String, serde_json::Value> {
    use pb::log_settings_request::setting_value::ParameterChoice as P;
    settings
        .into_iter()
        .map(|(key, value)| {
            let value = match value.parameter_choice {
                Some(P::BoolParam(b)) => serde_json::Value::Bool(b),
                Some(P::Uint32Param(n)) => n.into(),
                Some(P::StringParam(s)) => serde_json::Value::String(s),
                None => serde_json::Value::Null,
            };
            (key, value)
        })
        .collect()
}

/// The log settings as the gRPC `LogSettingsResponse` carries them.
pub fn log_settings(settings: serde_json::Value) -> pb::LogSettingsResponse {
    use pb::log_settings_response::SettingValue;
    use pb::log_settings_response::setting_value::ParameterChoice as P;
    let value = |v: &serde_json::Value| match v {
        serde_json::Value::Bool(b) => Some(P::BoolParam(*b)),
        serde_json::Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()).map(P::Uint32Param),
        serde_json::Value::String(s) => Some(P::StringParam(s.clone())),
        _ => None,
    };
    let settings = settings.as_object().into_iter().flatten();
    pb::LogSettingsResponse {
        settings: settings.map(|(k, v)| (k.clone(), SettingValue { parameter_choice: value(v) })).collect(),
    }
}

/// A model version's statistics as `ModelStatistics`.
pub fn statistics(s: ModelStatistics) -> pb::ModelStatistics {
    let d = |t: Total| Some(pb::StatisticDuration { count: t.count, ns: t.ns });
    let i = s.inference_stats;
    pb::ModelStatistics {
        name: s.name,
        version: s.version,
        last_inference: s.last_inference,
        inference_count: s.inference_count,
        execution_count: s.execution_count,
        inference_stats: Some(pb::InferStatistics {
            success: d(i.success),
            fail: d(i.fail),
            queue: d(i.queue),
            compute_input: d(i.compute_input),
            compute_infer: d(i.compute_infer),
            compute_output: d(i.compute_output),
            cache_hit: d(i.cache_hit),
            cache_miss: d(i.cache_miss),
        }),
        batch_stats: s
            .batch_stats
            .into_iter()
            .map(|b| pb::InferBatchStatistics {
                batch_size: b.batch_size,
                compute_input: d(b.compute_input),
                compute_infer: d(b.compute_infer),
                compute_output: d(b.compute_output),
            })
            .collect(),
    }
}

/// An error answer on a `ModelStreamInfer` stream to the request `id`.
pub fn stream_error(id: String, message: &str) -> pb::ModelStreamInferResponse {
    let infer_response = pb::ModelInferResponse { id, ..Default::default() };
    pb::ModelStreamInferResponse { error_message: message.to_owned(), infer_response: Some(infer_response) }
}
