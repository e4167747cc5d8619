//! Asynchronous copies of global rows into 16-bit shared tiles (`cp.async`, 16 bytes each).

use crate::arch;
use crate::tile::global::HeadRows16;
use crate::tile::layout::COPY_ELEMENTS;
use crate::tile::shared::SharedTile16;

/// Issues the copies of one tile (Q_i, K_j or V_j): rows `[first_row, first_row + rows)` of `src`
/// into `dst`, 16 bytes per `cp.async`; rows past the end are zero-filled. When the block's
/// `threads` cover whole rows per pass (`threads` a multiple of d/8), each thread copies the
/// same column of rows `r₀, r₀ + rows_per_pass, …` and, `rows`, `row_len` and `threads` being
/// compile-time constants once inlined, the passes unroll into straight-line copies. Otherwise
/// (d = 96: 12 copies per row) the threads stride over the tile's copies.
#[inline(always)]
pub fn copy_rows_async(
    src: &HeadRows16,
    first_row: u32,
    rows: u32,
    row_len: u32,
    threads: u32,
    dst: SharedTile16,
) {
    copy_rows_async_where(src, first_row, rows, row_len, threads, dst, |_| true);
}

/// As [`copy_rows_async`] into a tile whose rows are `row_len` wide while the tensor's rows hold
/// only `cols` elements (a multiple of 8: a kernel compiled for a larger head dim): the
/// 16-byte chunks from column `cols` on are zero-filled, so products over the padded columns
/// add zeros.
#[inline(always)]
pub fn copy_rows_async_padded(
    src: &HeadRows16,
    first_row: u32,
    (rows, row_len, cols): (u32, u32, u32),
    threads: u32,
    dst: SharedTile16,
) {
    copy_rows_async_where(src, first_row, rows, row_len, threads, dst, |col| {
        col < cols
    });
}

/// The copies of [`copy_rows_async`], with the chunks at columns where `column_exists` is false
/// zero-filled.
#[inline(always)]
fn copy_rows_async_where(
    src: &HeadRows16,
    first_row: u32,
    rows: u32,
    row_len: u32,
    threads: u32,
    dst: SharedTile16,
    column_exists: impl Fn(u32) -> bool,
) {
    let chunks_per_row = row_len / COPY_ELEMENTS;
    let rows_per_pass = threads / chunks_per_row;
    let thread = arch::thread_idx_x();
    let copy_chunk = |r: u32, col: u32| {
        let (source, valid) = src.copy_source(first_row + r, col, column_exists(col));
        // SAFETY: valid rows lie inside the tensor (the host checked shapes, and that strides and
        // addresses are multiples of 16 bytes); the destination is inside the carved tile.
        unsafe { arch::copy_async_16(dst.at(r, col), source, valid) };
    };
    if threads.is_multiple_of(chunks_per_row) && rows.is_multiple_of(rows_per_pass) {
        let (first_tile_row, col) = (
            thread / chunks_per_row,
            thread % chunks_per_row * COPY_ELEMENTS,
        );
        for pass in 0..rows / rows_per_pass {
            copy_chunk(first_tile_row + pass * rows_per_pass, col);
        }
    } else {
        let mut chunk = thread;
        while chunk < rows * chunks_per_row {
            copy_chunk(
                chunk / chunks_per_row,
                chunk % chunks_per_row * COPY_ELEMENTS,
            );
            chunk += threads;
        }
    }
}
