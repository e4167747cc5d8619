//! Element types of Q, K, V and O. Kernels load them into f32, compute in f32, and round once when
//! they store.

use crate::arch;

/// A tensor element the kernels read and write; arithmetic is always in f32.
pub trait Element: Copy {
    fn to_f32(self) -> f32;
    fn from_f32(value: f32) -> Self;
}

/// IEEE 754 binary16, as its bits (Rust's `f16` type is not used: its support on nvptx is young).
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct F16(pub u16);

/// bfloat16, as its bits.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct Bf16(pub u16);

impl Element for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        value
    }
}

impl Element for F16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        arch::f16_to_f32(self.0)
    }
    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        F16(arch::f32_to_f16(value))
    }
}

impl Element for Bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        arch::bf16_to_f32(self.0)
    }
    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        Bf16(arch::f32_to_bf16(value))
    }
}

/// A 16-bit element the tensor cores multiply (f32 accumulate).
pub trait TensorCoreElement: Element {
    /// Whether this is bf16 (else f16): the type names of a `wgmma`.
    const BF16: bool;
    /// Two f32 rounded to this type and packed into one register, `low` first.
    fn pack2(low: f32, high: f32) -> u32;
    /// Two elements packed in one register (`low` in bits 0–15) as f32, exactly.
    fn unpack2(packed: u32) -> [f32; 2];
    /// D = A·B + C, m16n8k16, in PTX fragment layouts.
    fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4];
}

impl TensorCoreElement for Bf16 {
    const BF16: bool = true;
    #[inline(always)]
    fn pack2(low: f32, high: f32) -> u32 {
        arch::pack_bf16x2(low, high)
    }
    #[inline(always)]
    fn unpack2(packed: u32) -> [f32; 2] {
        [packed as u16, (packed >> 16) as u16].map(arch::bf16_to_f32)
    }
    #[inline(always)]
    fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        arch::mma_bf16_16x8x16(a, b, c)
    }
}

impl TensorCoreElement for F16 {
    const BF16: bool = false;
    #[inline(always)]
    fn pack2(low: f32, high: f32) -> u32 {
        arch::pack_f16x2(low, high)
    }
    #[inline(always)]
    fn unpack2(packed: u32) -> [f32; 2] {
        [packed as u16, (packed >> 16) as u16].map(arch::f16_to_f32)
    }
    #[inline(always)]
    fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        arch::mma_f16_16x8x16(a, b, c)
    }
}
