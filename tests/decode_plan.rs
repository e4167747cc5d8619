//! CPU tests of decoding: the checked problem's named errors, the plan (splits, kernels,
//! launches, workspace) at the anchor shapes, and the f64 reference's GQA and paging.

use flash_attn::attention::CompiledLimits;
use flash_attn::attention::decode::{
    CacheGeometry, DecodeOptions, DecodePlan, DecodeProblem, DecodeShapes, SplitMerge, TablePages,
};
use flash_attn::{DType, Error};
use flash_attn_lab::model::decode_reference::{DecodeCase, decode_reference};
use flash_attn_lab::model::reference::attention_reference;
use flash_kernels::decode::config::HEAD_DIMS;
use flash_kernels::registry::{CacheLayout, ElementType, Family, KERNELS, KernelId};
use ndarray::{Array2, Array4, s};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

fn shapes<'a>(
    q: [usize; 4],
    k: [usize; 4],
    lengths: &'a [u32],
    table: Option<TablePages<'a>>,
) -> DecodeShapes<'a> {
    DecodeShapes {
        q,
        k_cache: k,
        v_cache: k,
        new_kv: None,
        cache_seqlens: lengths,
        block_table: table,
    }
}

fn error_name(result: Result<DecodeProblem, Error>) -> &'static str {
    match result {
        Err(Error::InvalidArgument { name, .. }) => name,
        other => panic!("expected a named error, got {other:?}"),
    }
}

fn problem(s: &DecodeShapes) -> Result<DecodeProblem, Error> {
    DecodeProblem::new(DType::Bf16, s, &DecodeOptions::default())
}

#[test]
fn bad_input_is_a_named_error() {
    let lengths = [10u32, 20];
    let q = [2, 32, 1, 128];
    // heads_q not a multiple of heads_kv.
    assert_eq!(
        error_name(problem(&shapes(q, [2, 5, 64, 128], &lengths, None))),
        "heads_kv"
    );
    // A length past the capacity.
    assert_eq!(
        error_name(problem(&shapes(q, [2, 8, 16, 128], &lengths, None))),
        "cache_seqlens"
    );
    // One length per sequence.
    assert_eq!(
        error_name(problem(&shapes(q, [2, 8, 64, 128], &[1], None))),
        "cache_seqlens"
    );
    // Too many query tokens; an uncompiled head dim; f32.
    assert_eq!(
        error_name(problem(&shapes(
            [2, 32, 17, 128],
            [2, 8, 64, 128],
            &lengths,
            None
        ))),
        "q"
    );
    assert_eq!(
        error_name(problem(&shapes(
            [2, 32, 1, 96],
            [2, 8, 64, 96],
            &lengths,
            None
        ))),
        "head_dim"
    );
    assert_eq!(
        error_name(DecodeProblem::new(
            DType::F32,
            &shapes(q, [2, 8, 64, 128], &lengths, None),
            &DecodeOptions::default()
        )),
        "dtype"
    );
    // Paged: a page size that is not a multiple of 16; a table entry past the pages; too few
    // table columns for the length; a row count that is not the batch.
    let prefix = vec![vec![0, 3, 3], vec![1, 4, 9]];
    let table = TablePages {
        prefix_max: &prefix,
        width: 3,
    };
    assert_eq!(
        error_name(problem(&shapes(q, [10, 8, 24, 128], &lengths, Some(table)))),
        "k_cache"
    );
    let long = [10u32, 40];
    let err = problem(&shapes(q, [5, 8, 16, 128], &long, Some(table)));
    match &err {
        Err(Error::InvalidArgument { name, value, .. }) => {
            assert_eq!(*name, "block_table");
            assert!(value.contains("block_table[1][2] = 9"), "{value}");
        }
        other => panic!("{other:?}"),
    }
    // The same table is fine when the sequence's keys stay in pages 0 and 1 (entry 9 unread).
    assert!(problem(&shapes(q, [5, 8, 16, 128], &lengths, Some(table))).is_ok());
    assert_eq!(
        error_name(problem(&shapes(
            q,
            [10, 8, 16, 128],
            &[10, 49],
            Some(table)
        ))),
        "cache_seqlens"
    );
    let one_row = vec![vec![0]];
    let short = TablePages {
        prefix_max: &one_row,
        width: 1,
    };
    assert_eq!(
        error_name(problem(&shapes(q, [10, 8, 16, 128], &lengths, Some(short)))),
        "block_table"
    );
}

