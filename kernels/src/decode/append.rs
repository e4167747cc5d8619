//! Appending new keys and values to a KV cache: token i of sequence b goes to position
//! `cache_seqlens[b] + i` of its cache (or of the page the block table names for it). One thread
//! per 16-byte piece of a row, of K and of V.

use super::config::APPEND_THREADS;
use crate::arch;
use crate::common::params::{DecodeParams, TensorView};
use crate::tile::global::HeadRows16;
use crate::tile::kv_cache::CacheRows;

/// 16-bit elements one thread copies.
const CHUNK_ELEMENTS: u32 = 8;

/// The kernel body: grid (⌈batch·new_tokens·heads_kv·d/8 / APPEND_THREADS⌉), APPEND_THREADS
/// threads.
#[inline(always)]
pub fn append<const PAGED: bool>(p: &DecodeParams) {
    let chunks_per_row = p.head_dim / CHUNK_ELEMENTS;
    let index = arch::block_idx_x() * APPEND_THREADS + arch::thread_idx_x();
    if index >= p.batch * p.new_tokens * p.heads_kv * chunks_per_row {
        return;
    }
    let col = index % chunks_per_row * CHUNK_ELEMENTS;
    let row = index / chunks_per_row;
    let kv_head = row % p.heads_kv;
    let token = row / p.heads_kv % p.new_tokens;
    let batch = row / (p.heads_kv * p.new_tokens);
    // SAFETY: the host allocated `batch` lengths.
    let cached =
        unsafe { arch::load((p.cache_seqlens as *const u32).wrapping_add(batch as usize)) };
    let position = cached + token;
    let copy_row = |new: &TensorView, cache: &TensorView| {
        let source = HeadRows16::new(new, batch, kv_head, p.new_tokens)
            .copy_source(token, col, true)
            .0;
        // SAFETY: a row of the new keys or values the host described, 16-byte aligned.
        let value = unsafe { arch::load_global_16(source) };
        let destination = CacheRows::<PAGED>::new(
            cache,
            batch,
            kv_head,
            p.block_table,
            p.table_stride,
            p.page_size,
        );
        // One row from `position`: the page lookup finds the page that holds it.
        destination.rows_from(position).store(0, col, value);
    };
    copy_row(&p.k_new, &p.k_cache);
    copy_row(&p.v_new, &p.v_cache);
}
