//! CPU tests of the FA1 and FA2 emulators: their outputs against the f64 reference, their HBM
//! counts against the article's formulas (exactly, element by element), and the IO table against
//! the emulators.

use flash_attn::DType;
use flash_attn::attention::{Algorithm, fa1_blocks, fa2_blocks};
use flash_attn::{Error, Result};
use flash_attn_lab::model::fa1::emulate_fa1;
use flash_attn_lab::model::fa2::emulate_fa2;
use flash_attn_lab::model::formulas::{fa1_formula, fa2_formula, standard_formula};
use flash_attn_lab::model::io_table::{H200_SHARED_MEMORY_PER_BLOCK, io_table, io_table_markdown};
use flash_attn_lab::model::prediction::{
    IoShape, predicted_fa1_io, predicted_fa2_io, predicted_standard_io,
};
use flash_attn_lab::model::reference::{Reference, attention_reference};
use flash_attn_lab::model::traffic::{IoCounts, Traffic};
use flash_attn_lab::tools::check::{F32_RELATIVE_TOLERANCE, LOGSUMEXP_TOLERANCE};
use flash_kernels::fwd::fa1::config::Fa1Blocks;
use ndarray::{Array3, Array4, Axis};
mod common;

/// (batch, heads, seqlen_q, seqlen_k, head_dim): lengths 1 to 257 in both orders, d from 1 to 59.
const SHAPES: [[usize; 5]; 7] = [
    [1, 1, 1, 1, 1],
    [1, 1, 1, 17, 8],
    [1, 2, 17, 17, 8],
    [2, 1, 64, 100, 16],
    [1, 2, 100, 64, 16],
    [1, 1, 257, 17, 59],
    [1, 1, 17, 257, 1],
];

/// FA2 (B_r, B_c): the kernel's four choices, and small odd ones that make many tail blocks.
const FA2_BLOCKS: [(u32, u32); 6] = [(64, 64), (128, 64), (64, 128), (128, 128), (16, 32), (3, 5)];

struct Inputs {
    q: Array4<f32>,
    k: Array4<f32>,
    v: Array4<f32>,
}

impl Inputs {
    fn random(shape: [usize; 5], seed: u64) -> Self {
        let [q, k, v] = common::normal_tensors(shape, seed, [true, false, false]);
        Self { q, k, v }
    }

    fn reference(&self, causal: bool, scale: f32) -> Reference {
        let wide = |a: &Array4<f32>| a.mapv(f64::from);
        let (q, k, v) = (wide(&self.q), wide(&self.k), wide(&self.v));
        attention_reference(q.view(), k.view(), v.view(), causal, scale as f64)
    }

    fn fa1(
        &self,
        causal: bool,
        blocks: Fa1Blocks,
        dtype: DType,
    ) -> (Array4<f32>, Array3<f64>, IoCounts) {
        let scale = default_scale(self.q.dim().3);
        let (q, k, v) = (self.q.view(), self.k.view(), self.v.view());
        let (o, row_max, row_sum, io) = emulate_fa1(q, k, v, causal, scale, blocks, dtype);
        // L = m + ln ℓ, as `RowStatistics::logsumexp` derives it from FA1's outputs.
        let mut logsumexp = row_max.mapv(f64::from);
        logsumexp.zip_mut_with(&row_sum, |m, &l| {
            *m = if l > 0.0 {
                *m + f64::from(l).ln()
            } else {
                f64::NEG_INFINITY
            };
        });
        (o, logsumexp, io)
    }

    fn fa2(
        &self,
        causal: bool,
        blocks: (u32, u32),
        dtype: DType,
    ) -> (Array4<f32>, Array3<f64>, IoCounts) {
        let scale = default_scale(self.q.dim().3);
        let (q, k, v) = (self.q.view(), self.k.view(), self.v.view());
        let (o, logsumexp, io) = emulate_fa2(q, k, v, causal, scale, blocks, dtype);
        (o, logsumexp.mapv(f64::from), io)
    }
}

fn default_scale(head_dim: usize) -> f32 {
    1.0 / (head_dim as f32).sqrt()
}

