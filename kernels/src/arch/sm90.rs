//! Hopper's instructions (sm_90a): warpgroup MMA (`wgmma`), the tensor memory accelerator (TMA),
//! transaction-counting mbarriers, named barriers and `setmaxnreg`. Compiled only into the Hopper
//! module (`feature = "hopper"`, `llc -mcpu=sm_90a`): wgmma and setmaxnreg exist on compute
//! capability 9.0 alone.
//!
//! What each encoding is was checked on the H200 (`../shared/BUILD-FACTS.md`, "Hopper from
//! Rust"): 128-byte-swizzled tiles written by TMA and read by wgmma through descriptors whose
//! leading/stride byte offsets are below, the scale-d operand as a predicate, the tensor map in
//! global memory.
//!
//! ```text
//!  a tile as TMA writes it and wgmma reads it (16-bit elements, 128-byte swizzle):
//!  panel p = columns 64p..64p+63, each row 128 bytes, rows consecutive, 16-byte chunk c of row r
//!  stored at chunk c ^ (r % 8); 8 rows = one 1024-byte swizzle atom (1024-byte aligned)
//! ```

use core::arch::asm;

use super::SharedAddress;

// ---------------------------------------------------------------------------------------------
// Shared-memory matrix descriptors
// ---------------------------------------------------------------------------------------------

/// Bytes of one row of a 128-byte-swizzled tile: 64 16-bit elements.
pub const SWIZZLE_ROW_BYTES: u32 = 128;
/// Bytes of one swizzle atom: 8 rows. Tiles start on this alignment.
pub const SWIZZLE_ATOM_BYTES: u32 = 8 * SWIZZLE_ROW_BYTES;

/// A wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): in 16-byte
/// units, the start address in bits 0–13, the leading-dimension byte offset in bits 16–29, the
/// stride-dimension byte offset in bits 32–45; the swizzle mode in bits 62–63 (1: 128-byte).
#[derive(Clone, Copy)]
pub struct MatrixDescriptor(pub u64);

impl MatrixDescriptor {
    const SWIZZLE_128B: u64 = 1 << 62;

    /// A 14-bit field of 16-byte units.
    #[inline(always)]
    const fn field(bytes: u32) -> u64 {
        ((bytes >> 4) & 0x3fff) as u64
    }

    #[inline(always)]
    const fn encode(start: SharedAddress, leading_bytes: u32, stride_bytes: u32) -> Self {
        let field = Self::field;
        Self(
            field(start.0)
                | (field(leading_bytes) << 16)
                | (field(stride_bytes) << 32)
                | Self::SWIZZLE_128B,
        )
    }

    /// An operand stored K-major (the reduction dimension contiguous: Q and K, rows of 128
    /// bytes): 8-row groups one swizzle atom apart; the leading offset is unused with swizzling
    /// (1 by convention).
    #[inline(always)]
    pub const fn k_major(start: SharedAddress) -> Self {
        Self::encode(start, 16, SWIZZLE_ATOM_BYTES)
    }

    /// An operand stored MN-major (the output dimension contiguous: V as `[key][d]`, read as B of
    /// P̃·V with `imm-trans-b`): 8-key groups one swizzle atom apart (stride offset), 64-column
    /// panels `panel_bytes` apart (leading offset).
    #[inline(always)]
    pub const fn mn_major(start: SharedAddress, panel_bytes: u32) -> Self {
        Self::encode(start, panel_bytes, SWIZZLE_ATOM_BYTES)
    }

    /// The same matrix `bytes` further on (a k-step inside a swizzle row: 32 bytes per 16
    /// elements; or the next 16 keys of V: 16 rows).
    #[inline(always)]
    pub const fn advanced(self, bytes: u32) -> Self {
        Self(self.0 + (bytes >> 4) as u64)
    }
}

// ---------------------------------------------------------------------------------------------
// wgmma: one 64 × N × 16 product per warpgroup (4 warps, 128 threads)
// ---------------------------------------------------------------------------------------------

/// `wgmma.fence.sync.aligned`: orders this warpgroup's register writes (accumulators rescaled,
/// A fragments packed) before the wgmma that reads them. Issued before each batch of products.
#[inline(always)]
pub fn wgmma_fence() {
    // SAFETY: an ordering instruction; all threads of the warpgroup execute it.
    unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) }
}

