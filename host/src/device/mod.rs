//! One GPU: its context, a stream, the kernel module ([`module`]), memory, timing, and typed
//! launches ([`launch`]).

mod launch;
pub mod module;
pub mod tensor_map;
mod tile_counters;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use flash_kernels::registry::KernelId;

pub use launch::ParamBlock;
pub use module::{
    HOPPER_PTX_ARCH, HOPPER_PTX_OVERRIDE_VAR, Module, ModuleSource, PTX_ARCH, PTX_OVERRIDE_VAR,
    check_capability, entry_names, module_source, ptx,
};

use cudarc::driver::sys::{self, CUdevice_attribute, CUmemPool_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits,
};

use crate::dtype::Element;
use crate::error::{CudaContextExt, Error, Result};

/// A CUDA stream handle another library owns (for [`Gpu::use_borrowed_stream`]).
pub type RawStream = sys::CUstream;

/// Why a call cannot be captured into a CUDA graph (see [`Gpu::use_borrowed_stream`]).
pub const GRAPH_CAPTURE_UNSUPPORTED: &str = "a stream that is not capturing a CUDA graph: \
    calls cannot be captured, because moving to a new stream first waits for the previous one \
    (not allowed during a capture), FA3 copies its tensor maps from host memory into a ring of \
    device slots that later calls reuse (a replay would read another call's maps), and standard \
    attention, FA1 and the backward allocate workspace per call; run the call outside the capture";

/// Whether `stream` is capturing a CUDA graph, or is the legacy stream while another stream's
/// capture forbids using it.
///
/// # Safety
///
/// `stream` is null or a valid stream.
unsafe fn is_capturing(stream: RawStream) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: writes one status for a valid stream (the caller's contract).
    match unsafe { sys::cuStreamIsCapturing(stream, &mut status) } {
        sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => Ok(true),
        result => {
            result.result().context(|| "cuStreamIsCapturing".into())?;
            Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
        }
    }
}

/// What the host needs to know about the device.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub multiprocessors: u32,
    /// Shared memory one block may use after opting in, in bytes.
    pub shared_memory_per_block: u32,
    pub total_memory: usize,
    /// CUDA driver version, e.g. 13000 for 13.0.
    pub driver_version: i32,
    /// L2 cache size in bytes (benchmarks rotate inputs through several times this).
    pub l2_cache_bytes: usize,
}

/// An open GPU with the kernel modules loaded (the Hopper one only on compute capability 9.0).
/// All launches go to one stream, in order.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    hopper_module: Option<Arc<CudaModule>>,
    functions: Mutex<HashMap<KernelId, CudaFunction>>,
    /// FA3's tensor maps on the device (`tensor_map`).
    tensor_maps: Mutex<tensor_map::TensorMapCache>,
    /// The persistent FA3 grid's tile counters (`tile_counters`).
    tile_counters: Mutex<tile_counters::TileCounterRing>,
    /// Each kernel's `cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)`, read on first use.
    thread_limits: Mutex<HashMap<KernelId, u32>>,
    info: DeviceInfo,
}

