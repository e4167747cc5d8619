//! Kernel ids as PTX entry names: `Display` writes a [`KernelId`]'s and `FromStr` reads it back;
//! no other code formats or parses kernel names.

use core::fmt;
use core::str::FromStr;

use super::id::{
    BackwardStage, CacheLayout, ElementType, Family, KernelId, StandardBackwardStage, StandardStage,
};
use crate::common::form::KernelForm;
use crate::fwd::fa2_tc::config::Fa2TcTiling;
use crate::fwd::fa3::config::Fa3Tiling;

impl fmt::Display for KernelId {
    /// The PTX entry name: `standard_<stage>_<dtype>`, `standard_backward_<stage>_<dtype>`,
    /// `fa1_forward_<dtype>`,
    /// `fa2_forward_<dtype>_d<capacity>_bc<B_c>`, `fa2tc_forward_<dtype>_d<d>_w<W>r<R>s<S>c<C>[_varlen|_local|_varlen_local]`,
    /// `fa3_forward_<dtype>_d<d>_w<consumers>c<B_c>[p|_varlen|_local]`, `decode_splitkv_<dtype>_d<d>_<cache>[_onelaunch]`,
    /// `decode_combine_<dtype>_d<d>`, `kv_append_<dtype>_<cache>`, `fa2_backward_<stage>_<dtype>` (pre- and
    /// post-pass, `<pre|post>process[_wide]`), `fa2_backward_main_<dtype>_d<capacity>[_grouped]`,
    /// `fa2tc_backward_<dtype>_d<capacity>[_grouped]`, `fa3_backward_<dtype>_d<d>[_grouped]`, `backward_group_sum_<dtype>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dtype = self.dtype.name();
        match self.family {
            Family::Standard(stage) => write!(f, "standard_{}_{dtype}", stage.name()),
            Family::StandardBackward(stage) => {
                write!(f, "standard_backward_{}_{dtype}", stage.name())
            }
            Family::Fa1 => write!(f, "fa1_forward_{dtype}"),
            Family::Fa2 {
                head_dim_capacity,
                block_cols,
            } => write!(f, "fa2_forward_{dtype}_d{head_dim_capacity}_bc{block_cols}"),
            Family::Fa2Tc {
                head_dim,
                tiling,
                form,
            } => {
                let Fa2TcTiling {
                    warps,
                    row_tiles,
                    kv_stages,
                    block_cols,
                } = tiling;
                write!(
                    f,
                    "fa2tc_forward_{dtype}_d{head_dim}_w{warps}r{row_tiles}s{kv_stages}c{block_cols}{}",
                    form.suffix()
                )
            }
            Family::Fa3 {
                head_dim,
                tiling,
                form,
            } => write!(
                f,
                "fa3_forward_{dtype}_d{head_dim}_{tiling}{}",
                form.suffix()
            ),
            Family::Fa2Backward(BackwardStage::Main {
                head_dim_capacity,
                grouped,
            }) => write!(
                f,
                "fa2_backward_main_{dtype}_d{head_dim_capacity}{}",
                grouped_suffix(grouped)
            ),
            Family::Fa2Backward(stage) => write!(f, "fa2_backward_{}_{dtype}", stage.name()),
            Family::Fa2TcBackward {
                head_dim_capacity,
                grouped,
                form,
            } => write!(
                f,
                "fa2tc_backward_{dtype}_d{head_dim_capacity}{}{}",
                grouped_suffix(grouped),
                form.suffix()
            ),
            Family::Fa3Backward {
                head_dim,
                grouped,
                deterministic,
                form,
            } => write!(
                f,
                "fa3_backward_{dtype}_d{head_dim}{}{}{}",
                grouped_suffix(grouped),
                form.suffix(),
                if deterministic { "_deterministic" } else { "" }
            ),
            Family::GroupSum => write!(f, "backward_group_sum_{dtype}"),
            Family::Decode {
                head_dim,
                cache,
                one_launch,
            } => write!(
                f,
                "decode_splitkv_{dtype}_d{head_dim}_{}{}",
                cache.name(),
                if one_launch { ONE_LAUNCH_SUFFIX } else { "" }
            ),
            Family::DecodeCombine { head_dim } => write!(f, "decode_combine_{dtype}_d{head_dim}"),
            Family::KvAppend { cache } => write!(f, "kv_append_{dtype}_{}", cache.name()),
        }
    }
}

/// `name` without its [`KernelForm`]'s suffix, and that form (dense when it has none).
fn strip_form(name: &str) -> (&str, KernelForm) {
    // The longest suffix that matches: `_varlen_local` ends in `_local` too.
    KernelForm::ALL
        .into_iter()
        .filter(|form| !form.suffix().is_empty())
        .filter_map(|form| name.strip_suffix(form.suffix()).map(|rest| (rest, form)))
        .min_by_key(|(rest, _)| rest.len())
        .unwrap_or((name, KernelForm::Dense))
}

