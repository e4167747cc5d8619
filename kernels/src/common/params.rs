//! Kernel parameter blocks, `#[repr(C)]` and shared by the kernels and the host, which passes each
//! kernel exactly one of them by value.

/// One (batch, heads, seqlen, head_dim) operand in device memory: its address and its strides in
/// elements. The last dimension is contiguous (stride 1), so both FlashAttention's layout
/// (batch, seqlen, heads, head_dim) and PyTorch SDPA's (batch, heads, seqlen, head_dim) are views.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TensorView {
    /// Device address of element (0, 0, 0, 0).
    pub addr: u64,
    pub batch_stride: u64,
    pub head_stride: u64,
    pub row_stride: u64,
}

impl TensorView {
    /// Element offset of the first row of (`batch`, `head`).
    #[inline(always)]
    pub fn head_offset(&self, batch: u32, head: u32) -> u64 {
        batch as u64 * self.batch_stride + head as u64 * self.head_stride
    }
}

/// The problem every attention kernel solves: O = drop(softmax(mask(cap(scale·Q·Kᵀ) + bias)))·V
/// for each of `batch × heads` query heads, each against its K/V head (`kv_group` query heads
/// share one), where cap is the optional soft-capping, bias the optional ALiBi, mask the causal or
/// sliding-window mask and drop the optional dropout.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    pub batch: u32,
    pub heads: u32,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub head_dim: u32,
    /// Multiplies Q·Kᵀ before the softmax (usually 1/√head_dim).
    pub softmax_scale: f32,
    /// 1: key k is visible to query q only if k ≤ q + seqlen_k − seqlen_q (bottom-right aligned).
    pub causal: u32,
    /// Query heads per K/V head (GQA/MQA; 1 when K and V have as many heads as Q): query head h
    /// reads K/V head h / kv_group, and K and V have heads / kv_group heads. At least 1.
    pub kv_group: u32,
    /// The sliding-window (local) mask, flash-attn's `window_size`: query q sees key k only if
    /// q + offset − window_left ≤ k ≤ q + offset + window_right (offset = seqlen_k − seqlen_q,
    /// `common::mask`); −1 leaves a side unbounded. With `causal`, the right side is 0.
    pub window_left: i32,
    pub window_right: i32,
    /// Soft-capping (Gemma 2, flash-attn's `softcap`): each score s = scale·q·k becomes
    /// softcap·tanh(s / softcap) before the mask and the softmax, which the kernels compute as
    /// tanh(q·k·softcap_inside)·softcap_outside·scale (`common::softcap`): softcap_inside =
    /// scale / softcap, softcap_outside = softcap / scale, both 0 when capping is off.
    pub softcap_inside: f32,
    pub softcap_outside: f32,
    /// ALiBi (`common::alibi`): device address of the f32 slopes, one per query head, the row of
    /// sequence b at b·`alibi_batch_stride` (0: one row for every sequence); 0 when ALiBi is
    /// off. Read by the window's and soft-capping's kernels (the `local` forms) only.
    pub alibi_slopes: u64,
    pub alibi_batch_stride: u32,
    pub _pad: u32,
    /// Dropout (`common::dropout`): Philox's seed and offset, the global head of the launch's
    /// first sequence (a packed launch's first sequence times heads; 0 otherwise), and the
    /// smallest kept 16-bit value (p rounded to 1/65536; 0 when dropout is off). Read by the
    /// `local` forms only.
    pub dropout_seed: u64,
    pub dropout_offset: u64,
    pub dropout_first_head: u32,
    pub dropout_drop_below: u32,
}

impl Default for AttentionShape {
    /// Every field 0 but the window, which is unbounded on both sides (a zero window would show
    /// each query its diagonal key only).
    fn default() -> Self {
        Self {
            batch: 0,
            heads: 0,
            seqlen_q: 0,
            seqlen_k: 0,
            head_dim: 0,
            softmax_scale: 0.0,
            causal: 0,
            kv_group: 0,
            window_left: -1,
            window_right: -1,
            softcap_inside: 0.0,
            softcap_outside: 0.0,
            alibi_slopes: 0,
            alibi_batch_stride: 0,
            _pad: 0,
            dropout_seed: 0,
            dropout_offset: 0,
            dropout_first_head: 0,
            dropout_drop_below: 0,
        }
    }
}

impl AttentionShape {
    /// Which keys each query sees around its diagonal.
    #[inline(always)]
    pub fn window(&self) -> crate::common::mask::KeyWindow {
        crate::common::mask::KeyWindow::from_params(
            self.causal != 0,
            self.window_left,
            self.window_right,
        )
    }
}

/// Q, K, V in, O out: the four operands of every algorithm.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Operands {
    pub q: TensorView,
    pub k: TensorView,
    pub v: TensorView,
    pub o: TensorView,
}

