//! ImageNet-style image classification, as torchvision's classification
//! presets do it. `preprocess` decodes a PNG or JPEG body, resizes its short
//! side to 256 pixels (bilinear), crops the centre 224x224 and normalises
//! with the ImageNet mean and standard deviation into an FP32 `[1, 3, 224,
//! 224]` tensor. `postprocess` turns the `[1, C]` logits into probabilities
//! (softmax) and answers the `top_k` most likely categories (query
//! parameter, default 5):
//! `{"classes": [{"index": 698, "label": "palace", "probability": 0.83}, ...]}`.
//!
//! The category names are read at start from the file the `config.pbtxt`
//! parameter `labels` names in the version folder, one per line, in logit
//! order.

use plinth_plugin_sdk::imaging::image::imageops::{self, FilterType};
use plinth_plugin_sdk::imaging::{ChannelOrder, decode_rgb, to_chw};
use plinth_plugin_sdk::{Datatype, Error, ModelInfo, Plugin, Request, Response, Tensor, export_plugin, find_output};

/// The short side after resizing, and the side of the centre crop.
const RESIZE: u32 = 256;
const CROP: u32 = 224;
/// ImageNet statistics of RGB values in [0, 1].
const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const STD: [f32; 3] = [0.229, 0.224, 0.225];
/// The largest image accepted: 40 megapixels, within the plugin's memory.
const MAX_PIXELS: u64 = 40_000_000;
/// Categories answered without a `top_k` parameter.
const DEFAULT_TOP_K: usize = 5;
/// Where the host mounts the version folder. A native build (the benchmark)
/// names the folder in `PLINTH_MODEL_DIR`; the sandbox has no environment.
fn model_dir() -> String {
    std::env::var("PLINTH_MODEL_DIR").unwrap_or_else(|_| "/model".to_owned())
}

/// The plugin's state, one per instance.
pub struct ImageClassification {
    input: String,
    output: String,
    labels: Vec<String>,
}

impl Plugin for ImageClassification {
    fn init(info: &ModelInfo) -> Result<Self, Error> {
        let input = info.first_input()?;
        let crop = i64::from(CROP);
        if input.datatype != Datatype::Fp32 || !matches!(input.dims[..], [3, h, w] if h == crop && w == crop) {
            return Err(Error::internal(format!(
                "input '{}' is {:?} with dims {:?}; this plugin makes FP32 images of dims [3, 224, 224]",
                input.name, input.datatype, input.dims
            )));
        }
        let output = info.first_output()?;
        let file = info.parameter("labels").ok_or_else(|| {
            Error::internal("the parameter 'labels' must name the category file in the version folder")
        })?;
        let path = format!("{}/{file}", model_dir());
        let text = std::fs::read_to_string(&path).map_err(|e| Error::internal(format!("cannot read {path}: {e}")))?;
        let labels: Vec<String> = text.lines().map(str::to_owned).collect();
        if output.dims.last().is_some_and(|&n| n >= 0 && n as usize != labels.len()) {
            return Err(Error::internal(format!(
                "output '{}' has {} classes but {file} names {}",
                output.name,
                output.dims.last().unwrap_or(&0),
                labels.len()
            )));
        }
        Ok(ImageClassification { input: input.name.clone(), output: output.name.clone(), labels })
    }

    fn preprocess(&mut self, req: &Request) -> Result<Vec<Tensor>, Error> {
        let img = decode_rgb(&req.body, MAX_PIXELS)?;
        let (w, h) = img.dimensions();
        // torchvision's Resize(256): the short side becomes 256, the long
        // side keeps the aspect ratio, rounded down.
        let (rw, rh) = if w <= h {
            (RESIZE, (u64::from(RESIZE) * u64::from(h) / u64::from(w)) as u32)
        } else {
            ((u64::from(RESIZE) * u64::from(w) / u64::from(h)) as u32, RESIZE)
        };
        let resized = imageops::resize(&img, rw, rh, FilterType::Triangle);
        // torchvision's CenterCrop(224): offsets rounded to nearest.
        let left = ((f64::from(rw - CROP)) / 2.0).round() as u32;
        let top = ((f64::from(rh - CROP)) / 2.0).round() as u32;
        let cropped = imageops::crop_imm(&resized, left, top, CROP, CROP).to_image();
        let values = to_chw(&cropped, ChannelOrder::Rgb, MEAN, STD, CROP as usize);
        Ok(vec![Tensor::from_slice(&self.input, &[1, 3, i64::from(CROP), i64::from(CROP)], &values)])
    }

    fn postprocess(&mut self, req: &Request, outputs: Vec<Tensor>) -> Result<Response, Error> {
        let top_k =
            match req.param("top_k") {
                None => DEFAULT_TOP_K,
                Some(v) => v.parse::<usize>().ok().filter(|&k| k >= 1).ok_or_else(|| {
                    Error::bad_input(format!("top_k must be a whole number of at least 1, got '{v}'"))
                })?,
            };
        let logits = find_output(&outputs, &self.output)?.to_vec::<f32>()?;
        if logits.len() != self.labels.len() {
            return Err(Error::internal(format!(
                "the model returned {} logits for {} categories",
                logits.len(),
                self.labels.len()
            )));
        }
        let probabilities = softmax(&logits);
        let mut order: Vec<usize> = (0..probabilities.len()).collect();
        order.sort_by(|&a, &b| probabilities[b].total_cmp(&probabilities[a]));
        let classes: Vec<_> = order
            .into_iter()
            .take(top_k)
            .map(|i| serde_json::json!({ "index": i, "label": self.labels[i], "probability": probabilities[i] }))
            .collect();
        Ok(Response::json(&serde_json::json!({ "classes": classes })))
    }
}

/// `exp(x - max) / sum`: the maximum is subtracted so no term overflows.
fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|&x| (x - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    exp.into_iter().map(|e| e / sum).collect()
}

export_plugin!(ImageClassification);
