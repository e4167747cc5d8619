//! `flash_attn_rs._native`: the native half of the Python package, a thin user of the host
//! crate's front door ([`Attention`]). The Python half (`flash_attn_rs/__init__.py`) checks
//! PyTorch's tensors, allocates the outputs with PyTorch and passes addresses, dims, strides and
//! the current stream here as plain integers; this half describes the call once, has the host
//! check all of it without a device ([`Attention::check_forward`], [`Attention::check_backward`])
//! and only then opens the GPU and runs it on that stream ([`Attention::forward_into`],
//! [`Attention::backward_into`]).
//!
//! Two launches: `forward` (a dense batch, a packed one given the offsets: flash-attn's varlen
//! call, or a call against a KV cache given its lengths: flash-attn's `flash_attn_with_kvcache`)
//! and `backward`. The form of a forward's batch comes from optional keywords
//! ([`FormArguments`]).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use flash_attn::device::{GRAPH_CAPTURE_UNSUPPORTED, RawStream};
use flash_attn::{
    Algorithm, AlibiSlopes, Attention, AttentionOptions, BackwardTensors, BlockTable, CacheSeqlens,
    CompiledLimits, DType, DeviceOffsets, Dropout, Element, Error, ForwardTensors, Gpu, Gradients,
    KvCache, PackedBatch, Plan, RowsRef, Statistics, TensorRef,
};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A tensor as the Python half passes it: the address of element (0, 0, 0, 0), its dims
/// (batch, heads, seqlen, head_dim) and its strides in elements.
pub type TensorArgument = (u64, [usize; 4], [usize; 4]);

/// L as the Python half passes it: address, dims (batch, heads, seqlen_q), strides in elements.
pub type RowsArgument = (u64, [usize; 3], [usize; 3]);

/// Which Python exception a host error raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExceptionKind {
    /// An unsupported dtype.
    Type,
    /// Any other argument that is not allowed (the message names it).
    Value,
    /// No driver, no device, a device too old, a CUDA error, out of memory, or PyTorch's current
    /// stream capturing a CUDA graph (a state, not an argument the caller passed).
    Runtime,
}

pub fn exception_kind(error: &Error) -> ExceptionKind {
    match error {
        Error::InvalidArgument { name: "dtype", .. } => ExceptionKind::Type,
        Error::InvalidArgument { name: "stream", .. } => ExceptionKind::Runtime,
        Error::InvalidArgument { .. } => ExceptionKind::Value,
        _ => ExceptionKind::Runtime,
    }
}

fn to_py(error: Error) -> PyErr {
    let message = error.to_string();
    match exception_kind(&error) {
        ExceptionKind::Type => PyTypeError::new_err(message),
        ExceptionKind::Value => PyValueError::new_err(message),
        ExceptionKind::Runtime => PyRuntimeError::new_err(message),
    }
}

fn invalid(name: &'static str, value: impl std::fmt::Display, allowed: impl Into<String>) -> Error {
    Error::InvalidArgument {
        name,
        value: value.to_string(),
        allowed: allowed.into(),
    }
}

/// `algorithm = None`: the fastest for the device and the call, FA3 on compute capability 9.0
/// and FA2-TC elsewhere, each falling back where it cannot run (the plan says why).
pub const DEFAULT_ALGORITHM: Algorithm = Algorithm::Auto;

/// The algorithms that run a packed batch (the host's plan refuses the others, naming
/// `algorithm`; a test here keeps this list and the host's in step).
pub const PACKED_ALGORITHMS: [Algorithm; 3] = [Algorithm::Auto, Algorithm::Fa3, Algorithm::Fa2Tc];

/// How a call forms its scores: the scale, the causal mask, flash-attn's `window_size` (left,
/// right; −1 unbounded), `softcap` (0: off), `alibi_slopes` and dropout. The host crate checks
/// each (and names it).
#[derive(Clone, Copy, Debug, Default)]
pub struct Scores {
    pub softmax_scale: Option<f64>,
    pub causal: bool,
    pub window: Option<(i64, i64)>,
    pub softcap: f64,
    pub alibi_slopes: Option<AlibiSlopes>,
    pub dropout: Option<Dropout>,
}

/// Dropout as the Python half passes it: (p, Philox seed, Philox offset), the seed and offset
/// taken from PyTorch's CUDA generator.
type DropoutArgument = (f64, u64, u64);

/// ALiBi's slopes as the Python half passes them: the address of a contiguous float32 CUDA
/// tensor and its shape, (heads,) or (batch, heads).
type AlibiArgument = (u64, Vec<usize>);

impl Scores {
    /// The six keyword arguments of every call, as the Python half passes them.
    fn of(
        softmax_scale: Option<f64>,
        causal: bool,
        window: Option<(i64, i64)>,
        softcap: f64,
        alibi_slopes: Option<AlibiArgument>,
        dropout: Option<DropoutArgument>,
    ) -> flash_attn::Result<Self> {
        Ok(Self {
            softmax_scale,
            causal,
            window,
            softcap,
            // SAFETY: the Python half passes a live float32 CUDA tensor of the call's device with
            // these dims, kept alive by PyTorch until the work on the stream is done.
            alibi_slopes: alibi_slopes
                .map(|(address, dims)| unsafe { AlibiSlopes::new(address, &dims) })
                .transpose()?,
            // An f64 that is not a finite f32 in [0, 1) is refused by the check.
            dropout: match dropout {
                Some((p, seed, offset)) => Dropout::new(p as f32, seed, offset)?,
                None => None,
            },
        })
    }

    fn options(self) -> AttentionOptions {
        AttentionOptions {
            causal: self.causal,
            // An f64 that is not a finite f32 becomes ±∞ or NaN, which the checks reject.
            softmax_scale: self.softmax_scale.map(|s| s as f32),
            // (−1, −1) is no window; the check names a side below −1.
            window: self.window.filter(|&w| w != (-1, -1)),
            softcap: self.softcap as f32,
            alibi: self.alibi_slopes,
            dropout: self.dropout,
            ..Default::default()
        }
    }
}

/// An algorithm's name as Python passes it; None is [`DEFAULT_ALGORITHM`].
fn algorithm(name: Option<&str>) -> flash_attn::Result<Algorithm> {
    name.map_or(Ok(DEFAULT_ALGORITHM), str::parse)
}

/// A tensor of PyTorch's memory as the host takes it.
///
/// # Safety
///
/// As [`TensorRef::from_raw`] for a call that runs; a call that is only checked reads and writes
/// nothing, so any integers do.
unsafe fn tensor<'a, T: Element>((address, dims, strides): TensorArgument) -> TensorRef<'a, T> {
    // SAFETY: the caller's contract.
    unsafe { TensorRef::from_raw(address, dims, strides) }
}

/// Row statistics as the host takes them.
///
/// # Safety
///
/// As [`tensor`].
unsafe fn rows<'a>((address, dims, strides): RowsArgument) -> RowsRef<'a> {
    // SAFETY: the caller's contract.
    unsafe { RowsRef::from_raw(address, dims, strides) }
}

/// The row statistics a forward writes, as the Python half passes them: one address (L), or
/// two (FA1's m and l). Each is a contiguous f32 (batch, heads, seqlen_q) (q's first three
/// dims: for a packed batch (1, heads, total_q), flash-attn's (heads, total_q)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatisticsArgument {
    LogSumExp(u64),
    MaxAndSum { max: u64, sum: u64 },
}

impl StatisticsArgument {
    fn parse(addresses: &[u64]) -> flash_attn::Result<Self> {
        match *addresses {
            [lse] => Ok(Self::LogSumExp(lse)),
            [max, sum] => Ok(Self::MaxAndSum { max, sum }),
            _ => Err(invalid(
                "stats",
                format!("{} addresses", addresses.len()),
                "one (L) or two (FA1's m and l)",
            )),
        }
    }
}

