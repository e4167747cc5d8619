//! A kernel's identity as a type: its family with the compile-time parameters that family has,
//! and its element type. Its PTX entry name is `registry::name`'s.

use crate::bwd::fa2::config as fa2_backward;
use crate::bwd::fa2_tc::config::Fa2TcBackwardTiling;
use crate::bwd::fa3::config::Fa3BackwardTiling;
use crate::bwd::group_sum::config as group_sum;
use crate::common::form::KernelForm;
use crate::decode::config as decode;
use crate::fwd::fa2::config as fa2;
use crate::fwd::fa2_tc::config::Fa2TcTiling;
use crate::fwd::fa3::config::Fa3Tiling;
use crate::fwd::{fa1, standard};

/// The element type of Q, K, V and O a kernel is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElementType {
    F32,
    F16,
    Bf16,
}

impl ElementType {
    pub const ALL: [ElementType; 3] = [ElementType::F32, ElementType::F16, ElementType::Bf16];

    /// The name in kernel names (`f32`, `f16`, `bf16`).
    pub const fn name(self) -> &'static str {
        match self {
            ElementType::F32 => "f32",
            ElementType::F16 => "f16",
            ElementType::Bf16 => "bf16",
        }
    }

    // Constructors named as the kernel list spells the types (`for_each_kernel!`).
    pub const fn f32() -> Self {
        ElementType::F32
    }
    pub const fn f16() -> Self {
        ElementType::F16
    }
    pub const fn bf16() -> Self {
        ElementType::Bf16
    }
}

/// The three kernels of standard attention, in launch order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StandardStage {
    /// S = scale·Q·Kᵀ to HBM.
    Scores,
    /// P = softmax(S) to HBM, and L.
    Softmax,
    /// O = P·V.
    Output,
}

impl StandardStage {
    pub const ALL: [StandardStage; 3] = [
        StandardStage::Scores,
        StandardStage::Softmax,
        StandardStage::Output,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            StandardStage::Scores => "scores",
            StandardStage::Softmax => "softmax",
            StandardStage::Output => "output",
        }
    }

    // Constructors named as the kernel list spells the stages (`for_each_kernel!`).
    pub const fn scores() -> Self {
        StandardStage::Scores
    }
    pub const fn softmax() -> Self {
        StandardStage::Softmax
    }
    pub const fn output() -> Self {
        StandardStage::Output
    }
}

/// The standard backward's own four kernels, in launch order (after the standard forward's
/// `scores` and `softmax`, which recompute S and P).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StandardBackwardStage {
    /// dP = dO·Vᵀ to HBM (over S).
    ProbsGradient,
    /// D = rowsum(dO ∘ O) and dS = P ∘ (dP − D), in place.
    ScoresGradient,
    /// dQ = scale·dS·K.
    QueryGradient,
    /// dK = scale·dSᵀ·Q and dV = Pᵀ·dO.
    KeyValueGradients,
}

impl StandardBackwardStage {
    pub const ALL: [StandardBackwardStage; 4] = [
        StandardBackwardStage::ProbsGradient,
        StandardBackwardStage::ScoresGradient,
        StandardBackwardStage::QueryGradient,
        StandardBackwardStage::KeyValueGradients,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            StandardBackwardStage::ProbsGradient => "dp",
            StandardBackwardStage::ScoresGradient => "ds",
            StandardBackwardStage::QueryGradient => "dq",
            StandardBackwardStage::KeyValueGradients => "dkdv",
        }
    }

    // Constructors named as the kernel list spells the stages (`for_each_kernel!`).
    pub const fn dp() -> Self {
        StandardBackwardStage::ProbsGradient
    }
    pub const fn ds() -> Self {
        StandardBackwardStage::ScoresGradient
    }
    pub const fn dq() -> Self {
        StandardBackwardStage::QueryGradient
    }
    pub const fn dkdv() -> Self {
        StandardBackwardStage::KeyValueGradients
    }
}

/// The FA2 backward's kernels: the pre-pass, the main kernel, the post-pass (each pass
/// element-wise, or wide where the host's plan finds it can run).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackwardStage {
    /// D = rowsum(dO ∘ O), and the f32 dQ accumulator zeroed (any head dim).
    Preprocess,
    /// The loop over key blocks: dK, dV, and dQ into the accumulator, for head dims up to
    /// `head_dim_capacity` (B_r and B_c follow from it, `bwd::fa2::config`); `grouped`: for
    /// grouped K/V heads, dK and dV stored per query head (the expanded workspace that
    /// [`Family::GroupSum`] sums).
    Main {
        head_dim_capacity: u32,
        grouped: bool,
    },
    /// dQ = scale·(the accumulator) in the input dtype (any head dim).
    Postprocess,
    /// [`BackwardStage::Preprocess`] with 16-byte loads and stores: f16/bf16, head dims that
    /// are multiples of 8 up to 256 (`bwd::fa2::config::wide_passes_take`), O and dO rows
    /// 16-byte aligned.
    PreprocessWide,
    /// [`BackwardStage::Postprocess`] with 16-byte loads and stores, where
    /// [`BackwardStage::PreprocessWide`] runs (and dQ's rows are 16-byte aligned).
    PostprocessWide,
}

