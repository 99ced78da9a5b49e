//! PP-OCR's DB post-processing (the settings RapidOCR 1.4.4 ships), for
//! horizontal text: the detector's probability map is thresholded and
//! dilated, each connected region is scored by the mean probability of its
//! box, and a kept box is grown by `area × 1.6 / perimeter` on every side,
//! because the detector was trained on text regions shrunk by that much.

/// A width and height in pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size {
    pub width: u32,
    pub height: u32,
}

/// A text line's box in page pixels: `x0..x1` by `y0..y1`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Region {
    pub x0: u32,
    pub y0: u32,
    pub x1: u32,
    pub y1: u32,
}

/// The short side the page is scaled up to (`limit_side_len`, type min).
const LIMIT_SIDE: f64 = 736.0;
/// The long side is kept below this, so a huge page stays affordable.
const MAX_SIDE: f64 = 2048.0;
/// Map values above this are text (`thresh`).
const THRESHOLD: f32 = 0.3;
/// Regions whose box has a lower mean probability are dropped (`box_thresh`).
const BOX_THRESHOLD: f32 = 0.5;
/// How much a box grows (`unclip_ratio`).
const UNCLIP_RATIO: f64 = 1.6;
/// Boxes thinner than this, in map pixels, are noise (`min_size`).
const MIN_SIZE: f64 = 3.0;
/// The most regions considered (`max_candidates`).
const MAX_CANDIDATES: usize = 1000;
/// Boxes whose tops differ by less than this, in page pixels, are on one
/// row and read left to right.
const SAME_ROW: u32 = 10;

/// The detector's input size for a `width` x `height` page: scaled so the
/// short side is at least 736, then each side rounded to a multiple of 32.
pub fn input_size(width: u32, height: u32) -> Size {
    let (short, long) = (f64::from(width.min(height)), f64::from(width.max(height)));
    let mut ratio = if short < LIMIT_SIDE { LIMIT_SIDE / short } else { 1.0 };
    if long * ratio > MAX_SIDE {
        ratio = MAX_SIDE / long;
    }
    let side = |v: u32| ((f64::from((f64::from(v) * ratio) as u32) / 32.0).round() as u32 * 32).max(32);
    Size { width: side(width), height: side(height) }
}

/// The text regions of a probability map of `map` size, in reading order,
/// as boxes in the pixels of a `page` (width, height).
pub fn regions(probabilities: &[f32], map: Size, page: (u32, u32)) -> Vec<Region> {
    let (w, h) = (map.width as usize, map.height as usize);
    let mask = dilated_mask(probabilities, w, h);
    let mut seen = vec![false; w * h];
    let mut found = Vec::new();
    for start in 0..w * h {
        if !mask[start] || seen[start] {
            continue;
        }
        let (x0, y0, x1, y1) = flood(&mask, &mut seen, w, h, start);
        if let Some(region) = keep(probabilities, w, (x0, y0, x1, y1), map, page) {
            found.push(region);
        }
        if found.len() >= MAX_CANDIDATES {
            break;
        }
    }
    reading_order(&mut found);
    found
}

/// Above-threshold pixels, dilated by a 2x2 kernel as PP-OCR does.
fn dilated_mask(probabilities: &[f32], w: usize, h: usize) -> Vec<bool> {
    let mut mask = vec![false; w * h];
    for y in 0..h {
        for x in 0..w {
            if probabilities[y * w + x] > THRESHOLD {
                for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    if y + dy < h && x + dx < w {
                        mask[(y + dy) * w + x + dx] = true;
                    }
                }
            }
        }
    }
    mask
}

/// Marks the 8-connected region of `start` as seen; returns its bounding
/// box (inclusive).
fn flood(mask: &[bool], seen: &mut [bool], w: usize, h: usize, start: usize) -> (usize, usize, usize, usize) {
    let (mut x0, mut y0, mut x1, mut y1) = (usize::MAX, usize::MAX, 0, 0);
    let mut stack = vec![start];
    seen[start] = true;
    while let Some(i) = stack.pop() {
        let (x, y) = (i % w, i / w);
        (x0, y0, x1, y1) = (x0.min(x), y0.min(y), x1.max(x), y1.max(y));
        for ny in y.saturating_sub(1)..=(y + 1).min(h - 1) {
            for nx in x.saturating_sub(1)..=(x + 1).min(w - 1) {
                let j = ny * w + nx;
                if mask[j] && !seen[j] {
                    seen[j] = true;
                    stack.push(j);
                }
            }
        }
    }
    (x0, y0, x1, y1)
}

/// Scores a region's box, grows it and maps it to page pixels; `None` for
/// boxes too thin or too faint.
fn keep(
    probabilities: &[f32],
    w: usize,
    (x0, y0, x1, y1): (usize, usize, usize, usize),
    map: Size,
    page: (u32, u32),
) -> Option<Region> {
    let (bw, bh) = ((x1 - x0 + 1) as f64, (y1 - y0 + 1) as f64);
    if bw.min(bh) < MIN_SIZE {
        return None;
    }
    let sum: f32 = (y0..=y1).map(|y| probabilities[y * w + x0..=y * w + x1].iter().sum::<f32>()).sum();
    if sum / ((bw * bh) as f32) < BOX_THRESHOLD {
        return None;
    }
    let grow = bw * bh * UNCLIP_RATIO / (2.0 * (bw + bh));
    if (bw + 2.0 * grow).min(bh + 2.0 * grow) < MIN_SIZE + 2.0 {
        return None;
    }
    let (sx, sy) = (f64::from(page.0) / f64::from(map.width), f64::from(page.1) / f64::from(map.height));
    let to_page = |v: f64, scale: f64, max: u32| (v * scale).round().clamp(0.0, f64::from(max)) as u32;
    let region = Region {
        x0: to_page(x0 as f64 - grow, sx, page.0),
        y0: to_page(y0 as f64 - grow, sy, page.1),
        x1: to_page(x1 as f64 + 1.0 + grow, sx, page.0),
        y1: to_page(y1 as f64 + 1.0 + grow, sy, page.1),
    };
    (region.x1 > region.x0 && region.y1 > region.y0).then_some(region)
}

/// Top to bottom; boxes on one row (tops within [`SAME_ROW`]) left to right.
fn reading_order(regions: &mut [Region]) {
    regions.sort_by_key(|r| (r.y0, r.x0));
    for i in 1..regions.len() {
        let mut j = i;
        while j > 0 && regions[j].y0.abs_diff(regions[j - 1].y0) < SAME_ROW && regions[j].x0 < regions[j - 1].x0 {
            regions.swap(j, j - 1);
            j -= 1;
        }
    }
}
