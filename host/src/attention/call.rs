//! One call of attention, described once: Q, K, V, the form of the batch (dense, packed, or a
//! KV cache), and the options, the algorithm among them ([`Algorithm::Auto`] by default). The
//! description is checked once, when it is planned ([`Attention::plan`]); the plan then runs it
//! (`run`), as many times as the caller likes, with new addresses of the same shapes.
//!
//! ```text
//!  dense    q (batch, heads, seqlen_q, d)   k, v (batch, heads_kv, seqlen_k, d)
//!  packed   q (1, heads, total_q, d)        k, v (1, heads_kv, total_k, d)  + cu_seqlens (PackedBatch)
//!  cache    q (batch, heads, q_tokens, d)   k, v = the caches (batch, heads_kv, capacity, d) or
//!                                           (pages, heads_kv, page_size, d) + lengths, block table,
//!                                           keys and values to append (KvCache)
//! ```
//!
//! Every tensor is a [`TensorRef`]: any strides with a contiguous head dim, so PyTorch's
//! (batch, heads, seqlen, d) and flash-attn's (batch, seqlen, heads, d) both work without a copy.

use flash_kernels::common::params::Operands;

use super::alibi::AlibiSlopes;
use super::decode::{BlockTable, CacheSeqlens, DecodeOptions, DecodeProblem, DecodeShapes};
use super::dropout::Dropout;
use super::packed::{DeviceOffsets, PackedBatch, PackedOffsets};
use super::problem::{Algorithm, AttentionOptions, Problem};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::{RowsRef, TensorRef};

/// One attention call: the tensors, the form and the options. Build it with [`Attention::new`]
/// and the option methods, or set the public fields.
#[derive(Clone, Copy, Debug)]
pub struct Attention<'a, T> {
    pub q: TensorRef<'a, T>,
    pub k: TensorRef<'a, T>,
    pub v: TensorRef<'a, T>,
    pub form: Form<'a, T>,
    pub options: AttentionOptions,
}

/// How the batch is laid out.
#[derive(Clone, Copy, Debug)]
pub enum Form<'a, T> {
    /// Every sequence of the batch has seqlen_q queries and seqlen_k keys.
    Dense,
    /// Sequences of different lengths packed into batch-1 tensors (flash-attn's varlen call),
    /// their offsets on the host or on the device.
    Packed(PackedOffsets<'a>),
    /// 1–16 new query tokens per sequence against its KV cache (decoding).
    Cache(KvCache<'a, T>),
}

/// A KV cache: `Attention::k` and `v` are the caches; these say how much of each is filled, how
/// it is paged, and what this call appends first.
#[derive(Clone, Copy, Debug)]
pub struct KvCache<'a, T> {
    /// Keys in each sequence's cache before this call.
    pub seqlens: &'a CacheSeqlens,
    /// The pages of a paged cache (then k and v are (pages, heads_kv, page_size, d)).
    pub block_table: Option<&'a BlockTable>,
    /// New keys and values, (batch, heads_kv, new_tokens, d) each, written into the cache at
    /// each sequence's length before attending.
    pub append: Option<(TensorRef<'a, T>, TensorRef<'a, T>)>,
}

impl<'a, T: Element> Attention<'a, T> {
    /// Dense attention of `q` against `k`, `v` with the default options: no mask, scale
    /// 1/√head_dim, [`Algorithm::Auto`].
    pub fn new(
        q: impl Into<TensorRef<'a, T>>,
        k: impl Into<TensorRef<'a, T>>,
        v: impl Into<TensorRef<'a, T>>,
    ) -> Self {
        Self {
            q: q.into(),
            k: k.into(),
            v: v.into(),
            form: Form::Dense,
            options: AttentionOptions::default(),
        }
    }

    /// The causal mask, aligned to the bottom-right corner (query i sees key j iff
    /// j ≤ i + seqlen_k − seqlen_q).
    pub fn causal(mut self, causal: bool) -> Self {
        self.options.causal = causal;
        self
    }

    /// flash-attn's `window_size = (left, right)`; −1 leaves a side unbounded.
    pub fn window(mut self, left: i64, right: i64) -> Self {
        self.options.window = Some((left, right));
        self
    }

    /// Logit soft-capping: s becomes softcap·tanh(s / softcap); 0 is off.
    pub fn softcap(mut self, softcap: f32) -> Self {
        self.options.softcap = softcap;
        self
    }

