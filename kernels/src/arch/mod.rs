//! Every nightly GPU intrinsic, `asm!` block and raw pointer access of the kernels, one documented
//! function per PTX instruction, each with its SAFETY note. Kernels and tile helpers call only
//! these, so the unsafe, unstable surface of the project lives in this folder, by architecture:
//!
//! - [`base`]: what every targeted GPU has (threads, barriers, shuffles, `ex2`/`lg2`, FMA,
//!   conversions, shared-memory carving, loads and stores);
//! - [`sm80`]: Ampere's tensor-core and copy instructions (`mma.sync`, `ldmatrix`, `cp.async`).
//!
//! - [`sm90`] (the Hopper module only, `feature = "hopper"`): wgmma, TMA, mbarriers, named
//!   barriers, `setmaxnreg`.
//!
//! Kernels import the folder as one namespace (`arch::sync_threads()`, `arch::load_matrix_x4(…)`).

mod base;
mod sm80;

pub use base::*;
pub use sm80::*;

#[cfg(feature = "hopper")]
mod sm90;
#[cfg(feature = "hopper")]
pub use sm90::*;
