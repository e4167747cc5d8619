//! FlashAttention as pure-Rust GPU kernels: open a GPU, describe a call once ([`Attention`]:
//! Q, K, V, the form of the batch, the options), and run it. [`Algorithm::Auto`], the default,
//! picks the fastest kernel for the device (FlashAttention-3 on Hopper, FlashAttention-2 on
//! tensor cores elsewhere), and the [`Plan`] says which kernels ran and why.
//!
//! ```no_run
//! use flash_attn::{Attention, DeviceTensor, Gpu, Layout};
//! use half::bf16;
//! # fn main() -> flash_attn::Result<()> {
//! let gpu = Gpu::open(0)?;
//! // Logical (batch, heads, seqlen, head_dim), stored as flash-attn does: (batch, seqlen, heads, d).
//! let host = ndarray::Array4::from_elem([2, 8, 1024, 128], bf16::from_f32(0.5));
//! let upload = |a: &ndarray::Array4<bf16>| DeviceTensor::from_array(&gpu, a.view(), Layout::BatchSeqHeadDim);
//! let (q, k, v) = (upload(&host)?, upload(&host)?, upload(&host)?);
//! let out = Attention::new(&q, &k, &v).causal(true).forward(&gpu)?;
//! println!("{}", out.plan); // which kernels ran, and why
//! let o = out.o.to_array(&gpu)?;
//! # let _ = o; Ok(()) }
//! ```
//!
//! Packed batches (`.packed(&PackedBatch)`, or `.packed_on_device(DeviceOffsets)` with the
//! offsets left on the GPU), KV-cache decoding (`.kv_cache(KvCache { .. })`),
//! the backward (`call.backward(&gpu, &out, &d_o)`), plans made once and run many times
//! (`call.plan(&gpu)`, [`Plan::run`]) and memory another library owns ([`TensorRef::from_raw`])
//! all go through the same description.

pub mod attention;
pub mod device;
pub mod dtype;
pub mod error;
pub mod scoring;
pub mod tensor;

pub use attention::{
    Algorithm, AlibiSlopes, Attention, AttentionOptions, AttentionOutput, BackwardOutput,
    BackwardTensors, BlockTable, CacheSeqlens, CompiledLimits, DeviceOffsets, Dropout, Form,
    ForwardTensors, Gradients, KvCache, PackedBatch, PackedOffsets, Pass, Plan, Problem,
    RowStatistics, Statistics, Workspace,
};
pub use device::{DeviceInfo, Gpu};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use tensor::{DeviceRows, DeviceTensor, Layout, RowsRef, TensorRef};
