//! What the caller asks for, checked: the algorithm, the options, and the problem's shape.

use flash_kernels::common::mask::KeyWindow;
use flash_kernels::common::params::AttentionShape;
use flash_kernels::common::softcap::Softcap;
use flash_kernels::fwd::fa2_tc::config::{DEFAULT_BLOCK_COLS, Fa2TcTiling};
use flash_kernels::fwd::fa3::config::Fa3Tiling;
use flash_kernels::fwd::standard::config::MATMUL_TILE;
use flash_kernels::registry::KernelForm;

use super::alibi::{self, AlibiSlopes};
use super::dropout::{self, Dropout};
use crate::error::{Error, Result};
use crate::scoring::Scoring;

/// Largest head dim any algorithm takes.
pub const MAX_HEAD_DIM: usize = 256;
/// CUDA's limit on grid dimensions y and z.
const MAX_GRID_YZ: usize = 65_535;

/// Which kernel(s) compute the attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// The fastest kernel for the device and the call: FA3 on compute capability 9.0, FA2 on
    /// tensor cores elsewhere, each falling back where it cannot run (the plan says why). The
    /// default, forward and backward; a KV-cache call runs the decode kernels.
    #[default]
    Auto,
    /// S and P materialised in HBM, three kernels.
    Standard,
    /// FlashAttention-1 forward: outer loop over K/V blocks; returns m and ℓ.
    Fa1,
    /// FlashAttention-2 forward: outer loop over Q blocks; returns L.
    Fa2,
    /// FlashAttention-2 forward on tensor cores (mma.sync, ldmatrix, cp.async), f16/bf16 at the
    /// compiled head dims (32, 64, 96, 128, 256) with 16-byte-aligned rows; anything else runs
    /// [`Algorithm::Fa2`], and the plan says why.
    Fa2Tc,
    /// FlashAttention-3 forward on Hopper (TMA, wgmma, a producer and consumer warpgroups),
    /// f16/bf16, head dims up to 256 (each on the smallest compiled one that holds it: 64, 96,
    /// 128, 192, 256), compute capability 9.0 with 16-byte-aligned rows; anything else runs
    /// [`Algorithm::Fa2Tc`], and the plan says why.
    Fa3,
}

impl Algorithm {
    /// The kernel families (every algorithm but `Auto`, which picks one of them).
    pub const FAMILIES: [Algorithm; 5] = [
        Algorithm::Standard,
        Algorithm::Fa1,
        Algorithm::Fa2,
        Algorithm::Fa2Tc,
        Algorithm::Fa3,
    ];
    /// The families with a backward pass.
    pub const BACKWARD_FAMILIES: [Algorithm; 4] = [
        Algorithm::Standard,
        Algorithm::Fa2,
        Algorithm::Fa2Tc,
        Algorithm::Fa3,
    ];
    pub const ALL: [Algorithm; 6] = [
        Algorithm::Auto,
        Algorithm::Standard,
        Algorithm::Fa1,
        Algorithm::Fa2,
        Algorithm::Fa2Tc,
        Algorithm::Fa3,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Auto => "auto",
            Algorithm::Standard => "standard",
            Algorithm::Fa1 => "fa1",
            Algorithm::Fa2 => "fa2",
            Algorithm::Fa2Tc => "fa2-tc",
            Algorithm::Fa3 => "fa3",
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Algorithm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                Error::invalid(
                    "algorithm",
                    s,
                    "allowed: auto, fa3, fa2-tc, fa2, fa1, standard",
                )
            })
    }
}

