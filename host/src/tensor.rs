//! Device tensors of shape (batch, heads, seqlen, head_dim) with explicit strides.

use std::marker::PhantomData;

use cudarc::driver::CudaSlice;
use flash_kernels::common::params::TensorView;
use ndarray::{Array3, Array4, ArrayView4};

use crate::device::Gpu;
use crate::dtype::Element;
use crate::error::{Error, Result};

/// How a (batch, heads, seqlen, head_dim) tensor is laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// (batch, heads, seqlen, head_dim) contiguous: PyTorch SDPA's layout.
    BatchHeadSeqDim,
    /// (batch, seqlen, heads, head_dim) contiguous: FlashAttention's layout.
    BatchSeqHeadDim,
}

impl Layout {
    pub const ALL: [Layout; 2] = [Layout::BatchHeadSeqDim, Layout::BatchSeqHeadDim];

    /// Strides in elements for (batch, heads, seqlen, head_dim) dims.
    pub fn strides(self, [b, h, s, d]: [usize; 4]) -> [usize; 4] {
        let _ = b;
        match self {
            Layout::BatchHeadSeqDim => [h * s * d, s * d, d, 1],
            Layout::BatchSeqHeadDim => [s * h * d, d, h * d, 1],
        }
    }

    /// The layout whose strides these are, if one of the two.
    pub fn of(dims: [usize; 4], strides: [usize; 4]) -> Option<Layout> {
        Layout::ALL.into_iter().find(|l| l.strides(dims) == strides)
    }

    pub fn name(self) -> &'static str {
        match self {
            Layout::BatchHeadSeqDim => "bhsd",
            Layout::BatchSeqHeadDim => "bshd",
        }
    }
}

/// A tensor on the GPU, logically (batch, heads, seqlen, head_dim), with strides in elements and a
/// contiguous last dimension.
pub struct DeviceTensor<T> {
    data: CudaSlice<T>,
    dims: [usize; 4],
    strides: [usize; 4],
}

impl<T: Element> DeviceTensor<T> {
    /// Uploads `array` (logically (batch, heads, seqlen, head_dim)) stored in `layout`.
    pub fn from_array(gpu: &Gpu, array: ArrayView4<T>, layout: Layout) -> Result<Self> {
        let dims: [usize; 4] = array
            .shape()
            .try_into()
            .map_err(|_| Error::invalid("array", "not 4-D", "a 4-D array"))?;
        let strides = layout.strides(dims);
        let mut host = vec![T::default(); dims.iter().product()];
        for ((b, h, s, d), value) in array.indexed_iter() {
            host[b * strides[0] + h * strides[1] + s * strides[2] + d] = *value;
        }
        Ok(Self {
            data: gpu.upload(&host, "a tensor")?,
            dims,
            strides,
        })
    }

    /// A new tensor with every element set to `value` (use [`Element::poison`] for outputs).
    pub fn filled(gpu: &Gpu, dims: [usize; 4], layout: Layout, value: T) -> Result<Self> {
        let mut data = gpu.alloc::<T>(dims.iter().product(), "a tensor")?;
        gpu.fill(&mut data, value)?;
        Ok(Self {
            data,
            dims,
            strides: layout.strides(dims),
        })
    }

    /// Wraps an existing buffer with the given dims and strides (elements); the last stride must
    /// be 1 and every element must lie inside the buffer.
    pub fn from_parts(data: CudaSlice<T>, dims: [usize; 4], strides: [usize; 4]) -> Result<Self> {
        if strides[3] != 1 {
            return Err(Error::invalid(
                "strides",
                format!("{strides:?}"),
                "the last dimension (head_dim) must be contiguous: stride 1",
            ));
        }
        if dims.contains(&0) {
            return Err(Error::invalid(
                "dims",
                format!("{dims:?}"),
                "every dimension must be at least 1",
            ));
        }
        let last = dims.iter().zip(strides).try_fold(0usize, |acc, (&n, s)| {
            (n - 1).checked_mul(s).and_then(|x| x.checked_add(acc))
        });
        match last {
            Some(last) if last < data.len() => Ok(Self {
                data,
                dims,
                strides,
            }),
            _ => Err(Error::invalid(
                "strides",
                format!("{strides:?} for dims {dims:?}"),
                format!(
                    "every element must lie inside the buffer of {} elements",
                    data.len()
                ),
            )),
        }
    }

    /// Downloads the tensor as a logical (batch, heads, seqlen, head_dim) array.
    pub fn to_array(&self, gpu: &Gpu) -> Result<Array4<T>> {
        let host = gpu.download(&self.data)?;
        let s = self.strides;
        Ok(Array4::from_shape_fn(self.dims, |(b, h, i, d)| {
            host[b * s[0] + h * s[1] + i * s[2] + d]
        }))
    }

    /// (batch, heads, seqlen, head_dim).
    pub fn dims(&self) -> [usize; 4] {
        self.dims
    }

    pub fn strides(&self) -> [usize; 4] {
        self.strides
    }

    /// The layout whose strides these are, if one of the standard two.
    pub fn layout(&self) -> Option<Layout> {
        Layout::of(self.dims, self.strides)
    }

    /// Refills every element with `value`.
    pub fn fill(&mut self, gpu: &Gpu, value: T) -> Result<()> {
        gpu.fill(&mut self.data, value)
    }
}

/// A (batch, heads, seqlen, head_dim) tensor of `T` in device memory, borrowed for `'a`: the
/// address of element (0, 0, 0, 0) and the strides in elements. Every call takes its tensors
/// as these; a [`DeviceTensor`] lends one (`(&tensor).into()`), and memory another library owns
/// (PyTorch's, through the Python bridge) is one through the unsafe [`TensorRef::from_raw`].
/// A view [`TensorRef::layout_only`] has no memory: it plans, and a run refuses it.
#[derive(Debug)]
pub struct TensorRef<'a, T> {
    address: u64,
    dims: [usize; 4],
    strides: [usize; 4],
    memory: PhantomData<&'a [T]>,
}