/// The optional keywords of `forward` that say how the batch is laid out: none for a dense
/// batch, the four of flash-attn's varlen call for a packed one, `cache_seqlens` (with an
/// optional block table and keys and values to append) for a call against a KV cache.
#[derive(Clone, Debug, Default)]
pub struct FormArguments {
    /// The packed batch's offsets, ints from `cu_seqlens.tolist()` (read on the host).
    pub cu_seqlens_q: Option<Vec<i64>>,
    pub cu_seqlens_k: Option<Vec<i64>>,
    /// Or the offsets left on the GPU: the device addresses of `cu_seqlens_q` and
    /// `cu_seqlens_k` (int32, contiguous) and the number of sequences (one fewer than each
    /// holds); the kernels read them there, so nothing waits for the device.
    pub device_offsets: Option<(u64, u64, usize)>,
    /// flash-attn's bounds on the longest sequence, each checked against host offsets (device
    /// offsets are not read: the grid is sized by the bounds, as flash-attn's).
    pub max_seqlen_q: Option<usize>,
    pub max_seqlen_k: Option<usize>,
    /// Keys in each sequence's cache before the call (read on the host, uploaded per call).
    pub cache_seqlens: Option<Vec<i64>>,
    /// A paged cache's block table, one row of page numbers per sequence.
    pub block_table: Option<Vec<Vec<i64>>>,
    /// Keys and values to write into the cache at each sequence's length first.
    pub k_new: Option<TensorArgument>,
    pub v_new: Option<TensorArgument>,
}

/// A KV-cache call's bookkeeping, in the host's u32.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheArguments {
    pub seqlens: Vec<u32>,
    /// (batch, pages per sequence).
    pub block_table: Option<ndarray::Array2<u32>>,
    /// K and V to append, (batch, heads_kv, new_tokens, d) each.
    pub append: Option<(TensorArgument, TensorArgument)>,
}

/// The form of a forward's batch, parsed from its [`FormArguments`].
#[derive(Clone, Debug, PartialEq)]
pub enum Batch {
    /// Q (batch, heads, seqlen_q, d), K and V (batch, heads_kv, seqlen_k, d).
    Dense,
    /// Q (1, heads, total_q, d), K and V (1, heads_kv, total_k, d), the offsets and
    /// flash-attn's `max_seqlen_q`, `max_seqlen_k` (checked by [`ForwardCall::check`]).
    Packed {
        batch: PackedBatch,
        max_seqlens: [usize; 2],
    },
    /// The same with the offsets in device memory, unread (`max_seqlens` in `offsets`).
    PackedOnDevice(DeviceOffsets),
    /// Q (batch, heads, q_tokens, d) against the caches K and V (batch, heads_kv, capacity, d),
    /// or (pages, heads_kv, page_size, d) with a block table.
    Cache(CacheArguments),
}

/// Ints as the Python half passes them (from `.tolist()` or Python ints), in the host's u32;
/// an entry below 0 or past u32 is named with its index.
fn host_u32(name: &'static str, values: &[i64], allowed: &str) -> flash_attn::Result<Vec<u32>> {
    values
        .iter()
        .enumerate()
        .map(|(i, &value)| {
            u32::try_from(value)
                .map_err(|_| invalid(name, format!("entry {i} = {value}"), allowed.to_string()))
        })
        .collect()
}

/// Offsets as the Python half passes them (ints from `cu_seqlens.tolist()`) in the host's u32.
fn host_offsets(name: &'static str, offsets: &[i64]) -> flash_attn::Result<Vec<u32>> {
    host_u32(
        name,
        offsets,
        &format!("offsets from 0 to at most {}", u32::MAX),
    )
}

impl FormArguments {
    /// No keyword: a dense batch. The packed form takes all four: the offsets (checked by
    /// [`PackedBatch::new`]; their last entries against Q's and K's rows by the host's checks of
    /// the call) and `max_seqlen_q`, `max_seqlen_k` (checked against the offsets once the
    /// host has checked the call: [`check_max_seqlens`]).
    fn batch(&self) -> flash_attn::Result<Batch> {
        let given = [
            self.cu_seqlens_q.is_some() || self.device_offsets.is_some(),
            self.cu_seqlens_k.is_some() || self.device_offsets.is_some(),
            self.max_seqlen_q.is_some(),
            self.max_seqlen_k.is_some(),
        ];
        if self.cache_seqlens.is_some() {
            if let Some(name) = [
                "cu_seqlens_q",
                "cu_seqlens_k",
                "max_seqlen_q",
                "max_seqlen_k",
            ]
            .into_iter()
            .zip(given)
            .find_map(|(name, given)| given.then_some(name))
            {
                return Err(invalid(
                    name,
                    "given",
                    "None with cache_seqlens: a call against a KV cache is not a packed batch",
                ));
            }
            return self.cache().map(Batch::Cache);
        }
        for (name, given) in [
            ("block_table", self.block_table.is_some()),
            ("k_new", self.k_new.is_some()),
            ("v_new", self.v_new.is_some()),
        ] {
            if given {
                return Err(invalid(
                    name,
                    "given",
                    "None without cache_seqlens (it belongs to a call against a KV cache)",
                ));
            }
        }
        if !given.contains(&true) {
            return Ok(Batch::Dense);
        }
        let missing = |name| {
            invalid(
                name,
                "None",
                "a packed batch takes cu_seqlens_q, cu_seqlens_k, max_seqlen_q and max_seqlen_k \
                 together",
            )
        };
        let max_seqlen = |name, value: Option<usize>| value.ok_or_else(|| missing(name));
        let max_seqlens = [
            max_seqlen("max_seqlen_q", self.max_seqlen_q)?,
            max_seqlen("max_seqlen_k", self.max_seqlen_k)?,
        ];
        if let Some((cu_seqlens_q, cu_seqlens_k, sequences)) = self.device_offsets {
            if let Some(name) = [
                ("cu_seqlens_q", self.cu_seqlens_q.is_some()),
                ("cu_seqlens_k", self.cu_seqlens_k.is_some()),
            ]
            .into_iter()
            .find_map(|(name, given)| given.then_some(name))
            {
                return Err(invalid(
                    name,
                    "a list",
                    "None with device_offsets: the offsets are on the host or on the device",
                ));
            }
            // SAFETY: the Python half passes the addresses of live int32 CUDA tensors of
            // sequences + 1 entries each on the call's device (the module's contract: wrong
            // integers here are undefined behaviour).
            let offsets =
                unsafe { DeviceOffsets::new(cu_seqlens_q, cu_seqlens_k, sequences, max_seqlens)? };
            return Ok(Batch::PackedOnDevice(offsets));
        }
        let cu_seqlens_q = self
            .cu_seqlens_q
            .as_deref()
            .ok_or_else(|| missing("cu_seqlens_q"))?;
        let cu_seqlens_k = self
            .cu_seqlens_k
            .as_deref()
            .ok_or_else(|| missing("cu_seqlens_k"))?;
        let batch = PackedBatch::new(
            &host_offsets("cu_seqlens_q", cu_seqlens_q)?,
            &host_offsets("cu_seqlens_k", cu_seqlens_k)?,
        )?;
        Ok(Batch::Packed { batch, max_seqlens })
    }

    /// The KV-cache form: the lengths and the block table in u32 (the host's checks take their
    /// values against the caches' shapes), K and V to append together or neither.
    fn cache(&self) -> flash_attn::Result<CacheArguments> {
        let lengths = self.cache_seqlens.as_deref().unwrap_or_default();
        let seqlens = host_u32(
            "cache_seqlens",
            lengths,
            "lengths from 0 to the cache's capacity",
        )?;
        let block_table = self
            .block_table
            .as_deref()
            .map(|rows| {
                let width = rows.first().map_or(0, Vec::len);
                if let Some(b) = rows.iter().position(|row| row.len() != width) {
                    return Err(invalid(
                        "block_table",
                        format!("row {b} of {} entries, row 0 of {width}", rows[b].len()),
                        "rows of one length (batch, pages per sequence)",
                    ));
                }
                let entries = host_u32(
                    "block_table",
                    &rows.concat(),
                    "page numbers from 0 to the cache's pages",
                )?;
                ndarray::Array2::from_shape_vec((rows.len(), width), entries).map_err(|e| {
                    invalid("block_table", format!("{} rows", rows.len()), e.to_string())
                })
            })
            .transpose()?;
        let append = match (self.k_new, self.v_new) {
            (Some(k), Some(v)) => Some((k, v)),
            (None, None) => None,
            (k, _) => {
                let missing = if k.is_none() { "k_new" } else { "v_new" };
                return Err(invalid(
                    missing,
                    "None",
                    "k_new and v_new together (the keys and values to append)",
                ));
            }
        };
        Ok(CacheArguments {
            seqlens,
            block_table,
            append,
        })
    }
}