/// `wgmma.commit_group.sync.aligned`: closes the group of products issued since the last commit.
#[inline(always)]
pub fn wgmma_commit() {
    // SAFETY: bookkeeping of this warpgroup's asynchronous products.
    unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) }
}

/// `wgmma.wait_group.sync.aligned PENDING`: waits until at most `PENDING` committed groups are
/// still running. Their accumulators may be read only after this, and after
/// [`wgmma_fence_accumulator`] tells the compiler so.
#[inline(always)]
pub fn wgmma_wait<const PENDING: u32>() {
    // SAFETY: waits on this warpgroup's own products.
    unsafe { asm!("wgmma.wait_group.sync.aligned {n};", n = const PENDING, options(nostack)) }
}

/// Four asm operand slots (one 16×8 tile of an accumulator); the argument only drives the
/// repetition.
macro_rules! tile_slots {
    ($tile:literal) => {
        ", {}, {}, {}, {}"
    };
}

/// One wgmma with its accumulator tiles as positional operands: `ss` (A and B from shared memory;
/// `$transpose` "0, 0": both K-major, "1, 1": both MN-major, `imm-trans-a` and `imm-trans-b`) or
/// `rs` (A from registers, B MN-major, `imm-trans-b` = 1), or `fence` (no instruction: the
/// accumulators pass through an empty asm, so the compiler neither reads them before a wait nor
/// moves the next write of them above it).
macro_rules! wgmma_asm {
    (ss $transpose:literal $dtype:literal $n:literal $acc:ident [$first:literal $($rest:literal)*], $a:expr, $b:expr, $scale:expr) => {
        asm!(
            "{{ .reg .pred p; setp.ne.b32 p, {scale}, 0;",
            concat!("wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $dtype, ".", $dtype),
            concat!("{{{}, {}, {}, {}", $(tile_slots!($rest),)* "}},"),
            concat!("{a}, {b}, p, 1, 1, ", $transpose, "; }}"),
            inout(reg32) $acc[$first][0], inout(reg32) $acc[$first][1],
            inout(reg32) $acc[$first][2], inout(reg32) $acc[$first][3],
            $(inout(reg32) $acc[$rest][0], inout(reg32) $acc[$rest][1],
              inout(reg32) $acc[$rest][2], inout(reg32) $acc[$rest][3],)*
            a = in(reg64) $a, b = in(reg64) $b, scale = in(reg32) $scale,
            options(nostack)
        )
    };
    // The first k-step (scale-d = 0): the accumulators are outputs only, so nothing has to define
    // them before the product (ptxas serializes wgmmas whose accumulator inputs other
    // instructions define inside a pipeline stage).
    (ss_zero $transpose:literal $dtype:literal $n:literal $acc:ident [$first:literal $($rest:literal)*], $a:expr, $b:expr) => {
        asm!(
            "{{ .reg .pred p; setp.ne.b32 p, {zero}, 0;",
            concat!("wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $dtype, ".", $dtype),
            concat!("{{{}, {}, {}, {}", $(tile_slots!($rest),)* "}},"),
            concat!("{a}, {b}, p, 1, 1, ", $transpose, "; }}"),
            out(reg32) $acc[$first][0], out(reg32) $acc[$first][1],
            out(reg32) $acc[$first][2], out(reg32) $acc[$first][3],
            $(out(reg32) $acc[$rest][0], out(reg32) $acc[$rest][1],
              out(reg32) $acc[$rest][2], out(reg32) $acc[$rest][3],)*
            a = in(reg64) $a, b = in(reg64) $b, zero = in(reg32) 0u32,
            options(nostack)
        )
    };
    (rs $dtype:literal $n:literal $acc:ident [$first:literal $($rest:literal)*], $a:expr, $b:expr, $scale:expr) => {
        asm!(
            "{{ .reg .pred p; setp.ne.b32 p, {scale}, 0;",
            concat!("wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $dtype, ".", $dtype),
            concat!("{{{}, {}, {}, {}", $(tile_slots!($rest),)* "}},"),
            "{{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, 1; }}",
            inout(reg32) $acc[$first][0], inout(reg32) $acc[$first][1],
            inout(reg32) $acc[$first][2], inout(reg32) $acc[$first][3],
            $(inout(reg32) $acc[$rest][0], inout(reg32) $acc[$rest][1],
              inout(reg32) $acc[$rest][2], inout(reg32) $acc[$rest][3],)*
            a0 = in(reg32) $a[0], a1 = in(reg32) $a[1], a2 = in(reg32) $a[2], a3 = in(reg32) $a[3],
            b = in(reg64) $b, scale = in(reg32) $scale,
            options(nostack)
        )
    };
    (fence $n:literal $acc:ident [$first:literal $($rest:literal)*]) => {
        asm!(
            concat!("// accumulators live: {}, {}, {}, {}", $(tile_slots!($rest),)*),
            inout(reg32) $acc[$first][0], inout(reg32) $acc[$first][1],
            inout(reg32) $acc[$first][2], inout(reg32) $acc[$first][3],
            $(inout(reg32) $acc[$rest][0], inout(reg32) $acc[$rest][1],
              inout(reg32) $acc[$rest][2], inout(reg32) $acc[$rest][3],)*
            options(nostack, nomem, preserves_flags)
        )
    };
}

/// Calls `$arm!(N, [tile indices])` for the accumulator of `TILES` 16×8 tiles: the N of an m64nN
/// wgmma is 8·TILES. The widths the FA3 configs use (B_c for S, the head dim for Õ).
macro_rules! match_width {
    ($tiles:expr, $arm:ident) => {
        match $tiles {
            8 => $arm!(64, [0 1 2 3 4 5 6 7]),
            10 => $arm!(80, [0 1 2 3 4 5 6 7 8 9]),
            12 => $arm!(96, [0 1 2 3 4 5 6 7 8 9 10 11]),
            14 => $arm!(112, [0 1 2 3 4 5 6 7 8 9 10 11 12 13]),
            16 => $arm!(128, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]),
            18 => $arm!(144, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17]),
            22 => $arm!(176, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21]),
            24 => $arm!(192, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23]),
            32 => $arm!(256, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24
                              25 26 27 28 29 30 31]),
            // SAFETY: `check_width` rejected every other width at compile time.
            _ => unsafe { core::hint::unreachable_unchecked() },
        }
    };
}

