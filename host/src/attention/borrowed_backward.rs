//! The backward pass on device memory another library owns (PyTorch's tensors, through the Python
//! bridge's `torch.autograd.Function`): Q, K, V, the forward's O and L, dO, and the gradients to
//! write, dQ, dK, dV, given as addresses, dims and strides.
//!
//! [`BorrowedBackwardArguments::check`] does every check that needs no device (the tensors as
//! [`borrowed`](super::borrowed) checks them, then the backward's own checks,
//! [`BackwardProblem`]), so a caller can reject bad input before it opens a GPU;
//! [`attention_backward_borrowed`] repeats it, plans against the device and launches on the
//! [`Gpu`]'s stream (the caller's, after [`Gpu::use_borrowed_stream`]).

use flash_kernels::common::params::Operands;

use super::backward::{BackwardArguments, BackwardProblem, Gradients, TensorSpec};
use super::backward_gpu::{BackwardCall, launch_backward};
use super::backward_plan::{BackwardOptions, BackwardPlan};
use super::borrowed::{BorrowedTensor, check_address, check_no_overlap, check_tensor, view};
use super::problem::AttentionOptions;
use crate::device::Gpu;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// L = m + log ℓ in f32 on borrowed memory, (batch, heads, seqlen_q): the address of L\[0, 0, 0\]
/// and its strides in elements. The kernels read it contiguous, row (batch·heads + head)·seqlen_q
/// + i, as every forward writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BorrowedRows {
    pub address: u64,
    pub dims: [usize; 3],
    pub strides: [usize; 3],
}

/// One backward call's operands: every tensor of `dtype` but L (f32). dQ has Q's dims, dK and dV
/// K's; each any strides with a contiguous head dim, the gradients without overlapping elements.
#[derive(Clone, Debug, PartialEq)]
pub struct BorrowedBackwardArguments {
    pub dtype: DType,
    pub q: BorrowedTensor,
    pub k: BorrowedTensor,
    pub v: BorrowedTensor,
    /// The forward's output for these Q, K, V and options.
    pub o: BorrowedTensor,
    /// The forward's L for these Q, K, V and options.
    pub logsumexp: BorrowedRows,
    /// The gradient of the loss with respect to O.
    pub d_o: BorrowedTensor,
    pub gradients: Gradients<BorrowedTensor>,
}

impl BorrowedBackwardArguments {
    /// Every check that needs no device; returns the checked problem. The errors name the
    /// argument (`q`, `k`, `v`, `o`, `d_o`, `logsumexp`, `dq`, `dk`, `dv`, or an option) and say
    /// what is allowed.
    pub fn check(&self, options: &AttentionOptions) -> Result<BackwardProblem> {
        let element_bytes = self.dtype.size_bytes() as u64;
        for (name, tensor) in self.tensors() {
            check_tensor(name, tensor, element_bytes)?;
        }
        check_rows("logsumexp", &self.logsumexp)?;
        let spec = |tensor: &BorrowedTensor| TensorSpec {
            dims: tensor.dims,
            // Within u64 by `check_tensor`; only the last (1) is read as a stride here.
            strides: tensor.strides.map(|s| s as isize),
            dtype: self.dtype,
        };
        let arguments = BackwardArguments {
            q: spec(&self.q),
            k: spec(&self.k),
            v: spec(&self.v),
            o: spec(&self.o),
            d_o: spec(&self.d_o),
            logsumexp: self.logsumexp.dims,
            // Borrowed O and L carry no plan: the caller vouches they are this problem's.
            forward: None,
        };
        let checked = BackwardProblem::new(&arguments, options)?;
        let Gradients { dq, dk, dv } = &self.gradients;
        checked.check_gradients(&Gradients {
            dq: spec(dq),
            dk: spec(dk),
            dv: spec(dv),
        })?;
        for (name, gradient) in [("dq", dq), ("dk", dk), ("dv", dv)] {
            check_no_overlap(name, gradient)?;
        }
        Ok(checked)
    }

