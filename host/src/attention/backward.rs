//! The backward pass's arguments, checked: dQ, dK, dV from Q, K, V, the forward's O and L, and dO.
//!
//! - [`TensorSpec`]: what the checks need of a tensor (dims, strides, dtype), from a host array or
//!   a [`DeviceTensor`] alike;
//! - [`BackwardProblem`]: the forward's [`Problem`] plus the checks of O, dO and L, each failure an
//!   [`Error::InvalidArgument`] naming the argument and what is allowed;
//! - [`Gradients`]: dQ, dK, dV, on the host or on the device.
//!
//! A backward call ([`Attention::backward_into`](crate::attention::Attention::backward_into))
//! builds the [`TensorSpec`]s from its tensors, takes the forward's problem from the forward's
//! plan where it has one ([`Attention::backward`](crate::attention::Attention::backward)), and
//! checks its gradient tensors with [`BackwardProblem::check_gradients`].

use ndarray::ArrayView4;

use crate::attention::{AttentionOptions, Problem};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::tensor::DeviceTensor;

/// dQ, dK, dV: each the shape of the input it is the gradient of.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gradients<X> {
    pub dq: X,
    pub dk: X,
    pub dv: X,
}

/// What the argument checks need to know about one (batch, heads, seqlen, head_dim) tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub dims: [usize; 4],
    /// In elements; a host array's may be negative.
    pub strides: [isize; 4],
    pub dtype: DType,
}

impl TensorSpec {
    /// The spec of a host array.
    pub fn of_array<T: Element>(array: &ArrayView4<T>) -> Self {
        let (b, h, n, d) = array.dim();
        let s = array.strides();
        Self {
            dims: [b, h, n, d],
            strides: [s[0], s[1], s[2], s[3]],
            dtype: T::DTYPE,
        }
    }

    /// The spec of a device tensor.
    pub fn of_device<T: Element>(tensor: &DeviceTensor<T>) -> Self {
        Self {
            dims: tensor.dims(),
            strides: tensor.strides().map(|s| s as isize),
            dtype: T::DTYPE,
        }
    }

    /// Whether head_dim is contiguous, as every kernel reads it (a head dim of 1 always is).
    fn last_dim_is_contiguous(&self) -> bool {
        self.strides[3] == 1 || self.dims[3] == 1
    }
}

/// Every argument of a backward call, described for the checks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackwardArguments {
    pub q: TensorSpec,
    pub k: TensorSpec,
    pub v: TensorSpec,
    /// The forward's output O.
    pub o: TensorSpec,
    /// The gradient of the loss with respect to O.
    pub d_o: TensorSpec,
    /// The dims of the forward's L = m + log ℓ (f32).
    pub logsumexp: [usize; 3],
    /// The problem the forward that wrote O and L solved, where known (a forward plan records
    /// it): the backward must be asked for the same shapes, mask and scale.
    pub forward: Option<Problem>,
}

/// A checked backward problem: the forward's problem and the dtype of every tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackwardProblem {
    pub problem: Problem,
    pub dtype: DType,
}

impl BackwardProblem {
    /// Checks Q, K, V and the options as the forward does ([`Problem::new`]: K and V may have
    /// fewer heads than Q, a divisor of Q's, whose dK and dV sum over each group), then that every
    /// tensor has Q's dtype and a contiguous head dim, that O and dO have Q's shape, that L is
    /// (batch, heads, seqlen_q), and that the forward's problem, if known, is this one.
    pub fn new(arguments: &BackwardArguments, options: &AttentionOptions) -> Result<Self> {
        let BackwardArguments {
            q, k, v, o, d_o, ..
        } = *arguments;
        let problem = Problem::new(q.dims, k.dims, v.dims, options)?;
        let tensors = [("q", q), ("k", k), ("v", v), ("o", o), ("d_o", d_o)];
        for (name, tensor) in tensors {
            check_tensor(name, &tensor, q.dtype)?;
        }
        check_dims("o", o.dims, "q", q.dims)?;
        check_dims("d_o", d_o.dims, "o", o.dims)?;
        let rows = [problem.batch, problem.heads, problem.seqlen_q];
        if arguments.logsumexp != rows {
            return Err(Error::invalid(
                "logsumexp",
                format!("shape {:?}", arguments.logsumexp),
                format!("must be (batch, heads, seqlen_q) = {rows:?}, the forward's L for q"),
            ));
        }
        if let Some(forward) = arguments.forward
            && forward != problem
        {
            return Err(Error::invalid(
                "logsumexp",
                format!("the statistics of another problem ({forward:?})"),
                format!("the forward's statistics for this problem ({problem:?})"),
            ));
        }
        Ok(Self {
            problem,
            dtype: q.dtype,
        })
    }