/// A call's options: the mask, the scores, the algorithm of each pass, and per-family tuning
/// overrides (each applies to one family; `None` is the measured default).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionOptions {
    /// The forward's kernel family (and a packed batch's); default [`Algorithm::Auto`].
    pub algorithm: Algorithm,
    /// The backward's kernel family: auto (fa3, falling back to fa2-tc, then fa2), fa3, fa2-tc,
    /// fa2 or standard; default [`Algorithm::Auto`].
    pub backward_algorithm: Algorithm,
    /// The backward's dQ the same bits on every run: the key blocks add to each row block's dQ
    /// in a fixed order (fa2-tc's kernels; auto and fa3 fall back to them, with the reason).
    pub deterministic: bool,
    /// Causal mask, aligned to the bottom-right corner (see `flash_kernels::mask`).
    pub causal: bool,
    /// Sliding-window (local) attention, flash-attn's `window_size = (left, right)`: query i sees
    /// key j iff i + offset − left ≤ j ≤ i + offset + right (offset = seqlen_k − seqlen_q, the
    /// causal mask's bottom-right alignment); −1 leaves a side unbounded, `None` is (−1, −1).
    /// With `causal`, right is 0 whatever it says here. A row that sees no key (possible with
    /// seqlen_q > seqlen_k) gets O = 0 and L = −∞, as in flash-attn. `fa2-tc`, `fa3` and
    /// `standard` take it; `fa1`, `fa2` and the backward pass refuse it.
    pub window: Option<(i64, i64)>,
    /// Logit soft-capping (Gemma 2, flash-attn's `softcap`): scores s = scale·q·k become
    /// softcap·tanh(s / softcap) before the mask and the softmax; 0 (the default) is off. Finite
    /// and ≥ 0; taken by the same algorithms as `window`.
    pub softcap: f32,
    /// ALiBi (flash-attn's `alibi_slopes`): scores s = scale·q·k − slope·|i + seqlen_k −
    /// seqlen_q − j|, one slope per query head (or per sequence and head), after soft-capping;
    /// `None` (the default) is off. Taken by `fa3` and `fa2-tc`, forward and backward, and
    /// `standard`'s forward.
    pub alibi: Option<AlibiSlopes>,
    /// Dropout on the probabilities (flash-attn's `dropout_p`, with Philox's seed and offset;
    /// `None`, the default, is off). Taken by `fa3` and `fa2-tc`, forward and backward; the
    /// backward must get the forward's.
    pub dropout: Option<Dropout>,
    /// Multiplies Q·Kᵀ; default 1/√head_dim.
    pub softmax_scale: Option<f32>,
    /// FA1's SRAM budget M in f32 elements (B_c = ⌈M/4d⌉, B_r = min(B_c, d)); default: the largest
    /// M whose tiles fit in the device's shared memory per block.
    pub fa1_sram_floats: Option<u32>,
    /// FA2's (B_r, B_c), each 64 or 128; default: the largest that fits in shared memory.
    pub fa2_blocks: Option<(u32, u32)>,
    /// FA2-TC's split of B_r over warps and row tiles, K/V pipeline depth and B_c
    /// (the tilings `registry::KERNELS` lists); default: measured per head dim.
    pub fa2_tc_tiling: Option<Fa2TcTiling>,
    /// FA3's consumer warpgroups, B_c and grid (one block per tile, or persistent: the tilings
    /// `registry::HOPPER_KERNELS` lists); default: per head dim (`Fa3Tiling::default_for`).
    pub fa3_tiling: Option<Fa3Tiling>,
    /// Decode: splits of the keys (1 to `MAX_SPLITS`); default: as many as fill the GPU once.
    pub decode_splits: Option<u32>,
    /// Decode with several splits: merge them in the split-KV kernel's last block (`true`, one
    /// launch) or in the combine kernel (`false`); default: the plan's choice.
    pub decode_one_launch: Option<bool>,
}

/// A checked problem: what every kernel's parameter block is built from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Problem {
    pub batch: usize,
    /// Query heads (Q's, O's and the statistics').
    pub heads: usize,
    /// K/V heads: `heads` itself, or a divisor of it (GQA; 1 is MQA). Query head h reads K/V
    /// head h / (heads / heads_kv), as [`Problem::kv_head`] says.
    pub heads_kv: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub head_dim: usize,
    pub softmax_scale: f32,
    pub causal: bool,
    /// The window as asked (unbounded sides `None`); [`Problem::scoring`] merges it with
    /// `causal`.
    pub window: KeyWindow,
    /// 0: off.
    pub softcap: f32,
    /// ALiBi's slopes, checked against the batch and the query heads.
    pub alibi: Option<AlibiSlopes>,
    /// Dropout: its probability and generator state.
    pub dropout: Option<Dropout>,
    /// A packed batch of sequences of different lengths (`attention::packed`): `batch` counts
    /// the sequences and the seqlens are the longest ones; each sequence's own lengths reach
    /// the kernels through `PackedSequences`. The tensors' rows in all.
    pub packed: Option<PackedRows>,
}

