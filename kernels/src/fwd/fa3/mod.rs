//! FlashAttention-3 forward on Hopper: TMA loads into a K/V ring guarded by mbarriers, `wgmma`
//! for both products, a producer warpgroup beside consumer warpgroups (registers moved with
//! `setmaxnreg`). Compiled into the Hopper module only (`feature = "hopper"`, sm_90a).

pub mod config;
#[cfg(all(target_arch = "nvptx64", feature = "hopper"))]
pub mod kernel;
#[cfg(all(target_arch = "nvptx64", feature = "hopper"))]
pub(crate) mod roles;
#[cfg(all(target_arch = "nvptx64", feature = "hopper"))]
mod sram;
#[cfg(all(target_arch = "nvptx64", feature = "hopper"))]
mod turns;
// Also built for the host's tests: the tile order is plain arithmetic.
#[cfg(any(test, all(target_arch = "nvptx64", feature = "hopper")))]
pub mod scheduler;
