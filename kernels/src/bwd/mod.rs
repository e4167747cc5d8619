//! Backward kernels, one folder per family, laid out as the forward's (`fwd/`): `config.rs` (tile
//! sizes and launch geometry, built for the host too) and `kernel.rs` (the bodies, GPU only).
//!
//! - [`fa2`]: FlashAttention-2's backward pass, scalar FP32: a pre-pass (D = rowsum(dO ∘ O)),
//!   the main loop over key blocks (dK, dV on chip, dQ by atomic adds) and a post-pass (dQ in
//!   the input dtype).
//! - [`fa2_tc`]: the same main loop on tensor cores (`mma.sync`, `ldmatrix`, `cp.async`),
//!   f16/bf16, between the same pre- and post-pass; dQ's adds optionally in a fixed order
//!   (deterministic mode).
//! - [`standard`]: the standard backward, every N × N matrix (S, P, dP, dS) in HBM: the
//!   baseline for memory and time.
//! - [`group_sum`]: grouped K/V heads (GQA/MQA). The main kernels, compiled for grouped heads
//!   (`grouped` in the kernel list: they read K/V head h / group, as the forward, but store
//!   dK, dV at query head h), write each query head's dK and dV into an expanded workspace; this
//!   kernel sums each K/V head's group of them into dK and dV (flash-attn 2's `dk_expanded`).
//!   The standard backward's dK/dV kernel reads no K or V, so it runs unchanged on the problem
//!   taken as ungrouped into the same workspace.

pub mod fa2;
pub mod fa2_tc;
pub mod fa3;
pub mod group_sum;
pub mod standard;
