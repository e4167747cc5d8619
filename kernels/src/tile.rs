//! Tile-level helpers: the only code that does index arithmetic on device or shared memory.
//!
//! Kernels name tiles ("rows 64..128 of K for this head") and these helpers turn that into
//! addresses, bounds checks and conversions.

use crate::element::Element;
use crate::gpu;
use crate::layout::{QUAD, conflict_free_stride, quad_padded, quad_stride};
use crate::params::TensorView;

/// The rows of one (batch, head) of a (batch, heads, seqlen, head_dim) tensor in device memory.
#[derive(Clone, Copy)]
pub struct HeadRows<T> {
    base: *mut T,
    row_stride: u64,
    /// Rows that exist (seqlen); reads beyond are zero and writes beyond are dropped.
    rows: u32,
}

impl<T: Element> HeadRows<T> {
    #[inline(always)]
    pub fn new(view: &TensorView, batch: u32, head: u32, rows: u32) -> Self {
        let base = (view.addr as *mut T).wrapping_add(view.head_offset(batch, head) as usize);
        Self {
            base,
            row_stride: view.row_stride,
            rows,
        }
    }

    /// Rows of a contiguous (batch·heads, rows, row_len) buffer, for head `batch_head`.
    #[inline(always)]
    pub fn contiguous(addr: u64, batch_head: u32, rows: u32, row_len: u32) -> Self {
        let row_stride = row_len as u64;
        let base =
            (addr as *mut T).wrapping_add((batch_head as u64 * rows as u64 * row_stride) as usize);
        Self {
            base,
            row_stride,
            rows,
        }
    }

    #[inline(always)]
    fn element(&self, row: u32, col: u32) -> *mut T {
        self.base
            .wrapping_add((row as u64 * self.row_stride + col as u64) as usize)
    }

    /// Element (row, col) as f32, or 0 for a row past the end.
    #[inline(always)]
    pub fn read(&self, row: u32, col: u32) -> f32 {
        if row < self.rows {
            // SAFETY: row < rows and the host checked col < row length, so the address is inside
            // the tensor the host described.
            unsafe { (*self.element(row, col)).to_f32() }
        } else {
            0.0
        }
    }

    /// Stores `value` (rounded to T) at (row, col); a row past the end is dropped.
    #[inline(always)]
    pub fn write(&self, row: u32, col: u32, value: f32) {
        if row < self.rows {
            // SAFETY: as for `read`.
            unsafe { *self.element(row, col) = T::from_f32(value) }
        }
    }
}

/// A row-major f32 tile in shared memory.
#[derive(Clone, Copy)]
pub struct SharedTile {
    base: *mut f32,
    stride: u32,
}

impl SharedTile {
    /// Carves `rows` rows of `row_len` floats at a bank-conflict-free stride.
    #[inline(always)]
    pub fn carve(carver: &mut gpu::SharedCarver, rows: u32, row_len: u32) -> Self {
        let stride = conflict_free_stride(row_len);
        Self {
            base: carver.take((rows * stride) as usize),
            stride,
        }
    }

    /// Carves `rows` rows of exactly `row_len` floats (rows read along, never down a column).
    #[inline(always)]
    pub fn carve_dense(carver: &mut gpu::SharedCarver, rows: u32, row_len: u32) -> Self {
        Self {
            base: carver.take((rows * row_len) as usize),
            stride: row_len,
        }
    }

    #[inline(always)]
    pub fn get(&self, row: u32, col: u32) -> f32 {
        // SAFETY: kernels index inside the rows and columns they carved.
        unsafe { *self.base.add((row * self.stride + col) as usize) }
    }

    #[inline(always)]
    pub fn set(&self, row: u32, col: u32, value: f32) {
        // SAFETY: as for `get`.
        unsafe { *self.base.add((row * self.stride + col) as usize) = value }
    }
}

/// Four consecutive floats, 16-byte aligned, so that one read is one `ld.shared.v4.f32`.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Quad([f32; QUAD as usize]);

/// A row-major f32 tile in shared memory that is read a quad (four floats, 16 bytes) at a time:
/// rows and row length rounded up to whole quads, at `layout::quad_stride`. One wide read moves
/// four values, so a thread can keep a 4 × 4 block of results in registers and feed its 64
/// multiply-adds from eight reads ([`dot_block`], [`product_block`]).
///
/// The padding (rows past `rows`, columns past `row_len`) is read as data, so kernels zero the
/// whole tile once ([`QuadTile::zero`]) and never write the padding afterwards.
#[derive(Clone, Copy)]
pub struct QuadTile {
    tile: SharedTile,
    padded_rows: u32,
}

impl QuadTile {
    #[inline(always)]
    pub fn carve(carver: &mut gpu::SharedCarver, rows: u32, row_len: u32) -> Self {
        let (padded_rows, stride) = (quad_padded(rows), quad_stride(row_len));
        // Whole quads per tile keep the next tile 16-byte aligned too.
        Self {
            tile: SharedTile {
                base: carver.take((padded_rows * stride) as usize),
                stride,
            },
            padded_rows,
        }
    }

