//! Hardware limits the kernels' configs are checked against at compile time (the host checks each
//! launch against the device's own values as well).

/// Registers one thread can address (the ISA's limit on every architecture since sm_70).
pub const MAX_REGISTERS_PER_THREAD: u32 = 255;

/// 32-bit registers of one SM (sm_80 and sm_90), shared by the threads of its resident blocks.
pub const REGISTERS_PER_SM: u32 = 65_536;

/// The most dynamic shared memory one block can opt in to on the GPUs the kernels target
/// (sm_90: 227 KiB; sm_80 allows 163 KiB, which the host checks against the device at launch).
pub const MAX_SHARED_BYTES_PER_BLOCK: u32 = 227 * 1024;

/// The most threads in one block.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;