/// flash-attn's `max_seqlen_q` and `max_seqlen_k`, each at least its offsets' longest sequence:
/// flash-attn sizes its grid by them (the host sizes it by the longest sequence itself, which
/// the offsets give, so a larger bound costs nothing).
fn check_max_seqlens(batch: &PackedBatch, max_seqlens: [usize; 2]) -> flash_attn::Result<()> {
    for ((name, given), longest) in ["max_seqlen_q", "max_seqlen_k"]
        .into_iter()
        .zip(max_seqlens)
        .zip(batch.max_seqlens())
    {
        if given < longest {
            return Err(invalid(
                name,
                given,
                format!(
                    "at least the longest sequence in its offsets ({longest}): flash-attn \
                     sizes its grid by it, and a smaller one would leave rows unwritten"
                ),
            ));
        }
    }
    Ok(())
}

/// One forward call's arguments, parsed; [`ForwardCall::check`] checks them without a device.
#[derive(Clone, Debug)]
pub struct ForwardCall {
    pub dtype: DType,
    /// Q, K, V and O to write (Q's dims).
    pub tensors: [TensorArgument; 4],
    pub stats: StatisticsArgument,
    pub batch: Batch,
    pub options: AttentionOptions,
}

impl ForwardCall {
    /// Parses the arguments of `forward` (the dtype, the algorithm, the statistics' count, the
    /// form's keywords); the rest is [`ForwardCall::check`]'s.
    pub fn parse(
        dtype: &str,
        tensors: [TensorArgument; 4],
        stats: &[u64],
        algorithm_name: Option<&str>,
        scores: Scores,
        form: &FormArguments,
    ) -> flash_attn::Result<Self> {
        let dtype: DType = dtype.parse()?;
        let options = AttentionOptions {
            algorithm: algorithm(algorithm_name)?,
            ..scores.options()
        };
        let stats = StatisticsArgument::parse(stats)?;
        let batch = form.batch()?;
        if matches!(batch, Batch::Packed { .. } | Batch::PackedOnDevice(_)) && dtype == DType::F32 {
            return Err(invalid(
                "dtype",
                dtype,
                "f16 or bf16: packed batches run on tensor cores only",
            ));
        }
        if matches!(batch, Batch::Cache(_)) && dtype == DType::F32 {
            return Err(invalid(
                "dtype",
                dtype,
                "f16 or bf16: decoding against a KV cache runs on tensor cores only",
            ));
        }
        Ok(Self {
            dtype,
            tensors,
            stats,
            batch,
            options,
        })
    }

    /// Every check the run makes, without a device (the host plans for an H200), then a packed
    /// batch's `max_seqlen_q` and `max_seqlen_k`; returns that plan.
    pub fn check(&self) -> flash_attn::Result<Plan> {
        // SAFETY: without a device nothing reads or writes the memory (the host only checks the
        // addresses).
        let plan = flash_attn::with_element!(self.dtype, T => unsafe { self.run::<T>(None) })?;
        if let Batch::Packed { batch, max_seqlens } = &self.batch {
            check_max_seqlens(batch, *max_seqlens)?;
        }
        Ok(plan)
    }

    /// Runs the call on `gpu`'s stream (its plan made for that device); returns the plan. Call
    /// it after [`ForwardCall::check`] (the host's run repeats every check but the bounds').
    ///
    /// # Safety
    ///
    /// Every address is live device memory of `gpu`'s device, in its primary context, holding
    /// what its dims and strides reach until the work on the stream has finished; O and the
    /// statistics alias nothing else.
    unsafe fn launch(&self, gpu: &Gpu) -> flash_attn::Result<Plan> {
        // SAFETY: the caller's contract.
        flash_attn::with_element!(self.dtype, T => unsafe { self.run::<T>(Some(gpu)) })
    }

    /// # Safety
    ///
    /// With `gpu`: as [`ForwardCall::launch`].
    unsafe fn run<T: Element>(&self, gpu: Option<&Gpu>) -> flash_attn::Result<Plan> {
        let [batch, heads, rows_q, _] = self.tensors[0].1;
        let dims = [batch, heads, rows_q];
        let strides = [heads.saturating_mul(rows_q), rows_q, 1];
        // SAFETY: the caller's contract (without a device, nothing is read or written).
        let [q, k, v, o] = self.tensors.map(|t| unsafe { tensor::<T>(t) });
        let stats_rows = |address| unsafe { rows((address, dims, strides)) };
        let stats = match self.stats {
            StatisticsArgument::LogSumExp(lse) => Statistics::LogSumExp(stats_rows(lse)),
            StatisticsArgument::MaxAndSum { max, sum } => Statistics::MaxAndSum {
                max: stats_rows(max),
                sum: stats_rows(sum),
            },
        };
        // A KV cache's lengths and table: uploaded for a run, host copies for a check.
        let cache = match &self.batch {
            Batch::Cache(cache) => Some(cache_bookkeeping(cache, gpu)?),
            _ => None,
        };
        let mut call = Attention::new(q, k, v).options(self.options);
        match (&self.batch, &cache) {
            (Batch::Packed { batch, .. }, _) => call = call.packed(batch),
            (Batch::PackedOnDevice(offsets), _) => call = call.packed_on_device(*offsets),
            (Batch::Cache(arguments), Some((seqlens, block_table))) => {
                // SAFETY: as Q, K, V above.
                let append = arguments
                    .append
                    .map(|(k, v)| unsafe { (tensor::<T>(k), tensor::<T>(v)) });
                call = call.kv_cache(KvCache {
                    seqlens,
                    block_table: block_table.as_ref(),
                    append,
                });
            }
            _ => {}
        }
        let tensors = ForwardTensors { o, stats };
        match (gpu, &self.batch) {
            (Some(gpu), _) => call.forward_into(gpu, tensors),
            // The host checks a KV-cache call's outputs only as it runs it (with the lengths on
            // the device): here its plan, every other check, from the host's lengths.
            (None, Batch::Cache(_)) => call.plan(&CompiledLimits::H200),
            (None, _) => call.check_forward(tensors),
        }
    }
}

/// A KV-cache call's lengths and block table as the host takes them: on the device (uploaded on
/// `gpu`'s stream) for a run, on the host alone for a check.
fn cache_bookkeeping(
    cache: &CacheArguments,
    gpu: Option<&Gpu>,
) -> flash_attn::Result<(CacheSeqlens, Option<BlockTable>)> {
    let seqlens = match gpu {
        Some(gpu) => CacheSeqlens::new(gpu, &cache.seqlens)?,
        None => CacheSeqlens::host(&cache.seqlens)?,
    };
    let block_table = cache
        .block_table
        .as_ref()
        .map(|table| match gpu {
            Some(gpu) => BlockTable::new(gpu, table.view()),
            None => BlockTable::host(table.view()),
        })
        .transpose()?;
    Ok((seqlens, block_table))
}

/// One backward call's arguments, parsed; [`BackwardCall::check`] checks them without a device.
#[derive(Clone, Debug)]
pub struct BackwardCall {
    pub dtype: DType,
    /// The forward's Q, K, V and O.
    pub tensors: [TensorArgument; 4],
    /// The forward's L.
    pub lse: RowsArgument,
    pub d_o: TensorArgument,
    /// dQ, dK, dV to write.
    pub gradients: Gradients<TensorArgument>,
    /// Dense, or a packed batch (its offsets and flash-attn's bounds, as the forward's).
    pub batch: Batch,
    /// The forward's scores; the backward's algorithm and determinism.
    pub options: AttentionOptions,
}

impl BackwardCall {
    /// Parses the arguments of `backward` (the dtype, the algorithm, the packed form's
    /// keywords, as the forward's: `form` holds no KV-cache keyword); the rest is
    /// [`BackwardCall::check`]'s.
    #[allow(clippy::too_many_arguments)]
    pub fn parse(
        dtype: &str,
        tensors: [TensorArgument; 4],
        lse: RowsArgument,
        d_o: TensorArgument,
        [dq, dk, dv]: [TensorArgument; 3],
        scores: Scores,
        algorithm_name: Option<&str>,
        deterministic: bool,
        form: &FormArguments,
    ) -> flash_attn::Result<Self> {
        let dtype = dtype.parse()?;
        let batch = form.batch()?;
        let options = AttentionOptions {
            backward_algorithm: algorithm(algorithm_name)?,
            deterministic,
            ..scores.options()
        };
        Ok(Self {
            dtype,
            tensors,
            lse,
            d_o,
            gradients: Gradients { dq, dk, dv },
            batch,
            options,
        })
    }

