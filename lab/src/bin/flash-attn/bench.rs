//! `flash-attn bench`: the sweep, memory and longest-N search, merged with PyTorch's numbers.

use std::path::PathBuf;
use std::process::ExitCode;

use flash_attn::{DType, Error, Gpu};
use flash_attn_lab::tools::bench::chart::chart_svg;
use flash_attn_lab::tools::bench::report::{memory_table, merged_table, read_records};
use flash_attn_lab::tools::bench::runner::{max_seqlen, run_case};
use flash_attn_lab::tools::bench::{BenchReport, SweepConfig};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// A small subset (N = 1024 and 4096) that runs in well under a minute.
    #[arg(long)]
    quick: bool,
    /// Element type of Q, K, V, O.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Sequence lengths (default: 512,1024,2048,4096,8192,16384).
    #[arg(long, value_delimiter = ',')]
    seqlens: Vec<usize>,
    /// Head dims (default: 64,128).
    #[arg(long, value_delimiter = ',')]
    head_dims: Vec<usize>,
    /// Causal settings to run: off, on, or both (default).
    #[arg(long, default_value = "both")]
    causal: String,
    /// Algorithms (default: all).
    #[arg(long, value_delimiter = ',')]
    algorithms: Vec<String>,
    /// batch · seqlen.
    #[arg(long, default_value_t = 16384)]
    tokens: usize,
    /// heads · head_dim.
    #[arg(long, default_value_t = 2048)]
    hidden: usize,
    /// PyTorch results (from lab/scripts/torch_sdpa_bench.py) to merge into the table.
    #[arg(long)]
    torch: Option<PathBuf>,
    /// Where bench.json, bench.md and bench.svg go.
    #[arg(long, default_value = "bench-results")]
    out_dir: PathBuf,
    /// Skip the search for the longest N that fits at batch 1.
    #[arg(long)]
    no_max_seqlen: bool,
    /// FA2-TC's tiling as WARPSxROW_TILES[sSTAGES][cB_C]: 4x1, 8x1 or 4x2, each with s2 (the
    /// default) or s1; 4x2 also with c32 (B_c = 32; default c64) and as 4x2s2c48, e.g. 4x2s1c32
    /// (default: the library's per head dim).
    #[arg(long)]
    fa2_tc_tiling: Option<String>,
    /// FA3's tiling as wCONSUMERScB_C, e.g. w2c176, with a trailing p for the persistent grid,
    /// e.g. w3c128p (default: the library's per head dim; the compiled ones: `flash-attn info`).
    #[arg(long)]
    fa3_tiling: Option<String>,
    /// The decode benchmark instead of the sweep: one query token against a KV cache at
    /// ANCHORS.md's shapes (bf16, d = 128, 32 query heads on 8 KV heads, 4k–128k keys, batch
    /// 1–64), µs and K+V bytes/s; `--torch` then names lab/scripts/torch_decode_bench.py's JSON.
    #[arg(long)]
    decode: bool,
    /// With --decode: also time our decode forced to these variants, comma-separated:
    /// `two-launch`, `one-launch` (the splits' merge), `s<N>` (N splits), or both joined by `+`,
    /// e.g. `two-launch,s16,s64+one-launch`. Each is a column beside the plan's `decode`.
    #[arg(long, value_delimiter = ',', requires = "decode")]
    decode_variants: Vec<String>,
    /// With --decode: only these of its shapes, as KEYSxBATCH, comma-separated, e.g.
    /// `131072x16,32768x64` (default: all).
    #[arg(long, value_delimiter = ',', requires = "decode")]
    decode_shapes: Vec<String>,
    /// The backward benchmark instead of the sweep: each of --backward-variants at the sweep's
    /// shapes (default N = 2k–16k), the backward alone and forward + backward, TFLOP/s = 2.5 ×
    /// (3.5 ×) the forward's FLOPs / time; `--torch` then names
    /// lab/scripts/torch_backward_bench.py's JSON. Writes backward.md and backward.json.
    #[arg(long)]
    backward: bool,
    /// Backward variants: fa3, fa2-tc, fa2, fa2-tc-deterministic, fa3-deterministic, standard
    /// (default: the first four; with --memory, standard and fa2-tc).
    #[arg(long, value_delimiter = ',')]
    backward_variants: Vec<String>,
    /// The forward before our backward (its O and L; timed in forward + backward): fa3 (the
    /// default; fa2-tc where FA3 cannot run, as the plan says), fa2-tc, fa2 or standard.
    #[arg(long, default_value = "fa3")]
    forward_algorithm: String,
    /// With --backward: the memory table instead of the timings: peak device memory of the
    /// backward (tensors and workspace) per variant at batch 1, heads·d = --hidden, d = the first
    /// --head-dims (default 128), N = 1k, 2k, … --memory-max-seqlen, and where each runs out of
    /// memory.
    #[arg(long)]
    memory: bool,
    /// The longest N of the memory table.
    #[arg(long, default_value_t = 131072)]
    memory_max_seqlen: usize,
}

