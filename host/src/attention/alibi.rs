//! ALiBi slopes (flash-attn's `alibi_slopes`): f32 in device memory, one per query head, shared
//! by every sequence (`(heads,)`) or one row per sequence (`(batch, heads)`). Each score becomes
//! scale·q·k − slope·|i + seqlen_k − seqlen_q − j| (`flash_kernels::common::alibi`), on the
//! kernels that take a window or soft-capping (fa3, fa2-tc, and standard's forward).

use crate::error::{Error, Result};

/// Where a call's slopes are and their shape. Built with [`AlibiSlopes::new`]; the problem
/// checks the shape against Q's heads and the batch ([`AlibiSlopes::checked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlibiSlopes {
    address: u64,
    /// The sequences the slopes have a row for: `None` for `(heads,)` slopes.
    rows: Option<usize>,
    heads: usize,
}

impl AlibiSlopes {
    /// Contiguous f32 slopes of `dims` = `[heads]` or `[batch, heads]` at device address
    /// `address`. Errors name an address that is 0 or not 4-byte aligned and a shape of another
    /// rank or with an empty dimension.
    ///
    /// # Safety
    /// `address` must hold the product of `dims` readable f32s in the memory of the GPU the call
    /// runs on, until the call's kernels have finished (stream order).
    pub unsafe fn new(address: u64, dims: &[usize]) -> Result<Self> {
        if address == 0 || !address.is_multiple_of(4) {
            return Err(Error::invalid(
                "alibi_slopes",
                format!("device address {address:#x}"),
                "the address of 4-byte-aligned float32 slopes in device memory",
            ));
        }
        let (rows, heads) = match *dims {
            [heads] => (None, heads),
            [batch, heads] => (Some(batch), heads),
            _ => {
                return Err(Error::invalid(
                    "alibi_slopes",
                    format!("shape {dims:?}"),
                    "(heads,) or (batch, heads), float32",
                ));
            }
        };
        if heads == 0 || rows == Some(0) {
            return Err(Error::invalid(
                "alibi_slopes",
                format!("shape {dims:?}"),
                "(heads,) or (batch, heads) with every dimension at least 1",
            ));
        }
        Ok(Self {
            address,
            rows,
            heads,
        })
    }

    /// These slopes, checked against a call of `batch` sequences and `heads` query heads.
    pub(crate) fn checked(self, batch: usize, heads: usize) -> Result<Self> {
        let dims = match self.rows {
            None => format!("({},)", self.heads),
            Some(rows) => format!("({rows}, {})", self.heads),
        };
        if self.heads != heads || self.rows.is_some_and(|rows| rows != batch) {
            return Err(Error::invalid(
                "alibi_slopes",
                format!("shape {dims}"),
                format!(
                    "(heads,) = ({heads},) or (batch, heads) = ({batch}, {heads}): one slope per query head"
                ),
            ));
        }
        Ok(self)
    }

    /// The kernels' `(alibi_slopes, alibi_batch_stride)` for the launch whose first sequence is
    /// `first_sequence`: the address of its row, and the stride between rows (0 when every
    /// sequence shares one row).
    pub(crate) fn kernel_fields(&self, first_sequence: usize) -> (u64, u32) {
        match self.rows {
            None => (self.address, 0),
            Some(_) => (
                self.address + 4 * (first_sequence * self.heads) as u64,
                self.heads as u32,
            ),
        }
    }

    /// The slopes' shape as flash-attn writes it.
    pub fn dims(&self) -> Vec<usize> {
        self.rows.into_iter().chain([self.heads]).collect()
    }
}

/// [`AlibiSlopes::kernel_fields`] of a call's slopes, (0, 0) without them.
pub(crate) fn kernel_fields(alibi: Option<AlibiSlopes>, first_sequence: usize) -> (u64, u32) {
    alibi.map_or((0, 0), |slopes| slopes.kernel_fields(first_sequence))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slopes(dims: &[usize]) -> Result<AlibiSlopes> {
        // SAFETY: no kernel runs in these tests.
        unsafe { AlibiSlopes::new(0x1000, dims) }
    }

    #[test]
    fn slopes_are_per_head_or_per_sequence_and_head() {
        let shared = slopes(&[8]).unwrap().checked(3, 8).unwrap();
        assert_eq!(shared.kernel_fields(200), (0x1000, 0));
        let per_sequence = slopes(&[3, 8]).unwrap().checked(3, 8).unwrap();
        assert_eq!(per_sequence.kernel_fields(0), (0x1000, 8));
        assert_eq!(per_sequence.kernel_fields(2), (0x1000 + 4 * 16, 8));
        assert_eq!(per_sequence.dims(), vec![3, 8]);
    }

    #[test]
    fn bad_slopes_are_named() {
        for dims in [&[][..], &[2, 3, 4], &[0], &[2, 0]] {
            let error = slopes(dims).unwrap_err().to_string();
            assert!(error.contains("alibi_slopes"), "{error}");
        }
        // SAFETY: refused before any use.
        for address in [0, 0x1002] {
            assert!(unsafe { AlibiSlopes::new(address, &[4]) }.is_err());
        }
        for (dims, batch, heads) in [(&[4][..], 2, 8), (&[3, 8][..], 2, 8), (&[2, 4][..], 2, 8)] {
            let error = slopes(dims)
                .unwrap()
                .checked(batch, heads)
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("alibi_slopes") && error.contains("(2, 8)"),
                "{error}"
            );
        }
    }
}
