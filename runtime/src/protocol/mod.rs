//! The KServe v2 (Open Inference Protocol) wire formats: the JSON messages
//! ([`json`]) with their tensor data ([`json_data`]) and the binary tensor
//! data extension ([`binary`]) over HTTP, the gRPC messages and their tensor codec ([`grpc`]), and the rules both
//! front ends share, written once: request parameters ([`parameters`]),
//! what an inference request asks for besides its inputs ([`request`]),
//! repository load and unload requests ([`repository`]) and where a request
//! puts a tensor in shared memory ([`shared_memory`]). Bytes and messages
//! in, tensors out, and back; no HTTP or gRPC framework. The front ends
//! (`server`) and the remote backend (`backend::remote`), which speaks the
//! same protocol to another server, both use it.

pub(crate) mod binary;
pub(crate) mod grpc;
pub mod json;
pub(crate) mod json_data;
pub(crate) mod parameters;
pub(crate) mod repository;
pub(crate) mod request;
pub(crate) mod shared_memory;
