//! Conversions between the host's types and the WIT-generated ones.

use super::wit;
use super::{ModelInfo, RawRequest};
use crate::tensor::{DataType, Tensor, TensorSpec};

pub fn datatype_to_wit(dt: DataType) -> wit::Datatype {
    use wit::Datatype as W;
    match dt {
        DataType::Bool => W::Bool,
        DataType::Uint8 => W::Uint8,
        DataType::Uint16 => W::Uint16,
        DataType::Uint32 => W::Uint32,
        DataType::Uint64 => W::Uint64,
        DataType::Int8 => W::Int8,
        DataType::Int16 => W::Int16,
        DataType::Int32 => W::Int32,
        DataType::Int64 => W::Int64,
        DataType::Fp16 => W::Fp16,
        DataType::Fp32 => W::Fp32,
        DataType::Fp64 => W::Fp64,
        DataType::Bf16 => W::Bf16,
        DataType::Bytes => W::Bytes,
    }
}

pub fn datatype_from_wit(dt: wit::Datatype) -> DataType {
    use wit::Datatype as W;
    match dt {
        W::Bool => DataType::Bool,
        W::Uint8 => DataType::Uint8,
        W::Uint16 => DataType::Uint16,
        W::Uint32 => DataType::Uint32,
        W::Uint64 => DataType::Uint64,
        W::Int8 => DataType::Int8,
        W::Int16 => DataType::Int16,
        W::Int32 => DataType::Int32,
        W::Int64 => DataType::Int64,
        W::Fp16 => DataType::Fp16,
        W::Fp32 => DataType::Fp32,
        W::Fp64 => DataType::Fp64,
        W::Bf16 => DataType::Bf16,
        W::Bytes => DataType::Bytes,
    }
}

pub fn tensor_to_wit(t: Tensor) -> wit::Tensor {
    wit::Tensor { name: t.name, datatype: datatype_to_wit(t.datatype), shape: t.shape, data: t.data }
}

pub fn tensor_from_wit(t: wit::Tensor) -> Tensor {
    Tensor { name: t.name, datatype: datatype_from_wit(t.datatype), shape: t.shape, data: t.data }
}

fn spec_to_wit(s: &TensorSpec) -> wit::TensorSpec {
    wit::TensorSpec { name: s.name.clone(), datatype: datatype_to_wit(s.datatype), dims: s.dims.clone() }
}

pub fn model_info(info: &ModelInfo) -> wit::ModelInfo {
    wit::ModelInfo {
        name: info.name.clone(),
        version: info.version,
        max_batch_size: info.signature.max_batch_size,
        inputs: info.signature.inputs.iter().map(spec_to_wit).collect(),
        outputs: info.signature.outputs.iter().map(spec_to_wit).collect(),
        parameters: info.parameters.clone(),
        metadata: info.metadata.clone(),
    }
}

pub fn request(req: &RawRequest) -> wit::Request {
    wit::Request { content_type: req.content_type.clone(), body: req.body.clone(), parameters: req.parameters.clone() }
}
