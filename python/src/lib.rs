//! `flash_attn_rs._native`: the native half of the Python package. The Python half
//! (`flash_attn_rs/__init__.py`) checks PyTorch's tensors, allocates the outputs with PyTorch and
//! passes addresses, dims, strides and the current stream here as plain integers; this half checks
//! them again with the host crate's checks ([`BorrowedArguments::check`]; for a packed batch,
//! [`PackedBatch`]'s) before it opens a GPU, then launches on that stream.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use flash_attn::attention::PackedBatch;
use flash_attn::device::{GRAPH_CAPTURE_UNSUPPORTED, RawStream};
use flash_attn::{
    Algorithm, AttentionOptions, BackwardAlgorithm, BackwardOptions, BorrowedArguments,
    BorrowedBackwardArguments, BorrowedRows, BorrowedTensor, DType, Error, Gpu, Gradients,
    StatisticsAddresses, attention_backward_borrowed, attention_borrowed,
    attention_packed_borrowed,
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

/// One forward call's arguments, parsed and checked without a device.
#[derive(Debug)]
pub struct Call {
    pub algorithm: Algorithm,
    pub arguments: BorrowedArguments,
    pub options: AttentionOptions,
}

/// One backward call's arguments, parsed and checked without a device.
#[derive(Debug)]
pub struct BackwardCall {
    pub arguments: BorrowedBackwardArguments,
    pub options: AttentionOptions,
}

/// `algorithm = None` is FA3, the fastest: on a device that is not compute capability 9.0, or
/// for f32, it falls back to FA2-TC and then FA2, and the plan says why.
pub const DEFAULT_ALGORITHM: Algorithm = Algorithm::Fa3;

fn tensor((address, dims, strides): TensorArgument) -> BorrowedTensor {
    BorrowedTensor {
        address,
        dims,
        strides,
    }
}

/// How a call forms its scores: the scale, the causal mask, flash-attn's `window_size` (left,
/// right; −1 unbounded) and `softcap` (0: off). The host crate checks each (and names it).
#[derive(Clone, Copy, Debug, Default)]
pub struct Scores {
    pub softmax_scale: Option<f64>,
    pub causal: bool,
    pub window: Option<(i64, i64)>,
    pub softcap: f64,
}

impl Scores {
    /// The four keyword arguments of every call, as the Python half passes them.
    fn of(
        softmax_scale: Option<f64>,
        causal: bool,
        window: Option<(i64, i64)>,
        softcap: f64,
    ) -> Self {
        Self {
            softmax_scale,
            causal,
            window,
            softcap,
        }
    }

    fn options(self) -> AttentionOptions {
        AttentionOptions {
            causal: self.causal,
            // An f64 that is not a finite f32 becomes ±∞ or NaN, which the checks reject.
            softmax_scale: self.softmax_scale.map(|s| s as f32),
            // (−1, −1) is no window; the check names a side below −1.
            window: self.window.filter(|&w| w != (-1, -1)),
            softcap: self.softcap as f32,
            ..Default::default()
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn parse(
    dtype: &str,
    q: TensorArgument,
    k: TensorArgument,
    v: TensorArgument,
    o: TensorArgument,
    stats: &[u64],
    algorithm: Option<&str>,
    scores: Scores,
) -> flash_attn::Result<Call> {
    let dtype: DType = dtype.parse()?;
    let algorithm = algorithm.map_or(Ok(DEFAULT_ALGORITHM), str::parse)?;
    let stats = match *stats {
        [lse] => StatisticsAddresses::LogSumExp(lse),
        [max, sum] => StatisticsAddresses::MaxAndSum { max, sum },
        _ => {
            return Err(Error::InvalidArgument {
                name: "stats",
                value: format!("{} addresses", stats.len()),
                allowed: "one (L) or two (FA1's m and l)".into(),
            });
        }
    };
    let call = Call {
        algorithm,
        arguments: BorrowedArguments {
            dtype,
            q: tensor(q),
            k: tensor(k),
            v: tensor(v),
            o: tensor(o),
            stats,
        },
        options: scores.options(),
    };
    call.arguments.check(call.algorithm, &call.options)?;
    Ok(call)
}

/// The backward's arguments: the forward's Q, K, V, O and L, dO, and dQ, dK, dV to write.
#[allow(clippy::too_many_arguments)]
pub fn parse_backward(
    dtype: &str,
    q: TensorArgument,
    k: TensorArgument,
    v: TensorArgument,
    o: TensorArgument,
    lse: RowsArgument,
    d_o: TensorArgument,
    [dq, dk, dv]: [TensorArgument; 3],
    scores: Scores,
) -> flash_attn::Result<BackwardCall> {
    let (address, dims, strides) = lse;
    let call = BackwardCall {
        arguments: BorrowedBackwardArguments {
            dtype: dtype.parse()?,
            q: tensor(q),
            k: tensor(k),
            v: tensor(v),
            o: tensor(o),
            logsumexp: BorrowedRows {
                address,
                dims,
                strides,
            },
            d_o: tensor(d_o),
            gradients: Gradients {
                dq: tensor(dq),
                dk: tensor(dk),
                dv: tensor(dv),
            },
        },
        options: scores.options(),
    };
    call.arguments.check(&call.options)?;
    Ok(call)
}

/// One packed-batch forward call's arguments (flash-attn's varlen call), parsed and checked
/// without a device: every sequence's rows in one Q (1, heads, total_q, d) and one K and V
/// (1, heads_kv, total_k, d), O with Q's dims, L an f32 (heads, total_q) at `logsumexp`.
#[derive(Debug)]
pub struct PackedCall {
    pub algorithm: Algorithm,
    /// Q, K, V, O and L (`StatisticsAddresses::LogSumExp`), checked for the batch.
    pub arguments: BorrowedArguments,
    pub batch: PackedBatch,
    pub options: AttentionOptions,
}

/// The algorithms that run a packed batch. The host's plan refuses the others too, but only
/// once a device is open; checked here so that the error comes without one.
pub const PACKED_ALGORITHMS: [Algorithm; 2] = [Algorithm::Fa3, Algorithm::Fa2Tc];

fn invalid(name: &'static str, value: impl std::fmt::Display, allowed: impl Into<String>) -> Error {
    Error::InvalidArgument {
        name,
        value: value.to_string(),
        allowed: allowed.into(),
    }
}

/// Offsets as the Python half passes them (ints from `cu_seqlens.tolist()`) in the host's u32.
fn host_offsets(name: &'static str, offsets: &[i64]) -> flash_attn::Result<Vec<u32>> {
    offsets
        .iter()
        .enumerate()
        .map(|(i, &offset)| {
            u32::try_from(offset).map_err(|_| {
                invalid(
                    name,
                    format!("entry {i} = {offset}"),
                    format!("offsets from 0 to at most {}", u32::MAX),
                )
            })
        })
        .collect()
}

/// The packed forward's arguments: Q, K, V, O (address, logical (1, heads, total, d) dims,
/// strides), L's address, the offsets `cu_seqlens_q` and `cu_seqlens_k` and flash-attn's
/// `max_seqlen_q` and `max_seqlen_k`, each at least its offsets' longest sequence (the grid is
/// sized by that longest one, which the offsets give).
#[allow(clippy::too_many_arguments)]
pub fn parse_packed(
    dtype: &str,
    [q, k, v, o]: [TensorArgument; 4],
    logsumexp: u64,
    [cu_seqlens_q, cu_seqlens_k]: [&[i64]; 2],
    max_seqlens: [usize; 2],
    algorithm: Option<&str>,
    scores: Scores,
) -> flash_attn::Result<PackedCall> {
    let dtype: DType = dtype.parse()?;
    if dtype == DType::F32 {
        return Err(invalid(
            "dtype",
            dtype,
            "f16 or bf16: packed batches run on tensor cores only",
        ));
    }
    let algorithm = algorithm.map_or(Ok(DEFAULT_ALGORITHM), str::parse)?;
    if !PACKED_ALGORITHMS.contains(&algorithm) {
        return Err(invalid(
            "algorithm",
            algorithm,
            "allowed for a packed batch of sequences: fa3 (which falls back to fa2-tc), fa2-tc",
        ));
    }
    let batch = PackedBatch::new(
        &host_offsets("cu_seqlens_q", cu_seqlens_q)?,
        &host_offsets("cu_seqlens_k", cu_seqlens_k)?,
    )?;
    let [q, k, v, o] = [q, k, v, o].map(tensor);
    let arguments = BorrowedArguments {
        dtype,
        q,
        k,
        v,
        o,
        stats: StatisticsAddresses::LogSumExp(logsumexp),
    };
    let options = scores.options();
    // Every check of the tensors, their shapes, the options, and each list's last offset
    // against Q's (K's) rows.
    arguments.check_packed(&batch, &options)?;
    for ((name, given), longest) in [
        ("max_seqlen_q", max_seqlens[0]),
        ("max_seqlen_k", max_seqlens[1]),
    ]
    .into_iter()
    .zip(batch.max_seqlens())
    {
        if given < longest {
            return Err(invalid(
                name,
                given,
                format!(
                    "at least the longest sequence in its offsets ({longest}): flash-attn sizes \
                     its grid by it, and a smaller one would leave rows unwritten"
                ),
            ));
        }
    }
    Ok(PackedCall {
        algorithm,
        arguments,
        batch,
        options,
    })
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

/// Checks the arguments (raising before anything is launched), then runs attention on device
/// `device` on stream `stream` (`torch.cuda.current_stream(device).cuda_stream`) and returns the
/// plan as one line; without `device`, only checks (returns None; no GPU needed). `stats` is
/// `[lse]`, or `[m, l]` for FA1; `window` is flash-attn's `window_size`, `softcap` its
/// `softcap`. Private: `flash_attn_rs`'s functions derive every integer from live tensors; wrong
/// integers here are undefined behaviour.
#[pyfunction]
#[pyo3(signature = (*, dtype, q, k, v, o, stats, algorithm=None, softmax_scale=None, causal=false, window=None, softcap=0.0, device=None, stream=0))]
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
    device: Option<usize>,
    stream: usize,
) -> PyResult<Option<String>> {
    let scores = Scores::of(softmax_scale, causal, window, softcap);
    let call = parse(dtype, q, k, v, o, &stats, algorithm, scores).map_err(to_py)?;
    // SAFETY: the Python half passes live CUDA tensors of device `device` (checked there: one
    // device for all), which PyTorch keeps allocated until the work on their stream is done, and
    // that device's current stream, a stream of its primary context.
    unsafe {
        launch_on(py, device, StreamHandle(stream), |gpu| {
            attention_borrowed(gpu, call.algorithm, &call.arguments, &call.options)
        })
    }
}

/// Checks the arguments (raising before anything is launched), then runs the backward on device
/// `device` on stream `stream`, writing dq, dk, dv, and returns its plan as one line; without
/// `device`, only checks. `lse` is the forward's L (address, dims, strides). `algorithm` is the
/// backward's (`fa2` or `fa2-tc`; default: the fastest the problem allows), `deterministic` makes
/// dQ bitwise reproducible; `window` and `softcap` are the forward's, which the backward refuses
/// with an error naming them (it has neither yet). Private, like `forward`.
#[pyfunction]
#[pyo3(signature = (*, dtype, q, k, v, o, lse, d_o, dq, dk, dv, softmax_scale=None, causal=false, window=None, softcap=0.0, algorithm=None, deterministic=false, device=None, stream=0))]
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
    algorithm: Option<&str>,
    deterministic: bool,
    device: Option<usize>,
    stream: usize,
) -> PyResult<Option<String>> {
    let backward_options = BackwardOptions {
        algorithm: match algorithm {
            Some(name) => name.parse::<BackwardAlgorithm>().map_err(to_py)?,
            None => BackwardAlgorithm::default(),
        },
        deterministic,
    };
    let gradients = [dq, dk, dv];
    let call = parse_backward(
        dtype,
        q,
        k,
        v,
        o,
        lse,
        d_o,
        gradients,
        Scores::of(softmax_scale, causal, window, softcap),
    )
    .map_err(to_py)?;
    // SAFETY: as `forward`; dq, dk, dv are fresh PyTorch tensors that alias nothing.
    unsafe {
        launch_on(py, device, StreamHandle(stream), |gpu| {
            attention_backward_borrowed(gpu, &call.arguments, &call.options, &backward_options)
        })
    }
}

/// Checks the arguments (raising before anything is launched), then runs attention over a packed
/// batch (the host crate's [`attention_packed_borrowed`], flash-attn's varlen call) on device
/// `device` on stream `stream`, writing O and L (f32 (heads, total_q), contiguous, at `lse`), and
/// returns the plan as one line; without `device`, only checks. `q`, `k`, `v`, `o` are the
/// packed (total, heads, d) tensors viewed as (1, heads, total, d); `cu_seqlens_q` and
/// `cu_seqlens_k` the offsets, read on the host; `max_seqlen_q` and `max_seqlen_k` flash-attn's
/// bounds, checked against them. Private, like `forward`.
#[pyfunction]
#[pyo3(signature = (*, dtype, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm=None, softmax_scale=None, causal=false, window=None, softcap=0.0, device=None, stream=0))]
#[allow(clippy::too_many_arguments)]
fn forward_packed(
    py: Python<'_>,
    dtype: &str,
    q: TensorArgument,
    k: TensorArgument,
    v: TensorArgument,
    o: TensorArgument,
    lse: u64,
    cu_seqlens_q: Vec<i64>,
    cu_seqlens_k: Vec<i64>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    algorithm: Option<&str>,
    softmax_scale: Option<f64>,
    causal: bool,
    window: Option<(i64, i64)>,
    softcap: f64,
    device: Option<usize>,
    stream: usize,
) -> PyResult<Option<String>> {
    let scores = Scores::of(softmax_scale, causal, window, softcap);
    let call = parse_packed(
        dtype,
        [q, k, v, o],
        lse,
        [&cu_seqlens_q, &cu_seqlens_k],
        [max_seqlen_q, max_seqlen_k],
        algorithm,
        scores,
    )
    .map_err(to_py)?;
    // SAFETY: as `forward`; O and L are fresh PyTorch tensors, L of heads·total_q f32.
    unsafe {
        launch_on(py, device, StreamHandle(stream), |gpu| {
            attention_packed_borrowed(
                gpu,
                call.algorithm,
                &call.arguments,
                &call.batch,
                &call.options,
            )
        })
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
    m.add_function(wrap_pyfunction!(forward_packed, m)?)?;
    m.add_function(wrap_pyfunction!(workspace_peak_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(reset_workspace_peak, m)?)?;
    m.add("DEFAULT_ALGORITHM", DEFAULT_ALGORITHM.name())?;
    m.add("ALGORITHMS", Algorithm::ALL.map(Algorithm::name).to_vec())?;
    m.add(
        "PACKED_ALGORITHMS",
        PACKED_ALGORITHMS.map(Algorithm::name).to_vec(),
    )?;
    m.add("GRAPH_CAPTURE_UNSUPPORTED", GRAPH_CAPTURE_UNSUPPORTED)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x7f00_0000_0000;

    fn sdpa(address: u64, [b, h, s, d]: [usize; 4]) -> TensorArgument {
        (address, [b, h, s, d], [h * s * d, s * d, d, 1])
    }

    fn parse_with(dtype: &str, algorithm: Option<&str>, stats: &[u64]) -> flash_attn::Result<Call> {
        let dims = [1, 2, 16, 64];
        let t = |i: u64| sdpa(BASE + (i << 30), dims);
        let scores = Scores {
            causal: true,
            ..Default::default()
        };
        parse(dtype, t(0), t(1), t(2), t(3), stats, algorithm, scores)
    }

    fn kind(result: flash_attn::Result<Call>) -> ExceptionKind {
        exception_kind(&result.expect_err("expected an error"))
    }

    #[test]
    fn defaults_to_fa3() {
        let call = parse_with("bf16", None, &[BASE + (4 << 30)]).expect("valid");
        assert_eq!(call.algorithm, Algorithm::Fa3);
        assert!(call.options.causal);
    }

    #[test]
    fn a_bad_dtype_is_a_type_error_and_the_rest_value_errors() {
        let lse = [BASE + (4 << 30)];
        assert_eq!(kind(parse_with("f64", None, &lse)), ExceptionKind::Type);
        assert_eq!(
            kind(parse_with("f16", Some("fa4"), &lse)),
            ExceptionKind::Value
        );
        assert_eq!(
            kind(parse_with("f16", Some("fa1"), &lse)),
            ExceptionKind::Value
        );
        assert_eq!(kind(parse_with("f16", None, &[])), ExceptionKind::Value);
        assert!(parse_with("f32", Some("fa1"), &[lse[0], lse[0] + 4096]).is_ok());
    }

    /// A window and soft-capping reach the forward's options ((−1, −1) is none); the backward
    /// refuses both, naming them, so no gradient is computed without the forward's mask.
    #[test]
    fn windows_and_softcap_run_forward_and_are_named_by_the_backward() {
        let dims = [1, 2, 16, 64];
        let t = |i: u64| sdpa(BASE + (i << 30), dims);
        let lse = [BASE + (4 << 30)];
        let scores = Scores {
            causal: true,
            window: Some((8, 0)),
            softcap: 30.0,
            ..Default::default()
        };
        let call = parse("bf16", t(0), t(1), t(2), t(3), &lse, None, scores).expect("valid");
        assert_eq!(call.options.window, Some((8, 0)));
        assert_eq!(call.options.softcap, 30.0);
        let unbounded = Scores {
            window: Some((-1, -1)),
            ..Default::default()
        };
        let call = parse("bf16", t(0), t(1), t(2), t(3), &lse, None, unbounded).expect("valid");
        assert_eq!(call.options.window, None);
        let bad = Scores {
            window: Some((-2, 0)),
            ..Default::default()
        };
        let error = parse("bf16", t(0), t(1), t(2), t(3), &lse, None, bad).expect_err("refused");
        assert!(
            matches!(error, Error::InvalidArgument { name: "window", .. }),
            "{error}"
        );
        for (window, softcap, name) in [(Some((8, 0)), 0.0, "window"), (None, 5.0, "softcap")] {
            let scores = Scores {
                window,
                softcap,
                ..Default::default()
            };
            let lse = (BASE + (8 << 30), [1, 2, 16], [32, 16, 1]);
            let error = parse_backward(
                "bf16",
                t(0),
                t(1),
                t(2),
                t(3),
                lse,
                t(5),
                [t(5), t(6), t(7)],
                scores,
            )
            .expect_err("the backward has no window or soft-capping");
            assert!(
                matches!(error, Error::InvalidArgument { name: n, .. } if n == name),
                "{error}"
            );
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

    /// A backward call on (1, 2, 16, 64) Q and (1, 2, 24, 64) K, V; `edit` changes one argument.
    fn parse_backward_with(
        dtype: &str,
        edit: impl FnOnce(&mut [TensorArgument; 8], &mut RowsArgument),
    ) -> flash_attn::Result<BackwardCall> {
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
        let scores = Scores {
            causal: true,
            ..Default::default()
        };
        parse_backward(dtype, q, k, v, o, lse, d_o, [dq, dk, dv], scores)
    }

    fn backward_rejected(
        result: flash_attn::Result<BackwardCall>,
    ) -> (&'static str, ExceptionKind) {
        let error = result.expect_err("expected an error");
        let kind = exception_kind(&error);
        match error {
            Error::InvalidArgument { name, .. } => (name, kind),
            other => panic!("expected an invalid argument, got {other:?}"),
        }
    }

    /// A packed call on flash-attn's (total, heads, d) storage viewed as (1, heads, total, d):
    /// three sequences of 5, 0 and 11 queries on 7, 3 and 9 keys, 4 query heads on `heads_kv`.
    struct PackedCase {
        dtype: &'static str,
        heads_kv: usize,
        cu_seqlens_q: Vec<i64>,
        cu_seqlens_k: Vec<i64>,
        max_seqlens: [usize; 2],
        algorithm: Option<&'static str>,
        scores: Scores,
    }

    impl Default for PackedCase {
        fn default() -> Self {
            Self {
                dtype: "bf16",
                heads_kv: 2,
                cu_seqlens_q: vec![0, 5, 5, 16],
                cu_seqlens_k: vec![0, 7, 10, 19],
                max_seqlens: [11, 9],
                algorithm: None,
                scores: Scores::default(),
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
        fn parse(&self) -> flash_attn::Result<PackedCall> {
            let (total_q, total_k) = (16, 19);
            let q = packed(BASE, [total_q, 4, 64]);
            let kv = |i: u64| packed(BASE + (i << 30), [total_k, self.heads_kv, 64]);
            let o = packed(BASE + (3 << 30), [total_q, 4, 64]);
            parse_packed(
                self.dtype,
                [q, kv(1), kv(2), o],
                BASE + (4 << 30),
                [&self.cu_seqlens_q, &self.cu_seqlens_k],
                self.max_seqlens,
                self.algorithm,
                self.scores,
            )
        }

        fn rejected(&self) -> (&'static str, ExceptionKind) {
            let error = self.parse().expect_err("expected an error");
            let kind = exception_kind(&error);
            match error {
                Error::InvalidArgument { name, .. } => (name, kind),
                other => panic!("expected an invalid argument, got {other:?}"),
            }
        }
    }

    #[test]
    fn packed_accepts_a_valid_call_and_takes_its_lengths_from_the_offsets() {
        let call = PackedCase::default().parse().expect("valid");
        assert_eq!(call.algorithm, Algorithm::Fa3);
        assert_eq!(call.batch.sequences(), 3);
        assert_eq!(call.batch.max_seqlens(), [11, 9]);
        // A larger max_seqlen is an upper bound, as in flash-attn: accepted.
        let loose = PackedCase {
            max_seqlens: [4096, 4096],
            algorithm: Some("fa2-tc"),
            ..Default::default()
        };
        assert_eq!(loose.parse().expect("valid").algorithm, Algorithm::Fa2Tc);
        let windowed = PackedCase {
            scores: Scores {
                causal: true,
                window: Some((8, 0)),
                softcap: 30.0,
                ..Default::default()
            },
            ..Default::default()
        };
        let call = windowed.parse().expect("valid");
        assert_eq!(
            (call.options.window, call.options.softcap),
            (Some((8, 0)), 30.0)
        );
    }

    /// Edits one argument of a packed call.
    type PackedEdit = fn(&mut PackedCase);

    #[test]
    fn packed_errors_name_the_argument() {
        let cases: [(&str, PackedEdit); 12] = [
            ("cu_seqlens_q", |c| c.cu_seqlens_q = vec![1, 5, 5, 16]), // not from 0
            ("cu_seqlens_q", |c| c.cu_seqlens_q = vec![0, 5, 4, 16]), // decreasing
            ("cu_seqlens_q", |c| c.cu_seqlens_q = vec![0, 5, 5, 15]), // last != q's rows
            ("cu_seqlens_q", |c| c.cu_seqlens_q = vec![0, -5, 5, 16]), // not a u32
            ("cu_seqlens_k", |c| c.cu_seqlens_k = vec![0, 7, 10, 20]),
            ("cu_seqlens_k", |c| c.cu_seqlens_k = vec![0, 19]), // one sequence, q has three
            ("max_seqlen_q", |c| c.max_seqlens = [10, 9]),      // the longest is 11
            ("max_seqlen_k", |c| c.max_seqlens = [11, 8]),      // and 9
            ("k", |c| c.heads_kv = 3),                          // does not divide 4
            ("algorithm", |c| c.algorithm = Some("fa2")),       // no packed kernels
            ("algorithm", |c| c.algorithm = Some("fa4")),
            ("window", |c| c.scores.window = Some((-2, 0))),
        ];
        for (name, edit) in cases {
            let mut case = PackedCase::default();
            edit(&mut case);
            assert_eq!(case.rejected(), (name, ExceptionKind::Value), "{name}");
        }
        for dtype in ["f32", "f64"] {
            let case = PackedCase {
                dtype,
                ..Default::default()
            };
            assert_eq!(case.rejected(), ("dtype", ExceptionKind::Type));
        }
    }

    /// The tensors go through the host's checks of borrowed memory (`check_packed`) before any
    /// device is opened, each error naming its tensor.
    #[test]
    fn packed_tensors_are_checked_without_a_device() {
        let q = packed(BASE, [16, 4, 64]);
        let k = packed(BASE + (1 << 30), [19, 2, 64]);
        let o = packed(BASE + (3 << 30), [16, 4, 64]);
        let parse = |[q, k, v, o]: [TensorArgument; 4], lse| {
            parse_packed(
                "bf16",
                [q, k, v, o],
                lse,
                [&[0, 5, 5, 16], &[0, 7, 10, 19]],
                [11, 9],
                None,
                Scores::default(),
            )
        };
        let v = (BASE + (2 << 30), k.1, k.2);
        assert!(parse([q, k, v, o], BASE + (4 << 30)).is_ok());
        let cases = [
            ("q", [(0, q.1, q.2), k, v, o], BASE + (4 << 30)),
            (
                "k",
                [q, (k.0, k.1, [0, 64, 128, 2]), v, o],
                BASE + (4 << 30),
            ),
            ("v", [q, k, (v.0 + 1, v.1, v.2), o], BASE + (4 << 30)),
            ("o", [q, k, v, (o.0, o.1, [0, 0, 0, 1])], BASE + (4 << 30)),
            ("lse", [q, k, v, o], 0),
        ];
        for (name, tensors, lse) in cases {
            let error = parse(tensors, lse).expect_err("refused");
            assert!(
                matches!(error, Error::InvalidArgument { name: n, .. } if n == name),
                "{name}: {error}"
            );
        }
    }

    #[test]
    fn backward_accepts_a_valid_call() {
        let call = parse_backward_with("f16", |_, _| {}).expect("valid");
        assert!(call.options.causal);
        assert_eq!(call.arguments.logsumexp.dims, [1, 2, 16]);
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
                backward_rejected(parse_backward_with("bf16", edit)),
                (name, ExceptionKind::Value)
            );
        }
        assert_eq!(
            backward_rejected(parse_backward_with("f64", |_, _| {})),
            ("dtype", ExceptionKind::Type)
        );
    }
}