/// Standard attention: three kernels that communicate through S and P in device memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StandardParams {
    pub operands: Operands,
    pub shape: AttentionShape,
    /// S, f32, (batch·heads, seqlen_q, seqlen_k) contiguous: scale·Q·Kᵀ.
    pub scores: u64,
    /// P, in the input dtype, same shape as S: softmax(S) with the mask applied.
    pub probs: u64,
    /// L, f32, (batch·heads, seqlen_q): the natural-log logsumexp of each row of S.
    pub logsumexp: u64,
}

/// The standard backward (`bwd::standard`): the standard forward's buffers (`base.scores` holds
/// S, then dP, then dS, f32; `base.probs` P in the input dtype; `base.logsumexp` the recomputed
/// L) and the backward's tensors.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StandardBackwardParams {
    pub base: StandardParams,
    /// dO, O's shape.
    pub d_o: TensorView,
    /// dQ, Q's shape.
    pub dq: TensorView,
    /// dK, K's shape.
    pub dk: TensorView,
    /// dV, V's shape.
    pub dv: TensorView,
}

/// FlashAttention-1 forward: one block per (batch, head), outer loop over K/V blocks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fa1Params {
    pub operands: Operands,
    pub shape: AttentionShape,
    /// O between outer steps, f32, (batch·heads, seqlen_q, head_dim) contiguous. For f32 inputs it
    /// may alias O itself.
    pub o_accumulator: u64,
    /// m, f32, (batch·heads, seqlen_q): running row max, natural-log units.
    pub row_max: u64,
    /// ℓ, f32, (batch·heads, seqlen_q): running row sum of e^(S − m).
    pub row_sum: u64,
    /// B_r.
    pub block_rows: u32,
    /// B_c.
    pub block_cols: u32,
}

/// FlashAttention-2 forward: a grid over (row block, batch·head), inner loop over K/V blocks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fa2Params {
    pub operands: Operands,
    pub shape: AttentionShape,
    /// L, f32, (batch·heads, seqlen_q): m + log ℓ, natural-log units; −∞ for rows with no visible key.
    pub logsumexp: u64,
    /// B_r (a multiple of `fwd::fa2::config::ROWS_PER_WARP`, one warp per that many rows).
    pub block_rows: u32,
    pub _pad: u32,
}

/// A packed batch of sequences of different lengths (flash-attn's varlen call): Q and O are one
/// (total_q, heads, d) tensor, K and V one (total_k, heads_kv, d), seen by the kernels as batch
/// 1; sequence b's queries are rows `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` and its keys rows
/// `cu_seqlens_k[b]..cu_seqlens_k[b + 1]`, each causal mask aligned within its own sequence.
/// `AttentionShape::batch` counts the launch's sequences and its seqlens are the longest ones
/// (the grid).
///
/// Two kinds of launch. Offsets the host read travel in the parameter block itself: a kernel
/// reads them from the constant bank at an index the whole warp shares (`ULDC`), so a block knows
/// its sequence's rows without a round trip to memory before its first load, and what it derives
/// from them stays in uniform registers. A launch holds at most [`MAX_SEQUENCES_PER_LAUNCH`]
/// sequences; the host splits a longer batch into several launches, each table holding its
/// sequences' offsets into the whole packed tensors. Offsets that stay on the GPU (flash-attn's
/// `cu_seqlens` as a data collator leaves them there) are read from device memory instead
/// (`device_cu_seqlens_q`, `_k` not 0; the tables are then unused), so the call needs no host
/// synchronization; the host splits the launches the same way, each one's addresses at its
/// first sequence.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PackedSequences {
    /// Device address of this launch's first sequence's entry of the caller's `cu_seqlens_q`
    /// (u32, batch + 1 entries in all), or 0: the offsets are the tables below.
    pub device_cu_seqlens_q: u64,
    /// The same of `cu_seqlens_k`.
    pub device_cu_seqlens_k: u64,
    /// Q's rows in the whole packed tensor: L is (heads, total_q), as flash-attn's.
    pub total_q: u32,
    /// K's and V's rows in the whole packed tensors.
    pub total_k: u32,
    /// This launch's sequences' batch + 1 offsets into Q's rows (absolute rows); unused entries 0.
    pub cu_seqlens_q: [u32; SEQUENCE_TABLE_LEN],
    /// The same into K's and V's rows.
    pub cu_seqlens_k: [u32; SEQUENCE_TABLE_LEN],
}

/// Offsets per tensor in one launch's [`PackedSequences`]: 2 KiB for both tables, so that a
/// packed parameter block stays under CUDA's 4 KiB for kernel parameters.
pub type const SEQUENCE_TABLE_LEN: usize = 256;

