//! Attention on device memory another library owns (PyTorch's tensors, through the Python
//! bridge): Q, K, V, O and the row statistics given as addresses, dims and strides.
//!
//! [`BorrowedArguments::check`] does every check that needs no device (shapes, strides,
//! alignment, the statistics the algorithm writes, the options), so a caller can reject bad input
//! before it opens a GPU; [`attention_borrowed`] repeats it, plans against the device and launches
//! on the [`Gpu`]'s stream (see [`Gpu::use_borrowed_stream`] to launch on the caller's stream).

use flash_kernels::common::params::{Operands, TensorView};

use super::{
    Algorithm, AttentionOptions, Plan, Problem, StatisticsKind, Workspace, launch_checked,
};
use crate::device::Gpu;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::with_element;

/// A (batch, heads, seqlen, head_dim) tensor in device memory the caller owns: the address of
/// element (0, 0, 0, 0) and the strides in elements. Both FlashAttention's layout
/// (batch, seqlen, heads, head_dim) and SDPA's are such views; the last stride must be 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BorrowedTensor {
    pub address: u64,
    pub dims: [usize; 4],
    pub strides: [usize; 4],
}

/// Where the row statistics go: f32 vectors of batch·heads·seqlen_q elements, row
/// (batch·heads + head)·seqlen_q + i for query i, i.e. a contiguous (batch, heads, seqlen_q).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatisticsAddresses {
    /// L = m + log ℓ (every algorithm but FA1).
    LogSumExp(u64),
    /// FA1's m and ℓ.
    MaxAndSum { max: u64, sum: u64 },
}

/// One call's operands: Q, K, V, the output O (Q's dims, any non-overlapping strides) and the
/// statistics, all of element type `dtype` but the f32 statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BorrowedArguments {
    pub dtype: DType,
    pub q: BorrowedTensor,
    pub k: BorrowedTensor,
    pub v: BorrowedTensor,
    pub o: BorrowedTensor,
    pub stats: StatisticsAddresses,
}

impl BorrowedArguments {
    /// Every check that needs no device; returns the problem. The errors name the argument
    /// (`q`, `k`, `v`, `o`, `lse`, `m`, `l`, or an option) and say what is allowed.
    pub fn check(&self, algorithm: Algorithm, options: &AttentionOptions) -> Result<Problem> {
        self.check_tensors()?;
        let problem = Problem::new(self.q.dims, self.k.dims, self.v.dims, options)?;
        self.check_output()?;
        let addresses = match (StatisticsKind::of(algorithm), self.stats) {
            (StatisticsKind::LogSumExp, StatisticsAddresses::LogSumExp(l)) => vec![("lse", l)],
            (StatisticsKind::MaxAndSum, StatisticsAddresses::MaxAndSum { max, sum }) => {
                vec![("m", max), ("l", sum)]
            }
            (kind, _) => {
                return Err(Error::invalid(
                    "stats",
                    format!("{:?}", self.stats),
                    format!("{algorithm} writes {kind:?} statistics"),
                ));
            }
        };
        for (name, address) in addresses {
            check_address(name, address, std::mem::size_of::<f32>() as u64)?;
        }
        Ok(problem)
    }

    /// Each of Q, K, V, O: non-null, aligned, a contiguous head dim, every address in 64 bits.
    pub(super) fn check_tensors(&self) -> Result<()> {
        let element_bytes = self.dtype.size_bytes() as u64;
        for (name, tensor) in self.tensors() {
            check_tensor(name, tensor, element_bytes)?;
        }
        Ok(())
    }

    /// O: Q's dims, and no two elements at one address.
    pub(super) fn check_output(&self) -> Result<()> {
        if self.o.dims != self.q.dims {
            return Err(Error::invalid(
                "o",
                format!("shape {:?}", self.o.dims),
                format!("must equal q's shape {:?}", self.q.dims),
            ));
        }
        check_no_overlap("o", &self.o)
    }