    /// ALiBi: scores s = scale·q·k − slope·|i + seqlen_k − seqlen_q − j| with `slopes` (one
    /// per query head, or per sequence and head).
    pub fn alibi(mut self, slopes: AlibiSlopes) -> Self {
        self.options.alibi = Some(slopes);
        self
    }

    /// Dropout on the probabilities (`Dropout::new`: p and Philox's seed and offset; the
    /// backward takes the forward's).
    pub fn dropout(mut self, dropout: Option<Dropout>) -> Self {
        self.options.dropout = dropout;
        self
    }

    /// Multiplies Q·Kᵀ instead of 1/√head_dim.
    pub fn softmax_scale(mut self, scale: f32) -> Self {
        self.options.softmax_scale = Some(scale);
        self
    }

    /// The forward's kernel family (default [`Algorithm::Auto`]).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.options.algorithm = algorithm;
        self
    }

    /// The backward's kernel family (default [`Algorithm::Auto`]).
    pub fn backward_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.options.backward_algorithm = algorithm;
        self
    }

    /// dQ the same bits on every run of the backward.
    pub fn deterministic(mut self, deterministic: bool) -> Self {
        self.options.deterministic = deterministic;
        self
    }

    /// Every option at once.
    pub fn options(mut self, options: AttentionOptions) -> Self {
        self.options = options;
        self
    }

    /// A packed batch: q, k, v hold every sequence's rows (batch 1) and `batch` their offsets.
    pub fn packed(mut self, batch: &'a PackedBatch) -> Self {
        self.form = Form::Packed(PackedOffsets::Host(batch));
        self
    }

    /// A packed batch whose offsets stay in device memory (`offsets`): the kernels read them
    /// there, so the call waits for nothing on the host.
    pub fn packed_on_device(mut self, offsets: DeviceOffsets) -> Self {
        self.form = Form::Packed(PackedOffsets::Device(offsets));
        self
    }

    /// Decoding: k and v are the caches, `cache` their lengths, pages and appended keys.
    pub fn kv_cache(mut self, cache: KvCache<'a, T>) -> Self {
        self.form = Form::Cache(cache);
        self
    }

    /// Every check of the description that needs no device: shapes, strides, options, the
    /// form's offsets or cache. Errors name the argument and say what is allowed.
    pub(crate) fn check(&self) -> Result<Checked> {
        for (name, tensor) in self.inputs() {
            check_layout(name, tensor.dims(), tensor.strides())?;
        }
        let dims = [self.q.dims(), self.k.dims(), self.v.dims()];
        Ok(match self.form {
            Form::Dense => {
                Checked::Attention(Problem::new(dims[0], dims[1], dims[2], &self.options)?)
            }
            Form::Packed(batch) => Checked::Attention(batch.problem(dims, &self.options)?),
            Form::Cache(cache) => {
                if self.options.algorithm != Algorithm::Auto {
                    return Err(Error::invalid(
                        "algorithm",
                        self.options.algorithm,
                        "a KV-cache call runs the split-KV decode kernels: auto",
                    ));
                }
                if let Some((name, value)) = self.local_option() {
                    return Err(Error::invalid(
                        name,
                        value,
                        "decoding takes no window, soft-capping, ALiBi or dropout yet",
                    ));
                }
                let shapes = DecodeShapes {
                    q: dims[0],
                    k_cache: dims[1],
                    v_cache: dims[2],
                    new_kv: cache.append.map(|(k, v)| (k.dims(), v.dims())),
                    cache_seqlens: cache.seqlens.lengths(),
                    block_table: cache.block_table.map(BlockTable::pages),
                };
                let problem = DecodeProblem::new(T::DTYPE, &shapes, &self.decode_options())?;
                let mut rows = vec![("q", self.q), ("k_cache", self.k), ("v_cache", self.v)];
                if let Some((k, v)) = cache.append {
                    check_layout("k_new", k.dims(), k.strides())?;
                    check_layout("v_new", v.dims(), v.strides())?;
                    rows.extend([("k_new", k), ("v_new", v)]);
                }
                for (name, tensor) in rows {
                    super::decode::check_rows_aligned(name, tensor.strides())?;
                }
                Checked::Decode(problem)
            }
        })
    }

    /// The window, softcap, ALiBi slopes or dropout a call asks for, named for a refusal.
    fn local_option(&self) -> Option<(&'static str, String)> {
        match (
            self.options.window,
            self.options.softcap,
            self.options.alibi,
            self.options.dropout,
        ) {
            (Some((left, right)), _, _, _) if (left, right) != (-1, -1) => {
                Some(("window", format!("({left}, {right})")))
            }
            (_, softcap, _, _) if softcap != 0.0 => Some(("softcap", softcap.to_string())),
            (_, _, Some(slopes), _) => {
                Some(("alibi_slopes", format!("of shape {:?}", slopes.dims())))
            }
            (_, _, _, Some(dropout)) => Some(("dropout_p", dropout.p().to_string())),
            _ => None,
        }
    }

    /// The decode kernels' options, from the call's.
    pub(crate) fn decode_options(&self) -> DecodeOptions {
        DecodeOptions {
            causal: self.options.causal,
            softmax_scale: self.options.softmax_scale,
            splits: self.options.decode_splits,
            one_launch: self.options.decode_one_launch,
        }
    }

    /// Q, K, V by name (the caches' names for a KV-cache call).
    pub(crate) fn inputs(&self) -> [(&'static str, TensorRef<'a, T>); 3] {
        match self.form {
            Form::Cache(_) => [("q", self.q), ("k_cache", self.k), ("v_cache", self.v)],
            _ => [("q", self.q), ("k", self.k), ("v", self.v)],
        }
    }

    /// The kernels' operands: Q, K, V and `o`.
    pub(crate) fn operands(&self, o: &TensorRef<T>) -> Operands {
        Operands {
            q: self.q.view(),
            k: self.k.view(),
            v: self.v.view(),
            o: o.view(),
        }
    }

    /// What a plan must match to run this call: the dtype, every input's dims and strides, the
    /// options and the form (the packed offsets, the cache's lengths and pages).
    pub(crate) fn key(&self, checked: &Checked) -> CallKey {
        CallKey {
            layouts: self.inputs().map(|(_, t)| (t.dims(), t.strides())),
            append: match self.form {
                Form::Cache(KvCache {
                    append: Some((k, v)),
                    ..
                }) => Some([(k.dims(), k.strides()), (v.dims(), v.strides())]),
                _ => None,
            },
            packed: match self.form {
                Form::Packed(PackedOffsets::Host(batch)) => Some(PackedKey::Host(batch.clone())),
                Form::Packed(PackedOffsets::Device(offsets)) => Some(PackedKey::Device(offsets)),
                _ => None,
            },
            checked: checked.clone(),
            options: self.options,
        }
    }
}

