//! Image helpers for plugins whose requests carry a PNG or JPEG body
//! (feature `image`).

use crate::Error;
pub use image;
use image::RgbImage;

/// Decodes a PNG or JPEG request body into 8-bit RGB.
///
/// # Errors
/// [`Error::BadInput`] naming the problem when the body is not a decodable
/// PNG or JPEG image.
pub fn decode_rgb(body: &[u8]) -> Result<RgbImage, Error> {
    let format =
        image::guess_format(body).map_err(|_| Error::bad_input("the request body is not a PNG or JPEG image"))?;
    if !matches!(format, image::ImageFormat::Png | image::ImageFormat::Jpeg) {
        return Err(Error::bad_input(format!("the request body is a {format:?} image; expected PNG or JPEG")));
    }
    let img = image::load_from_memory_with_format(body, format)
        .map_err(|e| Error::bad_input(format!("cannot decode the {format:?} image: {e}")))?;
    Ok(img.to_rgb8())
}

/// Channel order of the planes written by [`to_chw`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelOrder {
    /// Red, green, blue (most ImageNet-trained models).
    Rgb,
    /// Blue, green, red (models trained on OpenCV-loaded images, e.g. PaddleOCR).
    Bgr,
}

/// Writes `img` as planar `[3, H, W]` FP32 values `(x / 255 - mean[c]) / std[c]`
/// into a `[3, H, pad_width]` buffer, zero-padding columns at `W..pad_width`.
/// `mean` and `std` are given per output channel.
///
/// # Panics
/// If `pad_width` is smaller than the image width.
pub fn to_chw(img: &RgbImage, order: ChannelOrder, mean: [f32; 3], std: [f32; 3], pad_width: usize) -> Vec<f32> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    assert!(pad_width >= w, "pad width {pad_width} is narrower than the image ({w})");
    let mut out = vec![0.0f32; 3 * h * pad_width];
    for (x, y, px) in img.enumerate_pixels() {
        let rgb = px.0;
        let channels = match order {
            ChannelOrder::Rgb => rgb,
            ChannelOrder::Bgr => [rgb[2], rgb[1], rgb[0]],
        };
        for (c, v) in channels.into_iter().enumerate() {
            out[(c * h + y as usize) * pad_width + x as usize] = (f32::from(v) / 255.0 - mean[c]) / std[c];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_non_images_as_bad_input() {
        assert!(matches!(decode_rgb(b"hello"), Err(Error::BadInput(_))));
    }

    #[test]
    fn chw_is_planar_normalised_and_padded() {
        let img = RgbImage::from_raw(1, 1, vec![255, 0, 0]).unwrap();
        let v = to_chw(&img, ChannelOrder::Bgr, [0.5; 3], [0.5; 3], 2);
        // planes B, G, R; second column is padding
        assert_eq!(v, vec![-1.0, 0.0, -1.0, 0.0, 1.0, 0.0]);
    }
}
