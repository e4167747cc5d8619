//! Tools around the kernels: the benchmark and the checks against the f64 reference.

pub mod bench;
pub mod check;
pub mod check_backward;
pub mod check_decode;
pub mod check_packed;
pub mod check_packed_backward;
