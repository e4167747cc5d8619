//! ALiBi (Press, Smith and Lewis, "Train Short, Test Long", 2022; flash-attn's `alibi_slopes`):
//! each score is penalized by its key's distance from the query's diagonal,
//! s(i, j) = scale·q_i·k_j − slope·|i + seqlen_k − seqlen_q − j|, with one slope per query head
//! (or per sequence and query head). The bias comes after soft-capping and before the mask, as
//! in flash-attn; it does not depend on Q or K, so the backward only adds it again when it
//! recomputes P.
//!
//! The kernels keep scores in raw product units (q·k; scale·log2 e multiplies them in the
//! exponential), so the bias enters as −(slope / scale)·distance: one integer subtraction, one
//! conversion and one multiply-add per score.

#[cfg(target_arch = "nvptx64")]
use crate::common::{block::BlockInfo, params::AttentionShape};

/// One head's ALiBi bias in raw product units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Alibi {
    /// −slope / softmax_scale; 0 when ALiBi is off (or the head's slope is 0, the same thing).
    pub raw_slope: f32,
    /// seqlen_k − seqlen_q of the block's sequence: query i's diagonal key is i + this.
    pub diagonal: i32,
}

impl Alibi {
    /// No bias.
    pub const OFF: Self = Self {
        raw_slope: 0.0,
        diagonal: 0,
    };

    /// The bias of `slope` for a sequence of (`seqlen_q`, `seqlen_k`) under `softmax_scale`.
    #[inline(always)]
    pub fn new(slope: f32, softmax_scale: f32, seqlen_q: u32, seqlen_k: u32) -> Self {
        Self {
            raw_slope: -slope / softmax_scale,
            diagonal: seqlen_k as i32 - seqlen_q as i32,
        }
    }

    /// The bias of the block `info`'s head and sequence in a tensor-core kernel, forward or
    /// backward: read from the parameter block's slopes in the `local` form (one load per
    /// block, where the slopes are given), else [`Alibi::OFF`] as a constant, so the bias
    /// compiles away. The slope's row is the block's sequence (`batch_head / heads`: the batch
    /// of a dense call, the launch's sequence of a packed one, whose slopes the host moved to
    /// the launch's first sequence).
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub fn of_block(shape: &AttentionShape, info: &BlockInfo, local: bool) -> Self {
        if !local || shape.alibi_slopes == 0 {
            return Self::OFF;
        }
        let index = info.batch_head / shape.heads * shape.alibi_batch_stride + info.head;
        let slope = crate::tile::global::read_f32(shape.alibi_slopes, index);
        Self::new(slope, shape.softmax_scale, info.seqlen_q, info.seqlen_k)
    }

    /// Whether scores are biased (a uniform value: a branch on it costs one compare when off).
    #[inline(always)]
    pub fn is_on(&self) -> bool {
        self.raw_slope != 0.0
    }

    /// The bias of the score of (`query`, `key`), sequence indices, in raw product units:
    /// −(slope / scale)·|query + seqlen_k − seqlen_q − key|.
    #[inline(always)]
    pub fn bias(&self, query: u32, key: u32) -> f32 {
        let distance = (query as i32 + self.diagonal - key as i32).unsigned_abs();
        self.raw_slope * distance as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// flash-attn's rule: −slope·|i + seqlen_k − seqlen_q − j| after scaling.
    #[test]
    fn the_bias_is_the_slope_times_the_distance_from_the_diagonal() {
        let (slope, scale) = (0.25f32, 0.125f32);
        let alibi = Alibi::new(slope, scale, 3, 7);
        for (query, key, distance) in [(0u32, 4u32, 0.0f32), (0, 0, 4.0), (2, 6, 0.0), (1, 6, 1.0)]
        {
            assert_eq!(
                alibi.bias(query, key) * scale,
                -slope * distance,
                "{query} {key}"
            );
        }
        assert!(alibi.is_on());
        assert!(!Alibi::OFF.is_on());
        assert_eq!(Alibi::OFF.bias(5, 900), 0.0);
        // Longer queries than keys: the diagonal moves left.
        assert_eq!(Alibi::new(1.0, 1.0, 8, 2).bias(7, 1), 0.0);
    }
}