    /// Columns `4·quad .. 4·quad + 4` of `row`, in one 16-byte read.
    #[inline(always)]
    pub fn get_quad(&self, row: u32, quad: u32) -> [f32; QUAD as usize] {
        // SAFETY: the stride and every carved size are whole quads and dynamic shared memory
        // starts 16-byte aligned, so the address is 16-byte aligned; the kernel indexes inside
        // the padded tile.
        let element = (row * self.tile.stride + quad * QUAD) as usize;
        unsafe { (*(self.tile.base.add(element) as *const Quad)).0 }
    }

    /// Writes 0 to every element, padding included. Every thread of the block takes part.
    #[inline(always)]
    pub fn zero(&self) {
        for_each_element(self.padded_rows, self.tile.stride, |r, c| {
            self.set(r, c, 0.0)
        });
    }
}

/// A `QuadTile` is a `SharedTile` (element reads and writes, [`load_tile`]) with the quad layout.
impl core::ops::Deref for QuadTile {
    type Target = SharedTile;

    #[inline(always)]
    fn deref(&self) -> &SharedTile {
        &self.tile
    }
}

/// Accumulators of one thread's 4 × 4 block of a matrix product, in registers.
pub type RegisterBlock = [[f32; QUAD as usize]; QUAD as usize];

/// A·Bᵀ on a 4 × 4 block: `out[i][j] = Σ_x A[a_rows[i]][x]·B[b_rows[j]][x]` over the first
/// `quads` quads of x (padding columns are zero). Eight 16-byte reads feed 64 multiply-adds.
#[inline(always)]
pub fn dot_block(
    a: &QuadTile,
    a_rows: [u32; QUAD as usize],
    b: &QuadTile,
    b_rows: [u32; QUAD as usize],
    quads: u32,
) -> RegisterBlock {
    let mut out = [[0.0f32; QUAD as usize]; QUAD as usize];
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
    a_rows: [u32; QUAD as usize],
    b: &QuadTile,
    b_quad: u32,
    quads: u32,
) -> RegisterBlock {
    let mut out = [[0.0f32; QUAD as usize]; QUAD as usize];
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

/// A per-row f32 vector in shared memory (m_i, ℓ_i, …).
#[derive(Clone, Copy)]
pub struct SharedVector {
    base: *mut f32,
}

impl SharedVector {
    #[inline(always)]
    pub fn carve(carver: &mut gpu::SharedCarver, len: u32) -> Self {
        Self {
            base: carver.take(len as usize),
        }
    }

    #[inline(always)]
    pub fn get(&self, i: u32) -> f32 {
        // SAFETY: kernels index inside the length they carved.
        unsafe { *self.base.add(i as usize) }
    }

    #[inline(always)]
    pub fn set(&self, i: u32, value: f32) {
        // SAFETY: as for `get`.
        unsafe { *self.base.add(i as usize) = value }
    }
}

/// Per-row f32 statistics of one head in device memory (m, ℓ or L), `rows` long.
#[derive(Clone, Copy)]
pub struct HeadVector {
    base: *mut f32,
}

impl HeadVector {
    #[inline(always)]
    pub fn new(addr: u64, batch_head: u32, rows: u32) -> Self {
        Self {
            base: (addr as *mut f32).wrapping_add(batch_head as usize * rows as usize),
        }
    }

    #[inline(always)]
    pub fn read(&self, row: u32) -> f32 {
        // SAFETY: kernels pass rows < seqlen_q; the host allocated batch·heads·seqlen_q floats.
        unsafe { *self.base.add(row as usize) }
    }

    #[inline(always)]
    pub fn write(&self, row: u32, value: f32) {
        // SAFETY: as for `read`.
        unsafe { *self.base.add(row as usize) = value }
    }
}

/// Copies rows `[first_row, first_row + rows)` of `src` into `dst`, converting to f32; rows past
/// the end of `src` become zeros. Every thread of the block takes part; coalesced along the row.
#[inline(always)]
pub fn load_tile<T: Element>(
    src: &HeadRows<T>,
    first_row: u32,
    rows: u32,
    row_len: u32,
    dst: &SharedTile,
) {
    for_each_element(rows, row_len, |r, c| {
        dst.set(r, c, src.read(first_row + r, c))
    });
}

/// Runs `f(row, col)` for every element of a rows × cols tile, spread over the block's threads with
/// consecutive threads on consecutive columns.
#[inline(always)]
pub fn for_each_element(rows: u32, cols: u32, mut f: impl FnMut(u32, u32)) {
    let total = rows * cols;
    let mut index = gpu::thread_idx_x();
    while index < total {
        f(index / cols, index % cols);
        index += gpu::block_dim_x();
    }
}

/// Max of `value` over the warp; every lane gets the result.
#[inline(always)]
pub fn warp_max(mut value: f32) -> f32 {
    let mut lane_mask = gpu::WARP_SIZE / 2;
    while lane_mask > 0 {
        value = value.max(gpu::shuffle_xor(value, lane_mask));
        lane_mask /= 2;
    }
    value
}

/// Sum of `value` over the warp; every lane gets the result.
#[inline(always)]
pub fn warp_sum(mut value: f32) -> f32 {
    let mut lane_mask = gpu::WARP_SIZE / 2;
    while lane_mask > 0 {
        value += gpu::shuffle_xor(value, lane_mask);
        lane_mask /= 2;
    }
    value
}
