//! The sm_80 (Ampere and later) tensor-core and copy instructions: `mma.sync`, `ldmatrix` and
//! `cp.async`.
//!
//! PTX reads the shared-memory operands of ldmatrix and cp.async as shared-window addresses
//! (`cvta.to.shared`), not generic pointers, and Rust has no pointer type for that state space:
//! these helpers take a `SharedAddress`.

use core::arch::asm;

/// A byte address in the shared-memory window, as `ldmatrix` and `cp.async` take it.
#[derive(Clone, Copy)]
pub struct SharedAddress(pub u32);

impl SharedAddress {
    /// The shared-window address of a generic pointer into shared memory.
    #[inline(always)]
    // The asm converts the pointer's value and never dereferences it, so `nomem` is right.
    #[allow(clippy::pointers_in_nomem_asm_block)]
    pub fn of<T>(pointer: *const T) -> Self {
        let address: u32;
        // SAFETY: an address conversion; no memory is touched.
        unsafe {
            asm!("{{ .reg .u64 t; cvta.to.shared.u64 t, {p}; cvt.u32.u64 {a}, t; }}",
                 p = in(reg64) pointer, a = out(reg32) address, options(pure, nomem, nostack));
        }
        Self(address)
    }

    /// `bytes` further on.
    #[inline(always)]
    pub fn offset(self, bytes: u32) -> Self {
        Self(self.0 + bytes)
    }

    /// `ld.shared.u32`: the word at this address.
    ///
    /// # Safety
    /// The address must be 4-byte aligned inside the block's shared memory, and the word written
    /// before (with a barrier between writer and reader where they are different threads).
    #[inline(always)]
    pub unsafe fn load_u32(self) -> u32 {
        let value: u32;
        // SAFETY: the caller's contract.
        unsafe {
            asm!("ld.shared.u32 {v}, [{a}];", v = out(reg32) value, a = in(reg32) self.0,
                 options(nostack, readonly));
        }
        value
    }

    /// `st.shared.u32`: writes `value` at this address.
    ///
    /// # Safety
    /// The address must be 4-byte aligned inside the block's shared memory, in a word no other
    /// thread reads or writes without a barrier ordering it after this store.
    #[inline(always)]
    pub unsafe fn store_u32(self, value: u32) {
        // SAFETY: the caller's contract.
        unsafe {
            asm!("st.shared.u32 [{a}], {v};", a = in(reg32) self.0, v = in(reg32) value,
                 options(nostack));
        }
    }
}

/// `cp.async.cg.shared.global`: copies 16 bytes from global memory to shared memory without
/// blocking; with `valid = false` nothing is read and the 16 bytes are zero-filled (tail rows).
///
/// # Safety
/// With `valid`, `source` must point at 16 readable, 16-byte-aligned bytes; `destination` must be
/// 16-byte aligned inside the block's shared memory.
#[inline(always)]
pub unsafe fn copy_async_16(destination: SharedAddress, source: *const u8, valid: bool) {
    let source_bytes: u32 = if valid { 16 } else { 0 };
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("cp.async.cg.shared.global [{d}], [{s}], 16, {n};",
             d = in(reg32) destination.0, s = in(reg64) source, n = in(reg32) source_bytes,
             options(nostack));
    }
}

/// `cp.async.ca.shared.global` of 4 bytes: one f32 (a row's L or D) copied without blocking;
/// with `valid = false` nothing is read and the 4 bytes are zero-filled (tail rows).
///
/// # Safety
/// With `valid`, `source` must point at 4 readable, 4-byte-aligned bytes; `destination` must be
/// 4-byte aligned inside the block's shared memory.
#[inline(always)]
pub unsafe fn copy_async_4(destination: SharedAddress, source: *const u8, valid: bool) {
    let source_bytes: u32 = if valid { 4 } else { 0 };
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("cp.async.ca.shared.global [{d}], [{s}], 4, {n};",
             d = in(reg32) destination.0, s = in(reg64) source, n = in(reg32) source_bytes,
             options(nostack));
    }
}

/// `st.shared.b32`: stores one 32-bit word (two packed 16-bit elements) at a shared-window
/// address, as the tiles that `ldmatrix` reads are addressed.
///
/// # Safety
/// `destination` must be 4-byte aligned inside the block's shared memory.
#[inline(always)]
pub unsafe fn store_shared_u32(destination: SharedAddress, value: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("st.shared.b32 [{d}], {v};", d = in(reg32) destination.0, v = in(reg32) value,
             options(nostack));
    }
}

