//! Packed batches of sequences of different lengths (flash-attn's `flash_attn_varlen_func`):
//! every sequence's query rows in one Q tensor (total_q, heads, d), its keys and values in one
//! K and one V (total_k, heads_kv, d), and the cumulative offsets `cu_seqlens_q` and
//! `cu_seqlens_k` (batch + 1 each, from 0) that say where each sequence starts. Each sequence
//! attends to its own keys only, with the causal mask (or a sliding window) aligned to its own
//! bottom-right corner, so one call serves a batch of prompts of different lengths without
//! padding. A window or soft-capping (`AttentionOptions::window`, `softcap`) runs the
//! `_varlen_local` kernels, which have both the sequence offsets and the window compiled in.
//!
//! The tensors are [`DeviceTensor`]s of batch 1, in any layout (flash-attn's (batch, seqlen,
//! heads, d) is the packed one); O has Q's dims and L is (heads, total_q), flash-attn's varlen
//! layout. FA3 (`Fa3 { packed: true }`: each head dim's default split on the one-tile grid, its
//! tensor maps over the packed tensors) and FA2-TC (`Fa2Tc { packed: true }`, each head dim's
//! default tiling) run it; FA3 falls back to FA2-TC where it cannot run (the plan says why), and
//! the other algorithms refuse a packed batch.

use flash_kernels::common::params::{
    MAX_SEQUENCES_PER_LAUNCH, Operands, PackedParams, PackedSequences,
};

use super::plan::{Blocks, ForwardPlan, Launch, PlannedLaunch};
use super::{AttentionOptions, Problem, fa2_params, fa3_params};
use crate::device::{Gpu, ParamBlock};
use crate::dtype::Element;
use crate::error::{Error, Result};

/// The sequences of a packed batch: their cumulative offsets into Q's rows and into K's and V's,
/// checked (see [`PackedBatch::new`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedBatch {
    cu_seqlens_q: Vec<u32>,
    cu_seqlens_k: Vec<u32>,
}

impl PackedBatch {
    /// Sequence b's queries are Q's rows `cu_seqlens_q[b]..cu_seqlens_q[b + 1]`, its keys K's
    /// and V's rows `cu_seqlens_k[b]..cu_seqlens_k[b + 1]`. Both lists have batch + 1 ≥ 2
    /// entries, start at 0 and never decrease (a sequence may be empty: its rows, if any, get
    /// O = 0 and L = −∞); anything else is an `InvalidArgument` naming the list.
    pub fn new(cu_seqlens_q: &[u32], cu_seqlens_k: &[u32]) -> Result<Self> {
        for (name, offsets) in [
            ("cu_seqlens_q", cu_seqlens_q),
            ("cu_seqlens_k", cu_seqlens_k),
        ] {
            if offsets.len() < 2 {
                return Err(Error::invalid(
                    name,
                    format!("{offsets:?}"),
                    "batch + 1 ≥ 2 offsets: 0, then where each sequence ends",
                ));
            }
            if offsets[0] != 0 {
                return Err(Error::invalid(
                    name,
                    format!("{offsets:?}"),
                    "offsets starting at 0",
                ));
            }
            if let Some(b) = offsets.windows(2).position(|w| w[1] < w[0]) {
                return Err(Error::invalid(
                    name,
                    format!("{offsets:?}"),
                    format!(
                        "offsets that never decrease (entry {} is {} after {})",
                        b + 1,
                        offsets[b + 1],
                        offsets[b]
                    ),
                ));
            }
        }
        if cu_seqlens_q.len() != cu_seqlens_k.len() {
            return Err(Error::invalid(
                "cu_seqlens_k",
                format!("{} offsets", cu_seqlens_k.len()),
                format!(
                    "as many as cu_seqlens_q ({}): one sequence of keys per sequence of queries",
                    cu_seqlens_q.len()
                ),
            ));
        }
        Ok(Self {
            cu_seqlens_q: cu_seqlens_q.to_vec(),
            cu_seqlens_k: cu_seqlens_k.to_vec(),
        })
    }