/// The suffix of the one-launch split-KV kernel (`registry::decode_one_launch_suffix!`).
const ONE_LAUNCH_SUFFIX: &str = "_onelaunch";

/// The suffix of a backward main kernel compiled for grouped K/V heads
/// (`registry::backward_grouped_suffix!` in the entry names).
const GROUPED_SUFFIX: &str = "_grouped";

fn grouped_suffix(grouped: bool) -> &'static str {
    if grouped { GROUPED_SUFFIX } else { "" }
}

/// `name` without `suffix`, and whether it had it.
fn strip_flag<'a>(name: &'a str, suffix: &str) -> (&'a str, bool) {
    match name.strip_suffix(suffix) {
        Some(rest) => (rest, true),
        None => (name, false),
    }
}

/// A backward main kernel's name after its family's prefix and before its flags other than
/// `_grouped`, `<dtype>_d<head dim>[_grouped]`:
/// the dtype's name, the head dim (or capacity), and whether it is the grouped twin.
fn backward_main(rest: &str) -> Result<(&str, u32, bool), ParseKernelIdError> {
    let (rest, grouped) = strip_flag(rest, GROUPED_SUFFIX);
    let (dtype, head_dim) = rest.split_once("_d").ok_or(ParseKernelIdError)?;
    let head_dim = head_dim.parse::<u32>().map_err(|_| ParseKernelIdError)?;
    Ok((dtype, head_dim, grouped))
}

/// A name that is not a kernel name of the form [`KernelId`]'s `Display` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseKernelIdError;

impl fmt::Display for ParseKernelIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "not a kernel name (standard_<stage>_<dtype>, standard_backward_<stage>_<dtype>, \
             fa1_forward_<dtype>, \
             fa2_forward_<dtype>_d<capacity>_bc<B_c>, \
             fa2tc_forward_<dtype>_d<d>_w<W>r<R>s<S>c<C>[_varlen|_local|_varlen_local], \
             fa3_forward_<dtype>_d<d>_w<W>c<C>[p|_varlen|_local], fa2_backward_<pre|post>process[_wide]_<dtype>, \
             fa2_backward_main_<dtype>_d<capacity>[_grouped], \
             fa2tc_backward_<dtype>_d<capacity>[_grouped], fa3_backward_<dtype>_d<d>[_grouped], backward_group_sum_<dtype>, \
             decode_splitkv_<dtype>_d<d>_<cache>[_onelaunch], decode_combine_<dtype>_d<d>, \
             kv_append_<dtype>_<cache>)",
        )
    }
}

impl FromStr for KernelId {
    type Err = ParseKernelIdError;