    fn tensors(&self) -> [(&'static str, &BorrowedTensor); 4] {
        [
            ("q", &self.q),
            ("k", &self.k),
            ("v", &self.v),
            ("o", &self.o),
        ]
    }
}

pub(super) fn check_address(name: &'static str, address: u64, align: u64) -> Result<()> {
    if address == 0 || !address.is_multiple_of(align) {
        return Err(Error::invalid(
            name,
            format!("address {address:#x}"),
            format!("a device address, non-null and a multiple of {align} bytes"),
        ));
    }
    Ok(())
}

/// Non-null, element-aligned, last stride 1, and every element's byte offset within a u64.
pub(super) fn check_tensor(
    name: &'static str,
    tensor: &BorrowedTensor,
    element_bytes: u64,
) -> Result<()> {
    check_address(name, tensor.address, element_bytes)?;
    if tensor.strides[3] != 1 {
        return Err(Error::invalid(
            name,
            format!("strides {:?}", tensor.strides),
            "the last dimension (head_dim) must be contiguous: stride 1",
        ));
    }
    let last = tensor
        .dims
        .iter()
        .zip(tensor.strides)
        .try_fold(0u64, |acc, (&n, s)| {
            (n.saturating_sub(1) as u64)
                .checked_mul(s as u64)
                .and_then(|x| x.checked_add(acc))
        })
        .and_then(|last| last.checked_mul(element_bytes))
        .and_then(|bytes| bytes.checked_add(tensor.address));
    if last.is_none() {
        return Err(Error::invalid(
            name,
            format!("strides {:?} for dims {:?}", tensor.strides, tensor.dims),
            "every element's address must fit in 64 bits",
        ));
    }
    Ok(())
}

/// O is written once per element: no two of its elements may share an address (a stride-0 or
/// overlapping view would make the kernels race).
pub(super) fn check_no_overlap(name: &'static str, tensor: &BorrowedTensor) -> Result<()> {
    let mut axes: Vec<(usize, usize)> = tensor
        .strides
        .into_iter()
        .zip(tensor.dims)
        .filter(|&(_, n)| n > 1)
        .collect();
    axes.sort_unstable();
    // Sorted by stride, each axis must step past everything the smaller ones span.
    let mut span = 1usize;
    for (stride, n) in axes {
        if stride < span {
            return Err(Error::invalid(
                name,
                format!("strides {:?} for dims {:?}", tensor.strides, tensor.dims),
                "an output whose elements do not overlap (no stride 0, no aliasing axes)",
            ));
        }
        span = stride.saturating_mul(n);
    }
    Ok(())
}

pub(super) fn view(tensor: &BorrowedTensor) -> TensorView {
    TensorView {
        addr: tensor.address,
        batch_stride: tensor.strides[0] as u64,
        head_stride: tensor.strides[1] as u64,
        row_stride: tensor.strides[2] as u64,
    }
}

/// Runs `algorithm` on borrowed device memory, like [`super::attention_into`]: checks every
/// argument ([`BorrowedArguments::check`]), then plans against the device and launches on
/// `gpu`'s stream. The workspace (standard attention's S and P, FA1's accumulator) is allocated
/// by this library on that stream and freed in stream order at the end of the call. Returns the
/// plan: which kernels ran and, for a fallback, why.
///
/// # Safety
///
/// - Every address is device memory of `gpu`'s device in its context (for PyTorch: the device's
///   primary context, which [`Gpu::open`] uses too), holding every element its dims and strides
///   reach, of `args.dtype` (the statistics: f32, batch·heads·seqlen_q elements each).
/// - O and the statistics may be written: they alias neither Q, K, V nor each other.
/// - The memory stays allocated, and is not used by other work, until the launched work on
///   `gpu`'s stream has finished (PyTorch's caching allocator guarantees this for tensors used on
///   the stream they were allocated on).
pub unsafe fn attention_borrowed(
    gpu: &Gpu,
    algorithm: Algorithm,
    args: &BorrowedArguments,
    options: &AttentionOptions,
) -> Result<Plan> {
    let problem = args.check(algorithm, options)?;
    let operands = Operands {
        q: view(&args.q),
        k: view(&args.k),
        v: view(&args.v),
        o: view(&args.o),
    };
    let dims = [args.q.dims, args.k.dims, args.v.dims];
    with_element!(args.dtype, T => {
        let workspace = Workspace::<T>::new(gpu, algorithm, &problem)?;
        launch_checked(gpu, algorithm, &problem, operands, dims, args.stats, &workspace, options)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x7f00_0000_0000;

    /// (batch, seqlen, heads, head_dim) storage viewed as (batch, heads, seqlen, head_dim).
    fn bshd(address: u64, [b, h, s, d]: [usize; 4]) -> BorrowedTensor {
        BorrowedTensor {
            address,
            dims: [b, h, s, d],
            strides: [s * h * d, d, h * d, 1],
        }
    }

    fn arguments(dims: [usize; 4]) -> BorrowedArguments {
        BorrowedArguments {
            dtype: DType::Bf16,
            q: bshd(BASE, dims),
            k: bshd(BASE + (1 << 30), dims),
            v: bshd(BASE + (2 << 30), dims),
            o: bshd(BASE + (3 << 30), dims),
            stats: StatisticsAddresses::LogSumExp(BASE + (4 << 30)),
        }
    }

    fn rejected(args: &BorrowedArguments, algorithm: Algorithm) -> &'static str {
        match args.check(algorithm, &AttentionOptions::default()) {
            Err(Error::InvalidArgument { name, .. }) => name,
            other => panic!("expected an invalid argument, got {other:?}"),
        }
    }

    #[test]
    fn accepts_flash_attention_and_sdpa_layouts() {
        let args = arguments([2, 8, 100, 64]);
        let problem = args.check(Algorithm::Fa3, &AttentionOptions::default());
        assert_eq!(problem.map(|p| p.seqlen_q).ok(), Some(100));
        let mut sdpa = args;
        for t in [&mut sdpa.q, &mut sdpa.k, &mut sdpa.v, &mut sdpa.o] {
            t.strides = [8 * 100 * 64, 100 * 64, 64, 1];
        }
        assert!(
            sdpa.check(Algorithm::Fa2, &AttentionOptions::default())
                .is_ok()
        );
    }

    #[test]
    fn names_the_tensor_that_is_wrong() {
        let good = arguments([1, 2, 16, 32]);
        let mut args = good;
        args.k.strides[3] = 2;
        assert_eq!(rejected(&args, Algorithm::Fa2), "k");
        let mut args = good;
        args.v.address = 0;
        assert_eq!(rejected(&args, Algorithm::Fa2), "v");
        let mut args = good;
        args.q.address += 1; // not a whole bf16
        assert_eq!(rejected(&args, Algorithm::Fa2), "q");
        let mut args = good;
        args.o.dims = [1, 2, 15, 32];
        assert_eq!(rejected(&args, Algorithm::Fa2), "o");
        let mut args = good;
        args.k.dims = [1, 3, 16, 32];
        args.k.strides = [16 * 3 * 32, 32, 3 * 32, 1];
        assert_eq!(rejected(&args, Algorithm::Fa2), "k");
        let mut args = good;
        args.stats = StatisticsAddresses::LogSumExp(BASE + 2);
        assert_eq!(rejected(&args, Algorithm::Fa2), "lse");
    }

    #[test]
    fn rejects_an_overlapping_output() {
        let mut args = arguments([2, 2, 16, 32]);
        args.o.strides[0] = 0; // every batch writes the same memory
        assert_eq!(rejected(&args, Algorithm::Fa2), "o");
        // Q may be broadcast: only O is written.
        let mut args = arguments([2, 2, 16, 32]);
        args.q.strides[0] = 0;
        assert!(
            args.check(Algorithm::Fa2, &AttentionOptions::default())
                .is_ok()
        );
    }

    #[test]
    fn statistics_must_be_the_algorithms() {
        let args = arguments([1, 1, 8, 16]);
        assert_eq!(rejected(&args, Algorithm::Fa1), "stats");
        let mut fa1 = args;
        fa1.stats = StatisticsAddresses::MaxAndSum {
            max: BASE + (4 << 30),
            sum: 0,
        };
        assert_eq!(rejected(&fa1, Algorithm::Fa1), "l");
        assert_eq!(rejected(&fa1, Algorithm::Fa2), "stats");
    }

    #[test]
    fn options_and_problem_checks_are_the_host_apis() {
        let args = arguments([1, 1, 8, 300]);
        assert_eq!(rejected(&args, Algorithm::Fa2), "head_dim");
        let args = arguments([1, 1, 8, 64]);
        let options = AttentionOptions {
            softmax_scale: Some(f32::NAN),
            ..Default::default()
        };
        assert!(matches!(
            args.check(Algorithm::Fa2, &options),
            Err(Error::InvalidArgument {
                name: "softmax_scale",
                ..
            })
        ));
    }

    #[test]
    fn addresses_past_64_bits_are_rejected() {
        let mut args = arguments([2, 1, 8, 16]);
        args.v.strides[0] = usize::MAX / 2;
        assert_eq!(rejected(&args, Algorithm::Fa2), "v");
    }
}
