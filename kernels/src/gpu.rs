//! Every nightly GPU intrinsic the kernels use, and nothing else.
//!
//! Kernels call only these functions, so the unsafe, unstable surface of the project lives in this
//! one file: thread and block indices, barriers, dynamic shared memory, warp shuffles, fast
//! `exp2`/`log2`, and conversions between f32 and the 16-bit float formats. Swapping the backend
//! (another intrinsic set, another compiler) means rewriting this file only.

use core::arch::{asm, nvptx};

/// Lanes in a warp on every NVIDIA GPU.
pub const WARP_SIZE: u32 = 32;
/// Shuffle mask naming every lane of a warp.
const FULL_WARP: u32 = 0xffff_ffff;
/// `shfl.sync`'s clamp operand for whole-warp shuffles (`c = 0x1f`: segment mask 0, clamp 31).
const SHUFFLE_CLAMP: u32 = 0x1f;

unsafe extern "C" {
    #[link_name = "llvm.nvvm.shfl.sync.bfly.f32"]
    fn nvvm_shfl_sync_bfly_f32(mask: u32, value: f32, lane_mask: u32, clamp: u32) -> f32;
    #[link_name = "llvm.nvvm.shfl.sync.idx.f32"]
    fn nvvm_shfl_sync_idx_f32(mask: u32, value: f32, source_lane: u32, clamp: u32) -> f32;
    #[link_name = "llvm.nvvm.vote.any.sync"]
    fn nvvm_vote_any_sync(mask: u32, predicate: bool) -> bool;
    #[link_name = "llvm.nvvm.bar.warp.sync"]
    fn nvvm_bar_warp_sync(mask: u32);
    #[link_name = "llvm.nvvm.ex2.approx.ftz.f"]
    fn nvvm_ex2_approx_ftz(x: f32) -> f32;
    #[link_name = "llvm.nvvm.lg2.approx.ftz.f"]
    fn nvvm_lg2_approx_ftz(x: f32) -> f32;
    #[link_name = "llvm.fma.f32"]
    fn llvm_fma_f32(a: f32, b: f32, c: f32) -> f32;
}

/// `threadIdx.x`.
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    // SAFETY: reads a special register; valid in any kernel.
    unsafe { nvptx::_thread_idx_x() as u32 }
}

/// `blockDim.x`.
#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_block_dim_x() as u32 }
}

/// `blockIdx.x`.
#[inline(always)]
pub fn block_idx_x() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_block_idx_x() as u32 }
}

/// `gridDim.x`.
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_grid_dim_x() as u32 }
}

/// `blockIdx.y`.
#[inline(always)]
pub fn block_idx_y() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_block_idx_y() as u32 }
}

/// `blockIdx.z`.
#[inline(always)]
pub fn block_idx_z() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_block_idx_z() as u32 }
}

/// This thread's warp within the block (`threadIdx.x / 32`).
#[inline(always)]
pub fn warp_idx() -> u32 {
    thread_idx_x() / WARP_SIZE
}

/// This thread's lane within its warp.
#[inline(always)]
pub fn lane_idx() -> u32 {
    thread_idx_x() % WARP_SIZE
}

/// Warps in the block.
#[inline(always)]
pub fn warps_per_block() -> u32 {
    block_dim_x() / WARP_SIZE
}

/// `__syncthreads()`: every thread of the block arrives, and shared-memory writes before it are
/// visible to every thread after it.
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: a block-wide barrier; kernels call it from uniform control flow.
    unsafe { nvptx::_syncthreads() }
}

/// `__syncwarp()`: orders shared-memory accesses among the lanes of one warp.
#[inline(always)]
pub fn sync_warp() {
    // SAFETY: a warp-wide barrier over all lanes; kernels call it from warp-uniform control flow.
    unsafe { nvvm_bar_warp_sync(FULL_WARP) }
}

/// The block's dynamic shared memory (`extern __shared__`), sized at launch.
///
/// Every call returns the same address. Kernels carve it into tiles with [`SharedCarver`].
#[inline(always)]
pub fn dynamic_shared_f32() -> *mut f32 {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<f32>()
}

/// Butterfly shuffle: the value held by lane `lane ^ lane_mask`.
#[inline(always)]
pub fn shuffle_xor(value: f32, lane_mask: u32) -> f32 {
    // SAFETY: all 32 lanes take part; callers keep the whole warp converged.
    unsafe { nvvm_shfl_sync_bfly_f32(FULL_WARP, value, lane_mask, SHUFFLE_CLAMP) }
}