    /// Every check the run makes, without a device (planned for an H200), a packed batch's
    /// bounds among them; returns that plan.
    pub fn check(&self) -> flash_attn::Result<Plan> {
        // SAFETY: as `ForwardCall::check`.
        let plan = flash_attn::with_element!(self.dtype, T => unsafe { self.run::<T>(None) })?;
        if let Batch::Packed { batch, max_seqlens } = &self.batch {
            check_max_seqlens(batch, *max_seqlens)?;
        }
        Ok(plan)
    }

    /// Runs the backward on `gpu`'s stream, writing dQ, dK, dV; returns the plan.
    ///
    /// # Safety
    ///
    /// As [`ForwardCall::launch`]; dQ, dK, dV alias nothing else.
    unsafe fn launch(&self, gpu: &Gpu) -> flash_attn::Result<Plan> {
        // SAFETY: the caller's contract.
        flash_attn::with_element!(self.dtype, T => unsafe { self.run::<T>(Some(gpu)) })
    }

    /// # Safety
    ///
    /// With `gpu`: as [`BackwardCall::launch`].
    unsafe fn run<T: Element>(&self, gpu: Option<&Gpu>) -> flash_attn::Result<Plan> {
        // SAFETY: the caller's contract (without a device, nothing is read or written).
        let [q, k, v, o] = self.tensors.map(|t| unsafe { tensor::<T>(t) });
        let [d_o, dq, dk, dv] = [
            self.d_o,
            self.gradients.dq,
            self.gradients.dk,
            self.gradients.dv,
        ]
        .map(|t| unsafe { tensor::<T>(t) });
        let tensors = BackwardTensors {
            o,
            logsumexp: unsafe { rows(self.lse) },
            d_o,
            gradients: Gradients { dq, dk, dv },
        };
        let mut call = Attention::new(q, k, v).options(self.options);
        match &self.batch {
            Batch::Packed { batch, .. } => call = call.packed(batch),
            Batch::PackedOnDevice(offsets) => call = call.packed_on_device(*offsets),
            _ => {}
        }
        match gpu {
            Some(gpu) => call.backward_into(gpu, tensors),
            None => call.check_backward(tensors),
        }
    }
}

/// Checks the arguments (raising before anything is launched or a device opened), then runs the
/// forward on device `device` on stream `stream` (`torch.cuda.current_stream(device).cuda_stream`)
/// and returns its plan as one line; without `device`, only checks (returns None; no GPU needed).
/// `stats` is `[lse]`, or `[m, l]` for FA1: contiguous f32 (batch, heads, seqlen_q), q's first
/// three dims. `algorithm` is one of `ALGORITHMS` (None: "auto"); `window` is flash-attn's
/// `window_size`, `softcap` its `softcap`, `alibi_slopes` (address, dims) its `alibi_slopes`,
/// `dropout` (p, Philox seed, Philox offset) its `dropout_p` with PyTorch's generator state.
///
/// The batch's form comes from the optional keywords: none for a dense batch; for a packed one
/// (flash-attn's varlen call) all four of `cu_seqlens_q`, `cu_seqlens_k` (the offsets, as
/// lists), `max_seqlen_q`, `max_seqlen_k` (checked against them), with q, k, v, o the packed
/// (total, heads, d) tensors viewed as (1, heads, total, d) and L (1, heads, total_q); for a
/// call against a KV cache (flash-attn's `flash_attn_with_kvcache`) `cache_seqlens` (a list,
/// uploaded per call), optionally `block_table` (rows of page numbers: k and v are then the
/// pages, (pages, heads_kv, page_size, d)) and `k_new`, `v_new` (written into the caches first),
/// with k and v the caches and `num_splits` the split-KV count (None or 0: the plan's).
///
/// Private: `flash_attn_rs`'s functions derive every integer from live tensors; wrong integers
/// here are undefined behaviour.
#[pyfunction]
#[pyo3(signature = (
    *, dtype, q, k, v, o, stats, algorithm=None, softmax_scale=None, causal=false, window=None,
    softcap=0.0, alibi_slopes=None, dropout=None, cu_seqlens_q=None, cu_seqlens_k=None,
    device_offsets=None, max_seqlen_q=None, max_seqlen_k=None, cache_seqlens=None, block_table=None, k_new=None, v_new=None,
    num_splits=None, device=None, stream=0,
))]
#[allow(clippy::too_many_arguments)]
fn forward(
    py: Python<'_>,
    dtype: &str,
    q: TensorArgument,
    k: TensorArgument,
    v: TensorArgument,
    o: TensorArgument,
    stats: Vec<u64>,
    algorithm: Option<&str>,
    softmax_scale: Option<f64>,
    causal: bool,
    window: Option<(i64, i64)>,
    softcap: f64,
    alibi_slopes: Option<AlibiArgument>,
    dropout: Option<DropoutArgument>,
    cu_seqlens_q: Option<Vec<i64>>,
    cu_seqlens_k: Option<Vec<i64>>,
    device_offsets: Option<(u64, u64, usize)>,
    max_seqlen_q: Option<usize>,
    max_seqlen_k: Option<usize>,
    cache_seqlens: Option<Vec<i64>>,
    block_table: Option<Vec<Vec<i64>>>,
    k_new: Option<TensorArgument>,
    v_new: Option<TensorArgument>,
    num_splits: Option<u32>,
    device: Option<usize>,
    stream: usize,
) -> PyResult<Option<String>> {
    let form = FormArguments {
        cu_seqlens_q,
        cu_seqlens_k,
        device_offsets,
        max_seqlen_q,
        max_seqlen_k,
        cache_seqlens,
        block_table,
        k_new,
        v_new,
    };
    let scores = Scores::of(
        softmax_scale,
        causal,
        window,
        softcap,
        alibi_slopes,
        dropout,
    )
    .map_err(to_py)?;
    let mut call =
        ForwardCall::parse(dtype, [q, k, v, o], &stats, algorithm, scores, &form).map_err(to_py)?;
    // flash-attn's `num_splits`: 0 (or None) lets the plan choose the split-KV count.
    call.options.decode_splits = num_splits.filter(|&n| n > 0);
    call.check().map_err(to_py)?;
    // SAFETY: the Python half passes live CUDA tensors of device `device` (checked there: one
    // device for all), which PyTorch keeps allocated until the work on their stream is done, O
    // and the statistics fresh ones, and that device's current stream, a stream of its primary
    // context.
    unsafe { launch_on(py, device, StreamHandle(stream), |gpu| call.launch(gpu)) }
}

