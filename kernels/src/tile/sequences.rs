//! A packed launch's sequences as a kernel reads them (flash-attn's varlen batches): each block
//! finds its sequence's query rows and key rows, from the offsets table inside its own parameter
//! block ([`PackedTable`], offsets the host read) or from the caller's `cu_seqlens` in device
//! memory ([`DeviceOffsets`], offsets the host never read). The entry points run a packed kernel's
//! body once per kind ([`LaunchSequences`]), so each body reads its offsets one way only.

use crate::arch;
use crate::common::block::BlockInfo;
use crate::common::params::{AttentionShape, SEQUENCE_TABLE_LEN};

/// Where a kernel finds the sequence of a block of a packed launch.
pub trait Sequences: Copy {
    /// The query rows and key rows of the launch's sequence `sequence`: `[cu_seqlens_q[b],
    /// cu_seqlens_q[b + 1]]` and the same of K, inside the tensors.
    fn rows(&self, sequence: u32) -> ([u32; 2], [u32; 2]);

    /// Q's rows in the whole packed tensor (L's row length).
    fn total_q(&self) -> u32;

    /// The block of head `batch_head` (batch-major over the grid): in a kernel compiled for
    /// packed batches (`packed`, a constant there) its sequence's ([`BlockInfo::packed`]),
    /// else [`BlockInfo::of_form`]'s. `local` as there.
    #[inline(always)]
    fn block(
        &self,
        shape: &AttentionShape,
        batch_head: u32,
        packed: bool,
        local: bool,
    ) -> BlockInfo {
        if packed {
            let (query_rows, key_rows) = self.rows(batch_head / shape.heads);
            BlockInfo::packed(shape, batch_head, query_rows, key_rows, local)
        } else {
            BlockInfo::of_form(shape, batch_head, local)
        }
    }
}

/// The offsets table inside the launch's parameter block (`common::params::PackedSequences`),
/// read from the constant bank with [`arch::load_parameter_u32`]. The index (the block's sequence)
/// is the same for every thread, so ptxas reads it with `ULDC` into uniform registers, and the
/// loop over key blocks whose trip count the offsets set, the ring's stages and the TMA
/// coordinates derived from them stay on the uniform datapath, as a dense kernel's do from its
/// shape. The host checked these offsets.
#[derive(Clone, Copy)]
pub struct PackedTable {
    /// `.param` address of the table's first offset into Q's rows; 0 in a dense kernel.
    cu_seqlens_q: u64,
    /// Q's rows in the whole packed tensor.
    total_q: u32,
}

impl PackedTable {
    /// A dense kernel's: it reads no sequence.
    pub const NONE: Self = Self {
        cu_seqlens_q: 0,
        total_q: 0,
    };

    /// The table whose `cu_seqlens_q` starts at `.param` address `cu_seqlens_q`
    /// (`arch::kernel_parameters_address!` plus the field's offset), the `cu_seqlens_k`
    /// table right after it.
    #[inline(always)]
    pub fn new(cu_seqlens_q: u64, total_q: u32) -> Self {
        Self {
            cu_seqlens_q,
            total_q,
        }
    }
}

impl Sequences for PackedTable {
    #[inline(always)]
    fn rows(&self, sequence: u32) -> ([u32; 2], [u32; 2]) {
        let rows = |table: u64| {
            let first = table + 4 * sequence as u64;
            // SAFETY: the host launches one block row per sequence of the table, so sequence + 1
            // < SEQUENCE_TABLE_LEN, and both tables lie in the parameter block.
            unsafe {
                [
                    arch::load_parameter_u32(first),
                    arch::load_parameter_u32(first + 4),
                ]
            }
        };
        let cu_seqlens_k = self.cu_seqlens_q + 4 * SEQUENCE_TABLE_LEN as u64;
        (rows(self.cu_seqlens_q), rows(cu_seqlens_k))
    }

    #[inline(always)]
    fn total_q(&self) -> u32 {
        self.total_q
    }
}

/// The caller's `cu_seqlens_q` and `cu_seqlens_k` in device memory (int32, as flash-attn's), read
/// by each block before its first load: what a call whose offsets live on the GPU costs instead of
/// a host synchronization. Each loaded offset goes through [`arch::uniform_among_active`] (every
/// active lane loaded the same word), so what derives from it can stay on the uniform datapath,
/// as the table's does. The host never saw these values, so a block clamps its rows into the tensors
/// (`total_q`, `total_k`), and `BlockInfo::packed` its lengths to the grid's: wrong offsets give
/// wrong rows, never an access outside the tensors or the workspaces.
#[derive(Clone, Copy)]
pub struct DeviceOffsets {
    /// This launch's first sequence's offset into Q's rows, batch + 1 of them from there.
    cu_seqlens_q: *const u32,
    /// The same into K's and V's rows.
    cu_seqlens_k: *const u32,
    total_q: u32,
    total_k: u32,
}

impl DeviceOffsets {
    /// The offsets at device addresses `cu_seqlens_q` and `cu_seqlens_k` (4-byte aligned, one
    /// more than the launch's sequences each) into packed tensors of `total_q` and `total_k` rows.
    #[inline(always)]
    pub fn new(cu_seqlens_q: u64, cu_seqlens_k: u64, total_q: u32, total_k: u32) -> Self {
        Self {
            cu_seqlens_q: cu_seqlens_q as *const u32,
            cu_seqlens_k: cu_seqlens_k as *const u32,
            total_q,
            total_k,
        }
    }
}

impl Sequences for DeviceOffsets {
    #[inline(always)]
    fn rows(&self, sequence: u32) -> ([u32; 2], [u32; 2]) {
        let rows = |offsets: *const u32, total: u32| {
            let first = offsets.wrapping_add(sequence as usize);
            // SAFETY: the host launches one block row per sequence, and the caller's offsets
            // hold one more entry than the sequences (the host's contract with its caller).
            let [start, end] = unsafe { [arch::load(first), arch::load(first.wrapping_add(1))] }
                .map(arch::uniform_among_active);
            let end = end.min(total);
            [start.min(end), end]
        };
        (
            rows(self.cu_seqlens_q, self.total_q),
            rows(self.cu_seqlens_k, self.total_k),
        )
    }

    #[inline(always)]
    fn total_q(&self) -> u32 {
        self.total_q
    }
}

/// A packed launch's sequences, one kind or the other: an entry point matches on it and runs
/// its kernel's body once per arm, each compiled for its own [`Sequences`] (the table's body stays
/// on the uniform datapath). A dense form's block gives `InParameters(PackedTable::NONE)`, whose
/// other arm the compiler drops.
#[derive(Clone, Copy)]
pub enum LaunchSequences {
    InParameters(PackedTable),
    InDeviceMemory(DeviceOffsets),
}
