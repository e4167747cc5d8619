//! `flash_attn_rs._native`: the native half of the Python package. The Python half
//! (`flash_attn_rs/__init__.py`) checks PyTorch's tensors, allocates the outputs with PyTorch and
//! passes addresses, dims, strides and the current stream here as plain integers; this half checks
//! them again with the host crate's checks ([`BorrowedArguments::check`]) before it opens a GPU,
//! then launches on that stream.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use flash_attn::device::RawStream;
use flash_attn::{
    Algorithm, AttentionOptions, BorrowedArguments, BorrowedTensor, DType, Error, Gpu,
    StatisticsAddresses, attention_borrowed,
};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A tensor as the Python half passes it: the address of element (0, 0, 0, 0), its dims
/// (batch, heads, seqlen, head_dim) and its strides in elements.
pub type TensorArgument = (u64, [usize; 4], [usize; 4]);

/// Which Python exception a host error raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExceptionKind {
    /// An unsupported dtype.
    Type,
    /// Any other argument that is not allowed (the message names it).
    Value,
    /// No driver, no device, a device too old, a CUDA error, out of memory.
    Runtime,
}

pub fn exception_kind(error: &Error) -> ExceptionKind {
    match error {
        Error::InvalidArgument { name: "dtype", .. } => ExceptionKind::Type,
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

/// One call's arguments, parsed and checked without a device.
#[derive(Debug)]
pub struct Call {
    pub algorithm: Algorithm,
    pub arguments: BorrowedArguments,
    pub options: AttentionOptions,
}

/// `algorithm = None` is FA3, the fastest: on a device that is not compute capability 9.0, or
/// for f32, it falls back to FA2-TC and then FA2, and the plan says why.
pub const DEFAULT_ALGORITHM: Algorithm = Algorithm::Fa3;

#[allow(clippy::too_many_arguments)]
pub fn parse(
    dtype: &str,
    q: TensorArgument,
    k: TensorArgument,
    v: TensorArgument,
    o: TensorArgument,
    stats: &[u64],
    algorithm: Option<&str>,
    softmax_scale: Option<f64>,
    causal: bool,
) -> flash_attn::Result<Call> {
    let dtype: DType = dtype.parse()?;
    let algorithm = algorithm.map_or(Ok(DEFAULT_ALGORITHM), str::parse)?;
    let tensor = |(address, dims, strides): TensorArgument| BorrowedTensor {
        address,
        dims,
        strides,
    };
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
    let options = AttentionOptions {
        causal,
        // An f64 scale that is not a finite f32 becomes ±∞ or NaN, which the check rejects.
        softmax_scale: softmax_scale.map(|s| s as f32),
        ..Default::default()
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
        options,
    };
    call.arguments.check(call.algorithm, &call.options)?;
    Ok(call)
}

/// One open GPU per device ordinal, kept for the process: opening loads the kernel modules.
static GPUS: LazyLock<Mutex<HashMap<usize, Gpu>>> = LazyLock::new(Default::default);

/// Opens (once) device `ordinal`, points it at `stream` and launches; returns the plan's line.
///
/// # Safety
///
/// As [`attention_borrowed`], with `stream` a live stream of the device's primary context.
unsafe fn launch(call: &Call, ordinal: usize, stream: RawStream) -> flash_attn::Result<String> {
    let mut gpus = GPUS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let gpu = match gpus.entry(ordinal) {
        std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
        std::collections::hash_map::Entry::Vacant(entry) => entry.insert(Gpu::open(ordinal)?),
    };
    // SAFETY: the caller's contract.
    let plan = unsafe {
        gpu.use_borrowed_stream(stream)?;
        attention_borrowed(gpu, call.algorithm, &call.arguments, &call.options)?
    };
    Ok(plan.to_string())
}

/// Checks the arguments (raising before anything is launched), then runs attention on device
/// `device` on stream `stream` (`torch.cuda.current_stream(device).cuda_stream`) and returns the
/// plan as one line. `stats` is `[lse]`, or `[m, l]` for FA1. Private: `flash_attn_rs`'s
/// functions derive every integer from live tensors; wrong integers here are undefined behaviour.
#[pyfunction]
#[pyo3(signature = (*, dtype, device, stream, q, k, v, o, stats, algorithm=None, softmax_scale=None, causal=false))]
#[allow(clippy::too_many_arguments)]
fn forward(
    dtype: &str,
    device: usize,
    stream: usize,
    q: TensorArgument,
    k: TensorArgument,
    v: TensorArgument,
    o: TensorArgument,
    stats: Vec<u64>,
    algorithm: Option<&str>,
    softmax_scale: Option<f64>,
    causal: bool,
) -> PyResult<String> {
    let call = parse(dtype, q, k, v, o, &stats, algorithm, softmax_scale, causal).map_err(to_py)?;
    // SAFETY: the Python half passes live CUDA tensors of device `device` (checked there: one
    // device for all), which PyTorch keeps allocated until the work on their stream is done, and
    // that device's current stream, a stream of its primary context.
    unsafe { launch(&call, device, stream as RawStream) }.map_err(to_py)
}

/// The same checks as `forward`, without a device: `None`, or raises.
#[pyfunction]
#[pyo3(signature = (*, dtype, q, k, v, o, stats, algorithm=None, softmax_scale=None, causal=false))]
#[allow(clippy::too_many_arguments)]
fn check(
    dtype: &str,
    q: TensorArgument,
    k: TensorArgument,
    v: TensorArgument,
    o: TensorArgument,
    stats: Vec<u64>,
    algorithm: Option<&str>,
    softmax_scale: Option<f64>,
    causal: bool,
) -> PyResult<()> {
    parse(dtype, q, k, v, o, &stats, algorithm, softmax_scale, causal)
        .map(drop)
        .map_err(to_py)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(forward, m)?)?;
    m.add_function(wrap_pyfunction!(check, m)?)?;
    m.add("DEFAULT_ALGORITHM", DEFAULT_ALGORITHM.name())?;
    m.add("ALGORITHMS", Algorithm::ALL.map(Algorithm::name).to_vec())?;
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
        parse(dtype, t(0), t(1), t(2), t(3), stats, algorithm, None, true)
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

    #[test]
    fn device_errors_are_runtime_errors() {
        assert_eq!(exception_kind(&Error::NoDriver), ExceptionKind::Runtime);
    }
}
