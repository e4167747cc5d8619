//! `flash-attn run`: one algorithm on the user's Q, K, V from a safetensors file, O and the row
//! statistics written to another; with `--backward`, also dQ, dK, dV from the file's dO; with
//! `--packed`, a packed batch of sequences of different lengths (flash-attn's varlen layout).
//! Reading and checking the file happen before the GPU is opened, so a bad file is reported on
//! any machine.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use flash_attn::attention::{Attention, Gradients, PackedBatch, Plan, Problem};
use flash_attn::{Algorithm, AttentionOptions, DeviceTensor, Error, Gpu, Layout, RowStatistics};

use crate::call_args::{CallArgs, split_exact};
use flash_attn_lab::safetensors_io::{
    self, AttentionFileOutput, BACKWARD_INPUT_ROLES, HostQkv, INPUT_ROLES, Qkv, SafetensorsElement,
};

#[derive(clap::Args)]
pub struct RunArgs {
    /// safetensors file holding Q, K and V, each (batch, heads, seqlen, head_dim) (PyTorch SDPA's
    /// layout), all three F32, F16 or BF16. K and V may have fewer heads than Q, a divisor of Q's
    /// (grouped-query attention: query head h reads K/V head h / (heads_q / heads_kv)).
    #[arg(long, value_name = "FILE")]
    pub input: PathBuf,
    /// safetensors file to write: `o` (q's dtype and shape), `lse` (F32, (batch, heads,
    /// seqlen_q)), for fa1 `row_max` and `row_sum`, and with --backward `dq`, `dk`, `dv`.
    #[arg(long, value_name = "FILE")]
    pub output: PathBuf,
    /// auto (the fastest: fa3 on compute capability 9.0, fa2-tc elsewhere, each falling back
    /// where it cannot run, and the plan says why), fa3, fa2-tc, fa2, fa1 or standard.
    #[arg(long, default_value = "auto")]
    algorithm: Algorithm,
    #[command(flatten)]
    call: CallArgs,
    /// The K/V heads the file must hold (grouped-query attention: a divisor of Q's heads; 1 is
    /// MQA). Checked before the GPU is opened; default: whatever the file has.
    #[arg(long, value_name = "H")]
    kv_heads: Option<usize>,
    /// Names of the Q, K and V tensors in the input file.
    #[arg(long, value_name = "Q,K,V", default_value = "q,k,v", value_parser = parse_names)]
    pub names: [String; 3],
    /// Also the backward pass: read dO (q's shape and dtype) from the input file and write dQ,
    /// dK, dV (`attention_backward` on the forward's O and L; not with fa1, whose m and ℓ it
    /// does not take).
    #[arg(long)]
    backward: bool,
    /// Name of the dO tensor in the input file (with --backward).
    #[arg(long, value_name = "NAME", default_value = "do")]
    do_name: String,
    /// The input is a packed batch of sequences of different lengths, as flash-attn's varlen
    /// call takes it: Q (total_q, heads, head_dim), K and V (total_k, heads_kv, head_dim), and
    /// the offsets (1-D I32, U32 or I64, batch + 1 each, from 0; --offsets names them). Writes
    /// `o` (total_q, heads, head_dim) and `lse` (F32, (heads, total_q)); with --backward also
    /// `dq`, `dk`, `dv` from the file's dO (total_q, heads, head_dim), each in its input's
    /// layout. auto, fa3 or fa2-tc (windows and soft-capping too).
    #[arg(long, conflicts_with_all = ["fa1_sram_floats", "fa2_blocks"])]
    packed: bool,
    /// The input is a KV-cache call (decoding): Q (batch, heads, q_tokens ≤ 16, head_dim), and
    /// --names' K and V are the caches, (batch, heads_kv, capacity, head_dim) or, with
    /// --block-table, (pages, heads_kv, page_size, head_dim); each sequence's cache length is
    /// --cache-seqlens. Writes `o`, `lse` (F32, (batch, heads, q_tokens)) and, with --append,
    /// the caches after the append (`k_cache`, `v_cache`). f16 or bf16, head dims 64 and 128.
    #[arg(long, conflicts_with_all = ["backward", "packed"])]
    pub decode: bool,
    /// Name of the cache lengths (1-D I32, U32 or I64, batch) in a KV-cache input (with
    /// --decode).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "cache_seqlens",
        requires = "decode"
    )]
    pub cache_seqlens: String,
    /// Name of a paged cache's block table (2-D I32, U32 or I64, (batch, pages per sequence))
    /// in a KV-cache input (with --decode).
    #[arg(long, value_name = "NAME", requires = "decode")]
    pub block_table: Option<String>,
    /// Names of new keys and values to append to the caches first, each (batch, heads_kv,
    /// new_tokens, head_dim) (with --decode).
    #[arg(long, value_name = "K,V", value_parser = parse_append_names, requires = "decode")]
    pub append: Option<[String; 2]>,
    /// Names of the offsets of Q's and K's rows in a packed input (with --packed).
    #[arg(long, value_name = "Q,K", default_value = "cu_seqlens_q,cu_seqlens_k", value_parser = parse_offset_names)]
    offsets: [String; 2],
}

