//! A generative model's decoder: one ONNX Runtime session over an export of
//! ONNX Runtime GenAI's model builder, and its KV cache.
//!
//! The export's decoder (`genai_config.json`, `model.decoder`) takes
//! `input_ids` INT64 `[batch, sequence]`, `attention_mask` INT64
//! `[batch, total_sequence]` and, per layer N, `past_key_values.N.key` and
//! `.value` FP32 `[batch, kv_heads, past_sequence, head_size]`; it returns
//! `logits` FP32 `[batch, sequence, vocabulary]` and `present.N.key` and
//! `.value`. Its attention is ONNX Runtime's GroupQueryAttention, which
//! writes a step's keys and values into the past buffer itself when past
//! and present are the same memory (GenAI's `past_present_share_buffer`),
//! at each row's own position: the number of ones in its attention mask
//! less one. So the cache is one buffer per layer and kind,
//! `[slots, kv_heads, context, head_size]`, that every run reads and writes
//! in place: row `s` is sequence slot `s`, and a run over slots `a..b`
//! passes the rows' contiguous block, nothing is copied.

use std::ffi::CString;
use std::path::Path;

use ort::AsPointer;
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::Session;
use ort::value::{Shape, Tensor, TensorRefMut};
use serde::Deserialize;

/// The decoder's figures, from `genai_config.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dimensions {
    /// Transformer layers: a key and a value buffer each.
    pub layers: usize,
    /// Key/value heads (fewer than the attention heads under GQA).
    pub kv_heads: usize,
    /// Elements per head.
    pub head_size: usize,
    /// The longest sequence the model was trained for, in tokens.
    pub context_length: usize,
}

/// `genai_config.json` as far as the decoder reads it.
#[derive(Deserialize)]
struct GenaiConfig {
    model: GenaiModel,
}

#[derive(Deserialize)]
struct GenaiModel {
    context_length: usize,
    decoder: GenaiDecoder,
}

#[derive(Deserialize)]
struct GenaiDecoder {
    filename: String,
    head_size: usize,
    num_hidden_layers: usize,
    num_key_value_heads: usize,
}

/// The decoder's file and figures in version folder `dir`.
///
/// # Errors
/// A message naming `genai_config.json` when it is missing or lacks a field.
pub fn read_config(dir: &Path) -> Result<(std::path::PathBuf, Dimensions), String> {
    let path = dir.join("genai_config.json");
    let text = std::fs::read(&path).map_err(|e| {
        format!("{}: {e}; a generative model's folder holds ONNX Runtime GenAI's export", path.display())
    })?;
    let config: GenaiConfig = serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let d = config.model.decoder;
    let dims = Dimensions {
        layers: d.num_hidden_layers,
        kv_heads: d.num_key_value_heads,
        head_size: d.head_size,
        context_length: config.model.context_length,
    };
    Ok((dir.join(d.filename), dims))
}

/// The session and its KV cache.
pub struct Decoder {
    session: Session,
    dims: Dimensions,
    /// Tokens each slot holds at most.
    context: usize,
    slots: usize,
    /// Key and value buffer of each layer, in the order of `names`.
    cache: Vec<Vec<f32>>,
    /// The past and present names of each buffer.
    names: Vec<(CString, String)>,
}

impl Decoder {
    /// The decoder over `session`, with a cache of `slots` sequences of
    /// `context` tokens each (allocated now, zeroed).
    pub fn new(session: Session, dims: Dimensions, slots: usize, context: usize) -> Decoder {
        let per_buffer = slots * dims.kv_heads * context * dims.head_size;
        let mut names = Vec::new();
        for layer in 0..dims.layers {
            for kind in ["key", "value"] {
                let past = CString::new(format!("past_key_values.{layer}.{kind}")).expect("no NUL");
                names.push((past, format!("present.{layer}.{kind}")));
            }
        }
        let cache = names.iter().map(|_| vec![0f32; per_buffer]).collect();
        Decoder { session, dims, context, slots, cache, names }
    }

    /// The cache's size, in bytes.
    pub fn cache_bytes(&self) -> u64 {
        (self.cache.len() * self.cache.first().map_or(0, Vec::len) * size_of::<f32>()) as u64
    }

    /// Tokens each slot holds at most.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Runs `ids` (`rows` rows of equal length, row-major) on slots
    /// `first..first + rows`, where row `r` ends at position `ends[r]` of
    /// its slot (its tokens fill `ends[r] - len..ends[r]`), and returns the
    /// logits of each row's last token, `[rows][vocabulary]`.
    ///
    /// # Errors
    /// ONNX Runtime's message.
    pub fn run(&mut self, first: usize, ids: &[u32], ends: &[usize]) -> Result<Vec<Vec<f32>>, String> {
        let rows = ends.len();
        let len = ids.len() / rows;
        assert!(first + rows <= self.slots && ids.len() == rows * len, "rows outside the cache");
        assert!(ends.iter().all(|&e| e >= len && e <= self.context), "a row outside its slot");
        let width = *ends.iter().max().expect("one row at least");
        let mut mask = vec![0i64; rows * width];
        for (r, &end) in ends.iter().enumerate() {
            mask[r * width..r * width + end].fill(1);
        }
        let failed = |e: ort::Error| format!("ONNX Runtime failed a decoder step: {e}");
        let input_ids =
            Tensor::from_array(([rows, len], ids.iter().map(|&i| i64::from(i)).collect::<Vec<_>>())).map_err(failed)?;
        let mask = Tensor::from_array(([rows, width], mask)).map_err(failed)?;
        let mut binding = self.session.create_binding().map_err(failed)?;
        binding.bind_input("input_ids", &input_ids).map_err(failed)?;
        binding.bind_input("attention_mask", &mask).map_err(failed)?;
        let host =
            MemoryInfo::new(AllocationDevice::CPU, 0, AllocatorType::Device, MemoryType::Default).map_err(failed)?;
        let row = self.dims.kv_heads * self.context * self.dims.head_size;
        let shape =
            Shape::new([rows as i64, self.dims.kv_heads as i64, self.context as i64, self.dims.head_size as i64]);
        for (buffer, (past, present)) in self.cache.iter_mut().zip(&self.names) {
            let block = buffer[first * row..(first + rows) * row].as_mut_ptr();
            // SAFETY: the view covers `rows` whole rows of the buffer, which
            // outlives the run; ONNX Runtime reads and writes it in place.
            let view =
                unsafe { TensorRefMut::<f32>::from_raw(host.clone(), block.cast(), shape.clone()) }.map_err(failed)?;
            // ort's `bind_input` would copy a borrowed tensor; the cache is
            // bound as it is, as the past and the present of the same step.
            // SAFETY: the binding and the view are live; the name is a C string.
            unsafe {
                ort::Error::result_from_status((ort::api().BindInput)(
                    binding.ptr().cast_mut(),
                    past.as_ptr(),
                    view.ptr(),
                ))
            }
            .map_err(failed)?;
            binding.bind_output(present.as_str(), view).map_err(failed)?;
        }
        binding.bind_output_to_device("logits", &host).map_err(failed)?;
        let outputs = self.session.run_binding(&binding).map_err(failed)?;
        let (shape, logits) = outputs["logits"].try_extract_tensor::<f32>().map_err(failed)?;
        let vocabulary = *shape.last().expect("logits [batch, sequence, vocabulary]") as usize;
        Ok((0..rows).map(|r| logits[((r * len) + len - 1) * vocabulary..][..vocabulary].to_vec()).collect())
    }
}