/// The sequences one packed launch holds.
pub const MAX_SEQUENCES_PER_LAUNCH: usize = SEQUENCE_TABLE_LEN - 1;

impl PackedSequences {
    /// The table of the sequences whose offsets are `cu_seqlens_q` and `cu_seqlens_k` (as many
    /// each, at most [`SEQUENCE_TABLE_LEN`]; entries past them are 0), in a packed batch of
    /// `totals` = [total_q, total_k] rows. `None` if the offsets do not fit.
    pub fn new(totals: [u32; 2], cu_seqlens_q: &[u32], cu_seqlens_k: &[u32]) -> Option<Self> {
        let table = |offsets: &[u32]| {
            let mut table = [0; SEQUENCE_TABLE_LEN];
            table.get_mut(..offsets.len())?.copy_from_slice(offsets);
            Some(table)
        };
        Some(Self {
            cu_seqlens_q: table(cu_seqlens_q)?,
            cu_seqlens_k: table(cu_seqlens_k)?,
            ..Self::in_device_memory(totals, [0, 0])
        })
    }

    /// A launch that reads its offsets from device memory: `addresses` = [cu_seqlens_q,
    /// cu_seqlens_k] at the launch's first sequence (not 0), in a packed batch of `totals` rows.
    pub fn in_device_memory(totals: [u32; 2], addresses: [u64; 2]) -> Self {
        Self {
            device_cu_seqlens_q: addresses[0],
            device_cu_seqlens_k: addresses[1],
            total_q: totals[0],
            total_k: totals[1],
            cu_seqlens_q: [0; SEQUENCE_TABLE_LEN],
            cu_seqlens_k: [0; SEQUENCE_TABLE_LEN],
        }
    }
}

/// The parameter block of a packed form's kernel (`_varlen`, `_varlen_local`): its family's
/// block (`Fa2Params`, `Fa3Params`), then the launch's sequences.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PackedParams<P> {
    pub family: P,
    pub sequences: PackedSequences,
}

/// FlashAttention-3 forward (Hopper): Q, K and V arrive by TMA through tensor maps the host
/// encoded; O is stored from registers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fa3Params {
    pub shape: AttentionShape,
    pub o: TensorView,
    /// L, f32, (batch·heads, seqlen_q), as [`Fa2Params::logsumexp`].
    pub logsumexp: u64,
    /// Device address of three consecutive 128-byte `CUtensorMap`s (64-byte aligned): Q, K, V,
    /// each a 4-D tensor (head_dim, seqlen, heads, batch) of 16-bit elements with a box of 64
    /// columns × B_r (Q) or B_c (K, V) rows and 128-byte swizzle.
    pub tensor_maps: u64,
    /// Device address of two zeroed u32s (`tile::global::TileCounters`), for the persistent grid;
    /// unused on the one-tile-per-block grid.
    pub tile_counters: u64,
}

/// FlashAttention-2 backward: one parameter block for its three kernels (pre-pass, main loop,
/// post-pass). Q, K, V, O are the forward's operands (O its output); every gradient has the
/// strides of its own tensor view.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fa2BackwardParams {
    /// The forward's Q, K, V and its output O.
    pub operands: Operands,
    pub shape: AttentionShape,
    /// dO, O's shape.
    pub d_o: TensorView,
    /// dQ, Q's shape, in the input dtype (written by the post-pass).
    pub dq: TensorView,
    /// dK, K's shape, written by the main kernel; for grouped K/V heads, the expanded workspace
    /// (one head per query head, Q's heads) that `bwd::group_sum` sums per K/V head.
    pub dk: TensorView,
    /// dV, as `dk`.
    pub dv: TensorView,
    /// L, f32, (batch·heads, seqlen_q): the forward's m + log ℓ, natural-log units.
    pub logsumexp: u64,
    /// D, f32, (batch·heads, seqlen_q): rowsum(dO ∘ O), written by the pre-pass.
    pub delta: u64,
    /// dQ before scaling, f32, (batch·heads, seqlen_q, head_dim) contiguous: zeroed by the
    /// pre-pass, summed into by every key block of the main kernel (atomic adds).
    pub dq_accumulator: u64,
}

/// FlashAttention-2 backward on tensor cores: the main kernel's parameters (the pre- and
/// post-pass take `base` alone, as the scalar backward's do).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fa2TcBackwardParams {
    pub base: Fa2BackwardParams,
    /// 0: every key block adds its dQ_i into the accumulator by atomic adds in whatever order
    /// they land. Else the address of one zeroed u32 per (batch·head, row block of B_r),
    /// (batch·heads, ⌈seqlen_q / B_r⌉) contiguous: key block j adds to row block i only after
    /// key blocks 0..j have (deterministic mode: dQ is the same bits on every run).
    pub dq_semaphore: u64,
}

