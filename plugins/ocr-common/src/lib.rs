//! Text-line preprocessing shared by the PP-OCR recognition and direction
//! plugins: the input layout PaddleOCR's models were trained on.

use plinth_plugin_sdk::imaging::image::imageops::{self, FilterType};
use plinth_plugin_sdk::imaging::{self, ChannelOrder};
use plinth_plugin_sdk::{Error, ModelInfo, Request, Tensor};

/// Height in pixels of every text line the PP-OCR models read.
pub const LINE_HEIGHT: u32 = 48;

/// Largest image accepted, in pixels: any text line fits well within it,
/// and so does its decoded form within the plugin's memory limit.
pub const MAX_PIXELS: u64 = 16_000_000;

/// How wide the model input is, given the width the line has after being
/// scaled to [`LINE_HEIGHT`].
#[derive(Clone, Copy, Debug)]
pub enum Width {
    /// The line keeps its width, padded up to at least this many pixels
    /// (the recognizer: 320).
    AtLeast(u32),
    /// The line is squeezed to at most this width and padded to exactly it
    /// (the direction classifier: 192).
    Exactly(u32),
}

/// Decodes the request body (PNG or JPEG) and returns the model's input
/// tensor: `[1, 3, 48, W]` FP32 (batch dimension only when the model batches),
/// BGR planes normalised to `(x / 255 - 0.5) / 0.5`, zero-padded on the right.
///
/// # Errors
/// [`Error::BadInput`] when the body is not an image or is too large to be a
/// text line; [`Error::Internal`] when the model declares no input.
pub fn text_line_input(info: &ModelInfo, req: &Request, width: Width) -> Result<Vec<Tensor>, Error> {
    const MAX_WIDTH: u32 = 8192;
    let img = imaging::decode_rgb(&req.body, MAX_PIXELS)?;
    let (w, h) = img.dimensions();
    let scaled_w = (f64::from(LINE_HEIGHT) * f64::from(w) / f64::from(h)).ceil() as u32;
    let (resized_w, pad_w) = match width {
        Width::AtLeast(min) => (scaled_w, scaled_w.max(min)),
        Width::Exactly(exact) => (scaled_w.min(exact), exact),
    };
    if resized_w == 0 || pad_w > MAX_WIDTH {
        return Err(Error::bad_input(format!(
            "a {w}x{h} image is not a text line: scaled to height {LINE_HEIGHT} it would be {scaled_w} pixels wide (1 to {MAX_WIDTH} allowed)"
        )));
    }
    let resized = imageops::resize(&img, resized_w, LINE_HEIGHT, FilterType::Triangle);
    let data = imaging::to_chw(&resized, ChannelOrder::Bgr, [0.5; 3], [0.5; 3], pad_w as usize);
    let input = info.first_input()?;
    let mut shape = vec![3, i64::from(LINE_HEIGHT), i64::from(pad_w)];
    if info.max_batch_size > 0 {
        shape.insert(0, 1);
    }
    Ok(vec![Tensor::from_slice(&input.name, &shape, &data)])
}

/// Checks, when an instance starts, that the model's first input takes what
/// [`text_line_input`] makes: FP32 `[3, 48, W]` with `W` variable or
/// `fixed_width`. A configuration that could never match fails the load
/// instead of every request.
///
/// # Errors
/// [`Error::Internal`] naming the input, its dims and what is needed.
pub fn check_text_line_input(info: &ModelInfo, width: Width) -> Result<(), Error> {
    let input = info.first_input()?;
    let w = match width {
        Width::AtLeast(_) => -1,
        Width::Exactly(w) => i64::from(w),
    };
    let height = i64::from(LINE_HEIGHT);
    let fits = input.datatype == plinth_plugin_sdk::Datatype::Fp32
        && matches!(input.dims[..], [3, h, iw] if (h == height || h == -1) && (iw == w || iw == -1));
    if fits {
        Ok(())
    } else {
        let want = if w == -1 { "-1".to_owned() } else { format!("{w} or -1") };
        Err(Error::internal(format!(
            "input '{}' is {:?} with dims {:?}; this plugin makes FP32 text lines of dims [3, 48 or -1, {want}]",
            input.name, input.datatype, input.dims
        )))
    }
}

/// The output tensor the model declares first, from `outputs`.
///
/// # Errors
/// [`Error::Internal`] when the host returned no such output.
pub fn first_output<'a>(info: &ModelInfo, outputs: &'a [Tensor]) -> Result<&'a Tensor, Error> {
    let name = &info.first_output()?.name;
    outputs
        .iter()
        .find(|t| &t.name == name)
        .ok_or_else(|| Error::internal(format!("the model returned no output '{name}'")))
}
