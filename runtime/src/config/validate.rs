//! Checking a model configuration before any file of the model is looked
//! at: Triton's validation rules (`core/src/model_config_utils.cc`,
//! `ValidateModelConfig` and friends: platform and backend, batch sizes,
//! dims and reshape, priority levels, instance groups, batch inputs and
//! outputs, ensemble-only fields) and every field Plinth does not act on,
//! which is refused naming it rather than ignored. Every problem is
//! reported, not only the first.

use std::collections::HashSet;

use super::backends::{BackendKind, served};
use super::proto::model_config::SchedulingChoice;
use super::proto::model_instance_group::Kind;
use super::proto::model_queue_policy::TimeoutAction;
use super::proto::model_version_policy::PolicyChoice;
use super::proto::{self, ModelConfig, ModelDynamicBatching};

pub use super::backends::ENSEMBLE_PLATFORM;

mod ensemble;
mod generative;

/// Backends of Triton's that Plinth does not ship, by name or platform.
const NOT_SHIPPED: [&str; 11] = [
    "tensorrt",
    "tensorrt_plan",
    "tensorflow",
    "tensorflow_graphdef",
    "tensorflow_savedmodel",
    "python",
    "openvino",
    "fil",
    "dali",
    "vllm",
    "tensorrtllm",
];

/// Collects problems, each naming the field.
struct Problems(Vec<String>);

impl Problems {
    fn add(&mut self, problem: impl Into<String>) {
        self.0.push(problem.into());
    }

    fn check(&mut self, ok: bool, problem: impl FnOnce() -> String) {
        if !ok {
            self.add(problem());
        }
    }

    /// Refuses `field` of `subject` (e.g. "input 'x': ", or "" for the
    /// model) when it is `set`.
    fn refuse(&mut self, set: bool, subject: &str, field: &str, why: &str) {
        if set {
            self.add(format!("{subject}'{field}' is set, but {why}; remove it"));
        }
    }
}

/// Checks `config`, and returns its Plinth `parameters`, parsed.
///
/// # Errors
/// Every problem found, one message each, naming the field as Triton's
/// model configuration does.
pub fn validate(config: &ModelConfig) -> Result<super::Parameters, Vec<String>> {
    let mut p = Problems(Vec::new());
    platform(config, &mut p);
    p.check(config.max_batch_size >= 0, || {
        format!("'max_batch_size' is {}, not a non-negative value (0 or more)", config.max_batch_size)
    });
    version_policy(config, &mut p);
    for (kind, ios) in [("input", io_list(&config.input)), ("output", io_list(&config.output))] {
        let mut seen = HashSet::new();
        for io in ios {
            p.check(seen.insert(io.name), || format!("{kind} '{}' is declared twice", io.name));
            io_shape(kind, &io, config.max_batch_size, &mut p);
        }
    }
    for input in &config.input {
        let formatted = input.format != proto::model_input::Format::None as i32;
        p.check(!formatted || input.dims.len() == 3, || {
            format!("input '{}': 'format' NHWC and NCHW need 3 dims, got {:?}", input.name, input.dims)
        });
        p.refuse(
            input.is_shape_tensor,
            &format!("input '{}': ", input.name),
            "is_shape_tensor",
            "shape tensors are TensorRT's",
        );
        p.refuse(
            input.is_non_linear_format_io,
            &format!("input '{}': ", input.name),
            "is_non_linear_format_io",
            "non-linear formats are TensorRT's",
        );
    }
    for output in &config.output {
        p.refuse(
            output.is_shape_tensor,
            &format!("output '{}': ", output.name),
            "is_shape_tensor",
            "shape tensors are TensorRT's",
        );
        p.refuse(
            output.is_non_linear_format_io,
            &format!("output '{}': ", output.name),
            "is_non_linear_format_io",
            "non-linear formats are TensorRT's",
        );
    }
    batch_io(config, &mut p);
    scheduling(config, &mut p);
    instance_groups(config, &mut p);
    optimization(config.optimization.as_ref(), &mut p);
    unsupported(config, &mut p);
    generative::check(config, &mut p);
    let parameters = super::Parameters::parse(config).map_err(|problems| p.0.extend(problems));
    match parameters {
        Ok(parameters) if p.0.is_empty() => Ok(parameters),
        _ => Err(p.0),
    }
}

