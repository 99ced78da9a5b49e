//! Sentence embeddings with a BERT-style encoder (all-MiniLM-L6-v2 in the
//! example repository): tokenization and pooling here in the sandbox, the
//! encoder native.
//!
//! `preprocess` reads the texts of a request (`input`: JSON
//! `{"input": "text"}` or `{"input": ["text", ...]}` as OpenAI's embeddings
//! API takes them, or a `text/plain` body), tokenizes them with the model
//! folder's `tokenizer.json` (Hugging Face `tokenizers`, the same Rust crate
//! the Python library wraps; truncation as the file says) and pads them to
//! the smallest of the `length_buckets` that holds the longest, so that
//! requests of similar length share a batch. `postprocess` averages the
//! token vectors of the model's one output (`[rows, length, width]`, the
//! last hidden state) over the attention mask and scales each mean to unit
//! length, as sentence-transformers' mean pooling and `Normalize` do, and
//! answers in the shape of OpenAI's embeddings list:
//! `{"object": "list", "data": [{"object": "embedding", "index": 0,
//! "embedding": [...]}], "usage": {"prompt_tokens": n, "total_tokens": n}}`
//! (tokens counted with the special tokens, padding left out). The query
//! parameter `token_ids=true` adds each text's `token_ids`.
//!
//! Everything model-specific comes from the model folder: the `config.pbtxt`
//! parameters `tokenizer` (the file in the version folder) and, optionally,
//! `length_buckets` (comma-separated lengths, e.g. `16,32,64,128`), and the
//! signature. Each model input is fed the tokenizer field it is named after
//! (`input_ids`, `attention_mask`, `token_type_ids`, Hugging Face's names),
//! or the one a parameter `input.<field>` maps it to; INT64 or INT32.

pub mod encode;
pub mod input;
pub mod pooling;

use plinth_plugin_sdk::{Datatype, Error, ModelInfo, Plugin, Request, Response, Tensor, export_plugin, find_output};

use encode::{Batch, Encoder};

/// The tokenizer fields a model input can take, by their Hugging Face names.
const FIELDS: [&str; 3] = ["input_ids", "attention_mask", "token_type_ids"];

/// Where the host mounts the version folder. A native build (the benchmark)
/// names the folder in `PLINTH_MODEL_DIR`; the sandbox has no environment.
fn model_dir() -> String {
    std::env::var("PLINTH_MODEL_DIR").unwrap_or_else(|_| "/model".to_owned())
}

/// One model input and the tokenizer field it takes.
struct Feed {
    name: String,
    field: usize,
    datatype: Datatype,
}

/// The plugin's state, one per instance.
pub struct TextEmbedding {
    encoder: Encoder,
    feeds: Vec<Feed>,
    output: String,
    /// The model's `max_batch_size`: the most texts one request may carry
    /// (0: the model does not batch, no limit here).
    max_rows: usize,
}

impl Plugin for TextEmbedding {
    fn init(info: &ModelInfo) -> Result<Self, Error> {
        let file = info.parameter("tokenizer").ok_or_else(|| {
            Error::internal("the parameter 'tokenizer' must name the tokenizer.json file in the version folder")
        })?;
        let buckets = encode::parse_buckets(info.parameter("length_buckets").unwrap_or_default())?;
        let encoder = Encoder::from_file(&format!("{}/{file}", model_dir()), buckets)?;
        let feeds = feeds(info)?;
        let output = info.first_output()?;
        if output.datatype != Datatype::Fp32 || output.dims.len() != 2 {
            return Err(Error::internal(format!(
                "output '{}' is {:?} with dims {:?}; this plugin pools an FP32 [length, width] hidden state per text",
                output.name, output.datatype, output.dims
            )));
        }
        Ok(TextEmbedding { encoder, feeds, output: output.name.clone(), max_rows: info.max_batch_size as usize })
    }

    fn preprocess(&mut self, req: &Request) -> Result<Vec<Tensor>, Error> {
        token_ids_wanted(req)?;
        let texts = input::texts(req)?;
        if self.max_rows > 0 && texts.len() > self.max_rows {
            return Err(Error::bad_input(format!(
                "{} texts in one request; this model takes at most {} (its max_batch_size)",
                texts.len(),
                self.max_rows
            )));
        }
        let batch = self.encoder.encode(&texts)?;
        let shape = [batch.rows as i64, batch.length as i64];
        Ok(self
            .feeds
            .iter()
            .map(|feed| {
                let values = field(&batch, feed.field);
                if feed.datatype == Datatype::Int32 {
                    let narrow: Vec<i32> = values.iter().map(|&v| v as i32).collect();
                    Tensor::from_slice(&feed.name, &shape, &narrow)
                } else {
                    Tensor::from_slice(&feed.name, &shape, values)
                }
            })
            .collect())
    }