impl RunArgs {
    /// The library's options; a block-size override for another algorithm than the one run is
    /// refused rather than silently ignored.
    fn options(&self) -> flash_attn::Result<AttentionOptions> {
        let misplaced = [
            (
                "fa1_sram_floats",
                self.call.fa1_sram_floats.is_some(),
                Algorithm::Fa1,
            ),
            ("fa2_blocks", self.call.fa2_blocks.is_some(), Algorithm::Fa2),
            (
                "fa2_tc_tiling",
                self.call.fa2_tc_tiling.is_some(),
                Algorithm::Fa2Tc,
            ),
            ("fa3_tiling", self.call.fa3_tiling.is_some(), Algorithm::Fa3),
        ]
        .into_iter()
        // Auto runs FA3's chain: FA3's tiling applies to it too.
        .map(|(name, given, applies_to)| {
            let applies = applies_to == self.algorithm
                || (applies_to == Algorithm::Fa3 && self.algorithm == Algorithm::Auto);
            (name, given && !applies, applies_to)
        })
        .find(|&(_, misplaced, _)| misplaced);
        if let Some((name, _, applies_to)) = misplaced {
            return Err(Error::InvalidArgument {
                name,
                value: format!("an override with --algorithm {}", self.algorithm),
                allowed: format!("it applies only to --algorithm {applies_to}"),
            });
        }
        if !self.backward {
            let backward_only = [
                ("backward_algorithm", self.call.backward_algorithm.is_some()),
                ("deterministic", self.call.deterministic),
            ];
            if let Some((name, _)) = backward_only.into_iter().find(|&(_, given)| given) {
                return Err(Error::InvalidArgument {
                    name,
                    value: "given without --backward".into(),
                    allowed: "it applies only with --backward".into(),
                });
            }
        } else if self.algorithm == Algorithm::Fa1 {
            return Err(Error::InvalidArgument {
                name: "algorithm",
                value: "fa1 with --backward".into(),
                allowed: "the backward takes L = m + log ℓ: standard, fa2, fa2-tc or fa3".into(),
            });
        }
        self.call.options(self.algorithm)
    }
}

fn parse_names(list: &str) -> Result<[String; 3], String> {
    split_exact(list, "tensor names (q,k,v)")
}

fn parse_append_names(list: &str) -> Result<[String; 2], String> {
    split_exact(list, "tensor names (k_new,v_new)")
}

fn parse_offset_names(list: &str) -> Result<[String; 2], String> {
    split_exact(list, "tensor names (cu_seqlens_q,cu_seqlens_k)")
}

/// "causal ", "window (l, r) ", "softcap X " as the call asks, for the summary line.
fn scoring_words(problem: &Problem) -> String {
    let mut words = String::new();
    if problem.causal {
        words.push_str("causal ");
    }
    if problem.window.is_bounded() {
        words.push_str(&format!("window {:?} ", problem.window_size()));
    }
    if problem.softcap > 0.0 {
        words.push_str(&format!("softcap {} ", problem.softcap));
    }
    words
}