impl BenchArgs {
    fn config(&self) -> flash_attn::Result<SweepConfig> {
        let dtype: DType = self.dtype.parse()?;
        let mut config = if self.quick {
            SweepConfig::quick(dtype)
        } else {
            SweepConfig::full(dtype)
        };
        if !self.seqlens.is_empty() {
            config.seqlens = self.seqlens.clone();
        }
        if !self.head_dims.is_empty() {
            config.head_dims = self.head_dims.clone();
        }
        if !self.algorithms.is_empty() {
            config.algorithms = self
                .algorithms
                .iter()
                .map(|a| a.parse())
                .collect::<Result<_, _>>()?;
        }
        config.causal = super::parse_causal(&self.causal)?;
        config.tokens = self.tokens;
        config.fa2_tc_tiling = self
            .fa2_tc_tiling
            .as_deref()
            .map(|text| flash_attn::attention::parse_fa2_tc_tiling(text).map(|t| t.to_string()))
            .transpose()?;
        config.fa3_tiling = self
            .fa3_tiling
            .as_deref()
            .map(|text| flash_attn::attention::parse_fa3_tiling(text).map(|t| t.to_string()))
            .transpose()?;
        config.hidden = self.hidden;
        Ok(config)
    }
}

pub fn main(device: usize, args: &BenchArgs) -> flash_attn::Result<ExitCode> {
    if args.decode {
        return decode_main(device, args);
    }
    if args.backward {
        return backward_main(device, args);
    }
    let config = args.config()?;
    let gpu = match Gpu::open(device) {
        Ok(gpu) => gpu,
        Err(e @ (Error::NoDriver | Error::NoDevice { .. })) => {
            println!(
                "no GPU, nothing timed ({e}); the HBM traffic the articles' formulas predict:"
            );
            println!("{}", super::io::predicted_table_markdown(&config));
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    let torch = args.torch.as_deref().map(read_records).transpose()?;
    let shapes = config.shapes();
    let progress = progress_bar(shapes.len() * config.algorithms.len());
    let mut rng = rand::rng();
    let mut records = Vec::new();
    for shape in &shapes {
        for &algorithm in &config.algorithms {
            progress.set_message(format!(
                "{algorithm} N={} d={} causal={}",
                shape.seqlen, shape.head_dim, shape.causal
            ));
            records.push(run_case(&gpu, algorithm, *shape, &config, &mut rng));
            progress.inc(1);
        }
    }
    progress.finish_and_clear();

    let mut max_seqlens = Vec::new();
    if !args.no_max_seqlen {
        for &algorithm in &config.algorithms {
            for &head_dim in &config.head_dims {
                max_seqlens.push(max_seqlen(
                    &gpu,
                    algorithm,
                    config.dtype,
                    head_dim,
                    config.hidden,
                )?);
            }
        }
    }
    let mut all = records.clone();
    all.extend(torch.unwrap_or_default());
    std::fs::create_dir_all(&args.out_dir)
        .map_err(|e| Error::File(format!("cannot create {}: {e}", args.out_dir.display())))?;
    let report = BenchReport {
        device: gpu.info().name.clone(),
        config: config.clone(),
        records,
        max_seqlen: max_seqlens,
    };
    let write = |name: &str, text: &str| {
        let path = args.out_dir.join(name);
        std::fs::write(&path, text)
            .map_err(|e| Error::File(format!("cannot write {}: {e}", path.display())))
    };
    write(
        "bench.json",
        &serde_json::to_string_pretty(&report).map_err(|e| Error::File(e.to_string()))?,
    )?;
    chart_svg(&all, &args.out_dir.join("bench.svg"))?;

    let mut markdown = format!(
        "## {} TFLOP/s on {} ({} tokens, hidden {})\n\n",
        config.dtype, report.device, config.tokens, config.hidden
    );
    markdown.push_str(&merged_table(&all));
    markdown.push_str("\n## Peak device memory of one call (inputs, output, workspace)\n\n");
    markdown.push_str(&memory_table(&all));
    if !report.max_seqlen.is_empty() {
        markdown.push_str("\n## Longest N at batch 1 (buffers allocated)\n\n| algorithm | d | heads | N |\n|---|---|---|---|\n");
        for m in &report.max_seqlen {
            markdown.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                m.implementation, m.head_dim, m.heads, m.seqlen
            ));
        }
    }
    write("bench.md", &markdown)?;
    println!("{markdown}");
    let failures: Vec<_> = report
        .records
        .iter()
        .filter(|r| {
            r.error
                .as_deref()
                .is_some_and(|e| !e.contains("out of device memory"))
        })
        .collect();
    for f in &failures {
        println!(
            "error: {} {:?}: {}",
            f.implementation,
            f.shape,
            f.error.as_deref().unwrap_or_default()
        );
    }
    println!(
        "results: {}/bench.json, bench.md, bench.svg",
        args.out_dir.display()
    );
    Ok(if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `bench --decode`: our decode at ANCHORS.md's shapes, merged with PyTorch's.
fn decode_main(device: usize, args: &BenchArgs) -> flash_attn::Result<ExitCode> {
    use flash_attn_lab::tools::bench::decode::{
        DecodeVariant, anchor_shapes, decode_table, read_decode_records, select_shapes, time_decode,
    };
    let dtype: DType = args.dtype.parse()?;
    let shapes = select_shapes(anchor_shapes(args.quick), &args.decode_shapes)?;
    let mut variants = vec![DecodeVariant::PLAN];
    for text in &args.decode_variants {
        variants.push(text.parse()?);
    }
    let gpu = match Gpu::open(device) {
        Ok(gpu) => gpu,
        Err(e @ (Error::NoDriver | Error::NoDevice { .. })) => {
            println!(
                "no GPU, nothing timed ({e}); the K+V bytes each shape reads, and the time at 4.5 TB/s:"
            );
            for s in &shapes {
                let bytes = s.kv_bytes(dtype.size_bytes()) as f64;
                println!(
                    "  {} keys × batch {}: {:.1} MB, {:.1} µs",
                    s.kv_len,
                    s.batch,
                    bytes / 1e6,
                    bytes / 4.5e6
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    let repeats = if args.quick { 20 } else { 100 };
    let mut records = Vec::new();
    for &shape in &shapes {
        for &variant in &variants {
            records.push(time_decode(&gpu, dtype, shape, variant, repeats));
        }
    }
    let ours = records.clone();
    if let Some(path) = &args.torch {
        records.extend(read_decode_records(path)?);
    }
    std::fs::create_dir_all(&args.out_dir)
        .map_err(|e| Error::File(format!("cannot create {}: {e}", args.out_dir.display())))?;
    let mut markdown = format!(
        "## Decode on {}: {dtype}, one query token, K+V bytes read per second\n\n",
        gpu.info().name
    );
    markdown.push_str(&decode_table(&records));
    markdown.push_str("\nPlans:\n");
    for r in &ours {
        markdown.push_str(&format!(
            "- {} keys × batch {}: {}\n",
            r.shape.kv_len,
            r.shape.batch,
            r.plan.as_deref().or(r.error.as_deref()).unwrap_or_default()
        ));
    }
    let write = |name: &str, text: &str| {
        let path = args.out_dir.join(name);
        std::fs::write(&path, text)
            .map_err(|e| Error::File(format!("cannot write {}: {e}", path.display())))
    };
    write("decode.md", &markdown)?;
    write(
        "decode.json",
        &serde_json::to_string_pretty(&ours).map_err(|e| Error::File(e.to_string()))?,
    )?;
    println!("{markdown}");
    println!("results: {}/decode.md, decode.json", args.out_dir.display());
    Ok(if ours.iter().any(|r| r.error.is_some()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `bench --backward`: our backward variants' timings (or, with --memory, their peak memory by
/// N), merged with PyTorch's.
fn backward_main(device: usize, args: &BenchArgs) -> flash_attn::Result<ExitCode> {
    use flash_attn_lab::tools::bench::backward::{
        BackwardBenchConfig, BackwardVariant, backward_tables, memory_rows, memory_seqlens,
        memory_table, read_backward_records, time_backward,
    };
    let mut config = args.config()?;
    if args.seqlens.is_empty() {
        config.seqlens = if args.quick {
            vec![2048, 8192]
        } else {
            vec![2048, 4096, 8192, 16384]
        };
    }
    let variants: Vec<BackwardVariant> = if !args.backward_variants.is_empty() {
        args.backward_variants
            .iter()
            .map(|v| v.parse())
            .collect::<Result<_, _>>()?
    } else if args.memory {
        BackwardVariant::MEMORY.to_vec()
    } else {
        BackwardVariant::TIMED.to_vec()
    };
    let forward: flash_attn::Algorithm = args.forward_algorithm.parse()?;
    let backward_config = BackwardBenchConfig {
        dtype: config.dtype,
        forward,
        repeats: if args.quick { 5 } else { 20 },
    };
    let torch = if args.memory {
        None
    } else {
        args.torch
            .as_deref()
            .map(read_backward_records)
            .transpose()?
    };
    let gpu = match Gpu::open(device) {
        Ok(gpu) => gpu,
        Err(e @ (Error::NoDriver | Error::NoDevice { .. })) => {
            println!("no GPU, nothing timed ({e})");
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    std::fs::create_dir_all(&args.out_dir)
        .map_err(|e| Error::File(format!("cannot create {}: {e}", args.out_dir.display())))?;
    let write = |name: &str, text: &str| {
        let path = args.out_dir.join(name);
        std::fs::write(&path, text)
            .map_err(|e| Error::File(format!("cannot write {}: {e}", path.display())))
    };
    if args.memory {
        let head_dim = args.head_dims.first().copied().unwrap_or(128);
        let heads = (config.hidden / head_dim).max(1);
        let seqlens = memory_seqlens(args.memory_max_seqlen);
        let mut cells = Vec::new();
        for &variant in &variants {
            cells.extend(memory_rows(
                &gpu,
                variant,
                &backward_config,
                heads,
                head_dim,
                &seqlens,
            )?);
        }
        let markdown = format!(
            "## Peak device memory of the backward on {} ({}, after the {forward} forward; Q, K, \
             V, O, L, dO, dQ, dK, dV and the workspace)\n\n{}",
            gpu.info().name,
            config.dtype,
            memory_table(&cells, heads, head_dim)
        );
        write("backward-memory.md", &markdown)?;
        write("backward-memory.json", &to_json(&cells)?)?;
        println!("{markdown}");
        println!(
            "results: {}/backward-memory.md, backward-memory.json",
            args.out_dir.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let shapes = config.shapes();
    let progress = progress_bar(shapes.len() * variants.len());
    let mut rng = rand::rng();
    let mut records = Vec::new();
    for shape in &shapes {
        for &variant in &variants {
            progress.set_message(format!(
                "{} N={} d={} causal={}",
                variant.name(),
                shape.seqlen,
                shape.head_dim,
                shape.causal
            ));
            records.push(time_backward(
                &gpu,
                variant,
                *shape,
                &backward_config,
                &mut rng,
            ));
            progress.inc(1);
        }
    }
    progress.finish_and_clear();
    let ours = records.clone();
    records.extend(torch.unwrap_or_default());
    let mut markdown = format!(
        "## {} backward TFLOP/s on {} ({} tokens, hidden {})\n\n{}",
        config.dtype,
        gpu.info().name,
        config.tokens,
        config.hidden,
        backward_tables(&records, forward)
    );
    markdown.push_str("\nPlans:\n");
    for r in &ours {
        markdown.push_str(&format!(
            "- {} d = {} N = {} causal = {}: {}\n",
            r.implementation,
            r.shape.head_dim,
            r.shape.seqlen,
            r.shape.causal,
            r.plan.as_deref().or(r.error.as_deref()).unwrap_or_default()
        ));
    }
    write("backward.md", &markdown)?;
    write("backward.json", &to_json(&ours)?)?;
    println!("{markdown}");
    println!(
        "results: {}/backward.md, backward.json",
        args.out_dir.display()
    );
    let failures = ours
        .iter()
        .filter(|r| {
            r.error
                .as_deref()
                .is_some_and(|e| !e.contains("out of device memory"))
        })
        .count();
    Ok(if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `value` as pretty JSON.
fn to_json(value: &impl serde::Serialize) -> flash_attn::Result<String> {
    serde_json::to_string_pretty(value).map_err(|e| Error::File(e.to_string()))
}

/// A progress bar over `cases` cases, with the current one's message and the time so far.
fn progress_bar(cases: usize) -> ProgressBar {
    let progress = ProgressBar::new(cases as u64);
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg} [{elapsed_precise}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    progress
}
