//! The persistent FA3 forward's hand-off of tile numbers from the producer warp to the consumer
//! warpgroups: one word of shared memory between two named barriers, FlashAttention-3's
//! `DynamicPersistentTileScheduler` (its `TileCountSmemFull` and `TileCountSmemEmpty`).
//!
//! ```text
//!  producer warp                          consumer warpgroups
//!   [tile n > 0: sync EMPTY]                sync FULL
//!   lane 0 writes tile n's number           read tile n's number
//!   arrive FULL                             [a tile, not the end mark: arrive EMPTY]
//! ```
//!
//! The q_full and q_empty mbarriers order the word as well (release on arrive, acquire on the
//! wait), but compute-sanitizer's racecheck does not take an mbarrier as ordering plain shared
//! accesses: with the word between those alone it reported the producer's store and the
//! consumers' load as a race (issue #31). Named barriers it does take, so the hand-off is one the
//! tool can check, at the cost of one barrier a tile on each side, where neither waits: the
//! producer publishes tile n as it starts its loads, long before Q_i lands, and the consumers
//! release the word right after reading it.

use crate::arch::{self, SharedAddress};
use crate::fwd::fa3::config::WARPGROUP_THREADS;

/// Named barriers: 0 is `sync_threads`'s, 1 to 3 the ping-pong's (`GemmTurns`, one per consumer
/// warpgroup, at most 3 by `Fa3Config::CHECKED`).
const FULL: u32 = 4;
const EMPTY: u32 = 5;

/// The tile-number word and the barriers around it, for a block of `consumers` warpgroups.
#[derive(Clone, Copy)]
pub(crate) struct TileHandOff {
    slot: SharedAddress,
    /// The producer warp and every consumer thread.
    threads: u32,
}

impl TileHandOff {
    #[inline(always)]
    pub(crate) fn new(slot: SharedAddress, consumers: u32) -> Self {
        Self {
            slot,
            threads: arch::WARP_SIZE + consumers * WARPGROUP_THREADS,
        }
    }

    /// The producer warp, all lanes together: publishes tile number `t`, the `n`-th of this block
    /// (an end mark, past the problem, is the last).
    #[inline(always)]
    pub(crate) fn publish(&self, n: u32, t: u32) {
        if n > 0 {
            // Every consumer thread has read the previous number.
            arch::named_barrier_sync(EMPTY, self.threads);
        }
        if arch::lane_idx() == 0 {
            // SAFETY: a word of the block's shared memory past the barriers (`shared_bytes` counts
            // it); no consumer reads it between the EMPTY barrier above and FULL below.
            unsafe { self.slot.store_u32(t) }
        }
        arch::named_barrier_arrive(FULL, self.threads);
    }

    /// A consumer thread: the next tile number, once the producer has published it.
    #[inline(always)]
    pub(crate) fn receive(&self) -> u32 {
        arch::named_barrier_sync(FULL, self.threads);
        // SAFETY: as for `publish`: the producer writes it again only after every consumer
        // thread's `release`.
        unsafe { self.slot.load_u32() }
    }

    /// A consumer thread is done reading the number of a tile (not the end mark: the producer
    /// publishes nothing after it).
    #[inline(always)]
    pub(crate) fn release(&self) {
        arch::named_barrier_arrive(EMPTY, self.threads);
    }
}
