//! The element types a user's tensors can have.

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use flash_kernels::registry::ElementType;
/// The half-precision [`Element`]s, re-exported so [`with_element!`] can name them from any crate.
pub use half::{bf16, f16};

/// Element type of Q, K, V and O (all four share one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    Bf16,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

    /// Stored fraction bits (10 for f16, 7 for bf16, 23 for f32).
    pub fn fraction_bits(self) -> i32 {
        match self {
            DType::F32 => 23,
            DType::F16 => 10,
            DType::Bf16 => 7,
        }
    }

    /// The spacing of this type's values around `magnitude` (one unit in the last place), for
    /// normal numbers; the spacing at 1 for a magnitude of 0.
    pub fn unit_in_last_place(self, magnitude: f64) -> f64 {
        let exponent = if magnitude > 0.0 {
            magnitude.abs().log2().floor() as i32
        } else {
            0
        };
        2f64.powi(exponent - self.fraction_bits())
    }

    /// The name used in kernel names, on the command line and in files.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        }
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| crate::Error::invalid("dtype", s, "allowed: f32, f16, bf16"))
    }
}

/// Evaluates an expression with a type alias bound to the Rust type of a run-time [`DType`]: the
/// one place a dtype chosen by a user becomes a generic [`Element`] parameter.
///
/// `with_element!(dtype, T => body)` expands to a `match` on `dtype` whose arms each declare
/// `type T = f32;` (or [`f16`], [`bf16`]) and evaluate `body`, so every arm must have the same type.
///
/// ```
/// use flash_attn::{DType, Element, with_element};
///
/// fn bytes_of<T: Element>(elements: usize) -> usize {
///     elements * size_of::<T>()
/// }
/// let dtype: DType = "bf16".parse()?;
/// assert_eq!(with_element!(dtype, T => bytes_of::<T>(10)), 20);
/// # Ok::<(), flash_attn::Error>(())
/// ```
#[macro_export]
macro_rules! with_element {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F16 => {
                type $T = $crate::dtype::f16;
                $body
            }
            $crate::DType::Bf16 => {
                type $T = $crate::dtype::bf16;
                $body
            }
        }
    };
}

/// A Rust type that is one of the [`DType`]s.
pub trait Element:
    DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + std::fmt::Debug + 'static
{
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    /// Rounds to this type (to nearest even).
    fn from_f64(value: f64) -> Self;
    /// A value no kernel produces from finite inputs, written into outputs before a launch so that
    /// an element the kernel forgot to write shows up.
    fn poison() -> Self {
        Self::from_f64(f64::NAN)
    }
    /// `value` rounded to this type and back.
    fn round(value: f64) -> f64 {
        Self::from_f64(value).to_f64()
    }
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(value: f64) -> Self {
        value as f32
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(value: f64) -> Self {
        f16::from_f64(value)
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::Bf16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(value: f64) -> Self {
        bf16::from_f64(value)
    }
}

/// The kernels' name for the same element type (`flash_kernels::registry`).
impl From<DType> for ElementType {
    fn from(dtype: DType) -> Self {
        match dtype {
            DType::F32 => ElementType::F32,
            DType::F16 => ElementType::F16,
            DType::Bf16 => ElementType::Bf16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_in_the_last_place_is_the_spacing_of_neighbouring_values() {
        // 1 + 2⁻¹⁰ is f16's next value after 1; bf16 steps by 2⁻⁶ between 2 and 4.
        assert_eq!(DType::F16.unit_in_last_place(1.0), 2f64.powi(-10));
        assert_eq!(DType::F16.unit_in_last_place(1.999), 2f64.powi(-10));
        assert_eq!(DType::Bf16.unit_in_last_place(3.0), 2f64.powi(-6));
        assert_eq!(DType::F32.unit_in_last_place(0.5), 2f64.powi(-24));
        let next = f16::from_f64(1.5).to_f64() + DType::F16.unit_in_last_place(1.5);
        assert_eq!(f16::from_f64(next).to_f64(), next);
        assert_eq!(DType::Bf16.unit_in_last_place(0.0), 2f64.powi(-7));
    }
}
