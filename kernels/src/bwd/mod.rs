//! Backward kernels, one folder per family, laid out as the forward's (`fwd/`): `config.rs` (tile
//! sizes and launch geometry, built for the host too) and `kernel.rs` (the bodies, GPU only).
//!
//! - [`fa2`]: FlashAttention-2's backward pass, scalar FP32: a pre-pass (D = rowsum(dO ∘ O)),
//!   the main loop over key blocks (dK, dV on chip, dQ by atomic adds) and a post-pass (dQ in
//!   the input dtype).

pub mod fa2;
