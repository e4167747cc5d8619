//! Device tensors of shape (batch, heads, seqlen, head_dim) with explicit strides.

use cudarc::driver::CudaSlice;
use flash_kernels::common::params::TensorView;
use ndarray::{Array4, ArrayView4};

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
        Layout::ALL
            .into_iter()
            .find(|l| l.strides(self.dims) == self.strides)
    }

    /// Refills every element with `value`.
    pub fn fill(&mut self, gpu: &Gpu, value: T) -> Result<()> {
        gpu.fill(&mut self.data, value)
    }

    pub(crate) fn view(&self, gpu: &Gpu) -> TensorView {
        TensorView {
            addr: gpu.address(&self.data),
            batch_stride: self.strides[0] as u64,
            head_stride: self.strides[1] as u64,
            row_stride: self.strides[2] as u64,
        }
    }
}