/// Compile-time check that an accumulator of `TILES` tiles is a width [`match_width`] has.
const fn check_width(tiles: usize) {
    assert!(
        matches!(tiles, 8 | 10 | 12 | 14 | 16 | 18 | 22 | 24 | 32),
        "no wgmma width for this accumulator: add it to `match_width`"
    );
}

/// The accumulator as an array of the literal length `N / 8` the arm names.
macro_rules! typed_accumulator {
    ($acc:ident, $n:literal) => {
        // SAFETY: the arm for N is taken only when TILES = N / 8, so both types are the same.
        unsafe { &mut *($acc as *mut [[f32; 4]; TILES]).cast::<[[f32; 4]; const { $n / 8 }]>() }
    };
}

/// `wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}` with A and B in shared memory, both
/// K-major: `acc` (this warp's 16 rows of the 64 × N result, as N/8 tiles in the mma.m16n8 layout)
/// = A·Bᵀ + (`accumulate` ? `acc` : 0), A = 64 × 16, B = N × 16. Asynchronous: commit, wait and
/// [`wgmma_fence_accumulator`] before reading `acc`. `accumulate` must be a compile-time
/// constant once inlined (a k-step index > 0): without it `acc` is written only.
#[inline(always)]
pub fn wgmma_ss<const TILES: usize>(
    acc: &mut [[f32; 4]; TILES],
    a: MatrixDescriptor,
    b: MatrixDescriptor,
    accumulate: bool,
    bf16: bool,
) {
    wgmma_shared::<TILES, false>(acc, a, b, accumulate, bf16)
}

