//! FlashAttention-2 backward, scalar FP32, as the article lays it out (issue #15).
pub mod config;
#[cfg(target_arch = "nvptx64")]
pub mod kernel;
