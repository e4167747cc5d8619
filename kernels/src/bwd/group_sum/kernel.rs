//! The group sum, the grouped backward's last kernel. With grouped K/V heads (query head h
//! reads K/V head h / group) the gradient of K/V head k is the sum over its group's query heads:
//!
//! ```text
//! dK_k = Σ_{m < group} dK_{k·group + m},   dV_k likewise,
//! ```
//!
//! where dK_h is what the main kernel computes for query head h alone (it stores it, rounded to
//! the input dtype, in the expanded workspace, one head per query head). The terms are added
//! in f32 in the order of m, then rounded once: the same bits on every run.

use super::config::ROWS;
use crate::arch;
use crate::common::block::KvGroup;
use crate::common::element::Element;
use crate::common::params::GroupSumParams;
use crate::tile::global::HeadRows;
use crate::tile::shared::for_each_element;

/// dK (grid z = 0) or dV (z = 1) of [`ROWS`] rows of one K/V head, summed over its group.
/// Grid (⌈seqlen_k / ROWS⌉, batch·heads_kv, 2), `config::THREADS` threads, no shared memory.
#[inline(always)]
pub fn group_sum<T: Element>(p: &GroupSumParams) {
    let shape = &p.shape;
    let group = KvGroup::new(shape, arch::block_idx_y());
    let (expanded, sum) = if arch::block_idx_z() == 0 {
        (p.expanded_dk, &p.dk)
    } else {
        (p.expanded_dv, &p.dv)
    };
    let sum = HeadRows::<T>::new(sum, group.batch, group.kv_head, group.seqlen_k);
    let row_start = arch::block_idx_x() * ROWS;
    for_each_element(ROWS, shape.head_dim, |r, col| {
        let row = row_start + r;
        let mut total = 0.0f32;
        for m in 0..group.size {
            let member = HeadRows::<T>::contiguous(
                expanded,
                group.first_batch_head + m,
                group.seqlen_k,
                shape.head_dim,
            );
            total += member.read(row, col);
        }
        sum.write(row, col, total);
    });
}