/// Checks the arguments (raising before anything is launched or a device opened), then runs the
/// backward on device `device` on stream `stream`, writing dq, dk, dv, and returns its plan as
/// one line; without `device`, only checks. `lse` is the forward's L (address, dims, strides).
/// `algorithm` is the backward's (None: "auto", fa3 falling back to fa2-tc, then fa2; or fa3,
/// fa2-tc, fa2, standard), `deterministic` makes dQ bitwise reproducible; `window`, `softcap`,
/// `alibi_slopes` and `dropout` (p, seed, offset) are the forward's. A packed batch takes the forward's four keywords (`cu_seqlens_q`,
/// `cu_seqlens_k` as lists, `max_seqlen_q`, `max_seqlen_k`), with every tensor the packed
/// (total, heads, d) one viewed as (1, heads, total, d) and L (1, heads, total_q). Private,
/// like `forward`.
#[pyfunction]
#[pyo3(signature = (
    *, dtype, q, k, v, o, lse, d_o, dq, dk, dv, softmax_scale=None, causal=false, window=None,
    softcap=0.0, alibi_slopes=None, dropout=None, algorithm=None, deterministic=false,
    cu_seqlens_q=None, cu_seqlens_k=None,
    device_offsets=None, max_seqlen_q=None, max_seqlen_k=None, device=None, stream=0,
))]
#[allow(clippy::too_many_arguments)]
fn backward(
    py: Python<'_>,
    dtype: &str,
    q: TensorArgument,
    k: TensorArgument,
    v: TensorArgument,
    o: TensorArgument,
    lse: RowsArgument,
    d_o: TensorArgument,
    dq: TensorArgument,
    dk: TensorArgument,
    dv: TensorArgument,
    softmax_scale: Option<f64>,
    causal: bool,
    window: Option<(i64, i64)>,
    softcap: f64,
    alibi_slopes: Option<AlibiArgument>,
    dropout: Option<DropoutArgument>,
    algorithm: Option<&str>,
    deterministic: bool,
    cu_seqlens_q: Option<Vec<i64>>,
    cu_seqlens_k: Option<Vec<i64>>,
    device_offsets: Option<(u64, u64, usize)>,
    max_seqlen_q: Option<usize>,
    max_seqlen_k: Option<usize>,
    device: Option<usize>,
    stream: usize,
) -> PyResult<Option<String>> {
    let form = FormArguments {
        cu_seqlens_q,
        cu_seqlens_k,
        device_offsets,
        max_seqlen_q,
        max_seqlen_k,
        ..FormArguments::default()
    };
    let call = BackwardCall::parse(
        dtype,
        [q, k, v, o],
        lse,
        d_o,
        [dq, dk, dv],
        Scores::of(
            softmax_scale,
            causal,
            window,
            softcap,
            alibi_slopes,
            dropout,
        )
        .map_err(to_py)?,
        algorithm,
        deterministic,
        &form,
    )
    .map_err(to_py)?;
    call.check().map_err(to_py)?;
    // SAFETY: as `forward`; dq, dk, dv are fresh PyTorch tensors that alias nothing.
    unsafe { launch_on(py, device, StreamHandle(stream), |gpu| call.launch(gpu)) }
}

/// One open GPU per device ordinal, kept for the process: opening loads the kernel modules.
static GPUS: LazyLock<Mutex<HashMap<usize, Gpu>>> = LazyLock::new(Default::default);

/// Opens (once) device `ordinal`, points it at `stream` and runs `work` on it.
///
/// # Safety
///
/// `stream` is a live stream of the device's primary context, and `work` launches only on
/// memory that stays valid until the work sent to that stream has finished.
unsafe fn on_device<R>(
    ordinal: usize,
    stream: RawStream,
    work: impl FnOnce(&Gpu) -> flash_attn::Result<R>,
) -> flash_attn::Result<R> {
    let mut gpus = GPUS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let gpu = match gpus.entry(ordinal) {
        std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
        std::collections::hash_map::Entry::Vacant(entry) => entry.insert(Gpu::open(ordinal)?),
    };
    // SAFETY: the caller's contract.
    unsafe { gpu.use_borrowed_stream(stream)? };
    work(gpu)
}

/// A stream handle as Python passes it (`torch.cuda.Stream.cuda_stream`, an int), sendable
/// across the GIL release.
#[derive(Clone, Copy)]
struct StreamHandle(usize);

impl StreamHandle {
    fn raw(self) -> RawStream {
        self.0 as RawStream
    }
}

/// Runs `work` on `device` (if given) without the GIL (the first call opens the device: loads and
/// JIT-compiles the modules) and returns its plan's line.
///
/// # Safety
///
/// As [`on_device`].
unsafe fn launch_on<P: std::fmt::Display + Send>(
    py: Python<'_>,
    device: Option<usize>,
    stream: StreamHandle,
    work: impl FnOnce(&Gpu) -> flash_attn::Result<P> + Send,
) -> PyResult<Option<String>> {
    let Some(device) = device else {
        return Ok(None);
    };
    // SAFETY: the caller's contract.
    py.detach(|| unsafe { on_device(device, stream.raw(), work) })
        .map(|plan| Some(plan.to_string()))
        .map_err(to_py)
}

/// The most device memory this library's own allocations (workspace: the backward's D and dQ
/// accumulator, standard attention's S and P, FA1's accumulator) held at once on device `device`
/// since the last `reset_workspace_peak`, in bytes; 0 before the device was first used. PyTorch's
/// `max_memory_allocated` does not see these.
#[pyfunction]
fn workspace_peak_bytes(device: usize) -> PyResult<u64> {
    let gpus = GPUS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    gpus.get(&device)
        .map_or(Ok(0), Gpu::peak_memory)
        .map_err(to_py)
}

