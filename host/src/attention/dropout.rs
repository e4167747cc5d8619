//! Dropout on the attention probabilities (flash-attn's `dropout_p`): O = (P ∘ Z)·V / (1 − p),
//! Z drawn by Philox4x32-10 from a seed and an offset (`flash_kernels::common::dropout`, which
//! says which random number decides which score). The backward recomputes the same Z from the
//! same seed and offset, so a caller that wants gradients passes the forward's [`Dropout`] to
//! the backward unchanged. Taken by `fa3` and `fa2-tc` (their `local` forms), forward and
//! backward, dense and packed.

use crate::error::{Error, Result};
use flash_kernels::common::dropout::drop_below;

/// One call's dropout: the probability and the generator's state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    p: f32,
    seed: u64,
    offset: u64,
}

impl Dropout {
    /// Drop each probability with probability `p`, from Philox's `seed` and `offset` (PyTorch's
    /// generator state: the Python package takes them from the CUDA generator, as flash-attn
    /// does). `None` for p = 0; an error naming `dropout_p` unless 0 ≤ p < 1. The kernels round p
    /// to a multiple of 1/65536 and scale the kept probabilities by 1 / (1 − p) as rounded.
    pub fn new(p: f32, seed: u64, offset: u64) -> Result<Option<Self>> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid(
                "dropout_p",
                p,
                "a probability in [0, 1): 0.0 is no dropout",
            ));
        }
        Ok((p > 0.0).then_some(Self { p, seed, offset }))
    }

    /// The probability of dropping each score.
    pub fn p(&self) -> f32 {
        self.p
    }

    /// The kernels' `(dropout_seed, dropout_offset, dropout_first_head, dropout_drop_below)`
    /// for the launch whose first global head is `first_head` (a packed launch's first sequence
    /// times heads).
    pub(crate) fn kernel_fields(&self, first_head: u32) -> (u64, u64, u32, u32) {
        (self.seed, self.offset, first_head, drop_below(self.p))
    }
}

/// [`Dropout::kernel_fields`] of a call's dropout, all 0 without it (the kernels' off).
pub(crate) fn kernel_fields(dropout: Option<Dropout>, first_head: u32) -> (u64, u64, u32, u32) {
    dropout.map_or((0, 0, 0, 0), |d| d.kernel_fields(first_head))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_off_and_probabilities_outside_zero_one_are_named() {
        assert_eq!(Dropout::new(0.0, 1, 2).unwrap(), None);
        let half = Dropout::new(0.5, 7, 12).unwrap().unwrap();
        assert_eq!(half.kernel_fields(6), (7, 12, 6, 32768));
        assert_eq!(kernel_fields(None, 6), (0, 0, 0, 0));
        for p in [1.0, 1.5, -0.1, f32::NAN, f32::INFINITY] {
            let error = Dropout::new(p, 0, 0).unwrap_err().to_string();
            assert!(
                error.contains("dropout_p") && error.contains("[0, 1)"),
                "{error}"
            );
        }
        // p is rounded to 1/65536: below 2^-17 that is no dropout, the nearest.
        let tiny = Dropout::new(1e-6, 0, 0).unwrap().unwrap();
        assert_eq!(tiny.kernel_fields(0).3, 0);
        assert_eq!(
            Dropout::new(0.17, 0, 0)
                .unwrap()
                .unwrap()
                .kernel_fields(0)
                .3,
            11141
        );
    }
}
