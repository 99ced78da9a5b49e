//! Image helpers for plugins whose requests carry a PNG or JPEG body
//! (feature `image`).

use crate::Error;
pub use image;
use image::RgbImage;

/// Decodes a PNG or JPEG request body into 8-bit RGB. Images of more than
/// `max_pixels` pixels are refused before they are decoded, so a small file
/// cannot make the plugin allocate more than its memory limit.
///
/// # Errors
/// [`Error::BadInput`] naming the problem: an empty body, another format, a
/// truncated or undecodable file, or an image larger than `max_pixels`.
pub fn decode_rgb(body: &[u8], max_pixels: u64) -> Result<RgbImage, Error> {
    if body.is_empty() {
        return Err(Error::bad_input("the request body is empty; expected a PNG or JPEG image"));
    }
    let format =
        image::guess_format(body).map_err(|_| Error::bad_input("the request body is not a PNG or JPEG image"))?;
    if !matches!(format, image::ImageFormat::Png | image::ImageFormat::Jpeg) {
        return Err(Error::bad_input(format!("the request body is a {format:?} image; expected PNG or JPEG")));
    }
    if format == image::ImageFormat::Jpeg && !jpeg_is_complete(body) {
        return Err(Error::bad_input("the JPEG image is truncated: no end-of-image marker after its last scan"));
    }
    let undecodable = |e: image::ImageError| {
        Error::bad_input(format!("cannot decode the {format:?} image: {}", e.to_string().trim()))
    };
    let (w, h) =
        image::ImageReader::with_format(std::io::Cursor::new(body), format).into_dimensions().map_err(undecodable)?;
    let pixels = u64::from(w) * u64::from(h);
    if pixels > max_pixels {
        return Err(Error::bad_input(format!(
            "the image is {w}x{h} = {pixels} pixels; at most {max_pixels} are accepted"
        )));
    }
    Ok(image::load_from_memory_with_format(body, format).map_err(undecodable)?.to_rgb8())
}

/// Whether a JPEG file ends its last scan (SOS, `FF DA`) with an
/// end-of-image marker (`FF D9`). Inside scan data every `FF` byte is
/// stuffed or a restart marker, so `FF D9` there can only be the real end.
fn jpeg_is_complete(body: &[u8]) -> bool {
    let last_scan = body.windows(2).rposition(|w| w == [0xFF, 0xDA]).unwrap_or(0);
    body[last_scan..].windows(2).any(|w| w == [0xFF, 0xD9])
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

    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut out = std::io::Cursor::new(Vec::new());
        RgbImage::new(w, h).write_to(&mut out, image::ImageFormat::Png).unwrap();
        out.into_inner()
    }

    fn bad_input(r: Result<RgbImage, Error>) -> String {
        match r {
            Err(Error::BadInput(m)) => m,
            other => panic!("expected bad input, got {other:?}"),
        }
    }

    #[test]
    fn rejects_non_images_empty_bodies_and_huge_images_as_bad_input() {
        assert!(bad_input(decode_rgb(b"hello", 100)).contains("not a PNG or JPEG"));
        assert!(bad_input(decode_rgb(b"", 100)).contains("empty"));
        assert!(bad_input(decode_rgb(&png(20, 10), 100)).contains("20x10 = 200 pixels; at most 100"));
        assert_eq!(decode_rgb(&png(10, 10), 100).unwrap().dimensions(), (10, 10));
    }

    #[test]
    fn truncated_jpegs_are_refused() {
        let mut out = std::io::Cursor::new(Vec::new());
        RgbImage::new(16, 16).write_to(&mut out, image::ImageFormat::Jpeg).unwrap();
        let jpeg = out.into_inner();
        assert!(decode_rgb(&jpeg, 1000).is_ok());
        assert!(bad_input(decode_rgb(&jpeg[..jpeg.len() - 10], 1000)).contains("truncated"));
    }

    #[test]
    fn chw_is_planar_normalised_and_padded() {
        let img = RgbImage::from_raw(1, 1, vec![255, 0, 0]).unwrap();
        let v = to_chw(&img, ChannelOrder::Bgr, [0.5; 3], [0.5; 3], 2);
        // planes B, G, R; second column is padding
        assert_eq!(v, vec![-1.0, 0.0, -1.0, 0.0, 1.0, 0.0]);
    }
}
