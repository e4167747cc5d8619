//! Forward kernels, one folder per family: `config.rs` (tile sizes and launch geometry, built for
//! the host too, so launches and kernels share one source of truth) and `kernel.rs` (the body,
//! GPU only).
//!
//! - [`standard`]: S = scale·QKᵀ and P = softmax(S) through HBM, then O = PV (the baseline);
//! - [`fa1`]: FlashAttention-1, outer loop over K/V blocks, O normalised in HBM each step;
//! - [`fa2`]: FlashAttention-2, outer loop over Q blocks, unnormalised Õ in registers;
//! - [`fa2_tc`]: FlashAttention-2 on tensor cores (`mma.sync`, `ldmatrix`, `cp.async`);
//! - [`fa3`]: FlashAttention-3 on Hopper (TMA, wgmma, warp specialization), the Hopper module.
//!
//! And [`form`]: which calls a tensor-core forward kernel serves (dense, packed, local), which
//! FA2-TC and FA3 share.

pub mod fa1;
pub mod fa2;
pub mod fa2_tc;
pub mod fa3;
pub mod standard;
