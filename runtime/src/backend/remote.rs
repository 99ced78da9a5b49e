//! Delegation to a remote KServe v2 server (Triton, KServe, another Plinth):
//! tensors are forwarded over HTTP with the binary tensor data extension, so
//! plugins, batching and metrics work as for a local model.
//!
//! The configuration names the remote in `parameters`:
//! `remote.url` (e.g. `http://10.0.0.7:8000`, required), `remote.model`
//! (default: the local name), `remote.version` (default: the remote's
//! choice), `remote.timeout_ms` (each HTTP exchange, default 5000),
//! `remote.retries` (extra attempts after a refused connection or a 503,
//! default 2) and `remote.repository_control` (`"1"`: load the remote model
//! when this one loads, and unload it when no loaded model of this server
//! uses it any more).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use backon::{BlockingRetryable, ExponentialBuilder};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Backend, BackendError, BackendKind, Description, Framework, LoadContext, ModelIo, Placement, shared};
use crate::config::Signature;
use crate::config::parameters::RemoteParameters;
use crate::protocol::binary::{self, HEADER_LENGTH};
use crate::protocol::json::{self, InputTensor, TensorList};
use crate::tensor::{DataType, Tensor};

/// The largest response read from a remote, in bytes.
const MAX_RESPONSE_BYTES: u64 = 1 << 30;

/// Remote models this server loaded through `remote.repository_control`,
/// keyed by (URL, model), with the number of live versions of local models
/// that use each: the remote model is unloaded when the count falls to 0,
/// so a reload, a failed load or a second local model never unloads it from
/// under a model still serving.
static CONTROLLED: Mutex<Option<HashMap<(String, String), usize>>> = Mutex::new(None);

/// Where and how to reach the remote model, from `config.pbtxt`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteConfig {
    /// Base URL of the remote server, without a trailing `/`.
    pub url: String,
    /// The model's name on the remote.
    pub model: String,
    /// The remote version; `None` lets the remote choose.
    pub version: Option<u64>,
    /// The limit on each HTTP exchange with the remote.
    pub timeout: Duration,
    /// Extra attempts after a refused connection or a 503.
    pub retries: usize,
    /// Whether loading and unloading this model loads and unloads the
    /// remote one through its repository API.
    pub repository_control: bool,
}

impl RemoteConfig {
    /// The remote model `keys` (the parsed `remote.*` parameters) name;
    /// `name` is the local model's name, the default remote one.
    ///
    /// # Errors
    /// A message naming the parameter when `remote.url` is missing or
    /// `remote.model` is not a model name.
    pub fn from_parameters(keys: &RemoteParameters, name: &str) -> Result<RemoteConfig, String> {
        let url = keys.url.clone().ok_or("a remote model needs the parameter 'remote.url' (e.g. http://host:8000)")?;
        let model = keys.model.as_deref().unwrap_or(name);
        if !crate::repository::is_model_name(model) || model.contains(['?', '#', '%']) {
            return Err(format!("parameter 'remote.model' is not a model name: '{model}'"));
        }
        Ok(RemoteConfig {
            url,
            model: model.to_owned(),
            version: keys.version,
            timeout: keys.timeout,
            retries: keys.retries,
            repository_control: keys.repository_control,
        })
    }

    /// `{url}/v2/models/{model}[/versions/{version}]`.
    fn model_url(&self) -> String {
        match self.version {
            Some(v) => format!("{}/v2/models/{}/versions/{v}", self.url, self.model),
            None => format!("{}/v2/models/{}", self.url, self.model),
        }
    }

    /// How errors name the remote.
    fn label(&self) -> String {
        format!("remote model '{}' at {}", self.model, self.url)
    }
}

/// Requests a remote model forwards at once without an `instance_group`:
/// each instance holds one exchange, so one slow answer does not queue the
/// rest behind it.
const DEFAULT_INSTANCES: usize = 8;

/// The remote backend: models of another KServe v2 server.
pub struct Remote;

impl Framework for Remote {
    fn kind(&self) -> BackendKind {
        BackendKind::Remote
    }

    fn default_instances(&self) -> usize {
        DEFAULT_INSTANCES
    }

    fn load(&self, model: &LoadContext<'_>, placements: &[Placement]) -> Result<Vec<Arc<dyn Backend>>, String> {
        let config = RemoteConfig::from_parameters(&model.parameters.remote, model.name)?;
        RemoteModel::connect(config, model.signature, placements.len()).map(shared)
    }
}

/// A connection pool to one remote model, shared by a model's instances.
struct Connection {
    config: RemoteConfig,
    agent: ureq::Agent,
    /// Whether this version counts in [`CONTROLLED`] (its load succeeded).
    controls: bool,
}