impl BackwardStage {
    /// The passes, element-wise and wide, in the order the kernel names list them.
    pub const PASSES: [BackwardStage; 4] = [
        BackwardStage::Preprocess,
        BackwardStage::Postprocess,
        BackwardStage::PreprocessWide,
        BackwardStage::PostprocessWide,
    ];

    /// The name in kernel names (`preprocess`, `main`, `postprocess`, `preprocess_wide`,
    /// `postprocess_wide`).
    pub const fn name(self) -> &'static str {
        match self {
            BackwardStage::Preprocess => "preprocess",
            BackwardStage::Main { .. } => "main",
            BackwardStage::Postprocess => "postprocess",
            BackwardStage::PreprocessWide => "preprocess_wide",
            BackwardStage::PostprocessWide => "postprocess_wide",
        }
    }

    /// Whether this is a wide pass ([`BackwardStage::PreprocessWide`],
    /// [`BackwardStage::PostprocessWide`]).
    pub const fn is_wide(self) -> bool {
        matches!(
            self,
            BackwardStage::PreprocessWide | BackwardStage::PostprocessWide
        )
    }

    // Constructors named as the kernel list spells the passes (`for_each_kernel!`).
    pub const fn preprocess() -> Self {
        BackwardStage::Preprocess
    }
    pub const fn postprocess() -> Self {
        BackwardStage::Postprocess
    }
    pub const fn preprocess_wide() -> Self {
        BackwardStage::PreprocessWide
    }
    pub const fn postprocess_wide() -> Self {
        BackwardStage::PostprocessWide
    }

    /// Field-by-field equality usable in `const` code.
    const fn const_eq(self, other: Self) -> bool {
        match (self, other) {
            (BackwardStage::Preprocess, BackwardStage::Preprocess)
            | (BackwardStage::Postprocess, BackwardStage::Postprocess)
            | (BackwardStage::PreprocessWide, BackwardStage::PreprocessWide)
            | (BackwardStage::PostprocessWide, BackwardStage::PostprocessWide) => true,
            (
                BackwardStage::Main {
                    head_dim_capacity: a,
                    grouped: s,
                },
                BackwardStage::Main {
                    head_dim_capacity: b,
                    grouped: t,
                },
            ) => a == b && s == t,
            _ => false,
        }
    }
}

/// A kernel family and the parameters it is compiled with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Standard attention (any head dim).
    Standard(StandardStage),
    /// FlashAttention-1 forward (any head dim; B_r, B_c chosen at launch).
    Fa1,
    /// FlashAttention-2 forward, scalar FP32: head dims up to `head_dim_capacity`; B_r chosen at
    /// launch.
    Fa2 {
        head_dim_capacity: u32,
        block_cols: u32,
    },
    /// FlashAttention-2 forward on tensor cores, for exactly `head_dim`, in one [`KernelForm`].
    Fa2Tc {
        head_dim: u32,
        tiling: Fa2TcTiling,
        form: KernelForm,
    },
    /// FlashAttention-3 forward (Hopper): head dims up to `head_dim`, in one [`KernelForm`].
    Fa3 {
        head_dim: u32,
        tiling: Fa3Tiling,
        form: KernelForm,
    },
    /// FlashAttention-2 backward, scalar FP32: one of its three kernels.
    Fa2Backward(BackwardStage),
    /// FlashAttention-2 backward's main kernel on tensor cores, for head dims up to
    /// `head_dim_capacity` (its tiling: `Fa2TcBackwardTiling::for_capacity`); the pre- and
    /// post-pass are [`Family::Fa2Backward`]'s. `grouped`: for grouped K/V heads, as
    /// [`BackwardStage::Main`]'s. `form`: for a packed batch ([`KernelForm::Packed`]), a
    /// sliding window and soft-capping ([`KernelForm::Local`]), both, or the causal mask or
    /// none ([`KernelForm::Dense`]), as the forward's forms.
    Fa2TcBackward {
        head_dim_capacity: u32,
        grouped: bool,
        form: KernelForm,
    },
    /// FlashAttention-3's backward main kernel (Hopper), for head dims up to `head_dim` (its
    /// tiling: `Fa3BackwardTiling::for_head_dim`); the pre- and post-pass are
    /// [`Family::Fa2Backward`]'s. `grouped`: for grouped K/V heads, as
    /// [`BackwardStage::Main`]'s. `deterministic`: compiled for deterministic mode (dQ's
    /// reductions in a fixed order, `Fa3BackwardParams::dq_semaphore`). `form` as
    /// [`Family::Fa2TcBackward`]'s.
    Fa3Backward {
        head_dim: u32,
        grouped: bool,
        deterministic: bool,
        form: KernelForm,
    },
    /// Split-KV decoding for exactly `head_dim`, on a contiguous or a paged cache. `one_launch`:
    /// the last block of each group merges the splits (no [`Family::DecodeCombine`] launch).
    Decode {
        head_dim: u32,
        cache: CacheLayout,
        one_launch: bool,
    },
    /// The split-KV combine for exactly `head_dim`.
    DecodeCombine { head_dim: u32 },
    /// Appending new keys and values to a contiguous or paged cache (any head dim).
    KvAppend { cache: CacheLayout },
    /// The standard backward (any head dim): one of its own four kernels.
    StandardBackward(StandardBackwardStage),
    /// The grouped backward's last kernel (any head dim, any group): each K/V head's dK and dV
    /// as the sum of its query heads' rows of the expanded workspace.
    GroupSum,
}