#[test]
fn the_plan_splits_the_anchor_shapes_to_fill_the_h200() {
    for (batch, seqlen, splits) in [
        (1, 4096, 32),
        (1, 131_072, 33),
        (16, 32_768, 2),
        (64, 32_768, 1),
    ] {
        let lengths = vec![seqlen as u32; batch];
        let s = shapes([batch, 32, 1, 128], [batch, 8, seqlen, 128], &lengths, None);
        let problem = problem(&s).unwrap();
        assert_eq!(
            problem.cache,
            CacheGeometry::Contiguous { capacity: seqlen }
        );
        assert_eq!(problem.kv_bytes(2), 2 * batch * seqlen * 8 * 128 * 2);
        let plan = DecodePlan::new(
            &CompiledLimits::H200,
            DType::Bf16,
            &problem,
            &DecodeOptions::default(),
        )
        .unwrap();
        assert_eq!(
            plan.splits.splits, splits,
            "batch {batch}, {seqlen} keys: {plan}"
        );
        let split_kv = plan.launches[0];
        assert_eq!(split_kv.launch.grid, (splits, 1, batch as u32 * 8));
        // Every default split count fills at most one wave, so several splits merge in the
        // split-KV kernel's last blocks: one launch, with a counter per (batch, KV head).
        assert_eq!(
            split_kv.kernel.family,
            Family::Decode {
                head_dim: 128,
                cache: CacheLayout::Contiguous,
                one_launch: splits > 1,
            }
        );
        assert_eq!(plan.launches.len(), 1, "{plan}");
        let expected_merge = if splits > 1 {
            SplitMerge::LastBlock
        } else {
            SplitMerge::Direct
        };
        assert_eq!(plan.merge, expected_merge);
        assert_eq!(
            plan.workspace_stats,
            if splits > 1 {
                splits as usize * batch * 32
            } else {
                0
            }
        );
        assert_eq!(
            plan.workspace_counters,
            if splits > 1 { batch * 8 } else { 0 }
        );
        for launch in &plan.launches {
            assert!(KERNELS.contains(&launch.kernel), "{}", launch.kernel);
            assert!(launch.launch.threads <= launch.kernel.max_threads());
        }
    }
}

#[test]
fn forced_splits_and_row_tiles() {
    // 32 query heads per KV head × 16 tokens: 512 rows, 32 row tiles.
    let lengths = [1000u32];
    let s = shapes([1, 32, 16, 64], [1, 1, 1024, 64], &lengths, None);
    let p = problem(&s).unwrap();
    let options = DecodeOptions {
        splits: Some(7),
        one_launch: Some(false),
        ..Default::default()
    };
    let plan = DecodePlan::new(&CompiledLimits::H200, DType::F16, &p, &options).unwrap();
    assert_eq!(plan.launches[0].launch.grid.1, 32);
    assert!(plan.splits.splits <= 7 && plan.splits.splits * plan.splits.split_keys >= 1000);
    assert_eq!(
        plan.launches[1].kernel.family,
        Family::DecodeCombine { head_dim: 64 }
    );
    let bad = DecodeOptions {
        splits: Some(0),
        ..Default::default()
    };
    assert!(DecodePlan::new(&CompiledLimits::H200, DType::F16, &p, &bad).is_err());
}

