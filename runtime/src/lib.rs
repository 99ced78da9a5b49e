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

pub mod backend;
pub mod cli;
pub mod config;
pub mod drain;
pub mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod gpu;
pub mod lifecycle;
pub mod metrics;
pub mod model;
pub mod plugin;
pub mod protocol;
pub mod registry;
pub mod repository;
pub mod residency;
pub mod rollout;
pub mod scheduler;
pub mod server;
pub mod tensor;
pub mod trace;