/// A remote model: tensors in, tensors out, over HTTP.
pub struct RemoteModel {
    remote: Arc<Connection>,
    description: Description,
}

/// Why one HTTP exchange failed.
enum Failure {
    /// No connection: the request cannot have reached the remote.
    Unreachable(String),
    /// The exchange broke after the request may have reached the remote (a
    /// reset, a redirect, an answer too large): not retried.
    Broken(String),
    /// No answer within the timeout; the request may have run.
    TimedOut,
    /// The remote answered with this status and message.
    Status(u16, String),
    /// The answer could not be read as a v2 response.
    Malformed(String),
}

impl Failure {
    /// Worth another attempt: the request cannot have run, or the remote
    /// said it is overloaded.
    fn retryable(&self) -> bool {
        matches!(self, Failure::Unreachable(_) | Failure::Status(503 | 429, _))
    }

    fn into_backend_error(self, remote: &RemoteConfig) -> BackendError {
        let label = remote.label();
        match self {
            Failure::Unreachable(m) => BackendError::Unavailable(format!("{label} cannot be reached: {m}")),
            Failure::Broken(m) => BackendError::BadGateway(format!("{label} broke off the exchange: {m}")),
            Failure::TimedOut => BackendError::Unavailable(format!(
                "{label} did not answer within remote.timeout_ms = {} ms",
                remote.timeout.as_millis()
            )),
            Failure::Status(400, m) => BackendError::InvalidInput(format!("{label} refused the request: {m}")),
            Failure::Status(s @ (404 | 429 | 503), m) => {
                BackendError::Unavailable(format!("{label} cannot serve (HTTP {s}): {m}"))
            }
            Failure::Status(s, m) => BackendError::BadGateway(format!("{label} failed (HTTP {s}): {m}")),
            Failure::Malformed(m) => BackendError::BadGateway(format!("{label} sent a malformed answer: {m}")),
        }
    }
}

/// The v2 model metadata response, as far as it is checked.
#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    platform: String,
    inputs: Vec<TensorMetadata>,
    outputs: Vec<TensorMetadata>,
}

#[derive(Deserialize)]
struct TensorMetadata {
    name: String,
    datatype: String,
    shape: Vec<i64>,
}

/// A v2 inference response; its outputs have the fields of request inputs.
#[derive(Deserialize)]
struct Response {
    outputs: Vec<InputTensor>,
}

impl TensorList for Response {
    const KEY: &'static str = "outputs";
    fn tensors(&mut self) -> &mut [InputTensor] {
        &mut self.outputs
    }
}

impl RemoteModel {
    /// Connects to the remote model: loads it first when
    /// `repository_control` is set, then reads its metadata, which the
    /// caller checks against the configuration like a local model file's.
    /// A remote whose metadata lists no tensors (the KServe Python server's
    /// custom models) is taken to have the configured ones, `signature`.
    /// Returns `instances` backends sharing one connection pool.
    ///
    /// # Errors
    /// A message naming the remote when it cannot be reached, refuses the
    /// load, has no such model, or sends metadata that is not v2 JSON.
    pub fn connect(config: RemoteConfig, signature: &Signature, instances: usize) -> Result<Vec<RemoteModel>, String> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(config.timeout))
            .http_status_as_error(false)
            .build()
            .into();
        let mut remote = Connection { config, agent, controls: false };
        let label = remote.config.label();
        if remote.config.repository_control {
            let url = format!("{}/v2/repository/models/{}/load", remote.config.url, remote.config.model);
            remote
                .call(|| remote.send(remote.agent.post(&url), b"").map(drop))
                .map_err(|e| format!("{e} (loading it)"))?;
            let key = (remote.config.url.clone(), remote.config.model.clone());
            *CONTROLLED.lock().get_or_insert_default().entry(key).or_default() += 1;
            remote.controls = true;
        }
        let remote = Arc::new(remote);
        let body = remote.call(|| remote.send_get(&remote.config.model_url())).map_err(|e| e.to_string())?;
        let meta: Metadata = serde_json::from_slice(&body)
            .map_err(|e| format!("{label} sent metadata that is not KServe v2 JSON: {e}"))?;
        let io = |list: Vec<TensorMetadata>| -> Vec<ModelIo> {
            list.into_iter()
                .map(|t| ModelIo {
                    datatype: DataType::from_name(&t.datatype),
                    type_name: t.datatype,
                    name: t.name,
                    shape: t.shape,
                })
                .collect()
        };
        let (mut inputs, mut outputs) = (io(meta.inputs), io(meta.outputs));
        if inputs.is_empty() && outputs.is_empty() {
            if signature.inputs.is_empty() || signature.outputs.is_empty() {
                return Err(format!(
                    "{label} lists no inputs or outputs in its metadata: declare every input and output in config.pbtxt"
                ));
            }
            let batching = signature.max_batch_size > 0;
            inputs = signature.inputs.iter().map(|s| ModelIo::from_spec(s, batching)).collect();
            outputs = signature.outputs.iter().map(|s| ModelIo::from_spec(s, batching)).collect();
        }
        let description = Description {
            kind: BackendKind::Remote,
            platform: meta.platform,
            inputs,
            outputs,
            metadata: Vec::new(),
            remote: true,
        };
        Ok((0..instances).map(|_| RemoteModel { remote: remote.clone(), description: description.clone() }).collect())
    }
}

