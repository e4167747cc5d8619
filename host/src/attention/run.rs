//! A described call becomes a [`Plan`], and the plan runs: into tensors the caller owns
//! ([`Plan::run`], [`Attention::forward_into`], [`Attention::backward_into`]) or into new ones
//! ([`Attention::forward`], [`Attention::backward`]). A plan is made once per problem and can
//! run again on new addresses of the same shapes; a run of another problem is refused.

use super::backward::{BackwardArguments, BackwardProblem, Gradients, TensorSpec};
use super::backward_gpu::{BackwardCall, launch_backward};
use super::backward_plan::{BackwardAlgorithm, BackwardOptions, BackwardPlan, BackwardViews};
use super::call::{Attention, Checked, Form, check_memory, check_output, check_rows};
use super::call_plan::{PassPlan, Plan};
use super::decode::{DecodePlan, DecodeWorkspace, launch_decode};
use super::packed::launch_packed;
use super::plan::{CompiledLimits, ForwardPlan, LaunchLimits, StatisticsKind, misaligned_view};
use super::problem::{Algorithm, AttentionOptions, Problem};
use super::tensors::{
    AttentionOutput, BackwardOutput, BackwardTensors, ForwardTensors, Pass, RowStatistics,
    Statistics, Workspace,
};
use super::{ForwardWorkspace, StatisticsAddresses, launch_forward};
use crate::device::Gpu;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::{DeviceRows, DeviceTensor, Layout, TensorRef};

impl<'a, T: Element> Attention<'a, T> {
    /// Checks the call and plans its forward (a KV-cache call's decode) within `limits` (a
    /// [`Gpu`], or [`super::CompiledLimits`] to plan without one). The plan assumes O's rows
    /// 16-byte aligned; a run into an O whose rows are not is refused.
    pub fn plan(&self, limits: &dyn LaunchLimits) -> Result<Plan> {
        self.plan_forward(limits, None)
    }

    /// Checks the call and plans its backward within `limits`, assuming dO, dQ, dK, dV with
    /// 16-byte-aligned rows (a run with others is refused).
    pub fn plan_backward(&self, limits: &dyn LaunchLimits) -> Result<Plan> {
        self.plan_backward_with(limits, None, None)
    }

    /// The forward into new outputs: O (Q's dims and layout) and the row statistics.
    pub fn forward(&self, gpu: &Gpu) -> Result<AttentionOutput<T>> {
        self.forward_new(gpu, T::default(), None)
    }

    /// [`Attention::forward`] with O filled with `fill` and the statistics with NaN first (a
    /// test then sees every element the kernels leave unwritten).
    pub fn forward_filled(&self, gpu: &Gpu, fill: T) -> Result<AttentionOutput<T>> {
        self.forward_new(gpu, fill, Some(f32::NAN))
    }

    /// The forward into new outputs: O filled with `fill`, the statistics with `fill_rows`
    /// (uninitialised for `None`).
    fn forward_new(
        &self,
        gpu: &Gpu,
        fill: T,
        fill_rows: Option<f32>,
    ) -> Result<AttentionOutput<T>> {
        let plan = self.plan(gpu)?;
        let layout = Layout::of(self.q.dims(), self.q.strides()).unwrap_or(Layout::BatchHeadSeqDim);
        let mut o = DeviceTensor::filled(gpu, self.q.dims(), layout, fill)?;
        let rows = plan.statistics_dims();
        let new_rows = |what| DeviceRows::new(gpu, rows, fill_rows, what);
        let mut stats = match plan.statistics() {
            StatisticsKind::LogSumExp => RowStatistics::LogSumExp(new_rows("L")?),
            StatisticsKind::MaxAndSum => RowStatistics::MaxAndSum {
                max: new_rows("m")?,
                sum: new_rows("ℓ")?,
            },
        };
        let tensors = ForwardTensors {
            o: (&mut o).into(),
            stats: stats.as_refs(),
        };
        plan.run_checked(
            Some(gpu),
            self,
            Pass::Forward(tensors),
            &mut Workspace::default(),
        )?;
        Ok(AttentionOutput { o, stats, plan })
    }

    /// The forward into outputs the caller owns: plans with O's alignment known, then runs.
    /// Returns the plan.
    pub fn forward_into(&self, gpu: &Gpu, tensors: ForwardTensors<T>) -> Result<Plan> {
        self.plan_and_run_forward(gpu, Some(gpu), tensors)
    }

