//! Strides and padding of shared-memory tiles, shared by the kernels (which carve shared memory)
//! and the host (which sizes the launch through each family's config). One source of truth, so
//! the two cannot disagree.

/// Row stride, in floats, of a shared-memory tile whose rows hold `head_dim` values.
///
/// Kernels read a column of such a tile with one row per lane; an odd stride puts the 32 lanes in
/// 32 different banks (4-byte banks, 32 of them), so an even `head_dim` gets one float of padding.
#[inline(always)]
pub const fn conflict_free_stride(head_dim: u32) -> u32 {
    head_dim | 1
}

/// 16-bit elements one 16-byte `cp.async` moves: the tensor-core kernels' rows, strides and
/// addresses must be multiples of it.
pub const COPY_ELEMENTS: u32 = 8;

/// Floats in one 16-byte shared-memory access (`tile::QuadTile`).
pub const QUAD: u32 = 4;
/// [`QUAD`] as an array length (register blocks are `QUAD_LEN` × `QUAD_LEN`).
pub type const QUAD_LEN: usize = const { QUAD as usize };

/// Row stride, in floats, of a `tile::QuadTile` whose rows hold `row_len` values: whole quads (so
/// every quad is 16-byte aligned), an odd number of them. A 16-byte load is served in four phases
/// of eight lanes; eight lanes reading one quad each from eight consecutive rows then hit eight
/// different quad-bank groups, which an odd quad stride guarantees.
#[inline(always)]
pub const fn quad_stride(row_len: u32) -> u32 {
    QUAD * (row_len.div_ceil(QUAD) | 1)
}

/// `n` rounded up to whole quads.
#[inline(always)]
pub const fn quad_padded(n: u32) -> u32 {
    n.div_ceil(QUAD) * QUAD
}

/// Byte offset of f32 element (`row`, `col`) within one box of a tile laid out in the 128-byte
/// swizzle (TMA's `SWIZZLE_128B`, the backward's dQ_i staging): rows of 32 floats (128 bytes), whose
/// 16-byte chunk c is stored at chunk c ^ (row % 8).
#[inline(always)]
pub const fn swizzled_f32_offset(row: u32, col: u32) -> u32 {
    let chunk = (col / QUAD) ^ (row % 8);
    row * 128 + chunk * 16 + col % QUAD * 4
}

/// Which element of its accumulator pair (columns c and c + 1) a lane stores at its `store`-th
/// (0 or 1) 32-bit store into a [`swizzled_f32_offset`] tile. Lanes 2 and 3 of each quad take the
/// second element first: under the swizzle the quad's second half in row r shares its chunk with
/// the first half in row r ^ 1, so taking the other word puts each store's 32 lanes on 32
/// different banks. (Storing the pair in one 64-bit store costs two passes per half-warp: the
/// half-warp's four rows fill only 4 of the 8 chunks.)
#[inline(always)]
pub const fn swizzled_pair_side(lane: u32, store: u32) -> u32 {
    store ^ (lane % 4 / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_32_bit_store_of_the_staged_pairs_meets_every_bank_once() {
        use crate::tile::fragment::{accumulator_col, accumulator_row};
        // A warp's 16 rows of a 16 × 8 accumulator tile t, rows h·8 + l/4, stored one element a
        // lane per instruction.
        for t in 0..8 {
            for h in 0..2 {
                for store in 0..2 {
                    let mut banks = [0u32; 32];
                    for lane in 0..32 {
                        let row = accumulator_row(lane) + 8 * h;
                        let col = t * 8 + accumulator_col(lane) + swizzled_pair_side(lane, store);
                        banks[(swizzled_f32_offset(row, col % 32) / 4 % 32) as usize] += 1;
                    }
                    assert!(banks.iter().all(|&n| n == 1), "t {t} h {h} store {store}");
                }
            }
        }
    }

    #[test]
    fn the_swizzled_f32_offsets_fill_each_box_once() {
        let mut seen = [false; 2048];
        for row in 0..64 {
            for col in 0..32 {
                let word = (swizzled_f32_offset(row, col) / 4) as usize;
                assert!(!seen[word], "{row} {col}");
                seen[word] = true;
            }
        }
    }

    #[test]
    fn quad_stride_is_whole_and_odd_quads() {
        for row_len in 1..=300 {
            let stride = quad_stride(row_len);
            assert!(
                stride >= row_len && stride < row_len + 2 * QUAD,
                "{row_len}: {stride}"
            );
            assert_eq!(stride % QUAD, 0, "{row_len}");
            assert_eq!((stride / QUAD) % 2, 1, "{row_len}");
        }
        assert_eq!(quad_stride(40), 44);
        assert_eq!(quad_stride(128), 132);
        assert_eq!(quad_padded(57), 60);
    }
}