/// `wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}` with A and B in shared memory, both
/// MN-major (`imm-trans-a` = `imm-trans-b` = 1): `acc` = A·B + (`accumulate` ? `acc` : 0), A =
/// 64 × 16 stored with its 64 rows contiguous (a 16-row slice of a `[k][m]` tile: dSᵀ read as
/// dS), B = 16 × N stored `[k][n]` (K_j's rows as B of dQ = dS·K_j). Asynchronous, as
/// [`wgmma_ss`].
#[inline(always)]
pub fn wgmma_ss_mn_major<const TILES: usize>(
    acc: &mut [[f32; 4]; TILES],
    a: MatrixDescriptor,
    b: MatrixDescriptor,
    accumulate: bool,
    bf16: bool,
) {
    wgmma_shared::<TILES, true>(acc, a, b, accumulate, bf16)
}

/// [`wgmma_ss`] (`MN_MAJOR` false) or [`wgmma_ss_mn_major`] (true).
#[inline(always)]
fn wgmma_shared<const TILES: usize, const MN_MAJOR: bool>(
    acc: &mut [[f32; 4]; TILES],
    a: MatrixDescriptor,
    b: MatrixDescriptor,
    accumulate: bool,
    bf16: bool,
) {
    const { check_width(TILES) };
    let scale = accumulate as u32;
    macro_rules! arm {
        ($n:literal, [$($t:literal)*]) => {{
            let acc = typed_accumulator!(acc, $n);
            // SAFETY: the descriptors name 1024-byte-aligned swizzled tiles in this block's
            // shared memory that TMA filled (the caller waited on their barrier) or that this
            // warpgroup wrote and fenced for the async proxy; all 128 threads of the warpgroup
            // execute this.
            unsafe {
                match (MN_MAJOR, bf16, accumulate) {
                    (false, true, true) => wgmma_asm!(ss "0, 0" "bf16" $n acc [$($t)*], a.0, b.0, scale),
                    (false, false, true) => wgmma_asm!(ss "0, 0" "f16" $n acc [$($t)*], a.0, b.0, scale),
                    (false, true, false) => wgmma_asm!(ss_zero "0, 0" "bf16" $n acc [$($t)*], a.0, b.0),
                    (false, false, false) => wgmma_asm!(ss_zero "0, 0" "f16" $n acc [$($t)*], a.0, b.0),
                    (true, true, true) => wgmma_asm!(ss "1, 1" "bf16" $n acc [$($t)*], a.0, b.0, scale),
                    (true, false, true) => wgmma_asm!(ss "1, 1" "f16" $n acc [$($t)*], a.0, b.0, scale),
                    (true, true, false) => wgmma_asm!(ss_zero "1, 1" "bf16" $n acc [$($t)*], a.0, b.0),
                    (true, false, false) => wgmma_asm!(ss_zero "1, 1" "f16" $n acc [$($t)*], a.0, b.0),
                }
            }
        }};
    }
    match_width!(TILES, arm)
}

/// `wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}` with A from registers and B in shared
/// memory, MN-major (`imm-trans-b`): `acc` = A·B + (`accumulate` ? `acc` : 0), A = this warp's 16
/// rows × 16 of the 64 × 16 A in the mma.m16n8k16 A-fragment layout, B = 16 × N. Asynchronous, as
/// [`wgmma_ss`]; `a` must be written before the [`wgmma_fence`] that precedes this.
#[inline(always)]
pub fn wgmma_rs<const TILES: usize>(
    acc: &mut [[f32; 4]; TILES],
    a: [u32; 4],
    b: MatrixDescriptor,
    accumulate: bool,
    bf16: bool,
) {
    const { check_width(TILES) };
    let scale = accumulate as u32;
    macro_rules! arm {
        ($n:literal, [$($t:literal)*]) => {{
            let acc = typed_accumulator!(acc, $n);
            // SAFETY: as for `wgmma_ss`; A is in registers.
            unsafe {
                if bf16 {
                    wgmma_asm!(rs "bf16" $n acc [$($t)*], a, b.0, scale)
                } else {
                    wgmma_asm!(rs "f16" $n acc [$($t)*], a, b.0, scale)
                }
            }
        }};
    }
    match_width!(TILES, arm)
}