    /// Every check [`Attention::forward_into`] makes, without a device: planned for an H200
    /// ([`CompiledLimits::H200`]). Returns that plan.
    pub fn check_forward(&self, tensors: ForwardTensors<T>) -> Result<Plan> {
        self.plan_and_run_forward(&CompiledLimits::H200, None, tensors)
    }

    /// Plans the forward with O's alignment known, then runs it on `gpu` (without one: checks).
    fn plan_and_run_forward(
        &self,
        limits: &dyn LaunchLimits,
        gpu: Option<&Gpu>,
        tensors: ForwardTensors<T>,
    ) -> Result<Plan> {
        let plan = self.plan_forward(limits, Some(&tensors.o))?;
        let mut workspace = Workspace::default();
        plan.run_checked(gpu, self, Pass::Forward(tensors), &mut workspace)?;
        Ok(plan)
    }

    /// Every check [`Attention::backward_into`] makes, without a device (planned for an H200).
    pub fn check_backward(&self, tensors: BackwardTensors<T>) -> Result<Plan> {
        let plan = self.plan_backward_with(&CompiledLimits::H200, Some(&tensors), None)?;
        plan.launch_backward(None, self, tensors)?;
        Ok(plan)
    }

    /// The backward into new gradients (in Q's and K's layouts), from the forward's output.
    pub fn backward(
        &self,
        gpu: &Gpu,
        forward: &AttentionOutput<T>,
        d_o: &DeviceTensor<T>,
    ) -> Result<BackwardOutput<T>> {
        let RowStatistics::LogSumExp(logsumexp) = &forward.stats else {
            return Err(Error::invalid(
                "forward.stats",
                "FA1's m and ℓ",
                "L = m + log ℓ (run the forward with any algorithm but fa1)",
            ));
        };
        let layout_of =
            |t: &TensorRef<T>| Layout::of(t.dims(), t.strides()).unwrap_or(Layout::BatchHeadSeqDim);
        let zeros =
            |t: &TensorRef<T>| DeviceTensor::filled(gpu, t.dims(), layout_of(t), T::default());
        let mut gradients = Gradients {
            dq: zeros(&self.q)?,
            dk: zeros(&self.k)?,
            dv: zeros(&self.v)?,
        };
        let tensors = BackwardTensors {
            o: (&forward.o).into(),
            logsumexp: logsumexp.into(),
            d_o: d_o.into(),
            gradients: Gradients {
                dq: (&mut gradients.dq).into(),
                dk: (&mut gradients.dk).into(),
                dv: (&mut gradients.dv).into(),
            },
        };
        // The forward's plan says which problem its O and L solve: this one, or an error.
        let plan = self.plan_backward_with(gpu, Some(&tensors), forward.plan.problem().copied())?;
        plan.launch_backward(Some(gpu), self, tensors)?;
        Ok(BackwardOutput { gradients, plan })
    }

    /// The backward into gradients the caller owns: plans with every tensor's alignment known,
    /// then runs. Returns the plan.
    pub fn backward_into(&self, gpu: &Gpu, tensors: BackwardTensors<T>) -> Result<Plan> {
        let plan = self.plan_backward_with(gpu, Some(&tensors), None)?;
        plan.launch_backward(Some(gpu), self, tensors)?;
        Ok(plan)
    }

    fn plan_forward(&self, limits: &dyn LaunchLimits, o: Option<&TensorRef<T>>) -> Result<Plan> {
        let checked = self.check()?;
        let pass = match &checked {
            Checked::Attention(problem) => {
                // Without O, the plan takes it to be aligned as Q is (an O this library or
                // PyTorch allocates is); a run checks the O it gets.
                let operands = self.operands(o.unwrap_or(&self.q));
                let plan = ForwardPlan::new(
                    limits,
                    self.options.algorithm,
                    T::DTYPE,
                    problem,
                    &self.options,
                    Some(&operands),
                )?;
                PassPlan::Forward(plan)
            }
            Checked::Decode(problem) => PassPlan::Decode(DecodePlan::new(
                limits,
                T::DTYPE,
                problem,
                &self.decode_options(),
            )?),
        };
        Ok(Plan {
            key: self.key(&checked),
            pass,
        })
    }