/// A packed batch's rows in all: Q's, O's and L's (`total_q`) and K's and V's (`total_k`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedRows {
    pub total_q: usize,
    pub total_k: usize,
}

impl Problem {
    /// Checks that Q (batch, heads, seqlen_q, d), K and V (batch, heads_kv, seqlen_k, d) agree and
    /// that the options are valid: K and V have one head count, which divides Q's (grouped-query
    /// attention; without a copy of K and V, each K/V head serves heads / heads_kv query heads).
    pub fn new(
        q: [usize; 4],
        k: [usize; 4],
        v: [usize; 4],
        options: &AttentionOptions,
    ) -> Result<Self> {
        for (name, dims) in [("q", q), ("k", k), ("v", v)] {
            if dims.contains(&0) {
                return Err(Error::invalid(
                    name,
                    format!("shape {dims:?}"),
                    "every dimension (batch, heads, seqlen, head_dim) must be at least 1",
                ));
            }
        }
        let names = ["batch", "heads", "seqlen", "head_dim"];
        for axis in [0, 3] {
            for (name, dims) in [("k", k), ("v", v)] {
                if dims[axis] != q[axis] {
                    return Err(Error::invalid(
                        name,
                        format!("shape {dims:?}"),
                        format!(
                            "its {} must equal q's ({}; q is {q:?})",
                            names[axis], q[axis]
                        ),
                    ));
                }
            }
        }
        if !q[1].is_multiple_of(k[1]) {
            return Err(Error::invalid(
                "k",
                format!("shape {k:?}"),
                format!(
                    "its heads ({}) must divide q's ({}; q is {q:?}): q's heads must be a \
                     multiple of the K/V heads",
                    k[1], q[1]
                ),
            ));
        }
        for (axis, name) in [(1, "heads"), (2, "seqlen")] {
            if v[axis] != k[axis] {
                return Err(Error::invalid(
                    "v",
                    format!("shape {v:?}"),
                    format!("its {name} must equal k's ({}; k is {k:?})", k[axis]),
                ));
            }
        }
        let head_dim = q[3];
        if head_dim > MAX_HEAD_DIM {
            return Err(Error::invalid(
                "head_dim",
                head_dim,
                format!("allowed: 1 to {MAX_HEAD_DIM}"),
            ));
        }
        let softmax_scale = checked_softmax_scale(options.softmax_scale, head_dim)?;
        let window = checked_window(options.window)?;
        let softcap = checked_softcap(options.softcap)?;
        let problem = Self {
            batch: q[0],
            heads: q[1],
            heads_kv: k[1],
            seqlen_q: q[2],
            seqlen_k: k[2],
            head_dim,
            softmax_scale,
            causal: options.causal,
            window,
            softcap,
            alibi: options
                .alibi
                .map(|slopes| slopes.checked(q[0], q[1]))
                .transpose()?,
            dropout: options.dropout,
            packed: None,
        };
        problem.check_index_ranges()?;
        Ok(problem)
    }

    /// The problem of a packed batch: Q (1, heads, total_q, d), K and V (1, heads_kv, total_k,
    /// d), checked as [`Problem::new`] checks a batch of one, with `sequences` sequences whose
    /// longest are `max_seqlen_q` and `max_seqlen_k` long (the grid's extent).
    pub fn packed(
        [q, k, v]: [[usize; 4]; 3],
        sequences: usize,
        [max_seqlen_q, max_seqlen_k]: [usize; 2],
        options: &AttentionOptions,
    ) -> Result<Self> {
        for (name, dims) in [("q", q), ("k", k), ("v", v)] {
            if dims[0] != 1 {
                return Err(Error::invalid(
                    name,
                    format!("shape {dims:?}"),
                    "a packed batch is one tensor of every sequence's rows: batch 1, \
                     (total tokens, heads, head_dim) in flash-attn's layout",
                ));
            }
        }
        // The slopes' rows are the sequences, not the packed tensors' batch of 1.
        let whole = Self::new(
            q,
            k,
            v,
            &AttentionOptions {
                alibi: None,
                ..*options
            },
        )?;
        let alibi = options
            .alibi
            .map(|slopes| slopes.checked(sequences, q[1]))
            .transpose()?;
        let problem = Self {
            batch: sequences,
            seqlen_q: max_seqlen_q,
            seqlen_k: max_seqlen_k,
            packed: Some(PackedRows {
                total_q: q[2],
                total_k: k[2],
            }),
            alibi,
            ..whole
        };
        problem.check_index_ranges()?;
        Ok(problem)
    }

