//! Triton's ragged batching (`docs/user_guide/ragged_batching.md`): the
//! inputs marked `allow_ragged_batch` batch whatever their shapes and reach
//! the model as one flat tensor, the `batch_input`s the host synthesises
//! from the batch describe where each request's part lies, and the
//! `batch_output`s are cut back per request by the shape of an input.
//!
//! The shapes and values follow Triton's backends
//! (`backend/src/backend_input_collector.cc`: `BatchInputShape`,
//! `ProcessBatchInput`; `backend/src/backend_output_responder.cc`:
//! `ProcessBatchOutput`; `onnxruntime_backend/src/onnxruntime.cc`, which
//! gives a ragged input the shape `[total elements]`). Plinth does this in
//! the scheduler, so every backend sees the same tensors.

use super::batch::{self, BatchKey};
use crate::config::proto::{batch_input, batch_output};
use crate::config::{ModelConfig, datatype_from_config};
use crate::tensor::{DataType, Tensor, TensorSpec, bytes_elements, element_count};

/// What a `batch_input` holds (Triton's `BatchInput.Kind`). `n` is the
/// number of requests in the execution, `count(i)` the number of elements
/// of request `i`'s source input (every dimension, its batch dimension
/// included), `b(i)` its batch size and `dims(i)` its dimensions after the
/// batch dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchInputKind {
    /// `BATCH_ELEMENT_COUNT`: shape `[n]`, `count(i)` for each request.
    ElementCount,
    /// `BATCH_ACCUMULATED_ELEMENT_COUNT`: shape `[n]`, the running sum of
    /// `count`: where each request's part of a ragged input ends.
    AccumulatedElementCount,
    /// `BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO`: shape `[n + 1]`, 0 and
    /// then the running sum: where each request's part starts and ends.
    AccumulatedElementCountWithZero,
    /// `BATCH_MAX_ELEMENT_COUNT_AS_SHAPE`: shape `[max count(i)]`; only the
    /// shape carries information (Triton leaves the data unset, Plinth
    /// gives zeros).
    MaxElementCountAsShape,
    /// `BATCH_ITEM_SHAPE`: shape `[sum b(i), rank]`, one row per batch item
    /// holding `dims(i)`.
    ItemShape,
    /// `BATCH_ITEM_SHAPE_FLATTEN`: the same values as [`ItemShape`] in one
    /// dimension, `[sum b(i) * rank]`.
    ///
    /// [`ItemShape`]: BatchInputKind::ItemShape
    ItemShapeFlatten,
}

impl BatchInputKind {
    fn from_config(kind: batch_input::Kind) -> BatchInputKind {
        match kind {
            batch_input::Kind::BatchElementCount => BatchInputKind::ElementCount,
            batch_input::Kind::BatchAccumulatedElementCount => BatchInputKind::AccumulatedElementCount,
            batch_input::Kind::BatchAccumulatedElementCountWithZero => BatchInputKind::AccumulatedElementCountWithZero,
            batch_input::Kind::BatchMaxElementCountAsShape => BatchInputKind::MaxElementCountAsShape,
            batch_input::Kind::BatchItemShape => BatchInputKind::ItemShape,
            batch_input::Kind::BatchItemShapeFlatten => BatchInputKind::ItemShapeFlatten,
        }
    }

    /// Triton's name of the kind, as `config.pbtxt` spells it.
    pub fn name(self) -> &'static str {
        match self {
            BatchInputKind::ElementCount => "BATCH_ELEMENT_COUNT",
            BatchInputKind::AccumulatedElementCount => "BATCH_ACCUMULATED_ELEMENT_COUNT",
            BatchInputKind::AccumulatedElementCountWithZero => "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
            BatchInputKind::MaxElementCountAsShape => "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
            BatchInputKind::ItemShape => "BATCH_ITEM_SHAPE",
            BatchInputKind::ItemShapeFlatten => "BATCH_ITEM_SHAPE_FLATTEN",
        }
    }
}

/// One `batch_input`: a model input the host makes for each execution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchInput {
    /// What it holds.
    pub kind: BatchInputKind,
    /// The model inputs that receive it (`target_name`), each a copy.
    pub targets: Vec<String>,
    /// `INT32` or `FP32`.
    pub datatype: DataType,
    /// The request input it describes (`source_input`).
    pub source: String,
    /// The number of dimensions of the source input after its batch
    /// dimension, as the backend sees it (its `reshape` if it has one).
    pub source_rank: usize,
}

impl BatchInput {
    /// The tensor's dimensions as a model declares them, after a variable
    /// first dimension: `[source_rank]` for [`BatchInputKind::ItemShape`],
    /// none for the others (which are one-dimensional).
    pub fn dims(&self) -> Vec<i64> {
        match self.kind {
            BatchInputKind::ItemShape => vec![self.source_rank as i64],
            _ => Vec::new(),
        }
    }