/// A description that passed [`Attention::check`]: the problem the kernels solve.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Checked {
    /// Dense or packed attention (`Problem::packed` says which).
    Attention(Problem),
    /// Decoding against a KV cache.
    Decode(DecodeProblem),
}

/// The parts of a description a plan depends on; a plan runs only a call with the same key.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CallKey {
    layouts: [([usize; 4], [usize; 4]); 3],
    append: Option<[([usize; 4], [usize; 4]); 2]>,
    packed: Option<PackedKey>,
    checked: Checked,
    options: AttentionOptions,
}

/// A packed call's offsets, as its key holds them.
#[derive(Clone, Debug, PartialEq)]
enum PackedKey {
    Host(PackedBatch),
    Device(DeviceOffsets),
}

impl CallKey {
    /// Q's dims.
    pub(crate) fn q_dims(&self) -> [usize; 4] {
        self.layouts[0].0
    }
}

/// The head dim is contiguous (stride 1; a head dim of 1 always is) and every element's offset
/// fits in 64 bits.
pub(crate) fn check_layout(
    name: &'static str,
    dims: [usize; 4],
    strides: [usize; 4],
) -> Result<()> {
    if strides[3] != 1 && dims[3] != 1 {
        return Err(Error::invalid(
            name,
            format!("strides {strides:?}"),
            "the last dimension (head_dim) must be contiguous: stride 1",
        ));
    }
    if last_offset(dims, strides)
        .and_then(|l| l.checked_mul(8))
        .is_none()
    {
        return Err(Error::invalid(
            name,
            layout_words(dims, strides),
            "every element's offset must fit in 64 bits",
        ));
    }
    Ok(())
}

