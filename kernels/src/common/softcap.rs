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

    /// The multipliers of a tensor-core kernel, forward (`common::form::KernelForm`) or backward:
    /// the parameter block's in the `local` form, else [`Softcap::OFF`] as a constant, so the
    /// capping compiles away.
    #[inline(always)]
    pub fn of_form(shape: &AttentionShape, local: bool) -> Self {
        if local { Self::of(shape) } else { Self::OFF }
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

    /// The capped raw product and its derivative with respect to the raw product,
    /// d/dx [tanh(x·inside)·outside] = 1 − tanh², as inside·outside = 1: the backward pass
    /// multiplies dS by it (the chain rule through the cap). (x, 1) when capping is off.
    #[inline(always)]
    pub fn apply_with_slope(&self, product: f32, tanh: impl Fn(f32) -> f32) -> (f32, f32) {
        if !self.is_on() {
            return (product, 1.0);
        }
        let t = tanh(product * self.inside);
        (t * self.outside, 1.0 - t * t)
    }
}

/// tanh(x) to f32's precision from the `ex2.approx` exponential (relative error about 2^-22)
/// and one IEEE division, for the f32 standard kernel, whose scores are checked to f32's
/// tolerance: `tanh.approx`'s error, scaled by softcap, took the capped checks from 0.16 of their
/// bound to 1.6 (call 19). For |x| ≥ 1/4, tanh|x| = (1 − e)/(1 + e) with e = e^(−2|x|), where
/// 1 − e ≥ 0.39 amplifies `ex2.approx`'s error by at most 1.6; below, the Taylor series to x⁹,
/// whose next term is under 10⁻⁸·|x|.
#[inline(always)]
pub fn tanh_precise(x: f32, exp2: impl Fn(f32) -> f32) -> f32 {
    let magnitude = x.abs();
    if magnitude < 0.25 {
        let x2 = x * x;
        let series = 62.0 / 2835.0;
        let series = -17.0 / 315.0 + x2 * series;
        let series = 2.0 / 15.0 + x2 * series;
        let series = -1.0 / 3.0 + x2 * series;
        x * (1.0 + x2 * series)
    } else {
        let e = exp2(-2.0 * core::f32::consts::LOG2_E * magnitude);
        let t = (1.0 - e) / (1.0 + e);
        if x < 0.0 { -t } else { t }
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

    /// The slope against a central difference of the capped score.
    #[test]
    fn the_slope_is_the_derivative_of_the_capped_product() {
        let cap = Softcap::new(0.125, 4.0);
        for product in [-90.0f32, -20.0, -1.0, 0.0, 3.0, 31.0, 120.0] {
            let (capped, slope) = cap.apply_with_slope(product, f32::tanh);
            assert_eq!(capped, cap.apply(product, f32::tanh));
            let capped64 = |x: f64| (x * 0.125 / 4.0).tanh() * 4.0 / 0.125;
            let h = 1e-3;
            let numeric = (capped64(product as f64 + h) - capped64(product as f64 - h)) / (2.0 * h);
            assert!(
                (slope as f64 - numeric).abs() < 1e-5,
                "{product}: {slope} {numeric}"
            );
        }
        assert_eq!(Softcap::OFF.apply_with_slope(7.0, f32::tanh), (7.0, 1.0));
    }

    #[test]
    fn the_precise_tanh_is_within_a_few_ulps_of_the_f64_value() {
        let mut worst = 0.0f64;
        for i in -40_000..=40_000 {
            let x = i as f32 * 2.5e-4;
            let got = tanh_precise(x, f32::exp2) as f64;
            let want = (x as f64).tanh();
            if want != 0.0 {
                worst = worst.max(((got - want) / want).abs());
            }
        }
        assert!(tanh_precise(f32::INFINITY, f32::exp2) == 1.0);
        assert!(tanh_precise(f32::NEG_INFINITY, f32::exp2) == -1.0);
        assert!(worst < 4e-7, "worst relative error {worst:e}");
    }
}