    /// The backward's plan, with the tensors' shapes and alignment where given, and the
    /// problem of the forward that wrote O and L where known (it must be this call's).
    fn plan_backward_with(
        &self,
        limits: &dyn LaunchLimits,
        tensors: Option<&BackwardTensors<T>>,
        forward: Option<Problem>,
    ) -> Result<Plan> {
        let checked = self.check()?;
        let problem = match (&checked, self.form) {
            (Checked::Attention(problem), Form::Dense | Form::Packed(_)) => *problem,
            _ => {
                return Err(Error::invalid(
                    "form",
                    "a KV-cache call",
                    "the backward takes dense and packed batches (KV-cache calls: forward only)",
                ));
            }
        };
        let backward = self.backward_options()?;
        let views = tensors.map(|t| BackwardViews {
            q: self.q.view(),
            k: self.k.view(),
            v: self.v.view(),
            o: t.o.view(),
            d_o: t.d_o.view(),
            dq: t.gradients.dq.view(),
            dk: t.gradients.dk.view(),
            dv: t.gradients.dv.view(),
        });
        let checked_backward = self.backward_problem(&problem, tensors, forward)?;
        let plan = BackwardPlan::new(
            limits,
            T::DTYPE,
            &checked_backward.problem,
            &backward,
            views.as_ref(),
        )?;
        Ok(Plan {
            key: self.key(&checked),
            pass: PassPlan::Backward(plan),
        })
    }

    /// The backward's kernel choice from the call's options.
    fn backward_options(&self) -> Result<BackwardOptions> {
        let algorithm = match self.options.backward_algorithm {
            Algorithm::Auto | Algorithm::Fa3 => BackwardAlgorithm::Fa3,
            Algorithm::Fa2Tc => BackwardAlgorithm::Fa2Tc,
            Algorithm::Fa2 => BackwardAlgorithm::Fa2,
            Algorithm::Standard => BackwardAlgorithm::Standard,
            Algorithm::Fa1 => {
                return Err(Error::invalid(
                    "backward_algorithm",
                    Algorithm::Fa1,
                    "fa1 has no backward; allowed: auto, fa3, fa2-tc, fa2, standard",
                ));
            }
        };
        Ok(BackwardOptions {
            algorithm,
            deterministic: self.options.deterministic,
        })
    }

    /// The backward's own checks (with tensors: O, dO, L and the gradients' dims and dtypes).
    /// A packed batch's tensors are checked as the one sequence of all its rows they are (L
    /// (1, heads, total_q), flash-attn's varlen layout), and its problem kept.
    fn backward_problem(
        &self,
        problem: &Problem,
        tensors: Option<&BackwardTensors<T>>,
        forward: Option<Problem>,
    ) -> Result<BackwardProblem> {
        let spec = |t: &TensorRef<T>| TensorSpec {
            dims: t.dims(),
            strides: t.strides().map(|s| s as isize),
            dtype: T::DTYPE,
        };
        let whole = problem.whole();
        if let Some(forward) = forward
            && problem.is_packed()
            && forward != *problem
        {
            return Err(Error::invalid(
                "logsumexp",
                format!("the statistics of another problem ({forward:?})"),
                format!("the forward's statistics for this packed batch ({problem:?})"),
            ));
        }
        let q = spec(&self.q);
        let arguments = BackwardArguments {
            q,
            k: spec(&self.k),
            v: spec(&self.v),
            o: tensors.map_or(q, |t| spec(&t.o)),
            d_o: tensors.map_or(q, |t| spec(&t.d_o)),
            logsumexp: tensors.map_or([whole.batch, whole.heads, whole.seqlen_q], |t| {
                t.logsumexp.dims()
            }),
            forward: forward.map(|f| f.whole()),
        };
        // A packed batch's slopes were checked against its sequences (`problem`); the whole
        // tensors are one sequence, which `Problem::whole` gives no slopes.
        let options = AttentionOptions {
            alibi: self.options.alibi.filter(|_| !problem.is_packed()),
            ..self.options
        };
        let checked = BackwardProblem::new(&arguments, &options)?;
        if let Some(t) = tensors {
            let Gradients { dq, dk, dv } = &t.gradients;
            checked.check_gradients(&Gradients {
                dq: spec(dq),
                dk: spec(dk),
                dv: spec(dv),
            })?;
        }
        Ok(BackwardProblem {
            problem: *problem,
            ..checked
        })
    }
}

