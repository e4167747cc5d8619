//! Tensors in device memory, seen by one (batch, head): rows to read and write with bounds
//! checks and conversions, and per-row statistics vectors.

use crate::arch;
use crate::common::block::BlockInfo;
use crate::common::element::Element;
use crate::common::params::TensorView;

/// The rows of one (batch, head) of a (batch, heads, seqlen, head_dim) tensor in device memory.
#[derive(Clone, Copy)]
pub struct HeadRows<T> {
    base: *mut T,
    row_stride: u64,
    /// Rows that exist (seqlen); reads beyond are zero and writes beyond are dropped.
    rows: u32,
}

impl<T: Element> HeadRows<T> {
    #[inline(always)]
    pub fn new(view: &TensorView, batch: u32, head: u32, rows: u32) -> Self {
        let base = (view.addr as *mut T).wrapping_add(view.head_offset(batch, head) as usize);
        Self {
            base,
            row_stride: view.row_stride,
            rows,
        }
    }

    /// Rows of a contiguous (batch·heads, rows, row_len) buffer, for head `batch_head`.
    #[inline(always)]
    pub fn contiguous(addr: u64, batch_head: u32, rows: u32, row_len: u32) -> Self {
        let row_stride = row_len as u64;
        let base =
            (addr as *mut T).wrapping_add((batch_head as u64 * rows as u64 * row_stride) as usize);
        Self {
            base,
            row_stride,
            rows,
        }
    }

    /// The same rows from row `first_row` of the head on (a sequence of a packed batch), `rows`
    /// of them.
    #[inline(always)]
    pub fn starting_at(self, first_row: u32) -> Self {
        Self {
            base: self
                .base
                .wrapping_add((first_row as u64 * self.row_stride) as usize),
            ..self
        }
    }

    #[inline(always)]
    fn element(&self, row: u32, col: u32) -> *mut T {
        self.base
            .wrapping_add((row as u64 * self.row_stride + col as u64) as usize)
    }

    /// Element (row, col) as f32, or 0 for a row past the end.
    #[inline(always)]
    pub fn read(&self, row: u32, col: u32) -> f32 {
        if row < self.rows {
            // SAFETY: row < rows and the host checked col < row length, so the address is inside
            // the tensor the host described.
            unsafe { arch::load(self.element(row, col)) }.to_f32()
        } else {
            0.0
        }
    }

    /// Stores `value` (rounded to T) at (row, col); a row past the end is dropped.
    #[inline(always)]
    pub fn write(&self, row: u32, col: u32, value: f32) {
        if row < self.rows {
            // SAFETY: as for `read`.
            unsafe { arch::store(self.element(row, col), T::from_f32(value)) }
        }
    }
}

/// Per-row f32 statistics of one head in device memory (m, ℓ or L), `rows` long.
#[derive(Clone, Copy)]
pub struct HeadVector {
    base: *mut f32,
}

impl HeadVector {
    #[inline(always)]
    pub fn new(addr: u64, batch_head: u32, rows: u32) -> Self {
        Self {
            base: (addr as *mut f32).wrapping_add(batch_head as usize * rows as usize),
        }
    }

    /// Head `head`'s vector of a packed batch's (heads, total_q) statistics, from the sequence's
    /// first query row `q_start` on (flash-attn's varlen layout of L).
    #[inline(always)]
    pub fn packed(addr: u64, head: u32, total_q: u32, q_start: u32) -> Self {
        Self {
            base: (addr as *mut f32)
                .wrapping_add(head as usize * total_q as usize + q_start as usize),
        }
    }

    /// The vector of the block `info`'s head and sequence: [`HeadVector::packed`] in a kernel
    /// compiled for packed batches (`packed`, a constant there; Q's rows in all `total_q`), else
    /// [`HeadVector::new`].
    #[inline(always)]
    pub fn of_block(addr: u64, info: &BlockInfo, packed: bool, total_q: u32) -> Self {
        if packed {
            Self::packed(addr, info.head, total_q, info.q_start)
        } else {
            Self::new(addr, info.batch_head, info.seqlen_q)
        }
    }

    #[inline(always)]
    pub fn read(&self, row: u32) -> f32 {
        // SAFETY: kernels pass rows < seqlen_q; the host allocated batch·heads·seqlen_q floats.
        unsafe { arch::load(arch::offset(self.base, row as usize)) }
    }

    #[inline(always)]
    pub fn write(&self, row: u32, value: f32) {
        // SAFETY: as for `read`.
        unsafe { arch::store(arch::offset(self.base, row as usize), value) }
    }