/// Starts a new `workspace_peak_bytes` measurement on device `device` (nothing before its first
/// use).
#[pyfunction]
fn reset_workspace_peak(device: usize) -> PyResult<()> {
    let gpus = GPUS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    gpus.get(&device)
        .map_or(Ok(()), Gpu::reset_peak_memory)
        .map_err(to_py)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(forward, m)?)?;
    m.add_function(wrap_pyfunction!(backward, m)?)?;
    m.add_function(wrap_pyfunction!(workspace_peak_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(reset_workspace_peak, m)?)?;
    m.add("DEFAULT_ALGORITHM", DEFAULT_ALGORITHM.name())?;
    m.add("ALGORITHMS", Algorithm::ALL.map(Algorithm::name).to_vec())?;
    m.add(
        "PACKED_ALGORITHMS",
        PACKED_ALGORITHMS.map(Algorithm::name).to_vec(),
    )?;
    m.add("GRAPH_CAPTURE_UNSUPPORTED", GRAPH_CAPTURE_UNSUPPORTED)?;
    // The head dims fa2-tc's forward is compiled for: the Python half pads another head dim to
    // the next of them where fa2-tc runs it.
    m.add(
        "FA2_TC_HEAD_DIMS",
        flash_attn::attention::plan::fa2_tc_head_dims(),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x7f00_0000_0000;

    fn sdpa(address: u64, [b, h, s, d]: [usize; 4]) -> TensorArgument {
        (address, [b, h, s, d], [h * s * d, s * d, d, 1])
    }

    /// The name and exception kind of a refused call.
    fn rejected<R: std::fmt::Debug>(
        result: flash_attn::Result<R>,
    ) -> (&'static str, ExceptionKind) {
        let error = result.expect_err("expected an error");
        let kind = exception_kind(&error);
        match error {
            Error::InvalidArgument { name, .. } => (name, kind),
            other => panic!("expected an invalid argument, got {other:?}"),
        }
    }

    /// A dense forward on (1, 2, 16, 64) tensors, parsed and checked (no device).
    fn forward_with(
        dtype: &str,
        algorithm: Option<&str>,
        stats: &[u64],
        scores: Scores,
    ) -> flash_attn::Result<(ForwardCall, Plan)> {
        let t = |i: u64| sdpa(BASE + (i << 30), [1, 2, 16, 64]);
        let form = FormArguments::default();
        let call = ForwardCall::parse(
            dtype,
            [t(0), t(1), t(2), t(3)],
            stats,
            algorithm,
            scores,
            &form,
        )?;
        let plan = call.check()?;
        Ok((call, plan))
    }

    fn causal() -> Scores {
        Scores {
            causal: true,
            ..Default::default()
        }
    }

    fn kind(result: flash_attn::Result<(ForwardCall, Plan)>) -> ExceptionKind {
        exception_kind(&result.expect_err("expected an error"))
    }

    /// None is auto: FA3 on an H200 (the plan made without a device); for f32, which FA3 and
    /// FA2-TC cannot run, FA2, and the plan says why.
    #[test]
    fn defaults_to_auto_which_runs_fa3_on_hopper_and_says_why_it_falls_back() {
        let lse = [BASE + (4 << 30)];
        let (call, plan) = forward_with("bf16", None, &lse, causal()).expect("valid");
        assert_eq!(call.options.algorithm, Algorithm::Auto);
        assert_eq!(call.batch, Batch::Dense);
        assert!(call.options.causal);
        assert!(plan.to_string().starts_with("auto:"), "{plan}");
        assert!(
            plan.kernel_names().starts_with("fa3_forward_bf16_d64"),
            "{plan}"
        );
        assert_eq!(plan.fallback(), None);
        let (_, plan) = forward_with("f32", None, &lse, causal()).expect("valid");
        let why = plan.fallback().expect("f32 falls back");
        assert!(why.contains("fa3 falls back to fa2-tc"), "{why}");
    }

    /// Every name in `ALGORITHMS` reaches the host, whose plan names it.
    #[test]
    fn every_algorithm_is_planned_by_the_host() {
        let (lse, m_and_l) = ([BASE + (4 << 30)], [BASE + (4 << 30), BASE + (5 << 30)]);
        for algorithm in Algorithm::ALL {
            let stats: &[u64] = if algorithm == Algorithm::Fa1 {
                &m_and_l
            } else {
                &lse
            };
            let (call, plan) = forward_with("f16", Some(algorithm.name()), stats, causal())
                .unwrap_or_else(|e| panic!("{algorithm}: {e}"));
            assert_eq!(call.options.algorithm, algorithm);
            assert!(
                plan.to_string().starts_with(&format!("{algorithm}:")),
                "{plan}"
            );
        }
    }

    #[test]
    fn a_bad_dtype_is_a_type_error_and_the_rest_value_errors() {
        let lse = [BASE + (4 << 30)];
        let forward =
            |dtype, algorithm, stats: &[u64]| forward_with(dtype, algorithm, stats, causal());
        assert_eq!(kind(forward("f64", None, &lse)), ExceptionKind::Type);
        assert_eq!(
            rejected(forward("f16", Some("fa4"), &lse)),
            ("algorithm", ExceptionKind::Value)
        );
        assert_eq!(
            rejected(forward("f16", Some("fa1"), &lse)),
            ("stats", ExceptionKind::Value)
        );
        assert_eq!(
            rejected(forward("f16", None, &[])),
            ("stats", ExceptionKind::Value)
        );
        assert_eq!(
            rejected(forward("f16", None, &[0])),
            ("lse", ExceptionKind::Value)
        );
        assert!(forward("f32", Some("fa1"), &[lse[0], lse[0] + 4096]).is_ok());
    }

    /// Q, K, V and O go through the host's checks of the call before any device is opened, each
    /// error naming its tensor.
    #[test]
    fn tensors_are_checked_without_a_device() {
        let t = |i: u64| sdpa(BASE + (i << 30), [1, 2, 16, 64]);
        let lse = [BASE + (4 << 30)];
        let check = |tensors| {
            let form = FormArguments::default();
            ForwardCall::parse("bf16", tensors, &lse, None, causal(), &form)?.check()
        };
        let (q, k, v, o) = (t(0), t(1), t(2), t(3));
        let cases = [
            ("q", [(0, q.1, q.2), k, v, o]),
            ("k", [q, (k.0, k.1, [2048, 1024, 64, 2]), v, o]),
            ("v", [q, k, (v.0 + 1, v.1, v.2), o]),
            ("o", [q, k, v, (o.0, [1, 2, 8, 64], o.2)]),
            ("o", [q, k, v, (o.0, o.1, [0, 0, 0, 1])]),
            (
                "head_dim",
                [q, k, v, o].map(|t| (t.0, [1, 2, 16, 300], [9600, 4800, 300, 1])),
            ),
        ];
        for (name, tensors) in cases {
            assert_eq!(
                rejected(check(tensors)),
                (name, ExceptionKind::Value),
                "{name}"
            );
        }
    }

    /// A window and soft-capping reach the forward's and the backward's options ((−1, −1) is
    /// none); in f32, which no tensor-core backward takes, the backward names them.
    #[test]
    fn windows_and_softcap_reach_the_forward_and_the_backward() {
        let lse = [BASE + (4 << 30)];
        let scores = Scores {
            causal: true,
            window: Some((8, 0)),
            softcap: 30.0,
            ..Default::default()
        };
        let (call, _) = forward_with("bf16", None, &lse, scores).expect("valid");
        assert_eq!(call.options.window, Some((8, 0)));
        assert_eq!(call.options.softcap, 30.0);
        let unbounded = Scores {
            window: Some((-1, -1)),
            ..Default::default()
        };
        let (call, _) = forward_with("bf16", None, &lse, unbounded).expect("valid");
        assert_eq!(call.options.window, None);
        let bad = Scores {
            window: Some((-2, 0)),
            ..Default::default()
        };
        assert_eq!(
            rejected(forward_with("bf16", None, &lse, bad)),
            ("window", ExceptionKind::Value)
        );
        for (window, softcap, name) in [(Some((8, 0)), 0.0, "window"), (None, 5.0, "softcap")] {
            let scores = Scores {
                window,
                softcap,
                ..Default::default()
            };
            let (call, plan) = backward_with("bf16", scores, None, |_, _| {}).expect("valid");
            assert_eq!(
                (call.options.window, call.options.softcap),
                (window, softcap as f32)
            );
            assert!(plan.to_string().contains("_local"), "{plan}");
            let result = backward_with("f32", scores, None, |_, _| {});
            assert_eq!(rejected(result), (name, ExceptionKind::Value));
        }
    }

    #[test]
    fn device_errors_and_a_capturing_stream_are_runtime_errors() {
        assert_eq!(exception_kind(&Error::NoDriver), ExceptionKind::Runtime);
        let capturing = Error::InvalidArgument {
            name: "stream",
            value: "a stream capturing a CUDA graph".into(),
            allowed: GRAPH_CAPTURE_UNSUPPORTED.into(),
        };
        assert_eq!(exception_kind(&capturing), ExceptionKind::Runtime);
    }

    /// Edits one argument of a backward call: its tensors (q, k, v, o, d_o, dq, dk, dv) or L.
    type Edit = fn(&mut [TensorArgument; 8], &mut RowsArgument);

    /// A backward call on (1, 2, 16, 64) Q and (1, 2, 24, 64) K, V, parsed and checked (no
    /// device); `edit` changes one argument.
    fn backward_with(
        dtype: &str,
        scores: Scores,
        algorithm: Option<&str>,
        edit: impl FnOnce(&mut [TensorArgument; 8], &mut RowsArgument),
    ) -> flash_attn::Result<(BackwardCall, Plan)> {
        let (q_dims, kv_dims) = ([1, 2, 16, 64], [1, 2, 24, 64]);
        let t = |i: u64, dims| sdpa(BASE + (i << 30), dims);
        // q, k, v, o, d_o, dq, dk, dv
        let mut tensors = [
            t(0, q_dims),
            t(1, kv_dims),
            t(2, kv_dims),
            t(3, q_dims),
            t(4, q_dims),
            t(5, q_dims),
            t(6, kv_dims),
            t(7, kv_dims),
        ];
        let mut lse = (BASE + (8 << 30), [1, 2, 16], [32, 16, 1]);
        edit(&mut tensors, &mut lse);
        let [q, k, v, o, d_o, dq, dk, dv] = tensors;
        let call = BackwardCall::parse(
            dtype,
            [q, k, v, o],
            lse,
            d_o,
            [dq, dk, dv],
            scores,
            algorithm,
            algorithm == Some("fa2-tc"),
            &FormArguments::default(),
        )?;
        let plan = call.check()?;
        Ok((call, plan))
    }

    #[test]
    fn backward_accepts_a_valid_call_and_plans_fa3_by_default() {
        let (call, plan) = backward_with("f16", causal(), None, |_, _| {}).expect("valid");
        assert!(call.options.causal);
        assert_eq!(call.options.backward_algorithm, Algorithm::Auto);
        assert_eq!(call.lse.1, [1, 2, 16]);
        assert!(plan.to_string().starts_with("fa3 backward:"), "{plan}");
        // The algorithm asked for, deterministic (set with fa2-tc by `backward_with`).
        let (call, plan) =
            backward_with("f16", causal(), Some("fa2-tc"), |_, _| {}).expect("valid");
        assert!(call.options.deterministic);
        let line = plan.to_string();
        assert!(
            line.starts_with("fa2-tc backward:") && line.contains("deterministic"),
            "{line}"
        );
    }

    #[test]
    fn backward_errors_name_the_argument() {
        let cases: [(&str, Edit); 5] = [
            ("d_o", |t, _| t[4].2[3] = 2),
            ("dk", |t, _| t[6].1[2] = 16),
            ("dq", |t, _| t[5].2 = [0, 0, 0, 1]),
            ("logsumexp", |_, l| l.1 = [1, 2, 24]),
            ("logsumexp", |_, l| l.2 = [16, 1, 2]),
        ];
        for (name, edit) in cases {
            assert_eq!(
                rejected(backward_with("bf16", causal(), None, edit)),
                (name, ExceptionKind::Value),
                "{name}"
            );
        }
        assert_eq!(
            rejected(backward_with("f64", causal(), None, |_, _| {})),
            ("dtype", ExceptionKind::Type)
        );
        assert_eq!(
            rejected(backward_with("bf16", causal(), Some("fa4"), |_, _| {})),
            ("algorithm", ExceptionKind::Value)
        );
        assert_eq!(
            rejected(backward_with("bf16", causal(), Some("fa1"), |_, _| {})),
            ("backward_algorithm", ExceptionKind::Value)
        );
    }

    /// A packed call on flash-attn's (total, heads, d) storage viewed as (1, heads, total, d):
    /// three sequences of 5, 0 and 11 queries on 7, 3 and 9 keys, 4 query heads on `heads_kv`.
    struct PackedCase {
        dtype: &'static str,
        heads_kv: usize,
        form: FormArguments,
        algorithm: Option<&'static str>,
        scores: Scores,
        lse: u64,
    }

    impl Default for PackedCase {
        fn default() -> Self {
            Self {
                dtype: "bf16",
                heads_kv: 2,
                form: FormArguments {
                    cu_seqlens_q: Some(vec![0, 5, 5, 16]),
                    cu_seqlens_k: Some(vec![0, 7, 10, 19]),
                    max_seqlen_q: Some(11),
                    max_seqlen_k: Some(9),
                    ..Default::default()
                },
                algorithm: None,
                scores: Scores::default(),
                lse: BASE + (4 << 30),
            }
        }
    }

    fn packed(address: u64, [total, heads, d]: [usize; 3]) -> TensorArgument {
        (
            address,
            [1, heads, total, d],
            [total * heads * d, d, heads * d, 1],
        )
    }

    impl PackedCase {
        fn tensors(&self) -> [TensorArgument; 4] {
            let (total_q, total_k) = (16, 19);
            let kv = |i: u64| packed(BASE + (i << 30), [total_k, self.heads_kv, 64]);
            [
                packed(BASE, [total_q, 4, 64]),
                kv(1),
                kv(2),
                packed(BASE + (3 << 30), [total_q, 4, 64]),
            ]
        }

        fn check_with(
            &self,
            tensors: [TensorArgument; 4],
        ) -> flash_attn::Result<(ForwardCall, Plan)> {
            let call = ForwardCall::parse(
                self.dtype,
                tensors,
                &[self.lse],
                self.algorithm,
                self.scores,
                &self.form,
            )?;
            let plan = call.check()?;
            Ok((call, plan))
        }

        fn check(&self) -> flash_attn::Result<(ForwardCall, Plan)> {
            self.check_with(self.tensors())
        }
    }

    impl PackedCase {
        /// The backward of this packed call: dO, dQ, dK, dV in gibibytes 5 to 8.
        fn backward(&self) -> flash_attn::Result<(BackwardCall, Plan)> {
            let [q, k, v, o] = self.tensors();
            let at = |i: u64, t: TensorArgument| (BASE + (i << 30), t.1, t.2);
            let call = BackwardCall::parse(
                self.dtype,
                [q, k, v, o],
                (self.lse, [1, 4, 16], [64, 16, 1]),
                at(5, q),
                [at(6, q), at(7, k), at(8, v)],
                self.scores,
                self.algorithm,
                false,
                &self.form,
            )?;
            let plan = call.check()?;
            Ok((call, plan))
        }
    }

    #[test]
    fn packed_backward_runs_the_varlen_kernels_and_checks_the_bounds() {
        let (call, plan) = PackedCase::default().backward().expect("valid");
        assert!(matches!(call.batch, Batch::Packed { .. }));
        let line = plan.to_string();
        assert!(
            line.starts_with("fa3 backward:") && line.contains("_varlen"),
            "{line}"
        );
        // A bound below the longest sequence is named, as in the forward.
        let mut short = PackedCase::default();
        short.form.max_seqlen_k = Some(8);
        assert_eq!(
            rejected(short.backward()),
            ("max_seqlen_k", ExceptionKind::Value)
        );
        // The scalar backward takes no packed batch.
        let scalar = PackedCase {
            algorithm: Some("fa2"),
            ..Default::default()
        };
        assert_eq!(rejected(scalar.backward()), ("form", ExceptionKind::Value));
    }

    /// The same call with its offsets left on the GPU: only their addresses and count reach
    /// the host, whose grid takes the caller's bounds (at most the tensors' rows).
    fn on_device(case: &mut PackedCase) {
        case.form.cu_seqlens_q = None;
        case.form.cu_seqlens_k = None;
        case.form.device_offsets = Some((BASE + (9 << 30), BASE + (10 << 30), 3));
    }

    #[test]
    fn offsets_on_the_device_are_planned_from_the_bounds_forward_and_backward() {
        let mut case = PackedCase::default();
        on_device(&mut case);
        let (call, plan) = case.check().expect("valid");
        assert!(matches!(call.batch, Batch::PackedOnDevice(_)));
        assert!(plan.kernel_names().contains("_varlen"), "{plan}");
        // Three sequences of four heads; rows by the bound on the longest (11 of B_r = 128).
        assert!(plan.to_string().contains("grid (1, 12, 1)"), "{plan}");
        assert_eq!(plan.statistics_dims(), [1, 4, 16]);
        let (_, plan) = case.backward().expect("valid");
        assert!(plan.kernel_names().contains("_varlen"), "{plan}");
        // A bound below the longest sequence cannot be seen without reading the offsets: the
        // kernels cut that sequence to it. One above the rows is cut to the rows.
        case.form.max_seqlen_q = Some(1);
        case.form.max_seqlen_k = Some(1 << 40);
        let (_, plan) = case
            .check()
            .expect("bounds are not checked against device offsets");
        let problem = plan.problem().expect("attention");
        assert_eq!((problem.seqlen_q, problem.seqlen_k), (1, 19));
    }

    #[test]
    fn offsets_on_the_device_are_refused_with_lists_without_bounds_or_at_bad_addresses() {
        let cases: [(&str, PackedEdit); 6] = [
            ("cu_seqlens_q", |c| c.form.cu_seqlens_q = Some(vec![0, 16])),
            ("cu_seqlens_k", |c| c.form.cu_seqlens_k = Some(vec![0, 19])),
            ("max_seqlen_k", |c| c.form.max_seqlen_k = None),
            ("cu_seqlens_q", |c| {
                c.form.device_offsets = Some((0, BASE, 3))
            }),
            ("cu_seqlens_k", |c| {
                c.form.device_offsets = Some((BASE, BASE + 2, 3))
            }),
            ("cu_seqlens_q", |c| {
                c.form.device_offsets = Some((BASE, BASE, 0))
            }),
        ];
        for (name, edit) in cases {
            let mut case = PackedCase::default();
            on_device(&mut case);
            edit(&mut case);
            assert_eq!(
                rejected(case.check()),
                (name, ExceptionKind::Value),
                "{name}"
            );
        }
    }

    #[test]
    fn packed_accepts_a_valid_call_and_takes_its_lengths_from_the_offsets() {
        let (call, plan) = PackedCase::default().check().expect("valid");
        assert_eq!(call.options.algorithm, Algorithm::Auto);
        let Batch::Packed { batch, .. } = &call.batch else {
            panic!("a packed batch: {:?}", call.batch)
        };
        assert_eq!(batch.sequences(), 3);
        assert_eq!(batch.max_seqlens(), [11, 9]);
        // L is (1, heads, total_q): flash-attn's (heads, total_q).
        assert_eq!(plan.statistics_dims(), [1, 4, 16]);
        assert!(plan.kernel_names().contains("_varlen"), "{plan}");
        // A larger max_seqlen is an upper bound, as in flash-attn: accepted.
        let mut loose = PackedCase {
            algorithm: Some("fa2-tc"),
            ..Default::default()
        };
        loose.form.max_seqlen_q = Some(4096);
        loose.form.max_seqlen_k = Some(4096);
        assert_eq!(
            loose.check().expect("valid").0.options.algorithm,
            Algorithm::Fa2Tc
        );
        let windowed = PackedCase {
            scores: Scores {
                causal: true,
                window: Some((8, 0)),
                softcap: 30.0,
                ..Default::default()
            },
            ..Default::default()
        };
        let (call, _) = windowed.check().expect("valid");
        assert_eq!(
            (call.options.window, call.options.softcap),
            (Some((8, 0)), 30.0)
        );
    }

    /// `PACKED_ALGORITHMS` is what the host's plan takes for a packed batch: each of the others
    /// is refused, naming `algorithm`.
    #[test]
    fn packed_algorithms_are_the_ones_the_host_plans() {
        for algorithm in Algorithm::ALL {
            let case = PackedCase {
                algorithm: Some(algorithm.name()),
                ..Default::default()
            };
            if PACKED_ALGORITHMS.contains(&algorithm) {
                case.check().unwrap_or_else(|e| panic!("{algorithm}: {e}"));
            } else {
                assert_eq!(
                    rejected(case.check()),
                    ("algorithm", ExceptionKind::Value),
                    "{algorithm}"
                );
            }
        }
    }

    /// Edits one argument of a packed call.
    type PackedEdit = fn(&mut PackedCase);

    #[test]
    fn packed_errors_name_the_argument() {
        let cases: [(&str, PackedEdit); 16] = [
            ("cu_seqlens_q", |c| {
                c.form.cu_seqlens_q = Some(vec![1, 5, 5, 16])
            }), // not from 0
            ("cu_seqlens_q", |c| {
                c.form.cu_seqlens_q = Some(vec![0, 5, 4, 16])
            }), // decreasing
            ("cu_seqlens_q", |c| {
                c.form.cu_seqlens_q = Some(vec![0, 5, 5, 15])
            }), // last != rows
            ("cu_seqlens_q", |c| {
                c.form.cu_seqlens_q = Some(vec![0, -5, 5, 16])
            }), // not a u32
            ("cu_seqlens_k", |c| {
                c.form.cu_seqlens_k = Some(vec![0, 7, 10, 20])
            }),
            ("cu_seqlens_k", |c| c.form.cu_seqlens_k = Some(vec![0, 19])), // one sequence
            ("max_seqlen_q", |c| c.form.max_seqlen_q = Some(10)),          // the longest is 11
            ("max_seqlen_k", |c| c.form.max_seqlen_k = Some(8)),           // and 9
            // The packed form takes its four keywords together.
            ("cu_seqlens_q", |c| c.form.cu_seqlens_q = None),
            ("cu_seqlens_k", |c| c.form.cu_seqlens_k = None),
            ("max_seqlen_q", |c| c.form.max_seqlen_q = None),
            ("max_seqlen_k", |c| c.form.max_seqlen_k = None),
            ("k", |c| c.heads_kv = 3), // does not divide 4
            ("algorithm", |c| c.algorithm = Some("fa2")), // no packed kernels
            ("algorithm", |c| c.algorithm = Some("fa4")),
            ("window", |c| c.scores.window = Some((-2, 0))),
        ];
        for (name, edit) in cases {
            let mut case = PackedCase::default();
            edit(&mut case);
            assert_eq!(
                rejected(case.check()),
                (name, ExceptionKind::Value),
                "{name}"
            );
        }
        for dtype in ["f32", "f64"] {
            let case = PackedCase {
                dtype,
                ..Default::default()
            };
            assert_eq!(rejected(case.check()), ("dtype", ExceptionKind::Type));
        }
    }

    /// The tensors go through the host's checks of the call before any device is opened, each
    /// error naming its tensor.
    #[test]
    fn packed_tensors_are_checked_without_a_device() {
        let case = PackedCase::default();
        let [q, k, v, o] = case.tensors();
        assert!(case.check_with([q, k, v, o]).is_ok());
        let cases = [
            ("q", [(0, q.1, q.2), k, v, o]),
            ("k", [q, (k.0, k.1, [0, 64, 128, 2]), v, o]),
            ("v", [q, k, (0, v.1, v.2), o]),
            ("o", [q, k, v, (o.0, o.1, [0, 0, 0, 1])]),
        ];
        for (name, tensors) in cases {
            assert_eq!(
                rejected(case.check_with(tensors)),
                (name, ExceptionKind::Value),
                "{name}"
            );
        }
        // A misaligned tensor leaves the packed kernels (tensor cores only) nothing to run on:
        // the plan's refusal says which tensor.
        let misaligned = case.check_with([q, k, (v.0 + 2, v.1, v.2), o]);
        let error = misaligned.expect_err("refused").to_string();
        assert!(
            error.contains("v's rows are not 16-byte aligned"),
            "{error}"
        );
        let no_lse = PackedCase {
            lse: 0,
            ..Default::default()
        };
        assert_eq!(rejected(no_lse.check()), ("lse", ExceptionKind::Value));
    }

    /// A decode call: q (2, 8, 3, 64) against contiguous caches (2, 2, 40, 64) of lengths 10 and
    /// 0, or paged ones (6 pages of 16 keys) with a table; parsed and checked (no device).
    fn decode_with(form: FormArguments, dtype: &str) -> flash_attn::Result<(ForwardCall, Plan)> {
        let q = sdpa(BASE, [2, 8, 3, 64]);
        let paged = form.block_table.is_some();
        let cache_dims = if paged {
            [6, 2, 16, 64]
        } else {
            [2, 2, 40, 64]
        };
        let k = sdpa(BASE + (1 << 30), cache_dims);
        let v = sdpa(BASE + (2 << 30), cache_dims);
        let o = sdpa(BASE + (3 << 30), [2, 8, 3, 64]);
        let call = ForwardCall::parse(
            dtype,
            [q, k, v, o],
            &[BASE + (4 << 30)],
            None,
            Scores {
                causal: true,
                ..Scores::default()
            },
            &form,
        )?;
        let plan = call.check()?;
        Ok((call, plan))
    }

    fn cache_form(lengths: Vec<i64>) -> FormArguments {
        FormArguments {
            cache_seqlens: Some(lengths),
            ..Default::default()
        }
    }

    #[test]
    fn decode_calls_are_planned_with_their_cache() {
        let (call, plan) = decode_with(cache_form(vec![10, 0]), "bf16").unwrap();
        assert!(
            matches!(&call.batch, Batch::Cache(c) if c.seqlens == [10, 0]),
            "{call:?}"
        );
        assert!(plan.to_string().contains("decode"), "{plan}");
        // Paged: rows of page numbers, with keys to append.
        let form = FormArguments {
            block_table: Some(vec![vec![0, 1, 2], vec![3, 4, 5]]),
            k_new: Some(sdpa(BASE + (5 << 30), [2, 2, 3, 64])),
            v_new: Some(sdpa(BASE + (6 << 30), [2, 2, 3, 64])),
            ..cache_form(vec![20, 7])
        };
        let (call, _) = decode_with(form, "f16").unwrap();
        let Batch::Cache(cache) = &call.batch else {
            panic!("{call:?}")
        };
        assert_eq!(cache.block_table.as_ref().unwrap().dim(), (2, 3));
        assert!(cache.append.is_some());
    }

    #[test]
    fn decode_errors_name_the_argument() {
        let cases: Vec<(FormArguments, &str, &str)> = vec![
            (cache_form(vec![10, -1]), "bf16", "cache_seqlens"),
            // Past the cache's capacity (40): the host's check of the call.
            (cache_form(vec![41, 0]), "bf16", "cache_seqlens"),
            (cache_form(vec![10, 0]), "f32", "dtype"),
            (
                FormArguments {
                    max_seqlen_q: Some(3),
                    ..cache_form(vec![1, 1])
                },
                "bf16",
                "max_seqlen_q",
            ),
            (
                FormArguments {
                    block_table: Some(vec![vec![0, 1, 2], vec![3, 4]]),
                    ..cache_form(vec![1, 1])
                },
                "bf16",
                "block_table",
            ),
            (
                FormArguments {
                    block_table: Some(vec![vec![0, 1, 2], vec![3, 4, 9]]),
                    ..cache_form(vec![40, 40])
                },
                "bf16",
                "block_table",
            ),
            (
                FormArguments {
                    k_new: Some(sdpa(BASE + (5 << 30), [2, 2, 3, 64])),
                    ..cache_form(vec![1, 1])
                },
                "bf16",
                "v_new",
            ),
            (
                FormArguments {
                    k_new: Some(sdpa(BASE + (5 << 30), [2, 2, 3, 64])),
                    ..Default::default()
                },
                "bf16",
                "k_new",
            ),
        ];
        for (form, dtype, name) in cases {
            let described = format!("{form:?} {dtype}");
            let (got, _) = rejected(decode_with(form, dtype));
            assert_eq!(got, name, "{described}");
        }
    }
}