/// How a KV cache is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CacheLayout {
    /// (batch, capacity, heads_kv, d): one range of rows per sequence.
    Contiguous,
    /// (pages, page_size, heads_kv, d) with a block table naming each sequence's pages.
    Paged,
}

impl CacheLayout {
    pub const ALL: [CacheLayout; 2] = [CacheLayout::Contiguous, CacheLayout::Paged];

    /// The name in kernel names.
    pub const fn name(self) -> &'static str {
        match self {
            CacheLayout::Contiguous => "contiguous",
            CacheLayout::Paged => "paged",
        }
    }

    pub const fn is_paged(self) -> bool {
        matches!(self, CacheLayout::Paged)
    }

    // Constructors named as the kernel list spells the layouts (`for_each_kernel!`).
    pub const fn contiguous() -> Self {
        CacheLayout::Contiguous
    }
    pub const fn paged() -> Self {
        CacheLayout::Paged
    }
}

/// The PTX module a kernel is compiled into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Module {
    /// Every family but FA3, for sm_80 or sm_90 (runs on every later GPU).
    Main,
    /// FA3, for sm_90a (compute capability 9.0 only).
    Hopper,
}

impl Module {
    /// The kernels the module holds.
    pub const fn kernels(self) -> &'static crate::registry::KernelList {
        match self {
            Module::Main => &crate::registry::KERNELS,
            Module::Hopper => &crate::registry::HOPPER_KERNELS,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Module::Main => "main",
            Module::Hopper => "hopper",
        }
    }
}

/// One compiled kernel: an entry point of the PTX module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelId {
    pub family: Family,
    pub dtype: ElementType,
}

impl KernelId {
    /// Fills [`crate::registry::KernelList`] before its ids are written.
    pub(crate) const PLACEHOLDER: Self = Self::new(Family::Fa1, ElementType::F32);

    pub const fn new(family: Family, dtype: ElementType) -> Self {
        Self { family, dtype }
    }

    /// Largest head dim the kernel computes (`None`: any).
    pub const fn head_dim_capacity(&self) -> Option<u32> {
        match self.family {
            Family::Standard(_) | Family::StandardBackward(_) | Family::Fa1 | Family::GroupSum => {
                None
            }
            Family::Fa2 {
                head_dim_capacity, ..
            } => Some(head_dim_capacity),
            Family::Fa2Tc { head_dim, .. }
            | Family::Fa3 { head_dim, .. }
            | Family::Decode { head_dim, .. }
            | Family::DecodeCombine { head_dim } => Some(head_dim),
            Family::Fa2Backward(BackwardStage::Main {
                head_dim_capacity, ..
            })
            | Family::Fa2TcBackward {
                head_dim_capacity, ..
            }
            | Family::Fa3Backward {
                head_dim: head_dim_capacity,
                ..
            } => Some(head_dim_capacity),
            Family::Fa2Backward(_) | Family::KvAppend { .. } => None,
        }
    }

    /// The module the kernel is compiled into.
    pub const fn module(&self) -> Module {
        match self.family {
            Family::Fa3 { .. } | Family::Fa3Backward { .. } => Module::Hopper,
            _ => Module::Main,
        }
    }

    /// Whether the kernel multiplies on tensor cores (`xtask sass` requires HMMA, or HGMMA for
    /// the Hopper module's, in its loop).
    pub const fn uses_tensor_cores(&self) -> bool {
        matches!(
            self.family,
            Family::Fa2Tc { .. }
                | Family::Fa3 { .. }
                | Family::Fa2TcBackward { .. }
                | Family::Fa3Backward { .. }
                | Family::Decode { .. }
        )
    }

