//! The front door's checks without a device: each bad argument is an error naming it, before
//! anything could launch.

use half::{bf16, f16};

use super::*;
use crate::attention::alibi::AlibiSlopes;
use crate::attention::dropout::Dropout;
use crate::attention::packed::PackedBatch;
use crate::attention::problem::AttentionOptions;
use crate::error::Error;
use crate::tensor::RowsRef;
use flash_kernels::registry::{Family, KernelForm};

const GIB: u64 = 1 << 30;
const BASE: u64 = 0x7f00_0000_0000;

/// (batch, seqlen, heads, head_dim) storage at gibibyte `slot`, viewed as (batch, heads, seqlen,
/// head_dim): flash-attn's layout.
fn bshd<T: Element>(slot: u64, [b, h, s, d]: [usize; 4]) -> TensorRef<'static, T> {
    // SAFETY: the checks never touch the memory.
    unsafe { TensorRef::from_raw(BASE + slot * GIB, [b, h, s, d], [s * h * d, d, h * d, 1]) }
}

fn rows(slot: u64, [b, h, n]: [usize; 3]) -> RowsRef<'static> {
    // SAFETY: as `bshd`.
    unsafe { RowsRef::from_raw(BASE + slot * GIB, [b, h, n], [h * n, n, 1]) }
}

/// The argument an error names.
fn named<R: std::fmt::Debug>(result: Result<R>) -> &'static str {
    match result {
        Err(Error::InvalidArgument { name, .. }) => name,
        other => panic!("expected an invalid argument, got {other:?}"),
    }
}

struct Forward<T: Element> {
    q: TensorRef<'static, T>,
    k: TensorRef<'static, T>,
    v: TensorRef<'static, T>,
    o: TensorRef<'static, T>,
    lse: RowsRef<'static>,
    options: AttentionOptions,
}

impl<T: Element> Forward<T> {
    fn new(dims: [usize; 4]) -> Self {
        Self {
            q: bshd(0, dims),
            k: bshd(1, dims),
            v: bshd(2, dims),
            o: bshd(3, dims),
            lse: rows(4, [dims[0], dims[1], dims[2]]),
            options: AttentionOptions::default(),
        }
    }

    fn check(&self) -> Result<Plan> {
        let call = Attention::new(self.q, self.k, self.v).options(self.options);
        call.check_forward(ForwardTensors {
            o: self.o,
            stats: Statistics::LogSumExp(self.lse),
        })
    }
}

#[test]
fn accepts_flash_attention_and_sdpa_layouts_and_plans_auto_as_fa3_on_an_h200() {
    let call = Forward::<bf16>::new([2, 8, 100, 64]);
    let plan = call.check().expect("valid");
    assert!(
        plan.kernel_names().starts_with("fa3_forward_bf16_d64"),
        "{plan}"
    );
    let mut sdpa = Forward::<bf16>::new([2, 8, 100, 64]);
    for t in [&mut sdpa.q, &mut sdpa.k, &mut sdpa.v, &mut sdpa.o] {
        // SAFETY: as `bshd`.
        *t = unsafe { TensorRef::from_raw(t.address(), t.dims(), [8 * 100 * 64, 100 * 64, 64, 1]) };
    }
    assert!(sdpa.check().is_ok());
}

#[test]
fn names_the_tensor_that_is_wrong() {
    let restride = |t: &mut TensorRef<'static, f16>, strides| {
        // SAFETY: as `bshd`.
        *t = unsafe { TensorRef::from_raw(t.address(), t.dims(), strides) }
    };
    let readdress = |t: &mut TensorRef<'static, f16>, address| {
        // SAFETY: as `bshd`.
        *t = unsafe { TensorRef::from_raw(address, t.dims(), t.strides()) }
    };
    let dims = [1, 2, 16, 32];
    let mut call = Forward::<f16>::new(dims);
    restride(&mut call.k, [1024, 32, 64, 2]);
    assert_eq!(named(call.check()), "k");
    let mut call = Forward::<f16>::new(dims);
    readdress(&mut call.v, 0);
    assert_eq!(named(call.check()), "v");
    let mut call = Forward::<f16>::new(dims);
    readdress(&mut call.q, BASE + 1); // not a whole f16
    assert_eq!(named(call.check()), "q");
    let mut call = Forward::<f16>::new(dims);
    call.o = bshd(3, [1, 2, 15, 32]);
    assert_eq!(named(call.check()), "o");
    let mut call = Forward::<f16>::new(dims);
    call.k = bshd(1, [1, 3, 16, 32]);
    assert_eq!(named(call.check()), "k");
    let mut call = Forward::<f16>::new(dims);
    call.lse = rows(4, [1, 2, 15]);
    assert_eq!(named(call.check()), "lse");
}