/// `--kv-heads`: the file's K/V heads must be the ones asked for (the problem already checked
/// that they divide Q's).
fn check_kv_heads(expected: Option<usize>, problem: &Problem) -> flash_attn::Result<()> {
    match expected {
        Some(heads_kv) if heads_kv != problem.heads_kv => Err(Error::InvalidArgument {
            name: "kv-heads",
            value: heads_kv.to_string(),
            allowed: format!(
                "the K/V heads of the input file: {} (for {} query heads)",
                problem.heads_kv, problem.heads
            ),
        }),
        _ => Ok(()),
    }
}

/// `run --packed`: the file's packed batch, checked before the GPU is opened, run and written.
fn run_packed(device: usize, args: &RunArgs) -> flash_attn::Result<ExitCode> {
    let options = args.options()?;
    let mut names: Vec<&str> = args.names.iter().map(String::as_str).collect();
    if args.backward {
        names.push(&args.do_name);
    }
    let [cu_q, cu_k] = args.offsets.each_ref().map(String::as_str);
    let (qkv, batch) = safetensors_io::read_packed(&args.input, &names, [cu_q, cu_k])?;
    let problem = batch.problem(qkv.dims(), &options)?;
    check_kv_heads(args.kv_heads, &problem)?;
    let dtype = qkv.dtype();
    let gpu = Gpu::open(device)?;
    let RunOutcome {
        milliseconds,
        plan,
        backward,
    } = match qkv {
        HostQkv::F32(qkv) => run_packed_typed(&gpu, args, &options, &batch, qkv),
        HostQkv::F16(qkv) => run_packed_typed(&gpu, args, &options, &batch, qkv),
        HostQkv::Bf16(qkv) => run_packed_typed(&gpu, args, &options, &batch, qkv),
    }?;
    let [total_q, total_k] = batch.totals();
    println!(
        "{} {}{dtype}: a packed batch of {} sequences ({total_q} query and {total_k} key rows, \
         the longest {:?}) on {}: {milliseconds:.3} ms; wrote {}",
        args.algorithm,
        if problem.causal { "causal " } else { "" },
        batch.sequences(),
        batch.max_seqlens(),
        gpu.info().name,
        args.output.display()
    );
    println!("plan: {plan}");
    if let Some((backward_ms, backward_plan)) = backward {
        println!("backward: {backward_ms:.3} ms (dq, dk, dv written)");
        println!("backward plan: {backward_plan}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Uploads the packed Q, K, V (flash-attn's layout), runs the call (timed on the GPU), with
/// --backward the backward on the file's dO (timed alike), writes O, L and the gradients with
/// the plans in the file's metadata.
fn run_packed_typed<T: SafetensorsElement>(
    gpu: &Gpu,
    args: &RunArgs,
    options: &AttentionOptions,
    batch: &PackedBatch,
    qkv: Qkv<T>,
) -> flash_attn::Result<RunOutcome> {
    let upload =
        |a: &ndarray::Array4<T>| DeviceTensor::from_array(gpu, a.view(), Layout::BatchSeqHeadDim);
    let (q, k, v) = (upload(&qkv.q)?, upload(&qkv.k)?, upload(&qkv.v)?);
    let d_o = qkv.d_o.as_ref().map(upload).transpose()?;
    drop(qkv);
    let call = Attention::new(&q, &k, &v).options(*options).packed(batch);
    let mut out = call.forward(gpu)?;
    let milliseconds = gpu.time_ms(|| call.forward_into(gpu, out.tensors()).map(|_plan| ()))?;
    let plan = out.plan.clone();
    let mut metadata = HashMap::from([
        ("algorithm".into(), args.algorithm.to_string()),
        ("causal".into(), options.causal.to_string()),
        ("window".into(), format!("{:?}", options.window)),
        ("softcap".into(), options.softcap.to_string()),
        ("input".into(), args.input.display().to_string()),
        ("packed_sequences".into(), batch.sequences().to_string()),
        ("kernel".into(), plan.kernel_names()),
        ("plan".into(), plan.to_string()),
    ]);
    let mut backward = None;
    let gradients = match &d_o {
        Some(d_o) => {
            let (backward_ms, backward_plan, gradients) = timed_backward(gpu, &call, &out, d_o)?;
            metadata.extend([
                ("backward_kernel".into(), backward_plan.kernel_names()),
                ("backward_plan".into(), backward_plan.to_string()),
            ]);
            backward = Some((backward_ms, backward_plan));
            Some(gradients)
        }
        None => None,
    };
    safetensors_io::write_packed_outputs(
        &args.output,
        &out.o.to_array(gpu)?,
        &out.stats
            .logsumexp(gpu)?
            .index_axis_move(ndarray::Axis(0), 0),
        gradients.as_ref(),
        metadata,
    )?;
    Ok(RunOutcome {
        milliseconds,
        plan,
        backward,
    })
}

pub fn main(device: usize, args: &RunArgs) -> flash_attn::Result<ExitCode> {
    if args.packed {
        return run_packed(device, args);
    }
    let options = args.options()?;
    if args.decode {
        return crate::run_decode::main(device, args, &options);
    }
    let [q_name, k_name, v_name] = args.names.each_ref().map(String::as_str);
    let qkv = if args.backward {
        safetensors_io::read_backward_inputs(
            &args.input,
            [q_name, k_name, v_name, args.do_name.as_str()],
        )?
    } else {
        safetensors_io::read_qkv(&args.input, [q_name, k_name, v_name])?
    };
    let [q_dims, k_dims, v_dims] = qkv.dims();
    let problem = Problem::new(q_dims, k_dims, v_dims, &options)?;
    check_kv_heads(args.kv_heads, &problem)?;
    let dtype = qkv.dtype();
    let gpu = Gpu::open(device)?;
    let run = Run {
        gpu: &gpu,
        args,
        options: &options,
        problem: &problem,
    };
    let RunOutcome {
        milliseconds,
        plan,
        backward,
    } = match qkv {
        HostQkv::F32(qkv) => run.run_and_write(qkv),
        HostQkv::F16(qkv) => run.run_and_write(qkv),
        HostQkv::Bf16(qkv) => run.run_and_write(qkv),
    }?;
    let mut names = args.names.join(",");
    if args.backward {
        names = format!("{names},{}", args.do_name);
    }
    println!(
        "{} {}{dtype}: q {q_dims:?}, k {k_dims:?}, v {v_dims:?} ({names}) on {}: {milliseconds:.3} ms; wrote {}",
        args.algorithm,
        scoring_words(&problem),
        gpu.info().name,
        args.output.display()
    );
    println!("plan: {plan}");
    if let Some((backward_ms, backward_plan)) = backward {
        println!("backward: {backward_ms:.3} ms (dq, dk, dv written)");
        println!("backward plan: {backward_plan}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The backward of `call` on `d_o` after the forward `out`, timed on the GPU (the kernels and
/// their workspace): its time, its plan, and dQ, dK, dV downloaded.
fn timed_backward<T: SafetensorsElement>(
    gpu: &Gpu,
    call: &Attention<T>,
    out: &flash_attn::AttentionOutput<T>,
    d_o: &DeviceTensor<T>,
) -> flash_attn::Result<(f32, Plan, Gradients<ndarray::Array4<T>>)> {
    let mut result = None;
    let backward_ms = gpu.time_ms(|| {
        result = Some(call.backward(gpu, out, d_o)?);
        Ok(())
    })?;
    let flash_attn::BackwardOutput { gradients, plan } =
        result.ok_or_else(|| Error::File("the backward call returned without gradients".into()))?;
    let gradients = Gradients {
        dq: gradients.dq.to_array(gpu)?,
        dk: gradients.dk.to_array(gpu)?,
        dv: gradients.dv.to_array(gpu)?,
    };
    Ok((backward_ms, plan, gradients))
}

/// What one run did: the forward's time and plan, and the backward's when it ran.
struct RunOutcome {
    milliseconds: f32,
    plan: Plan,
    backward: Option<(f32, Plan)>,
}

/// One checked run on an open GPU: what the per-dtype work shares.
struct Run<'a> {
    gpu: &'a Gpu,
    args: &'a RunArgs,
    options: &'a AttentionOptions,
    problem: &'a Problem,
}

impl Run<'_> {
    /// Uploads Q, K and V, runs the algorithm (timed on the GPU: the kernels and their workspace,
    /// not the transfers), with --backward the backward on the file's dO (timed alike), downloads
    /// O, the statistics and the gradients, writes them (the plans in the file's metadata), and
    /// returns the times and the plans.
    fn run_and_write<T: SafetensorsElement>(&self, qkv: Qkv<T>) -> flash_attn::Result<RunOutcome> {
        let gpu = self.gpu;
        let upload = |a: &ndarray::Array4<T>| {
            DeviceTensor::from_array(gpu, a.view(), Layout::BatchHeadSeqDim)
        };
        let (q, k, v) = (upload(&qkv.q)?, upload(&qkv.k)?, upload(&qkv.v)?);
        let d_o = qkv.d_o.as_ref().map(upload).transpose()?;
        drop(qkv);
        let call = Attention::new(&q, &k, &v).options(*self.options);
        let mut out = call.forward(gpu)?;
        let milliseconds = gpu.time_ms(|| call.forward_into(gpu, out.tensors()).map(|_plan| ()))?;
        let plan = out.plan.clone();
        let row_max_and_sum = match &out.stats {
            RowStatistics::MaxAndSum { max, sum } => Some((max.to_array(gpu)?, sum.to_array(gpu)?)),
            RowStatistics::LogSumExp(_) => None,
        };
        let backward = match &d_o {
            Some(d_o) => Some(timed_backward(gpu, &call, &out, d_o)?),
            None => None,
        };
        let mut metadata = self.metadata(&plan);
        if let Some((_, backward_plan, _)) = &backward {
            metadata.extend(self.backward_metadata(backward_plan));
        }
        let (backward, gradients) = match backward {
            Some((ms, backward_plan, gradients)) => (Some((ms, backward_plan)), Some(gradients)),
            None => (None, None),
        };
        let output = AttentionFileOutput {
            o: out.o.to_array(gpu)?,
            logsumexp: out.stats.logsumexp(gpu)?,
            row_max_and_sum,
            gradients,
            caches: None,
        };
        safetensors_io::write_outputs(&self.args.output, &output, metadata)?;
        Ok(RunOutcome {
            milliseconds,
            plan,
            backward,
        })
    }

    /// How the gradients were made: the backward's options, kernels and plan.
    fn backward_metadata(&self, plan: &Plan) -> HashMap<String, String> {
        HashMap::from([
            (
                "backward_algorithm".into(),
                self.options.backward_algorithm.to_string(),
            ),
            (
                "deterministic".into(),
                self.options.deterministic.to_string(),
            ),
            ("backward_kernel".into(), plan.kernel_names()),
            ("backward_plan".into(), plan.to_string()),
        ])
    }

    /// How the outputs were made, stored in the output file's metadata: the arguments, the
    /// kernels that ran (`kernel`) and the whole plan (`plan`).
    fn metadata(&self, plan: &Plan) -> HashMap<String, String> {
        let mut names = self.args.names.to_vec();
        let roles: &[&str] = if self.args.backward {
            names.push(self.args.do_name.clone());
            &BACKWARD_INPUT_ROLES
        } else {
            &INPUT_ROLES
        };
        let inputs = roles
            .iter()
            .zip(&names)
            .map(|(role, name)| format!("{role}={name}"))
            .collect::<Vec<_>>()
            .join(",");
        HashMap::from([
            ("algorithm".into(), self.args.algorithm.to_string()),
            ("causal".into(), self.problem.causal.to_string()),
            ("window".into(), format!("{:?}", self.problem.window_size())),
            ("softcap".into(), self.problem.softcap.to_string()),
            (
                "softmax_scale".into(),
                self.problem.softmax_scale.to_string(),
            ),
            ("input".into(), self.args.input.display().to_string()),
            ("input_tensors".into(), inputs),
            ("kv_heads".into(), self.problem.heads_kv.to_string()),
            ("kernel".into(), plan.kernel_names()),
            ("plan".into(), plan.to_string()),
        ])
    }
}
