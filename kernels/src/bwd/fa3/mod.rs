//! FlashAttention-3's backward on Hopper (`fa3`'s backward): FA2's backward main loop (Algorithm
//! 2) with K_j, V_j and the streamed Q_i, dO_i loaded by TMA, a producer warpgroup beside
//! consumer warpgroups, and every product on `wgmma` with its operands read from shared memory
//! or registers, between the FA2 backward's pre- and post-pass. Compiled into the Hopper module
//! only (`feature = "hopper"`, sm_90a).

pub mod config;
#[cfg(all(target_arch = "nvptx64", feature = "hopper"))]
mod dq_writer;
#[cfg(all(target_arch = "nvptx64", feature = "hopper"))]
pub mod kernel;
#[cfg(all(target_arch = "nvptx64", feature = "hopper"))]
mod key_block;
#[cfg(all(target_arch = "nvptx64", feature = "hopper"))]
mod sram;