    /// The kernels index rows and columns with u32 and a head's rows with u32 counts; grids are
    /// limited to 65 535 in y and z.
    fn check_index_ranges(&self) -> Result<()> {
        let u32_max = u32::MAX as usize;
        for (name, value) in [("seqlen_q", self.seqlen_q), ("seqlen_k", self.seqlen_k)] {
            if value
                .checked_mul(self.head_dim.max(MATMUL_TILE as usize))
                .is_none_or(|n| n > u32_max)
            {
                return Err(Error::invalid(
                    name,
                    value,
                    format!("seqlen × max(head_dim, 16) must fit in 32 bits (≤ {u32_max})"),
                ));
            }
        }
        if self.seqlen_q.div_ceil(MATMUL_TILE as usize) > MAX_GRID_YZ {
            return Err(Error::invalid(
                "seqlen_q",
                self.seqlen_q,
                format!(
                    "at most {} (grid limit)",
                    MAX_GRID_YZ * MATMUL_TILE as usize
                ),
            ));
        }
        if self.batch_heads() > MAX_GRID_YZ {
            return Err(Error::invalid(
                "batch × heads",
                self.batch_heads(),
                format!("at most {MAX_GRID_YZ} (grid limit)"),
            ));
        }
        Ok(())
    }

    pub fn batch_heads(&self) -> usize {
        self.batch * self.heads
    }

    /// Whether this is a packed batch's problem.
    pub fn is_packed(&self) -> bool {
        self.packed.is_some()
    }

    /// The problem as the tensors hold it: a packed batch's as one sequence of all its rows
    /// (batch 1, seqlens total_q and total_k), which the kernels that walk rows without
    /// attending (the backward's pre- and post-pass, the group sum) and the workspaces cover;
    /// any other problem itself.
    pub fn whole(&self) -> Problem {
        match self.packed {
            // ALiBi's slopes have a row per sequence, which the whole tensors do not have: the
            // passes that walk them bias no score.
            Some(rows) => Problem {
                batch: 1,
                seqlen_q: rows.total_q,
                seqlen_k: rows.total_k,
                packed: None,
                alibi: None,
                ..*self
            },
            None => *self,
        }
    }

    /// Query heads per K/V head (1 without GQA).
    pub fn kv_group(&self) -> usize {
        self.heads / self.heads_kv
    }

    /// Whether K and V have fewer heads than Q (GQA or MQA).
    pub fn is_grouped(&self) -> bool {
        self.heads_kv != self.heads
    }

    /// The K/V head query head `head` reads (as `BlockInfo::kv_head` in the kernels).
    pub fn kv_head(&self, head: usize) -> usize {
        head / self.kv_group()
    }

    /// Q's (and O's, dO's, dQ's) dims: (batch, heads, seqlen_q, head_dim).
    pub fn q_dims(&self) -> [usize; 4] {
        [self.batch, self.heads, self.seqlen_q, self.head_dim]
    }

    /// K's and V's dims: (batch, heads_kv, seqlen_k, head_dim).
    pub fn kv_dims(&self) -> [usize; 4] {
        [self.batch, self.heads_kv, self.seqlen_k, self.head_dim]
    }

    /// How each row's scores are formed: soft-capping and the mask, the window merged with the
    /// causal mask (right = 0), as the kernels merge them (`AttentionShape::window`).
    pub fn scoring(&self) -> Scoring {
        Scoring {
            window: KeyWindow {
                left: self.window.left,
                right: if self.causal {
                    Some(0)
                } else {
                    self.window.right
                },
            },
            softcap: self.softcap as f64,
        }
    }

    /// The window as flash-attn's `window_size` writes it: (left, right), −1 for an unbounded
    /// side (as asked: `causal` is not merged in).
    pub fn window_size(&self) -> (i64, i64) {
        let side = |bound: Option<u32>| bound.map_or(-1, i64::from);
        (side(self.window.left), side(self.window.right))
    }

