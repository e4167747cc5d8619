//! A decode call's shapes and options, checked: every misuse is an `InvalidArgument` naming the
//! argument, before anything is launched.

use flash_kernels::decode::config::{HEAD_DIMS, MAX_QUERY_TOKENS, PAGE_KEYS_MULTIPLE};

use super::cache::TablePages;
use crate::attention::problem::{MAX_HEAD_DIM, checked_softmax_scale};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// CUDA's limit on grid dimension z (batch × KV heads).
const MAX_GRID_Z: usize = 65_535;

/// Options of a decode call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecodeOptions {
    /// The new query tokens are the last `q_tokens` positions of each sequence: token t sees key
    /// k iff k ≤ t + seqlen − q_tokens (FlashAttention's bottom-right alignment). A token that
    /// sees no key (a sequence shorter than its tokens, or empty) gets O = 0 and L = −∞.
    pub causal: bool,
    /// Multiplies Q·Kᵀ; default 1/√head_dim.
    pub softmax_scale: Option<f32>,
    /// Splits of the keys (1 to `MAX_SPLITS`); default: as many as fill the GPU once
    /// (`flash_kernels::decode::config::plan_splits`).
    pub splits: Option<u32>,
    /// With several splits: `Some(true)` merges them in the split-KV kernel's last block of each
    /// group (one launch), `Some(false)` in the combine kernel (two launches); default: the
    /// plan's choice (`DecodePlan::merge`, `SplitMerge::choose`).
    pub one_launch: Option<bool>,
}

/// How the cache is stored, with its sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheGeometry {
    /// (batch, heads_kv, capacity, d): `capacity` keys per sequence.
    Contiguous { capacity: usize },
    /// (pages, heads_kv, page_size, d) and a block table of `table_width` pages per sequence.
    Paged {
        pages: usize,
        page_size: usize,
        table_width: usize,
    },
}

/// A checked decode problem.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeProblem {
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    /// Query tokens per sequence (1 to 16).
    pub q_tokens: usize,
    pub head_dim: usize,
    pub cache: CacheGeometry,
    /// Keys appended by this call to every sequence (0: none).
    pub new_tokens: usize,
    /// Keys each sequence attends to: its cache length plus `new_tokens`.
    pub seqlens: Vec<usize>,
    pub softmax_scale: f32,
    pub causal: bool,
}

/// The shapes of a decode call's tensors, as logical (batch, heads, seqlen, d) dims.
#[derive(Clone, Copy, Debug)]
pub struct DecodeShapes<'a> {
    pub q: [usize; 4],
    pub k_cache: [usize; 4],
    pub v_cache: [usize; 4],
    /// The new keys and values, (batch, heads_kv, new_tokens, d) each.
    pub new_kv: Option<([usize; 4], [usize; 4])>,
    pub cache_seqlens: &'a [u32],
    pub block_table: Option<TablePages<'a>>,
}

