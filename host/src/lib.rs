//! Host side of FlashAttention in Rust: open a GPU, move tensors, launch the kernels of the
//! `flash-kernels` crate through one safe entry point, and check them against an f64 CPU reference.
//!
//! ```no_run
//! use flash_attn::{Algorithm, AttentionOptions, DeviceTensor, Gpu, Layout, attention};
//! # fn main() -> flash_attn::Result<()> {
//! let gpu = Gpu::open(0)?;
//! let q = ndarray::Array4::from_elem([2, 8, 1024, 64], half::bf16::from_f32(0.5));
//! let dq = DeviceTensor::from_array(&gpu, q.view(), Layout::BatchHeadSeqDim)?;
//! let out = attention(&gpu, Algorithm::Fa2, &dq, &dq, &dq, &AttentionOptions { causal: true, ..Default::default() })?;
//! let o = out.o.to_array(&gpu)?;
//! # let _ = o; Ok(()) }
//! ```

pub mod attention;
pub mod device;
pub mod dtype;
pub mod error;
pub mod scoring;
pub mod tensor;

pub use attention::{
    Algorithm, AttentionOptions, AttentionOutput, BackwardAlgorithm, BackwardOptions, BackwardPlan,
    BackwardProblem, BorrowedArguments, BorrowedBackwardArguments, BorrowedRows, BorrowedTensor,
    Gradients, Problem, RowStatistics, StatisticsAddresses, Workspace, attention,
    attention_backward, attention_backward_borrowed, attention_backward_into, attention_borrowed,
    attention_into, attention_packed_borrowed, attention_with_workspace, new_output,
};
pub use device::{DeviceInfo, Gpu};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use tensor::{DeviceTensor, Layout};
