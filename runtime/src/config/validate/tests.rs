use super::*;

fn problems(text: &str) -> Vec<String> {
    validate(&crate::config::parse(text).unwrap()).err().unwrap_or_default()
}

#[test]
fn a_good_configuration_has_no_problems() {
    let ok = r#"
        platform: "onnxruntime_onnx" max_batch_size: 8
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 4, -1, 6 ] reshape: { shape: [ 8, -1, 1, 6 ] } } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
        dynamic_batching { preferred_batch_size: [ 4, 8 ] priority_levels: 2 default_priority_level: 2 }
        instance_group [ { count: 2 kind: KIND_CPU } ]
        optimization { graph { level: 1 } }"#;
    assert_eq!(problems(ok), Vec::<String>::new());
}

#[test]
fn every_problem_is_reported_naming_its_field() {
    let bad = r#"
        platform: "onnxruntime_onnx" backend: "pytorch" max_batch_size: 2
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 4, 0 ] },
                { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 3 ] } } ]
        output [ { name: "y" dims: [ ] is_shape_tensor: true } ]
        dynamic_batching { preferred_batch_size: [ 4 ] priority_levels: 2 default_priority_level: 3
                           preserve_ordering: true }
        instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]
        optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ] } }
        batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_INT8 source_input: "x" } ]
        model_transaction_policy { decoupled: true }"#;
    let found = problems(bad);
    for expected in [
        "platform 'onnxruntime_onnx' / backend 'pytorch' is not a pair Plinth serves",
        "input 'x' is declared twice",
        "input 'x': every dimension of 'dims' must be 1 or more, or -1 for a variable size, got [4, 0]",
        "input 'x': 'dims' [4] and 'reshape' [3] hold different numbers of elements",
        "output 'y' must have a valid 'data_type'",
        "output 'y' must have 'dims'",
        "output 'y': 'is_shape_tensor' is set, but shape tensors are TensorRT's; remove it",
        "'preferred_batch_size' 4 is not within 1..=2 (max_batch_size)",
        "default priority level ('default_priority_level') 3 is not in range [1, 2] ('priority_levels')",
        "'preserve_ordering' is true, so only one priority level may be used; 'priority_levels' is 2",
        "instance group #0 is of kind KIND_CPU, yet 'gpus' specifies GPUs [0]",
        "'optimization.execution_accelerators' is set",
        "batch input data type must be TYPE_INT32 or TYPE_FP32, got TYPE_INT8",
        "'model_transaction_policy.decoupled' is set",
    ] {
        assert!(found.iter().any(|f| f.contains(expected)), "missing {expected:?} in {found:#?}");
    }
}