/// FA1 blocks with T_c > 1: M = 4·d·B gives B_c = B and B_r = min(B, d); plus the H200's default.
fn fa1_block_choices(head_dim: usize) -> Vec<Fa1Blocks> {
    let d = head_dim as u32;
    let mut choices: Vec<Fa1Blocks> = [1, 3, 16, 64]
        .map(|b| Fa1Blocks::from_sram(4 * d * b, d))
        .to_vec();
    choices.push(
        fa1_blocks(head_dim, H200_SHARED_MEMORY_PER_BLOCK, None)
            .unwrap()
            .1,
    );
    choices
}

/// The rule of `flash_attn_lab::tools::check` for f32: max |O − O_ref| / max |O_ref| ≤ 1e-5; L within 1e-4
/// where finite; rows that see no key have O = 0 and L = −∞ exactly. Every output must have been
/// written (the emulators start from NaN).
fn assert_matches_reference(
    o: &Array4<f32>,
    logsumexp: &Array3<f64>,
    reference: &Reference,
    what: &str,
) {
    assert!(
        o.iter().all(|x| x.is_finite()),
        "{what}: O has unwritten or NaN elements"
    );
    let max_reference = reference.o.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let max_error = o
        .iter()
        .zip(&reference.o)
        .fold(0.0f64, |m, (&a, &b)| m.max((f64::from(a) - b).abs()));
    assert!(
        max_error <= F32_RELATIVE_TOLERANCE * max_reference.max(f64::MIN_POSITIVE),
        "{what}: max |O − O_ref| = {max_error:e}, max |O_ref| = {max_reference}"
    );
    for ((index, &l), &l_ref) in logsumexp.indexed_iter().zip(&reference.logsumexp) {
        if l_ref == f64::NEG_INFINITY {
            assert_eq!(l, f64::NEG_INFINITY, "{what}: L at {index:?}");
            let (b, h, i) = index;
            let row = o.index_axis(Axis(0), b);
            let row = row.index_axis(Axis(0), h);
            assert!(
                row.index_axis(Axis(0), i).iter().all(|&x| x == 0.0),
                "{what}: O at row {index:?}, which sees no key, is not 0"
            );
        } else {
            assert!(
                (l - l_ref).abs() <= LOGSUMEXP_TOLERANCE,
                "{what}: L at {index:?} is {l}, reference {l_ref}"
            );
        }
    }
}

/// FA1 on every shape and block choice against the reference (one test per mask, to keep each
/// under a second in debug builds).
fn check_fa1_against_reference(causal: bool) {
    for (seed, shape) in SHAPES.into_iter().enumerate() {
        let inputs = Inputs::random(shape, seed as u64);
        let reference = inputs.reference(causal, default_scale(shape[4]));
        for blocks in fa1_block_choices(shape[4]) {
            let (o, logsumexp, _) = inputs.fa1(causal, blocks, DType::F32);
            let what = format!("FA1 {shape:?} causal={causal} {blocks:?}");
            assert_matches_reference(&o, &logsumexp, &reference, &what);
        }
    }
}

/// FA2 on every shape and block choice against the reference.
fn check_fa2_against_reference(causal: bool) {
    for (seed, shape) in SHAPES.into_iter().enumerate() {
        let inputs = Inputs::random(shape, 100 + seed as u64);
        let reference = inputs.reference(causal, default_scale(shape[4]));
        for blocks in FA2_BLOCKS {
            let (o, logsumexp, _) = inputs.fa2(causal, blocks, DType::F32);
            let what = format!("FA2 {shape:?} causal={causal} blocks={blocks:?}");
            assert_matches_reference(&o, &logsumexp, &reference, &what);
        }
    }
}

#[test]
fn fa1_emulator_matches_the_reference() {
    check_fa1_against_reference(false);
}

#[test]
fn fa1_emulator_matches_the_reference_with_a_causal_mask() {
    check_fa1_against_reference(true);
}

#[test]
fn fa2_emulator_matches_the_reference() {
    check_fa2_against_reference(false);
}

#[test]
fn fa2_emulator_matches_the_reference_with_a_causal_mask() {
    check_fa2_against_reference(true);
}

#[test]
fn o_is_stored_in_the_input_dtype() {
    let inputs = Inputs::random([1, 1, 33, 40, 16], 7);
    let blocks = Fa1Blocks::from_sram(4 * 16 * 8, 16);
    for dtype in [DType::F16, DType::Bf16] {
        let round = |x: f32| match dtype {
            DType::F16 => half::f16::from_f32(x).to_f32(),
            _ => half::bf16::from_f32(x).to_f32(),
        };
        let (o_f32, _, _) = inputs.fa1(true, blocks, DType::F32);
        let (o_half, _, _) = inputs.fa1(true, blocks, dtype);
        assert_eq!(o_half, o_f32.mapv(round), "FA1 {dtype}");
        let (o_f32, _, _) = inputs.fa2(true, (16, 32), DType::F32);
        let (o_half, _, _) = inputs.fa2(true, (16, 32), dtype);
        assert_eq!(o_half, o_f32.mapv(round), "FA2 {dtype}");
    }
}