    /// The same lengths for queries and keys (self-attention over packed prompts).
    pub fn from_lengths(lengths: &[usize]) -> Result<Self> {
        let offsets = cumulative(lengths)?;
        Self::new(&offsets, &offsets)
    }

    /// Each sequence's (query, key) lengths.
    pub fn from_length_pairs(lengths: &[(usize, usize)]) -> Result<Self> {
        let queries: Vec<usize> = lengths.iter().map(|l| l.0).collect();
        let keys: Vec<usize> = lengths.iter().map(|l| l.1).collect();
        Self::new(&cumulative(&queries)?, &cumulative(&keys)?)
    }

    /// The number of sequences.
    pub fn sequences(&self) -> usize {
        self.cu_seqlens_q.len() - 1
    }

    /// Sequence `b`'s query rows and key rows.
    pub fn rows(&self, b: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let range = |offsets: &[u32]| offsets[b] as usize..offsets[b + 1] as usize;
        (range(&self.cu_seqlens_q), range(&self.cu_seqlens_k))
    }

    /// Q's rows and K's rows in all.
    pub fn totals(&self) -> [usize; 2] {
        [&self.cu_seqlens_q, &self.cu_seqlens_k].map(|o| o[o.len() - 1] as usize)
    }

    /// The longest sequence of queries and of keys.
    pub fn max_seqlens(&self) -> [usize; 2] {
        [&self.cu_seqlens_q, &self.cu_seqlens_k].map(|o| {
            o.windows(2)
                .map(|w| (w[1] - w[0]) as usize)
                .max()
                .unwrap_or(0)
        })
    }

    /// The tables of the launches that run this batch, in order, each with its number of
    /// sequences: at most [`MAX_SEQUENCES_PER_LAUNCH`] sequences per launch, each table holding
    /// its sequences' offsets into the whole packed tensors (the kernels read them from their
    /// parameter block, `PackedSequences`).
    pub fn launch_tables(&self) -> Vec<(u32, PackedSequences)> {
        let totals = self.totals().map(|t| t as u32);
        launch_ranges(self.sequences())
            .map(|(first, last)| {
                let offsets = first..=last;
                let table = PackedSequences::new(
                    totals,
                    &self.cu_seqlens_q[offsets.clone()],
                    &self.cu_seqlens_k[offsets],
                )
                .expect("a launch's offsets fit its table");
                ((last - first) as u32, table)
            })
            .collect()
    }

    pub fn cu_seqlens_q(&self) -> &[u32] {
        &self.cu_seqlens_q
    }

    pub fn cu_seqlens_k(&self) -> &[u32] {
        &self.cu_seqlens_k
    }

    /// The checked problem of this batch on Q, K, V of these dims (logical (1, heads, total,
    /// d)): the last offsets must be Q's and K's row counts.
    pub fn problem(&self, dims: [[usize; 4]; 3], options: &AttentionOptions) -> Result<Problem> {
        let [total_q, total_k] = self.totals();
        for (name, offsets, tensor, dims, total) in [
            ("cu_seqlens_q", &self.cu_seqlens_q, "q", dims[0], total_q),
            ("cu_seqlens_k", &self.cu_seqlens_k, "k", dims[1], total_k),
        ] {
            if dims[2] != total {
                return Err(Error::invalid(
                    name,
                    format!("offsets ending at {total} ({} entries)", offsets.len()),
                    format!(
                        "its last offset must be {tensor}'s rows ({}; {tensor} is {dims:?})",
                        dims[2]
                    ),
                ));
            }
        }
        let [max_q, max_k] = self.max_seqlens();
        // A batch of empty sequences still has one row to launch over.
        Problem::packed(
            dims,
            self.sequences(),
            [max_q.max(1), max_k.max(1)],
            options,
        )
    }
}

