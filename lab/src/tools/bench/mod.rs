//! Benchmarks: speed, memory and the longest sequence that fits, for every algorithm,
//! over the FlashAttention papers' sweep (batch·N = 16384 tokens, heads·d = 2048).
//!
//! Records share one JSON schema with `lab/scripts/torch_sdpa_bench.py`, which times PyTorch's SDPA
//! backends on the same shapes, so [`report::merged_table`] can put ours and theirs side by side as
//! ratios measured in the same run.
//!
//! [`backward`] is the backward benchmark (the backward alone and forward + backward, beside
//! PyTorch's, and the memory mode).
//! [`decode`] is the decode benchmark (µs and K+V bytes/s at ANCHORS.md's decode shapes).
//! [`runner`] measures, [`report`] writes the markdown tables a person reads, [`chart`] draws the
//! SVG; the record types they share are here.

pub mod backward;
pub mod chart;
pub mod decode;
pub mod report;
pub mod runner;
#[cfg(test)]
mod test_records;

use flash_attn::attention::Algorithm;
use flash_attn::dtype::DType;

/// What to sweep.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SweepConfig {
    pub seqlens: Vec<usize>,
    pub head_dims: Vec<usize>,
    pub causal: Vec<bool>,
    #[serde(with = "crate::names")]
    pub dtype: DType,
    #[serde(with = "crate::names::list")]
    pub algorithms: Vec<Algorithm>,
    /// batch · seqlen (the papers: 16384).
    pub tokens: usize,
    /// heads · head_dim (the papers: 2048).
    pub hidden: usize,
    /// Timed launches per case at least, and at most.
    pub min_repeats: usize,
    pub max_repeats: usize,
    /// Stop repeating once this much GPU time has been measured.
    pub target_ms: f64,
    /// FA2-TC's tiling (as `attention::parse_fa2_tc_tiling` reads it, e.g. `4x2s1c64`); `None`:
    /// the library's default. Records of an override are named `fa2-tc-<tiling>`, so runs with
    /// different values merge into one table.
    #[serde(default)]
    pub fa2_tc_tiling: Option<String>,
    /// FA3's tiling (`attention::parse_fa3_tiling`, e.g. `w2c176`), named into its records as
    /// `fa3-<tiling>`.
    #[serde(default)]
    pub fa3_tiling: Option<String>,
}

impl SweepConfig {
    /// The papers' sweep: N from 512 to 16k, d 64 and 128, causal off and on.
    pub fn full(dtype: DType) -> Self {
        Self {
            seqlens: vec![512, 1024, 2048, 4096, 8192, 16384],
            head_dims: vec![64, 128],
            causal: vec![false, true],
            dtype,
            algorithms: Algorithm::ALL.to_vec(),
            tokens: 16384,
            hidden: 2048,
            min_repeats: 5,
            max_repeats: 50,
            target_ms: 300.0,
            fa2_tc_tiling: None,
            fa3_tiling: None,
        }
    }

    /// A subset that runs in well under a minute.
    pub fn quick(dtype: DType) -> Self {
        Self {
            seqlens: vec![1024, 4096],
            min_repeats: 3,
            max_repeats: 10,
            target_ms: 50.0,
            ..Self::full(dtype)
        }
    }

    /// Every case of the sweep, in order.
    pub fn shapes(&self) -> Vec<BenchShape> {
        let mut shapes = Vec::new();
        for &head_dim in &self.head_dims {
            for &causal in &self.causal {
                for &seqlen in &self.seqlens {
                    let batch = (self.tokens / seqlen).max(1);
                    let heads = (self.hidden / head_dim).max(1);
                    shapes.push(BenchShape {
                        batch,
                        heads,
                        seqlen,
                        head_dim,
                        causal,
                    });
                }
            }
        }
        shapes
    }
}

/// One benchmark shape (self-attention: seqlen_q = seqlen_k).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BenchShape {
    pub batch: usize,
    pub heads: usize,
    pub seqlen: usize,
    pub head_dim: usize,
    pub causal: bool,
}

impl BenchShape {
    /// 4·B·H·N²·d, halved for causal (the FlashAttention papers' count).
    pub fn flops(&self) -> f64 {
        let full = 4.0
            * (self.batch * self.heads) as f64
            * (self.seqlen as f64).powi(2)
            * self.head_dim as f64;
        if self.causal { full / 2.0 } else { full }
    }

    /// The fewest bytes any algorithm must move: Q, K, V read once, O written once.
    pub fn minimum_bytes(&self, dtype: DType) -> f64 {
        4.0 * (self.batch * self.heads * self.seqlen * self.head_dim * dtype.size_bytes()) as f64
    }

    pub(super) fn dims(&self) -> [usize; 4] {
        [self.batch, self.heads, self.seqlen, self.head_dim]
    }
}

/// One measurement: ours or a PyTorch backend's (same schema in both JSON files).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct BenchRecord {
    /// `standard`, `fa1`, `fa2`, or `torch-flash`, `torch-cudnn`, `torch-efficient`, `torch-math`.
    pub implementation: String,
    #[serde(with = "crate::names")]
    pub dtype: DType,
    pub shape: BenchShape,
    pub median_ms: Option<f64>,
    pub tflops: Option<f64>,
    /// Minimum bytes (Q, K, V in, O out) over the median time, GB/s.
    pub bandwidth_gbs: Option<f64>,
    /// Device memory the call held at its peak, inputs and outputs included, bytes.
    pub peak_memory_bytes: Option<u64>,
    /// Why there is no time (out of memory, unsupported, …).
    pub error: Option<String>,
}

/// The longest sequence an algorithm's buffers fit at batch 1.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct MaxSeqlen {
    pub implementation: String,
    pub head_dim: usize,
    pub heads: usize,
    /// Largest N (a multiple of 1024) whose inputs, outputs and workspace were all allocated.
    pub seqlen: usize,
    /// The out-of-memory error at the next size tried.
    pub limit: String,
}

/// Everything one `bench` run produces.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct BenchReport {
    pub device: String,
    pub config: SweepConfig,
    pub records: Vec<BenchRecord>,
    pub max_seqlen: Vec<MaxSeqlen>,
}
