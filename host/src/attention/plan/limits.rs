//! What the plan checks launches against: the device's limits ([`LaunchLimits`], and
//! [`CompiledLimits`] for plans made without a GPU), and the checks that turn a launch that does
//! not fit into an error naming the option that asked for it.

use std::fmt;

use flash_kernels::registry::KernelId;

use crate::error::{Error, Result};

/// SMs of the H200, for plans made without a GPU.
pub const H200_MULTIPROCESSORS: u32 = 132;

/// Shared memory per block (opt-in) of the H200 the project measures on, for plans made without
/// a GPU ([`CompiledLimits`]).
pub const H200_SHARED_MEMORY_PER_BLOCK: u32 = 232_448;

/// What the plan checks launches against: the device's shared memory and, per kernel, the most
/// threads a block can have.
pub trait LaunchLimits {
    /// Dynamic shared memory one block may use after opting in, in bytes.
    fn shared_memory_per_block(&self) -> u32;
    /// The most threads a block of `kernel` can launch with on this device: its compiled bound
    /// (`.maxntid`), lowered where its registers per thread leave fewer.
    fn max_threads(&self, kernel: KernelId) -> Result<u32>;
    /// Whether the device runs the Hopper module (FA3): compute capability 9.0.
    fn runs_hopper_module(&self) -> bool;
    /// Streaming multiprocessors: FA3's persistent grid has one block per SM, and the decode
    /// plan sizes its splits by them.
    fn multiprocessors(&self) -> u32;
}

/// Limits known without a GPU: a device's shared memory, and each kernel's compiled thread bound
/// ([`KernelId::max_threads`]). The GPU's own limits ([`crate::Gpu`]) can only be lower.
#[derive(Clone, Copy, Debug)]
pub struct CompiledLimits {
    pub shared_memory_per_block: u32,
    /// Whether the device is compute capability 9.0 (runs the Hopper module).
    pub hopper: bool,
    pub multiprocessors: u32,
}

impl CompiledLimits {
    /// The H200's shared memory; a 9.0 device.
    pub const H200: Self = Self {
        shared_memory_per_block: H200_SHARED_MEMORY_PER_BLOCK,
        hopper: true,
        multiprocessors: H200_MULTIPROCESSORS,
    };
}

impl LaunchLimits for CompiledLimits {
    fn shared_memory_per_block(&self) -> u32 {
        self.shared_memory_per_block
    }
    fn max_threads(&self, kernel: KernelId) -> Result<u32> {
        Ok(kernel.max_threads())
    }
    fn runs_hopper_module(&self) -> bool {
        self.hopper
    }
    fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }
}

/// An error naming `argument` when a tiling's shared memory does not fit the device.
pub(crate) fn check_shared(
    limits: &dyn LaunchLimits,
    shared_bytes: u32,
    argument: &'static str,
    tiling: impl fmt::Display,
    head_dim: usize,
) -> Result<()> {
    let shared_limit = limits.shared_memory_per_block();
    if shared_bytes > shared_limit {
        return Err(Error::invalid(
            argument,
            tiling,
            format!(
                "needs {shared_bytes} bytes of shared memory at head_dim {head_dim}; the device \
                 allows {shared_limit}"
            ),
        ));
    }
    Ok(())
}

/// An error naming `argument` when `kernel` cannot launch `threads` threads on this device.
pub(crate) fn check_threads(
    limits: &dyn LaunchLimits,
    kernel: KernelId,
    threads: u32,
    argument: &'static str,
) -> Result<()> {
    let max_threads = limits.max_threads(kernel)?;
    if threads > max_threads {
        return Err(Error::invalid(
            argument,
            kernel,
            format!(
                "needs {threads} threads per block; this device launches it with at most \
                 {max_threads}"
            ),
        ));
    }
    Ok(())
}
