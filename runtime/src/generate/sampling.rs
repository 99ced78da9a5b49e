//! Choosing each next token from the decoder's logits, as vLLM's sampling
//! parameters define it: penalties on the tokens seen so far, then greedy
//! choice or temperature, top-k, top-p and min-p truncation and a draw
//! from a generator seeded per request.

/// How one sequence picks its tokens (vLLM's `SamplingParams` names).
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// Divides the logits; 0 picks the most likely token (greedy).
    pub temperature: f32,
    /// Keeps the `top_k` most likely tokens; `None` keeps all.
    pub top_k: Option<usize>,
    /// Keeps the most likely tokens whose probabilities add up to `top_p`.
    pub top_p: f32,
    /// Drops tokens less likely than `min_p` times the most likely one.
    pub min_p: f32,
    /// Seeds the draw: the same request with the same seed gives the same
    /// text. `None` draws a seed.
    pub seed: Option<u64>,
    /// Over 1 makes tokens of the prompt and the output less likely
    /// (a positive logit divided by it, a negative one multiplied).
    pub repetition_penalty: f32,
    /// Subtracted from the logit of every token the output holds.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time the output holds it.
    pub frequency_penalty: f32,
    /// How many most likely alternatives to return with each token's log
    /// probability; `None` returns no log probabilities.
    pub logprobs: Option<usize>,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 1.0,
            top_k: None,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logprobs: None,
        }
    }
}

/// A chosen token, with its log probability and the most likely
/// alternatives' when asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    pub token: u32,
    /// Natural-log probability of `token` under the penalised distribution
    /// (before temperature and truncation), when asked for.
    pub logprob: Option<f32>,
    /// The most likely tokens and their log probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// One sequence's sampler: its parameters, generator and token counts.
pub struct Sampler {
    sampling: Sampling,
    rng: fastrand::Rng,
    /// How many times the output holds each token, by id.
    output: std::collections::HashMap<u32, u32>,
    /// The tokens of the prompt and the output (the repetition penalty's).
    seen: std::collections::HashSet<u32>,
}

impl Sampler {
    /// A sampler for a sequence whose prompt is `prompt`.
    pub fn new(sampling: Sampling, prompt: &[u32]) -> Sampler {
        let rng = sampling.seed.map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
        let seen =
            if sampling.repetition_penalty == 1.0 { Default::default() } else { prompt.iter().copied().collect() };
        Sampler { sampling, rng, output: Default::default(), seen }
    }

    /// Picks the next token from `logits` (`[vocabulary]`, changed in
    /// place by the penalties) and remembers it.
    pub fn pick(&mut self, logits: &mut [f32]) -> Choice {
        self.penalise(logits);
        let (logprob, top) = match self.sampling.logprobs {
            Some(n) => {
                let logprobs = log_softmax(logits);
                let top = top_n(&logprobs, n);
                (Some(logprobs), top)
            }
            None => (None, Vec::new()),
        };
        let token = if self.sampling.temperature <= 0.0 || self.sampling.top_k == Some(1) {
            argmax(logits)
        } else {
            self.draw(logits)
        };
        *self.output.entry(token).or_default() += 1;
        if self.sampling.repetition_penalty != 1.0 {
            self.seen.insert(token);
        }
        Choice { token, logprob: logprob.map(|l| l[token as usize]), top }
    }

    fn penalise(&self, logits: &mut [f32]) {
        let s = &self.sampling;
        if s.repetition_penalty != 1.0 {
            for &t in &self.seen {
                let l = &mut logits[t as usize];
                *l = if *l > 0.0 { *l / s.repetition_penalty } else { *l * s.repetition_penalty };
            }
        }
        if s.presence_penalty != 0.0 || s.frequency_penalty != 0.0 {
            for (&t, &n) in &self.output {
                logits[t as usize] -= s.presence_penalty + s.frequency_penalty * n as f32;
            }
        }
    }