impl Plan {
    /// Runs the plan on `call` (the description it was made from, or one of the same shapes with
    /// new addresses) with the pass's tensors, on `gpu`'s stream. The workspace is allocated for
    /// this run and freed in stream order after its kernels.
    pub fn run<T: Element>(&self, gpu: &Gpu, call: &Attention<T>, tensors: Pass<T>) -> Result<()> {
        self.run_with_workspace(gpu, call, tensors, &mut Workspace::default())
    }

    /// [`Plan::run`] with a workspace made for this plan ([`Workspace::new`]); what it lacks is
    /// allocated for this run.
    pub fn run_with_workspace<T: Element>(
        &self,
        gpu: &Gpu,
        call: &Attention<T>,
        tensors: Pass<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        let checked = call.check()?;
        if call.key(&checked) != self.key {
            return Err(Error::invalid(
                "plan",
                "a plan of another call",
                "a plan made for this call's shapes, options and form (Attention::plan)",
            ));
        }
        self.run_checked(Some(gpu), call, tensors, workspace)
    }

    /// Runs a plan whose key matches `call`: checks the memory of every tensor and the outputs'
    /// shapes, then launches on `gpu` (without one: the checks alone).
    fn run_checked<T: Element>(
        &self,
        gpu: Option<&Gpu>,
        call: &Attention<T>,
        tensors: Pass<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        for (name, tensor) in call.inputs() {
            check_memory(name, &tensor)?;
        }
        match (&self.pass, tensors) {
            (PassPlan::Forward(plan), Pass::Forward(out)) => {
                check_output("o", &out.o, call.q.dims(), "q")?;
                if plan.needs_aligned_rows()
                    && let Some(reason) = misaligned_view(&[("o", &out.o.view())])
                {
                    return Err(Error::invalid(
                        "o",
                        format!("strides {:?}", out.o.strides()),
                        format!("{reason}, as the planned {} needs", plan.kernel_names()),
                    ));
                }
                let stats = self.statistics_addresses(&out.stats)?;
                let operands = call.operands(&out.o);
                let dims = [call.q.dims(), call.k.dims(), call.v.dims()];
                let Some(gpu) = gpu else { return Ok(()) };
                match call.form {
                    Form::Packed(batch) => {
                        let StatisticsAddresses::LogSumExp(l) = stats else {
                            unreachable!("a packed plan writes L")
                        };
                        launch_packed::<T>(gpu, plan, operands, dims, l, batch)
                    }
                    _ => {
                        let workspace = match &mut workspace.forward {
                            Some(w) => w,
                            slot => slot.insert(ForwardWorkspace::covering(gpu, &[plan])?),
                        };
                        launch_forward::<T>(gpu, plan, operands, dims, stats, workspace)
                    }
                }
            }
            (PassPlan::Decode(plan), Pass::Forward(out)) => {
                check_output("o", &out.o, call.q.dims(), "q")?;
                super::decode::check_rows_aligned("o", out.o.strides())?;
                let StatisticsAddresses::LogSumExp(l) = self.statistics_addresses(&out.stats)?
                else {
                    unreachable!("decode writes L")
                };
                let Form::Cache(cache) = call.form else {
                    unreachable!("a decode plan's key is a KV-cache call's")
                };
                if let Some((k, v)) = cache.append {
                    check_memory("k_new", &k)?;
                    check_memory("v_new", &v)?;
                }
                if cache.seqlens.device.is_none() {
                    return Err(Error::invalid(
                        "cache_seqlens",
                        "lengths on the host alone (CacheSeqlens::host)",
                        "lengths on the device: CacheSeqlens::new",
                    ));
                }
                if cache.block_table.is_some_and(|t| t.device.is_none()) {
                    return Err(Error::invalid(
                        "block_table",
                        "a table on the host alone (BlockTable::host)",
                        "a table on the device: BlockTable::new",
                    ));
                }
                let Some(gpu) = gpu else { return Ok(()) };
                let workspace = match &mut workspace.decode {
                    Some(w) => w,
                    slot => {
                        slot.insert(DecodeWorkspace::covering(gpu, std::slice::from_ref(plan))?)
                    }
                };
                launch_decode(gpu, plan, call, &cache, &out.o, l, workspace)
            }
            (PassPlan::Backward(plan), Pass::Backward(t)) => {
                // A reused plan meets these tensors for the first time: their shapes and dtypes
                // as the backward needs them, and the alignment the plan assumed.
                call.backward_problem(&plan.problem, Some(&t), None)?;
                // The tensor-core main kernels copy dO and store dK, dV in 16-byte pieces; the
                // wide passes read O, dO and write dQ 16 bytes at a time.
                let mut views = Vec::new();
                if plan.needs_aligned_rows() {
                    views.extend([
                        ("d_o", t.d_o.view()),
                        ("dk", t.gradients.dk.view()),
                        ("dv", t.gradients.dv.view()),
                    ]);
                }
                if plan.has_wide_passes() {
                    views.extend([
                        ("o", t.o.view()),
                        ("d_o", t.d_o.view()),
                        ("dq", t.gradients.dq.view()),
                    ]);
                }
                if !views.is_empty() {
                    let named: Vec<(&str, &_)> = views.iter().map(|(n, v)| (*n, v)).collect();
                    if let Some(reason) = misaligned_view(&named) {
                        let name = named
                            .iter()
                            .map(|(n, _)| *n)
                            .find(|n| reason.starts_with(n))
                            .unwrap_or("d_o");
                        return Err(Error::invalid(
                            name,
                            "rows that are not 16-byte aligned",
                            format!(
                                "{reason}, as the planned {} needs (Attention::backward_into \
                                 plans with the tensors)",
                                plan.kernel_names()
                            ),
                        ));
                    }
                }
                self.launch_backward(gpu, call, t)
            }
            (_, _) => Err(Error::invalid(
                "tensors",
                "another pass's tensors",
                "Pass::Forward for a forward or decode plan, Pass::Backward for a backward plan",
            )),
        }
    }