    /// Checks gradient tensors to be written: each in the problem's dtype with a contiguous head
    /// dim, dQ of Q's shape, dK and dV of K's.
    pub fn check_gradients(&self, gradients: &Gradients<TensorSpec>) -> Result<()> {
        let p = &self.problem;
        let q_dims = [p.batch, p.heads, p.seqlen_q, p.head_dim];
        let kv_dims = p.kv_dims();
        let expected = [
            ("dq", gradients.dq, "q", q_dims),
            ("dk", gradients.dk, "k", kv_dims),
            ("dv", gradients.dv, "v", kv_dims),
        ];
        for (name, tensor, input, dims) in expected {
            check_tensor(name, &tensor, self.dtype)?;
            check_dims(name, tensor.dims, input, dims)?;
        }
        Ok(())
    }
}

/// `tensor` has element type `dtype` and a contiguous head dim.
fn check_tensor(name: &'static str, tensor: &TensorSpec, dtype: DType) -> Result<()> {
    if tensor.dtype != dtype {
        return Err(Error::invalid(
            name,
            format!("dtype {}", tensor.dtype),
            format!("must be q's dtype ({dtype}): every tensor of a call shares one"),
        ));
    }
    if !tensor.last_dim_is_contiguous() {
        return Err(Error::invalid(
            name,
            format!("strides {:?}", tensor.strides),
            "the last dimension (head_dim) must be contiguous: stride 1",
        ));
    }
    Ok(())
}

