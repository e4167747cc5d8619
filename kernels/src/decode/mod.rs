//! Decoding against a KV cache: a few query tokens per sequence (1–16) against a long cache of
//! keys and values, contiguous or paged, with grouped K/V heads (GQA/MQA).
//!
//! - [`config`]: the block geometry, the split plan and [`config::DecodeConfig`] (host and GPU);
//! - `append`: new keys and values written into the cache (GPU);
//! - `split_kv`: one block per (split of the keys, 16 query rows, batch·KV head), each writing
//!   its partial (Õ, m, ℓ); in its one-launch form the last block of each group then merges
//!   them (GPU);
//! - `combine`: the splits merged by their (m, ℓ) into O and L, as a second kernel or by that
//!   last block (GPU).

pub mod config;

#[cfg(target_arch = "nvptx64")]
pub mod append;
#[cfg(target_arch = "nvptx64")]
pub mod combine;
#[cfg(target_arch = "nvptx64")]
pub mod split_kv;