impl Connection {
    /// Runs `attempt`, again after a refused connection or a 503, with
    /// exponential backoff and jitter, at most `retries` more times.
    fn call<T>(&self, attempt: impl FnMut() -> Result<T, Failure>) -> Result<T, BackendError> {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(1))
            .with_max_times(self.config.retries)
            .with_jitter();
        attempt.retry(backoff).when(Failure::retryable).call().map_err(|f| f.into_backend_error(&self.config))
    }

    fn send_get(&self, url: &str) -> Result<Vec<u8>, Failure> {
        let response = self.agent.get(url).call().map_err(unreachable)?;
        read(response).map(|(_, body)| body)
    }

    /// POSTs `body`; returns the response's JSON header length (when given)
    /// and body.
    fn send(
        &self,
        request: ureq::RequestBuilder<ureq::typestate::WithBody>,
        body: &[u8],
    ) -> Result<(Option<usize>, Vec<u8>), Failure> {
        read(request.send(body).map_err(unreachable)?)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if !self.controls {
            return;
        }
        let key = (self.config.url.clone(), self.config.model.clone());
        {
            let mut controlled = CONTROLLED.lock();
            let users = controlled.get_or_insert_default().entry(key.clone()).or_default();
            *users = users.saturating_sub(1);
            if *users > 0 {
                return;
            }
            controlled.get_or_insert_default().remove(&key);
        }
        // Dropped on the request path's threads too: unload in the
        // background rather than block one for up to the timeout.
        let url = format!("{}/v2/repository/models/{}/unload", self.config.url, self.config.model);
        tracing::info!(%url, "unloading the remote model: no loaded model uses it any more");
        let agent = self.agent.clone();
        std::thread::spawn(move || {
            if let Err(e) = agent.post(&url).send(&b""[..]) {
                tracing::warn!(%url, "cannot unload the remote model: {e}");
            }
        });
    }
}

/// Sorts a transport error: only a connection that never opened is
/// retried, since anything later may have reached the remote.
fn unreachable(e: ureq::Error) -> Failure {
    match e {
        ureq::Error::Timeout(_) => Failure::TimedOut,
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => Failure::Unreachable(e.to_string()),
        ureq::Error::Io(ref io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            Failure::Unreachable(e.to_string())
        }
        e => Failure::Broken(e.to_string()),
    }
}

/// The body of a response, or the remote's `{"error"}` for a failure status.
fn read(mut response: ureq::http::Response<ureq::Body>) -> Result<(Option<usize>, Vec<u8>), Failure> {
    let status = response.status().as_u16();
    let header_length =
        response.headers().get(HEADER_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok());
    let body = response.body_mut().with_config().limit(MAX_RESPONSE_BYTES).read_to_vec().map_err(unreachable)?;
    if (200..300).contains(&status) {
        return Ok((header_length, body));
    }
    let message = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    Err(Failure::Status(status, message))
}

impl Backend for RemoteModel {
    fn description(&self) -> &Description {
        &self.description
    }