    /// Reads a name `Display` writes; whether that kernel is compiled is
    /// [`crate::registry::KERNELS`]`.contains`.
    fn from_str(name: &str) -> Result<Self, ParseKernelIdError> {
        let number = |s: &str| s.parse::<u32>().map_err(|_| ParseKernelIdError);
        let dtype_of = |s: &str| {
            ElementType::ALL
                .into_iter()
                .find(|t| t.name() == s)
                .ok_or(ParseKernelIdError)
        };
        let cache_of = |s: &str| {
            CacheLayout::ALL
                .into_iter()
                .find(|c| c.name() == s)
                .ok_or(ParseKernelIdError)
        };
        let (family, dtype) = if let Some(rest) = name.strip_prefix("standard_backward_") {
            let (stage, dtype) = rest.split_once('_').ok_or(ParseKernelIdError)?;
            let stage = StandardBackwardStage::ALL
                .into_iter()
                .find(|s| s.name() == stage)
                .ok_or(ParseKernelIdError)?;
            (Family::StandardBackward(stage), dtype)
        } else if let Some(rest) = name.strip_prefix("standard_") {
            let (stage, dtype) = rest.split_once('_').ok_or(ParseKernelIdError)?;
            let stage = StandardStage::ALL
                .into_iter()
                .find(|s| s.name() == stage)
                .ok_or(ParseKernelIdError)?;
            (Family::Standard(stage), dtype)
        } else if let Some(dtype) = name.strip_prefix("fa1_forward_") {
            (Family::Fa1, dtype)
        } else if let Some(rest) = name.strip_prefix("fa2_forward_") {
            // <dtype>_d<capacity>_bc<B_c>
            let (dtype, rest) = rest.split_once("_d").ok_or(ParseKernelIdError)?;
            let (capacity, cols) = rest.split_once("_bc").ok_or(ParseKernelIdError)?;
            let family = Family::Fa2 {
                head_dim_capacity: number(capacity)?,
                block_cols: number(cols)?,
            };
            (family, dtype)
        } else if let Some(rest) = name.strip_prefix("fa2tc_forward_") {
            // <dtype>_d<d>_w<W>r<R>s<S>c<C>[_varlen|_local|_varlen_local]
            let (rest, form) = strip_form(rest);
            let (dtype, rest) = rest.split_once("_d").ok_or(ParseKernelIdError)?;
            let (head_dim, rest) = rest.split_once("_w").ok_or(ParseKernelIdError)?;
            let (warps, rest) = rest.split_once('r').ok_or(ParseKernelIdError)?;
            let (rows, rest) = rest.split_once('s').ok_or(ParseKernelIdError)?;
            let (stages, cols) = rest.split_once('c').ok_or(ParseKernelIdError)?;
            let tiling = Fa2TcTiling::new(
                number(warps)?,
                number(rows)?,
                number(stages)?,
                number(cols)?,
            );
            let family = Family::Fa2Tc {
                head_dim: number(head_dim)?,
                tiling,
                form,
            };
            (family, dtype)
        } else if let Some(rest) = name.strip_prefix("fa2tc_backward_") {
            let (rest, form) = strip_form(rest);
            let (dtype, head_dim_capacity, grouped) = backward_main(rest)?;
            let family = Family::Fa2TcBackward {
                head_dim_capacity,
                grouped,
                form,
            };
            (family, dtype)
        } else if let Some(rest) = name.strip_prefix("fa3_backward_") {
            let (rest, deterministic) = strip_flag(rest, "_deterministic");
            let (rest, form) = strip_form(rest);
            let (dtype, head_dim, grouped) = backward_main(rest)?;
            let family = Family::Fa3Backward {
                head_dim,
                grouped,
                deterministic,
                form,
            };
            (family, dtype)
        } else if let Some(rest) = name.strip_prefix("fa2_backward_main_") {
            let (dtype, head_dim_capacity, grouped) = backward_main(rest)?;
            let stage = BackwardStage::Main {
                head_dim_capacity,
                grouped,
            };
            (Family::Fa2Backward(stage), dtype)
        } else if let Some(dtype) = name.strip_prefix("backward_group_sum_") {
            (Family::GroupSum, dtype)
        } else if let Some(rest) = name.strip_prefix("fa2_backward_") {
            // <preprocess|postprocess>[_wide]_<dtype>
            let (stage, dtype) = rest.rsplit_once('_').ok_or(ParseKernelIdError)?;
            let stage = BackwardStage::PASSES
                .into_iter()
                .find(|s| s.name() == stage)
                .ok_or(ParseKernelIdError)?;
            (Family::Fa2Backward(stage), dtype)
        } else if let Some(rest) = name.strip_prefix("fa3_forward_") {
            // <dtype>_d<d>_w<W>c<C>[p|_varlen|_local]
            let (rest, form) = strip_form(rest);
            let (dtype, rest) = rest.split_once("_d").ok_or(ParseKernelIdError)?;
            let (head_dim, rest) = rest.split_once("_w").ok_or(ParseKernelIdError)?;
            let (consumers, cols) = rest.split_once('c').ok_or(ParseKernelIdError)?;
            let (cols, persistent) = match cols.strip_suffix('p') {
                Some(cols) => (cols, true),
                None => (cols, false),
            };
            let tiling = Fa3Tiling::new(number(consumers)?, number(cols)?);
            let family = Family::Fa3 {
                head_dim: number(head_dim)?,
                tiling: if persistent {
                    tiling.on_persistent_grid()
                } else {
                    tiling
                },
                form,
            };
            (family, dtype)
        } else if let Some(rest) = name.strip_prefix("decode_splitkv_") {
            // <dtype>_d<d>_<cache>[_onelaunch]
            let (rest, one_launch) = match rest.strip_suffix(ONE_LAUNCH_SUFFIX) {
                Some(rest) => (rest, true),
                None => (rest, false),
            };
            let (dtype, rest) = rest.split_once("_d").ok_or(ParseKernelIdError)?;
            let (head_dim, cache) = rest.split_once('_').ok_or(ParseKernelIdError)?;
            let family = Family::Decode {
                head_dim: number(head_dim)?,
                cache: cache_of(cache)?,
                one_launch,
            };
            (family, dtype)
        } else if let Some(rest) = name.strip_prefix("decode_combine_") {
            // <dtype>_d<d>
            let (dtype, head_dim) = rest.split_once("_d").ok_or(ParseKernelIdError)?;
            let family = Family::DecodeCombine {
                head_dim: number(head_dim)?,
            };
            (family, dtype)
        } else if let Some(rest) = name.strip_prefix("kv_append_") {
            // <dtype>_<cache>
            let (dtype, cache) = rest.split_once('_').ok_or(ParseKernelIdError)?;
            (
                Family::KvAppend {
                    cache: cache_of(cache)?,
                },
                dtype,
            )
        } else {
            return Err(ParseKernelIdError);
        };
        Ok(KernelId::new(family, dtype_of(dtype)?))
    }
}