    /// Where a 4-byte copy of `row` reads from, and whether it reads at all (`row < rows`): rows
    /// past the end read nothing (the copy zero-fills), from an address inside the vector.
    #[inline(always)]
    pub fn copy_source(&self, row: u32, rows: u32) -> (*const u8, bool) {
        let valid = row < rows;
        let row = if valid { row } else { 0 };
        (self.base.wrapping_add(row as usize) as *const u8, valid)
    }
}

/// One head's rows of an f32 accumulator in device memory, contiguous (batch·heads, rows,
/// row_len), that many blocks add to at once (the backward pass's dQ).
#[derive(Clone, Copy)]
pub struct HeadAccumulator {
    rows: HeadRows<f32>,
}

impl HeadAccumulator {
    #[inline(always)]
    pub fn new(addr: u64, batch_head: u32, rows: u32, row_len: u32) -> Self {
        Self {
            rows: HeadRows::contiguous(addr, batch_head, rows, row_len),
        }
    }

    /// The rows of the block `info`'s head and sequence: in a kernel compiled for packed
    /// batches (`packed`, a constant there; the accumulator (heads, total_q, row_len), as the
    /// packed Q) its sequence's seqlen_q rows from its first, so no add reaches another
    /// sequence's; else [`HeadAccumulator::new`]'s.
    #[inline(always)]
    pub fn of_block(addr: u64, info: &BlockInfo, packed: bool, total_q: u32, row_len: u32) -> Self {
        if packed {
            let head = HeadRows::contiguous(addr, info.head, total_q, row_len);
            Self {
                rows: HeadRows {
                    rows: info.seqlen_q,
                    ..head.starting_at(info.q_start)
                },
            }
        } else {
            Self::new(addr, info.batch_head, info.seqlen_q, row_len)
        }
    }

    /// Element (row, col), or 0 for a row past the end.
    #[inline(always)]
    pub fn read(&self, row: u32, col: u32) -> f32 {
        self.rows.read(row, col)
    }

    /// Stores `value` at (row, col); a row past the end is dropped.
    #[inline(always)]
    pub fn write(&self, row: u32, col: u32, value: f32) {
        self.rows.write(row, col, value)
    }

    /// The 8 elements from (row, col) on (32 bytes, two 16-byte loads without caching in L1),
    /// or zeros for a row past the end or when `column_exists` is false (past the row).
    #[inline(always)]
    pub fn load_chunk(&self, row: u32, col: u32, column_exists: bool) -> [f32; 8] {
        let mut values = [0.0; 8];
        if row < self.rows.rows && column_exists {
            let first = self.rows.element(row, col) as *const u8;
            // SAFETY: row < rows and the kernel passes col + 8 ≤ row_len, a multiple of 8: both
            // halves lie inside the accumulator the host allocated (256-byte-aligned, rows of a
            // multiple of 8 floats), 16-byte aligned; no thread writes it during the kernel.
            let halves = unsafe {
                [
                    arch::load_streaming_16(first),
                    arch::load_streaming_16(first.wrapping_add(16)),
                ]
            };
            for (i, bits) in halves.as_flattened().iter().enumerate() {
                values[i] = f32::from_bits(*bits);
            }
        }
        values
    }

    /// Stores 8 elements from (row, col) on (two 16-byte stores); dropped for a row past the
    /// end or when `column_exists` is false. Alignment as for [`Self::load_chunk`].
    #[inline(always)]
    pub fn store_chunk(&self, row: u32, col: u32, column_exists: bool, values: [f32; 8]) {
        if row < self.rows.rows && column_exists {
            let first = self.rows.element(row, col) as *mut u8;
            let bits = values.map(f32::to_bits);
            // SAFETY: as for `load_chunk`; this thread may write the accumulator.
            unsafe {
                arch::store_global_16(first, [bits[0], bits[1], bits[2], bits[3]]);
                arch::store_global_16(first.wrapping_add(16), [bits[4], bits[5], bits[6], bits[7]]);
            }
        }
    }

    /// Adds `value` to (row, col) atomically; a row past the end is dropped.
    #[inline(always)]
    pub fn add(&self, row: u32, col: u32, value: f32) {
        if row < self.rows.rows {
            // SAFETY: row < rows and the kernel passes col < row_len: inside the accumulator
            // the host allocated, 4-byte aligned.
            unsafe { arch::atomic_add_f32(self.rows.element(row, col), value) }
        }
    }
}

/// One head's rows of a 16-bit tensor in device memory, byte-addressed: the source of 16-byte
/// `cp.async` copies and loads, and the destination of two-element (4-byte) and 16-byte stores.
#[derive(Clone, Copy)]
pub struct HeadRows16 {
    base: *const u8,
    row_bytes: u64,
    /// Rows that exist (seqlen); copies of rows beyond are zero-filled, stores beyond dropped
    /// by the caller.
    rows: u32,
}