/// Offsets that stay in device memory (flash-attn's `cu_seqlens` as a data collator leaves them
/// on the GPU): the kernels read them there, so the call needs no copy to the host and no wait
/// for the work queued before it. The host knows only how many sequences there are and the
/// caller's bounds on the longest (flash-attn's `max_seqlen_q`, `max_seqlen_k`), which size the
/// grid; it checks no offset. The kernels clamp each sequence's rows into the tensors and its
/// lengths to those bounds, so wrong offsets give wrong rows but never an access outside the
/// tensors and workspaces; a sequence longer than its bound is cut to it (flash-attn leaves the
/// rest unwritten).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceOffsets {
    cu_seqlens_q: u64,
    cu_seqlens_k: u64,
    sequences: usize,
    max_seqlens: [usize; 2],
}

impl DeviceOffsets {
    /// `sequences` + 1 u32 offsets each at device addresses `cu_seqlens_q` and `cu_seqlens_k`
    /// (flash-attn's int32 `cu_seqlens`), the longest sequences at most `max_seqlens`.
    /// Errors name an address that is 0 or not 4-byte aligned, and a batch of no sequence.
    ///
    /// # Safety
    /// Both addresses must hold `sequences` + 1 readable u32s in the memory of the GPU the call
    /// runs on, until the call's kernels have finished (stream order).
    pub unsafe fn new(
        cu_seqlens_q: u64,
        cu_seqlens_k: u64,
        sequences: usize,
        max_seqlens: [usize; 2],
    ) -> Result<Self> {
        for (name, address) in [
            ("cu_seqlens_q", cu_seqlens_q),
            ("cu_seqlens_k", cu_seqlens_k),
        ] {
            if address == 0 || address % 4 != 0 {
                return Err(Error::invalid(
                    name,
                    format!("device address {address:#x}"),
                    "the address of 4-byte-aligned int32 offsets in device memory",
                ));
            }
        }
        if sequences == 0 {
            return Err(Error::invalid(
                "cu_seqlens_q",
                "1 offset",
                "batch + 1 ≥ 2 offsets: 0, then where each sequence ends",
            ));
        }
        Ok(Self {
            cu_seqlens_q,
            cu_seqlens_k,
            sequences,
            max_seqlens,
        })
    }
}

/// A packed batch's sequences, read on the host ([`PackedBatch`], checked) or left on the device
/// ([`DeviceOffsets`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackedOffsets<'a> {
    Host(&'a PackedBatch),
    Device(DeviceOffsets),
}

impl PackedOffsets<'_> {
    /// The number of sequences.
    pub fn sequences(&self) -> usize {
        match self {
            Self::Host(batch) => batch.sequences(),
            Self::Device(offsets) => offsets.sequences,
        }
    }

    /// The checked problem of this batch on Q, K, V of these dims (logical (1, heads, total,
    /// d)): [`PackedBatch::problem`]'s, or for offsets on the device the tensors' rows with the
    /// caller's bounds on the longest sequences (at most the rows: no sequence is longer).
    pub fn problem(&self, dims: [[usize; 4]; 3], options: &AttentionOptions) -> Result<Problem> {
        match self {
            Self::Host(batch) => batch.problem(dims, options),
            Self::Device(offsets) => {
                let totals = [dims[0][2], dims[1][2]];
                let [max_q, max_k] = [0, 1].map(|i| offsets.max_seqlens[i].min(totals[i]).max(1));
                Problem::packed(dims, offsets.sequences, [max_q, max_k], options)
            }
        }
    }

    /// The parameter tables of the launches that run this batch, in order, each with its number
    /// of sequences ([`PackedBatch::launch_tables`]); offsets on the device give each launch the
    /// addresses of its first sequence's entries. `totals`: Q's and K's rows.
    pub fn launch_tables(&self, totals: [usize; 2]) -> Vec<(u32, PackedSequences)> {
        match self {
            Self::Host(batch) => batch.launch_tables(),
            Self::Device(offsets) => {
                let totals = totals.map(|t| t as u32);
                launch_ranges(offsets.sequences)
                    .map(|(first, last)| {
                        let at_first = [offsets.cu_seqlens_q, offsets.cu_seqlens_k]
                            .map(|a| a + 4 * first as u64);
                        let table = PackedSequences::in_device_memory(totals, at_first);
                        ((last - first) as u32, table)
                    })
                    .collect()
            }
        }
    }
}

