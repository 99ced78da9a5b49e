//! Sentence vectors from token vectors, as sentence-transformers'
//! `Pooling(pooling_mode_mean_tokens=True)` followed by `Normalize()` does.

/// The mean of the token vectors of each row whose `attention_mask` is 1,
/// scaled to unit L2 norm.
///
/// `hidden` is `[rows, length, width]` row-major (a BERT model's
/// `last_hidden_state`), `attention_mask` `[rows, length]`. A row without
/// tokens, or whose mean is the zero vector, stays zero.
pub fn mean_pooled_normalised(
    hidden: &[f32],
    attention_mask: &[i64],
    rows: usize,
    length: usize,
    width: usize,
) -> Vec<Vec<f32>> {
    (0..rows)
        .map(|row| {
            let mut sum = vec![0f32; width];
            let mut count = 0f32;
            for t in 0..length {
                if attention_mask[row * length + t] == 0 {
                    continue;
                }
                let token = &hidden[(row * length + t) * width..][..width];
                for (s, &x) in sum.iter_mut().zip(token) {
                    *s += x;
                }
                count += 1.0;
            }
            // sentence-transformers divides by max(count, 1e-9) and
            // normalises with max(norm, 1e-12), as torch's F.normalize does.
            let count = count.max(1e-9);
            let mean: Vec<f32> = sum.into_iter().map(|s| s / count).collect();
            let norm = mean.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            mean.into_iter().map(|x| x / norm).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_only_masked_tokens_and_normalises() {
        // Two rows of length 2, width 2; the second row's second token is padding.
        let hidden = [1.0, 0.0, 0.0, 1.0, 3.0, 4.0, 100.0, 100.0];
        let mask = [1, 1, 1, 0];
        let v = mean_pooled_normalised(&hidden, &mask, 2, 2, 2);
        let h = std::f32::consts::FRAC_1_SQRT_2;
        assert!((v[0][0] - h).abs() < 1e-6 && (v[0][1] - h).abs() < 1e-6);
        assert!((v[1][0] - 0.6).abs() < 1e-6 && (v[1][1] - 0.8).abs() < 1e-6);
    }
}
