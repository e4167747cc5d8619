//! The options of one attention call as `run` and `plan` both take them: the mask, the scores,
//! the backward's algorithm and mode, and the per-family tuning overrides. The algorithm itself
//! is each command's (`run --algorithm`, `plan --algorithms`), `auto` by default.

use flash_attn::attention::{parse_fa3_tiling, parse_optional_fa2_tc_tiling};
use flash_attn::{Algorithm, AttentionOptions};

#[derive(clap::Args)]
pub struct CallArgs {
    /// Causal mask, aligned to the bottom-right corner when seqlen_q ≠ seqlen_k.
    #[arg(long)]
    pub causal: bool,
    /// Softmax scale multiplying Q·Kᵀ (default 1/√head_dim).
    #[arg(long, value_name = "S", allow_negative_numbers = true)]
    pub scale: Option<f32>,
    /// Sliding-window (local) attention as flash-attn's window_size: query i sees key j iff
    /// i + offset − L ≤ j ≤ i + offset + R (offset = seqlen_k − seqlen_q); −1 leaves a side
    /// unbounded; with --causal, R is 0. fa2-tc, fa3 and standard take it.
    #[arg(long, value_name = "L,R", allow_hyphen_values = true, value_parser = parse_window)]
    pub window: Option<(i64, i64)>,
    /// Logit soft-capping (Gemma 2): scores become X·tanh(scale·q·k / X) before the softmax
    /// (0, the default, is off). fa2-tc, fa3 and standard take it.
    #[arg(
        long,
        value_name = "X",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub softcap: f32,
    /// The backward: auto (the default: fa3, Hopper's wgmma and TMA, falling back to fa2-tc,
    /// and that to fa2, where it cannot run; the plan says why), fa3, fa2-tc (mma.sync tensor
    /// cores), fa2 (scalar) or standard (S, P, dP, dS in HBM: O(N²) memory).
    #[arg(long, value_name = "ALGORITHM")]
    pub backward_algorithm: Option<Algorithm>,
    /// The backward's dQ with the same bits on every run (fa2-tc orders its adds; standard has
    /// none).
    #[arg(long)]
    pub deterministic: bool,
    /// FA1's SRAM budget M in f32 elements (default: the most that fits in shared memory).
    #[arg(long, value_name = "M")]
    pub fa1_sram_floats: Option<u32>,
    /// FA2's block sizes B_r,B_c, each 64 or 128 (default: the largest that fit).
    #[arg(long, value_name = "R,C", value_parser = parse_fa2_blocks)]
    pub fa2_blocks: Option<(u32, u32)>,
    /// FA2-TC's tiling, e.g. 4x2s1c64 (default: measured per head dim).
    #[arg(long, value_name = "TILING")]
    pub fa2_tc_tiling: Option<String>,
    /// FA3's tiling, e.g. w2c128 or w2c128p (persistent grid; default: per head dim).
    #[arg(long, value_name = "TILING")]
    pub fa3_tiling: Option<String>,
}

impl CallArgs {
    /// The library's options for `algorithm`; a bad tiling names its option.
    pub fn options(&self, algorithm: Algorithm) -> flash_attn::Result<AttentionOptions> {
        Ok(AttentionOptions {
            algorithm,
            backward_algorithm: self.backward_algorithm.unwrap_or_default(),
            deterministic: self.deterministic,
            causal: self.causal,
            window: self.window,
            softcap: self.softcap,
            softmax_scale: self.scale,
            fa1_sram_floats: self.fa1_sram_floats,
            fa2_blocks: self.fa2_blocks,
            fa2_tc_tiling: parse_optional_fa2_tc_tiling(self.fa2_tc_tiling.as_deref())?,
            fa3_tiling: self
                .fa3_tiling
                .as_deref()
                .map(parse_fa3_tiling)
                .transpose()?,
            ..Default::default()
        })
    }
}

/// Splits a comma-separated list into exactly `N` non-empty items.
pub fn split_exact<const N: usize>(list: &str, what: &str) -> Result<[String; N], String> {
    let items: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
    match <[String; N]>::try_from(items) {
        Ok(items) if items.iter().all(|s| !s.is_empty()) => Ok(items),
        _ => Err(format!("expected {N} comma-separated {what}, got `{list}`")),
    }
}

/// Two comma-separated values of `T`, `what` naming the pair and `item` one of them in errors.
fn parse_pair<T: std::str::FromStr>(list: &str, what: &str, item: &str) -> Result<(T, T), String>
where
    T::Err: std::fmt::Display,
{
    let [first, second] = split_exact(list, what)?;
    let parse = |s: &str| s.parse::<T>().map_err(|e| format!("{item} `{s}`: {e}"));
    Ok((parse(&first)?, parse(&second)?))
}

/// `--window L,R`: two integers (the library checks their range and names `window`).
fn parse_window(list: &str) -> Result<(i64, i64), String> {
    parse_pair(list, "window sides (L,R)", "window side")
}

fn parse_fa2_blocks(list: &str) -> Result<(u32, u32), String> {
    parse_pair(list, "block sizes (B_r,B_c)", "block size")
}