/// Non-causal shapes for the exact IO counts: tails in both directions, d = 1 to 8.
const IO_SHAPES: [[usize; 5]; 4] = [
    [1, 1, 1, 1, 1],
    [1, 2, 17, 64, 8],
    [2, 1, 100, 129, 1],
    [1, 1, 257, 100, 8],
];

fn io_shape([batch, heads, seqlen_q, seqlen_k, head_dim]: [usize; 5]) -> IoShape {
    IoShape {
        batch,
        heads,
        seqlen_q,
        seqlen_k,
        head_dim,
    }
}

fn reads(read: u64) -> Traffic {
    Traffic { read, written: 0 }
}

fn writes(written: u64) -> Traffic {
    Traffic { read: 0, written }
}

#[test]
fn fa1_io_equals_the_article_formula() {
    for (seed, shape) in IO_SHAPES.into_iter().enumerate() {
        let inputs = Inputs::random(shape, 200 + seed as u64);
        let [b, h, n_q, n_k, d] = shape;
        let heads = (b * h) as u64;
        let (n_q, n_k, d) = (n_q as u64, n_k as u64, d as u64);
        // Each block choice in one dtype, alternating, so both element sizes are covered.
        for (blocks, dtype) in fa1_block_choices(shape[4])
            .into_iter()
            .zip([DType::F32, DType::Bf16].into_iter().cycle())
        {
            let (_, _, io) = inputs.fa1(false, blocks, dtype);
            let what = format!("FA1 {shape:?} {blocks:?} {dtype}");
            let t_c = n_k.div_ceil(blocks.block_cols as u64);
            let formula = fa1_formula(shape[2], shape[3], shape[4], blocks);

            // The article: K and V read once, Q read T_c times (every Q row once per outer
            // step, tail blocks counting only rows that exist).
            assert_eq!(io.k.elements, reads(n_k * d * heads), "{what}");
            assert_eq!(io.v.elements, reads(n_k * d * heads), "{what}");
            assert_eq!(io.q.elements, reads(t_c * n_q * d * heads), "{what}");
            assert_eq!(formula.k, reads(n_k * d), "{what}");
            assert_eq!(formula.q, reads(t_c * n_q * d), "{what}");

            // O read T_c times: all from the f32 accumulator, the first step included,
            // because line 2 initialised it in HBM.
            assert_eq!(
                io.o_accumulator.elements.read,
                t_c * n_q * d * heads,
                "{what}"
            );
            assert_eq!(formula.o.read, t_c * n_q * d, "{what}");
            // O written T_c times by the steps: T_c − 1 to the accumulator, the last as the
            // final O. Line 2's initialisation writes the accumulator once more (N_q·d): the
            // one write the article does not count.
            let initialisation = n_q * d * heads;
            assert_eq!(io.o.elements, writes(n_q * d * heads), "{what}");
            assert_eq!(
                io.o_accumulator.elements.written,
                initialisation + (t_c - 1) * n_q * d * heads,
                "{what}"
            );
            assert_eq!(formula.o.written, t_c * n_q * d, "{what}");
            assert_eq!(
                io.o_accumulator.elements.written + io.o.elements.written,
                formula.o.written * heads + initialisation,
                "{what}"
            );

            // m and ℓ: written at line 2, then read and written at every step.
            let statistics = Traffic {
                read: t_c * n_q * heads,
                written: (t_c + 1) * n_q * heads,
            };
            assert_eq!(io.row_max.elements, statistics, "{what}");
            assert_eq!(io.row_sum.elements, statistics, "{what}");
            for untouched in [io.logsumexp, io.scores, io.probs] {
                assert_eq!(untouched.elements, Traffic::default(), "{what}");
            }

            // Bytes: Q, K, V, O in the input dtype; the accumulator, m and ℓ in f32.
            let e = dtype.size_bytes() as u64;
            let input_reads = io.q.elements.read + 2 * n_k * d * heads;
            let f32_reads = io.o_accumulator.elements.read + 2 * statistics.read;
            assert_eq!(io.bytes_read(), e * input_reads + 4 * f32_reads, "{what}");
            let f32_writes = io.o_accumulator.elements.written + 2 * statistics.written;
            assert_eq!(
                io.bytes_written(),
                e * n_q * d * heads + 4 * f32_writes,
                "{what}"
            );

            // The prediction behind the IO table is this same count.
            let predicted = predicted_fa1_io(io_shape(shape), blocks, dtype).unwrap();
            assert_eq!(io, predicted, "{what}");
        }
    }
}

