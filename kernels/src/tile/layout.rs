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

#[cfg(test)]
mod tests {
    use super::*;

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