/// The sequences of each launch of a packed batch of `sequences`: (first, first + count), at
/// most [`MAX_SEQUENCES_PER_LAUNCH`] each.
fn launch_ranges(sequences: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..sequences)
        .step_by(MAX_SEQUENCES_PER_LAUNCH)
        .map(move |first| (first, (first + MAX_SEQUENCES_PER_LAUNCH).min(sequences)))
}

/// `launches` over the packed batch of `problem` (its sequences `batch`): each once per table of
/// at most MAX_SEQUENCES_PER_LAUNCH sequences, over its own sequences' heads, with `family` as
/// `per_launch` sets it for the table's first sequence and count (its shape's batch at least);
/// the grid's x and z stay the longest sequence's of the whole batch.
pub(super) fn launch_sequences<P: ParamBlock>(
    gpu: &Gpu,
    launches: &[PlannedLaunch],
    problem: &Problem,
    batch: PackedOffsets,
    family: P,
    per_launch: impl Fn(&mut P, u32, u32),
) -> Result<()> {
    let whole = problem.whole();
    let totals = [whole.seqlen_q, whole.seqlen_k];
    for (index, (sequences, table)) in batch.launch_tables(totals).into_iter().enumerate() {
        let mut family = family;
        per_launch(
            &mut family,
            (index * MAX_SEQUENCES_PER_LAUNCH) as u32,
            sequences,
        );
        let params = PackedParams {
            family,
            sequences: table,
        };
        for PlannedLaunch { kernel, launch } in launches {
            let (x, _, z) = launch.grid;
            let grid = (x, sequences * problem.heads as u32, z);
            gpu.launch(*kernel, Launch { grid, ..*launch }, params)?;
        }
    }
    Ok(())
}

/// Cumulative offsets 0, l₀, l₀ + l₁, … of `lengths`, in u32 (an error past it).
fn cumulative(lengths: &[usize]) -> Result<Vec<u32>> {
    let mut offsets = vec![0u32];
    let mut total = 0usize;
    for &length in lengths {
        total += length;
        offsets.push(u32::try_from(total).map_err(|_| {
            Error::invalid("lengths", total, format!("a total of at most {}", u32::MAX))
        })?);
    }
    Ok(offsets)
}

/// Launches a packed call's plan (its problem from [`PackedBatch::problem`], O with Q's dims, L
/// of heads·total_q floats at `logsumexp`): once per table of at most 255 sequences.
pub(crate) fn launch_packed<T: Element>(
    gpu: &Gpu,
    plan: &ForwardPlan,
    operands: Operands,
    dims: [[usize; 4]; 3],
    logsumexp: u64,
    batch: PackedOffsets,
) -> Result<()> {
    let problem = &plan.problem;
    let launches = &plan.launches;
    match plan.blocks {
        Blocks::Fa2Tc(tiling) => {
            let family = fa2_params(operands, problem, logsumexp, tiling.block_rows());
            launch_sequences(gpu, launches, problem, batch, family, |p, first, n| {
                problem.shape_for_launch(&mut p.shape, first, n)
            })?
        }
        Blocks::Fa3 { tiling, .. } => {
            // The tensor maps span the packed tensors (batch 1, every sequence's rows).
            let shape = problem.shape();
            let family = fa3_params::<T>(gpu, &operands, dims, tiling, shape, logsumexp)?;
            launch_sequences(gpu, launches, problem, batch, family, |p, first, n| {
                problem.shape_for_launch(&mut p.shape, first, n)
            })?
        }
        _ => unreachable!("a packed batch plans FA3 or FA2-TC, or fails"),
    }
    Ok(())
}