#[test]
fn fa2_io_equals_the_article_formula() {
    for (seed, shape) in IO_SHAPES.into_iter().enumerate() {
        let inputs = Inputs::random(shape, 300 + seed as u64);
        let [b, h, n_q, n_k, d] = shape;
        let heads = (b * h) as u64;
        let (n_q, n_k, d) = (n_q as u64, n_k as u64, d as u64);
        for (blocks, dtype) in FA2_BLOCKS
            .into_iter()
            .zip([DType::F32, DType::F16].into_iter().cycle())
        {
            let (_, _, io) = inputs.fa2(false, blocks, dtype);
            let what = format!("FA2 {shape:?} {blocks:?} {dtype}");
            let t_r = n_q.div_ceil(blocks.0 as u64);
            let formula = fa2_formula(shape[2], shape[3], shape[4], blocks.0);

            // The article: Q read once, K and V read T_r times, O written once; and L once.
            assert_eq!(io.q.elements, reads(n_q * d * heads), "{what}");
            assert_eq!(io.k.elements, reads(t_r * n_k * d * heads), "{what}");
            assert_eq!(io.v.elements, reads(t_r * n_k * d * heads), "{what}");
            assert_eq!(io.o.elements, writes(n_q * d * heads), "{what}");
            assert_eq!(io.logsumexp.elements, writes(n_q * heads), "{what}");
            for untouched in [
                io.o_accumulator,
                io.row_max,
                io.row_sum,
                io.scores,
                io.probs,
            ] {
                assert_eq!(untouched.elements, Traffic::default(), "{what}");
            }
            assert_eq!(formula.q, reads(n_q * d), "{what}");
            assert_eq!(formula.k, reads(t_r * n_k * d), "{what}");
            assert_eq!(formula.v, reads(t_r * n_k * d), "{what}");
            assert_eq!(formula.o, writes(n_q * d), "{what}");

            let e = dtype.size_bytes() as u64;
            let input_reads = (n_q + 2 * t_r * n_k) * d * heads;
            assert_eq!(io.bytes_read(), e * input_reads, "{what}");
            assert_eq!(
                io.bytes_written(),
                (e * n_q * d + 4 * n_q) * heads,
                "{what}"
            );

            let predicted = predicted_fa2_io(io_shape(shape), blocks.0, dtype).unwrap();
            assert_eq!(io, predicted, "{what}");
        }
    }
}

#[test]
fn causal_blocks_past_the_diagonal_are_skipped() {
    // N = T·B with B_r = B_c = B: only the T(T + 1)/2 blocks on or below the diagonal are visited.
    let (n, d, block) = (64u64, 8u64, 16u64);
    let visited = {
        let t = n / block;
        t * (t + 1) / 2
    };
    let inputs = Inputs::random([1, 1, n as usize, n as usize, d as usize], 400);
    let square = Fa1Blocks {
        block_rows: block as u32,
        block_cols: block as u32,
    };
    let (_, _, fa1) = inputs.fa1(true, square, DType::F32);
    assert_eq!(fa1.q.elements, reads(visited * block * d));
    assert_eq!(fa1.o_accumulator.elements.read, visited * block * d);
    assert_eq!(fa1.row_max.elements.read, visited * block);
    // Every K/V block is still loaded once: the last row block needs all of them.
    assert_eq!(fa1.k.elements, reads(n * d));
    // Line 2, then every visited step but each row block's last writes the accumulator.
    let row_blocks = n / block;
    assert_eq!(
        fa1.o_accumulator.elements.written,
        n * d + (visited - row_blocks) * block * d
    );
    assert_eq!(fa1.o.elements, writes(n * d));

    let (_, _, fa2) = inputs.fa2(true, (block as u32, block as u32), DType::F32);
    assert_eq!(fa2.q.elements, reads(n * d));
    assert_eq!(fa2.k.elements, reads(visited * block * d));
    assert_eq!(fa2.v.elements, reads(visited * block * d));
    assert_eq!(fa2.o.elements, writes(n * d));
}