/// Keeps the A fragments `fragments` of the register-A products alive until here (after the
/// [`wgmma_wait`] that retires them): the compiler sees the asm read them when it is issued, and
/// would otherwise reuse their registers for the next block's P̃ while the product still reads
/// them, which ptxas answers by serializing the wgmmas. Emits no instruction.
#[inline(always)]
pub fn wgmma_fence_fragments<const CHUNKS: usize>(fragments: &mut [[u32; 4]; CHUNKS]) {
    macro_rules! arm {
        ($($t:literal)*) => {{
            // SAFETY: the arm for CHUNKS reinterprets the array at its own length.
            let f = unsafe { &mut *(fragments as *mut [[u32; 4]; CHUNKS]).cast::<[[u32; 4]; const { [$($t),*].len() }]>() };
            // SAFETY: an empty asm; registers only.
            unsafe { wgmma_asm!(fence 0 f [$($t)*]) }
        }};
    }
    const {
        assert!(
            matches!(CHUNKS, 4 | 5 | 6 | 7 | 8 | 11),
            "no fence for this many P̃ fragments: add it to `wgmma_fence_fragments`"
        )
    };
    match CHUNKS {
        4 => arm!(0 1 2 3),
        5 => arm!(0 1 2 3 4),
        6 => arm!(0 1 2 3 4 5),
        7 => arm!(0 1 2 3 4 5 6),
        8 => arm!(0 1 2 3 4 5 6 7),
        11 => arm!(0 1 2 3 4 5 6 7 8 9 10),
        // SAFETY: the assertion above rejected every other count at compile time.
        _ => unsafe { core::hint::unreachable_unchecked() },
    }
}

/// Marks `acc` as produced here: after [`wgmma_wait`], so the compiler reads the accumulators
/// the products wrote, and writes them (a rescale) only after the wait. Emits no instruction.
#[inline(always)]
pub fn wgmma_fence_accumulator<const TILES: usize>(acc: &mut [[f32; 4]; TILES]) {
    const { check_width(TILES) };
    macro_rules! arm {
        ($n:literal, [$($t:literal)*]) => {{
            let acc = typed_accumulator!(acc, $n);
            // SAFETY: an empty asm; registers only.
            unsafe { wgmma_asm!(fence $n acc [$($t)*]) }
        }};
    }
    match_width!(TILES, arm)
}

// ---------------------------------------------------------------------------------------------
// mbarriers: arrival counts and TMA transaction bytes
// ---------------------------------------------------------------------------------------------

/// An mbarrier (8 bytes of shared memory, 8-byte aligned): a phase completes when its expected
/// arrivals have arrived and its expected transaction bytes have landed.
#[derive(Clone, Copy)]
pub struct MBarrier(pub SharedAddress);

impl MBarrier {
    /// `mbarrier.init.shared::cta.b64`: phase 0, expecting `arrivals` arrivals. One thread
    /// initialises; [`fence_barrier_init`] and a block barrier follow before anyone uses it.
    #[inline(always)]
    pub fn init(self, arrivals: u32) {
        // SAFETY: writes the barrier's 8 bytes in this block's shared memory.
        unsafe {
            asm!("mbarrier.init.shared::cta.b64 [{b}], {n};", b = in(reg32) self.0.0,
                 n = in(reg32) arrivals, options(nostack))
        }
    }

    /// `mbarrier.arrive.shared::cta.b64`: one arrival.
    #[inline(always)]
    pub fn arrive(self) {
        // SAFETY: an atomic update of an initialised barrier.
        unsafe {
            asm!("mbarrier.arrive.shared::cta.b64 _, [{b}];", b = in(reg32) self.0.0,
                 options(nostack))
        }
    }