impl HeadRows16 {
    #[inline(always)]
    pub fn new(view: &TensorView, batch: u32, head: u32, rows: u32) -> Self {
        let base =
            (view.addr as *const u8).wrapping_add(view.head_offset(batch, head) as usize * 2);
        Self {
            base,
            row_bytes: view.row_stride * 2,
            rows,
        }
    }

    /// The same rows from row `first_row` of the head on (a sequence of a packed batch).
    #[inline(always)]
    pub fn starting_at(self, first_row: u32) -> Self {
        Self {
            base: self
                .base
                .wrapping_add((first_row as u64 * self.row_bytes) as usize),
            ..self
        }
    }

    /// Where a 16-byte copy of (row, col) reads from, and whether it reads at all: rows past the
    /// end read nothing (the copy zero-fills), from an address inside the tensor.
    /// `column_exists`: false for a column past the tensor's row (read nothing either).
    #[inline(always)]
    pub fn copy_source(&self, row: u32, col: u32, column_exists: bool) -> (*const u8, bool) {
        let valid = row < self.rows && column_exists;
        let source = if valid {
            self.element(row, col)
        } else {
            self.base
        };
        (source, valid)
    }

    #[inline(always)]
    fn element(&self, row: u32, col: u32) -> *const u8 {
        self.base
            .wrapping_add((row as u64 * self.row_bytes + col as u64 * 2) as usize)
    }

    /// The 16 bytes (8 elements) at (row, col), or zeros for a row past the end or when
    /// `column_exists` is false (a chunk past the row), read without caching in L1
    /// (`ld.global.nc`): for a tensor no thread writes while the kernel runs.
    ///
    /// The host checked that the view's address and strides are multiples of 8 elements, and
    /// kernels pass a col that is a multiple of 8: the load is 16-byte aligned.
    #[inline(always)]
    pub fn load_chunk(&self, row: u32, col: u32, column_exists: bool) -> [u32; 4] {
        if row < self.rows && column_exists {
            // SAFETY: inside the tensor the host described (row < rows, col + 8 ≤ its row
            // length), 16-byte aligned (see above), and not written during the kernel.
            unsafe { arch::load_streaming_16(self.element(row, col)) }
        } else {
            [0; 4]
        }
    }

    /// Stores 16 bytes (8 packed elements) at (row, col); dropped for a row past the end or
    /// when `column_exists` is false. Alignment as for [`Self::load_chunk`].
    #[inline(always)]
    pub fn store_chunk(&self, row: u32, col: u32, column_exists: bool, value: [u32; 4]) {
        if row < self.rows && column_exists {
            // SAFETY: as for `load_chunk`; the tensor is an output of the kernel.
            unsafe { arch::store_global_16(self.element(row, col) as *mut u8, value) }
        }
    }

    /// Stores two packed 16-bit elements at (row, col) and (row, col + 1).
    ///
    /// The caller passes row < rows and col + 1 < the row length; the host checked that strides
    /// are multiples of 8 elements, so the 4-byte store is aligned.
    #[inline(always)]
    pub fn store_pair(&self, row: u32, col: u32, packed: u32) {
        let address = self.element(row, col);
        // SAFETY: inside the tensor the host described (see above), 4-byte aligned.
        unsafe { arch::store(address as *mut u32, packed) }
    }
}

/// Element `index` of an f32 table in device memory at `addr` (ALiBi's slopes,
/// `common::alibi`).
#[inline(always)]
pub fn read_f32(addr: u64, index: u32) -> f32 {
    // SAFETY: the host checked that the table holds every index a launch reads (one per query
    // head of each of its sequences) and that `addr` is 4-byte aligned.
    unsafe { arch::load((addr as *const f32).wrapping_add(index as usize)) }
}

/// The persistent grid's two counters, consecutive u32s in global memory that start a launch at
/// zero: the next tile to hand out (past the first `grid` tiles, which the blocks' indices name)
/// and the blocks that have finished taking tiles. The last block to finish sets both back to
/// zero, so the next launch on the stream finds them as this one did without a memset.
#[derive(Clone, Copy)]
pub struct TileCounters {
    base: *mut u32,
}

impl TileCounters {
    #[inline(always)]
    pub fn new(addr: u64) -> Self {
        Self {
            base: addr as *mut u32,
        }
    }

    /// The next tile number after the grid's first `grid` ones (FlashAttention-3's dynamic
    /// scheduler: blocks that finish early take more tiles).
    #[inline(always)]
    pub fn take(&self, grid: u32) -> u32 {
        // SAFETY: the host passes two zeroed u32s that only this launch's atomics touch.
        grid + unsafe { arch::atomic_fetch_add_u32(self.base, 1) }
    }