#[test]
fn rejects_an_overlapping_output_but_takes_a_broadcast_input() {
    let mut call = Forward::<bf16>::new([2, 2, 16, 32]);
    // SAFETY: as `bshd`.
    call.o = unsafe { TensorRef::from_raw(call.o.address(), call.o.dims(), [0, 32, 64, 1]) };
    assert_eq!(named(call.check()), "o");
    let mut call = Forward::<bf16>::new([2, 2, 16, 32]);
    // SAFETY: as `bshd`.
    call.q = unsafe { TensorRef::from_raw(call.q.address(), call.q.dims(), [0, 32, 64, 1]) };
    assert!(call.check().is_ok());
}

#[test]
fn statistics_must_be_the_algorithms() {
    let mut call = Forward::<f32>::new([1, 1, 8, 16]);
    call.options.algorithm = Algorithm::Fa1;
    assert_eq!(named(call.check()), "stats");
}

#[test]
fn options_and_shapes_are_checked_with_the_call() {
    let call = Forward::<f16>::new([1, 1, 8, 300]);
    assert_eq!(named(call.check()), "head_dim");
    let mut call = Forward::<f16>::new([1, 1, 8, 64]);
    call.options.softmax_scale = Some(f32::NAN);
    assert_eq!(named(call.check()), "softmax_scale");
    let mut call = Forward::<f16>::new([1, 1, 8, 64]);
    call.options.backward_algorithm = Algorithm::Fa1;
    let attention = Attention::new(call.q, call.k, call.v).options(call.options);
    assert_eq!(
        named(attention.plan_backward(&CompiledLimits::H200)),
        "backward_algorithm"
    );
}

#[test]
fn addresses_past_64_bits_are_rejected() {
    let mut call = Forward::<f16>::new([2, 1, 8, 16]);
    // SAFETY: as `bshd`.
    call.v = unsafe {
        TensorRef::from_raw(call.v.address(), call.v.dims(), [usize::MAX / 2, 16, 16, 1])
    };
    assert_eq!(named(call.check()), "v");
}

#[test]
fn a_layout_only_call_plans_but_does_not_run() {
    let dims = [1, 4, 128, 128];
    let strides = Layout::BatchHeadSeqDim.strides(dims);
    let q = TensorRef::<bf16>::layout_only(dims, strides);
    let call = Attention::new(q, q, q).causal(true);
    let plan = call.plan(&CompiledLimits::H200).expect("plans");
    assert!(
        plan.kernel_names().contains("fa3_forward_bf16_d128"),
        "{plan}"
    );
    let o = bshd(3, dims);
    let result = call.check_forward(ForwardTensors {
        o,
        stats: Statistics::LogSumExp(rows(4, [1, 4, 128])),
    });
    assert_eq!(named(result), "q");
}

#[test]
fn a_plan_runs_only_its_own_calls_shapes() {
    let dims = [1, 2, 64, 64];
    let strides = Layout::BatchHeadSeqDim.strides(dims);
    let q = TensorRef::<bf16>::layout_only(dims, strides);
    let call = Attention::new(q, q, q);
    let plan = call.plan(&CompiledLimits::H200).expect("plans");
    let other = Attention::new(q, q, q).causal(true);
    assert_ne!(other.key(&other.check().unwrap()), plan.key);
    assert_eq!(call.key(&call.check().unwrap()), plan.key);
}

