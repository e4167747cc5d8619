//! Benchmark records for the report's and the chart's unit tests, on the papers' sweep shapes.

use flash_attn::dtype::DType;

use crate::tools::bench::{BenchRecord, BenchShape};

/// The papers' shape for (d, causal, N): batch·N = 16384 tokens, heads·d = 2048.
pub(crate) fn shape(head_dim: usize, causal: bool, seqlen: usize) -> BenchShape {
    BenchShape {
        batch: 16384 / seqlen,
        heads: 2048 / head_dim,
        seqlen,
        head_dim,
        causal,
    }
}

/// A measured record at `tflops`.
pub(crate) fn timed(
    implementation: &str,
    head_dim: usize,
    causal: bool,
    seqlen: usize,
    tflops: f64,
) -> BenchRecord {
    let shape = shape(head_dim, causal, seqlen);
    let median_ms = shape.flops() / (tflops * 1e12) * 1e3;
    BenchRecord {
        implementation: implementation.to_string(),
        dtype: DType::Bf16,
        shape,
        median_ms: Some(median_ms),
        tflops: Some(tflops),
        bandwidth_gbs: Some(shape.minimum_bytes(DType::Bf16) / (median_ms * 1e-3) / 1e9),
        peak_memory_bytes: Some(1 << 30),
        error: None,
    }
}

/// A record with no time, failed with `error`.
pub(crate) fn failed(
    implementation: &str,
    head_dim: usize,
    causal: bool,
    seqlen: usize,
    error: &str,
) -> BenchRecord {
    BenchRecord {
        implementation: implementation.to_string(),
        dtype: DType::Bf16,
        shape: shape(head_dim, causal, seqlen),
        median_ms: None,
        tflops: None,
        bandwidth_gbs: None,
        peak_memory_bytes: None,
        error: Some(error.to_string()),
    }
}