impl<T> Clone for TensorRef<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for TensorRef<'_, T> {}

impl<'a, T: Element> TensorRef<'a, T> {
    /// A view of memory this library does not own.
    ///
    /// # Safety
    ///
    /// `address` is device memory of the device a call runs on, in its context (for PyTorch: the
    /// device's primary context, which [`Gpu::open`] uses too), holding every element `dims` and
    /// `strides` reach, for as long as `'a` and until the work launched on it has finished.
    /// A tensor a call writes (O, the gradients) is used by nothing else meanwhile.
    pub unsafe fn from_raw(address: u64, dims: [usize; 4], strides: [usize; 4]) -> Self {
        Self {
            address,
            dims,
            strides,
            memory: PhantomData,
        }
    }

    /// A tensor's dims and strides with no memory behind them (address 0): enough to plan a call
    /// (the plan assumes 16-byte aligned rows); running such a call is an error naming it.
    pub fn layout_only(dims: [usize; 4], strides: [usize; 4]) -> TensorRef<'static, T> {
        TensorRef {
            address: 0,
            dims,
            strides,
            memory: PhantomData,
        }
    }

    pub fn address(&self) -> u64 {
        self.address
    }

    /// (batch, heads, seqlen, head_dim).
    pub fn dims(&self) -> [usize; 4] {
        self.dims
    }

    /// In elements.
    pub fn strides(&self) -> [usize; 4] {
        self.strides
    }

    /// The view the kernels' parameter blocks carry.
    pub(crate) fn view(&self) -> TensorView {
        TensorView {
            addr: self.address,
            batch_stride: self.strides[0] as u64,
            head_stride: self.strides[1] as u64,
            row_stride: self.strides[2] as u64,
        }
    }
}

impl<'a, T: Element> From<&'a DeviceTensor<T>> for TensorRef<'a, T> {
    fn from(tensor: &'a DeviceTensor<T>) -> Self {
        Self {
            address: slice_address(&tensor.data),
            dims: tensor.dims,
            strides: tensor.strides,
            memory: PhantomData,
        }
    }
}

impl<'a, T: Element> From<&'a mut DeviceTensor<T>> for TensorRef<'a, T> {
    fn from(tensor: &'a mut DeviceTensor<T>) -> Self {
        TensorRef::from(&*tensor)
    }
}

/// A buffer's device address, on the stream it was allocated on.
fn slice_address<T>(slice: &CudaSlice<T>) -> u64 {
    use cudarc::driver::DevicePtr;
    slice.device_ptr(slice.stream()).0
}

/// Per-row statistics on the GPU: f32, contiguous, logically (batch, heads, rows) (a packed
/// batch's are (1, heads, total_q), flash-attn's (heads, total_q)).
pub struct DeviceRows {
    data: CudaSlice<f32>,
    dims: [usize; 3],
}

impl DeviceRows {
    /// Rows of `dims`, each `fill` (uninitialised for `None`); `what` names them in an
    /// out-of-memory error.
    pub fn new(gpu: &Gpu, dims: [usize; 3], fill: Option<f32>, what: &'static str) -> Result<Self> {
        let mut data = gpu.alloc(dims.iter().product(), what)?;
        if let Some(value) = fill {
            gpu.fill(&mut data, value)?;
        }
        Ok(Self { data, dims })
    }

    pub fn dims(&self) -> [usize; 3] {
        self.dims
    }

    /// Refills every row with `value`.
    pub fn fill(&mut self, gpu: &Gpu, value: f32) -> Result<()> {
        gpu.fill(&mut self.data, value)
    }

    /// Downloads the rows as a (batch, heads, rows) array.
    pub fn to_array(&self, gpu: &Gpu) -> Result<Array3<f32>> {
        Array3::from_shape_vec(self.dims, gpu.download(&self.data)?)
            .map_err(|e| Error::File(e.to_string()))
    }
}

/// Per-row f32 statistics in device memory, borrowed for `'a`: address, (batch, heads, rows)
/// dims and strides in elements. The kernels read and write them contiguous (checked per call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowsRef<'a> {
    address: u64,
    dims: [usize; 3],
    strides: [usize; 3],
    memory: PhantomData<&'a [f32]>,
}

impl<'a> RowsRef<'a> {
    /// A view of f32 rows this library does not own.
    ///
    /// # Safety
    ///
    /// As [`TensorRef::from_raw`]: device memory of the call's device holding every element
    /// `dims` and `strides` reach, alive and unused by other work until the call's work ends.
    pub unsafe fn from_raw(address: u64, dims: [usize; 3], strides: [usize; 3]) -> Self {
        Self {
            address,
            dims,
            strides,
            memory: PhantomData,
        }
    }

    pub fn address(&self) -> u64 {
        self.address
    }

    pub fn dims(&self) -> [usize; 3] {
        self.dims
    }

    pub fn strides(&self) -> [usize; 3] {
        self.strides
    }
}

impl<'a> From<&'a DeviceRows> for RowsRef<'a> {
    fn from(rows: &'a DeviceRows) -> Self {
        let [_, h, n] = rows.dims;
        Self {
            address: slice_address(&rows.data),
            dims: rows.dims,
            strides: [h * n, n, 1],
            memory: PhantomData,
        }
    }
}

impl<'a> From<&'a mut DeviceRows> for RowsRef<'a> {
    fn from(rows: &'a mut DeviceRows) -> Self {
        RowsRef::from(&*rows)
    }
}