/// `dims` (of `name`) equal `other`'s.
fn check_dims(
    name: &'static str,
    dims: [usize; 4],
    other_name: &str,
    other: [usize; 4],
) -> Result<()> {
    if dims == other {
        return Ok(());
    }
    Err(Error::invalid(
        name,
        format!("shape {dims:?}"),
        format!("must equal {other_name}'s shape {other:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: [usize; 4] = [2, 3, 5, 8];
    const KV: [usize; 4] = [2, 3, 7, 8];

    fn contiguous(dims: [usize; 4], dtype: DType) -> TensorSpec {
        let [_, h, n, d] = dims;
        TensorSpec {
            dims,
            strides: [(h * n * d) as isize, (n * d) as isize, d as isize, 1],
            dtype,
        }
    }

    fn valid() -> BackwardArguments {
        BackwardArguments {
            q: contiguous(Q, DType::Bf16),
            k: contiguous(KV, DType::Bf16),
            v: contiguous(KV, DType::Bf16),
            o: contiguous(Q, DType::Bf16),
            d_o: contiguous(Q, DType::Bf16),
            logsumexp: [2, 3, 5],
            forward: None,
        }
    }

    /// The argument an error names, and its whole message.
    fn rejected(arguments: BackwardArguments) -> (&'static str, String) {
        match BackwardProblem::new(&arguments, &AttentionOptions::default()) {
            Err(e @ Error::InvalidArgument { name, .. }) => (name, e.to_string()),
            other => panic!("expected an invalid argument, got {other:?}"),
        }
    }

    fn assert_rejected(arguments: BackwardArguments, name: &str, says: &[&str]) {
        let (rejected_name, message) = rejected(arguments);
        assert_eq!(rejected_name, name, "{message}");
        for part in says {
            assert!(message.contains(part), "{message} lacks {part:?}");
        }
    }

    #[test]
    fn valid_arguments_give_the_forwards_problem() {
        let checked = BackwardProblem::new(&valid(), &AttentionOptions::default()).unwrap();
        assert_eq!(checked.dtype, DType::Bf16);
        assert_eq!(
            checked.problem,
            Problem::new(Q, KV, KV, &AttentionOptions::default()).unwrap()
        );
    }

    #[test]
    fn grouped_kv_heads_are_accepted_and_their_gradients_have_k_s_heads() {
        // 6 query heads on 3 K/V heads, and MQA.
        for heads_kv in [3, 1] {
            let kv = [2, heads_kv, 7, 8];
            let mut a = valid();
            a.q = contiguous([2, 6, 5, 8], DType::Bf16);
            (a.o, a.d_o) = (a.q, a.q);
            (a.k, a.v) = (contiguous(kv, DType::Bf16), contiguous(kv, DType::Bf16));
            a.logsumexp = [2, 6, 5];
            let checked = BackwardProblem::new(&a, &AttentionOptions::default()).unwrap();
            assert_eq!(checked.problem.kv_group(), 6 / heads_kv);
            let mut gradients = Gradients {
                dq: a.q,
                dk: a.k,
                dv: a.v,
            };
            assert!(checked.check_gradients(&gradients).is_ok());
            // dK with one head per query head is refused: dK is K's shape.
            gradients.dk = a.q;
            assert!(matches!(
                checked.check_gradients(&gradients),
                Err(Error::InvalidArgument { name: "dk", .. })
            ));
        }
    }

    #[test]
    fn the_forwards_checks_come_first() {
        let mut a = valid();
        a.v.dims[2] = 6;
        assert_rejected(a, "v", &["seqlen must equal k's"]);
        let mut a = valid();
        (a.q.dims[3], a.k.dims[3], a.v.dims[3]) = (300, 300, 300);
        assert_rejected(a, "head_dim", &["1 to 256"]);
    }

    #[test]
    fn a_d_o_whose_shape_differs_from_o_is_named() {
        let mut a = valid();
        a.d_o = contiguous([2, 3, 6, 8], DType::Bf16);
        assert_rejected(a, "d_o", &["[2, 3, 6, 8]", "o's shape [2, 3, 5, 8]"]);
        let mut a = valid();
        a.o = contiguous([2, 3, 5, 4], DType::Bf16);
        assert_rejected(a, "o", &["q's shape [2, 3, 5, 8]"]);
    }

    #[test]
    fn a_dtype_other_than_qs_is_named() {
        let mut a = valid();
        a.d_o.dtype = DType::F16;
        assert_rejected(a, "d_o", &["dtype f16", "q's dtype (bf16)"]);
        let mut a = valid();
        a.k.dtype = DType::F32;
        assert_rejected(a, "k", &["dtype f32"]);
    }

    #[test]
    fn statistics_of_another_shape_or_problem_are_named() {
        let mut a = valid();
        a.logsumexp = [2, 3, 7];
        assert_rejected(
            a,
            "logsumexp",
            &["[2, 3, 7]", "(batch, heads, seqlen_q) = [2, 3, 5]"],
        );
        // The right shape, but from a causal forward, or one with another scale.
        let causal = AttentionOptions {
            causal: true,
            ..Default::default()
        };
        let scaled = AttentionOptions {
            softmax_scale: Some(0.5),
            ..Default::default()
        };
        for options in [causal, scaled] {
            let mut a = valid();
            a.forward = Some(Problem::new(Q, KV, KV, &options).unwrap());
            assert_rejected(a, "logsumexp", &["another problem", "causal"]);
        }
        let mut a = valid();
        a.forward = Some(Problem::new(Q, KV, KV, &AttentionOptions::default()).unwrap());
        assert!(BackwardProblem::new(&a, &AttentionOptions::default()).is_ok());
    }

    #[test]
    fn a_strided_head_dim_is_named() {
        let mut a = valid();
        a.d_o.strides[3] = 2;
        assert_rejected(a, "d_o", &["strides", "stride 1"]);
        // A head dim of 1 is contiguous whatever its stride.
        let mut a = valid();
        for t in [&mut a.q, &mut a.k, &mut a.v, &mut a.o, &mut a.d_o] {
            t.dims[3] = 1;
            t.strides[3] = 5;
        }
        assert!(BackwardProblem::new(&a, &AttentionOptions::default()).is_ok());
    }

    #[test]
    fn gradients_are_checked_against_the_inputs() {
        let checked = BackwardProblem::new(&valid(), &AttentionOptions::default()).unwrap();
        let good = Gradients {
            dq: contiguous(Q, DType::Bf16),
            dk: contiguous(KV, DType::Bf16),
            dv: contiguous(KV, DType::Bf16),
        };
        assert!(checked.check_gradients(&good).is_ok());
        let name = |gradients: Gradients<TensorSpec>| match checked.check_gradients(&gradients) {
            Err(Error::InvalidArgument { name, .. }) => name,
            other => panic!("expected an invalid argument, got {other:?}"),
        };
        let mut bad = good;
        bad.dq.dims = KV;
        assert_eq!(name(bad), "dq");
        let mut bad = good;
        bad.dv.dtype = DType::F32;
        assert_eq!(name(bad), "dv");
        let mut bad = good;
        bad.dk.strides[3] = 3;
        assert_eq!(name(bad), "dk");
    }
}