/// The merge: one split needs none; several merge in the split-KV kernel's last blocks while the
/// grid fits one wave of 2 blocks on each of the 132 SMs, and in the combine kernel past it;
/// `one_launch` forces either (but one split stays direct).
#[test]
fn the_plan_merges_in_one_launch_while_the_grid_fits_one_wave() {
    let choose = |splits, blocks, one_launch| SplitMerge::choose(splits, blocks, 132, one_launch).0;
    assert_eq!(choose(1, 8, None), SplitMerge::Direct);
    assert_eq!(choose(1, 8, Some(true)), SplitMerge::Direct);
    assert_eq!(choose(1, 8, Some(false)), SplitMerge::Direct);
    assert_eq!(choose(33, 8, None), SplitMerge::LastBlock);
    assert_eq!(choose(2, 132, None), SplitMerge::LastBlock);
    assert_eq!(choose(3, 88, None), SplitMerge::LastBlock);
    assert_eq!(choose(2, 133, None), SplitMerge::CombineKernel);
    assert_eq!(choose(128, 32, None), SplitMerge::CombineKernel);
    assert_eq!(choose(128, 32, Some(true)), SplitMerge::LastBlock);
    assert_eq!(choose(2, 8, Some(false)), SplitMerge::CombineKernel);

    // Batch 4, 8 KV heads, 2 tokens of 4 query heads each (one row tile per KV head): 32
    // blocks a split.
    let lengths = [5000u32, 64, 1, 0];
    let s = shapes([4, 32, 2, 128], [4, 8, 5000, 128], &lengths, None);
    let p = problem(&s).unwrap();
    let plan_with = |splits, one_launch| {
        let options = DecodeOptions {
            splits: Some(splits),
            one_launch,
            ..Default::default()
        };
        DecodePlan::new(&CompiledLimits::H200, DType::Bf16, &p, &options).unwrap()
    };
    let family = |plan: &DecodePlan, i: usize| plan.launches[i].kernel.family;
    // 7 splits × 32 blocks fit one wave: one launch, a counter per (batch, KV head).
    let one = plan_with(7, None);
    assert_eq!(one.merge, SplitMerge::LastBlock);
    assert_eq!(one.launches.len(), 1);
    assert_eq!(
        family(&one, 0),
        Family::Decode {
            head_dim: 128,
            cache: CacheLayout::Contiguous,
            one_launch: true
        }
    );
    assert_eq!(one.workspace_counters, 32);
    assert_eq!(one.workspace_stats, 7 * 4 * 32 * 2);
    assert_eq!(one.workspace_o, one.workspace_stats * 128);
    assert!(one.to_string().contains("no combine launch"), "{one}");
    // 64 splits × 32 blocks take eight waves: two launches, no counters.
    let two = plan_with(64, None);
    assert_eq!(two.merge, SplitMerge::CombineKernel);
    assert_eq!(two.launches.len(), 2);
    assert_eq!(
        family(&two, 0),
        Family::Decode {
            head_dim: 128,
            cache: CacheLayout::Contiguous,
            one_launch: false
        }
    );
    assert_eq!(family(&two, 1), Family::DecodeCombine { head_dim: 128 });
    assert_eq!(two.workspace_counters, 0);
    assert!(two.to_string().contains("more than one wave"), "{two}");
    // Forced either way; one split is direct, with no workspace at all.
    assert_eq!(plan_with(64, Some(true)).launches.len(), 1);
    assert_eq!(plan_with(7, Some(false)).launches.len(), 2);
    let direct = plan_with(1, Some(true));
    assert_eq!(direct.merge, SplitMerge::Direct);
    assert_eq!(
        (
            direct.workspace_o,
            direct.workspace_stats,
            direct.workspace_counters
        ),
        (0, 0, 0)
    );
    assert!(!direct.kernel_names().contains("onelaunch"));
    // Several row tiles: a counter per (batch, KV head, row tile). 32 query heads on one KV
    // head × 16 tokens: 32 row tiles.
    let one_kv = [1000u32];
    let s = shapes([1, 32, 16, 64], [1, 1, 1024, 64], &one_kv, None);
    let p = problem(&s).unwrap();
    let options = DecodeOptions {
        splits: Some(4),
        ..Default::default()
    };
    let plan = DecodePlan::new(&CompiledLimits::H200, DType::F16, &p, &options).unwrap();
    assert_eq!(plan.merge, SplitMerge::LastBlock);
    assert_eq!(plan.launches[0].launch.grid, (4, 32, 1));
    assert_eq!(plan.workspace_counters, 32);
}

#[test]
fn every_decode_head_dim_and_layout_is_compiled() {
    for dtype in [ElementType::F16, ElementType::Bf16] {
        for &head_dim in &HEAD_DIMS {
            for cache in CacheLayout::ALL {
                for family in [
                    Family::Decode {
                        head_dim,
                        cache,
                        one_launch: false,
                    },
                    Family::Decode {
                        head_dim,
                        cache,
                        one_launch: true,
                    },
                    Family::DecodeCombine { head_dim },
                    Family::KvAppend { cache },
                ] {
                    let id = KernelId::new(family, dtype);
                    assert!(KERNELS.contains(&id), "{id}");
                    assert_eq!(id.to_string().parse::<KernelId>(), Ok(id));
                }
            }
        }
    }
}

