//! Tokenization with the model folder's Hugging Face `tokenizer.json`, and
//! padding to length buckets so that requests of similar length share a
//! batch (the dynamic batcher batches requests whose shapes after the batch
//! dimension are equal).

use plinth_plugin_sdk::Error;
use tokenizers::{PaddingDirection, PaddingParams, Tokenizer};

/// The tokenizer of a model and the sequence lengths its requests are padded
/// to.
pub struct Encoder {
    tokenizer: Tokenizer,
    /// The file's padding: pad id, pad type id and side. Its length strategy
    /// is replaced by `buckets`.
    padding: PaddingParams,
    /// Sequence lengths, ascending; a batch is padded to the first one that
    /// holds its longest sequence (to that sequence's length past the last).
    buckets: Vec<usize>,
}

/// Token ids and masks of a batch of texts, row-major `[rows, length]`.
pub struct Batch {
    /// Rows (texts) in the batch.
    pub rows: usize,
    /// The padded length of every row.
    pub length: usize,
    /// `input_ids`.
    pub ids: Vec<i64>,
    /// `attention_mask`: 1 for a token, 0 for padding.
    pub attention_mask: Vec<i64>,
    /// `token_type_ids` (segment ids).
    pub type_ids: Vec<i64>,
    /// Each row's token count, padding left out (special tokens counted).
    pub tokens: Vec<usize>,
}

impl Encoder {
    /// Reads `tokenizer.json` (Hugging Face `tokenizers` format) from `path`.
    /// Truncation stays as the file sets it; `buckets` (ascending lengths,
    /// empty for "the longest row") replace its padding length.
    ///
    /// # Errors
    /// [`Error::Internal`] when the file cannot be read or parsed.
    pub fn from_file(path: &str, buckets: Vec<usize>) -> Result<Encoder, Error> {
        let mut tokenizer = Tokenizer::from_file(path)
            .map_err(|e| Error::internal(format!("cannot load the tokenizer {path}: {e}")))?;
        let padding = tokenizer.get_padding().cloned().unwrap_or_default();
        tokenizer.with_padding(None);
        Ok(Encoder { tokenizer, padding, buckets })
    }

    /// The most tokens a text keeps after truncation, if the file truncates.
    pub fn max_length(&self) -> Option<usize> {
        self.tokenizer.get_truncation().map(|t| t.max_length)
    }

    /// Token ids of each text, special tokens added and truncated as the
    /// file says, without padding.
    ///
    /// # Errors
    /// [`Error::BadInput`] when the tokenizer refuses a text.
    pub fn token_ids(&self, texts: &[String]) -> Result<Vec<Vec<u32>>, Error> {
        texts
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let encoding = self
                    .tokenizer
                    .encode(text.as_str(), true)
                    .map_err(|e| Error::bad_input(format!("text {i} cannot be tokenized: {e}")))?;
                Ok(encoding.get_ids().to_vec())
            })
            .collect()
    }

    /// `texts` tokenized and padded to one bucket length.
    ///
    /// # Errors
    /// As [`Encoder::token_ids`].
    pub fn encode(&self, texts: &[String]) -> Result<Batch, Error> {
        let mut encodings = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            encodings.push(
                self.tokenizer
                    .encode(text.as_str(), true)
                    .map_err(|e| Error::bad_input(format!("text {i} cannot be tokenized: {e}")))?,
            );
        }
        let longest = encodings.iter().map(|e| e.len()).max().unwrap_or(0);
        let length = bucket(&self.buckets, longest);
        let rows = encodings.len();
        let mut batch = Batch {
            rows,
            length,
            ids: vec![i64::from(self.padding.pad_id); rows * length],
            attention_mask: vec![0; rows * length],
            type_ids: vec![i64::from(self.padding.pad_type_id); rows * length],
            tokens: Vec::with_capacity(rows),
        };
        for (row, encoding) in encodings.iter().enumerate() {
            let n = encoding.len();
            let start =
                row * length + if matches!(self.padding.direction, PaddingDirection::Left) { length - n } else { 0 };
            for (k, ((&id, &type_id), &mask)) in
                encoding.get_ids().iter().zip(encoding.get_type_ids()).zip(encoding.get_attention_mask()).enumerate()
            {
                batch.ids[start + k] = i64::from(id);
                batch.type_ids[start + k] = i64::from(type_id);
                batch.attention_mask[start + k] = i64::from(mask);
            }
            batch.tokens.push(n);
        }
        Ok(batch)
    }
}

/// The first of `buckets` (ascending) that holds `longest` tokens; `longest`
/// itself when none does or there are no buckets.
pub fn bucket(buckets: &[usize], longest: usize) -> usize {
    buckets.iter().copied().find(|&b| b >= longest).unwrap_or(longest)
}

/// Bucket lengths from a comma-separated list (the `config.pbtxt`
/// parameter), sorted and deduplicated.
///
/// # Errors
/// [`Error::Internal`] naming an item that is not a whole number above 0.
pub fn parse_buckets(list: &str) -> Result<Vec<usize>, Error> {
    let mut buckets = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
                Error::internal(format!("length_buckets: '{s}' is not a whole number of tokens above 0"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    buckets.sort_unstable();
    buckets.dedup();
    Ok(buckets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_takes_the_smallest_bucket_that_holds_its_longest_row() {
        let buckets = parse_buckets("64, 16,32,16").unwrap();
        assert_eq!(buckets, [16, 32, 64]);
        assert_eq!(bucket(&buckets, 3), 16);
        assert_eq!(bucket(&buckets, 16), 16);
        assert_eq!(bucket(&buckets, 17), 32);
        assert_eq!(bucket(&buckets, 100), 100);
        assert_eq!(bucket(&[], 7), 7);
        assert!(parse_buckets("16,zero").is_err());
    }
}