    /// `mbarrier.arrive.expect_tx.shared::cta.b64`: one arrival, and `bytes` more transaction
    /// bytes expected this phase (the TMA copies that complete on this barrier).
    #[inline(always)]
    pub fn arrive_expect_bytes(self, bytes: u32) {
        // SAFETY: as for `arrive`.
        unsafe {
            asm!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n};",
                 b = in(reg32) self.0.0, n = in(reg32) bytes, options(nostack))
        }
    }

    /// `mbarrier.try_wait.parity.shared::cta.b64`: whether the phase of parity `parity` has
    /// completed (the hardware may suspend the thread a while before answering no).
    #[inline(always)]
    pub fn try_wait(self, parity: u32) -> bool {
        let done: u32;
        // SAFETY: reads an initialised barrier.
        unsafe {
            asm!("{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {parity}; selp.u32 {d}, 1, 0, p; }}",
                 b = in(reg32) self.0.0, parity = in(reg32) parity, d = out(reg32) done,
                 options(nostack))
        }
        done != 0
    }

    /// Waits until the phase of parity `parity` has completed. Shared-memory data that TMA
    /// copies completed on this barrier is visible afterwards.
    #[inline(always)]
    pub fn wait(self, parity: u32) {
        while !self.try_wait(parity) {}
    }
}

/// `fence.mbarrier_init.release.cluster`: makes barrier initialisations visible to the async
/// proxy (TMA) before a block barrier publishes them.
#[inline(always)]
pub fn fence_barrier_init() {
    // SAFETY: an ordering instruction.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) }
}

/// `fence.proxy.async.shared::cta`: orders this thread's generic-proxy writes to shared memory
/// (`st.shared` of the backward's dSᵀ) before async-proxy reads of it (a wgmma descriptor
/// operand). Each writing thread fences, then a barrier publishes the tile to the warpgroup.
#[inline(always)]
pub fn fence_proxy_async_shared() {
    // SAFETY: an ordering instruction.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) }
}

/// `fence.proxy.async.global`: orders this thread's generic-proxy accesses to global memory
/// against its async-proxy ones (bulk tensor reductions), both ways: deterministic mode's flag,
/// acquired before a reduction is issued and released after it has completed.
#[inline(always)]
pub fn fence_proxy_async_global() {
    // SAFETY: an ordering instruction.
    unsafe { asm!("fence.proxy.async.global;", options(nostack)) }
}

// ---------------------------------------------------------------------------------------------
// TMA
// ---------------------------------------------------------------------------------------------

/// A `CUtensorMap` (128 bytes, 64-byte aligned) the host encoded with `cuTensorMapEncodeTiled`
/// and copied to global memory; kernels take its generic address.
#[derive(Clone, Copy)]
pub struct TensorMap(pub u64);

impl TensorMap {
    /// `prefetch.tensormap`: brings the map into the TMA unit's cache before the first copy.
    #[inline(always)]
    pub fn prefetch(self) {
        // SAFETY: a prefetch of a valid global address; no architectural effect.
        unsafe { asm!("prefetch.tensormap [{m}];", m = in(reg64) self.0, options(nostack)) }
    }

    /// `cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes`: copies
    /// the box at `coords` (innermost first) of the map's 4-D tensor into shared memory at
    /// `destination`, in the map's swizzle; elements outside the tensor arrive as zeros. The
    /// box's bytes complete a transaction on `barrier`.
    ///
    /// # Safety
    /// `self` must be a valid tensor map in global memory; `destination` must be aligned as the
    /// swizzle needs (1024 bytes for 128-byte swizzle) with the box's bytes free inside the
    /// block's shared memory until `barrier` completes; `barrier` must expect the bytes.
    #[inline(always)]
    pub unsafe fn load_4d(self, destination: SharedAddress, coords: [i32; 4], barrier: MBarrier) {
        // SAFETY: the caller's contract.
        unsafe {
            asm!("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{d}], [{m}, {{{c0}, {c1}, {c2}, {c3}}}], [{b}];",
                 d = in(reg32) destination.0, m = in(reg64) self.0, c0 = in(reg32) coords[0],
                 c1 = in(reg32) coords[1], c2 = in(reg32) coords[2], c3 = in(reg32) coords[3],
                 b = in(reg32) barrier.0.0, options(nostack))
        }
    }