fn platform(config: &ModelConfig, p: &mut Problems) {
    let (platform, backend) = (config.platform.as_str(), config.backend.as_str());
    if let Some(name) = [platform, backend].into_iter().find(|n| NOT_SHIPPED.contains(n)) {
        p.add(format!(
            "platform '{platform}' / backend '{backend}': Plinth does not ship Triton's '{name}' backend; it serves \
             {}",
            served()
        ));
        return;
    }
    if platform == ENSEMBLE_PLATFORM {
        p.check(backend.is_empty(), || {
            format!("an ensemble must have platform type '{ENSEMBLE_PLATFORM}' and empty backend type, got backend '{backend}'")
        });
        return;
    }
    if let Err(refused) = BackendKind::of(config) {
        p.add(refused);
    }
}

fn version_policy(config: &ModelConfig, p: &mut Problems) {
    match config.version_policy.as_ref().and_then(|v| v.policy_choice.as_ref()) {
        Some(PolicyChoice::Latest(latest)) => {
            p.check(latest.num_versions >= 1, || "'version_policy' latest needs 'num_versions' of 1 or more".to_owned())
        }
        Some(PolicyChoice::Specific(specific)) => {
            if let Some(v) = specific.versions.iter().find(|&&v| v < 0) {
                p.add(format!("'version_policy' specific names version {v}; versions are 0 or more"));
            }
        }
        Some(PolicyChoice::All(_)) | None => {}
    }
}

/// An input or output, as the shape rules see it.
struct Io<'a> {
    name: &'a str,
    data_type: i32,
    dims: &'a [i64],
    reshape: Option<&'a [i64]>,
}

fn io_list<T: IoFields>(list: &[T]) -> Vec<Io<'_>> {
    list.iter().map(IoFields::io).collect()
}

trait IoFields {
    fn io(&self) -> Io<'_>;
}

impl IoFields for proto::ModelInput {
    fn io(&self) -> Io<'_> {
        Io {
            name: &self.name,
            data_type: self.data_type,
            dims: &self.dims,
            reshape: self.reshape.as_ref().map(|r| &r.shape[..]),
        }
    }
}

impl IoFields for proto::ModelOutput {
    fn io(&self) -> Io<'_> {
        Io {
            name: &self.name,
            data_type: self.data_type,
            dims: &self.dims,
            reshape: self.reshape.as_ref().map(|r| &r.shape[..]),
        }
    }
}

/// Triton's `ValidateIOShape`: a name, a data type, dims of sizes 1 or more
/// (-1 for any size), and a reshape with as many elements, trunk by trunk
/// between variable dimensions.
fn io_shape(kind: &str, io: &Io<'_>, max_batch_size: i32, p: &mut Problems) {
    if io.name.is_empty() {
        p.add(format!("an {kind} must have a 'name'"));
        return;
    }
    let what = format!("{kind} '{}'", io.name);
    p.check(
        io.data_type != proto::DataType::TypeInvalid as i32 && proto::DataType::try_from(io.data_type).is_ok(),
        || format!("{what} must have a valid 'data_type'"),
    );
    p.check(!io.dims.is_empty(), || format!("{what} must have 'dims'"));
    let sizes_ok = |dims: &[i64]| dims.iter().all(|&d| d >= 1 || d == -1);
    p.check(sizes_ok(io.dims), || {
        format!("{what}: every dimension of 'dims' must be 1 or more, or -1 for a variable size, got {:?}", io.dims)
    });
    let Some(reshape) = io.reshape else { return };
    p.check(!(reshape.is_empty() && max_batch_size == 0), || {
        format!("{what}: an empty 'reshape' needs max_batch_size > 0 (a model without batching has no scalar tensors)")
    });
    if !sizes_ok(reshape) {
        p.add(format!(
            "{what}: 'reshape' {reshape:?} has a dimension below 1; each reshape dimension is an integer of 1 or \
             more, or -1 for a variable-size dimension"
        ));
        return;
    }
    let trunks = |dims: &[i64]| -> Vec<i64> { dims.split(|&d| d == -1).map(|trunk| trunk.iter().product()).collect() };
    // Element counts between variable dimensions; an empty reshape is one
    // trunk of one element.
    let (from, to) = (trunks(io.dims), trunks(reshape));
    if from.len() != to.len() {
        p.add(format!(
            "{what}: 'dims' {:?} and 'reshape' {reshape:?} have different numbers of variable-size dimensions",
            io.dims
        ));
    } else if from != to {
        p.add(format!("{what}: 'dims' {:?} and 'reshape' {reshape:?} hold different numbers of elements", io.dims));
    }
}

