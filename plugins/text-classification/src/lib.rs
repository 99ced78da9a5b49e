//! Text classification composed of two models: an encoder that turns text
//! into a sentence embedding (another model of the repository, through its
//! own plugin, e.g. `minilm` with `text_embedding.wasm`) and this plugin's
//! model, a classification head over that embedding (e.g. a logistic
//! regression exported by skl2onnx).
//!
//! `preprocess` sends the request, as it came (JSON `{"input": "text"}` or a
//! `text/plain` body), to the encoder's `/predict` (composition, contract
//! 0.2), reads the one vector from its embeddings list (OpenAI's shape,
//! `data[0].embedding`) and makes it the head's one FP32 input `[1, width]`.
//! `postprocess` answers the most probable class of the head's one output
//! (`[1, classes]` probabilities): `{"label": "spam", "score": 0.97}`.
//!
//! From the model folder: the `config.pbtxt` parameters `encoder` (the
//! model to run first) and `labels` (a file in the version folder, one class
//! name per line, in the order of the head's output).

use plinth_plugin_sdk::{
    Datatype, Error, ModelInfo, Plugin, Request, Response, Tensor, export_plugin, find_output, predict,
};

/// Where the host mounts the version folder.
const MODEL_DIR: &str = "/model";

/// The plugin's state, one per instance.
pub struct TextClassification {
    encoder: String,
    input: String,
    width: Option<usize>,
    output: String,
    labels: Vec<String>,
}

impl Plugin for TextClassification {
    fn init(info: &ModelInfo) -> Result<Self, Error> {
        let encoder = info
            .parameter("encoder")
            .ok_or_else(|| Error::internal("the parameter 'encoder' must name the model that embeds the text"))?
            .to_owned();
        let file = info
            .parameter("labels")
            .ok_or_else(|| Error::internal("the parameter 'labels' must name the class file in the version folder"))?;
        let path = format!("{MODEL_DIR}/{file}");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::internal(format!("cannot read {path}: {e}")))?;
        let labels: Vec<String> = text.lines().filter(|l| !l.is_empty()).map(str::to_owned).collect();
        let input = info.first_input()?;
        let output = info.first_output()?;
        if input.datatype != Datatype::Fp32 || input.dims.len() != 1 || output.datatype != Datatype::Fp32 {
            return Err(Error::internal(format!(
                "the head takes '{}' {:?} {:?} and returns '{}' {:?}; this plugin feeds an FP32 [width] embedding and reads FP32 probabilities",
                input.name, input.datatype, input.dims, output.name, output.datatype
            )));
        }
        if output.dims.last().is_some_and(|&n| n >= 0 && n as usize != labels.len()) {
            return Err(Error::internal(format!(
                "output '{}' has {:?} classes but {file} names {}",
                output.name,
                output.dims.last(),
                labels.len()
            )));
        }
        let width = usize::try_from(input.dims[0]).ok();
        Ok(TextClassification { encoder, input: input.name.clone(), width, output: output.name.clone(), labels })
    }

    fn preprocess(&mut self, req: &Request) -> Result<Vec<Tensor>, Error> {
        let answer = predict(&self.encoder, None, req)?;
        let list: serde_json::Value = serde_json::from_slice(&answer.body).map_err(|e| {
            Error::internal(format!("the encoder '{}' answered something other than JSON: {e}", self.encoder))
        })?;
        let data = list["data"].as_array().map(Vec::as_slice).unwrap_or_default();
        let [item] = data else {
            return Err(Error::bad_input(format!("send one text to classify; got {}", data.len())));
        };
        let vector: Vec<f32> = item["embedding"]
            .as_array()
            .ok_or_else(|| Error::internal(format!("the encoder '{}' answered no data[0].embedding", self.encoder)))?
            .iter()
            .map(|v| v.as_f64().map(|x| x as f32))
            .collect::<Option<_>>()
            .ok_or_else(|| Error::internal("the embedding holds something other than numbers"))?;
        if self.width.is_some_and(|w| w != vector.len()) {
            return Err(Error::internal(format!(
                "the encoder's embedding has {} values; the head takes {:?}",
                vector.len(),
                self.width
            )));
        }
        Ok(vec![Tensor::from_slice(&self.input, &[1, vector.len() as i64], &vector)])
    }

    fn postprocess(&mut self, _req: &Request, outputs: Vec<Tensor>) -> Result<Response, Error> {
        let probabilities = find_output(&outputs, &self.output)?.to_vec::<f32>()?;
        if probabilities.len() != self.labels.len() {
            return Err(Error::internal(format!(
                "the head returned {} probabilities for {} labels",
                probabilities.len(),
                self.labels.len()
            )));
        }
        let (best, score) = probabilities
            .iter()
            .copied()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .ok_or_else(|| Error::internal("the head returned no probabilities"))?;
        Ok(Response::json(&serde_json::json!({ "label": self.labels[best], "score": score })))
    }
}

export_plugin!(TextClassification);
