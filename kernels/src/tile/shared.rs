//! Tiles in shared memory: f32 tiles at bank-conflict-free strides, quad-read tiles, per-row
//! vectors, and the block-wide loops that fill them.

use crate::arch::{self, SharedAddress};
use crate::common::element::Element;
use crate::tile::global::HeadRows;
use crate::tile::layout::{QUAD, QUAD_LEN, conflict_free_stride, quad_padded, quad_stride};

/// A row-major f32 tile in shared memory.
#[derive(Clone, Copy)]
pub struct SharedTile {
    base: *mut f32,
    stride: u32,
}

impl SharedTile {
    /// Carves `rows` rows of `row_len` floats at a bank-conflict-free stride.
    #[inline(always)]
    pub fn carve(carver: &mut arch::SharedCarver, rows: u32, row_len: u32) -> Self {
        let stride = conflict_free_stride(row_len);
        Self {
            base: carver.take((rows * stride) as usize),
            stride,
        }
    }

    /// Carves `rows` rows of exactly `row_len` floats (rows read along, never down a column).
    #[inline(always)]
    pub fn carve_dense(carver: &mut arch::SharedCarver, rows: u32, row_len: u32) -> Self {
        Self {
            base: carver.take((rows * row_len) as usize),
            stride: row_len,
        }
    }

    #[inline(always)]
    pub fn get(&self, row: u32, col: u32) -> f32 {
        // SAFETY: kernels index inside the rows and columns they carved.
        unsafe { arch::load(arch::offset(self.base, (row * self.stride + col) as usize)) }
    }

    #[inline(always)]
    pub fn set(&self, row: u32, col: u32, value: f32) {
        // SAFETY: as for `get`.
        unsafe {
            arch::store(
                arch::offset(self.base, (row * self.stride + col) as usize),
                value,
            )
        }
    }
}

/// Four consecutive floats, 16-byte aligned, so that one read is one `ld.shared.v4.f32`.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Quad([f32; QUAD_LEN]);

/// A row-major f32 tile in shared memory that is read a quad (four floats, 16 bytes) at a time:
/// rows and row length rounded up to whole quads, at `tile::layout::quad_stride`. One wide read moves
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
    pub fn carve(carver: &mut arch::SharedCarver, rows: u32, row_len: u32) -> Self {
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
    pub fn get_quad(&self, row: u32, quad: u32) -> [f32; QUAD_LEN] {
        // SAFETY: the stride and every carved size are whole quads and dynamic shared memory
        // starts 16-byte aligned, so the address is 16-byte aligned; the kernel indexes inside
        // the padded tile.
        let element = (row * self.tile.stride + quad * QUAD) as usize;
        unsafe { arch::load(arch::offset(self.tile.base, element) as *const Quad) }.0
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

/// A per-row f32 vector in shared memory (m_i, ℓ_i, …).
#[derive(Clone, Copy)]
pub struct SharedVector {
    base: *mut f32,
}

impl SharedVector {
    #[inline(always)]
    pub fn carve(carver: &mut arch::SharedCarver, len: u32) -> Self {
        Self {
            base: carver.take(len as usize),
        }
    }

    #[inline(always)]
    pub fn get(&self, i: u32) -> f32 {
        // SAFETY: kernels index inside the length they carved.
        unsafe { arch::load(arch::offset(self.base, i as usize)) }
    }

    #[inline(always)]
    pub fn set(&self, i: u32, value: f32) {
        // SAFETY: as for `get`.
        unsafe { arch::store(arch::offset(self.base, i as usize), value) }
    }

    /// The vector at shared-window address `start` of the dynamic shared memory (a layout placed
    /// by address, as the Hopper kernels' is), read and written through a generic pointer so that
    /// element offsets fold into the loads' immediates.
    #[inline(always)]
    pub fn at(start: SharedAddress) -> Self {
        let base = arch::dynamic_shared_f32();
        let offset = start.0 - SharedAddress::of(base).0;
        Self {
            base: base.wrapping_byte_add(offset as usize),
        }
    }

    /// The shared-window address of element `i`, as `cp.async` writes it.
    #[inline(always)]
    pub fn address(&self, i: u32) -> SharedAddress {
        SharedAddress::of(self.base).offset(4 * i)
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
    let mut index = arch::thread_idx_x();
    while index < total {
        f(index / cols, index % cols);
        index += arch::block_dim_x();
    }
}

/// A row-major tile of 16-bit elements in shared memory, as `ldmatrix` and `cp.async` address it
/// (the shared window), rows at the padded stride `row_bytes`.
#[derive(Clone, Copy)]
pub struct SharedTile16 {
    base: SharedAddress,
    row_bytes: u32,
}

impl SharedTile16 {
    /// The tile at the start of dynamic shared memory.
    #[inline(always)]
    pub fn at_start(row_bytes: u32) -> Self {
        Self {
            base: SharedAddress::of(arch::dynamic_shared_f32()),
            row_bytes,
        }
    }

    /// Carves `rows` rows of `row_bytes` bytes (a multiple of 16, so the next tile stays 16-byte
    /// aligned).
    #[inline(always)]
    pub fn carve(carver: &mut arch::SharedCarver, rows: u32, row_bytes: u32) -> Self {
        Self {
            base: SharedAddress::of(carver.take((rows * row_bytes / 4) as usize)),
            row_bytes,
        }
    }

    /// Bytes of `rows` rows of this tile.
    #[inline(always)]
    pub fn bytes_of_rows(&self, rows: u32) -> u32 {
        rows * self.row_bytes
    }

    /// The tile (same stride) that starts `bytes` after this one starts.
    #[inline(always)]
    pub fn bytes_after(&self, bytes: u32) -> Self {
        Self {
            base: self.base.offset(bytes),
            row_bytes: self.row_bytes,
        }
    }

    /// Address of element (row, col).
    #[inline(always)]
    pub fn at(&self, row: u32, col: u32) -> SharedAddress {
        self.base.offset(row * self.row_bytes + col * 2)
    }
}