impl Gpu {
    /// Opens device `ordinal` and loads the kernels. Fails with a typed error (never a panic) when
    /// there is no driver, no such device, a device older than the PTX's target, or the module
    /// does not load.
    pub fn open(ordinal: usize) -> Result<Self> {
        // SAFETY: only probes whether the driver library can be opened.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::NoDriver);
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| Error::NoDevice {
            ordinal,
            detail: e.to_string(),
        })?;
        let info = device_info(&ctx, ordinal)?;
        check_capability(ordinal, &info.name, info.compute_capability, PTX_ARCH)?;
        let load = |module: Module| {
            let source = module_source(module, std::env::var_os(module::override_var(module)))?;
            ctx.load_module(source.into_loadable())
                .map_err(|e| Error::ModuleLoad {
                    ordinal,
                    arch: module::arch(module),
                    detail: e.to_string(),
                })
        };
        let module = load(Module::Main)?;
        let hopper_module = module::runs(info.compute_capability, HOPPER_PTX_ARCH)
            .then(|| load(Module::Hopper))
            .transpose()?;
        // One stream, in-order: cudarc's cross-stream event tracking would only add work.
        // SAFETY: nothing in this crate uses a second stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let gpu = Self {
            ctx,
            stream,
            module,
            hopper_module,
            functions: Mutex::new(HashMap::new()),
            tensor_maps: Mutex::default(),
            tile_counters: Mutex::default(),
            thread_limits: Mutex::new(HashMap::new()),
            info,
        };
        // Keep freed memory in the pool instead of returning it at every synchronisation, so a
        // call's workspace allocation costs the same on every repetition.
        gpu.set_pool_attribute(
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            u64::MAX,
        )?;
        Ok(gpu)
    }

    /// The device's default memory pool, which cudarc's stream-ordered allocations draw from.
    fn memory_pool(&self) -> Result<sys::CUmemoryPool> {
        let mut pool = std::ptr::null_mut();
        // SAFETY: writes one pool handle for a valid device.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device()) }
            .result()
            .context(|| "cuDeviceGetDefaultMemPool".into())?;
        Ok(pool)
    }

    fn set_pool_attribute(&self, attribute: CUmemPool_attribute, mut value: u64) -> Result<()> {
        let pool = self.memory_pool()?;
        // SAFETY: both attributes used here take a cuuint64_t.
        unsafe { sys::cuMemPoolSetAttribute(pool, attribute, (&mut value as *mut u64).cast()) }
            .result()
            .context(|| format!("cuMemPoolSetAttribute({attribute:?})"))
    }

    /// Starts a new peak-memory measurement (see [`Gpu::peak_memory`]).
    pub fn reset_peak_memory(&self) -> Result<()> {
        self.set_pool_attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0)
    }

    /// The most device memory allocated at once through this library since the last
    /// [`Gpu::reset_peak_memory`] (the pool's high-water mark), in bytes.
    pub fn peak_memory(&self) -> Result<u64> {
        let pool = self.memory_pool()?;
        let mut value = 0u64;
        let attribute = CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
        // SAFETY: USED_MEM_HIGH is a cuuint64_t.
        unsafe { sys::cuMemPoolGetAttribute(pool, attribute, (&mut value as *mut u64).cast()) }
            .result()
            .context(|| "cuMemPoolGetAttribute(USED_MEM_HIGH)".into())?;
        Ok(value)
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Whether the Hopper module (FA3) is loaded: the device is compute capability 9.0.
    pub fn has_hopper_module(&self) -> bool {
        self.hopper_module.is_some()
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Sends this GPU's later work (launches, allocations, copies) to `stream`, a stream another
    /// library owns, e.g. PyTorch's current stream (`torch.cuda.current_stream().cuda_stream`);
    /// null is the legacy default stream. When the stream changes, waits for the work on the
    /// previous one first, so buffers this `Gpu` keeps across calls (FA3's tensor maps) are never
    /// used by two streams at once.
    ///
    /// # Safety
    ///
    /// `stream` is null or a valid stream of this device's primary context (the context
    /// [`Gpu::open`] uses and PyTorch uses), and its owner keeps it alive while work this `Gpu`
    /// sent to it may run. Buffers allocated through this `Gpu` before the switch are used only
    /// after the work that wrote them (the wait above gives that for work sent through it).
    ///
    /// A stream capturing a CUDA graph is refused ([`GRAPH_CAPTURE_UNSUPPORTED`] says why),
    /// before anything is sent to it, so the capture stays valid.
    pub unsafe fn use_borrowed_stream(&mut self, stream: RawStream) -> Result<()> {
        // SAFETY: the caller's contract: a valid stream (or null).
        if unsafe { is_capturing(stream) }? {
            return Err(Error::invalid(
                "stream",
                "a stream capturing a CUDA graph",
                GRAPH_CAPTURE_UNSUPPORTED,
            ));
        }
        if self.stream.cu_stream() == stream {
            return Ok(());
        }
        self.synchronize()?;
        // SAFETY: the caller's contract above is cudarc's for a borrowed stream.
        self.stream = unsafe { self.ctx.wrap_borrowed_stream(stream) };
        Ok(())
    }

    /// Free and total device memory, in bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().context(|| "cuMemGetInfo".into())
    }

    /// Allocates `len` elements of device memory; an out-of-memory failure says how much was asked
    /// and how much is free, and leaves the context usable.
    ///
    /// The pool is asked first: every call's workspace comes through here (three allocations per
    /// backward call), and asking the driver how much memory is free (`cuMemGetInfo`, a query of
    /// the kernel driver) costs more than an allocation the pool serves. Only when the pool cannot
    /// serve it are the pool's freed blocks handed back to the driver and the allocation tried
    /// once more; only then is the driver asked, for the error's figures.
    pub fn alloc<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
        what: &'static str,
    ) -> Result<CudaSlice<T>> {
        let requested = len.saturating_mul(std::mem::size_of::<T>());
        // Past the device's memory nothing can serve it (and the element count's bytes may not
        // fit a usize): straight to the error.
        if requested <= self.info.total_memory {
            if let Some(slice) = self.try_alloc::<T>(len, requested, what)? {
                return Ok(slice);
            }
            // Memory freed into the pool (kept there for speed) is not free to the driver: hand
            // it back before concluding there is not enough.
            self.synchronize()?;
            let pool = self.memory_pool()?;
            // SAFETY: trims unused pool memory; live allocations are untouched.
            unsafe { sys::cuMemPoolTrimTo(pool, 0) }
                .result()
                .context(|| "cuMemPoolTrimTo".into())?;
            if let Some(slice) = self.try_alloc::<T>(len, requested, what)? {
                return Ok(slice);
            }
        }
        let (free, total) = self.memory()?;
        Err(Error::OutOfMemory {
            what,
            requested,
            free,
            total,
        })
    }

    /// One allocation from the stream's pool: `None` when it is out of memory.
    fn try_alloc<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
        requested: usize,
        what: &'static str,
    ) -> Result<Option<CudaSlice<T>>> {
        // SAFETY: the memory is written (uploaded, poisoned or computed) before it is read.
        match unsafe { self.stream.alloc::<T>(len.max(1)) } {
            Ok(slice) => Ok(Some(slice)),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Ok(None),
            Err(e) => Err(e).context(|| format!("allocating {requested} bytes for {what}")),
        }
    }

    /// [`Gpu::alloc`], then zeroed on the stream (counters that kernels expect at zero).
    pub fn alloc_zeroed<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
        what: &'static str,
    ) -> Result<CudaSlice<T>> {
        let mut slice = self.alloc::<T>(len, what)?;
        self.stream
            .memset_zeros(&mut slice)
            .context(|| format!("zeroing {what}"))?;
        Ok(slice)
    }

    /// Device address of a buffer, for a parameter block (or for `DeviceOffsets`, offsets
    /// uploaded with [`Gpu::upload`]).
    pub fn address<T>(&self, slice: &CudaSlice<T>) -> u64 {
        use cudarc::driver::DevicePtr;
        slice.device_ptr(&self.stream).0
    }

    /// Waits for every launch so far; a kernel fault surfaces here.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .context(|| "waiting for the GPU".into())
    }

    /// Runs `launch` `count` times back to back, with a CUDA event between consecutive launches so
    /// the GPU never waits on the host between them, and returns each launch's milliseconds.
    pub fn time_each_ms(
        &self,
        count: usize,
        mut launch: impl FnMut(usize) -> Result<()>,
    ) -> Result<Vec<f32>> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let events = (0..=count)
            .map(|_| {
                self.ctx
                    .new_event(flags)
                    .context(|| "creating an event".into())
            })
            .collect::<Result<Vec<_>>>()?;
        events[0]
            .record(&self.stream)
            .context(|| "recording an event".into())?;
        for (i, event) in events[1..].iter().enumerate() {
            launch(i)?;
            event
                .record(&self.stream)
                .context(|| "recording an event".into())?;
        }
        events[count]
            .synchronize()
            .context(|| "waiting for the timed work".into())?;
        events
            .windows(2)
            .map(|w| {
                w[0].elapsed_ms(&w[1])
                    .context(|| "reading event times".into())
            })
            .collect()
    }

    /// Runs `work` between two CUDA events and returns the milliseconds between them.
    pub fn time_ms(&self, work: impl FnOnce() -> Result<()>) -> Result<f32> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self
            .ctx
            .new_event(flags)
            .context(|| "creating an event".into())?;
        let end = self
            .ctx
            .new_event(flags)
            .context(|| "creating an event".into())?;
        start
            .record(&self.stream)
            .context(|| "recording an event".into())?;
        work()?;
        end.record(&self.stream)
            .context(|| "recording an event".into())?;
        end.synchronize()
            .context(|| "waiting for the timed work".into())?;
        start
            .elapsed_ms(&end)
            .context(|| "reading event times".into())
    }

    /// Copies host data to a new device buffer.
    pub fn upload<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        data: &[T],
        what: &'static str,
    ) -> Result<CudaSlice<T>> {
        let mut slice = self.alloc::<T>(data.len(), what)?;
        if !data.is_empty() {
            self.stream
                .memcpy_htod(data, &mut slice)
                .context(|| format!("uploading {what}"))?;
        }
        Ok(slice)
    }

    /// Copies a device buffer back.
    pub fn download<T: DeviceRepr + ValidAsZeroBits + Clone + Default>(
        &self,
        slice: &CudaSlice<T>,
    ) -> Result<Vec<T>> {
        self.stream
            .clone_dtoh(slice)
            .context(|| "downloading a result".into())
    }

    /// Fills a buffer with `value` (from the host).
    pub fn fill<T: Element>(&self, slice: &mut CudaSlice<T>, value: T) -> Result<()> {
        let as_f64 = value.to_f64();
        if as_f64 == 0.0 && as_f64.is_sign_positive() {
            // +0.0 is all-zero bits in every dtype: a device memset, no host buffer.
            return self
                .stream
                .memset_zeros(slice)
                .context(|| "zeroing a buffer".into());
        }
        let data = vec![value; slice.len()];
        self.stream
            .memcpy_htod(&data, slice)
            .context(|| "filling a buffer".into())
    }
}

fn device_info(ctx: &Arc<CudaContext>, ordinal: usize) -> Result<DeviceInfo> {
    let attribute = |a: CUdevice_attribute| ctx.attribute(a).context(|| format!("reading {a:?}"));
    let mut driver_version = 0;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .context(|| "cuDriverGetVersion".into())?;
    Ok(DeviceInfo {
        ordinal,
        name: ctx.name().context(|| "reading the device name".into())?,
        compute_capability: ctx
            .compute_capability()
            .context(|| "reading the compute capability".into())?,
        l2_cache_bytes: attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
        multiprocessors: attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as u32,
        shared_memory_per_block: attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )? as u32,
        total_memory: ctx
            .total_mem()
            .context(|| "reading the memory size".into())?,
        driver_version,
    })
}