    /// The most keys one query row sees: seqlen_k, or fewer when the window bounds both sides
    /// (left + 1 + right; right is 0 with the causal mask).
    pub fn keys_per_row(&self) -> usize {
        let window = self.scoring().window;
        match (window.left, window.right) {
            (Some(left), Some(right)) => (left as usize + 1 + right as usize).min(self.seqlen_k),
            _ => self.seqlen_k,
        }
    }

    /// Whether the call asks for a window, soft-capping, ALiBi or dropout, which only `fa2-tc`
    /// and `fa3` (their `local` forms) and, but for dropout, `standard` run: the argument and
    /// its value to name in the others' refusal.
    pub fn local_option(&self) -> Option<(&'static str, String)> {
        if self.window.is_bounded() {
            let (left, right) = self.window_size();
            Some(("window", format!("({left}, {right})")))
        } else if self.softcap > 0.0 {
            Some(("softcap", self.softcap.to_string()))
        } else if let Some(slopes) = self.alibi {
            Some(("alibi_slopes", format!("of shape {:?}", slopes.dims())))
        } else {
            self.dropout
                .map(|dropout| ("dropout_p", dropout.p().to_string()))
        }
    }

    /// Which form of the tensor-core forward kernels serves this call: a packed batch's, a
    /// window's, soft-capping's, ALiBi's or dropout's (`local`), both, or the dense one, which has none
    /// compiled in.
    pub fn kernel_form(&self) -> KernelForm {
        KernelForm::of(self.is_packed(), self.local_option().is_some())
    }

    pub(crate) fn shape(&self) -> AttentionShape {
        // A side wider than both sequences sees as much as an unbounded one; clipped there, it
        // fits in the kernels' i32 (sequences are below 2^28, `check_index_ranges`).
        let widest = self.seqlen_q + self.seqlen_k;
        let side = |bound: Option<u32>| bound.map_or(-1, |n| (n as usize).min(widest) as i32);
        let softcap = Softcap::new(self.softmax_scale, self.softcap);
        let (alibi_slopes, alibi_batch_stride) = alibi::kernel_fields(self.alibi, 0);
        let (dropout_seed, dropout_offset, dropout_first_head, dropout_drop_below) =
            dropout::kernel_fields(self.dropout, 0);
        AttentionShape {
            batch: self.batch as u32,
            heads: self.heads as u32,
            seqlen_q: self.seqlen_q as u32,
            seqlen_k: self.seqlen_k as u32,
            head_dim: self.head_dim as u32,
            softmax_scale: self.softmax_scale,
            causal: self.causal as u32,
            kv_group: self.kv_group() as u32,
            window_left: side(self.window.left),
            window_right: side(self.window.right),
            softcap_inside: softcap.inside,
            softcap_outside: softcap.outside,
            alibi_slopes,
            alibi_batch_stride,
            _pad: 0,
            dropout_seed,
            dropout_offset,
            dropout_first_head,
            dropout_drop_below,
        }
    }

    /// `shape` (this problem's) for a packed launch of `sequences` sequences from
    /// `first_sequence` on: its batch, ALiBi's slopes from the launch's first row, and
    /// dropout's global heads from the launch's first sequence.
    pub(crate) fn shape_for_launch(
        &self,
        shape: &mut AttentionShape,
        first_sequence: u32,
        sequences: u32,
    ) {
        shape.batch = sequences;
        (shape.alibi_slopes, shape.alibi_batch_stride) =
            alibi::kernel_fields(self.alibi, first_sequence as usize);
        shape.dropout_first_head = first_sequence * self.heads as u32;
    }

    /// Elements of a per-row statistics vector: batch·heads·seqlen_q.
    pub(crate) fn rows(&self) -> usize {
        self.batch_heads() * self.seqlen_q
    }
}

/// The softmax scale a call asked for, or 1/√head_dim; an error unless finite and positive.
pub(crate) fn checked_softmax_scale(requested: Option<f32>, head_dim: usize) -> Result<f32> {
    let softmax_scale = requested.unwrap_or(1.0 / (head_dim as f32).sqrt());
    if !softmax_scale.is_finite() || softmax_scale <= 0.0 {
        return Err(Error::invalid(
            "softmax_scale",
            softmax_scale,
            "must be finite and > 0",
        ));
    }
    Ok(softmax_scale)
}