/// A packed batch of three sequences (5, 0, 11 queries; 7, 3, 9 keys), 4 query heads on 2 K/V
/// heads, head dim 64, in flash-attn's (total, heads, d) layout.
fn packed_call() -> (Forward<bf16>, PackedBatch) {
    let packed = |slot, [total, heads, d]: [usize; 3]| bshd(slot, [1, heads, total, d]);
    let call = Forward {
        q: packed(0, [16, 4, 64]),
        k: packed(1, [19, 2, 64]),
        v: packed(2, [19, 2, 64]),
        o: packed(3, [16, 4, 64]),
        lse: rows(4, [1, 4, 16]),
        options: AttentionOptions::default(),
    };
    let batch = PackedBatch::new(&[0, 5, 5, 16], &[0, 7, 10, 19]).expect("valid offsets");
    (call, batch)
}

fn check_packed(call: &Forward<bf16>, batch: &PackedBatch) -> Result<Plan> {
    Attention::new(call.q, call.k, call.v)
        .options(call.options)
        .packed(batch)
        .check_forward(ForwardTensors {
            o: call.o,
            stats: Statistics::LogSumExp(call.lse),
        })
}

#[test]
fn a_packed_batch_takes_its_shape_from_the_offsets_and_names_bad_arguments() {
    let (call, batch) = packed_call();
    let plan = check_packed(&call, &batch).expect("valid");
    assert!(plan.kernel_names().contains("varlen"), "{plan}");
    assert_eq!(plan.statistics_dims(), [1, 4, 16]);
    let (mut bad, _) = packed_call();
    bad.lse = rows(4, [1, 4, 15]);
    assert_eq!(named(check_packed(&bad, &batch)), "lse");
    let (mut bad, _) = packed_call();
    bad.q = bshd(0, [1, 4, 17, 64]);
    bad.o = bshd(3, [1, 4, 17, 64]);
    assert_eq!(named(check_packed(&bad, &batch)), "cu_seqlens_q");
    let (mut bad, _) = packed_call();
    bad.options.algorithm = Algorithm::Fa2;
    assert_eq!(named(check_packed(&bad, &batch)), "algorithm");
}

struct Backward<T: Element> {
    forward: Forward<T>,
    d_o: TensorRef<'static, T>,
    gradients: Gradients<TensorRef<'static, T>>,
}

impl<T: Element> Backward<T> {
    /// Q (2, 3, 5, 40) against K, V (2, 3, 7, 40), every tensor in its own gibibyte.
    fn new() -> Self {
        let (q, kv) = ([2, 3, 5, 40], [2, 3, 7, 40]);
        Self {
            forward: Forward {
                q: bshd(0, q),
                k: bshd(1, kv),
                v: bshd(2, kv),
                o: bshd(3, q),
                lse: rows(4, [2, 3, 5]),
                options: AttentionOptions::default(),
            },
            d_o: bshd(5, q),
            gradients: Gradients {
                dq: bshd(6, q),
                dk: bshd(7, kv),
                dv: bshd(8, kv),
            },
        }
    }

    fn check(&self) -> Result<Plan> {
        let f = &self.forward;
        Attention::new(f.q, f.k, f.v)
            .options(f.options)
            .check_backward(BackwardTensors {
                o: f.o,
                logsumexp: f.lse,
                d_o: self.d_o,
                gradients: self.gradients,
            })
    }
}

#[test]
fn backward_accepts_a_valid_call_with_seqlen_q_and_k_apart() {
    let mut call = Backward::<bf16>::new();
    call.forward.options.causal = true;
    let plan = call.check().expect("valid");
    let PassPlan::Backward(backward) = &plan.pass else {
        panic!("a backward plan")
    };
    assert_eq!(
        (backward.problem.seqlen_q, backward.problem.seqlen_k),
        (5, 7)
    );
    assert!(backward.problem.causal);
}