    /// The values and shape of this batch input for requests whose source
    /// inputs have `shapes` (batch dimension first), in execution order.
    fn values(&self, shapes: &[&[i64]]) -> Result<(Vec<i64>, Vec<i64>), String> {
        let counts = shapes
            .iter()
            .map(|s| element_count(s).and_then(|c| i64::try_from(c).ok()))
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(|| format!("input '{}' has too many elements to count", self.source))?;
        let accumulated = || {
            counts.iter().scan(0i64, |sum, &c| {
                *sum = sum.saturating_add(c);
                Some(*sum)
            })
        };
        let items = || {
            shapes.iter().flat_map(|s| {
                let rows = usize::try_from(s.first().copied().unwrap_or(1)).unwrap_or(0);
                std::iter::repeat_n(s.get(1..).unwrap_or_default(), rows).flatten().copied()
            })
        };
        let n = shapes.len() as i64;
        Ok(match self.kind {
            BatchInputKind::ElementCount => (counts, vec![n]),
            BatchInputKind::AccumulatedElementCount => (accumulated().collect(), vec![n]),
            BatchInputKind::AccumulatedElementCountWithZero => {
                (std::iter::once(0).chain(accumulated()).collect(), vec![n + 1])
            }
            BatchInputKind::MaxElementCountAsShape => {
                let max = counts.iter().copied().max().unwrap_or(0);
                (vec![0; usize::try_from(max).unwrap_or(0)], vec![max])
            }
            BatchInputKind::ItemShape => {
                let rows: i64 = shapes.iter().map(|s| s.first().copied().unwrap_or(1)).sum();
                (items().collect(), vec![rows, self.source_rank as i64])
            }
            BatchInputKind::ItemShapeFlatten => {
                let values: Vec<i64> = items().collect();
                let len = values.len() as i64;
                (values, vec![len])
            }
        })
    }

    /// One tensor per target for requests whose source inputs have
    /// `shapes`.
    fn tensors(&self, shapes: &[&[i64]]) -> Result<Vec<Tensor>, String> {
        let (values, shape) = self.values(shapes)?;
        let mut data = Vec::with_capacity(values.len() * 4);
        for v in values {
            match self.datatype {
                DataType::Int32 => {
                    let v = i32::try_from(v).map_err(|_| {
                        format!("batch input '{}' ({}): {v} does not fit INT32", self.targets[0], self.kind.name())
                    })?;
                    data.extend_from_slice(&v.to_le_bytes());
                }
                _ => data.extend_from_slice(&(v as f32).to_le_bytes()),
            }
        }
        Ok(self
            .targets
            .iter()
            .map(|target| Tensor {
                name: target.clone(),
                datatype: self.datatype,
                shape: shape.clone(),
                data: data.clone(),
            })
            .collect())
    }
}

/// One `batch_output` (`BATCH_SCATTER_WITH_INPUT_SHAPE`): outputs that are
/// cut per request by the shape of an input instead of by batch rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchOutput {
    /// Each target output with the shape pattern of one request's part:
    /// a variable batch dimension (for a model that batches) and the
    /// output's dimensions as the backend produces them (its `reshape` if
    /// it has one); each -1 takes the source input's size at that index.
    pub targets: Vec<(String, Vec<i64>)>,
    /// The request input whose shape cuts them (`source_input`).
    pub source: String,
}

/// How the requests of one execution become the model's inputs and its
/// outputs their answers, beyond concatenating and splitting along the
/// batch dimension: Triton's `allow_ragged_batch`, `batch_input` and
/// `batch_output`. The default (none of them) is plain batching.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchLayout {
    /// The inputs with `allow_ragged_batch`.
    ragged: Vec<String>,
    /// The `batch_input`s, in configuration order.
    inputs: Vec<BatchInput>,
    /// The `batch_output`s, in configuration order.
    outputs: Vec<BatchOutput>,
}

