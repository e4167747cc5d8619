//! FA3's ping-pong between consumer warpgroups: named barriers that pass the turn to issue the
//! products from one warpgroup to the next.

use crate::arch;
use crate::fwd::fa3::config::WARPGROUP_THREADS;

/// Inter-warpgroup overlap (FlashAttention-3's ping-pong): the consumer warpgroups take turns
/// to issue their products, in order, so one's softmax runs while another's products run.
/// Consumer c waits at named barrier 1 + c; the one before it (cyclically) arrives there after
/// issuing its own. Every consumer of a block runs the same number of turns.
#[derive(Clone, Copy)]
pub(crate) struct GemmTurns {
    consumer: u32,
    consumers: u32,
    enabled: bool,
}

impl GemmTurns {
    /// Named barrier 0 is `sync_threads`'s.
    const FIRST_BARRIER: u32 = 1;
    /// A turn's barrier counts the warpgroup that waits and the one that hands over.
    const THREADS: u32 = 2 * WARPGROUP_THREADS;

    #[inline(always)]
    pub(crate) fn new(consumer: u32, consumers: u32, enabled: bool) -> Self {
        Self {
            consumer,
            consumers,
            enabled: enabled && consumers > 1,
        }
    }

    /// The last consumer hands the first its first turn.
    #[inline(always)]
    pub(crate) fn start(&self) {
        if self.enabled && self.consumer == self.consumers - 1 {
            arch::named_barrier_arrive(Self::FIRST_BARRIER, Self::THREADS);
        }
    }

    /// Waits for this warpgroup's turn.
    #[inline(always)]
    pub(crate) fn take(&self) {
        if self.enabled {
            arch::named_barrier_sync(Self::FIRST_BARRIER + self.consumer, Self::THREADS);
        }
    }

    /// Hands the turn to the next warpgroup.
    #[inline(always)]
    pub(crate) fn pass(&self) {
        if self.enabled {
            let next = (self.consumer + 1) % self.consumers;
            arch::named_barrier_arrive(Self::FIRST_BARRIER + next, Self::THREADS);
        }
    }

    /// The first consumer takes the hand-over left after the last turn, so no barrier ends
    /// the block with a partial count.
    #[inline(always)]
    pub(crate) fn finish(&self) {
        if self.consumer == 0 {
            self.take();
        }
    }
}