    fn tensors(&self) -> [(&'static str, &BorrowedTensor); 8] {
        let Gradients { dq, dk, dv } = &self.gradients;
        [
            ("q", &self.q),
            ("k", &self.k),
            ("v", &self.v),
            ("o", &self.o),
            ("d_o", &self.d_o),
            ("dq", dq),
            ("dk", dk),
            ("dv", dv),
        ]
    }
}

/// L's address is f32-aligned, its strides contiguous (size-1 dims aside) and its last element's
/// address within 64 bits.
fn check_rows(name: &'static str, rows: &BorrowedRows) -> Result<()> {
    check_address(name, rows.address, std::mem::size_of::<f32>() as u64)?;
    let [b, h, n] = rows.dims;
    let contiguous = [h * n, n, 1];
    let is_contiguous = (0..3).all(|i| rows.dims[i] <= 1 || rows.strides[i] == contiguous[i]);
    if !is_contiguous {
        return Err(Error::invalid(
            name,
            format!("strides {:?} for dims {:?}", rows.strides, rows.dims),
            format!("a contiguous (batch, heads, seqlen_q) f32 tensor: strides {contiguous:?}"),
        ));
    }
    let fits = b
        .checked_mul(h)
        .and_then(|x| x.checked_mul(n))
        .and_then(|x| (x as u64).checked_mul(4))
        .and_then(|bytes| bytes.checked_add(rows.address));
    if fits.is_none() {
        return Err(Error::invalid(
            name,
            format!("dims {:?}", rows.dims),
            "every element's address must fit in 64 bits",
        ));
    }
    Ok(())
}

/// The FA2 backward on borrowed device memory, like
/// [`attention_backward_into`](super::attention_backward_into): checks every argument
/// ([`BorrowedBackwardArguments::check`]), then plans against the device and launches on `gpu`'s
/// stream, writing dQ, dK, dV. The workspace (D and the f32 dQ accumulator) is allocated by this
/// library on that stream and freed in stream order at the end of the call. Returns the plan.
///
/// # Safety
///
/// - Every address is device memory of `gpu`'s device in its context (for PyTorch: the device's
///   primary context, which [`Gpu::open`] uses too), holding every element its dims and strides
///   reach, of `args.dtype` (L: f32).
/// - O and L are the forward's outputs for these Q, K, V and `options` (other values give wrong
///   gradients, not memory errors).
/// - dQ, dK and dV may be written: they alias no other tensor of the call nor each other.
/// - The memory stays allocated, and is not used by other work, until the launched work on
///   `gpu`'s stream has finished (PyTorch's caching allocator guarantees this for tensors used on
///   the stream they were allocated on).
pub unsafe fn attention_backward_borrowed(
    gpu: &Gpu,
    args: &BorrowedBackwardArguments,
    options: &AttentionOptions,
    backward: &BackwardOptions,
) -> Result<BackwardPlan> {
    let checked = args.check(options)?;
    let Gradients { dq, dk, dv } = &args.gradients;
    let call = BackwardCall {
        operands: Operands {
            q: view(&args.q),
            k: view(&args.k),
            v: view(&args.v),
            o: view(&args.o),
        },
        d_o: view(&args.d_o),
        gradients: Gradients {
            dq: view(dq),
            dk: view(dk),
            dv: view(dv),
        },
        logsumexp: args.logsumexp.address,
    };
    launch_backward(gpu, &checked, call, backward)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const BASE: u64 = 0x7f00_0000_0000;

    /// (batch, seqlen, heads, head_dim) storage viewed as (batch, heads, seqlen, head_dim).
    fn bshd(slot: u64, [b, h, s, d]: [usize; 4]) -> BorrowedTensor {
        BorrowedTensor {
            address: BASE + slot * GIB,
            dims: [b, h, s, d],
            strides: [s * h * d, d, h * d, 1],
        }
    }

    /// Q (b, h, 5, d) against K, V (b, h, 7, d), every tensor in its own gibibyte.
    fn arguments(dtype: DType) -> BorrowedBackwardArguments {
        let (q_dims, kv_dims) = ([2, 3, 5, 40], [2, 3, 7, 40]);
        BorrowedBackwardArguments {
            dtype,
            q: bshd(0, q_dims),
            k: bshd(1, kv_dims),
            v: bshd(2, kv_dims),
            o: bshd(3, q_dims),
            logsumexp: BorrowedRows {
                address: BASE + 4 * GIB,
                dims: [2, 3, 5],
                strides: [15, 5, 1],
            },
            d_o: bshd(5, q_dims),
            gradients: Gradients {
                dq: bshd(6, q_dims),
                dk: bshd(7, kv_dims),
                dv: bshd(8, kv_dims),
            },
        }
    }

    fn rejected(args: &BorrowedBackwardArguments) -> &'static str {
        match args.check(&AttentionOptions::default()) {
            Err(Error::InvalidArgument { name, .. }) => name,
            other => panic!("expected an invalid argument, got {other:?}"),
        }
    }

