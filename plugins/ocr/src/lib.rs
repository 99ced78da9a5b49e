//! Full-page OCR as a model of its own. The model is the PP-OCRv4 text
//! detector; this plugin turns a page image into its input and its
//! probability map into text: regions above the threshold, each scored and
//! grown as PP-OCR's DB post-processing does, cropped from the page, turned
//! upright by `ocr_cls` and read by `ocr_rec`, both run through the host
//! (`plinth_plugin_sdk::predict`). Answers, in reading order,
//! `{"lines": [{"text", "confidence", "box": [[x, y] x 4]}]}` with box
//! corners in the page's pixels, clockwise from the top left.
//!
//! `config.pbtxt` parameters `cls_model` and `rec_model` name the two
//! models (default `ocr_cls`, `ocr_rec`).

mod detect;

use plinth_plugin_sdk::imaging::image::{self, RgbImage, imageops};
use plinth_plugin_sdk::imaging::{ChannelOrder, decode_rgb, to_chw};
use plinth_plugin_sdk::{Datatype, Error, ModelInfo, Plugin, Request, Response, Tensor, export_plugin, find_output};

use detect::{Region, Size};

/// The largest page accepted.
const MAX_PIXELS: u64 = 16_000_000;
/// Lines read with less confidence are left out (RapidOCR's `text_score`).
const TEXT_SCORE: f64 = 0.5;
/// A line classified as upside down with at least this confidence is
/// turned before it is read (RapidOCR's `cls_thresh`).
const CLS_THRESHOLD: f64 = 0.9;

struct Ocr {
    input: String,
    output: String,
    cls_model: String,
    rec_model: String,
}

impl Plugin for Ocr {
    fn init(info: &ModelInfo) -> Result<Self, Error> {
        let input = info.first_input()?;
        let image_dims =
            if info.max_batch_size > 0 { &input.dims[..] } else { input.dims.get(1..).unwrap_or_default() };
        if input.datatype != Datatype::Fp32 || !matches!(image_dims, [3, -1, -1]) {
            return Err(Error::internal(format!(
                "input '{}' is {:?} with dims {:?}; this plugin makes FP32 pages of dims [3, -1, -1] (batch of 1)",
                input.name, input.datatype, input.dims
            )));
        }
        let model = |key: &str, default: &str| info.parameter(key).unwrap_or(default).to_owned();
        Ok(Ocr {
            input: input.name.clone(),
            output: info.first_output()?.name.clone(),
            cls_model: model("cls_model", "ocr_cls"),
            rec_model: model("rec_model", "ocr_rec"),
        })
    }

    fn preprocess(&mut self, req: &Request) -> Result<Vec<Tensor>, Error> {
        let page = decode_rgb(&req.body, MAX_PIXELS)?;
        let size = detect::input_size(page.width(), page.height());
        let resized = imageops::resize(&page, size.width, size.height, imageops::FilterType::Triangle);
        // PP-OCR reads BGR images normalised to [-1, 1].
        let values = to_chw(&resized, ChannelOrder::Bgr, [0.5; 3], [0.5; 3], size.width as usize);
        let shape = [1, 3, i64::from(size.height), i64::from(size.width)];
        Ok(vec![Tensor::from_slice(&self.input, &shape, &values)])
    }

    fn postprocess(&mut self, req: &Request, outputs: Vec<Tensor>) -> Result<Response, Error> {
        let map = find_output(&outputs, &self.output)?;
        let [.., h, w] = map.shape[..] else {
            return Err(Error::internal(format!("the detector's map has shape {:?}", map.shape)));
        };
        let probabilities = map.to_vec::<f32>()?;
        let page = decode_rgb(&req.body, MAX_PIXELS)?;
        let map_size = Size { width: w as u32, height: h as u32 };
        let regions = detect::regions(&probabilities, map_size, page.dimensions());
        let mut lines = Vec::new();
        for region in regions {
            if let Some(line) = self.read(&page, &region)? {
                lines.push(line);
            }
        }
        Ok(Response::json(&serde_json::json!({ "lines": lines })))
    }
}

impl Ocr {
    /// Reads one region: upright it with the classifier, then recognise it.
    /// `None` when the recogniser is not confident enough.
    fn read(&self, page: &RgbImage, region: &Region) -> Result<Option<serde_json::Value>, Error> {
        // The recogniser reads word gaps reliably only with some white around
        // the ink, as in the lines it was trained on: a margin of a quarter
        // of the line's height.
        let margin = (region.y1 - region.y0) / 4;
        let (x0, y0) = (region.x0.saturating_sub(margin), region.y0.saturating_sub(margin));
        let (x1, y1) = ((region.x1 + margin).min(page.width()), (region.y1 + margin).min(page.height()));
        let mut crop = imageops::crop_imm(page, x0, y0, x1 - x0, y1 - y0).to_image();
        let angle = self.ask(&self.cls_model, &crop)?;
        let upside_down = angle["angle"] == 180 && angle["confidence"].as_f64().unwrap_or(0.0) >= CLS_THRESHOLD;
        if upside_down {
            imageops::rotate180_in_place(&mut crop);
        }
        let read = self.ask(&self.rec_model, &crop)?;
        let confidence = read["confidence"].as_f64().unwrap_or(0.0);
        if confidence < TEXT_SCORE {
            return Ok(None);
        }
        let (x0, y0, x1, y1) = (region.x0, region.y0, region.x1, region.y1);
        Ok(Some(serde_json::json!({
            "text": read["text"],
            "confidence": confidence,
            "box": [[x0, y0], [x1, y0], [x1, y1], [x0, y1]],
        })))
    }

    /// Sends `crop` as a PNG to `model`'s `/predict` through the host.
    fn ask(&self, model: &str, crop: &RgbImage) -> Result<serde_json::Value, Error> {
        let mut png = std::io::Cursor::new(Vec::new());
        crop.write_to(&mut png, image::ImageFormat::Png)
            .map_err(|e| Error::internal(format!("cannot encode a line as PNG: {e}")))?;
        let req = Request { content_type: "image/png".into(), body: png.into_inner(), parameters: Vec::new() };
        let response = plinth_plugin_sdk::predict(model, None, &req)?;
        serde_json::from_slice(&response.body)
            .map_err(|e| Error::internal(format!("model '{model}' answered something other than JSON: {e}")))
    }
}

export_plugin!(Ocr);
