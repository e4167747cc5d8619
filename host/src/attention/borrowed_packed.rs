//! A packed batch (flash-attn's `flash_attn_varlen_func`) on device memory another library owns
//! (PyTorch's tensors, through the Python bridge): Q, K, V and O as borrowed (1, heads, total,
//! d) views and L at an address, with the sequences' offsets in a [`PackedBatch`].
//!
//! [`BorrowedArguments::check_packed`] does every check that needs no device, so a caller can
//! reject bad input before it opens a GPU; [`attention_packed_borrowed`] repeats it, plans
//! against the device and launches on the [`Gpu`]'s stream, exactly as
//! [`super::attention_packed_into`] does on the library's own buffers (one body,
//! `packed::launch_packed`).

use flash_kernels::common::params::Operands;

use super::borrowed::{BorrowedArguments, StatisticsAddresses, check_address, view};
use super::packed::{PackedBatch, launch_packed};
use super::plan::Plan;
use super::problem::{Algorithm, AttentionOptions, Problem};
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::with_element;

impl BorrowedArguments {
    /// Every check of a packed call that needs no device; returns the problem. Q is
    /// (1, heads, total_q, d), K and V (1, heads_kv, total_k, d), each any strides with a
    /// contiguous head dim; O has Q's dims and no overlapping elements; `stats` is
    /// [`StatisticsAddresses::LogSumExp`], L as (heads, total_q) f32. The errors name the
    /// argument (`q`, `k`, `v`, `o`, `lse`, `stats`, `cu_seqlens_q`, `cu_seqlens_k`, or an
    /// option) and say what is allowed.
    pub fn check_packed(&self, batch: &PackedBatch, options: &AttentionOptions) -> Result<Problem> {
        self.check_tensors()?;
        // Shapes, heads, head dim, the options, and each list's last offset against the rows.
        let problem = batch.problem([self.q.dims, self.k.dims, self.v.dims], options)?;
        self.check_output()?;
        self.packed_logsumexp()?;
        Ok(problem)
    }

    /// L's address: a packed batch writes L = m + log ℓ, (heads, total_q).
    fn packed_logsumexp(&self) -> Result<u64> {
        let StatisticsAddresses::LogSumExp(address) = self.stats else {
            return Err(Error::invalid(
                "stats",
                format!("{:?}", self.stats),
                "a packed batch writes L = m + log ℓ: StatisticsAddresses::LogSumExp",
            ));
        };
        check_address("lse", address, std::mem::size_of::<f32>() as u64)?;
        Ok(address)
    }
}

/// Attention over a packed batch on borrowed device memory, like
/// [`super::attention_packed_into`]: checks every argument
/// ([`BorrowedArguments::check_packed`]), then plans against the device (FA3, falling back to
/// FA2-TC where it cannot run, or FA2-TC; the plan refuses the other algorithms) and launches on
/// `gpu`'s stream. Returns the plan.
///
/// # Safety
///
/// As [`super::attention_borrowed`]: every address is device memory of `gpu`'s device in its
/// context holding every element its dims and strides reach (L: heads·total_q f32); O and L alias
/// neither Q, K, V nor each other; the memory stays allocated, and unused by other work, until
/// the launched work on `gpu`'s stream has finished.
pub unsafe fn attention_packed_borrowed(
    gpu: &Gpu,
    algorithm: Algorithm,
    args: &BorrowedArguments,
    batch: &PackedBatch,
    options: &AttentionOptions,
) -> Result<Plan> {
    let problem = args.check_packed(batch, options)?;
    let logsumexp = args.packed_logsumexp()?;
    let operands = Operands {
        q: view(&args.q),
        k: view(&args.k),
        v: view(&args.v),
        o: view(&args.o),
    };
    let dims = [args.q.dims, args.k.dims, args.v.dims];
    with_element!(args.dtype, T => {
        launch_packed::<T>(gpu, algorithm, &problem, operands, dims, logsumexp, batch, options)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::borrowed::BorrowedTensor;
    use crate::dtype::DType;

    const BASE: u64 = 0x7f00_0000_0000;

    /// Packed (total, heads, d) storage viewed as (1, heads, total, d).
    fn packed(address: u64, [total, heads, d]: [usize; 3]) -> BorrowedTensor {
        BorrowedTensor {
            address,
            dims: [1, heads, total, d],
            strides: [total * heads * d, d, heads * d, 1],
        }
    }

    fn arguments() -> (BorrowedArguments, PackedBatch) {
        let args = BorrowedArguments {
            dtype: DType::Bf16,
            q: packed(BASE, [16, 4, 64]),
            k: packed(BASE + (1 << 30), [19, 2, 64]),
            v: packed(BASE + (2 << 30), [19, 2, 64]),
            o: packed(BASE + (3 << 30), [16, 4, 64]),
            stats: StatisticsAddresses::LogSumExp(BASE + (4 << 30)),
        };
        let batch = PackedBatch::new(&[0, 5, 5, 16], &[0, 7, 10, 19]).expect("valid offsets");
        (args, batch)
    }

    fn rejected(args: &BorrowedArguments, batch: &PackedBatch) -> &'static str {
        match args.check_packed(batch, &AttentionOptions::default()) {
            Err(Error::InvalidArgument { name, .. }) => name,
            other => panic!("expected an invalid argument, got {other:?}"),
        }
    }

    #[test]
    fn accepts_a_packed_batch_and_takes_its_shape_from_the_offsets() {
        let (args, batch) = arguments();
        let problem = args
            .check_packed(&batch, &AttentionOptions::default())
            .expect("valid");
        assert_eq!(
            (problem.heads, problem.heads_kv, problem.head_dim),
            (4, 2, 64)
        );
    }

    /// Edits one argument of a valid packed call.
    type Edit = fn(&mut BorrowedArguments);

    #[test]
    fn errors_name_the_argument() {
        let (_, batch) = arguments();
        let cases: [(&str, Edit); 8] = [
            ("q", |a| a.q.address = 0),
            ("k", |a| a.k.strides[3] = 2),
            ("v", |a| a.v.address += 1), // not a multiple of the element's 2 bytes
            ("o", |a| a.o = packed(a.o.address, [16, 2, 64])),
            ("o", |a| a.o.strides = [0, 0, 0, 1]), // every element at one address
            ("lse", |a| {
                a.stats = StatisticsAddresses::LogSumExp(BASE + 2)
            }),
            ("stats", |a| {
                a.stats = StatisticsAddresses::MaxAndSum {
                    max: BASE,
                    sum: BASE,
                }
            }),
            ("cu_seqlens_q", |a| a.q = packed(a.q.address, [17, 4, 64])),
        ];
        for (name, edit) in cases {
            let (mut args, _) = arguments();
            edit(&mut args);
            assert_eq!(rejected(&args, &batch), name, "{name}");
        }
    }
}
