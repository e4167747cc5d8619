//! The lab around the `flash-attn` library: what checks and measures the kernels, apart from the
//! API a user links.
//!
//! - [`tools`]: the checks against the f64 reference and the benchmark (the `flash-attn` CLI's
//!   `check` and `bench`);
//! - [`model`]: CPU models of the kernels: the f64 reference, emulators that count every HBM
//!   access, and the traffic formulas;
//! - [`safetensors_io`]: Q, K, V in and outputs out as safetensors files (`flash-attn run`);
//! - [`names`]: the library's enums in the records' JSON, by name.

pub mod model;
pub mod names;
pub mod safetensors_io;
pub mod tools;
