//! The intrinsics every architecture the kernels target has (sm_80 and later): thread and block
//! indices, barriers, dynamic shared memory, warp shuffles and votes, fast `exp2`/`log2`/`tanh`, FMA,
//! conversions between f32 and the 16-bit float formats, and raw memory access.

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
    #[link_name = "llvm.nvvm.shfl.sync.idx.i32"]
    fn nvvm_shfl_sync_idx_i32(mask: u32, value: i32, source_lane: u32, clamp: u32) -> i32;
    #[link_name = "llvm.nvvm.vote.any.sync"]
    fn nvvm_vote_any_sync(mask: u32, predicate: bool) -> bool;
    #[link_name = "llvm.nvvm.bar.warp.sync"]
    fn nvvm_bar_warp_sync(mask: u32);
    #[link_name = "llvm.nvvm.ex2.approx.ftz.f"]
    fn nvvm_ex2_approx_ftz(x: f32) -> f32;
    #[link_name = "llvm.nvvm.tanh.approx.f32"]
    fn nvvm_tanh_approx(x: f32) -> f32;
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

/// `gridDim.y`.
#[inline(always)]
pub fn grid_dim_y() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_grid_dim_y() as u32 }
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

/// `value` as lane 0 holds it (`shfl.sync.idx.b32`), for a value the caller knows is the same on
/// every lane (a warp or warpgroup index): ptxas cannot prove that of `tid.x / 128`, but it can
/// of a shuffle's result, and then keeps what is derived from it (wgmma descriptors, shared
/// addresses) in uniform registers instead of the warp's per-thread ones.
#[inline(always)]
pub fn warp_uniform(value: u32) -> u32 {
    // SAFETY: as for `shuffle_xor`.
    unsafe { nvvm_shfl_sync_idx_i32(FULL_WARP, value as i32, 0, SHUFFLE_CLAMP) as u32 }
}

/// `value`, which every active lane of the warp holds alike, as the OR over the active lanes
/// (`activemask.b32`, then `redux.sync.or.b32`). REDUX writes a uniform register, so ptxas keeps
/// what derives from the result on the uniform datapath, as it does for a kernel parameter; unlike
/// [`warp_uniform`] it may run on part of a warp (a role's one elected thread).
#[inline(always)]
pub fn uniform_among_active(value: u32) -> u32 {
    let uniform: u32;
    // SAFETY: the mask is the set of lanes executing this instruction, so every lane it names
    // takes part in the reduction; no memory is touched.
    unsafe {
        asm!(
            "{{ .reg .b32 active; activemask.b32 active; redux.sync.or.b32 {u}, {v}, active; }}",
            u = out(reg32) uniform,
            v = in(reg32) value,
            options(nomem, nostack)
        );
    }
    uniform
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

/// tanh(x) on the special-function unit (`tanh.approx.f32`, sm_75 and later; maximum relative
/// error about 2^-11, below the 16-bit P̃ it feeds): soft-capping's one SFU instruction per
/// score. `tanh(±inf) = ±1`.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    // SAFETY: a pure arithmetic instruction.
    unsafe { nvvm_tanh_approx(x) }
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

/// `*pointer += value` in global memory as one atomic read-modify-write (`red.global.add.f32`),
/// for sums that many blocks add to in any order (the backward pass's dQ accumulator).
///
/// # Safety
/// `pointer` must be 4-byte aligned and point at an f32 in global memory (a buffer the host
/// allocated) that this thread may write.
#[inline(always)]
pub unsafe fn atomic_add_f32(pointer: *mut f32, value: f32) {
    // SAFETY: the caller's contract; `red` returns nothing and is ordered as a relaxed atomic.
    unsafe {
        asm!("red.global.add.f32 [{pointer}], {value};", pointer = in(reg64) pointer,
             value = in(reg32) value, options(nostack));
    }
}

/// `atom.global.add.u32`: adds `value` to the u32 at `pointer` and returns what it held before, as
/// one relaxed atomic read-modify-write (gpu scope): a counter many blocks take numbers from.
///
/// # Safety
/// `pointer` must be 4-byte aligned and point at a u32 in global memory (a buffer the host
/// allocated) that, while the kernel runs, only atomics touch.
#[inline(always)]
pub unsafe fn atomic_fetch_add_u32(pointer: *mut u32, value: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller's contract.
    unsafe {
        asm!("atom.global.add.u32 {old}, [{pointer}], {value};", old = out(reg32) old,
             pointer = in(reg64) pointer, value = in(reg32) value, options(nostack));
    }
    old
}

/// `atom.global.exch.b32`: writes `value` at `pointer` as one relaxed atomic (gpu scope), so it
/// cannot tear against other blocks' atomics on the same word.
///
/// # Safety
/// As [`atomic_fetch_add_u32`].
#[inline(always)]
pub unsafe fn atomic_store_u32(pointer: *mut u32, value: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("atom.global.exch.b32 _, [{pointer}], {value};", pointer = in(reg64) pointer,
             value = in(reg32) value, options(nostack));
    }
}

