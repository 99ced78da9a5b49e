//! PP-OCR text direction. `preprocess` turns a text-line image into the
//! classifier's `[1, 3, 48, 192]` input; `postprocess` reads its `[1, 2]`
//! probabilities and answers `{"angle": 0 | 180, "confidence": 0.99}`.

use ocr_common::{Width, check_text_line_input, first_output, text_line_input};
use plinth_plugin_sdk::{Error, ModelInfo, Plugin, Request, Response, Tensor, export_plugin};

/// The plugin's state, one per instance.
pub struct OcrCls {
    info: ModelInfo,
}

/// The classifier's input width (PaddleOCR's 3x48x192).
const WIDTH: u32 = 192;
/// The angle each output class stands for.
const ANGLES: [u32; 2] = [0, 180];

impl Plugin for OcrCls {
    fn init(info: &ModelInfo) -> Result<Self, Error> {
        check_text_line_input(info, Width::Exactly(WIDTH))?;
        Ok(OcrCls { info: info.clone() })
    }

    fn preprocess(&mut self, req: &Request) -> Result<Vec<Tensor>, Error> {
        text_line_input(&self.info, req, Width::Exactly(WIDTH))
    }

    fn postprocess(&mut self, _req: &Request, outputs: Vec<Tensor>) -> Result<Response, Error> {
        let probs = first_output(&self.info, &outputs)?.to_vec::<f32>()?;
        let [p0, p180] = probs[..] else {
            return Err(Error::internal(format!("expected 2 class probabilities, got {}", probs.len())));
        };
        let (angle, confidence) = if p180 > p0 { (ANGLES[1], p180) } else { (ANGLES[0], p0) };
        Ok(Response::json(&serde_json::json!({ "angle": angle, "confidence": confidence })))
    }
}

export_plugin!(OcrCls);