    #[test]
    fn accepts_a_valid_call_with_seqlen_q_and_k_apart() {
        let checked = arguments(DType::Bf16)
            .check(&AttentionOptions {
                causal: true,
                ..Default::default()
            })
            .expect("valid");
        assert_eq!((checked.problem.seqlen_q, checked.problem.seqlen_k), (5, 7));
        assert_eq!(checked.dtype, DType::Bf16);
        assert!(checked.problem.causal);
    }

    #[test]
    fn names_each_tensor_that_is_wrong() {
        let good = arguments(DType::F16);
        let mut args = good.clone();
        args.d_o.strides[3] = 2;
        assert_eq!(rejected(&args), "d_o");
        let mut args = good.clone();
        args.o.dims[2] = 4;
        assert_eq!(rejected(&args), "o");
        let mut args = good.clone();
        args.d_o.dims[2] = 4;
        assert_eq!(rejected(&args), "d_o");
        let mut args = good.clone();
        args.gradients.dq.address += 1; // not a whole f16
        assert_eq!(rejected(&args), "dq");
        let mut args = good.clone();
        args.gradients.dk.dims[2] = 5; // Q's seqlen, not K's
        assert_eq!(rejected(&args), "dk");
        let mut args = good.clone();
        args.gradients.dv.address = 0;
        assert_eq!(rejected(&args), "dv");
    }

    #[test]
    fn gradients_must_not_overlap_but_inputs_may_broadcast() {
        let mut args = arguments(DType::F32);
        args.gradients.dk.strides[0] = 0;
        assert_eq!(rejected(&args), "dk");
        let mut args = arguments(DType::F32);
        args.d_o.strides = [0, 0, 0, 1]; // dO of `o.sum(-1)`-like losses: one row broadcast
        assert!(args.check(&AttentionOptions::default()).is_ok());
    }

    #[test]
    fn logsumexp_must_be_contiguous_and_of_q_rows() {
        let mut args = arguments(DType::Bf16);
        args.logsumexp.strides = [5, 10, 1]; // (batch, heads) transposed
        assert_eq!(rejected(&args), "logsumexp");
        let mut args = arguments(DType::Bf16);
        args.logsumexp.dims = [2, 3, 7];
        args.logsumexp.strides = [21, 7, 1];
        assert_eq!(rejected(&args), "logsumexp");
        let mut args = arguments(DType::Bf16);
        args.logsumexp.address += 2;
        assert_eq!(rejected(&args), "logsumexp");
        // A size-1 dim's stride is not read.
        let mut args = arguments(DType::Bf16);
        for t in [
            &mut args.q,
            &mut args.o,
            &mut args.d_o,
            &mut args.gradients.dq,
        ] {
            t.dims[0] = 1;
        }
        for t in [&mut args.k, &mut args.v, &mut args.gradients.dk] {
            t.dims[0] = 1;
        }
        args.gradients.dv.dims[0] = 1;
        args.logsumexp.dims = [1, 3, 5];
        args.logsumexp.strides = [999, 5, 1];
        assert!(args.check(&AttentionOptions::default()).is_ok());
    }

    #[test]
    fn options_are_checked_as_the_forward_checks_them() {
        let options = AttentionOptions {
            softmax_scale: Some(-1.0),
            ..Default::default()
        };
        assert!(matches!(
            arguments(DType::F16).check(&options),
            Err(Error::InvalidArgument {
                name: "softmax_scale",
                ..
            })
        ));
    }
}
