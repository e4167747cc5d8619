//! The plan of one described call (`Attention::plan`, `Attention::plan_backward`): which
//! pass it is, that pass's own plan (kernels, launches, workspace, a fallback's reason), and the
//! key of the call it was made for, so that a run of another call is refused.

use std::fmt;

use super::backward_plan::BackwardPlan;
use super::call::CallKey;
use super::decode::DecodePlan;
use super::plan::{ForwardPlan, PlannedLaunch, StatisticsKind};
use super::problem::Problem;

/// Which kernels one call runs and why, decided before any launch; made by
/// [`Attention::plan`] or [`Attention::plan_backward`].
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub pass: PassPlan,
    pub(crate) key: CallKey,
}

/// The plan of one pass.
#[derive(Clone, Debug, PartialEq)]
pub enum PassPlan {
    /// Dense or packed attention's forward.
    Forward(ForwardPlan),
    /// The backward: dQ, dK, dV.
    Backward(BackwardPlan),
    /// A KV-cache call's split-KV decode.
    Decode(DecodePlan),
}

impl Plan {
    /// Which statistics the forward writes.
    pub fn statistics(&self) -> StatisticsKind {
        match &self.pass {
            PassPlan::Forward(plan) => plan.statistics,
            _ => StatisticsKind::LogSumExp,
        }
    }

    /// The statistics' dims: (batch, heads, seqlen_q); a packed batch's (1, heads, total_q),
    /// forward and backward; a decode's (batch, heads, q_tokens).
    pub fn statistics_dims(&self) -> [usize; 3] {
        match &self.pass {
            PassPlan::Forward(plan) => {
                let [_, heads, rows, _] = self.key.q_dims();
                if plan.problem.is_packed() {
                    [1, heads, rows]
                } else {
                    [plan.problem.batch, heads, plan.problem.seqlen_q]
                }
            }
            PassPlan::Backward(plan) => {
                let whole = plan.problem.whole();
                [whole.batch, whole.heads, whole.seqlen_q]
            }
            PassPlan::Decode(plan) => [
                plan.problem.batch,
                plan.problem.heads_q,
                plan.problem.q_tokens,
            ],
        }
    }

    /// The problem a forward or backward plan solves (a decode plan's is `PassPlan::Decode`'s).
    pub fn problem(&self) -> Option<&Problem> {
        match &self.pass {
            PassPlan::Forward(plan) => Some(&plan.problem),
            PassPlan::Backward(plan) => Some(&plan.problem),
            PassPlan::Decode(_) => None,
        }
    }

    /// The kernels in launch order (a packed batch of more than 255 sequences launches each
    /// once per 255).
    pub fn launches(&self) -> &[PlannedLaunch] {
        match &self.pass {
            PassPlan::Forward(plan) => &plan.launches,
            PassPlan::Backward(plan) => &plan.launches,
            PassPlan::Decode(plan) => &plan.launches,
        }
    }

    /// Every kernel's name, in launch order, joined by `+`.
    pub fn kernel_names(&self) -> String {
        super::plan::kernel_names(self.launches())
    }

    /// Bytes of device memory the plan's kernels need besides the call's tensors (standard
    /// attention's S and P, FA1's accumulator; the backward's D, dQ accumulator, flags and
    /// expanded dK, dV; decode's per-split partials).
    pub fn workspace_bytes(&self) -> usize {
        let f32_bytes = std::mem::size_of::<f32>();
        match &self.pass {
            PassPlan::Forward(plan) => {
                let w = plan.workspace;
                w.scores * (f32_bytes + plan.dtype.size_bytes()) + w.o_accumulator * f32_bytes
            }
            PassPlan::Backward(plan) => plan.workspace_bytes(),
            PassPlan::Decode(plan) => {
                (plan.workspace_o + 2 * plan.workspace_stats + plan.workspace_counters) * f32_bytes
            }
        }
    }

    /// Why the algorithm asked for runs another family's kernels, if it does.
    pub fn fallback(&self) -> Option<&str> {
        match &self.pass {
            PassPlan::Forward(plan) => plan.fallback.as_deref(),
            PassPlan::Backward(plan) => plan.fallback.as_deref(),
            PassPlan::Decode(_) => None,
        }
    }
}

impl fmt::Display for Plan {
    /// One line: the family, the kernels with grid, threads and shared memory, the workspace,
    /// and why (a fallback's reason; the decode merge's).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pass {
            PassPlan::Forward(plan) => plan.fmt(f),
            PassPlan::Backward(plan) => plan.fmt(f),
            PassPlan::Decode(plan) => plan.fmt(f),
        }
    }
}
