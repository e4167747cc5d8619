//! One thread's register blocks of a matrix product, fed by quad reads of shared tiles.

use crate::tile::layout::{QUAD, QUAD_LEN};
use crate::tile::shared::QuadTile;

/// Accumulators of one thread's 4 × 4 block of a matrix product, in registers.
pub type RegisterBlock = [[f32; QUAD_LEN]; QUAD_LEN];

/// A·Bᵀ on a 4 × 4 block: `out[i][j] = Σ_x A[a_rows[i]][x]·B[b_rows[j]][x]` over the first
/// `quads` quads of x (padding columns are zero). Eight 16-byte reads feed 64 multiply-adds.
#[inline(always)]
pub fn dot_block(
    a: &QuadTile,
    a_rows: [u32; QUAD_LEN],
    b: &QuadTile,
    b_rows: [u32; QUAD_LEN],
    quads: u32,
) -> RegisterBlock {
    let mut out = [[0.0f32; QUAD_LEN]; QUAD_LEN];
    for quad in 0..quads {
        let a_quads = a_rows.map(|row| a.get_quad(row, quad));
        let b_quads = b_rows.map(|row| b.get_quad(row, quad));
        for (out_row, a_quad) in out.iter_mut().zip(&a_quads) {
            for (acc, b_quad) in out_row.iter_mut().zip(&b_quads) {
                for x in 0..QUAD as usize {
                    *acc += a_quad[x] * b_quad[x];
                }
            }
        }
    }
    out
}

/// A·B on a 4 × 4 block: `out[i][j] = Σ_k A[a_rows[i]][k]·B[k][4·b_quad + j]` over
/// k < 4·`quads`. Eight 16-byte reads (four of A along k, one of B per k) feed 64 multiply-adds.
#[inline(always)]
pub fn product_block(
    a: &QuadTile,
    a_rows: [u32; QUAD_LEN],
    b: &QuadTile,
    b_quad: u32,
    quads: u32,
) -> RegisterBlock {
    let mut out = [[0.0f32; QUAD_LEN]; QUAD_LEN];
    for quad in 0..quads {
        let a_quads = a_rows.map(|row| a.get_quad(row, quad));
        for k in 0..QUAD {
            let b_quad = b.get_quad(quad * QUAD + k, b_quad);
            for (out_row, a_quad) in out.iter_mut().zip(&a_quads) {
                for (acc, b_value) in out_row.iter_mut().zip(&b_quad) {
                    *acc += a_quad[k as usize] * b_value;
                }
            }
        }
    }
    out
}
