//! Plinth: a model-serving runtime that speaks the KServe v2 / Open
//! Inference Protocol over a Triton-style model repository, runs models
//! natively (ONNX Runtime) and runs every model-specific step in a
//! WebAssembly sandbox.
//!
//! Request path: `server` (HTTP) → `registry` (model + version) →
//! `model` (plugin preprocess → checks → `scheduler` → `backend` → plugin
//! postprocess).
//! `lifecycle` loads the `repository` into the `registry`.

#![warn(missing_docs)]

pub(crate) mod backend;
pub mod cli;
pub mod config;
pub(crate) mod drain;
pub mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub(crate) mod generate;
pub(crate) mod gpu;
pub(crate) mod lifecycle;
pub mod metrics;
pub(crate) mod model;
pub mod plugin;
pub mod protocol;
pub(crate) mod registry;
pub(crate) mod repository;
pub(crate) mod residency;
pub(crate) mod rollout;
pub mod scheduler;
pub(crate) mod server;
pub mod tensor;
pub mod trace;