impl DecodeProblem {
    pub fn new(dtype: DType, shapes: &DecodeShapes, options: &DecodeOptions) -> Result<Self> {
        if dtype == DType::F32 {
            return Err(Error::invalid(
                "dtype",
                dtype,
                "decode runs f16 and bf16 (tensor cores)",
            ));
        }
        let q = shapes.q;
        if q.contains(&0) {
            return Err(Error::invalid(
                "q",
                format!("shape {q:?}"),
                "every dimension (batch, heads_q, q_tokens, head_dim) must be at least 1",
            ));
        }
        let [batch, heads_q, q_tokens, head_dim] = q;
        if q_tokens > MAX_QUERY_TOKENS as usize {
            return Err(Error::invalid(
                "q",
                format!("{q_tokens} query tokens (shape {q:?})"),
                format!("1 to {MAX_QUERY_TOKENS} query tokens per sequence"),
            ));
        }
        if !HEAD_DIMS.contains(&(head_dim as u32)) {
            return Err(Error::invalid(
                "head_dim",
                head_dim,
                format!("decode is compiled for head dims {HEAD_DIMS:?}"),
            ));
        }
        let k = shapes.k_cache;
        if shapes.v_cache != k {
            return Err(Error::invalid(
                "v_cache",
                format!("shape {:?}", shapes.v_cache),
                format!("must equal k_cache's shape {k:?}"),
            ));
        }
        if k.contains(&0) {
            return Err(Error::invalid(
                "k_cache",
                format!("shape {k:?}"),
                "every dimension must be at least 1",
            ));
        }
        let heads_kv = k[1];
        if k[3] != head_dim {
            return Err(Error::invalid(
                "k_cache",
                format!("shape {k:?}"),
                format!("its head_dim must equal q's ({head_dim})"),
            ));
        }
        if !heads_q.is_multiple_of(heads_kv) {
            return Err(Error::invalid(
                "heads_kv",
                heads_kv,
                format!("q's {heads_q} heads must be a multiple of the cache's KV heads"),
            ));
        }
        if batch * heads_kv > MAX_GRID_Z {
            return Err(Error::invalid(
                "batch × heads_kv",
                batch * heads_kv,
                format!("at most {MAX_GRID_Z} (grid limit)"),
            ));
        }
        let lengths = shapes.cache_seqlens;
        if lengths.len() != batch {
            return Err(Error::invalid(
                "cache_seqlens",
                format!("{} lengths", lengths.len()),
                format!("one per sequence of q ({batch})"),
            ));
        }
        let new_tokens = match shapes.new_kv {
            None => 0,
            Some((k_new, v_new)) => {
                let expected = [batch, heads_kv, k_new[2], head_dim];
                for (name, dims) in [("k_new", k_new), ("v_new", v_new)] {
                    if dims != expected || dims[2] == 0 {
                        return Err(Error::invalid(
                            name,
                            format!("shape {dims:?}"),
                            format!(
                                "(batch {batch}, heads_kv {heads_kv}, new tokens ≥ 1, head_dim \
                                 {head_dim}), the same for k_new and v_new"
                            ),
                        ));
                    }
                }
                if v_new != k_new {
                    return Err(Error::invalid(
                        "v_new",
                        format!("shape {v_new:?}"),
                        format!("must equal k_new's shape {k_new:?}"),
                    ));
                }
                k_new[2]
            }
        };
        let cache = match shapes.block_table {
            None => {
                if k[0] != batch {
                    return Err(Error::invalid(
                        "k_cache",
                        format!("shape {k:?}"),
                        format!(
                            "a contiguous cache has one sequence per batch entry of q ({batch}); pass a block table for a paged cache"
                        ),
                    ));
                }
                CacheGeometry::Contiguous { capacity: k[2] }
            }
            Some(table) => {
                let page_size = k[2];
                if !page_size.is_multiple_of(PAGE_KEYS_MULTIPLE as usize) {
                    return Err(Error::invalid(
                        "k_cache",
                        format!("page size {page_size} (shape {k:?})"),
                        format!(
                            "a paged cache's pages hold a multiple of {PAGE_KEYS_MULTIPLE} keys"
                        ),
                    ));
                }
                if table.prefix_max.len() != batch {
                    return Err(Error::invalid(
                        "block_table",
                        format!("{} rows", table.prefix_max.len()),
                        format!("one row per sequence ({batch})"),
                    ));
                }
                CacheGeometry::Paged {
                    pages: k[0],
                    page_size,
                    table_width: table.width,
                }
            }
        };
        let capacity = match cache {
            CacheGeometry::Contiguous { capacity } => capacity,
            CacheGeometry::Paged {
                page_size,
                table_width,
                ..
            } => page_size * table_width,
        };
        let mut seqlens = Vec::with_capacity(batch);
        for (b, &cached) in lengths.iter().enumerate() {
            let seqlen = cached as usize + new_tokens;
            if seqlen > capacity {
                return Err(Error::invalid(
                    "cache_seqlens",
                    format!("cache_seqlens[{b}] = {cached} (+ {new_tokens} new)"),
                    format!("at most the cache's capacity of {capacity} keys per sequence"),
                ));
            }
            if let (
                Some(table),
                CacheGeometry::Paged {
                    pages, page_size, ..
                },
            ) = (shapes.block_table, cache)
            {
                let used = seqlen.div_ceil(page_size);
                if used > 0 && table.prefix_max[b][used - 1] as usize >= pages {
                    let (i, page) = table.prefix_max[b]
                        .iter()
                        .enumerate()
                        .find(|(_, max)| **max as usize >= pages)
                        .map(|(i, max)| (i, *max))
                        .unwrap_or((used - 1, 0));
                    return Err(Error::invalid(
                        "block_table",
                        format!("block_table[{b}][{i}] = {page}"),
                        format!("a page index below the cache's {pages} pages"),
                    ));
                }
            }
            seqlens.push(seqlen);
        }
        let softmax_scale = checked_softmax_scale(options.softmax_scale, head_dim)?;
        if capacity
            .checked_mul(MAX_HEAD_DIM)
            .is_none_or(|n| n > u32::MAX as usize)
        {
            return Err(Error::invalid(
                "k_cache",
                format!("{capacity} keys per sequence"),
                "keys × 256 must fit in 32 bits",
            ));
        }
        Ok(Self {
            batch,
            heads_q,
            heads_kv,
            q_tokens,
            head_dim,
            cache,
            new_tokens,
            seqlens,
            softmax_scale,
            causal: options.causal,
        })
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.heads_q / self.heads_kv
    }

    /// Query rows: batch × heads_q × q_tokens (the statistics' and the workspace's rows).
    pub fn rows(&self) -> usize {
        self.batch * self.heads_q * self.q_tokens
    }

    pub fn max_seqlen(&self) -> usize {
        self.seqlens.iter().copied().max().unwrap_or(0)
    }

    /// Bytes of K and V the call reads: every sequence's keys once, for every KV head.
    pub fn kv_bytes(&self, element_bytes: usize) -> usize {
        let keys: usize = self.seqlens.iter().sum();
        2 * keys * self.heads_kv * self.head_dim * element_bytes
    }
}