#[test]
fn rows_that_see_no_key_are_written_once() {
    // seqlen_q = 100 > seqlen_k = 17, causal: query q sees keys ≤ q − 83, so queries 0–82 see
    // none. With B_r = B_c = 8, row blocks 0–9 (rows 0–79) are never visited: FA1 writes their
    // O = 0 at initialisation and FA2 loads no K/V for them. Row block 10 (rows 80–87, the last
    // seeing keys 0–4) needs 1 K/V block, row block 11 (88–95) 2, and the tail row block 12
    // (96–99, 4 rows) all 3.
    let shape = [1, 2, 100, 17, 8];
    let (heads, d) = (2u64, 8u64);
    let inputs = Inputs::random(shape, 500);
    let reference = inputs.reference(true, default_scale(8));
    let blocks = Fa1Blocks {
        block_rows: 8,
        block_cols: 8,
    };
    let (o, logsumexp, fa1) = inputs.fa1(true, blocks, DType::F32);
    assert_matches_reference(&o, &logsumexp, &reference, "FA1");
    assert_eq!(fa1.o.elements, writes(heads * 100 * d));
    // Q rows read: 8 once, 8 twice, 4 three times.
    assert_eq!(fa1.q.elements, reads(heads * (8 + 2 * 8 + 3 * 4) * d));

    let (o, logsumexp, fa2) = inputs.fa2(true, (8, 8), DType::F32);
    assert_matches_reference(&o, &logsumexp, &reference, "FA2");
    assert_eq!(fa2.o.elements, writes(heads * 100 * d));
    assert_eq!(fa2.logsumexp.elements, writes(heads * 100));
    // Keys read: 8 (one block), 16 (two), 17 (all three, the last a tail of 1).
    assert_eq!(fa2.k.elements, reads(heads * (8 + 16 + 17) * d));
}

#[test]
fn standard_formula_counts_each_pass_over_s_and_p() {
    let f = standard_formula(3, 5, 2);
    assert_eq!((f.q, f.k, f.v), (reads(6), reads(10), reads(10)));
    // S: written by the scores kernel, read by both passes of the softmax kernel.
    assert_eq!(
        f.scores,
        Traffic {
            read: 30,
            written: 15
        }
    );
    // P: written by the softmax kernel, read by the output kernel.
    assert_eq!(
        f.probs,
        Traffic {
            read: 15,
            written: 15
        }
    );
    assert_eq!(f.o, writes(6));
    let io = predicted_standard_io(io_shape([1, 1, 3, 5, 2]), DType::Bf16).unwrap();
    // Q, K, V, P in bf16; S in f32. Written: S (f32), P, O (bf16), L (f32).
    assert_eq!(io.bytes_read(), 2 * (6 + 10 + 10) + 4 * 30 + 2 * 15);
    assert_eq!(io.bytes_written(), 4 * 15 + 2 * 15 + 2 * 6 + 4 * 3);
}

/// The algorithms the IO table predicts at d = 16 in f16, in its order (FA2-TC has no d = 16
/// kernel; FA3 runs it on its d = 64 one).
const PREDICTED: [Algorithm; 4] = [
    Algorithm::Standard,
    Algorithm::Fa1,
    Algorithm::Fa2,
    Algorithm::Fa3,
];