    fn postprocess(&mut self, req: &Request, outputs: Vec<Tensor>) -> Result<Response, Error> {
        // The contract hands postprocess the request, not the tensors
        // preprocess made: the attention mask comes from tokenizing again.
        let texts = input::texts(req)?;
        let batch = self.encoder.encode(&texts)?;
        let hidden = find_output(&outputs, &self.output)?;
        let width = match hidden.shape[..] {
            [rows, length, width] if rows as usize == batch.rows && length as usize == batch.length => width as usize,
            _ => {
                return Err(Error::internal(format!(
                    "output '{}' has shape {:?}; expected [{}, {}, width]",
                    self.output, hidden.shape, batch.rows, batch.length
                )));
            }
        };
        let values = hidden.to_vec::<f32>()?;
        let vectors = pooling::mean_pooled_normalised(&values, &batch.attention_mask, batch.rows, batch.length, width);
        let ids = if token_ids_wanted(req)? { Some(self.encoder.token_ids(&texts)?) } else { None };
        Ok(Response { content_type: "application/json".into(), body: embedding_list(&vectors, &batch, ids.as_deref()) })
    }
}

/// Each model input and the field it takes: its own name, or the field a
/// parameter `input.<field>` maps to it.
fn feeds(info: &ModelInfo) -> Result<Vec<Feed>, Error> {
    let mut feeds = Vec::new();
    for spec in &info.inputs {
        let mapped = FIELDS.iter().position(|f| info.parameter(&format!("input.{f}")) == Some(spec.name.as_str()));
        let field = mapped.or_else(|| FIELDS.iter().position(|f| *f == spec.name)).ok_or_else(|| {
            Error::internal(format!(
                "input '{}' is none of the tokenizer's fields {FIELDS:?}; name it after one, or map one to it with a parameter input.<field>",
                spec.name
            ))
        })?;
        if !matches!(spec.datatype, Datatype::Int64 | Datatype::Int32) || spec.dims.len() != 1 {
            return Err(Error::internal(format!(
                "input '{}' is {:?} with dims {:?}; token fields are INT64 or INT32 of dims [length]",
                spec.name, spec.datatype, spec.dims
            )));
        }
        feeds.push(Feed { name: spec.name.clone(), field, datatype: spec.datatype });
    }
    if !feeds.iter().any(|f| f.field == 0) {
        return Err(Error::internal("no model input takes the token ids (input_ids)"));
    }
    Ok(feeds)
}

fn field(batch: &Batch, index: usize) -> &[i64] {
    match index {
        0 => &batch.ids,
        1 => &batch.attention_mask,
        _ => &batch.type_ids,
    }
}

/// Whether the query asks for token ids (`token_ids=true`).
///
/// # Errors
/// [`Error::BadInput`] for another query parameter or value, so that none is
/// ignored.
fn token_ids_wanted(req: &Request) -> Result<bool, Error> {
    let mut wanted = false;
    for (key, value) in &req.parameters {
        match (key.as_str(), value.as_str()) {
            ("token_ids", "true") => wanted = true,
            ("token_ids", "false") => wanted = false,
            ("token_ids", v) => return Err(Error::bad_input(format!("token_ids must be true or false, got '{v}'"))),
            (k, _) => {
                return Err(Error::bad_input(format!("unknown query parameter '{k}'; this model takes token_ids")));
            }
        }
    }
    Ok(wanted)
}

/// OpenAI's embeddings list as JSON. The vectors are written as FP32
/// numbers (shortest text that reads back to the same FP32 value), not
/// widened to FP64.
fn embedding_list(vectors: &[Vec<f32>], batch: &Batch, ids: Option<&[Vec<u32>]>) -> Vec<u8> {
    let mut out = String::from(r#"{"object":"list","data":["#);
    for (index, vector) in vectors.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        out.push_str(&format!(r#"{{"object":"embedding","index":{index},"embedding":"#));
        out.push_str(&serde_json::to_string(vector).expect("finite FP32 values serialise"));
        if let Some(ids) = ids {
            out.push_str(r#","token_ids":"#);
            out.push_str(&serde_json::to_string(&ids[index]).expect("integers serialise"));
        }
        out.push('}');
    }
    let tokens: usize = batch.tokens.iter().sum();
    out.push_str(&format!(r#"],"usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens}}}}}"#));
    out.into_bytes()
}

export_plugin!(TextEmbedding);
