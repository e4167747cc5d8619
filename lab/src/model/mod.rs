//! CPU models of the kernels: the f64 reference they are checked against (forward, gradients,
//! and decoding against a KV cache),
//! emulators of FA1, FA2 and FA2's backward that count every HBM read and write, and the HBM-traffic
//! formulas the emulators are checked against.
//!
//! The emulators run the kernels' tiling, loop order, causal block skipping and update equations
//! (the shared [`flash_kernels::softmax`] and [`flash_kernels::mask`] code, with `f32::exp2` for
//! the GPU's `ex2`), and count, element by element, what each kernel loads from and stores to
//! device memory. Like the kernels' `HeadRows`, they count only rows that exist: a tail block's
//! missing rows are zeros made on chip, not reads.

pub mod decode_reference;
mod emulation;
pub mod fa1;
pub mod fa2;
pub mod fa2_backward;
pub mod formulas;
pub mod formulas_backward;
pub mod io_table;
pub mod prediction;
pub mod reference;
pub mod reference_backward;
pub mod traffic;
