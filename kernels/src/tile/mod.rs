//! Tiles: the only code that turns "rows 64..128 of K for this head" into addresses, bounds
//! checks and conversions. Kernels name tiles; these helpers do the index arithmetic.
//!
//! - [`layout`]: strides and padding of shared tiles (host and GPU: the host sizes launches);
//! - [`fragment`]: the tensor-core operand shapes, and which element each lane holds;
//! - [`row_chunks`]: which thread of a row-streaming pass owns which 16-byte chunk of which row
//!   (host and GPU: the host sizes the grid);
//! - `global`: one head's rows of a tensor in device memory, and its statistics vectors;
//! - `sequences`: where a block of a packed launch finds its sequence's rows (the offsets in
//!   the parameter block, or in device memory);
//! - `shared`: f32 and 16-bit tiles in shared memory, and the block-wide loops that fill them;
//! - `copy`: asynchronous 16-byte copies of global rows into 16-bit shared tiles;
//! - `register`: one thread's 4 × 4 register blocks of a matrix product;
//! - `warp`: reductions across a warp, or across an aligned group of its lanes;
//! - `accumulator`: a warp's rows of an f32 accumulator in the mma.m16n8 layout (mask, row
//!   reductions, the online-softmax update, dropout's keep bits, the output store), shared by
//!   FA2-TC and FA3;
//! - `transposed_scores`: the backward's Sᵀ and dPᵀ becoming Pᵀ and dSᵀ (FA2-TC's and FA3's);
//! - `kv_cache`: a KV cache's rows (contiguous or paged) and the decode kernels' mma fragments
//!   loaded straight from them;
//! - `partials`: the split-KV workspace (each split's Õ, m and ℓ);
//! - `swizzled` (Hopper): 128-byte-swizzled shared tiles as TMA writes and wgmma reads them.

pub mod fragment;
pub mod layout;
pub mod row_chunks;

#[cfg(target_arch = "nvptx64")]
pub mod accumulator;
#[cfg(target_arch = "nvptx64")]
pub mod copy;
#[cfg(target_arch = "nvptx64")]
pub mod global;
#[cfg(target_arch = "nvptx64")]
pub mod kv_cache;
#[cfg(target_arch = "nvptx64")]
pub mod partials;
#[cfg(target_arch = "nvptx64")]
pub mod register;
#[cfg(target_arch = "nvptx64")]
pub mod sequences;
#[cfg(target_arch = "nvptx64")]
pub mod shared;
#[cfg(all(target_arch = "nvptx64", feature = "hopper"))]
pub mod swizzled;
#[cfg(target_arch = "nvptx64")]
pub mod transposed_scores;
#[cfg(target_arch = "nvptx64")]
pub mod warp;