    fn execute(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, BackendError> {
        let (body, header_length) = encode(&inputs, &self.description.outputs);
        let url = format!("{}/infer", self.remote.config.model_url());
        let remote = &self.remote;
        let (response_header, response) = remote.call(|| {
            let request = remote
                .agent
                .post(&url)
                .header(HEADER_LENGTH, header_length.to_string())
                .header("Content-Type", "application/octet-stream");
            remote.send(request, &body)
        })?;
        decode(response_header, &response, &self.description.outputs)
            .map_err(|m| Failure::Malformed(m).into_backend_error(&remote.config))
    }
}

/// An inference request with every input as binary data and every output
/// asked for as binary data; returns the body and its JSON header's length.
fn encode(inputs: &[Tensor], outputs: &[ModelIo]) -> (Vec<u8>, usize) {
    let header = json!({
        "inputs": inputs.iter().map(|t| json!({
            "name": t.name,
            "shape": t.shape,
            "datatype": t.datatype.name(),
            "parameters": { "binary_data_size": t.data.len() },
        })).collect::<Vec<_>>(),
        "outputs": outputs.iter().map(|o| json!({
            "name": o.name,
            "parameters": { "binary_data": true },
        })).collect::<Vec<_>>(),
    });
    let mut body = serde_json::to_vec(&header).expect("JSON values serialise");
    let header_length = body.len();
    for t in inputs {
        body.extend_from_slice(&t.data);
    }
    (body, header_length)
}

/// Reads an inference response: JSON, or a JSON header followed by the
/// outputs' binary data in order. Each expected output must be there.
fn decode(header_length: Option<usize>, body: &[u8], expected: &[ModelIo]) -> Result<Vec<Tensor>, String> {
    let (header, mut binary) = match header_length {
        Some(n) if n <= body.len() => body.split_at(n),
        Some(n) => return Err(format!("{HEADER_LENGTH} {n} is past the end of the {}-byte body", body.len())),
        None => (body, &[][..]),
    };
    let response: Response = json::from_json(header).map_err(|e| format!("not KServe v2 JSON: {e}"))?;
    let mut tensors = Vec::with_capacity(response.outputs.len());
    for output in response.outputs {
        // The same reading as a request's inputs: binary data in order, or JSON.
        let tensor = match binary::binary_size(&output).map_err(|e| e.to_string())? {
            None => output.into_tensor(),
            Some(size) => {
                let (data, rest) = binary
                    .split_at_checked(size)
                    .ok_or_else(|| format!("output '{}' has more binary data than the body", output.name))?;
                binary = rest;
                binary::binary_tensor(output, data.to_vec())
            }
        }
        .map_err(|e| e.to_string())?;
        tensors.push(tensor);
    }
    for o in expected {
        if !tensors.iter().any(|t| t.name == o.name) {
            return Err(format!("the response has no output '{}'", o.name));
        }
    }
    Ok(tensors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ModelConfig, Parameters};

    fn io(name: &str) -> ModelIo {
        ModelIo { name: name.into(), datatype: Some(DataType::Fp32), type_name: "FP32".into(), shape: vec![-1, 2] }
    }

    #[test]
    fn a_request_round_trips_through_binary_encoding() {
        let input = Tensor { name: "x".into(), datatype: DataType::Fp32, shape: vec![1, 2], data: vec![1; 8] };
        let (body, n) = encode(std::slice::from_ref(&input), &[io("y")]);
        let header: Value = serde_json::from_slice(&body[..n]).unwrap();
        assert_eq!(header["inputs"][0]["parameters"]["binary_data_size"], 8);
        assert_eq!(header["outputs"][0]["parameters"]["binary_data"], true);
        assert_eq!(&body[n..], &input.data[..]);
    }

    #[test]
    fn binary_and_json_outputs_are_read_and_missing_ones_refused() {
        let header = br#"{"outputs":[{"name":"y","datatype":"FP32","shape":[1,2],"parameters":{"binary_data_size":8}},{"name":"z","datatype":"INT64","shape":[1],"data":[7]}]}"#;
        let mut body = header.to_vec();
        body.extend_from_slice(&[0, 0, 128, 63, 0, 0, 0, 64]);
        let out = decode(Some(header.len()), &body, &[io("y"), io("z")]).unwrap();
        assert_eq!(out[0].data, [0, 0, 128, 63, 0, 0, 0, 64]);
        assert_eq!(out[1].data, 7i64.to_le_bytes());
        let missing = decode(Some(header.len()), &body, &[io("w")]).unwrap_err();
        assert!(missing.contains("no output 'w'"), "{missing}");
        let short = decode(Some(header.len()), &body[..body.len() - 1], &[io("y")]).unwrap_err();
        assert!(short.contains("more binary data"), "{short}");
    }

    #[test]
    fn the_remote_parameters_are_read_with_defaults() {
        let config: ModelConfig = crate::config::parse(
            r#"name: "m" backend: "remote" parameters { key: "remote.url" value { string_value: "http://h:1/" } }"#,
        )
        .unwrap();
        let remote = RemoteConfig::from_parameters(&Parameters::parse(&config).unwrap().remote, "m").unwrap();
        assert_eq!(remote.url, "http://h:1");
        assert_eq!(remote.model, "m");
        assert_eq!(remote.timeout, Duration::from_secs(5));
        assert_eq!(remote.model_url(), "http://h:1/v2/models/m");
        let no_url: ModelConfig = crate::config::parse(r#"name: "m" backend: "remote""#).unwrap();
        let keys = Parameters::parse(&no_url).unwrap().remote;
        assert!(RemoteConfig::from_parameters(&keys, "m").unwrap_err().contains("remote.url"));
    }
}