/// `st.shared.v2.f32`: stores two f32 as one 8-byte access at a shared-window address (a lane's
/// pair of adjacent accumulator columns).
///
/// # Safety
/// `destination` must be 8-byte aligned inside the block's shared memory.
#[inline(always)]
pub unsafe fn store_shared_f32x2(destination: SharedAddress, values: [f32; 2]) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("st.shared.v2.f32 [{d}], {{{a}, {b}}};", d = in(reg32) destination.0,
             a = in(reg32) values[0], b = in(reg32) values[1], options(nostack));
    }
}

/// `cp.async.commit_group`: closes the group of copies issued since the last commit.
#[inline(always)]
pub fn copy_async_commit() {
    // SAFETY: bookkeeping of this thread's asynchronous copies.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) }
}

/// `cp.async.wait_group 0`: waits until every copy this thread issued has landed. A barrier must
/// follow before other threads read them.
#[inline(always)]
pub fn copy_async_wait_all() {
    // SAFETY: waits on this thread's own copies.
    unsafe { asm!("cp.async.wait_group 0;", options(nostack)) }
}

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: four 8×8 matrices of 16-bit elements; lane `i`
/// names the row address of row `i % 8` of matrix `i / 8`, and receives, from each matrix, the
/// two elements of row `lane / 4` at columns `2·(lane % 4)` and `+1`.
#[inline(always)]
pub fn load_matrix_x4(row: SharedAddress) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: reads shared memory the caller filled; all lanes take part.
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
             p = in(reg32) row.0, options(nostack, readonly));
    }
    [a, b, c, d]
}

/// As [`load_matrix_x4`], each matrix transposed (`.trans`): lane gets column `lane / 4`.
#[inline(always)]
pub fn load_matrix_x4_transposed(row: SharedAddress) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: as for `load_matrix_x4`.
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
             p = in(reg32) row.0, options(nostack, readonly));
    }
    [a, b, c, d]
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`: D = A·B + C for a 16×16 A, a 16×8 B
/// (both bf16) and a 16×8 f32 accumulator, per warp, in the PTX fragment layouts.
#[inline(always)]
pub fn mma_bf16_16x8x16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let mut d = c;
    // SAFETY: register-only tensor-core instruction; all lanes take part.
    unsafe {
        asm!("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};",
             d0 = inout(reg32) d[0], d1 = inout(reg32) d[1], d2 = inout(reg32) d[2], d3 = inout(reg32) d[3],
             a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
             b0 = in(reg32) b[0], b1 = in(reg32) b[1], options(pure, nomem, nostack));
    }
    d
}

/// As [`mma_bf16_16x8x16`] with f16 A and B.
#[inline(always)]
pub fn mma_f16_16x8x16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let mut d = c;
    // SAFETY: as for `mma_bf16_16x8x16`.
    unsafe {
        asm!("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};",
             d0 = inout(reg32) d[0], d1 = inout(reg32) d[1], d2 = inout(reg32) d[2], d3 = inout(reg32) d[3],
             a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
             b0 = in(reg32) b[0], b1 = in(reg32) b[1], options(pure, nomem, nostack));
    }
    d
}

/// Two f32 rounded to bf16 and packed, `low` in bits 0–15 (`cvt.rn.bf16x2.f32`).
#[inline(always)]
pub fn pack_bf16x2(low: f32, high: f32) -> u32 {
    let packed: u32;
    // SAFETY: a pure conversion.
    unsafe {
        asm!("cvt.rn.bf16x2.f32 {d}, {h}, {l};", d = out(reg32) packed, h = in(reg32) high,
             l = in(reg32) low, options(pure, nomem, nostack));
    }
    packed
}

/// Two f32 rounded to f16 and packed, `low` in bits 0–15 (`cvt.rn.f16x2.f32`).
#[inline(always)]
pub fn pack_f16x2(low: f32, high: f32) -> u32 {
    let packed: u32;
    // SAFETY: a pure conversion.
    unsafe {
        asm!("cvt.rn.f16x2.f32 {d}, {h}, {l};", d = out(reg32) packed, h = in(reg32) high,
             l = in(reg32) low, options(pure, nomem, nostack));
    }
    packed
}