#[test]
fn io_table_agrees_with_the_emulators() {
    // 32 KiB of shared memory at d = 16 gives FA1 (B_r, B_c) = (16, 128) and FA2 (64, 64), so
    // both loops have several blocks at N = 200.
    let shared = 32 * 1024;
    let shape = [1, 2, 200, 200, 16];
    let rows = io_table(io_shape(shape), DType::F16, shared).unwrap();
    let algorithms: Vec<Algorithm> = rows.iter().map(|r| r.algorithm).collect();
    assert_eq!(algorithms, PREDICTED);

    let (_, fa1) = fa1_blocks(16, shared, None).unwrap();
    let fa2 = fa2_blocks(16, shared, None).unwrap();
    assert_eq!(rows[1].blocks, Some((fa1.block_rows, fa1.block_cols)));
    assert_eq!(rows[2].blocks, Some(fa2));
    assert!(
        200usize.div_ceil(fa1.block_cols as usize) > 1,
        "{fa1:?}: T_c = 1"
    );
    assert!(200usize.div_ceil(fa2.0 as usize) > 1, "{fa2:?}: T_r = 1");

    let inputs = Inputs::random(shape, 600);
    let (_, _, fa1_io) = inputs.fa1(false, fa1, DType::F16);
    let (_, _, fa2_io) = inputs.fa2(false, fa2, DType::F16);
    assert_eq!(rows[1].io, fa1_io);
    assert_eq!(rows[2].io, fa2_io);
    // FA3 moves FA2's tensors with its own B_r (three consumer warpgroups of 64 rows at d ≤ 64).
    assert_eq!(rows[3].blocks, Some((192, 128)));
    let (_, _, fa3_io) = inputs.fa2(false, (192, 128), DType::F16);
    assert_eq!(rows[3].io, fa3_io);
    assert_eq!(
        rows[0].io,
        predicted_standard_io(io_shape(shape), DType::F16).unwrap()
    );

    let table = io_table_markdown(&rows);
    assert_eq!(table.lines().count(), 2 + rows.len(), "{table}");
    for algorithm in PREDICTED {
        assert!(table.contains(&format!("| {algorithm} |")), "{table}");
    }
    assert!(
        table.contains("| 1 × 2 × 200 × 200 × 16 | f16 |"),
        "{table}"
    );
}

#[test]
fn io_table_handles_long_sequences_from_the_formulas() {
    // N = 16384: far too long for the O(N²) emulators, instant from the formulas.
    let shape = IoShape::square(1, 16, 16_384, 128);
    let rows = io_table(shape, DType::Bf16, H200_SHARED_MEMORY_PER_BLOCK).unwrap();
    let total = |i: usize| rows[i].io.bytes_read() + rows[i].io.bytes_written();
    assert!(
        total(2) < total(0),
        "FA2 moves less than the standard attention"
    );
    assert!(total(2) < total(1), "FA2 moves less than FA1");
    // FA2 = the article's Nd + 2·T_r·Nd + Nd in bf16, plus L in f32.
    let (n, d, heads) = (16_384u64, 128u64, 16u64);
    let t_r = n.div_ceil(rows[2].blocks.unwrap().0 as u64);
    assert_eq!(
        rows[2].io.bytes_read(),
        2 * (n * d + 2 * t_r * n * d) * heads
    );
    assert_eq!(rows[2].io.bytes_written(), (2 * n * d + 4 * n) * heads);
    let markdown = io_table_markdown(&rows);
    assert!(markdown.contains("GiB"), "{markdown}");
}

fn invalid_argument_name<T: std::fmt::Debug>(result: Result<T>) -> &'static str {
    match result {
        Err(Error::InvalidArgument { name, .. }) => name,
        other => panic!("expected an invalid argument, got {other:?}"),
    }
}

#[test]
fn predictions_reject_what_the_host_rejects() {
    let f32 = DType::F32;
    let shared = H200_SHARED_MEMORY_PER_BLOCK;
    assert_eq!(
        invalid_argument_name(io_table(IoShape::square(1, 1, 16, 0), f32, shared)),
        "q"
    );
    assert_eq!(
        invalid_argument_name(io_table(IoShape::square(1, 1, 16, 300), f32, shared)),
        "head_dim"
    );
    // Within every launch limit, but FA1's traffic in bytes overflows 64 bits: an error, no panic.
    let huge = IoShape {
        batch: 255,
        heads: 257,
        seqlen_q: 1_048_560,
        seqlen_k: 16_777_215,
        head_dim: 256,
    };
    assert_eq!(invalid_argument_name(io_table(huge, f32, shared)), "shape");
    let no_blocks = Fa1Blocks {
        block_rows: 0,
        block_cols: 0,
    };
    assert_eq!(
        invalid_argument_name(predicted_fa1_io(
            IoShape::square(1, 1, 8, 8),
            no_blocks,
            f32
        )),
        "blocks"
    );
    assert_eq!(
        invalid_argument_name(predicted_fa2_io(IoShape::square(1, 1, 8, 8), 0, f32)),
        "block_rows"
    );
    // The bare formulas saturate instead of dividing by zero.
    assert_eq!(fa1_formula(8, 8, 4, no_blocks).q.read, u64::MAX);
}