    /// Launches a backward plan after the memory checks (the shapes were checked with the plan,
    /// or by the run).
    fn launch_backward<T: Element>(
        &self,
        gpu: Option<&Gpu>,
        call: &Attention<T>,
        t: BackwardTensors<T>,
    ) -> Result<()> {
        let PassPlan::Backward(plan) = &self.pass else {
            unreachable!("a backward plan")
        };
        let problem = &plan.problem;
        for (name, tensor) in call.inputs() {
            check_memory(name, &tensor)?;
        }
        check_output("dq", &t.gradients.dq, call.q.dims(), "q")?;
        check_output("dk", &t.gradients.dk, call.k.dims(), "k")?;
        check_output("dv", &t.gradients.dv, call.v.dims(), "v")?;
        check_memory("o", &t.o)?;
        check_memory("d_o", &t.d_o)?;
        let whole = problem.whole();
        check_rows(
            "logsumexp",
            &t.logsumexp,
            [whole.batch, whole.heads, whole.seqlen_q],
        )?;
        let Gradients { dq, dk, dv } = &t.gradients;
        let backward_call = BackwardCall {
            operands: call.operands(&t.o),
            d_o: t.d_o.view(),
            gradients: Gradients {
                dq: dq.view(),
                dk: dk.view(),
                dv: dv.view(),
            },
            logsumexp: t.logsumexp.address(),
            packed: match call.form {
                Form::Packed(batch) => Some(batch),
                _ => None,
            },
        };
        match gpu {
            Some(gpu) => launch_backward(gpu, plan, backward_call),
            None => Ok(()),
        }
    }

    /// The statistics' addresses, checked against what the plan writes.
    fn statistics_addresses(&self, stats: &Statistics) -> Result<StatisticsAddresses> {
        let rows = self.statistics_dims();
        match (self.statistics(), stats) {
            (StatisticsKind::LogSumExp, Statistics::LogSumExp(l)) => {
                check_rows("lse", l, rows)?;
                Ok(StatisticsAddresses::LogSumExp(l.address()))
            }
            (StatisticsKind::MaxAndSum, Statistics::MaxAndSum { max, sum }) => {
                check_rows("m", max, rows)?;
                check_rows("l", sum, rows)?;
                Ok(StatisticsAddresses::MaxAndSum {
                    max: max.address(),
                    sum: sum.address(),
                })
            }
            (kind, _) => Err(Error::invalid(
                "stats",
                "statistics of another kind",
                format!("this plan writes {kind:?} statistics"),
            )),
        }
    }
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