    /// The most threads a block of this kernel is launched with. `ptx-build` writes it into the
    /// PTX as `.maxntid`, so ptxas budgets registers for that many threads (at 512 threads, 128
    /// registers each) instead of assuming the worst; the host's launch plan never exceeds it.
    pub const fn max_threads(&self) -> u32 {
        match self.family {
            Family::Standard(_) | Family::StandardBackward(_) => standard::config::THREADS,
            Family::Fa1 => fa1::config::THREADS,
            Family::Fa2 {
                head_dim_capacity, ..
            } => fa2::threads(fa2::max_block_rows(head_dim_capacity)),
            Family::Fa2Tc { tiling, .. } => tiling.threads(),
            Family::Fa3 { tiling, .. } => tiling.threads(),
            Family::Fa2Backward(BackwardStage::Main { .. }) => fa2_backward::main_threads(),
            Family::Fa2Backward(_) => fa2_backward::PASS_THREADS,
            Family::Fa2TcBackward {
                head_dim_capacity, ..
            } => Fa2TcBackwardTiling::for_capacity(head_dim_capacity).threads(),
            Family::Fa3Backward { head_dim, .. } => {
                Fa3BackwardTiling::for_head_dim(head_dim).threads()
            }
            Family::GroupSum => group_sum::THREADS,
            Family::Decode { .. } => decode::THREADS,
            Family::DecodeCombine { .. } => decode::COMBINE_THREADS,
            Family::KvAppend { .. } => decode::APPEND_THREADS,
        }
    }

    /// The blocks per SM `ptx-build` asks ptxas to fit (`.minnctapersm`): 1, except the split-KV
    /// kernels, whose split plan counts on [`decode::BLOCKS_PER_SM`] resident blocks.
    pub const fn min_blocks_per_sm(&self) -> u32 {
        match self.family {
            Family::Decode { .. } => decode::BLOCKS_PER_SM,
            _ => 1,
        }
    }

    /// Field-by-field equality usable in `const` code.
    pub const fn const_eq(&self, other: &Self) -> bool {
        let same_family = match (self.family, other.family) {
            (Family::Standard(a), Family::Standard(b)) => a as u8 == b as u8,
            (Family::StandardBackward(a), Family::StandardBackward(b)) => a as u8 == b as u8,
            (Family::Fa1, Family::Fa1) => true,
            (
                Family::Fa2 {
                    head_dim_capacity: a,
                    block_cols: b,
                },
                Family::Fa2 {
                    head_dim_capacity: c,
                    block_cols: d,
                },
            ) => a == c && b == d,
            (
                Family::Fa2Tc {
                    head_dim: a,
                    tiling: s,
                    form: x,
                },
                Family::Fa2Tc {
                    head_dim: b,
                    tiling: t,
                    form: y,
                },
            ) => a == b && s.const_eq(t) && x as u8 == y as u8,
            (
                Family::Fa3 {
                    head_dim: a,
                    tiling: s,
                    form: x,
                },
                Family::Fa3 {
                    head_dim: b,
                    tiling: t,
                    form: y,
                },
            ) => a == b && s.const_eq(t) && x as u8 == y as u8,
            (Family::Fa2Backward(a), Family::Fa2Backward(b)) => a.const_eq(b),
            (
                Family::Fa2TcBackward {
                    head_dim_capacity: a,
                    grouped: s,
                    form: x,
                },
                Family::Fa2TcBackward {
                    head_dim_capacity: b,
                    grouped: t,
                    form: y,
                },
            ) => a == b && s == t && x as u8 == y as u8,
            (
                Family::Fa3Backward {
                    head_dim: a,
                    grouped: s,
                    deterministic: u,
                    form: x,
                },
                Family::Fa3Backward {
                    head_dim: b,
                    grouped: t,
                    deterministic: v,
                    form: y,
                },
            ) => a == b && s == t && u == v && x as u8 == y as u8,
            (Family::GroupSum, Family::GroupSum) => true,
            (
                Family::Decode {
                    head_dim: a,
                    cache: s,
                    one_launch: x,
                },
                Family::Decode {
                    head_dim: b,
                    cache: t,
                    one_launch: y,
                },
            ) => a == b && s as u8 == t as u8 && x == y,
            (Family::DecodeCombine { head_dim: a }, Family::DecodeCombine { head_dim: b }) => {
                a == b
            }
            (Family::KvAppend { cache: s }, Family::KvAppend { cache: t }) => s as u8 == t as u8,
            _ => false,
        };
        same_family && self.dtype as u8 == other.dtype as u8
    }
}
