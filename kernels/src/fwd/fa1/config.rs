//! FlashAttention-1's block sizes (the article's formula from the SRAM budget M) and launch
//! geometry.

use crate::tile::layout::{quad_padded, quad_stride};

/// Threads per block.
pub const THREADS: u32 = 256;

/// FA1's block sizes from the article: B_c = ⌈M/4d⌉ and B_r = min(⌈M/4d⌉, d), where M is the
/// on-chip memory, in f32 elements, given to the four blocks Q_i, K_j, V_j, O_i.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fa1Blocks {
    pub block_rows: u32,
    pub block_cols: u32,
}

impl Fa1Blocks {
    /// The article's formula for an SRAM budget of `sram_floats` (M) and head dim `head_dim` (d).
    pub const fn from_sram(sram_floats: u32, head_dim: u32) -> Self {
        let block_cols = sram_floats.div_ceil(4 * head_dim);
        let block_rows = if block_cols < head_dim {
            block_cols
        } else {
            head_dim
        };
        Self {
            block_rows,
            block_cols,
        }
    }

    /// Shared memory the FA1 kernel needs with these blocks: Q_i, O_i (B_r × d), K_j, V_j
    /// (B_c × d), S_ij (B_r × B_c), and four per-row vectors (m_i, ℓ_i, α, β), all f32. The
    /// tiles are `QuadTile`s: rows rounded up to whole quads, at `quad_stride`.
    pub const fn shared_bytes(&self, head_dim: u32) -> u64 {
        let stride = quad_stride(head_dim) as u64;
        let rows = quad_padded(self.block_rows) as u64;
        let cols = quad_padded(self.block_cols) as u64;
        let score_stride = quad_stride(self.block_cols) as u64;
        let floats = 2 * rows * stride
            + 2 * cols * stride
            + rows * score_stride
            + ROW_VECTORS * self.block_rows as u64;
        floats * 4
    }
}

/// Per-row vectors the FA1 kernel keeps in shared memory: m_i, ℓ_i, α and β (ℓ_new/ℓ_i folded).
pub const ROW_VECTORS: u64 = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fa1_formula_matches_the_article() {
        // M = 16384 floats, d = 64: B_c = ⌈16384/256⌉ = 64, B_r = min(64, 64) = 64.
        assert_eq!(
            Fa1Blocks::from_sram(16384, 64),
            Fa1Blocks {
                block_rows: 64,
                block_cols: 64
            }
        );
        // d = 128: B_c = 32, B_r = min(32, 128) = 32.
        assert_eq!(
            Fa1Blocks::from_sram(16384, 128),
            Fa1Blocks {
                block_rows: 32,
                block_cols: 32
            }
        );
        // d = 16: B_c = 256, B_r = min(256, 16) = 16; a ceiling, not a floor.
        assert_eq!(
            Fa1Blocks::from_sram(16385, 16),
            Fa1Blocks {
                block_rows: 16,
                block_cols: 257
            }
        );
    }

    #[test]
    fn fa1_shared_bytes_count_the_padded_tiles() {
        // d = 40, B_r = 40, B_c = 363: Q, O 40 × 44; K, V 364 × 44; S 40 × 364 (91 quads, odd);
        // four vectors of 40.
        let blocks = Fa1Blocks {
            block_rows: 40,
            block_cols: 363,
        };
        let floats = 2 * 40 * 44 + 2 * 364 * 44 + 40 * 364 + 4 * 40;
        assert_eq!(blocks.shared_bytes(40), floats * 4);
    }
}