    /// [`TensorMap::load_4d`] with an L2 cache policy (`.L2::cache_hint`): the copy's lines
    /// stay in L2 with the policy's priority ([`create_l2_policy`]).
    ///
    /// # Safety
    /// As [`TensorMap::load_4d`].
    #[inline(always)]
    pub unsafe fn load_4d_hinted(
        self,
        destination: SharedAddress,
        coords: [i32; 4],
        barrier: MBarrier,
        policy: L2Policy,
    ) {
        // SAFETY: the caller's contract; the policy is one `createpolicy` made.
        unsafe {
            asm!("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [{d}], [{m}, {{{c0}, {c1}, {c2}, {c3}}}], [{b}], {p};",
                 d = in(reg32) destination.0, m = in(reg64) self.0, c0 = in(reg32) coords[0],
                 c1 = in(reg32) coords[1], c2 = in(reg32) coords[2], c3 = in(reg32) coords[3],
                 b = in(reg32) barrier.0.0, p = in(reg64) policy.0, options(nostack))
        }
    }

    /// `cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group`: copies the box in shared
    /// memory at `source` (laid out in the map's swizzle) to the map's 4-D tensor at `coords`
    /// (innermost first); elements of the box outside the tensor are not written. Joins this
    /// thread's open bulk group ([`bulk_commit_group`]); the source must not be written again
    /// before [`bulk_wait_group_read`] says it was read.
    ///
    /// # Safety
    /// `self` must be a valid tensor map of a global buffer this block may write; `source` must
    /// be aligned as the swizzle needs (1024 bytes for 128-byte swizzle), hold the box's bytes
    /// inside the block's shared memory, and its stores must be visible to the async proxy
    /// ([`fence_proxy_async_shared`] after them, then a barrier with the storing threads).
    #[inline(always)]
    pub unsafe fn store_4d(self, source: SharedAddress, coords: [i32; 4]) {
        // SAFETY: the caller's contract.
        unsafe {
            asm!("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [{m}, {{{c0}, {c1}, {c2}, {c3}}}], [{s}];",
                 m = in(reg64) self.0, c0 = in(reg32) coords[0], c1 = in(reg32) coords[1],
                 c2 = in(reg32) coords[2], c3 = in(reg32) coords[3], s = in(reg32) source.0,
                 options(nostack))
        }
    }

    /// `cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group.L2::cache_hint`:
    /// adds the box in shared memory at `source` (laid out in the map's swizzle) to the map's 4-D
    /// tensor at `coords` (innermost first), element by element, in L2, the lines kept with
    /// `policy`'s priority ([`create_l2_policy`]); elements of the box outside the tensor are
    /// dropped. Joins this thread's open bulk group ([`bulk_commit_group`]); the source must not
    /// be written again before [`bulk_wait_group_read`] says it was read.
    ///
    /// # Safety
    /// `self` must be a valid tensor map of a global buffer this block may add to; `source` must
    /// be aligned as the swizzle needs (1024 bytes for 128-byte swizzle), hold the box's bytes
    /// inside the block's shared memory, and its stores must be visible to the async proxy
    /// ([`fence_proxy_async_shared`] after them, then a barrier with the storing threads).
    #[inline(always)]
    pub unsafe fn reduce_add_4d_hinted(
        self,
        source: SharedAddress,
        coords: [i32; 4],
        policy: L2Policy,
    ) {
        // SAFETY: the caller's contract; the policy is one `createpolicy` made.
        unsafe {
            asm!("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group.L2::cache_hint [{m}, {{{c0}, {c1}, {c2}, {c3}}}], [{s}], {p};",
                 m = in(reg64) self.0, c0 = in(reg32) coords[0], c1 = in(reg32) coords[1],
                 c2 = in(reg32) coords[2], c3 = in(reg32) coords[3], s = in(reg32) source.0,
                 p = in(reg64) policy.0, options(nostack))
        }
    }
}

/// How long L2 keeps the lines a bulk copy brings or writes, against other traffic: the primary
/// priority of a cache policy.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum L2Priority {
    /// No hint: the copy is issued without a cache policy.
    Normal,
    /// Data read once (evicted before normal lines).
    EvictFirst,
    /// Data read again by other blocks soon (kept over normal lines).
    EvictLast,
}

/// A 64-bit L2 cache policy, the `.L2::cache_hint` operand of the bulk copies.
#[derive(Clone, Copy)]
pub struct L2Policy(u64);

