//! HBM traffic, counted per tensor: what the emulators count and the formulas predict.

use flash_attn::dtype::DType;

/// Bytes of an f32: FA1's O accumulator, m, ℓ, L and the standard attention's S.
const F32_BYTES: u64 = 4;

/// Elements of one tensor moved between HBM and the chip.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub read: u64,
    pub written: u64,
}

impl Traffic {
    /// Both counts times `factor` (e.g. per head → whole problem), `None` on overflow.
    pub(super) fn checked_scale(self, factor: u64) -> Option<Self> {
        Some(Self {
            read: self.read.checked_mul(factor)?,
            written: self.written.checked_mul(factor)?,
        })
    }
}

/// The HBM traffic of one tensor: its element counts and the size of its elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorIo {
    pub element_bytes: u64,
    pub elements: Traffic,
}

impl TensorIo {
    pub(super) fn new(element_bytes: u64) -> Self {
        Self {
            element_bytes,
            elements: Traffic::default(),
        }
    }

    /// Bytes read (saturating at `u64::MAX`).
    pub fn bytes_read(&self) -> u64 {
        self.elements.read.saturating_mul(self.element_bytes)
    }

    /// Bytes written (saturating at `u64::MAX`).
    pub fn bytes_written(&self) -> u64 {
        self.elements.written.saturating_mul(self.element_bytes)
    }

    /// Both counts times `factor`, `None` on overflow.
    fn checked_scale(self, factor: u64) -> Option<Self> {
        Some(Self {
            element_bytes: self.element_bytes,
            elements: self.elements.checked_scale(factor)?,
        })
    }

    pub(super) fn count_read(&mut self, elements: usize) {
        self.elements.read += elements as u64;
    }

    pub(super) fn count_written(&mut self, elements: usize) {
        self.elements.written += elements as u64;
    }
}

/// The accessors every per-tensor count struct shares, from its fields and their report names:
/// `tensors()` (each tensor with its name), the byte totals (saturating at `u64::MAX`), and
/// [`CheckedScale`].
macro_rules! impl_tensor_counts {
    ($counts:ident, $n:literal, [$($field:ident $name:literal),* $(,)?]) => {
        impl $counts {
            /// Every tensor with its name, for reports.
            pub fn tensors(&self) -> [(&'static str, TensorIo); $n] {
                [$(($name, self.$field)),*]
            }

            /// Bytes read from HBM over all tensors (saturating at `u64::MAX`).
            pub fn bytes_read(&self) -> u64 {
                checked_bytes(&self.tensors(), |t| t.elements.read).unwrap_or(u64::MAX)
            }

            /// Bytes written to HBM over all tensors (saturating at `u64::MAX`).
            pub fn bytes_written(&self) -> u64 {
                checked_bytes(&self.tensors(), |t| t.elements.written).unwrap_or(u64::MAX)
            }
        }

        impl CheckedScale for $counts {
            fn checked_scale(&self, factor: u64) -> Option<Self> {
                let scaled = Self {
                    $($field: self.$field.checked_scale(factor)?,)*
                };
                byte_totals_fit(&scaled.tensors()).then_some(scaled)
            }
        }
    };
}

/// HBM traffic per tensor. Q, K, V, O are in the input dtype; everything else is f32. A tensor an
/// algorithm does not have stays at zero (the emulators never touch S and P).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoCounts {
    pub q: TensorIo,
    pub k: TensorIo,
    pub v: TensorIo,
    /// The final output O.
    pub o: TensorIo,
    /// FA1's f32 copy of O between outer steps (kept normalised, Algorithm 1 line 12).
    pub o_accumulator: TensorIo,
    /// FA1's running row max m (natural-log units).
    pub row_max: TensorIo,
    /// FA1's running row sum ℓ.
    pub row_sum: TensorIo,
    /// L = m + log ℓ (FA2 and the standard attention).
    pub logsumexp: TensorIo,
    /// The standard attention's S = scale·Q·Kᵀ (f32).
    pub scores: TensorIo,
    /// The standard attention's P = softmax(S) (input dtype).
    pub probs: TensorIo,
}