#[test]
fn each_field_plinth_does_not_act_on_is_refused_by_name() {
    let io = r#"input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]"#;
    let ensemble = r#"platform: "ensemble" max_batch_size: 1
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ] output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
        ensemble_scheduling { step [ { model_name: "m" model_version: -1 input_map { key: "x" value: "IN" }
                                       output_map { key: "y" value: "OUT" } } ] }"#;
    let cases = [
        (
            r#"input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] is_shape_tensor: true } ]"#,
            "input 'x': 'is_shape_tensor'",
        ),
        (
            r#"input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] is_non_linear_format_io: true } ]"#,
            "input 'x': 'is_non_linear_format_io'",
        ),
        (
            r#"output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] is_shape_tensor: true } ]"#,
            "output 'y': 'is_shape_tensor'",
        ),
        (
            r#"output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] is_non_linear_format_io: true } ]"#,
            "output 'y': 'is_non_linear_format_io'",
        ),
        (r#"instance_group [ { profile: [ "0" ] } ]"#, "'profile'"),
        (r#"instance_group [ { secondary_devices [ { kind: KIND_NVDLA device_id: 0 } ] } ]"#, "'secondary_devices'"),
        (r#"instance_group [ { passive: true } ]"#, "'passive'"),
        (r#"instance_group [ { host_policy: "numa0" } ]"#, "'host_policy'"),
        ("optimization { priority: PRIORITY_MAX }", "'optimization.priority'"),
        ("optimization { cuda { graphs: true } }", "'optimization.cuda'"),
        ("optimization { execution_accelerators { } }", "'optimization.execution_accelerators'"),
        ("optimization { input_pinned_memory { enable: true } }", "'optimization.input_pinned_memory'"),
        ("optimization { output_pinned_memory { enable: true } }", "'optimization.output_pinned_memory'"),
        ("optimization { gather_kernel_buffer_threshold: 1 }", "'optimization.gather_kernel_buffer_threshold'"),
        ("optimization { eager_batching: true }", "'optimization.eager_batching'"),
        (r#"runtime: "libcustom.so""#, "'runtime'"),
        (r#"cc_model_filenames { key: "7.5" value: "m.onnx" }"#, "'cc_model_filenames'"),
        (r#"metric_tags { key: "team" value: "ocr" }"#, "'metric_tags'"),
        (r#"model_operations { op_library_filename: "ops.so" }"#, "'model_operations'"),
        (r#"model_repository_agents { agents [ { name: "checksum" } ] }"#, "'model_repository_agents'"),
        ("model_metrics { }", "'model_metrics'"),
        ("model_transaction_policy { decoupled: true }", "'model_transaction_policy.decoupled'"),
        (
            "sequence_batching { } response_cache { enable: true }",
            "'response_cache' cannot be enabled with 'sequence_batching'",
        ),
    ];
    for (field, named) in cases {
        let found = problems(&format!("platform: \"onnxruntime_onnx\" max_batch_size: 1 {io} {field}"));
        assert!(found.iter().any(|f| f.contains(named)), "{field}: {named:?} not in {found:#?}");
    }
    for (field, named) in [
        ("optimization { graph { level: 1 } }", "ensemble: 'optimization'"),
        (
            r#"model_warmup [ { name: "w" batch_size: 1 inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]"#,
            "ensemble: 'model_warmup'",
        ),
    ] {
        let found = problems(&format!("{ensemble} {field}"));
        assert!(found.iter().any(|f| f.contains(named)), "{field}: {named:?} not in {found:#?}");
    }
}

#[test]
fn the_example_repository_is_valid() {
    let repository = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../model_repository");
    for entry in std::fs::read_dir(&repository).unwrap() {
        let folder = entry.unwrap().path();
        let config = crate::config::load(&folder).unwrap();
        assert_eq!(validate(&config).map(drop), Ok(()), "{}", folder.display());
    }
}

#[test]
fn an_ensemble_graph_is_checked_step_by_step() {
    let ok = r#"
        platform: "ensemble" max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling { step [
          { model_name: "a" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "MID" } },
          { model_name: "b" model_version: -1 input_map { key: "x" value: "MID" } output_map { key: "y" value: "OUT" } } ] }"#;
    assert_eq!(problems(ok), Vec::<String>::new());
    let bad = r#"
        platform: "ensemble" max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "SPARE" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
        instance_group [ { count: 1 } ]
        ensemble_scheduling { step [
          { model_name: "a" input_map { key: "x" value: "IN" } output_map { key: "y" value: "MID" } },
          { model_name: "b" input_map { key: "x" value: "NOWHERE" } output_map { key: "y" value: "MID" } },
          { model_name: "" input_map { key: "x" value: "IN" } output_map { key: "y" value: "DROPPED" } } ] }"#;
    let found = problems(bad);
    for expected in [
        "an ensemble runs its steps' instances",
        "ensemble tensor 'MID' can appear in an output map only once: step 0 and step 1 write it",
        "ensemble step 1 (model 'b') can never run: its inputs [\"NOWHERE\"]",
        "must specify 'model_name' in ensemble step 2",
        "ensemble input 'SPARE' is not used: no step reads it",
        "ensemble output 'OUT' is not written: no step writes it",
        "ensemble tensor 'DROPPED' is unused: step 2 writes it, but no step reads it and it is no ensemble output",
    ] {
        assert!(found.iter().any(|f| f.contains(expected)), "missing {expected:?} in {found:#?}");
    }
    let twice = r#"
        platform: "ensemble" max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling { step [
          { model_name: "a" input_map { key: "x" value: "IN" } output_map [ { key: "y" value: "OUT" }, { key: "z" value: "OUT" } ] } ] }"#;
    assert_eq!(
        problems(twice),
        ["ensemble tensor 'OUT' can appear in an output map only once: step 0 writes it twice"]
    );
    let unconnected = r#"
        platform: "ensemble" max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "LATE" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling { step [
          { model_name: "a" input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } },
          { model_name: "b" input_map { key: "x" value: "NOWHERE" } output_map { key: "y" value: "LATE" } } ] }"#;
    assert_eq!(
        problems(unconnected),
        [
            "ensemble step 1 (model 'b') can never run: its inputs [\"NOWHERE\"] are neither ensemble inputs nor \
             written by a step that can run",
            "ensemble output 'LATE' is not written: the tensors it depends on [\"NOWHERE\"] are not connected (no \
             ensemble input, and no step that can run, writes them)",
        ]
    );
}

#[test]
fn backends_plinth_does_not_ship_are_named() {
    let found = problems(r#"backend: "python""#);
    assert!(found[0].contains("Plinth does not ship Triton's 'python' backend"), "{found:?}");
    let ensemble = problems(r#"platform: "ensemble" backend: "onnxruntime""#);
    assert!(
        ensemble.iter().any(|f| f.contains("an ensemble must have platform type 'ensemble' and empty backend type")),
        "{ensemble:?}"
    );
    assert!(ensemble.iter().any(|f| f.contains("needs 'ensemble_scheduling'")), "{ensemble:?}");
}

/// Triton's `qa/L0_model_config/noautofill_platform/batch_*` cases, as
/// their configurations state them (no platform, no max_batch_size), and
/// the words of each case's `expected` file.
#[test]
fn batch_inputs_and_outputs_are_checked_with_triton_s_messages() {
    let io = |out_dims: &str| {
        format!(
            r#"input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
               output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: {out_dims} }} ]"#
        )
    };
    let kinds = [
        "BATCH_ELEMENT_COUNT",
        "BATCH_ACCUMULATED_ELEMENT_COUNT",
        "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
        "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    ];
    let mut cases = Vec::new();
    for kind in kinds {
        cases.push((
            format!(
                r#"{} batch_input [ {{ kind: {kind} target_name: "BATCH_INPUT" data_type: TYPE_FP32 }} ]"#,
                io("[ 1 ]")
            ),
            format!("batch input kind '{kind}' expects 1 source input, got 0"),
        ));
        cases.push((
            format!(
                r#"{} batch_input [ {{ kind: {kind} target_name: "BATCH_AND_SIZE_INPUT" data_type: TYPE_FP32
                                      source_input: ["INPUT", "INPUT"] }} ]"#,
                io("[ 1 ]")
            ),
            format!("batch input kind '{kind}' expects 1 source input, got 2"),
        ));
    }
    let scatter = "BATCH_SCATTER_WITH_INPUT_SHAPE";
    for (fields, message) in [
        (
            r#"batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "BATCH_INPUT" data_type: TYPE_FP32 source_input: "UNKNOWN_INPUT" } ]"#,
            "unknown source input name 'UNKNOWN_INPUT'",
        ),
        (
            r#"batch_output [ { target_name: ["OUTPUT", "OUTPUT"] kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT" } ]"#,
            "target output name 'OUTPUT' can only be specified once",
        ),
        (
            r#"batch_output [ { target_name: "OUTPUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE } ]"#,
            "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0",
        ),
        (
            r#"batch_output [ { target_name: "OUTPUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: ["INPUT", "INPUT"] } ]"#,
            "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 2",
        ),
        (
            r#"batch_output [ { target_name: "OUTPUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "UNKNOWN_INPUT" } ]"#,
            "unknown source input name 'UNKNOWN_INPUT'",
        ),
        (
            r#"batch_output [ { target_name: "UNKNOWN_OUTPUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT" } ]"#,
            "unknown target output name 'UNKNOWN_OUTPUT'",
        ),
    ] {
        cases.push((format!("{} {fields}", io("[ -1 ]")), message.replace("BATCH_SCATTER_WITH_INPUT_SHAPE", scatter)));
    }
    for (config, message) in cases {
        let found = problems(&config);
        assert!(found.iter().any(|f| f.contains(&message)), "{message:?} not in {found:#?}");
        // Without a batch dimension Plinth also says why it refuses.
        assert!(found.iter().any(|f| f.contains("needs max_batch_size > 0")), "{found:#?}");
    }
}

#[test]
fn ragged_batching_is_valid_with_a_batch_dimension_and_checked_beyond_triton() {
    let ok = r#"
        platform: "onnxruntime_onnx" max_batch_size: 4
        input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, -1 ] }, { name: "z" data_type: TYPE_FP32 dims: [ 2 ] } ]
        batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "offsets" data_type: TYPE_INT32 source_input: "x" },
                      { kind: BATCH_ITEM_SHAPE target_name: [ "shapes", "shapes_again" ] data_type: TYPE_FP32 source_input: "x" } ]
        batch_output [ { target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "x" } ]
        dynamic_batching { }"#;
    assert_eq!(problems(ok), Vec::<String>::new());
    let bad = r#"
        platform: "onnxruntime_onnx" max_batch_size: 4
        input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true },
                { name: "n" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]
        batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_INT32 source_input: "x" },
                      { kind: BATCH_ELEMENT_COUNT target_name: "m" data_type: TYPE_INT32 source_input: "x" },
                      { kind: BATCH_ITEM_SHAPE target_name: "m" data_type: TYPE_INT32 source_input: "x" },
                      { kind: BATCH_ITEM_SHAPE data_type: TYPE_INT32 source_input: "x" } ]
        batch_output [ { target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "x" } ]"#;
    let found = problems(bad);
    for expected in [
        "batch input target name 'n' is also a declared input",
        "batch input target name 'm' can only be specified once",
        "batch input kind 'BATCH_ITEM_SHAPE' expects a 'target_name', got none",
        "batch output 'y' (BATCH_SCATTER_WITH_INPUT_SHAPE): its dimension 2 (batch dimension first) is variable, but source input 'x' has only 2 dimensions",
    ] {
        assert!(found.iter().any(|f| f.contains(expected)), "missing {expected:?} in {found:#?}");
    }
    let unbatched = problems(
        r#"platform: "onnxruntime_onnx" input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]"#,
    );
    assert!(
        unbatched.iter().any(|f| f.contains("input 'x': 'allow_ragged_batch' needs max_batch_size > 0")),
        "{unbatched:#?}"
    );
    let ensemble = problems(
        r#"platform: "ensemble" max_batch_size: 4
           input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
           output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
           ensemble_scheduling { step [ { model_name: "m" model_version: -1 input_map { key: "x" value: "IN" }
                                          output_map { key: "y" value: "OUT" } } ] }"#,
    );
    assert!(
        ensemble.iter().any(|f| f.contains("input 'IN': 'allow_ragged_batch' is set on an ensemble")),
        "{ensemble:#?}"
    );
}

#[test]
fn a_generative_model_needs_onnx_runtime_and_its_tokenizer_and_generation_keys_need_one() {
    let found = problems(
        r#"platform: "pytorch_libtorch" max_batch_size: 4 model_transaction_policy { decoupled: true }
           input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]"#,
    );
    for expected in
        ["Plinth runs with ONNX Runtime", "(parameter 'plugin')", "max_batch_size 0", "text_input and text_output"]
    {
        assert!(found.iter().any(|f| f.contains(expected)), "missing {expected:?} in {found:#?}");
    }
    let plain = problems(r#"parameters { key: "generation.max_tokens" value: { string_value: "8" } }"#);
    assert!(plain.iter().any(|f| f.contains("'generation.max_tokens' is for generative models")), "{plain:#?}");
    let ok = r#"backend: "onnxruntime" model_transaction_policy { decoupled: true }
        parameters { key: "plugin" value: { string_value: "t.wasm" } }
        parameters { key: "generation.context_length" value: { string_value: "512" } }"#;
    assert_eq!(problems(ok), Vec::<String>::new());
}
