//! FlashAttention as Rust GPU kernels.
//!
//! Built twice:
//! - for `nvptx64-nvidia-cuda` (by the `ptx-build` crate), where the kernels exist and are
//!   compiled into one PTX module;
//! - for the host, where only the plain parts exist: the kernel list and ids ([`registry`]),
//!   parameter blocks, block coordinates, the causal mask and the online softmax ([`common`]),
//!   tile geometry ([`tile`]) and each family's config ([`fwd`], [`bwd`], [`decode`]), so the host
//!   launches exactly
//!   what the kernels expect and tests the arithmetic on the CPU.
//!
//! ```text
//! arch/      every intrinsic, asm! and raw pointer access (base, sm80); nothing else is unsafe
//! common/    params, block coordinates, mask, softmax, limits, element types
//! tile/      global rows, shared tiles, copies, fragments, register blocks, warp reductions
//! fwd/       one folder per forward family: config.rs (host and GPU) and kernel.rs (GPU)
//! bwd/       one folder per backward family, laid out as fwd/
//! decode/    decoding against a KV cache: append, split-KV, combine (config.rs: host and GPU)
//! registry/  the list of every compiled kernel, and `KernelId`
//! entry.rs   the PTX entry points, generated from the list
//! ```
#![no_std]
// Per-kernel configs size the kernels' register arrays by associated constants
// (`[[f32; 4]; C::O_TILES]`): `type const` items, which this feature provides.
#![feature(min_generic_const_args)]
#![allow(incomplete_features)]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(
        abi_ptx,
        stdarch_nvptx,
        gpu_intrinsics,
        gpu_launch_sized_workgroup_mem,
        asm_experimental_arch,
        link_llvm_intrinsics,
        core_intrinsics
    ),
    allow(internal_features)
)]
// Kernels index per-thread register arrays with `for r in 0..ROWS`: constant-bound loops that LLVM
// unrolls fully, which keeps the arrays in registers. Iterator chains over several arrays at once
// would obscure that.
#![allow(clippy::needless_range_loop)]

#[cfg(test)]
extern crate std;

pub mod bwd;
pub mod common;
pub mod decode;
pub mod fwd;
pub mod registry;
pub mod tile;

#[cfg(target_arch = "nvptx64")]
pub mod arch;
#[cfg(target_arch = "nvptx64")]
mod entry;

/// Kernels cannot unwind; a panic (which the kernels avoid: no indexing that can fail, no
/// unwrap) traps the whole grid, and the host sees a launch failure.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; nothing runs after it.
    unsafe { core::arch::nvptx::trap() }
}