impl BatchLayout {
    /// The layout `config` declares (already checked by
    /// `config::validate`).
    ///
    /// # Errors
    /// A message naming the `batch_input` or `batch_output` whose kind, data
    /// type, source or target is not one Plinth can act on.
    pub fn from_config(config: &ModelConfig) -> Result<BatchLayout, String> {
        let input = |name: &str| config.input.iter().find(|i| i.name == name);
        let ragged = config.input.iter().filter(|i| i.allow_ragged_batch).map(|i| i.name.clone()).collect();
        let mut inputs = Vec::with_capacity(config.batch_input.len());
        for bi in &config.batch_input {
            let kind = batch_input::Kind::try_from(bi.kind)
                .map(BatchInputKind::from_config)
                .map_err(|_| format!("unknown batch input kind '{}'", bi.kind))?;
            let [source] = bi.source_input.as_slice() else {
                return Err(format!(
                    "batch input kind '{}' expects 1 source input, got {}",
                    kind.name(),
                    bi.source_input.len()
                ));
            };
            let source_input = input(source).ok_or_else(|| format!("unknown source input name '{source}'"))?;
            let datatype = match datatype_from_config(bi.data_type) {
                Some(dt @ (DataType::Int32 | DataType::Fp32)) => dt,
                _ => return Err("batch input data type must be TYPE_INT32 or TYPE_FP32".to_owned()),
            };
            if bi.target_name.is_empty() {
                return Err(format!("batch input kind '{}' names no 'target_name'", kind.name()));
            }
            let source_rank = source_input.reshape.as_ref().map_or(source_input.dims.len(), |r| r.shape.len());
            inputs.push(BatchInput {
                kind,
                targets: bi.target_name.clone(),
                datatype,
                source: source.clone(),
                source_rank,
            });
        }
        let mut outputs = Vec::with_capacity(config.batch_output.len());
        for bo in &config.batch_output {
            batch_output::Kind::try_from(bo.kind).map_err(|_| format!("unknown batch output kind '{}'", bo.kind))?;
            let [source] = bo.source_input.as_slice() else {
                return Err(format!(
                    "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got {}",
                    bo.source_input.len()
                ));
            };
            input(source).ok_or_else(|| format!("unknown source input name '{source}'"))?;
            let mut targets = Vec::with_capacity(bo.target_name.len());
            for target in &bo.target_name {
                let output = config
                    .output
                    .iter()
                    .find(|o| o.name == *target)
                    .ok_or_else(|| format!("unknown target output name '{target}'"))?;
                let dims: &[i64] = output.reshape.as_ref().map_or(&output.dims, |r| &r.shape);
                let batch = (config.max_batch_size > 0).then_some(-1);
                targets.push((target.clone(), batch.into_iter().chain(dims.iter().copied()).collect()));
            }
            outputs.push(BatchOutput { targets, source: source.clone() });
        }
        Ok(BatchLayout { ragged, inputs, outputs })
    }

    /// Whether the layout is plain batching: nothing ragged, no batch
    /// inputs or outputs.
    pub fn is_plain(&self) -> bool {
        self.ragged.is_empty() && self.inputs.is_empty() && self.outputs.is_empty()
    }

    /// Whether input `name` has `allow_ragged_batch`.
    pub fn is_ragged(&self, name: &str) -> bool {
        self.ragged.iter().any(|r| r == name)
    }

    /// The `batch_input`s.
    pub fn batch_inputs(&self) -> &[BatchInput] {
        &self.inputs
    }

    /// Whether output `name` is a `batch_output` target.
    pub fn is_batch_output(&self, name: &str) -> bool {
        self.outputs.iter().any(|o| o.targets.iter().any(|(t, _)| t == name))
    }

    /// The model inputs the host adds to each execution, as a batching
    /// model declares them (dimensions after a variable first one).
    pub fn host_specs(&self) -> Vec<TensorSpec> {
        self.inputs
            .iter()
            .flat_map(|bi| bi.targets.iter().map(|t| TensorSpec::new(t, bi.datatype, &bi.dims())))
            .collect()
    }

    /// What must be equal for requests to share an execution (`inputs`
    /// sorted by name): as [`batch::batch_key`], except that a ragged
    /// input's shape may differ.
    pub fn key(&self, inputs: &[Tensor]) -> BatchKey {
        let mut key = batch::batch_key(inputs);
        for (name, _, dims) in &mut key {
            if self.is_ragged(name) {
                dims.clear();
            }
        }
        key
    }

    /// What a request leaves for [`BatchLayout::split`]: the shape of each
    /// `batch_output`'s source input among `inputs` (empty when missing).
    pub fn sources(&self, inputs: &[Tensor]) -> Vec<Vec<i64>> {
        let shape = |name: &str| inputs.iter().find(|t| t.name == name).map(|t| t.shape.clone()).unwrap_or_default();
        self.outputs.iter().map(|o| shape(&o.source)).collect()
    }

