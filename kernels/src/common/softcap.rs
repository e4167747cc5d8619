//! Logit soft-capping (Gemma 2; flash-attn's `softcap`): each score s = scale·q·k becomes
//! softcap·tanh(s / softcap) before the mask and the softmax, which bounds it to (−softcap,
//! softcap).
//!
//! The kernels keep their softmax in the units it had without capping (scale·log2 e times the
//! raw product q·k): a raw product x becomes tanh(x·scale/softcap)·softcap/scale, whose scaled
//! value is the capped score. So capping costs one multiply, one tanh and one multiply per
//! score, and nothing else changes (the scale, the exp2 domain, the conditional rescale).

use crate::common::params::AttentionShape;

/// The two multipliers of soft-capping a raw product x = q·k: tanh(x·inside)·outside.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Softcap {
    /// scale / softcap; 0 when soft-capping is off.
    pub inside: f32,
    /// softcap / scale.
    pub outside: f32,
}

impl Softcap {
    /// No capping.
    pub const OFF: Self = Self {
        inside: 0.0,
        outside: 0.0,
    };

    /// The multipliers for `softmax_scale` and `softcap` (0: off; the host checks that it is
    /// finite and not negative).
    pub fn new(softmax_scale: f32, softcap: f32) -> Self {
        if softcap > 0.0 {
            Self {
                inside: softmax_scale / softcap,
                outside: softcap / softmax_scale,
            }
        } else {
            Self::OFF
        }
    }

    /// The multipliers a parameter block carries.
    #[inline(always)]
    pub fn of(shape: &AttentionShape) -> Self {
        Self {
            inside: shape.softcap_inside,
            outside: shape.softcap_outside,
        }
    }

    /// Whether scores are capped (a uniform value: a branch on it costs one compare when off).
    #[inline(always)]
    pub fn is_on(&self) -> bool {
        self.inside != 0.0
    }

    /// The capped raw product: tanh(x·inside)·outside, with `tanh` the GPU's `tanh.approx` or
    /// the host's `f32::tanh`.
    #[inline(always)]
    pub fn apply(&self, product: f32, tanh: impl Fn(f32) -> f32) -> f32 {
        tanh(product * self.inside) * self.outside
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capped_score_is_softcap_tanh_of_the_scaled_product() {
        let (scale, softcap) = (0.125f32, 5.0f32);
        let cap = Softcap::new(scale, softcap);
        for product in [-400.0f32, -3.0, 0.0, 1.5, 80.0] {
            let capped = cap.apply(product, f32::tanh) * scale;
            let expected = softcap * (product * scale / softcap).tanh();
            assert!((capped - expected).abs() <= 1e-5 * softcap, "{product}");
            assert!(capped.abs() <= softcap);
        }
        assert!(!Softcap::new(scale, 0.0).is_on());
        assert!(cap.is_on());
    }
}