/// The value held by lane `source_lane`.
#[inline(always)]
pub fn shuffle_broadcast(value: f32, source_lane: u32) -> f32 {
    // SAFETY: as for `shuffle_xor`.
    unsafe { nvvm_shfl_sync_idx_f32(FULL_WARP, value, source_lane, SHUFFLE_CLAMP) }
}

/// `vote.sync.any.pred`: whether `predicate` holds on any lane of the warp. The result is the same
/// on every lane, so a branch on it is warp-uniform.
#[inline(always)]
pub fn vote_any(predicate: bool) -> bool {
    // SAFETY: all 32 lanes take part; callers keep the whole warp converged.
    unsafe { nvvm_vote_any_sync(FULL_WARP, predicate) }
}

/// `2^x` on the special-function unit (`ex2.approx.ftz.f32`, relative error about 2^-22).
/// `exp2(-inf) = 0`.
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    // SAFETY: a pure arithmetic instruction.
    unsafe { nvvm_ex2_approx_ftz(x) }
}

/// a·b + c with one rounding (`fma.rn.f32`); Rust does not contract a·b + c on its own.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    // SAFETY: a pure arithmetic intrinsic.
    unsafe { llvm_fma_f32(a, b, c) }
}

/// `log2(x)` on the special-function unit (`lg2.approx.ftz.f32`). `log2(0) = -inf`.
#[inline(always)]
pub fn log2(x: f32) -> f32 {
    // SAFETY: a pure arithmetic instruction.
    unsafe { nvvm_lg2_approx_ftz(x) }
}

/// IEEE half (bits) to f32, exact (`cvt.f32.f16`).
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    let out: f32;
    // SAFETY: a pure conversion instruction on registers.
    unsafe {
        asm!("cvt.f32.f16 {out}, {bits};", out = out(reg32) out, bits = in(reg16) bits,
             options(pure, nomem, nostack));
    }
    out
}

/// f32 to IEEE half (bits), rounding to nearest even (`cvt.rn.f16.f32`).
#[inline(always)]
pub fn f32_to_f16(value: f32) -> u16 {
    let bits: u16;
    // SAFETY: a pure conversion instruction on registers.
    unsafe {
        asm!("cvt.rn.f16.f32 {bits}, {value};", bits = out(reg16) bits, value = in(reg32) value,
             options(pure, nomem, nostack));
    }
    bits
}

/// bfloat16 (bits) to f32, exact: bf16 is the upper half of an f32.
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to bfloat16 (bits), rounding to nearest even (`cvt.rn.bf16.f32`, sm_80 and later).
#[inline(always)]
pub fn f32_to_bf16(value: f32) -> u16 {
    let bits: u16;
    // SAFETY: a pure conversion instruction on registers.
    unsafe {
        asm!("cvt.rn.bf16.f32 {bits}, {value};", bits = out(reg16) bits, value = in(reg32) value,
             options(pure, nomem, nostack));
    }
    bits
}

/// Hands out consecutive, non-overlapping f32 tiles of the block's dynamic shared memory.
///
/// The host sizes the launch with the same arithmetic (`crate::layout`), so a kernel that carves
/// the tiles its layout names stays inside the allocation.
pub struct SharedCarver {
    next: *mut f32,
}

impl SharedCarver {
    /// Starts at the beginning of dynamic shared memory.
    #[inline(always)]
    pub fn from_start() -> Self {
        Self {
            next: dynamic_shared_f32(),
        }
    }

    /// The next `len` floats.
    #[inline(always)]
    pub fn take(&mut self, len: usize) -> *mut f32 {
        let tile = self.next;
        // SAFETY: pointer arithmetic inside the launch-sized allocation; see the type's docs.
        self.next = unsafe { self.next.add(len) };
        tile
    }
}

// ---------------------------------------------------------------------------------------------
// Tensor cores and asynchronous copies (sm_80 and later).
//
// PTX reads the shared-memory operands of ldmatrix and cp.async as shared-window addresses
// (`cvta.to.shared`), not generic pointers, and Rust has no pointer type for that state space:
// these helpers take a `SharedAddress`.
// ---------------------------------------------------------------------------------------------

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
