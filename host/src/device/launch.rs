//! Launching kernels: the parameter blocks kernels take by value, the function cache keyed by
//! [`KernelId`], the launch itself, and the per-kernel limits the launch plan checks.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use flash_kernels::registry::{KernelId, Module};

use super::Gpu;
use crate::attention::{Launch, LaunchLimits};
use crate::error::{CudaContextExt, Error, Result};

/// Shared memory a kernel gets without opting in (CUDA's rule).
const DEFAULT_SHARED_LIMIT: u32 = 48 * 1024;

/// A kernel parameter block from `flash_kernels::params`, passed to the kernel by value.
pub trait ParamBlock: Copy {}
impl ParamBlock for flash_kernels::common::params::StandardParams {}
impl ParamBlock for flash_kernels::common::params::StandardBackwardParams {}
impl ParamBlock for flash_kernels::common::params::Fa1Params {}
impl ParamBlock for flash_kernels::common::params::Fa2Params {}
impl ParamBlock for flash_kernels::common::params::Fa3Params {}
impl<P: ParamBlock> ParamBlock for flash_kernels::common::params::PackedParams<P> {}
impl ParamBlock for flash_kernels::common::params::Fa2BackwardParams {}
impl ParamBlock for flash_kernels::common::params::Fa2TcBackwardParams {}
impl ParamBlock for flash_kernels::common::params::Fa3BackwardParams {}
impl ParamBlock for flash_kernels::common::params::GroupSumParams {}
impl ParamBlock for flash_kernels::common::params::DecodeParams {}

#[repr(transparent)]
#[derive(Clone, Copy)]
struct ByValue<P>(P);
// SAFETY: every ParamBlock is `#[repr(C)]` plain data whose layout the kernels share.
unsafe impl<P: ParamBlock> DeviceRepr for ByValue<P> {}

impl Gpu {
    /// A kernel of the module, loaded on first use.
    pub fn function(&self, kernel: KernelId) -> Result<CudaFunction> {
        let mut functions = self
            .functions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(f) = functions.get(&kernel) {
            return Ok(f.clone());
        }
        let module = match kernel.module() {
            Module::Main => &self.module,
            Module::Hopper => self.hopper_module.as_ref().ok_or_else(|| {
                Error::invalid(
                    "kernel",
                    kernel,
                    format!(
                        "a kernel of the Hopper module, which only compute capability 9.0 loads \
                         (this device is {}.{})",
                        self.info.compute_capability.0, self.info.compute_capability.1
                    ),
                )
            })?,
        };
        let f = module
            .load_function(&kernel.to_string())
            .context(|| format!("loading kernel `{kernel}`"))?;
        functions.insert(kernel, f.clone());
        Ok(f)
    }

    /// Launches `kernel` with one parameter block, raising its dynamic shared-memory limit first
    /// when it needs more than the default 48 KiB.
    pub(crate) fn launch<P: ParamBlock>(
        &self,
        kernel: KernelId,
        launch: Launch,
        params: P,
    ) -> Result<()> {
        let f = self.function(kernel)?;
        if launch.shared_bytes > DEFAULT_SHARED_LIMIT {
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                launch.shared_bytes as i32,
            )
            .context(|| {
                format!(
                    "raising `{kernel}`'s shared memory to {} bytes",
                    launch.shared_bytes
                )
            })?;
        }
        let config = LaunchConfig {
            grid_dim: launch.grid,
            block_dim: (launch.threads, 1, 1),
            shared_mem_bytes: launch.shared_bytes,
        };
        let arg = ByValue(params);
        let mut builder = self.stream.launch_builder(&f);
        builder.arg(&arg);
        // SAFETY: the parameter block describes buffers the caller allocated with the shapes it
        // names, and `launch` is the configuration the kernel documents for it.
        unsafe { builder.launch(config) }
            .context(|| format!("launching `{kernel}` with {launch:?}"))?;
        Ok(())
    }
}

impl LaunchLimits for Gpu {
    fn shared_memory_per_block(&self) -> u32 {
        self.info().shared_memory_per_block
    }

    fn runs_hopper_module(&self) -> bool {
        self.has_hopper_module()
    }

    fn multiprocessors(&self) -> u32 {
        self.info().multiprocessors
    }

    /// `cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)`: the kernel's `.maxntid`, lowered where its
    /// registers per thread would not fit that many threads on this device.
    /// Read once per kernel and kept: every call's plan asks.
    fn max_threads(&self, kernel: KernelId) -> Result<u32> {
        let mut limits = self
            .thread_limits
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(&threads) = limits.get(&kernel) {
            return Ok(threads);
        }
        let threads = self
            .function(kernel)?
            .get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
            .context(|| format!("reading `{kernel}`'s thread limit"))? as u32;
        limits.insert(kernel, threads);
        Ok(threads)
    }
}
