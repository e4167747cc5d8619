//! The grouped backward's group sum: dK and dV of each K/V head as the sum over the query heads
//! that share it (grouped-query attention, GQA/MQA).
pub mod config;
#[cfg(target_arch = "nvptx64")]
pub mod kernel;
