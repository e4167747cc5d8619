//! Which thread of a row-streaming pass owns which 16-byte chunk of which row (the backward's
//! wide pre- and post-pass, `bwd::fa2::kernel::preprocess_wide`): plain arithmetic, shared by
//! the kernels and the host, which sizes the grid with [`ChunkLanes::rows_per_block`].
//!
//! A row of d 16-bit elements is d/8 chunks of 16 bytes (8 elements; 32 bytes of an f32 row). A
//! warp's lanes split into groups of G = d/8 rounded up to a power of two (1 to 32 lanes): one
//! group per row, lane c of the group on chunk c (columns 8c .. 8c + 8); lanes c ≥ d/8 hold no
//! chunk and add 0 to the row's sum, which a butterfly over the group's G lanes reduces. A block
//! of T threads covers T/G consecutive rows per step, thread t on row t/G of each step, and
//! `STEPS` steps one after another, so each warp reads consecutive rows and each thread has
//! `STEPS` chunks of each tensor in flight at once.
//!
//! ```text
//!  d = 128: G = 16, 2 rows per warp, 16 rows per step of 256 threads, 32 per block (2 steps)
//!    warp 0:  lanes 0–15 → row 0, chunks 0–15      lanes 16–31 → row 1, chunks 0–15
//!  d = 40:  G = 8, 4 rows per warp: lanes 8r + 0..5 hold chunks 0–4, lanes 8r + 5..8 none
//!  d = 256: G = 32, one row per warp, every lane one chunk
//! ```

/// 16-bit elements in one 16-byte chunk.
pub const CHUNK_ELEMENTS: u32 = 8;

/// Lanes of a warp.
const WARP_LANES: u32 = 32;

/// The largest head dim the layout takes: one chunk per lane of a warp.
pub const MAX_HEAD_DIM: u32 = CHUNK_ELEMENTS * WARP_LANES;

/// One thread's chunks of a row-streaming pass over 16-bit rows of `head_dim` elements, `STEPS`
/// rows per thread (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkLanes<const STEPS: usize> {
    /// G: lanes per row, a power of two ≥ d/8.
    group: u32,
    /// The block's row of this thread in its first step (the block's first row plus t/G).
    first_row: u32,
    /// Rows one step of the block covers (T/G): the distance between this thread's rows.
    rows_per_step: u32,
    /// Its chunk's first column (8c).
    col: u32,
    /// Whether its chunk lies inside the row (c < d/8).
    in_row: bool,
}

impl<const STEPS: usize> ChunkLanes<STEPS> {
    /// Lanes per row at `head_dim` (a multiple of 8, at most [`MAX_HEAD_DIM`]): d/8 rounded up
    /// to a power of two.
    pub const fn group(head_dim: u32) -> u32 {
        head_dim.div_ceil(CHUNK_ELEMENTS).next_power_of_two()
    }

    /// Rows one block of `threads` threads (a multiple of 32) covers at `head_dim`.
    pub const fn rows_per_block(head_dim: u32, threads: u32) -> u32 {
        threads / Self::group(head_dim) * STEPS as u32
    }

    /// Thread `thread` of block `block` (of `threads` threads) at `head_dim`.
    pub const fn new(head_dim: u32, threads: u32, block: u32, thread: u32) -> Self {
        let group = Self::group(head_dim);
        let chunk = thread % group;
        Self {
            group,
            first_row: block * Self::rows_per_block(head_dim, threads) + thread / group,
            rows_per_step: threads / group,
            col: chunk * CHUNK_ELEMENTS,
            in_row: chunk < head_dim / CHUNK_ELEMENTS,
        }
    }

    /// This thread's row (of the head) in each step.
    #[inline(always)]
    pub fn rows(&self) -> [u32; STEPS] {
        core::array::from_fn(|step| self.first_row + step as u32 * self.rows_per_step)
    }

    /// The first column of this thread's chunk.
    #[inline(always)]
    pub const fn col(&self) -> u32 {
        self.col
    }

    /// Whether this thread's chunk lies inside the row (else it reads and writes nothing).
    #[inline(always)]
    pub const fn in_row(&self) -> bool {
        self.in_row
    }

    /// G: the lanes that share each of this thread's rows (a power of two, aligned in the warp:
    /// a butterfly over lane masks G/2, …, 1 stays inside the group).
    #[inline(always)]
    pub const fn lanes_per_row(&self) -> u32 {
        self.group
    }

    /// Whether this thread holds the row's first chunk: the lane that writes a per-row result.
    #[inline(always)]
    pub const fn leads_row(&self) -> bool {
        self.col == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;

    const THREADS: u32 = 256;

    /// Every (row, chunk) of a block's rows is owned by exactly one (thread, step); idle lanes
    /// are past d/8; each row's lanes are one aligned group inside one warp, led by chunk 0.
    #[test]
    fn every_chunk_of_a_block_has_one_owner_at_every_head_dim() {
        for d in (8..=MAX_HEAD_DIM).step_by(8) {
            let rows = ChunkLanes::<2>::rows_per_block(d, THREADS);
            let chunks = d / CHUNK_ELEMENTS;
            let block = 3;
            let mut owners = vec![0u32; (rows * chunks) as usize];
            let mut leaders = vec![0u32; rows as usize];
            for thread in 0..THREADS {
                let lanes = ChunkLanes::<2>::new(d, THREADS, block, thread);
                let group = lanes.lanes_per_row();
                assert!(
                    group.is_power_of_two() && group >= chunks && group <= 32,
                    "d {d}"
                );
                assert_eq!(lanes.in_row(), lanes.col() / CHUNK_ELEMENTS < chunks);
                for row in lanes.rows() {
                    let local = row - block * rows;
                    assert!(local < rows, "d {d}: thread {thread} row {row}");
                    // The row's lanes: threads t/G·G .. +G, inside one warp.
                    let first = thread / group * group;
                    assert_eq!(first / 32, (first + group - 1) / 32, "d {d}");
                    if lanes.in_row() {
                        owners[(local * chunks + lanes.col() / CHUNK_ELEMENTS) as usize] += 1;
                    }
                    if lanes.leads_row() {
                        leaders[local as usize] += 1;
                    }
                }
            }
            assert!(owners.iter().all(|&n| n == 1), "d {d}: {owners:?}");
            assert!(leaders.iter().all(|&n| n == 1), "d {d}: {leaders:?}");
        }
    }

    #[test]
    fn groups_and_rows_per_block() {
        let group = ChunkLanes::<2>::group;
        assert_eq!(
            [8, 40, 64, 72, 128, 136, 200, 256].map(group),
            [1, 8, 8, 16, 16, 32, 32, 32]
        );
        let rows = |d| ChunkLanes::<2>::rows_per_block(d, THREADS);
        assert_eq!([rows(8), rows(64), rows(128), rows(256)], [512, 64, 32, 16]);
    }
}
