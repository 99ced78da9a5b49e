//! The KServe v2 (Open Inference Protocol) wire formats over HTTP: the JSON
//! messages ([`json`]) and the binary tensor data extension ([`binary`]),
//! which request parameters Plinth acts on ([`parameters`], for gRPC too),
//! and where a request puts a tensor in shared memory ([`shared_memory`]).
//! Bytes and messages in, tensors out, and back; no HTTP framework. The
//! HTTP front end (`server`) and the remote backend (`backend::remote`),
//! which speaks the same protocol to another server, both use it.

pub mod binary;
pub mod json;
pub mod parameters;
pub mod shared_memory;
