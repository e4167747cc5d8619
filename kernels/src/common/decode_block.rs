//! Where one split-KV decode block's work sits: its (batch, KV head), its split of the cached
//! keys, its rows of the KV head's query group, and which of its key steps the causal mask of the
//! new tokens touches. The decode kernels' counterpart of `common::block`.

use crate::common::mask::AttentionMask;
use crate::common::params::DecodeParams;

/// One split-KV decode block: its (batch, KV head), its split of the keys, its 16 query rows of
/// the KV head's group, and the sequence's length. Query row r of the group is query head
/// `kv_head·group + r / q_tokens` at token `r % q_tokens` (head-major), so one block serves every
/// query head that reads this KV head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeBlock {
    pub batch: u32,
    pub kv_head: u32,
    pub split: u32,
    /// The group's first row this block computes (a multiple of 16).
    pub first_row: u32,
    /// Query heads per KV head.
    pub group: u32,
    pub heads_q: u32,
    pub q_tokens: u32,
    /// Keys the sequence has (its cache length after this call's append).
    pub seqlen: u32,
    /// This split's keys: [key_start, key_end), key_end ≤ seqlen.
    pub key_start: u32,
    pub key_end: u32,
    pub causal: bool,
}

/// A query row of a decode call: its head and token, and its index in the (batch, heads_q,
/// q_tokens) statistics and workspace rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeRow {
    pub head: u32,
    pub token: u32,
    pub row_id: u32,
}

impl DecodeBlock {
    /// The block at grid position (`split`, `row_tile`, `batch_kv_head` = batch·heads_kv +
    /// KV head) of a call whose sequence has `seqlen` keys.
    #[inline(always)]
    pub fn new(
        p: &DecodeParams,
        split: u32,
        row_tile: u32,
        batch_kv_head: u32,
        seqlen: u32,
    ) -> Self {
        let key_start = split * p.split_keys;
        let split_end = key_start + p.split_keys;
        Self {
            batch: batch_kv_head / p.heads_kv,
            kv_head: batch_kv_head % p.heads_kv,
            split,
            first_row: row_tile * crate::decode::config::TILE_ROWS,
            group: p.heads_q / p.heads_kv,
            heads_q: p.heads_q,
            q_tokens: p.q_tokens,
            seqlen,
            key_start,
            key_end: if split_end < seqlen {
                split_end
            } else {
                seqlen
            },
            causal: p.causal != 0,
        }
    }

    /// Row `r` of the group, if it exists (the last row tile may be partly empty).
    #[inline(always)]
    pub fn row(&self, r: u32) -> Option<DecodeRow> {
        if r >= self.group * self.q_tokens {
            return None;
        }
        let head = self.kv_head * self.group + r / self.q_tokens;
        let token = r % self.q_tokens;
        Some(DecodeRow {
            head,
            token,
            row_id: (self.batch * self.heads_q + head) * self.q_tokens + token,
        })
    }

    /// The causal mask of the new tokens against the cache: token t is position
    /// seqlen − q_tokens + t of the sequence (a no-op when not causal).
    #[inline(always)]
    pub fn mask(&self) -> AttentionMask {
        AttentionMask::causal(self.causal, self.q_tokens, self.seqlen)
    }

    /// Whether the step of `step_keys` keys from `key_start` runs past the sequence or crosses
    /// the causal diagonal of the first token, so it runs with the element-wise mask.
    #[inline(always)]
    pub fn step_needs_mask(&self, key_start: u32, step_keys: u32) -> bool {
        key_start + step_keys > self.seqlen
            || self
                .mask()
                .tile_needs_mask(0, 1, key_start, key_start + step_keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_params(heads_q: u32, heads_kv: u32, q_tokens: u32, causal: bool) -> DecodeParams {
        DecodeParams {
            heads_q,
            heads_kv,
            q_tokens,
            split_keys: 128,
            causal: causal as u32,
            ..Default::default()
        }
    }

    #[test]
    fn decode_rows_are_head_major_within_the_group() {
        // 8 query heads on 2 KV heads, 3 tokens: KV head 1 of batch 1 serves heads 4..8.
        let p = decode_params(8, 2, 3, true);
        let block = DecodeBlock::new(&p, 2, 0, 3, 1000);
        assert_eq!((block.batch, block.kv_head, block.group), (1, 1, 4));
        assert_eq!((block.key_start, block.key_end), (256, 384));
        let row = block.row(5).unwrap();
        assert_eq!((row.head, row.token), (5, 2));
        assert_eq!(row.row_id, (8 + 5) * 3 + 2);
        assert_eq!(block.row(12), None);
        // The last split ends at the sequence's end.
        assert_eq!(DecodeBlock::new(&p, 7, 0, 3, 1000).key_end, 1000);
    }

    #[test]
    fn decode_steps_are_masked_at_the_tail_and_the_new_tokens_diagonal() {
        // 3 new tokens at the end of 100 keys: token 0 sees keys 0..=97, so the step [80, 96)
        // needs no mask and [96, 112) does (tail and diagonal).
        let block = DecodeBlock::new(&decode_params(4, 4, 3, true), 0, 0, 0, 100);
        assert!(!block.step_needs_mask(80, 16));
        assert!(block.step_needs_mask(96, 16));
        // 112 keys: token 0 sees 0..=109, so [96, 112) crosses the diagonal inside the sequence.
        let block = DecodeBlock::new(&decode_params(4, 4, 3, true), 0, 0, 0, 112);
        assert!(block.step_needs_mask(96, 16));
        assert!(
            !DecodeBlock::new(&decode_params(4, 4, 3, false), 0, 0, 0, 112).step_needs_mask(96, 16)
        );
        let mask = block.mask();
        assert!(mask.visible(0, 109) && !mask.visible(0, 110) && mask.visible(2, 111));
    }
}