/// Triton's `ValidateBatchIO` (`core/src/model_config_utils.cc`), with its
/// messages: each `batch_input` of a known kind with exactly one source
/// input among the inputs and data type `TYPE_INT32` or `TYPE_FP32`; each
/// `batch_output` of a known kind with exactly one source input among the
/// inputs and each target an output, named once. Plinth adds what makes a
/// configuration it would otherwise have to half-serve: a target to each,
/// no batch input target that is also a declared input or another batch
/// input's, every variable dimension of a batch output's pattern one its
/// source input has, and ragged batching only where there is a batch
/// dimension (`max_batch_size` > 0) and a backend (not an ensemble).
fn batch_io(config: &ModelConfig, p: &mut Problems) {
    use proto::{batch_input, batch_output};
    let inputs: HashSet<&str> = config.input.iter().map(|i| i.name.as_str()).collect();
    let outputs: HashSet<&str> = config.output.iter().map(|o| o.name.as_str()).collect();
    let ragged: Vec<&str> = config.input.iter().filter(|i| i.allow_ragged_batch).map(|i| i.name.as_str()).collect();
    let used = !config.batch_input.is_empty() || !config.batch_output.is_empty() || !ragged.is_empty();
    if !used {
        return;
    }
    let fields = || {
        let mut fields: Vec<String> = ragged.iter().map(|r| format!("input '{r}': 'allow_ragged_batch'")).collect();
        for (set, field) in
            [(!config.batch_input.is_empty(), "'batch_input'"), (!config.batch_output.is_empty(), "'batch_output'")]
        {
            if set {
                fields.push(field.to_owned());
            }
        }
        fields.join(", ")
    };
    if config.platform == ENSEMBLE_PLATFORM {
        p.add(format!(
            "{} is set on an ensemble, which batches nothing itself; set it on the step's model instead",
            fields()
        ));
        return;
    }
    p.check(config.max_batch_size > 0, || {
        format!("{} needs max_batch_size > 0: ragged batching combines requests along the batch dimension", fields())
    });
    let mut targets: HashSet<&str> = HashSet::new();
    for bi in &config.batch_input {
        let kind = match batch_input::Kind::try_from(bi.kind) {
            Ok(kind) => kind.as_str_name().to_owned(),
            Err(_) => {
                p.add(format!("unknown batch input kind '{}'", bi.kind));
                continue;
            }
        };
        p.check(bi.source_input.len() == 1, || {
            format!("batch input kind '{kind}' expects 1 source input, got {}", bi.source_input.len())
        });
        let dt = bi.data_type;
        p.check(dt == proto::DataType::TypeInt32 as i32 || dt == proto::DataType::TypeFp32 as i32, || {
            let got = proto::DataType::try_from(dt).map_or_else(|_| dt.to_string(), |d| d.as_str_name().to_owned());
            format!("batch input data type must be TYPE_INT32 or TYPE_FP32, got {got} (kind '{kind}')")
        });
        for source in &bi.source_input {
            p.check(inputs.contains(source.as_str()), || format!("unknown source input name '{source}'"));
        }
        p.check(!bi.target_name.is_empty(), || format!("batch input kind '{kind}' expects a 'target_name', got none"));
        for target in &bi.target_name {
            p.check(!inputs.contains(target.as_str()), || {
                format!(
                    "batch input target name '{target}' is also a declared input; the host gives the model that input, \
                     so a request cannot: remove it from 'input'"
                )
            });
            p.check(targets.insert(target), || {
                format!("batch input target name '{target}' can only be specified once")
            });
        }
    }
    let mut scattered: HashSet<&str> = HashSet::new();
    for bo in &config.batch_output {
        let kind = match batch_output::Kind::try_from(bo.kind) {
            Ok(kind) => kind.as_str_name().to_owned(),
            Err(_) => {
                p.add(format!("unknown batch output kind '{}'", bo.kind));
                continue;
            }
        };
        p.check(bo.source_input.len() == 1, || {
            format!("batch output kind '{kind}' expects 1 source input, got {}", bo.source_input.len())
        });
        for source in &bo.source_input {
            p.check(inputs.contains(source.as_str()), || format!("unknown source input name '{source}'"));
        }
        p.check(!bo.target_name.is_empty(), || format!("batch output kind '{kind}' expects a 'target_name', got none"));
        for target in &bo.target_name {
            p.check(outputs.contains(target.as_str()), || format!("unknown target output name '{target}'"));
            p.check(scattered.insert(target), || format!("target output name '{target}' can only be specified once"));
        }
        // Each -1 of a target's pattern (batch dimension first) takes the
        // source input's size at the same index.
        let [source] = bo.source_input.as_slice() else { continue };
        let Some(input) = config.input.iter().find(|i| i.name == *source) else { continue };
        let batch = usize::from(config.max_batch_size > 0);
        let source_rank = batch + input.reshape.as_ref().map_or(input.dims.len(), |r| r.shape.len());
        for output in config.output.iter().filter(|o| bo.target_name.contains(&o.name)) {
            let dims: &[i64] = output.reshape.as_ref().map_or(&output.dims, |r| &r.shape);
            if let Some(i) = dims.iter().rposition(|&d| d < 0).map(|i| i + batch).filter(|&i| i >= source_rank) {
                p.add(format!(
                    "batch output '{}' ({kind}): its dimension {i} (batch dimension first) is variable, but source \
                     input '{source}' has only {source_rank} dimensions to take its size from",
                    output.name
                ));
            }
        }
    }
}

