//! The KServe v2 gRPC front end (`inference.GRPCInferenceService`, from
//! `proto/grpc_service.proto`) on tonic. Like the HTTP routes, it only
//! translates between protobuf messages and the [`Service`] core: the
//! handlers ([`service`]), one inference ([`infer`]) and the streams of
//! `ModelStreamInfer` ([`stream`]), the answers' messages ([`codec`]), and
//! the layers over every gRPC service ([`layers`]).

pub mod codec;
mod generate;
pub mod infer;
pub mod layers;
pub mod service;
pub mod stream;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use tonic::codec::CompressionEncoding;

pub use layers::{MessageLimit, Restricted};
pub use service::Grpc;

use super::Service;
use crate::protocol::grpc::proto::grpc_inference_service_server::GrpcInferenceServiceServer;

/// The inference service over `service`: messages up to the server's body
/// limit (`--http-max-body-bytes`, which bounds gRPC messages too), gzip and
/// deflate taken and sent.
pub fn inference(service: &Arc<Service>) -> GrpcInferenceServiceServer<Grpc> {
    GrpcInferenceServiceServer::new(Grpc { service: service.clone() })
        .max_decoding_message_size(service.max_body_bytes)
        .max_encoding_message_size(usize::MAX)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate)
        .send_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Deflate)
}