/// FlashAttention-3's backward on Hopper: the main kernel's parameters (the pre- and post-pass
/// take `base` alone, as for the other backward kernels).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fa3BackwardParams {
    pub base: Fa2BackwardParams,
    /// Device address of five consecutive 128-byte `CUtensorMap`s (64-byte aligned): Q, K, V,
    /// dO, each as [`Fa3Params::tensor_maps`]' with a box of 64 columns × B_r (Q, dO) or B_c
    /// (K, V) rows, then the f32 dQ accumulator, (batch, heads, seqlen_q, d) contiguous, with a
    /// box of 32 columns × B_r rows.
    pub tensor_maps: u64,
    /// 0: each key block adds its dQ_i to the accumulator whenever it is done with it. Else
    /// deterministic mode, as [`Fa2TcBackwardParams::dq_semaphore`] (one zeroed u32 per
    /// (batch·head, row block of B_r)), in FlashAttention-3's order: key blocks ascending
    /// without the mask; with it, from the last key block that sees the row block down, the
    /// grid started from the last key block (shortest first), so that a block only ever waits
    /// for blocks started before it.
    pub dq_semaphore: u64,
}

/// The grouped backward's group sum (`bwd::group_sum`): with grouped K/V heads the main kernel
/// stores each query head's dK and dV in an expanded workspace; this kernel sums each K/V head's
/// group of them (in f32) into the caller's dK and dV.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GroupSumParams {
    /// The problem (query heads `heads`, `kv_group` of them per K/V head).
    pub shape: AttentionShape,
    /// dK per query head, in the input dtype, (batch·heads, seqlen_k, head_dim) contiguous.
    pub expanded_dk: u64,
    /// dV per query head, as `expanded_dk`.
    pub expanded_dv: u64,
    /// dK, K's shape (batch, heads / kv_group, seqlen_k, head_dim).
    pub dk: TensorView,
    /// dV, V's shape.
    pub dv: TensorView,
}

/// Decoding against a KV cache (`decode`): a few query tokens per sequence against a long cache,
/// the keys split across blocks (split-KV), then merged. One block for the three kernels of a call
/// (append, split-KV, combine), so the host builds it once.
///
/// Rows: a query row is (batch, query head, token); `row_id = (batch·heads_q + head)·q_tokens +
/// token` indexes the statistics and the workspace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecodeParams {
    /// Q, (batch, heads_q, q_tokens, d) as a view (any strides, last one 1).
    pub q: TensorView,
    /// K cache. Contiguous cache: (batch, capacity, heads_kv, d) as a view (`batch_stride` per
    /// sequence). Paged: (pages, page_size, heads_kv, d), `batch_stride` per page.
    pub k_cache: TensorView,
    pub v_cache: TensorView,
    /// O, (batch, heads_q, q_tokens, d).
    pub o: TensorView,
    /// New keys and values to append before attending, (batch, new_tokens, heads_kv, d); unused
    /// when `new_tokens` is 0.
    pub k_new: TensorView,
    pub v_new: TensorView,
    /// L, f32, (batch, heads_q, q_tokens) contiguous, natural-log units; −∞ for a row that sees
    /// no key.
    pub logsumexp: u64,
    /// Workspace, used when `splits` > 1: each split's unnormalised Õ, f32 (splits, rows, d), and
    /// its m (log2 units) and ℓ, f32 (splits, rows).
    pub partial_o: u64,
    pub partial_max: u64,
    pub partial_sum: u64,
    /// u32 (batch): keys in each sequence's cache before this call's append.
    pub cache_seqlens: u64,
    /// u32 (batch, table_stride): page of each `page_size` keys of each sequence; 0 for a
    /// contiguous cache.
    pub block_table: u64,
    /// u32 per (batch·heads_kv, row tile), zero between launches: the one-launch split-KV
    /// kernel's arrival counters (`tile::global::SplitArrivals`); 0 for the other kernels.
    pub split_counters: u64,
    pub table_stride: u32,
    pub page_size: u32,
    pub batch: u32,
    pub heads_q: u32,
    pub heads_kv: u32,
    /// Query tokens per sequence (1 to `decode::config::MAX_QUERY_TOKENS`), the last positions of
    /// each sequence.
    pub q_tokens: u32,
    /// Keys appended by this call (added to every `cache_seqlens` entry).
    pub new_tokens: u32,
    pub head_dim: u32,
    /// Splits of the keys; split s covers keys [s·split_keys, (s + 1)·split_keys).
    pub splits: u32,
    pub split_keys: u32,
    /// 1: query token t sees key k iff k ≤ t + seqlen − q_tokens (bottom-right aligned).
    pub causal: u32,
    pub softmax_scale: f32,
    pub _pad: u32,
}