fn scheduling(config: &ModelConfig, p: &mut Problems) {
    let is_ensemble = config.platform == ENSEMBLE_PLATFORM;
    match &config.scheduling_choice {
        Some(SchedulingChoice::DynamicBatching(db)) => dynamic_batching(db, config.max_batch_size, p),
        Some(SchedulingChoice::SequenceBatching(_)) if is_ensemble => {
            p.add("an ensemble cannot have 'sequence_batching'; its steps that are sequence models have it")
        }
        Some(SchedulingChoice::SequenceBatching(_)) => {
            p.check(!config.response_cache.as_ref().is_some_and(|c| c.enable), || {
                "'response_cache' cannot be enabled with 'sequence_batching': a sequence's answers depend on its state"
                    .to_owned()
            })
        }
        Some(SchedulingChoice::EnsembleScheduling(_)) if !is_ensemble => p.add(format!(
            "ensemble scheduling cannot be set for a model whose platform is '{}': only platform \
             '{ENSEMBLE_PLATFORM}' has steps",
            config.platform
        )),
        Some(SchedulingChoice::EnsembleScheduling(scheduling)) => ensemble::ensemble(config, scheduling, p),
        None if is_ensemble => p.add(format!(
            "ensemble scheduling must be set: an ensemble (platform '{ENSEMBLE_PLATFORM}') needs \
                 'ensemble_scheduling' with its steps"
        )),
        None => {}
    }
}

fn dynamic_batching(db: &ModelDynamicBatching, max_batch_size: i32, p: &mut Problems) {
    p.check(max_batch_size > 0, || {
        "'dynamic_batching' needs max_batch_size > 0 (the model must accept a batch dimension)".to_owned()
    });
    for &size in &db.preferred_batch_size {
        p.check((1..=max_batch_size.max(1)).contains(&size) || max_batch_size <= 0, || {
            format!("'preferred_batch_size' {size} is not within 1..={max_batch_size} (max_batch_size)")
        });
    }
    let levels = db.priority_levels;
    if levels > 0 {
        p.check((1..=levels).contains(&db.default_priority_level), || {
            format!(
                "default priority level ('default_priority_level') {} is not in range [1, {levels}] \
                 ('priority_levels')",
                db.default_priority_level
            )
        });
    } else {
        p.check(db.default_priority_level == 0, || {
            format!("'default_priority_level' {} is set, but 'priority_levels' is not", db.default_priority_level)
        });
    }
    for &level in db.priority_queue_policy.keys() {
        p.check((1..=levels.max(1)).contains(&level) && (levels > 0 || level == 1), || {
            format!(
                "priority queue policy ('priority_queue_policy') names priority level {level}, not in range [1, \
                 {levels}] ('priority_levels')"
            )
        });
    }
    if db.preserve_ordering {
        p.check(levels <= 1, || {
            format!(
                "'preserve_ordering' is true, so only one priority level may be used; 'priority_levels' is {levels}"
            )
        });
        let delays = |q: &proto::ModelQueuePolicy| {
            q.default_timeout_microseconds != 0 && q.timeout_action == TimeoutAction::Delay as i32
        };
        let any_delay =
            db.default_queue_policy.as_ref().is_some_and(delays) || db.priority_queue_policy.values().any(delays);
        p.check(!any_delay, || {
            "'preserve_ordering' is true, so no queue policy may have DELAY as its timeout action \
             ('timeout_action')"
                .to_owned()
        });
    }
}

