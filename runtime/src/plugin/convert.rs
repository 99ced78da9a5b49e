//! Conversions between the host's types and one contract version's
//! WIT-generated ones. Every version's bindings have their own Rust types
//! (structurally the same tensors, requests and answers), so the functions
//! are written once, here, and expanded inside each version's bindings
//! module by [`wit_conversions!`], where `plinth::plugin::types` names that
//! version's types.

/// Expands to a module `convert` of functions between the host's types and
/// those of the bindings it is expanded in. The error conversions are the
/// version's own (0.3.0 has more classes than 0.2.0) and are written beside
/// each expansion.
macro_rules! wit_conversions {
    () => {
        pub mod convert {
            use super::plinth::plugin::types as wit;
            use crate::plugin::{ModelInfo, RawRequest, RawResponse};
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

            pub fn tensors_to_wit(ts: Vec<Tensor>) -> Vec<wit::Tensor> {
                ts.into_iter().map(tensor_to_wit).collect()
            }

            pub fn tensors_from_wit(ts: Vec<wit::Tensor>) -> Vec<Tensor> {
                ts.into_iter().map(tensor_from_wit).collect()
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
                wit::Request {
                    content_type: req.content_type.clone(),
                    body: req.body.clone(),
                    parameters: req.parameters.clone(),
                }
            }

            pub fn request_from_wit(req: wit::Request) -> RawRequest {
                RawRequest { content_type: req.content_type, body: req.body, parameters: req.parameters }
            }

            pub fn response_to_wit(r: RawResponse) -> wit::Response {
                wit::Response { content_type: r.content_type, body: r.body }
            }

            pub fn response_from_wit(r: wit::Response) -> RawResponse {
                RawResponse { content_type: r.content_type, body: r.body }
            }
        }
    };
}

pub(super) use wit_conversions;