#[test]
fn backward_names_each_tensor_that_is_wrong() {
    let mut call = Backward::<f16>::new();
    // SAFETY: as `bshd`.
    call.d_o =
        unsafe { TensorRef::from_raw(call.d_o.address(), call.d_o.dims(), [1200, 40, 120, 2]) };
    assert_eq!(named(call.check()), "d_o");
    let mut call = Backward::<f16>::new();
    call.forward.o = bshd(3, [2, 3, 4, 40]);
    assert_eq!(named(call.check()), "o");
    let mut call = Backward::<f16>::new();
    call.d_o = bshd(5, [2, 3, 4, 40]);
    assert_eq!(named(call.check()), "d_o");
    let mut call = Backward::<f16>::new();
    // SAFETY: as `bshd`.
    call.gradients.dq = unsafe {
        TensorRef::from_raw(
            call.gradients.dq.address() + 1,
            call.gradients.dq.dims(),
            call.gradients.dq.strides(),
        )
    };
    assert_eq!(named(call.check()), "dq");
    let mut call = Backward::<f16>::new();
    call.gradients.dk = bshd(7, [2, 3, 5, 40]); // Q's seqlen, not K's
    assert_eq!(named(call.check()), "dk");
    let mut call = Backward::<f16>::new();
    // SAFETY: as `bshd`.
    call.gradients.dv =
        unsafe { TensorRef::from_raw(0, call.gradients.dv.dims(), call.gradients.dv.strides()) };
    assert_eq!(named(call.check()), "dv");
}

#[test]
fn gradients_must_not_overlap_but_d_o_may_broadcast() {
    let mut call = Backward::<f32>::new();
    let dk = call.gradients.dk;
    // SAFETY: as `bshd`.
    call.gradients.dk = unsafe { TensorRef::from_raw(dk.address(), dk.dims(), [0, 40, 120, 1]) };
    assert_eq!(named(call.check()), "dk");
    let mut call = Backward::<f32>::new();
    // SAFETY: as `bshd`; dO of `o.sum(-1)`-like losses: one row broadcast.
    call.d_o = unsafe { TensorRef::from_raw(call.d_o.address(), call.d_o.dims(), [0, 0, 0, 1]) };
    assert!(call.check().is_ok());
}

#[test]
fn logsumexp_must_be_contiguous_and_of_q_rows() {
    let mut call = Backward::<bf16>::new();
    // SAFETY: as `bshd`; (batch, heads) transposed.
    call.forward.lse =
        unsafe { RowsRef::from_raw(call.forward.lse.address(), [2, 3, 5], [5, 10, 1]) };
    assert_eq!(named(call.check()), "logsumexp");
    let mut call = Backward::<bf16>::new();
    call.forward.lse = rows(4, [2, 3, 7]);
    assert_eq!(named(call.check()), "logsumexp");
    let mut call = Backward::<bf16>::new();
    // SAFETY: as `bshd`.
    call.forward.lse = unsafe { RowsRef::from_raw(BASE + 4 * GIB + 2, [2, 3, 5], [15, 5, 1]) };
    assert_eq!(named(call.check()), "logsumexp");
}

impl<T: Element> Backward<T> {
    fn tensors(&self) -> BackwardTensors<'static, T> {
        BackwardTensors {
            o: self.forward.o,
            logsumexp: self.forward.lse,
            d_o: self.d_o,
            gradients: self.gradients,
        }
    }
}