/// `createpolicy.fractional.L2::evict_first.b64` or `….L2::evict_last.b64` with fraction 1.0:
/// a policy that gives every line the copy touches `priority` (`Normal` gives `evict_normal`).
/// Made where it is used, so that no register holds it across a loop.
#[inline(always)]
pub fn create_l2_policy(priority: L2Priority) -> L2Policy {
    let policy: u64;
    // SAFETY: computes a value in a register; no memory access.
    unsafe {
        match priority {
            L2Priority::Normal => asm!("createpolicy.fractional.L2::evict_normal.b64 {p}, 1.0;",
                                       p = out(reg64) policy, options(nostack)),
            L2Priority::EvictFirst => asm!("createpolicy.fractional.L2::evict_first.b64 {p}, 1.0;",
                                           p = out(reg64) policy, options(nostack)),
            L2Priority::EvictLast => asm!("createpolicy.fractional.L2::evict_last.b64 {p}, 1.0;",
                                          p = out(reg64) policy, options(nostack)),
        }
    }
    L2Policy(policy)
}

/// `cp.async.bulk.commit_group`: closes this thread's bulk group (the bulk copies and reductions
/// it issued since the last commit), so that [`bulk_wait_group_read`] can wait for it.
#[inline(always)]
pub fn bulk_commit_group() {
    // SAFETY: bookkeeping of this thread's bulk operations.
    unsafe { asm!("cp.async.bulk.commit_group;", options(nostack)) }
}

/// `cp.async.bulk.wait_group.read PENDING`: waits until at most `PENDING` of this thread's
/// committed bulk groups still read their shared-memory sources (their writes to global memory
/// may still be in flight): the sources may then be written again.
#[inline(always)]
pub fn bulk_wait_group_read<const PENDING: u32>() {
    // SAFETY: a wait on this thread's own bulk groups.
    unsafe { asm!("cp.async.bulk.wait_group.read {n};", n = const PENDING, options(nostack)) }
}

/// `cp.async.bulk.wait_group PENDING`: waits until at most `PENDING` of this thread's committed
/// bulk groups are incomplete, their writes to global memory done (before the block exits).
#[inline(always)]
pub fn bulk_wait_group<const PENDING: u32>() {
    // SAFETY: a wait on this thread's own bulk groups.
    unsafe { asm!("cp.async.bulk.wait_group {n};", n = const PENDING, options(nostack)) }
}

// ---------------------------------------------------------------------------------------------
// Warpgroup roles: registers and named barriers
// ---------------------------------------------------------------------------------------------

/// `setmaxnreg.dec.sync.aligned.u32 REGISTERS`: this warpgroup gives registers back to the SM
/// (the producer, which only issues copies). All 128 threads execute it.
#[inline(always)]
pub fn release_registers<const REGISTERS: u32>() {
    // SAFETY: lowers this warpgroup's register allocation; the code after it needs fewer.
    unsafe { asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const REGISTERS, options(nostack)) }
}

/// `setmaxnreg.inc.sync.aligned.u32 REGISTERS`: this warpgroup takes registers the producer gave
/// back (the consumers, which hold Õ and S). All 128 threads execute it.
#[inline(always)]
pub fn claim_registers<const REGISTERS: u32>() {
    // SAFETY: raises this warpgroup's register allocation; blocks until the SM has them.
    unsafe { asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const REGISTERS, options(nostack)) }
}

/// `bar.sync id, threads`: waits until `threads` threads (a multiple of 32) have arrived at named
/// barrier `id` (1–15; 0 is `sync_threads`'s).
#[inline(always)]
pub fn named_barrier_sync(id: u32, threads: u32) {
    // SAFETY: a barrier among the warps the caller names; they all reach it.
    unsafe {
        asm!("bar.sync {id}, {n};", id = in(reg32) id, n = in(reg32) threads, options(nostack))
    }
}

/// `bar.arrive id, threads`: arrives at named barrier `id` without waiting.
#[inline(always)]
pub fn named_barrier_arrive(id: u32, threads: u32) {
    // SAFETY: as for `named_barrier_sync`.
    unsafe {
        asm!("bar.arrive {id}, {n};", id = in(reg32) id, n = in(reg32) threads, options(nostack))
    }
}