/// The window a call asked for: each side −1 (unbounded) or at least 0, at most u32::MAX.
pub(crate) fn checked_window(requested: Option<(i64, i64)>) -> Result<KeyWindow> {
    let Some((left, right)) = requested else {
        return Ok(KeyWindow::FULL);
    };
    let side = |n: i64| -> Result<Option<u32>> {
        match n {
            -1 => Ok(None),
            n => u32::try_from(n).map(Some).map_err(|_| {
                Error::invalid(
                    "window",
                    format!("({left}, {right})"),
                    "each side must be -1 (unbounded) or a key count from 0 to 4294967295",
                )
            }),
        }
    };
    Ok(KeyWindow {
        left: side(left)?,
        right: side(right)?,
    })
}

/// The soft-cap a call asked for: finite and ≥ 0 (0 is off).
pub(crate) fn checked_softcap(softcap: f32) -> Result<f32> {
    if !softcap.is_finite() || softcap < 0.0 {
        return Err(Error::invalid(
            "softcap",
            softcap,
            "must be finite and ≥ 0 (0: no soft-capping)",
        ));
    }
    Ok(softcap)
}

/// Parses an FA2-TC tiling: `WxR`, optionally followed by `sS` and `cC` (warps, row tiles per
/// warp, K/V stages, B_c), e.g. `4x2`, `4x2s1`, `4x2s1c32`; the stages default to 2 and B_c to
/// 64. Whether the kernel is compiled with it is checked per head dim by [`fa2_tc_tiling`].
pub fn parse_fa2_tc_tiling(text: &str) -> Result<Fa2TcTiling> {
    let invalid = || {
        Error::invalid(
            "fa2-tc-tiling",
            text,
            "WARPSxROW_TILES, optionally followed by sSTAGES and cB_C, e.g. 4x2, 4x2s1 or 4x2s1c32",
        )
    };
    let number = |s: &str| s.parse::<u32>().map_err(|_| invalid());
    let optional = |value: Option<&str>, default: u32| value.map_or(Ok(default), number);
    // The optional fields, last first: the text before the tag, and the tag's value if present.
    let (warps, rest) = text.split_once('x').ok_or_else(invalid)?;
    let (rest, cols) = rest
        .split_once('c')
        .map_or((rest, None), |(r, c)| (r, Some(c)));
    let (row_tiles, stages) = rest
        .split_once('s')
        .map_or((rest, None), |(r, s)| (r, Some(s)));
    Ok(Fa2TcTiling::new(
        number(warps)?,
        number(row_tiles)?,
        optional(stages, 2)?,
        optional(cols, DEFAULT_BLOCK_COLS)?,
    ))
}

/// [`parse_fa2_tc_tiling`] of an optional override: `None` (the default per head dim) stays `None`.
pub fn parse_optional_fa2_tc_tiling(text: Option<&str>) -> Result<Option<Fa2TcTiling>> {
    text.map(parse_fa2_tc_tiling).transpose()
}

/// An FA3 tiling from its name, `wWcC[p]` (e.g. `w2c128`: 2 consumer warpgroups, B_c = 128;
/// `w2c128p` the same on the persistent grid). Whether the kernel is compiled with it is checked
/// per head dim by the plan.
pub fn parse_fa3_tiling(text: &str) -> Result<Fa3Tiling> {
    let bad = || {
        Error::invalid(
            "fa3_tiling",
            text,
            "wWcC or wWcCp, e.g. w2c128 (consumer warpgroups, B_c; p: the persistent grid)",
        )
    };
    let (consumers, cols) = text
        .strip_prefix('w')
        .and_then(|rest| rest.split_once('c'))
        .ok_or_else(bad)?;
    let (cols, persistent) = match cols.strip_suffix('p') {
        Some(cols) => (cols, true),
        None => (cols, false),
    };
    let number = |s: &str| s.parse::<u32>().map_err(|_| bad());
    let tiling = Fa3Tiling::new(number(consumers)?, number(cols)?);
    Ok(if persistent {
        tiling.on_persistent_grid()
    } else {
        tiling
    })
}