    /// This block takes no more tiles; the last of the `grid` blocks resets both counters.
    #[inline(always)]
    pub fn finish(&self, grid: u32) {
        // SAFETY: as for `take`; the second counter is the next u32.
        unsafe {
            let finished = arch::offset(self.base, 1);
            if arch::atomic_fetch_add_u32(finished, 1) == grid - 1 {
                // Every block has taken its last number: nothing reads the counters again.
                arch::atomic_store_u32(self.base, 0);
                arch::atomic_store_u32(finished, 0);
            }
        }
    }
}

/// The one-launch split-KV kernel's arrival counters: one u32 per (batch·KV head, row tile)
/// group in global memory, zero between launches, counting the group's splits that have stored
/// their partial results. The block that arrives last merges the group's splits and sets its
/// counter back to zero, so the next launch on the stream finds it as this one did, without a
/// memset (as [`TileCounters`] do).
#[derive(Clone, Copy)]
pub struct SplitArrivals {
    counter: *mut u32,
}

impl SplitArrivals {
    /// The counter of `group` (`batch_kv_head · row_tiles + row_tile`) at `addr`.
    #[inline(always)]
    pub fn new(addr: u64, group: u32) -> Self {
        Self {
            counter: (addr as *mut u32).wrapping_add(group as usize),
        }
    }

    /// One thread's arrival for its block, after a barrier over the block's partial stores:
    /// whether this block is the last of the group's `arrivals`. The last one also sees every
    /// other block's stores (acquire) and resets the counter for the next launch.
    #[inline(always)]
    pub fn arrive_last(&self, arrivals: u32) -> bool {
        // SAFETY: the host allocated and zeroed one u32 per group (`group` < their count); while
        // the kernel runs only these atomics touch them.
        unsafe {
            let last = arch::arrive_acq_rel_u32(self.counter) == arrivals - 1;
            if last {
                // Every block of the group has arrived: nothing reads the counter again.
                arch::atomic_store_u32(self.counter, 0);
            }
            last
        }
    }
}

/// One u32 flag per (batch·head, row block) in device memory, zeroed by the host: the order in
/// which the key blocks of a head add to a row block's dQ (the deterministic backward). Key
/// block j waits until the flag of row block i reads j, adds, and releases j + 1, so the adds
/// land in the order j = 0, 1, … on every run. Key block j − 1 has the lower block index and
/// was started first, so a waiting block never waits on one that cannot run.
#[derive(Clone, Copy)]
pub struct RowBlockFlags {
    base: *mut u32,
}

impl RowBlockFlags {
    /// Head `batch_head`'s flags of `row_blocks` row blocks, at `addr`.
    #[inline(always)]
    pub fn new(addr: u64, batch_head: u32, row_blocks: u32) -> Self {
        Self {
            base: (addr as *mut u32).wrapping_add(batch_head as usize * row_blocks as usize),
        }
    }

    /// Thread 0 waits until the flag of `row_block` reads `turn`; then the whole block
    /// continues (a barrier), seeing every add made before that release.
    #[inline(always)]
    pub fn wait_for_turn(&self, row_block: u32, turn: u32) {
        if arch::thread_idx_x() == 0 {
            self.wait_for_turn_alone(row_block, turn);
        }
        arch::sync_threads();
    }

    /// After every thread of the block has made its adds (a barrier), thread 0 passes the turn
    /// of `row_block` to the next key block.
    #[inline(always)]
    pub fn pass_turn(&self, row_block: u32) {
        arch::sync_threads();
        if arch::thread_idx_x() == 0 {
            self.pass_turn_alone(row_block);
        }
    }

    /// This thread waits until the flag of `row_block` reads `turn` (the caller orders the
    /// block's other threads after it, or has one thread make the adds).
    #[inline(always)]
    pub fn wait_for_turn_alone(&self, row_block: u32, turn: u32) {
        let flag = self.base.wrapping_add(row_block as usize);
        // SAFETY: row_block < row_blocks: inside the flags the host allocated and zeroed.
        while unsafe { arch::load_acquire_u32(flag) } != turn {}
    }

    /// This thread passes the turn of `row_block` to the next key block: every add it has seen
    /// performed is visible to the thread that acquires the new value.
    #[inline(always)]
    pub fn pass_turn_alone(&self, row_block: u32) {
        // SAFETY: as for `wait_for_turn_alone`.
        unsafe { arch::release_add_u32(self.base.wrapping_add(row_block as usize), 1) };
    }
}