    /// The execution's inputs from the requests' (each sorted alike, as
    /// their equal [`BatchLayout::key`]s make them): concatenated along the
    /// batch dimension, each ragged input as one dimension of all the
    /// requests' elements in order, and the batch inputs added after them.
    ///
    /// # Errors
    /// A message when a request lacks a batch input's source input, or a
    /// count does not fit the batch input's `INT32`.
    pub fn gather(&self, requests: &[Vec<Tensor>]) -> Result<Vec<Tensor>, String> {
        let mut gathered = match requests {
            [one] => one.clone(),
            _ => batch::concat(requests),
        };
        for (i, t) in gathered.iter_mut().enumerate() {
            if self.is_ragged(&t.name) {
                let total = requests.iter().map(|r| element_count(&r[i].shape).unwrap_or(0)).sum::<usize>();
                t.shape = vec![total as i64];
            }
        }
        for bi in &self.inputs {
            let shapes = requests
                .iter()
                .map(|r| {
                    r.iter().find(|t| t.name == bi.source).map(|t| t.shape.as_slice()).ok_or_else(|| {
                        format!(
                            "batch input '{}' describes input '{}', which a request lacks",
                            bi.targets[0], bi.source
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            gathered.extend(bi.tensors(&shapes)?);
        }
        Ok(gathered)
    }

    /// Each request's outputs from the execution's: a `batch_output` cut
    /// into consecutive parts shaped by the request's source input
    /// (`sources`, from [`BatchLayout::sources`]), every other output cut
    /// into `rows` rows per request (with one request, left whole).
    ///
    /// # Errors
    /// A message naming an output whose elements are not exactly the sum
    /// of the parts, whose pattern needs a dimension its source input does
    /// not have, or that is not cut into whole rows.
    pub fn split(
        &self,
        outputs: Vec<Tensor>,
        rows: &[usize],
        sources: &[Vec<Vec<i64>>],
    ) -> Result<Vec<Vec<Tensor>>, String> {
        let mut per_request: Vec<Vec<Tensor>> = rows.iter().map(|_| Vec::with_capacity(outputs.len())).collect();
        for out in outputs {
            let scatter = self
                .outputs
                .iter()
                .enumerate()
                .find_map(|(k, o)| o.targets.iter().find(|(t, _)| *t == out.name).map(|(_, p)| (k, &o.source, p)));
            let parts = match scatter {
                Some((k, source, pattern)) => scatter_parts(out, pattern, source, sources.iter().map(|s| &s[k][..]))?,
                None if rows.len() == 1 => vec![out],
                None => batch::split(vec![out], rows)?.into_iter().flatten().collect(),
            };
            for (request, part) in per_request.iter_mut().zip(parts) {
                request.push(part);
            }
        }
        Ok(per_request)
    }
}

/// `out` cut into consecutive parts, one per request, each shaped as
/// `pattern` with every -1 taken from the request's `source` input shape.
fn scatter_parts<'a>(
    out: Tensor,
    pattern: &[i64],
    source: &str,
    shapes: impl Iterator<Item = &'a [i64]>,
) -> Result<Vec<Tensor>, String> {
    let mut parts = Vec::new();
    let mut offset = 0;
    let items = match out.datatype.element_size() {
        Some(_) => None,
        None => Some(
            bytes_elements(&out.data)
                .ok_or_else(|| format!("output '{}' has malformed BYTES data", out.name))?
                .iter()
                .map(|item| 4 + item.len())
                .collect::<Vec<usize>>(),
        ),
    };
    let mut item = 0;
    for shape in shapes {
        let part_shape = pattern
            .iter()
            .enumerate()
            .map(|(i, &d)| if d < 0 { shape.get(i).copied() } else { Some(d) })
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(|| {
                format!(
                    "output '{}' (batch_output) has variable dimensions {pattern:?} that input '{source}' of shape {shape:?} cannot give",
                    out.name
                )
            })?;
        let count = element_count(&part_shape).ok_or_else(|| format!("output '{}' is too large", out.name))?;
        let len = match (&items, out.datatype.element_size()) {
            (_, Some(size)) => count * size,
            (Some(items), None) => {
                let taken = items.get(item..item + count).ok_or_else(|| short(&out, source))?;
                item += count;
                taken.iter().sum()
            }
            (None, None) => 0,
        };
        let data = out.data.get(offset..offset + len).ok_or_else(|| short(&out, source))?.to_vec();
        offset += len;
        parts.push(Tensor { name: out.name.clone(), datatype: out.datatype, shape: part_shape, data });
    }
    if offset != out.data.len() {
        return Err(format!(
            "output '{}' (batch_output) of shape {:?} has more elements than the requests' shapes of input '{source}' give it",
            out.name, out.shape
        ));
    }
    Ok(parts)
}

fn short(out: &Tensor, source: &str) -> String {
    format!(
        "output '{}' (batch_output) of shape {:?} has fewer elements than the requests' shapes of input '{source}' need",
        out.name, out.shape
    )
}

#[cfg(test)]
mod tests;