impl IoCounts {
    /// All counts zero, with element sizes for inputs of `dtype`.
    pub fn new(dtype: DType) -> Self {
        let input = dtype.size_bytes() as u64;
        let f32_tensor = TensorIo::new(F32_BYTES);
        Self {
            q: TensorIo::new(input),
            k: TensorIo::new(input),
            v: TensorIo::new(input),
            o: TensorIo::new(input),
            o_accumulator: f32_tensor,
            row_max: f32_tensor,
            row_sum: f32_tensor,
            logsumexp: f32_tensor,
            scores: f32_tensor,
            probs: TensorIo::new(input),
        }
    }
}

impl_tensor_counts!(IoCounts, 10, [
    q "Q", k "K", v "V", o "O", o_accumulator "O accumulator", row_max "m", row_sum "ℓ",
    logsumexp "L", scores "S", probs "P",
]);

/// The backward pass's HBM traffic per tensor. Q, K, V, O, dO and the gradients are in the input
/// dtype; L, D, the dQ accumulator and dP are f32; P and dS are in the input dtype (the operands of
/// the next matrix product, as the forward stores P). A tensor an algorithm does not have stays at
/// zero (FA2 never touches P, dP, dS; the standard backward never touches L, D and the
/// accumulator).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardIoCounts {
    pub q: TensorIo,
    pub k: TensorIo,
    pub v: TensorIo,
    /// The forward's O (read by FA2's pre-pass for D).
    pub o: TensorIo,
    pub d_o: TensorIo,
    /// The forward's L = m + log ℓ, from which FA2 recomputes P.
    pub logsumexp: TensorIo,
    /// FA2's D = rowsum(dO ∘ O): written by the pre-pass, read by the main loop.
    pub delta: TensorIo,
    /// FA2's f32 dQ accumulator: zeroed by the pre-pass, read and written at every visit of a
    /// row block, read by the post-pass that writes dQ.
    pub dq_accumulator: TensorIo,
    pub dq: TensorIo,
    pub dk: TensorIo,
    pub dv: TensorIo,
    /// The standard backward's P, kept in HBM by the forward.
    pub probs: TensorIo,
    /// The standard backward's dP = dO·Vᵀ.
    pub d_probs: TensorIo,
    /// The standard backward's dS = P ∘ (dP − D).
    pub d_scores: TensorIo,
}

impl BackwardIoCounts {
    /// All counts zero, with element sizes for inputs of `dtype`.
    pub fn new(dtype: DType) -> Self {
        let input = TensorIo::new(dtype.size_bytes() as u64);
        let f32_tensor = TensorIo::new(F32_BYTES);
        Self {
            q: input,
            k: input,
            v: input,
            o: input,
            d_o: input,
            logsumexp: f32_tensor,
            delta: f32_tensor,
            dq_accumulator: f32_tensor,
            dq: input,
            dk: input,
            dv: input,
            probs: input,
            d_probs: f32_tensor,
            d_scores: input,
        }
    }
}

impl_tensor_counts!(BackwardIoCounts, 14, [
    q "Q", k "K", v "V", o "O", d_o "dO", logsumexp "L", delta "D",
    dq_accumulator "dQ accumulator", dq "dQ", dk "dK", dv "dV", probs "P", d_probs "dP",
    d_scores "dS",
]);

/// Per-head counts that scale to a whole problem.
pub(super) trait CheckedScale: Sized {
    /// Every count times `factor`, `None` if a count or a byte total overflows.
    fn checked_scale(&self, factor: u64) -> Option<Self>;
}

/// Σ elements·element_bytes over `tensors`, `None` on overflow.
fn checked_bytes(
    tensors: &[(&'static str, TensorIo)],
    elements: impl Fn(&TensorIo) -> u64,
) -> Option<u64> {
    tensors.iter().try_fold(0u64, |total, (_, tensor)| {
        total.checked_add(elements(tensor).checked_mul(tensor.element_bytes)?)
    })
}

/// Whether the bytes read and the bytes written over `tensors` each fit in 64 bits.
fn byte_totals_fit(tensors: &[(&'static str, TensorIo)]) -> bool {
    checked_bytes(tensors, |t| t.elements.read).is_some()
        && checked_bytes(tensors, |t| t.elements.written).is_some()
}