/// The offset in elements of a tensor's last element, if it fits in 64 bits.
fn last_offset(dims: [usize; 4], strides: [usize; 4]) -> Option<u64> {
    dims.iter().zip(strides).try_fold(0u64, |acc, (&n, s)| {
        (n.saturating_sub(1) as u64)
            .checked_mul(s as u64)
            .and_then(|x| x.checked_add(acc))
    })
}

/// A tensor's layout as an error names it.
fn layout_words(dims: [usize; 4], strides: [usize; 4]) -> String {
    format!("strides {strides:?} for dims {dims:?}")
}

/// A tensor a run reads or writes: a device address, non-null, element-aligned, whose last
/// element's address fits in 64 bits.
pub(crate) fn check_memory<T: Element>(name: &'static str, tensor: &TensorRef<T>) -> Result<()> {
    let element_bytes = T::DTYPE.size_bytes() as u64;
    check_address(name, tensor.address(), element_bytes)?;
    let last = last_offset(tensor.dims(), tensor.strides())
        .and_then(|last| last.checked_mul(element_bytes))
        .and_then(|bytes| bytes.checked_add(tensor.address()));
    if last.is_none() {
        return Err(Error::invalid(
            name,
            layout_words(tensor.dims(), tensor.strides()),
            "every element's address must fit in 64 bits",
        ));
    }
    Ok(())
}

/// A device address: non-null and a multiple of `align` bytes.
pub(crate) fn check_address(name: &'static str, address: u64, align: u64) -> Result<()> {
    if address == 0 || !address.is_multiple_of(align) {
        let what = if address == 0 {
            "a device address (a layout-only tensor plans a call but cannot run it)".to_string()
        } else {
            format!("a device address, a multiple of {align} bytes")
        };
        return Err(Error::invalid(name, format!("address {address:#x}"), what));
    }
    Ok(())
}

/// A tensor a run writes: `dims` as expected, and no two of its elements at one address (a
/// stride-0 or overlapping view would make the kernels race).
pub(crate) fn check_output<T: Element>(
    name: &'static str,
    tensor: &TensorRef<T>,
    dims: [usize; 4],
    of: &str,
) -> Result<()> {
    if tensor.dims() != dims {
        return Err(Error::invalid(
            name,
            format!("shape {:?}", tensor.dims()),
            format!("must equal {of}'s shape {dims:?}"),
        ));
    }
    check_memory(name, tensor)?;
    let mut axes: Vec<(usize, usize)> = tensor
        .strides()
        .into_iter()
        .zip(tensor.dims())
        .filter(|&(_, n)| n > 1)
        .collect();
    axes.sort_unstable();
    // Sorted by stride, each axis must step past everything the smaller ones span.
    let mut span = 1usize;
    for (stride, n) in axes {
        if stride < span {
            return Err(Error::invalid(
                name,
                layout_words(tensor.dims(), tensor.strides()),
                "an output whose elements do not overlap (no stride 0, no aliasing axes)",
            ));
        }
        span = stride.saturating_mul(n);
    }
    Ok(())
}

/// f32 rows of `dims`, contiguous, at an f32-aligned address whose last element fits in 64 bits.
pub(crate) fn check_rows(name: &'static str, rows: &RowsRef, dims: [usize; 3]) -> Result<()> {
    if rows.dims() != dims {
        return Err(Error::invalid(
            name,
            format!("shape {:?}", rows.dims()),
            format!("must be {dims:?}"),
        ));
    }
    check_address(name, rows.address(), std::mem::size_of::<f32>() as u64)?;
    let [_, h, n] = dims;
    let contiguous = [h * n, n, 1];
    if !(0..3).all(|i| dims[i] <= 1 || rows.strides()[i] == contiguous[i]) {
        return Err(Error::invalid(
            name,
            format!("strides {:?} for dims {dims:?}", rows.strides()),
            format!("contiguous f32 rows: strides {contiguous:?}"),
        ));
    }
    let fits = dims
        .iter()
        .try_fold(4u64, |acc, &n| acc.checked_mul(n as u64))
        .and_then(|bytes| bytes.checked_add(rows.address()));
    if fits.is_none() {
        return Err(Error::invalid(
            name,
            format!("dims {dims:?}"),
            "every element's address must fit in 64 bits",
        ));
    }
    Ok(())
}
