//! PP-OCR text recognition. `preprocess` turns a text-line image into the
//! recognizer's input; `postprocess` decodes its per-step class
//! probabilities `[1, T, C]` with greedy CTC and answers
//! `{"text": "...", "confidence": 0.97}`.

use ocr_common::{Width, check_text_line_input, first_output, text_line_input};
use plinth_plugin_sdk::{Error, ModelInfo, Plugin, Request, Response, Tensor, export_plugin};

/// The plugin's state, one per instance.
pub struct OcrRec {
    info: ModelInfo,
    /// Class labels: index 0 is the CTC blank, the last one a space.
    classes: Vec<String>,
}

/// The recognizer reads at least 320 pixels of line (PaddleOCR's 3x48x320).
const MIN_WIDTH: u32 = 320;

impl Plugin for OcrRec {
    fn init(info: &ModelInfo) -> Result<Self, Error> {
        let dictionary = info.metadata("character").ok_or_else(|| {
            Error::internal("the model file has no 'character' metadata (the recognizer's dictionary)")
        })?;
        let mut classes = vec![String::new()];
        // One character per line; split on '\n' only, as a line may be a lone '\r'.
        let dictionary = dictionary.strip_suffix('\n').unwrap_or(dictionary);
        classes.extend(dictionary.split('\n').map(str::to_owned));
        classes.push(" ".into());
        check_text_line_input(info, Width::AtLeast(MIN_WIDTH))?;
        Ok(OcrRec { info: info.clone(), classes })
    }

    fn preprocess(&mut self, req: &Request) -> Result<Vec<Tensor>, Error> {
        text_line_input(&self.info, req, Width::AtLeast(MIN_WIDTH))
    }

    fn postprocess(&mut self, _req: &Request, outputs: Vec<Tensor>) -> Result<Response, Error> {
        let probs = first_output(&self.info, &outputs)?;
        let &[_, steps, classes] = probs.shape.as_slice() else {
            return Err(Error::internal(format!("expected output shape [1, T, C], got {:?}", probs.shape)));
        };
        if classes as usize != self.classes.len() {
            return Err(Error::internal(format!(
                "the model has {classes} classes but its dictionary gives {}",
                self.classes.len()
            )));
        }
        let values = probs.to_vec::<f32>()?;
        let (text, confidence) = self.ctc_greedy(&values[..steps as usize * classes as usize], classes as usize);
        Ok(Response::json(&serde_json::json!({ "text": text, "confidence": confidence })))
    }
}

impl OcrRec {
    /// Greedy CTC: the best class per step, repeats merged, blanks dropped;
    /// the confidence is the mean probability of the characters kept.
    fn ctc_greedy(&self, probs: &[f32], classes: usize) -> (String, f32) {
        let mut text = String::new();
        let mut kept = Vec::new();
        let mut previous = None;
        for step in probs.chunks_exact(classes) {
            let (best, p) = step
                .iter()
                .copied()
                .enumerate()
                .fold((0, f32::MIN), |acc, (i, p)| if p > acc.1 { (i, p) } else { acc });
            if best != 0 && previous != Some(best) {
                text.push_str(&self.classes[best]);
                kept.push(p);
            }
            previous = Some(best);
        }
        let confidence = if kept.is_empty() { 0.0 } else { kept.iter().sum::<f32>() / kept.len() as f32 };
        (text, confidence)
    }
}

export_plugin!(OcrRec);