/// `ld.acquire.gpu.global.u32`: reads a flag another block releases ([`release_add_u32`]);
/// every write that block made before its release is visible to this thread after the read.
///
/// # Safety
/// `pointer` must be 4-byte aligned and point at a u32 in global memory this thread may read.
#[inline(always)]
pub unsafe fn load_acquire_u32(pointer: *const u32) -> u32 {
    let value: u32;
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.acquire.gpu.global.u32 {v}, [{p}];", v = out(reg32) value,
             p = in(reg64) pointer, options(nostack));
    }
    value
}

/// `fence.acq_rel.gpu` then `red.relaxed.gpu.global.add.u32`: adds `value` to a flag so that
/// every write this thread has seen performed (the block's, after a barrier) is visible to a
/// thread that acquires the new value ([`load_acquire_u32`]).
///
/// # Safety
/// `pointer` must be 4-byte aligned and point at a u32 in global memory this thread may write.
#[inline(always)]
pub unsafe fn release_add_u32(pointer: *mut u32, value: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("fence.acq_rel.gpu;", "red.relaxed.gpu.global.add.u32 [{p}], {v};",
             p = in(reg64) pointer, v = in(reg32) value, options(nostack));
    }
}

/// `atom.acq_rel.gpu.global.add.u32`: adds 1 to the arrival counter at `pointer` and returns what
/// it held before. Release: every global write this thread has made, or has seen performed (its
/// block's, after a barrier: release is cumulative, as the `__threadfence()` before a grid
/// barrier's atomic is), is visible to any thread that later acquires a value this add produced.
/// Acquire: when the value returned shows that every other block has arrived, each one's writes
/// before its own arrival are visible to this thread, and, after a barrier, to its block (the
/// last block of a one-launch split-KV group reads the other blocks' partial results this way).
/// On sm_90 ptxas makes it `MEMBAR.ALL.GPU` (the release fence), `ATOMG.E.ADD.STRONG.GPU`, then
/// `CCTL.IVALL` (the SM's L1 invalidated, so no stale line of another block's results is read).
///
/// # Safety
/// `pointer` must be 4-byte aligned and point at a u32 in global memory (a buffer the host
/// allocated) that, while the kernel runs, only atomics touch.
#[inline(always)]
pub unsafe fn arrive_acq_rel_u32(pointer: *mut u32) -> u32 {
    let old: u32;
    // SAFETY: the caller's contract.
    unsafe {
        asm!("atom.acq_rel.gpu.global.add.u32 {old}, [{p}], 1;", old = out(reg32) old,
             p = in(reg64) pointer, options(nostack));
    }
    old
}

/// Hands out consecutive, non-overlapping f32 tiles of the block's dynamic shared memory.
///
/// The host sizes the launch with the same arithmetic (each family's `config`), so a kernel that carves
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

/// The value at `pointer`.
///
/// # Safety
/// `pointer` must be aligned and point at an initialised `T` inside memory this thread may read
/// (a tensor the host described, or a carved shared tile).
#[inline(always)]
pub unsafe fn load<T: Copy>(pointer: *const T) -> T {
    // SAFETY: the caller's contract.
    unsafe { *pointer }
}

/// Writes `value` at `pointer`.
///
/// # Safety
/// `pointer` must be aligned and inside memory this thread may write (an output tensor the host
/// allocated, or a carved shared tile).
#[inline(always)]
pub unsafe fn store<T>(pointer: *mut T, value: T) {
    // SAFETY: the caller's contract.
    unsafe { *pointer = value }
}

/// `pointer + count` elements, for addresses inside one tile or tensor.
///
/// # Safety
/// As [`pointer::add`]: the result must stay inside the allocation `pointer` points into.
#[inline(always)]
pub unsafe fn offset<T>(pointer: *mut T, count: usize) -> *mut T {
    // SAFETY: the caller's contract.
    unsafe { pointer.add(count) }
}

