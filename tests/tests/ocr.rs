//! Reading text out of real images through the example repository, end to
//! end: HTTP → plugin preprocess → ONNX Runtime → plugin postprocess; and a
//! whole page through `ocr`, whose plugin runs ocr_cls and ocr_rec on each
//! line it finds (composition).

use plinth_tests::{Server, example_repository, fixture};
use serde_json::Value;

fn expected() -> Value {
    serde_json::from_slice(&fixture("expected.json")).unwrap()
}

fn content_type(file: &str) -> &'static str {
    if file.ends_with(".jpg") { "image/jpeg" } else { "image/png" }
}

#[test]
fn ocr_rec_reads_the_exact_text_of_every_line() {
    let server = Server::start(&example_repository(), &[]);
    let expected = expected();
    let lines = expected["rec"].as_object().unwrap();
    assert!(lines.len() >= 5 && lines.keys().any(|f| f.ends_with(".jpg")), "fixtures cover several lines and a JPEG");
    for (file, want) in lines {
        let (status, body) = server.post_bytes("/v2/models/ocr_rec/predict", content_type(file), fixture(file));
        assert_eq!(status, 200, "{file}: {body}");
        assert_eq!(body["text"], want["text"], "{file}");
        let confidence = body["confidence"].as_f64().unwrap();
        let reference = want["confidence"].as_f64().unwrap();
        assert!((confidence - reference).abs() < 0.01, "{file}: confidence {confidence}, reference {reference}");
    }
}

#[test]
fn ocr_cls_tells_upright_from_rotated_lines() {
    let server = Server::start(&example_repository(), &[]);
    for (file, angle) in [("cls_upright.png", 0), ("cls_rotated.png", 180)] {
        let (status, body) = server.post_bytes("/v2/models/ocr_cls/predict", "image/png", fixture(file));
        assert_eq!(status, 200, "{file}: {body}");
        assert_eq!(body["angle"], angle, "{file}");
        assert!(body["confidence"].as_f64().unwrap() > 0.9, "{file}: {body}");
    }
}

#[test]
fn ocr_reads_every_line_of_a_page_in_reading_order_with_boxes_inside_it() {
    let server = Server::start(&example_repository(), &[]);
    let calls = |m: &str| server.metric(&format!("nv_inference_request_success{{model=\"{m}\",version=\"1\"}}"));
    // Each model's plugin warm-up (plugin.warmup) ran before READY: count
    // from here.
    let before = (calls("ocr"), calls("ocr_cls"), calls("ocr_rec"));
    let (status, body) = server.post_bytes("/v2/models/ocr/predict", "image/png", fixture("page.png"));
    assert_eq!(status, 200, "{body}");
    let lines = body["lines"].as_array().unwrap();
    let texts: Vec<&str> = lines.iter().map(|l| l["text"].as_str().unwrap()).collect();
    let expected = expected();
    let want: Vec<&str> =
        expected["page"]["page.png"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(texts, want);
    let (width, height) = (900, 440); // page.png
    let mut previous_top = 0;
    for line in lines {
        let corners: Vec<(i64, i64)> =
            line["box"].as_array().unwrap().iter().map(|p| (p[0].as_i64().unwrap(), p[1].as_i64().unwrap())).collect();
        let [(x0, y0), (x1, _), (_, y1), _] = corners[..] else { panic!("{line}") };
        assert!(0 <= x0 && x0 < x1 && x1 <= width && 0 <= y0 && y0 < y1 && y1 <= height, "{line}");
        assert!(y0 > previous_top, "lines come top to bottom: {body}");
        previous_top = y0;
        assert!(line["confidence"].as_f64().unwrap() > 0.9, "{line}");
    }
    assert_eq!(
        (calls("ocr") - before.0, calls("ocr_cls") - before.1, calls("ocr_rec") - before.2),
        (1.0, 4.0, 4.0),
        "each line went through both models"
    );
}

#[test]
fn versioned_routes_reach_the_same_model() {
    let server = Server::start(&example_repository(), &[]);
    let (status, body) =
        server.post_bytes("/v2/models/ocr_rec/versions/1/predict", "image/png", fixture("line_hello.png"));
    assert_eq!((status, body["text"].as_str()), (200, Some("Hello World")));
    let (status, _) = server.get("/v2/models/ocr_rec/versions/1/ready");
    assert_eq!(status, 200);
}

#[test]
fn metadata_and_health_follow_the_v2_protocol() {
    let server = Server::start(&example_repository(), &[]);
    assert_eq!(server.get("/v2/health/live").0, 200);
    assert_eq!(server.get("/v2/health/ready").0, 200);
    let (status, meta) = server.get("/v2");
    assert_eq!((status, meta["name"].as_str()), (200, Some("plinth")));
    let (status, meta) = server.get("/v2/models/ocr_rec");
    assert_eq!(status, 200);
    assert_eq!(meta["platform"], "onnxruntime_onnx");
    assert_eq!(meta["versions"], serde_json::json!(["1"]));
    assert_eq!(meta["inputs"], serde_json::json!([{"name": "x", "datatype": "FP32", "shape": [-1, 3, 48, -1]}]));
    assert_eq!(meta["outputs"][0]["shape"], serde_json::json!([-1, -1, 6625]));
}

#[test]
fn json_infer_carries_tensors_and_the_request_id() {
    let server = Server::start(&example_repository(), &[]);
    let zeros = vec![0.0f32; 3 * 48 * 192];
    let request = serde_json::json!({
        "id": "req-7",
        "inputs": [{"name": "x", "shape": [1, 3, 48, 192], "datatype": "FP32", "data": zeros}],
        "outputs": [{"name": "save_infer_model/scale_0.tmp_1"}],
    });
    let (status, body) = server.post_json("/v2/models/ocr_cls/infer", &request);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["id"], "req-7");
    assert_eq!(body["model_name"], "ocr_cls");
    assert_eq!(body["model_version"], "1");
    let out = &body["outputs"][0];
    assert_eq!(out["shape"], serde_json::json!([1, 2]));
    let p: Vec<f64> = out["data"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert!((p[0] + p[1] - 1.0).abs() < 1e-5, "class probabilities sum to 1: {p:?}");
}
