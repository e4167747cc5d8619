//! The tensors a run takes besides Q, K, V ([`Pass`]: the forward's outputs, or the backward's
//! O, L, dO and gradients), the outputs the conveniences allocate, and the reusable workspace.

use super::ForwardWorkspace;
use super::backward::Gradients;
use super::call_plan::{PassPlan, Plan};
use super::decode::{DecodePlan, DecodeWorkspace};
use super::plan::ForwardPlan;
use crate::device::Gpu;
use crate::dtype::Element;
use crate::error::Result;
use crate::tensor::{DeviceRows, DeviceTensor, RowsRef, TensorRef};

/// The tensors a run takes besides Q, K, V: the forward's outputs, or the backward's (a few
/// hundred bytes of addresses, passed by value once per run).
#[derive(Clone, Copy, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Pass<'a, T> {
    Forward(ForwardTensors<'a, T>),
    Backward(BackwardTensors<'a, T>),
}

/// What the forward writes: O (Q's dims) and the row statistics.
#[derive(Clone, Copy, Debug)]
pub struct ForwardTensors<'a, T> {
    pub o: TensorRef<'a, T>,
    pub stats: Statistics<'a>,
}

/// The row statistics a forward writes: L = m + log ℓ, (batch, heads, seqlen_q) (a packed
/// batch's (1, heads, total_q); a KV-cache call's (batch, heads, q_tokens)), or FA1's m and ℓ.
#[derive(Clone, Copy, Debug)]
pub enum Statistics<'a> {
    LogSumExp(RowsRef<'a>),
    MaxAndSum { max: RowsRef<'a>, sum: RowsRef<'a> },
}

/// The backward's tensors: the forward's O and L for this call, dO, and dQ, dK, dV to write (dQ
/// Q's dims, dK and dV K's; any strides with a contiguous head dim).
#[derive(Clone, Copy, Debug)]
pub struct BackwardTensors<'a, T> {
    pub o: TensorRef<'a, T>,
    pub logsumexp: RowsRef<'a>,
    pub d_o: TensorRef<'a, T>,
    pub gradients: Gradients<TensorRef<'a, T>>,
}

/// O, the row statistics and the plan that wrote them.
pub struct AttentionOutput<T> {
    pub o: DeviceTensor<T>,
    pub stats: RowStatistics,
    pub plan: Plan,
}

impl<T: Element> AttentionOutput<T> {
    /// This output as the tensors a forward writes ([`Attention::forward_into`]).
    pub fn tensors(&mut self) -> ForwardTensors<'_, T> {
        ForwardTensors {
            o: (&mut self.o).into(),
            stats: self.stats.as_refs(),
        }
    }

    /// This output as a run's tensors, to run its plan again into it ([`Plan::run`]).
    pub fn pass(&mut self) -> Pass<'_, T> {
        Pass::Forward(self.tensors())
    }
}

/// The row statistics on the device (see [`Statistics`]).
pub enum RowStatistics {
    LogSumExp(DeviceRows),
    MaxAndSum { max: DeviceRows, sum: DeviceRows },
}

impl RowStatistics {
    /// L as a (batch, heads, rows) array: downloaded, or m + ln ℓ for FA1 (−∞ where ℓ = 0).
    pub fn logsumexp(&self, gpu: &Gpu) -> Result<ndarray::Array3<f32>> {
        match self {
            RowStatistics::LogSumExp(l) => l.to_array(gpu),
            RowStatistics::MaxAndSum { max, sum } => {
                let (m, l) = (max.to_array(gpu)?, sum.to_array(gpu)?);
                Ok(ndarray::Zip::from(&m).and(&l).map_collect(|&m, &l| {
                    if l > 0.0 {
                        m + l.ln()
                    } else {
                        f32::NEG_INFINITY
                    }
                }))
            }
        }
    }

    /// The statistics as a run writes them.
    pub fn as_refs(&mut self) -> Statistics<'_> {
        match self {
            RowStatistics::LogSumExp(l) => Statistics::LogSumExp(l.into()),
            RowStatistics::MaxAndSum { max, sum } => Statistics::MaxAndSum {
                max: max.into(),
                sum: sum.into(),
            },
        }
    }
}

/// dQ, dK, dV and the plan that wrote them.
pub struct BackwardOutput<T> {
    pub gradients: Gradients<DeviceTensor<T>>,
    pub plan: Plan,
}

/// Device memory a plan needs besides its tensors (standard attention's S and P, FA1's
/// accumulator, decode's per-split partials), allocated once to serve many runs.
#[derive(Default)]
pub struct Workspace {
    pub(crate) forward: Option<ForwardWorkspace>,
    pub(crate) decode: Option<DecodeWorkspace>,
}

impl Workspace {
    /// What `plan` needs (the backward allocates its own per run).
    pub fn new(gpu: &Gpu, plan: &Plan) -> Result<Self> {
        Self::covering(gpu, std::slice::from_ref(plan))
    }

    /// What the most demanding of `plans` needs, so that one workspace runs each.
    pub fn covering(gpu: &Gpu, plans: &[Plan]) -> Result<Self> {
        let forward: Vec<&ForwardPlan> = plans
            .iter()
            .filter_map(|p| match &p.pass {
                PassPlan::Forward(f) => Some(f),
                _ => None,
            })
            .collect();
        let decode: Vec<DecodePlan> = plans
            .iter()
            .filter_map(|p| match &p.pass {
                PassPlan::Decode(d) => Some(d.clone()),
                _ => None,
            })
            .collect();
        Ok(Self {
            forward: (!forward.is_empty())
                .then(|| ForwardWorkspace::covering(gpu, &forward))
                .transpose()?,
            decode: (!decode.is_empty())
                .then(|| DecodeWorkspace::covering(gpu, &decode))
                .transpose()?,
        })
    }
}
