use super::*;
use crate::tensor::push_bytes_element;

fn fp32(name: &str, shape: &[i64], values: &[f32]) -> Tensor {
    let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor { name: name.into(), datatype: DataType::Fp32, shape: shape.to_vec(), data }
}

/// A request of one ragged FP32 input `x` of `shape`, filled with its
/// first dimension after the batch one (Triton's L0_batch_input values).
fn request(shape: &[i64]) -> Vec<Tensor> {
    let n = element_count(shape).unwrap();
    vec![fp32("x", shape, &vec![shape.get(1).copied().unwrap_or(0) as f32; n])]
}

fn values(t: &Tensor) -> Vec<f64> {
    match t.datatype {
        DataType::Int32 => t.data.chunks(4).map(|c| f64::from(i32::from_le_bytes(c.try_into().unwrap()))).collect(),
        _ => t.data.chunks(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap()))).collect(),
    }
}

fn layout(x_dims: &str, extra: &str) -> BatchLayout {
    let config = crate::config::parse(&format!(
        r#"max_batch_size: 8
           input [ {{ name: "x" data_type: TYPE_FP32 dims: {x_dims} allow_ragged_batch: true }} ]
           output [ {{ name: "y" data_type: TYPE_FP32 dims: {x_dims} }}, {{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }} ]
           {extra}"#
    ))
    .unwrap();
    BatchLayout::from_config(&config).unwrap()
}

