//! The arithmetic every kernel family shares, built for the GPU and the host alike (the host
//! sizes launches with it, the CPU models and unit tests run it): parameter blocks, block
//! coordinates, the causal mask, the online softmax, hardware limits. `element` (loads and
//! stores of f32/f16/bf16) exists on the GPU only.

pub mod alibi;
pub mod block;
pub mod decode_block;
pub mod dropout;
pub mod form;
pub mod limits;
pub mod mask;
pub mod params;
pub mod softcap;
pub mod softmax;

#[cfg(target_arch = "nvptx64")]
pub mod element;