    /// A draw from the tempered, truncated distribution.
    fn draw(&mut self, logits: &[f32]) -> u32 {
        let s = &self.sampling;
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        if let Some(k) = s.top_k {
            order.truncate(k.max(1));
        }
        let max = logits[order[0] as usize];
        let mut probs: Vec<f32> = order.iter().map(|&t| ((logits[t as usize] - max) / s.temperature).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        let mut kept = probs.len();
        if s.top_p < 1.0 {
            let mut sum = 0.0;
            let last = probs.iter().position(|p| {
                sum += p;
                sum >= s.top_p
            });
            kept = last.map_or(probs.len(), |i| i + 1);
        }
        if s.min_p > 0.0 {
            let floor = probs[0] * s.min_p;
            kept = kept.min(probs.iter().take_while(|&&p| p >= floor).count().max(1));
        }
        let total: f32 = probs[..kept].iter().sum();
        let mut point = self.rng.f32() * total;
        for (i, p) in probs[..kept].iter().enumerate() {
            point -= p;
            if point <= 0.0 {
                return order[i];
            }
        }
        order[kept - 1]
    }
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, l) in logits.iter().enumerate() {
        if *l > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
    let log_sum = sum.ln() + max;
    logits.iter().map(|l| l - log_sum).collect()
}

/// The `n` most likely tokens, most likely first.
fn top_n(logprobs: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut order: Vec<u32> = (0..logprobs.len() as u32).collect();
    let n = n.min(order.len());
    if n == 0 {
        return Vec::new();
    }
    order.select_nth_unstable_by(n - 1, |&a, &b| logprobs[b as usize].total_cmp(&logprobs[a as usize]));
    order.truncate(n);
    order.sort_by(|&a, &b| logprobs[b as usize].total_cmp(&logprobs[a as usize]));
    order.into_iter().map(|t| (t, logprobs[t as usize])).collect()
}

#[cfg(test)]
mod tests {
    use super::{Sampler, Sampling};

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, 0.5, 2.9]
    }

    #[test]
    fn temperature_zero_is_greedy_and_penalties_change_the_choice() {
        let mut greedy = Sampler::new(Sampling { temperature: 0.0, ..Sampling::default() }, &[]);
        assert_eq!(greedy.pick(&mut logits()).token, 1);
        let mut penalised =
            Sampler::new(Sampling { temperature: 0.0, presence_penalty: 1.0, ..Sampling::default() }, &[]);
        assert_eq!(penalised.pick(&mut logits()).token, 1);
        assert_eq!(penalised.pick(&mut logits()).token, 4, "token 1 is now below token 4");
        let mut repeated =
            Sampler::new(Sampling { temperature: 0.0, repetition_penalty: 2.0, ..Sampling::default() }, &[1]);
        assert_eq!(repeated.pick(&mut logits()).token, 4, "the prompt's token 1 is penalised");
    }

    #[test]
    fn a_seed_gives_the_same_draws_and_truncation_limits_them() {
        let draws = |seed| {
            let mut s = Sampler::new(Sampling { seed: Some(seed), ..Sampling::default() }, &[]);
            (0..32).map(|_| s.pick(&mut logits()).token).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        let mut top2 = Sampler::new(Sampling { top_k: Some(2), seed: Some(1), ..Sampling::default() }, &[]);
        assert!((0..64).all(|_| [1, 4].contains(&top2.pick(&mut logits()).token)));
        let mut nucleus = Sampler::new(Sampling { top_p: 0.01, seed: Some(1), ..Sampling::default() }, &[]);
        assert!((0..16).all(|_| nucleus.pick(&mut logits()).token == 1));
        let mut min_p = Sampler::new(Sampling { min_p: 0.95, seed: Some(1), ..Sampling::default() }, &[]);
        assert!((0..64).all(|_| [1, 4].contains(&min_p.pick(&mut logits()).token)));
    }

    #[test]
    fn logprobs_are_normalised_and_the_top_ones_sorted() {
        let mut s = Sampler::new(Sampling { temperature: 0.0, logprobs: Some(2), ..Sampling::default() }, &[]);
        let choice = s.pick(&mut logits());
        let total: f32 = logits().iter().map(|l| (l - 3.0).exp()).sum();
        assert!((choice.logprob.unwrap() - (1.0 / total).ln()).abs() < 1e-5);
        assert_eq!(choice.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 4]);
    }
}