/// An f32 from global memory, read at L2 and not cached in L1 (`ld.global.cg.f32`): for results
/// that other blocks of the same kernel wrote (the split-KV partials that the last block of a
/// one-launch group merges), so that no line an earlier load left in this SM's L1 is read stale,
/// whatever the acquire's L1 invalidation covers.
///
/// # Safety
/// `pointer` must be 4-byte aligned and point at an f32 in global memory this thread may read.
#[inline(always)]
pub unsafe fn load_l2_f32(pointer: *const f32) -> f32 {
    let value: f32;
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("ld.global.cg.f32 {v}, [{p}];", v = out(reg32) value, p = in(reg64) pointer,
             options(nostack, readonly, preserves_flags));
    }
    value
}

/// 16 bytes from global memory that no thread writes during the kernel, bypassing L1
/// (`ld.global.nc.L1::no_allocate.v4.u32`): the streaming read of a K/V cache row, which no
/// other warp of the SM reads again.
///
/// # Safety
/// `pointer` must be 16-byte aligned and point at 16 readable bytes that stay unchanged while the
/// kernel runs.
#[inline(always)]
pub unsafe fn load_streaming_16(pointer: *const u8) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("ld.global.nc.L1::no_allocate.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
             p = in(reg64) pointer, options(nostack, readonly, preserves_flags));
    }
    [a, b, c, d]
}

/// 16 bytes from global memory (`ld.global.v4.u32`).
///
/// # Safety
/// `pointer` must be 16-byte aligned and point at 16 readable bytes.
#[inline(always)]
pub unsafe fn load_global_16(pointer: *const u8) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("ld.global.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
             p = in(reg64) pointer, options(nostack, readonly, preserves_flags));
    }
    [a, b, c, d]
}

/// Writes 16 bytes to global memory (`st.global.v4.u32`).
///
/// # Safety
/// `pointer` must be 16-byte aligned and point at 16 writable bytes.
#[inline(always)]
pub unsafe fn store_global_16(pointer: *mut u8, value: [u32; 4]) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("st.global.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
             p = in(reg64) pointer, a = in(reg32) value[0], b = in(reg32) value[1],
             c = in(reg32) value[2], d = in(reg32) value[3], options(nostack, preserves_flags));
    }
}

/// `prmt.b32`: four bytes picked from the eight of `low` (bytes 0–3) and `high` (4–7), result
/// byte i being the byte the i-th nibble of `selector` names. `0x5410` pairs the low 16-bit
/// halves (`low`'s first), `0x7632` the high halves.
#[inline(always)]
pub fn permute_bytes(low: u32, high: u32, selector: u32) -> u32 {
    let out: u32;
    // SAFETY: a pure register instruction.
    unsafe {
        asm!("prmt.b32 {d}, {a}, {b}, {c};", d = out(reg32) out, a = in(reg32) low,
             b = in(reg32) high, c = in(reg32) selector, options(pure, nomem, nostack));
    }
    out
}

/// The address, in the `.param` state space, of the kernel's parameter block (its first and only
/// parameter, which LLVM names `<kernel>_param_0`): `mov.b64` of the parameter's symbol. Expanded
/// in a kernel's entry point, whose exported name `$kernel` must be.
#[macro_export]
macro_rules! kernel_parameters_address {
    ($kernel:expr) => {{
        let address: u64;
        // SAFETY: moves a symbol's address into a register; reads nothing.
        unsafe {
            core::arch::asm!(concat!("mov.b64 {a}, ", $kernel, "_param_0;"), a = out(reg64) address,
                options(pure, nomem, nostack));
        }
        address
    }};
}

/// `ld.param.u32` at a `.param` address ([`kernel_parameters_address`] plus an offset): a word
/// of the parameter block at an index known only at run time. ptxas reads it from the constant
/// bank (`ULDC` with a uniform index, when the index is the same for the warp).
///
/// # Safety
/// `address` must lie inside the kernel's parameter block, 4-byte aligned.
#[inline(always)]
pub unsafe fn load_parameter_u32(address: u64) -> u32 {
    let value: u32;
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.param.u32 {v}, [{a}];", v = out(reg32) value, a = in(reg64) address,
             options(pure, readonly, nostack));
    }
    value
}
