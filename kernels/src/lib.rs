//! FlashAttention as Rust GPU kernels.
//!
//! Built twice:
//! - for `nvptx64-nvidia-cuda` (by the `ptx-build` crate), where the kernels below exist and are
//!   compiled into one PTX module;
//! - for the host, where only the plain parts exist: kernel parameter blocks ([`params`]), tile and
//!   shared-memory layouts ([`layout`]), the causal mask ([`mask`]) and the online-softmax update
//!   ([`softmax`]), so the host launches exactly what the kernels expect and tests the arithmetic
//!   on the CPU.
//!
//! Kernels touch GPU intrinsics only through [`gpu`].
#![no_std]
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

pub mod layout;
pub mod mask;
pub mod params;
pub mod softmax;

#[cfg(target_arch = "nvptx64")]
mod element;
#[cfg(target_arch = "nvptx64")]
mod entry;
#[cfg(target_arch = "nvptx64")]
mod fa1;
#[cfg(target_arch = "nvptx64")]
mod fa2;
#[cfg(target_arch = "nvptx64")]
mod fa2_tc;
#[cfg(target_arch = "nvptx64")]
pub mod gpu;
#[cfg(target_arch = "nvptx64")]
mod standard;
#[cfg(target_arch = "nvptx64")]
mod tile;

/// Kernels cannot unwind; a panic (which the kernels avoid: no indexing that can fail, no
/// unwrap) traps the whole grid, and the host sees a launch failure.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; nothing runs after it.
    unsafe { core::arch::nvptx::trap() }
}