fn normal(dims: [usize; 4], seed: u64) -> Array4<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    Array4::from_shape_simple_fn(dims, || StandardNormal.sample(&mut rng))
}

/// The reference's GQA mapping and paging: the same keys, stored contiguous or shuffled into
/// pages, give the dense reference with each KV head repeated for its query heads.
#[test]
fn the_reference_maps_heads_and_pages() {
    let (batch, heads_q, heads_kv, tokens, d, page) = (2, 6, 2, 3, 8, 4);
    let seqlens = [9usize, 2];
    let q = normal([batch, heads_q, tokens, d], 1);
    let k = normal([batch, heads_kv, 12, d], 2);
    let v = normal([batch, heads_kv, 12, d], 3);
    let contiguous = DecodeCase {
        q: q.view(),
        k_cache: k.view(),
        v_cache: v.view(),
        seqlens: &seqlens,
        block_table: None,
        causal: true,
        scale: 0.3,
    };
    let expected = decode_reference(&contiguous);
    // Pages: sequence b's page i at page 3·(1 − b) + (2 − i) of 6.
    let table = Array2::from_shape_fn((batch, 3), |(b, i)| (3 * (1 - b) + (2 - i)) as u32);
    let mut k_pages = Array4::zeros((6, heads_kv, page, d));
    let mut v_pages = Array4::zeros((6, heads_kv, page, d));
    for b in 0..batch {
        for key in 0..12 {
            let p = table[[b, key / page]] as usize;
            k_pages
                .slice_mut(s![p, .., key % page, ..])
                .assign(&k.slice(s![b, .., key, ..]));
            v_pages
                .slice_mut(s![p, .., key % page, ..])
                .assign(&v.slice(s![b, .., key, ..]));
        }
    }
    let paged = DecodeCase {
        k_cache: k_pages.view(),
        v_cache: v_pages.view(),
        block_table: Some(table.view()),
        ..contiguous
    };
    let got = decode_reference(&paged);
    assert_eq!(got.o, expected.o);
    for b in 0..batch {
        let repeat = |a: &Array4<f64>| {
            Array4::from_shape_fn((1, heads_q, seqlens[b], d), |(_, h, key, x)| {
                a[[b, h / 3, key, x]]
            })
        };
        let dense = attention_reference(
            q.slice(s![b..b + 1, .., .., ..]),
            repeat(&k).view(),
            repeat(&v).view(),
            true,
            0.3,
        );
        assert_eq!(
            dense.o.slice(s![0, .., .., ..]),
            expected.o.slice(s![b, .., .., ..])
        );
    }
    // Sequence 1 has 2 keys and 3 tokens: token 0 sees none (O = 0, L = −∞).
    assert_eq!(expected.logsumexp[[1, 0, 0]], f64::NEG_INFINITY);
    assert!(expected.o.slice(s![1, 0, 0, ..]).iter().all(|&x| x == 0.0));
}

#[test]
fn the_benchmark_runs_the_shapes_it_is_given_and_names_one_it_lacks() {
    use flash_attn_lab::tools::bench::decode::{anchor_shapes, select_shapes};
    let all = anchor_shapes(false);
    assert_eq!(select_shapes(all.clone(), &[]).unwrap(), all);
    let picked = select_shapes(all.clone(), &["32768x64".into(), "131072x16".into()]).unwrap();
    let picked: Vec<_> = picked.iter().map(|s| (s.kv_len, s.batch)).collect();
    assert_eq!(picked, [(32_768, 64), (131_072, 16)]);
    match select_shapes(all, &["1000x3".into()]) {
        Err(Error::InvalidArgument {
            name,
            value,
            allowed,
        }) => {
            assert_eq!((name, value.as_str()), ("--decode-shapes", "1000x3"));
            assert!(allowed.contains("131072x16"), "{allowed}");
        }
        other => panic!("{other:?}"),
    }
}
