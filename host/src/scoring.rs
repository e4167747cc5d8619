//! How a row's scores are formed before its softmax: the scale, soft-capping and the mask
//! (causal or a sliding window), as the kernels' `AttentionShape` carries them
//! ([`Problem::scoring`](crate::Problem::scoring)), for the lab's f64 reference and emulators.

use std::ops::Range;

use flash_kernels::common::mask::{AttentionMask, KeyWindow};

/// The score rule of one call: s = scale·q·k, then softcap·tanh(s / softcap) when `softcap` > 0
/// (Gemma 2's soft-capping), then the mask (which keys each query sees). A `bool` converts to
/// the causal mask (or none) without soft-capping, the rule before windows existed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Scoring {
    /// Which keys each query sees around its bottom-right diagonal (`common::mask`); causal
    /// attention is [`KeyWindow::CAUSAL`].
    pub window: KeyWindow,
    /// 0: off.
    pub softcap: f64,
}

impl From<bool> for Scoring {
    fn from(causal: bool) -> Self {
        Self {
            window: KeyWindow::causal(causal),
            softcap: 0.0,
        }
    }
}

impl Scoring {
    /// The mask placed on (seqlen_q, seqlen_k).
    pub fn mask(&self, seqlen_q: usize, seqlen_k: usize) -> AttentionMask {
        AttentionMask::new(self.window, seqlen_q as u32, seqlen_k as u32)
    }

    /// The keys query `query` sees, straight from flash-attn's rule (written apart from the
    /// kernels' [`AttentionMask`] so that the reference checks it): q + offset − left ≤ k ≤
    /// q + offset + right with offset = seqlen_k − seqlen_q, clipped to the keys that exist;
    /// empty for a query that sees none.
    pub fn visible_keys(&self, query: usize, seqlen_q: usize, seqlen_k: usize) -> Range<usize> {
        let diagonal = query as i64 + seqlen_k as i64 - seqlen_q as i64;
        let first = self.window.left.map_or(0, |left| diagonal - left as i64);
        let last = self
            .window
            .right
            .map_or(seqlen_k as i64 - 1, |right| diagonal + right as i64);
        let clip = |key: i64| key.clamp(0, seqlen_k as i64) as usize;
        let (start, end) = (clip(first), clip(last + 1));
        start..end.max(start)
    }

    /// The score of a scaled product s = scale·q·k: softcap·tanh(s / softcap), or s.
    pub fn cap(&self, scaled: f64) -> f64 {
        if self.softcap > 0.0 {
            self.softcap * (scaled / self.softcap).tanh()
        } else {
            scaled
        }
    }
}