/// `tensor` one element past where it starts: aligned to its element, not to 16 bytes.
fn shifted<T: Element>(tensor: TensorRef<'static, T>) -> TensorRef<'static, T> {
    // SAFETY: as `bshd`.
    unsafe {
        TensorRef::from_raw(
            tensor.address() + std::mem::size_of::<T>() as u64,
            tensor.dims(),
            tensor.strides(),
        )
    }
}

#[test]
fn the_backward_plans_the_wide_passes_only_for_aligned_o_d_o_and_dq() {
    let backward = |plan: &Plan| match &plan.pass {
        PassPlan::Backward(backward) => backward.clone(),
        _ => panic!("a backward plan"),
    };
    // d = 40, every row 16-byte aligned: the wide pre- and post-pass.
    let call = Backward::<bf16>::new();
    let plan = call.check().expect("valid");
    assert!(backward(&plan).has_wide_passes(), "{plan}");
    // dQ one element off: the element-wise passes, and the plan says why.
    let mut misaligned = Backward::<bf16>::new();
    misaligned.gradients.dq = shifted(misaligned.gradients.dq);
    let p = backward(&misaligned.check().expect("valid"));
    assert!(!p.has_wide_passes(), "{p}");
    let reason = p.element_wise_passes.clone().unwrap_or_default();
    assert!(
        reason.starts_with("dq's rows are not 16-byte aligned"),
        "{p}"
    );
    assert!(
        p.kernel_names()
            .starts_with("fa2_backward_preprocess_bf16+"),
        "{p}"
    );
    // The wide plan run again on those tensors is refused, naming dQ; on its own, it runs.
    let attention = Attention::new(call.forward.q, call.forward.k, call.forward.v);
    let mut workspace = Workspace::default();
    let result = plan.run_checked(
        None,
        &attention,
        Pass::Backward(misaligned.tensors()),
        &mut workspace,
    );
    assert_eq!(named(result), "dq");
    for (name, tensors) in [
        ("o", {
            let mut c = Backward::<bf16>::new();
            c.forward.o = shifted(c.forward.o);
            c.tensors()
        }),
        ("d_o", {
            let mut c = Backward::<bf16>::new();
            c.d_o = shifted(c.d_o);
            c.tensors()
        }),
    ] {
        let result = plan.run_checked(None, &attention, Pass::Backward(tensors), &mut workspace);
        assert_eq!(named(result), name);
    }
    let result = plan.run_checked(
        None,
        &attention,
        Pass::Backward(call.tensors()),
        &mut workspace,
    );
    assert!(result.is_ok(), "{result:?}");
}

/// The backward plan of `call`.
fn backward_plan<T: Element>(call: &Backward<T>) -> BackwardPlan {
    let plan = call.check().expect("valid");
    let PassPlan::Backward(backward) = plan.pass else {
        panic!("a backward plan")
    };
    backward
}

#[test]
fn a_window_or_softcap_backward_runs_the_local_kernels_and_f32_is_refused_by_name() {
    let local_main = |plan: &BackwardPlan| main_form(plan) == KernelForm::Local;
    let mut call = Backward::<bf16>::new();
    call.forward.options.window = Some((4, 0));
    let plan = backward_plan(&call);
    assert_eq!(plan.algorithm, BackwardAlgorithm::Fa3);
    assert!(local_main(&plan), "{plan}");
    let mut call = Backward::<bf16>::new();
    call.forward.options.softcap = 30.0;
    assert!(local_main(&backward_plan(&call)));
    // Without either, the dense kernels.
    assert!(!local_main(&backward_plan(&Backward::<bf16>::new())));
    // Deterministic mode with a window: fa2-tc's local kernel, and the plan says why.
    let mut call = Backward::<f16>::new();
    call.forward.options.window = Some((3, 2));
    call.forward.options.deterministic = true;
    let plan = backward_plan(&call);
    assert_eq!(plan.algorithm, BackwardAlgorithm::Fa2Tc);
    assert!(local_main(&plan));
    assert!(plan.fallback.as_deref().unwrap().contains("deterministic"));
    // The standard backward has no soft-cap slope: refused by name, as the scalar fa2 is.
    for algorithm in [Algorithm::Standard, Algorithm::Fa2] {
        let mut call = Backward::<bf16>::new();
        call.forward.options.softcap = 5.0;
        call.forward.options.backward_algorithm = algorithm;
        assert_eq!(named(call.check()), "softcap", "{algorithm}");
        call.forward.options.softcap = 0.0;
        call.forward.options.window = Some((2, 2));
        assert_eq!(named(call.check()), "window", "{algorithm}");
    }
    // f32 has no tensor-core kernel: refused, naming the window or the softcap.
    let mut call = Backward::<f32>::new();
    call.forward.options.window = Some((4, 0));
    assert_eq!(named(call.check()), "window");
    let mut call = Backward::<f32>::new();
    call.forward.options.softcap = 5.0;
    assert_eq!(named(call.check()), "softcap");
}

/// ALiBi slopes of `dims` at a fake aligned address (no kernel runs in these tests).
fn slopes(dims: &[usize]) -> AlibiSlopes {
    // SAFETY: only checked and planned, never read.
    unsafe { AlibiSlopes::new(BASE + (9 << 30), dims) }.expect("valid slopes")
}

#[test]
fn alibi_runs_the_local_kernels_forward_and_backward_and_is_checked_against_the_call() {
    // Forward: the `_local` FA3 kernel; the shape is checked against Q's heads and batch.
    let mut call = Forward::<bf16>::new([2, 8, 100, 64]);
    for dims in [&[8][..], &[2, 8]] {
        call.options.alibi = Some(slopes(dims));
        let plan = call.check().expect("valid");
        assert!(plan.kernel_names().contains("_local"), "{plan}");
    }
    for dims in [&[4][..], &[3, 8], &[8, 2]] {
        call.options.alibi = Some(slopes(dims));
        assert_eq!(named(call.check()), "alibi_slopes", "{dims:?}");
    }
    // The faithful kernels refuse it by name.
    call.options.alibi = Some(slopes(&[8]));
    for algorithm in [Algorithm::Fa2, Algorithm::Fa1] {
        call.options.algorithm = algorithm;
        assert_eq!(named(call.check()), "alibi_slopes", "{algorithm}");
    }
    // Backward: the local kernels of fa3 (and fa2-tc in deterministic mode); the standard
    // backward and f32 refuse it by name.
    let mut call = Backward::<bf16>::new();
    call.forward.options.alibi = Some(slopes(&[2, 3]));
    assert!(main_form(&backward_plan(&call)) == KernelForm::Local);
    call.forward.options.deterministic = true;
    let plan = backward_plan(&call);
    assert_eq!(plan.algorithm, BackwardAlgorithm::Fa2Tc);
    assert!(main_form(&plan) == KernelForm::Local);
    call.forward.options.deterministic = false;
    call.forward.options.backward_algorithm = Algorithm::Standard;
    assert_eq!(named(call.check()), "alibi_slopes");
    let mut call = Backward::<f32>::new();
    call.forward.options.alibi = Some(slopes(&[3]));
    assert_eq!(named(call.check()), "alibi_slopes");
    // A packed batch's slopes have a row per sequence (3 here), not per packed tensor.
    let (mut call, batch) = packed_call();
    call.options.alibi = Some(slopes(&[3, 4]));
    let packed = |call: &Forward<bf16>| {
        Attention::new(call.q, call.k, call.v)
            .options(call.options)
            .packed(&batch)
            .check_forward(ForwardTensors {
                o: call.o,
                stats: Statistics::LogSumExp(call.lse),
            })
    };
    let plan = packed(&call).expect("valid");
    assert!(plan.kernel_names().contains("_varlen_local"), "{plan}");
    assert!(packed_backward(&call, &batch).is_ok());
    call.options.alibi = Some(slopes(&[1, 4]));
    assert_eq!(named(packed(&call)), "alibi_slopes");
}

#[test]
fn dropout_runs_the_local_kernels_forward_and_backward_and_is_refused_elsewhere_by_name() {
    let dropout = Dropout::new(0.17, 0x5eed, 8).unwrap();
    let mut call = Forward::<bf16>::new([2, 8, 100, 64]);
    call.options.dropout = dropout;
    let plan = call.check().expect("valid");
    assert!(plan.kernel_names().contains("_local"), "{plan}");
    call.options.algorithm = Algorithm::Fa2Tc;
    let plan = call.check().expect("valid");
    assert!(plan.kernel_names().contains("_local"), "{plan}");
    // The faithful kernels and standard refuse it by name (standard takes windows, softcap and
    // ALiBi, not dropout).
    for algorithm in [Algorithm::Fa2, Algorithm::Fa1, Algorithm::Standard] {
        call.options.algorithm = algorithm;
        assert_eq!(named(call.check()), "dropout_p", "{algorithm}");
    }
    // f32 falls back to the scalar fa2, which refuses it.
    let mut call = Forward::<f32>::new([2, 8, 100, 64]);
    call.options.dropout = dropout;
    assert_eq!(named(call.check()), "dropout_p");
    // Backward: the local kernels; the standard backward refuses it.
    let mut call = Backward::<bf16>::new();
    call.forward.options.dropout = dropout;
    assert!(main_form(&backward_plan(&call)) == KernelForm::Local);
    call.forward.options.deterministic = true;
    assert!(main_form(&backward_plan(&call)) == KernelForm::Local);
    call.forward.options.deterministic = false;
    call.forward.options.backward_algorithm = Algorithm::Standard;
    assert_eq!(named(call.check()), "dropout_p");
    // Packed: the varlen local kernels, forward and backward.
    let (mut call, batch) = packed_call();
    call.options.dropout = dropout;
    let plan = Attention::new(call.q, call.k, call.v)
        .options(call.options)
        .packed(&batch)
        .check_forward(ForwardTensors {
            o: call.o,
            stats: Statistics::LogSumExp(call.lse),
        })
        .expect("valid");
    assert!(plan.kernel_names().contains("_varlen_local"), "{plan}");
    assert!(packed_backward(&call, &batch).is_ok());
    // A probability outside [0, 1) never reaches a call.
    assert!(Dropout::new(1.0, 0, 0).is_err());
}

/// The form of a backward plan's main kernel.
fn main_form(plan: &BackwardPlan) -> KernelForm {
    match plan.launches[1].kernel.family {
        Family::Fa3Backward { form, .. } | Family::Fa2TcBackward { form, .. } => form,
        other => panic!("{other:?}"),
    }
}

/// The backward of `packed_call`'s batch (dims: Q (1, 4, 16, 64), K, V (1, 2, 19, 64)).
fn packed_backward(call: &Forward<bf16>, batch: &PackedBatch) -> Result<Plan> {
    let gradients = Gradients {
        dq: bshd(6, call.q.dims()),
        dk: bshd(7, call.k.dims()),
        dv: bshd(8, call.k.dims()),
    };
    Attention::new(call.q, call.k, call.v)
        .options(call.options)
        .packed(batch)
        .check_backward(BackwardTensors {
            o: call.o,
            logsumexp: call.lse,
            d_o: bshd(5, call.q.dims()),
            gradients,
        })
}

#[test]
fn a_packed_backward_runs_the_varlen_kernels_over_the_whole_tensors() {
    let (call, batch) = packed_call();
    let plan = packed_backward(&call, &batch).expect("valid");
    assert_eq!(plan.statistics_dims(), [1, 4, 16], "{plan}");
    let PassPlan::Backward(backward) = &plan.pass else {
        panic!("a backward plan")
    };
    assert_eq!(backward.algorithm, BackwardAlgorithm::Fa3);
    assert_eq!(main_form(backward), KernelForm::Packed);
    // The main kernel's grid: the longest sequence's key blocks (11 keys), three sequences of
    // 4 heads; the passes walk all 16 rows of the 4 heads; the workspaces cover the tensors'
    // rows, and the grouped sum (2 K/V heads) all 19 keys.
    assert_eq!(backward.launches[1].launch.grid, (1, 12, 1));
    assert_eq!(backward.launches[0].launch.grid.1, 4);
    assert_eq!(backward.delta, 4 * 16);
    assert_eq!(backward.dq_accumulator, 4 * 16 * 64);
    assert_eq!(backward.expanded_kv_gradients, 4 * 19 * 64);
    // A window with a packed batch: both compiled in; deterministic: fa2-tc's, with the reason.
    let (mut windowed, _) = packed_call();
    windowed.options.window = Some((3, 0));
    let plan = backward_plan_of(packed_backward(&windowed, &batch));
    assert_eq!(main_form(&plan), KernelForm::PackedLocal);
    windowed.options.deterministic = true;
    let plan = backward_plan_of(packed_backward(&windowed, &batch));
    assert_eq!(plan.algorithm, BackwardAlgorithm::Fa2Tc);
    assert_eq!(main_form(&plan), KernelForm::PackedLocal);
    assert!(
        plan.fallback.as_deref().unwrap().contains("packed"),
        "{plan}"
    );
    // L must be the packed batch's (1, heads, total_q), as the forward writes it.
    let (mut bad, _) = packed_call();
    bad.lse = rows(4, [3, 4, 6]);
    assert_eq!(named(packed_backward(&bad, &batch)), "logsumexp");
    // The scalar and standard backwards take no packed batch: refused by name.
    for algorithm in [Algorithm::Standard, Algorithm::Fa2] {
        let (mut asked, _) = packed_call();
        asked.options.backward_algorithm = algorithm;
        assert_eq!(
            named(packed_backward(&asked, &batch)),
            "form",
            "{algorithm}"
        );
    }
}

/// The backward plan of a checked call.
fn backward_plan_of(plan: Result<Plan>) -> BackwardPlan {
    let PassPlan::Backward(backward) = plan.expect("valid").pass else {
        panic!("a backward plan")
    };
    backward
}

#[test]
fn the_backward_refuses_the_output_of_a_forward_of_another_problem() {
    // The forward's plan records its problem; a backward of another (here: causal) problem
    // is refused before anything runs, naming L.
    let dims = [1, 2, 64, 64];
    let strides = Layout::BatchHeadSeqDim.strides(dims);
    let q = TensorRef::<bf16>::layout_only(dims, strides);
    let forward = Attention::new(q, q, q).plan(&CompiledLimits::H200).unwrap();
    let causal = Attention::new(q, q, q).causal(true);
    let result = causal.plan_backward_with(&CompiledLimits::H200, None, forward.problem().copied());
    assert_eq!(named(result), "logsumexp");
    let same = Attention::new(q, q, q);
    assert!(
        same.plan_backward_with(&CompiledLimits::H200, None, forward.problem().copied())
            .is_ok()
    );
}

#[test]
fn a_packed_batch_names_a_misaligned_tensor_and_f32_as_its_dtype() {
    let (mut call, batch) = packed_call();
    // SAFETY: as `bshd`; V's rows one element past a 16-byte boundary.
    call.v = unsafe { TensorRef::from_raw(call.v.address() + 2, call.v.dims(), call.v.strides()) };
    assert_eq!(named(check_packed(&call, &batch)), "v");
    let f32_call = Forward::<f32>::new([1, 4, 16, 64]);
    let offsets = PackedBatch::new(&[0, 16], &[0, 16]).unwrap();
    let result = Attention::new(f32_call.q, f32_call.k, f32_call.v)
        .packed(&offsets)
        .plan(&CompiledLimits::H200);
    assert_eq!(named(result), "dtype");
}

#[test]
fn a_kv_cache_call_plans_from_host_lengths_and_runs_only_with_device_ones() {
    use crate::attention::{CacheSeqlens, KvCache};
    let lengths = CacheSeqlens::host(&[100, 4000]).unwrap();
    let q = bshd::<bf16>(0, [2, 8, 1, 128]);
    let (k, v) = (bshd(1, [2, 2, 4096, 128]), bshd(2, [2, 2, 4096, 128]));
    let cache = KvCache {
        seqlens: &lengths,
        block_table: None,
        append: None,
    };
    let call = Attention::new(q, k, v).causal(true).kv_cache(cache);
    let plan = call.plan(&CompiledLimits::H200).expect("plans");
    assert!(
        plan.kernel_names().contains("decode_splitkv_bf16_d128"),
        "{plan}"
    );
    assert_eq!(plan.statistics_dims(), [2, 8, 1]);
    let result = call.check_forward(ForwardTensors {
        o: bshd(3, [2, 8, 1, 128]),
        stats: Statistics::LogSumExp(rows(4, [2, 8, 1])),
    });
    assert_eq!(named(result), "cache_seqlens");
    // Only auto runs a KV cache, and a length past the cache is named.
    let fa3 = Attention::new(q, k, v)
        .kv_cache(cache)
        .algorithm(Algorithm::Fa3);
    assert_eq!(named(fa3.plan(&CompiledLimits::H200)), "algorithm");
    let long = CacheSeqlens::host(&[100, 5000]).unwrap();
    let past = Attention::new(q, k, v).kv_cache(KvCache {
        seqlens: &long,
        ..cache
    });
    assert_eq!(named(past.plan(&CompiledLimits::H200)), "cache_seqlens");
}