/// The batch input `target` of a layout with one batch input of `kind`
/// and `datatype` over `x`, for `requests`.
fn batch_input(kind: &str, datatype: &str, x_dims: &str, requests: &[Vec<Tensor>]) -> Tensor {
    let layout = layout(
        x_dims,
        &format!(r#"batch_input [ {{ kind: {kind} target_name: "b" data_type: {datatype} source_input: "x" }} ]"#),
    );
    let gathered = layout.gather(requests).unwrap();
    gathered.into_iter().find(|t| t.name == "b").unwrap()
}

fn l0_requests() -> Vec<Vec<Tensor>> {
    [[1, 2], [1, 4], [1, 1], [1, 3]].iter().map(|s| request(s)).collect()
}

#[test]
fn a_ragged_input_is_all_the_requests_elements_in_one_dimension() {
    let layout = layout("[ -1 ]", "");
    let requests = l0_requests();
    assert_eq!(layout.key(&requests[0]), layout.key(&requests[1]), "shapes of a ragged input may differ");
    let gathered = layout.gather(&requests).unwrap();
    assert_eq!(gathered.len(), 1);
    assert_eq!(gathered[0].shape, vec![10]);
    assert_eq!(values(&gathered[0]), [2., 2., 4., 4., 4., 4., 1., 3., 3., 3.]);
    // Alone, too: the model always takes it flat.
    assert_eq!(layout.gather(&requests[1..2]).unwrap()[0].shape, vec![4]);
}

#[test]
fn an_input_without_allow_ragged_batch_keeps_its_shape_in_the_key() {
    let layout = BatchLayout::default();
    assert!(layout.is_plain());
    let requests = l0_requests();
    assert_ne!(layout.key(&requests[0]), layout.key(&requests[1]));
}

#[test]
fn element_counts_as_triton_gives_them() {
    let requests = l0_requests();
    let count = batch_input("BATCH_ELEMENT_COUNT", "TYPE_FP32", "[ -1 ]", &requests);
    assert_eq!((count.datatype, count.shape.clone(), values(&count)), (DataType::Fp32, vec![4], vec![2., 4., 1., 3.]));
    let accumulated = batch_input("BATCH_ACCUMULATED_ELEMENT_COUNT", "TYPE_INT32", "[ -1 ]", &requests);
    assert_eq!(
        (accumulated.datatype, accumulated.shape.clone(), values(&accumulated)),
        (DataType::Int32, vec![4], vec![2., 6., 7., 10.])
    );
    let with_zero = batch_input("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "TYPE_FP32", "[ -1 ]", &requests);
    assert_eq!((with_zero.shape.clone(), values(&with_zero)), (vec![5], vec![0., 2., 6., 7., 10.]));
    let max = batch_input("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "TYPE_INT32", "[ -1 ]", &requests);
    assert_eq!((max.shape.clone(), values(&max)), (vec![4], vec![0.; 4]), "the shape is the value");
}

#[test]
fn element_counts_count_every_dimension_of_a_request() {
    let requests: Vec<_> = [[2, 1, 3], [1, 2, 2]].iter().map(|s| request(s)).collect();
    let count = batch_input("BATCH_ELEMENT_COUNT", "TYPE_INT32", "[ -1, -1 ]", &requests);
    assert_eq!(values(&count), [6., 4.]);
}

#[test]
fn item_shapes_give_one_row_per_batch_item() {
    let requests: Vec<_> = [[2, 1, 2], [1, 1, 2], [1, 2, 2]].iter().map(|s| request(s)).collect();
    let items = batch_input("BATCH_ITEM_SHAPE", "TYPE_FP32", "[ -1, -1 ]", &requests);
    assert_eq!((items.shape.clone(), values(&items)), (vec![4, 2], vec![1., 2., 1., 2., 1., 2., 2., 2.]));
    let requests: Vec<_> = [[1, 4, 1], [1, 1, 2], [1, 1, 2], [1, 2, 2]].iter().map(|s| request(s)).collect();
    let flat = batch_input("BATCH_ITEM_SHAPE_FLATTEN", "TYPE_INT32", "[ -1, -1 ]", &requests);
    assert_eq!((flat.shape.clone(), values(&flat)), (vec![8], vec![4., 1., 1., 2., 1., 2., 2., 2.]));
}

#[test]
fn a_batch_input_goes_to_each_of_its_targets_after_the_request_inputs() {
    let layout = layout(
        "[ -1 ]",
        r#"batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: [ "a", "b" ] data_type: TYPE_INT32 source_input: "x" } ]"#,
    );
    let names: Vec<String> = layout.gather(&l0_requests()).unwrap().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["x", "a", "b"]);
    let specs = layout.host_specs();
    assert_eq!(specs.iter().map(|s| (s.name.as_str(), s.dims.len())).collect::<Vec<_>>(), [("a", 0), ("b", 0)]);
}

#[test]
fn an_int32_batch_input_refuses_a_count_it_cannot_hold() {
    let bi = BatchInput {
        kind: BatchInputKind::ElementCount,
        targets: vec!["n".into()],
        datatype: DataType::Int32,
        source: "x".into(),
        source_rank: 1,
    };
    let err = bi.tensors(&[&[1, 1 << 31]]).unwrap_err();
    assert!(err.contains("2147483648 does not fit INT32"), "{err}");
}

#[test]
fn a_batch_output_is_scattered_by_each_request_s_source_shape() {
    let layout = layout(
        "[ -1 ]",
        r#"batch_output [ { target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "x" } ]"#,
    );
    let requests = l0_requests();
    let sources: Vec<_> = requests.iter().map(|r| layout.sources(r)).collect();
    let flat: Vec<f32> = (0..10).map(|v| v as f32).collect();
    // `z` has one row per request; `y` follows `x`'s shapes.
    let outputs = vec![fp32("z", &[4, 1], &[7., 8., 9., 10.]), fp32("y", &[10], &flat)];
    let parts = layout.split(outputs, &[1, 1, 1, 1], &sources).unwrap();
    let shapes: Vec<_> = parts.iter().map(|p| (p[0].shape.clone(), p[1].shape.clone())).collect();
    assert_eq!(
        shapes,
        [(vec![1, 1], vec![1, 2]), (vec![1, 1], vec![1, 4]), (vec![1, 1], vec![1, 1]), (vec![1, 1], vec![1, 3])]
    );
    assert_eq!(values(&parts[1][1]), [2., 3., 4., 5.]);
    assert_eq!(values(&parts[3][1]), [7., 8., 9.]);
    assert_eq!(values(&parts[2][0]), [9.]);
}

#[test]
fn a_batch_output_must_have_exactly_the_elements_of_its_parts() {
    let layout = layout(
        "[ -1 ]",
        r#"batch_output [ { target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "x" } ]"#,
    );
    let requests = &l0_requests()[..2];
    let sources: Vec<_> = requests.iter().map(|r| layout.sources(r)).collect();
    let short = layout.split(vec![fp32("y", &[5], &[0.; 5])], &[1, 1], &sources).unwrap_err();
    assert!(short.contains("output 'y' (batch_output) of shape [5] has fewer elements"), "{short}");
    let long = layout.split(vec![fp32("y", &[7], &[0.; 7])], &[1, 1], &sources).unwrap_err();
    assert!(long.contains("has more elements"), "{long}");
}

#[test]
fn a_bytes_batch_output_is_scattered_by_element() {
    let config = crate::config::parse(
        r#"max_batch_size: 8
           input [ { name: "x" data_type: TYPE_STRING dims: [ -1 ] allow_ragged_batch: true } ]
           output [ { name: "y" data_type: TYPE_STRING dims: [ -1 ] } ]
           batch_output [ { target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "x" } ]"#,
    )
    .unwrap();
    let layout = BatchLayout::from_config(&config).unwrap();
    let mut data = Vec::new();
    for s in ["a", "bcd", "", "ef"] {
        push_bytes_element(&mut data, s.as_bytes());
    }
    let out = Tensor { name: "y".into(), datatype: DataType::Bytes, shape: vec![4], data };
    let parts = layout.split(vec![out], &[1, 1], &[vec![vec![1, 1]], vec![vec![1, 3]]]).unwrap();
    assert_eq!(bytes_elements(&parts[0][0].data).unwrap(), vec![b"a".as_slice()]);
    assert_eq!(bytes_elements(&parts[1][0].data).unwrap(), vec![b"bcd".as_slice(), b"", b"ef"]);
    assert_eq!(parts[1][0].shape, vec![1, 3]);
}
