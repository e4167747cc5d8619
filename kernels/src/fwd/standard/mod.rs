//! Standard attention: S and P through HBM, three kernels.
pub mod config;
#[cfg(target_arch = "nvptx64")]
pub mod kernel;