fn instance_groups(config: &ModelConfig, p: &mut Problems) {
    if config.platform == ENSEMBLE_PLATFORM {
        p.check(config.instance_group.is_empty(), || {
            "instance group should not be specified for an ensemble: an ensemble runs its steps' instances; \
             'instance_group' is for the models it calls"
                .to_owned()
        });
        return;
    }
    for (i, group) in config.instance_group.iter().enumerate() {
        let name = if group.name.is_empty() { format!("#{i}") } else { format!("'{}'", group.name) };
        p.check(group.count >= 0, || {
            format!("instance_group {name}: 'count' must be 0 (one) or more, got {}", group.count)
        });
        let kind = Kind::try_from(group.kind).unwrap_or(Kind::Auto);
        p.check(!matches!(kind, Kind::Cpu | Kind::Model) || group.gpus.is_empty(), || {
            format!(
                "instance group {name} is of kind {}, yet 'gpus' specifies GPUs {:?}",
                kind.as_str_name(),
                group.gpus
            )
        });
        if let Some(gpu) = group.gpus.iter().find(|&&g| g < 0) {
            p.add(format!("instance group {name}: gpu id {gpu} in 'gpus' is invalid, not a device index"));
        }
        p.refuse(!group.profile.is_empty(), &format!("instance_group {name}: "), "profile", "profiles are TensorRT's");
        p.refuse(
            !group.secondary_devices.is_empty(),
            &format!("instance_group {name}: "),
            "secondary_devices",
            "Plinth places instances on one device",
        );
        p.refuse(group.passive, &format!("instance_group {name}: "), "passive", "every instance Plinth loads serves");
        p.refuse(
            !group.host_policy.is_empty(),
            &format!("instance_group {name}: "),
            "host_policy",
            "Plinth has no host policies",
        );
    }
}

fn optimization(o: Option<&proto::ModelOptimizationPolicy>, p: &mut Problems) {
    let Some(o) = o else { return };
    if let Some(graph) = &o.graph {
        p.check(matches!(graph.level, -1..=2), || {
            format!(
                "'optimization.graph.level' must be -1 (basic), 0 (all), 1 (extended) or 2 (none), got {}",
                graph.level
            )
        });
    }
    p.refuse(o.priority != 0, "", "optimization.priority", "Plinth sets no execution priority");
    p.refuse(o.cuda.is_some(), "", "optimization.cuda", "Plinth runs no CUDA graphs or streams of its own");
    p.refuse(
        o.execution_accelerators.is_some(),
        "",
        "optimization.execution_accelerators",
        "ONNX Runtime runs with its CPU execution provider here",
    );
    p.refuse(
        o.input_pinned_memory.is_some(),
        "",
        "optimization.input_pinned_memory",
        "Plinth copies no inputs to a GPU",
    );
    p.refuse(
        o.output_pinned_memory.is_some(),
        "",
        "optimization.output_pinned_memory",
        "Plinth copies no outputs from a GPU",
    );
    p.refuse(
        o.gather_kernel_buffer_threshold != 0,
        "",
        "optimization.gather_kernel_buffer_threshold",
        "it is TensorRT's",
    );
    p.refuse(o.eager_batching, "", "optimization.eager_batching", "it is TensorRT's");
}

/// Fields Plinth does not act on.
fn unsupported(config: &ModelConfig, p: &mut Problems) {
    p.refuse(!config.runtime.is_empty(), "", "runtime", "Plinth's backends are built in");
    p.refuse(
        !config.cc_model_filenames.is_empty(),
        "",
        "cc_model_filenames",
        "Plinth picks no file by compute capability",
    );
    p.refuse(
        !config.metric_tags.is_empty(),
        "",
        "metric_tags",
        "Plinth's metrics carry the model and version labels only",
    );
    p.refuse(config.model_operations.is_some(), "", "model_operations", "Plinth loads no custom operator libraries");
    p.refuse(
        config.model_repository_agents.is_some(),
        "",
        "model_repository_agents",
        "Plinth has no repository agents",
    );
    p.refuse(config.model_metrics.is_some(), "", "model_metrics", "Plinth's metric families are fixed");
}

#[cfg(test)]
mod tests;
