//! The kernel lists (`flash_kernels::registry::KERNELS`, `HOPPER_KERNELS`) against the PTX
//! modules the build produced, and the launch plan's choices, on the CPU.

use flash_attn::attention::backward_plan::{BackwardOptions, BackwardViews};
use flash_attn::attention::{
    Algorithm, AttentionOptions, Blocks, CompiledLimits, ForwardPlan, Problem, StatisticsKind,
};
use flash_attn::attention::{BackwardAlgorithm, BackwardPlan};
use flash_attn::{DType, Error};
use flash_kernels::fwd::fa2_tc::config::Fa2TcTiling;
use flash_kernels::fwd::fa3::config::Fa3Tiling;
use flash_kernels::registry::{ElementType, Family, KERNELS, KernelForm, KernelId, Module};

#[test]
fn each_kernel_list_is_exactly_its_modules_entry_points() {
    for module in [Module::Main, Module::Hopper] {
        let list = module.kernels();
        let mut listed: Vec<String> = list.iter().map(|k| k.to_string()).collect();
        let mut entries: Vec<String> = flash_attn::device::entry_names(module)
            .into_iter()
            .map(String::from)
            .collect();
        listed.sort();
        entries.sort();
        let missing: Vec<_> = listed.iter().filter(|k| !entries.contains(k)).collect();
        let unlisted: Vec<_> = entries.iter().filter(|e| !listed.contains(e)).collect();
        assert!(
            missing.is_empty() && unlisted.is_empty(),
            "{}: listed but not in the PTX: {missing:?}; in the PTX but not listed: {unlisted:?}",
            module.name()
        );
        assert_eq!(listed.len(), list.len(), "the list names a kernel twice");
        assert!(list.iter().all(|k| k.module() == module));
    }
}

#[test]
fn kernel_names_read_back_as_their_ids() {
    for kernel in KERNELS.iter().chain(Module::Hopper.kernels().iter()) {
        let name = kernel.to_string();
        assert_eq!(name.parse::<KernelId>(), Ok(*kernel), "{name}");
    }
    let id = KernelId::new(
        Family::Fa2Tc {
            head_dim: 128,
            tiling: Fa2TcTiling::new(4, 2, 1, 64),
            form: KernelForm::Dense,
        },
        ElementType::Bf16,
    );
    assert_eq!(id.to_string(), "fa2tc_forward_bf16_d128_w4r2s1c64");
    assert_eq!(id.max_threads(), 128);
    let packed = KernelId::new(
        Family::Fa2Tc {
            head_dim: 128,
            tiling: Fa2TcTiling::new(4, 2, 1, 64),
            form: KernelForm::Packed,
        },
        ElementType::F16,
    );
    assert_eq!(
        packed.to_string(),
        "fa2tc_forward_f16_d128_w4r2s1c64_varlen"
    );
    // Every form's name reads back as its id, in both families.
    for form in KernelForm::ALL {
        let fa2_tc = KernelId::new(
            Family::Fa2Tc {
                head_dim: 64,
                tiling: Fa2TcTiling::new(4, 2, 2, 64),
                form,
            },
            ElementType::Bf16,
        );
        let fa3 = KernelId::new(
            Family::Fa3 {
                head_dim: 128,
                tiling: Fa3Tiling::new(2, 128),
                form,
            },
            ElementType::F16,
        );
        for id in [fa2_tc, fa3] {
            let name = id.to_string();
            assert!(name.ends_with(form.suffix()), "{name}");
            assert_eq!(name.parse::<KernelId>(), Ok(id), "{name}");
        }
    }
    for bad in [
        "",
        "fa2_forward_f64_d64_bc64",
        "fa2_forward_f32_d64",
        "fa2tc_forward_bf16_d128_w4r2s1",
        "standard_gather_f32",
        "fa3_forward_bf16",
    ] {
        assert!(bad.parse::<KernelId>().is_err(), "{bad:?} parsed");
    }
}

fn plan(
    algorithm: Algorithm,
    dtype: DType,
    dims: [usize; 4],
    options: &AttentionOptions,
) -> ForwardPlan {
    let problem = Problem::new(dims, dims, dims, options).unwrap();
    ForwardPlan::new(
        &CompiledLimits::H200,
        algorithm,
        dtype,
        &problem,
        options,
        None,
    )
    .unwrap()
}

#[test]
fn head_dims_between_capacities_get_a_block_their_kernel_can_launch() {
    // d = 160 and 192 use FA2's capacity-256 kernel, compiled for at most 256 threads (B_r = 64);
    // B_r = 128 would fit in shared memory but not launch (the bug of issue 13).
    for d in [129, 160, 192, 200, 256] {
        for dtype in DType::ALL {
            let options = AttentionOptions::default();
            let p = plan(Algorithm::Fa2, dtype, [1, 24, 1000, d], &options);
            let Blocks::Fa2 { block_rows, .. } = p.blocks else {
                panic!("{p}");
            };
            assert_eq!(block_rows, 64, "{p}");
            let launch = p.launches[0];
            assert!(launch.launch.threads <= launch.kernel.max_threads(), "{p}");
            assert_eq!(launch.kernel.head_dim_capacity(), Some(256), "{p}");
            assert!(launch.launch.shared_bytes <= CompiledLimits::H200.shared_memory_per_block);
        }
    }
    // Below 128 the 512-thread blocks stay.
    let p = plan(
        Algorithm::Fa2,
        DType::Bf16,
        [1, 1, 1000, 64],
        &AttentionOptions::default(),
    );
    assert_eq!(
        p.blocks,
        Blocks::Fa2 {
            block_rows: 128,
            block_cols: 128
        }
    );
    // An override that cannot launch is named, with the reason.
    let options = AttentionOptions {
        fa2_blocks: Some((128, 64)),
        ..Default::default()
    };
    let problem =
        Problem::new([1, 1, 10, 160], [1, 1, 10, 160], [1, 1, 10, 160], &options).unwrap();
    let err = ForwardPlan::new(
        &CompiledLimits::H200,
        Algorithm::Fa2,
        DType::F16,
        &problem,
        &options,
        None,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                name: "fa2_blocks",
                ..
            }
        ) && err.to_string().contains("at most 256"),
        "{err}"
    );
}

#[test]
fn the_plan_says_which_kernel_runs_and_why_a_fallback() {
    let options = AttentionOptions::default();
    let p = plan(Algorithm::Fa2Tc, DType::Bf16, [2, 16, 4096, 128], &options);
    assert_eq!(p.fallback, None);
    assert_eq!(p.kernel_names(), "fa2tc_forward_bf16_d128_w4r2s1c64");
    assert_eq!(p.launches[0].launch.grid, (32, 32, 1));
    assert_eq!(p.statistics, StatisticsKind::LogSumExp);
    let p = plan(Algorithm::Fa2Tc, DType::Bf16, [2, 16, 4096, 160], &options);
    assert!(
        p.fallback
            .as_deref()
            .is_some_and(|r| r.contains("head_dim 160")),
        "{p}"
    );
    assert_eq!(p.kernel_names(), "fa2_forward_bf16_d256_bc64");
    assert!(p.to_string().contains("falls back to fa2"), "{p}");
    let p = plan(Algorithm::Fa2Tc, DType::F32, [1, 1, 64, 64], &options);
    assert!(
        p.fallback.as_deref().is_some_and(|r| r.contains("f32")),
        "{p}"
    );
    let p = plan(Algorithm::Standard, DType::F16, [1, 2, 100, 40], &options);
    assert_eq!(
        p.kernel_names(),
        "standard_scores_f16+standard_softmax_f16+standard_output_f16"
    );
    assert_eq!(p.workspace.scores, 2 * 100 * 100);
    let p = plan(Algorithm::Fa1, DType::F32, [1, 2, 100, 64], &options);
    assert_eq!(p.statistics, StatisticsKind::MaxAndSum);
    assert_eq!(p.workspace.o_accumulator, 2 * 100 * 64);
    println!("{p}");
}

#[test]
fn fa3_runs_on_the_next_compiled_head_dim_and_says_why_it_falls_back() {
    let options = AttentionOptions::default();
    let causal = AttentionOptions {
        causal: true,
        ..Default::default()
    };
    let p = plan(Algorithm::Fa3, DType::Bf16, [2, 16, 4096, 128], &causal);
    assert_eq!(p.fallback, None, "{p}");
    assert_eq!(p.kernel_names(), "fa3_forward_bf16_d128_w2c128");
    // 2 consumer warpgroups of 64 rows: B_r = 128; 384 threads.
    assert_eq!(p.launches[0].launch.grid, (32, 32, 1));
    assert_eq!(p.launches[0].launch.threads, 384);
    // The defaults' persistent grid (measured faster): d = 128 without the mask, and short rows.
    let p = plan(Algorithm::Fa3, DType::Bf16, [2, 16, 4096, 128], &options);
    assert_eq!(p.kernel_names(), "fa3_forward_bf16_d128_w2c128p");
    assert_eq!(p.launches[0].launch.grid, (132, 1, 1));
    // At d = 96, 192, 256 the persistent grid for short sequences only (measured, docs/perf).
    let p = plan(Algorithm::Fa3, DType::F16, [1, 4, 1000, 80], &options);
    assert_eq!(p.kernel_names(), "fa3_forward_f16_d96_w2c128p", "{p}");
    let p = plan(Algorithm::Fa3, DType::F16, [1, 4, 2048, 96], &options);
    assert_eq!(p.kernel_names(), "fa3_forward_f16_d96_w2c128", "{p}");
    let p = plan(Algorithm::Fa3, DType::F16, [1, 4, 2048, 96], &causal);
    assert_eq!(p.kernel_names(), "fa3_forward_f16_d96_w2c128p", "{p}");
    let p = plan(Algorithm::Fa3, DType::Bf16, [1, 4, 1000, 192], &options);
    assert_eq!(p.kernel_names(), "fa3_forward_bf16_d192_w2c112p", "{p}");
    let p = plan(Algorithm::Fa3, DType::Bf16, [1, 4, 2048, 192], &causal);
    assert_eq!(p.kernel_names(), "fa3_forward_bf16_d192_w2c112", "{p}");
    let p = plan(Algorithm::Fa3, DType::Bf16, [1, 4, 1000, 256], &options);
    assert_eq!(p.kernel_names(), "fa3_forward_bf16_d256_w2c80", "{p}");
    let p = plan(Algorithm::Fa3, DType::Bf16, [1, 4, 1000, 256], &causal);
    assert_eq!(p.kernel_names(), "fa3_forward_bf16_d256_w2c80p", "{p}");
    let p = plan(Algorithm::Fa3, DType::Bf16, [1, 4, 1000, 64], &causal);
    assert_eq!(p.kernel_names(), "fa3_forward_bf16_d64_w3c128p", "{p}");
    let p = plan(Algorithm::Fa3, DType::Bf16, [1, 4, 4096, 64], &causal);
    assert_eq!(p.kernel_names(), "fa3_forward_bf16_d64_w3c128", "{p}");
    // f32 and odd head dims run FA2-TC's plan (which may fall back further), with both reasons.
    let p = plan(Algorithm::Fa3, DType::F32, [1, 1, 64, 64], &options);
    let why = p.fallback.clone().unwrap_or_default();
    assert!(
        why.contains("fa3 falls back to fa2-tc: f32") && why.contains("fa2-tc falls back to fa2"),
        "{why}"
    );
    let p = plan(Algorithm::Fa3, DType::Bf16, [1, 1, 64, 33], &options);
    assert!(
        p.fallback.as_deref().is_some_and(|r| r.contains("odd")),
        "{p}"
    );
    // A device that is not compute capability 9.0 runs FA2-TC.
    let limits = CompiledLimits {
        hopper: false,
        ..CompiledLimits::H200
    };
    let problem = Problem::new(
        [1, 2, 256, 128],
        [1, 2, 256, 128],
        [1, 2, 256, 128],
        &options,
    )
    .expect("a valid problem");
    let p = ForwardPlan::new(
        &limits,
        Algorithm::Fa3,
        DType::Bf16,
        &problem,
        &options,
        None,
    )
    .unwrap();
    assert_eq!(p.kernel_names(), "fa2tc_forward_bf16_d128_w4r2s1c64");
    assert!(
        p.fallback.as_deref().is_some_and(|r| r.contains("9.0")),
        "{p}"
    );
    // A tiling that is not compiled at this head dim is an error naming the option.
    let options = AttentionOptions {
        fa3_tiling: Some(flash_attn::attention::parse_fa3_tiling("w2c176").unwrap()),
        ..Default::default()
    };
    let dims = [1, 2, 256, 64];
    let problem = Problem::new(dims, dims, dims, &options).unwrap();
    let err = ForwardPlan::new(
        &CompiledLimits::H200,
        Algorithm::Fa3,
        DType::Bf16,
        &problem,
        &options,
        None,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                name: "fa3_tiling",
                ..
            }
        ) && err.to_string().contains("w3c128"),
        "{err}"
    );
    assert!(flash_attn::attention::parse_fa3_tiling("2x128").is_err());
}

/// The standard backward's plan: the standard forward's scores and softmax, then dP, dS, dQ and
/// dK with dV, every grid from the shape, every kernel compiled; its workspace S (f32) and P
/// (the dtype) each batch·heads·N_q·N_k, counted in `workspace_bytes`; deterministic accepted.
#[test]
fn the_standard_backward_plans_six_launches_and_its_quadratic_workspace() {
    use flash_kernels::registry::{StandardBackwardStage, StandardStage};
    let options = AttentionOptions {
        causal: true,
        ..Default::default()
    };
    for d in [1, 40, 64, 128, 200, 256] {
        for dtype in DType::ALL {
            for deterministic in [false, true] {
                let standard = BackwardOptions {
                    algorithm: BackwardAlgorithm::Standard,
                    deterministic,
                };
                let problem =
                    Problem::new([2, 3, 113, d], [2, 3, 203, d], [2, 3, 203, d], &options).unwrap();
                let p = BackwardPlan::new(&CompiledLimits::H200, dtype, &problem, &standard, None)
                    .unwrap();
                assert_eq!(p.algorithm, BackwardAlgorithm::Standard);
                let families: Vec<Family> = p.launches.iter().map(|l| l.kernel.family).collect();
                assert_eq!(
                    families,
                    [
                        Family::Standard(StandardStage::Scores),
                        Family::Standard(StandardStage::Softmax),
                        Family::StandardBackward(StandardBackwardStage::ProbsGradient),
                        Family::StandardBackward(StandardBackwardStage::ScoresGradient),
                        Family::StandardBackward(StandardBackwardStage::QueryGradient),
                        Family::StandardBackward(StandardBackwardStage::KeyValueGradients),
                    ]
                );
                let d_tiles = d.div_ceil(16) as u32;
                let grids: Vec<_> = p.launches.iter().map(|l| l.launch.grid).collect();
                assert_eq!(
                    grids,
                    [
                        (13, 8, 6),
                        (15, 6, 1),
                        (13, 8, 6),
                        (15, 6, 1),
                        (d_tiles, 8, 6),
                        (d_tiles, 13, 6),
                    ],
                    "d {d}"
                );
                for l in &p.launches {
                    assert!(KERNELS.contains(&l.kernel), "{l:?}");
                    assert!(l.launch.threads <= l.kernel.max_threads(), "{l:?}");
                }
                let matrix = 6 * 113 * 203;
                assert_eq!((p.scores, p.probs, p.dq_accumulator), (matrix, matrix, 0));
                assert_eq!(
                    p.workspace_bytes(),
                    4 * matrix + dtype.size_bytes() * matrix + 4 * 6 * 113
                );
                assert!(p.to_string().contains("standard backward:"), "{p}");
            }
        }
    }
    assert_eq!(
        "standard".parse::<BackwardAlgorithm>().ok(),
        Some(BackwardAlgorithm::Standard)
    );
}

#[test]
fn the_backward_plans_three_launches_that_fit_at_every_head_dim() {
    use flash_attn::attention::BackwardPlan;
    use flash_kernels::registry::BackwardStage;
    let scalar = BackwardOptions {
        algorithm: BackwardAlgorithm::Fa2,
        deterministic: false,
    };
    let options = AttentionOptions {
        causal: true,
        ..Default::default()
    };
    // 113 queries, 203 keys, 2·3 heads: the main kernel over ⌈203/64⌉ key blocks; the pre- and
    // post-pass wide at f16/bf16 and head dims that are multiples of 8 (over ⌈113 / rows per
    // block⌉ row blocks), element-wise elsewhere (over ⌈113/64⌉), saying why.
    for d in [1, 8, 32, 33, 40, 64, 72, 100, 128, 129, 136, 200, 256] {
        for dtype in DType::ALL {
            let problem =
                Problem::new([2, 3, 113, d], [2, 3, 203, d], [2, 3, 203, d], &options).unwrap();
            let p =
                BackwardPlan::new(&CompiledLimits::H200, dtype, &problem, &scalar, None).unwrap();
            let [pre, main, post] = p.launches[..] else {
                panic!("three launches: {p}");
            };
            let stages = [pre, main, post].map(|l| match l.kernel.family {
                Family::Fa2Backward(stage) => stage,
                other => panic!("{other:?}"),
            });
            let wide = dtype != DType::F32 && d % 8 == 0;
            let (passes, pass_rows) = if wide {
                let rows = 256 / (d as u32 / 8).next_power_of_two() * 2;
                assert_eq!(
                    rows,
                    flash_kernels::bwd::fa2::config::wide_pass_rows(d as u32)
                );
                let stages = [
                    BackwardStage::PreprocessWide,
                    BackwardStage::PostprocessWide,
                ];
                assert_eq!(p.element_wise_passes, None, "{p}");
                (stages, rows)
            } else {
                let reason = p.element_wise_passes.clone().unwrap();
                let why = if dtype == DType::F32 {
                    "f32".to_string()
                } else {
                    format!("head_dim {d} is not a multiple of 8")
                };
                assert!(reason.starts_with(&why), "{reason}");
                assert!(
                    p.to_string()
                        .ends_with(&format!("; element-wise pre- and post-pass: {reason}")),
                    "{p}"
                );
                ([BackwardStage::Preprocess, BackwardStage::Postprocess], 64)
            };
            assert_eq!([stages[0], stages[2]], passes, "{dtype} d {d}");
            let capacity = main.kernel.head_dim_capacity().unwrap();
            let smallest = [32, 64, 128, 256].into_iter().find(|&c| c >= d as u32);
            assert_eq!(Some(capacity), smallest, "d {d}");
            let row_blocks = 113u32.div_ceil(pass_rows);
            assert_eq!(pre.launch.grid, (row_blocks, 6, 1), "{dtype} d {d}");
            assert_eq!(post.launch.grid, (row_blocks, 6, 1), "{dtype} d {d}");
            assert_eq!((pre.launch.threads, post.launch.threads), (256, 256));
            assert_eq!(main.launch.grid, (4, 6, 1));
            assert_eq!(
                (p.block_cols, p.block_rows),
                (64, if d > 128 { 32 } else { 64 })
            );
            for &l in &p.launches {
                assert!(l.launch.threads <= l.kernel.max_threads(), "{l:?}");
                assert!(KERNELS.contains(&l.kernel), "{l:?}");
                assert!(l.launch.shared_bytes <= 227 * 1024, "d {d}: {l:?}");
            }
            assert_eq!(p.dq_accumulator, 6 * 113 * d);
            assert_eq!(p.delta, 6 * 113);
        }
    }
    // d = 256: K_j, V_j (64 × 257), Q_i, dO_i (32 × 257), P, dS (32 × 65), L_i, D_i (32), f32.
    let problem = Problem::new([1, 1, 8, 256], [1, 1, 8, 256], [1, 1, 8, 256], &options).unwrap();
    let p = BackwardPlan::new(&CompiledLimits::H200, DType::Bf16, &problem, &scalar, None).unwrap();
    let expected = (2 * 64 * 257 + 2 * 32 * 257 + 2 * 32 * 65 + 2 * 32) * 4;
    assert_eq!(p.launches[1].launch.shared_bytes, expected);
    assert_eq!(
        p.launches[1].kernel.to_string(),
        "fa2_backward_main_bf16_d256"
    );
    // A device with less shared memory (A100's 163 KiB) is named.
    let small = CompiledLimits {
        shared_memory_per_block: 163 * 1024,
        hopper: false,
        multiprocessors: 108,
    };
    let err = BackwardPlan::new(&small, DType::Bf16, &problem, &scalar, None).unwrap_err();
    assert!(err.to_string().contains("shared memory"), "{err}");
}

#[test]
fn backward_kernel_names_read_back() {
    for name in [
        "fa2_backward_preprocess_f32",
        "fa2_backward_main_bf16_d128",
        "fa2_backward_postprocess_f16",
        "fa2_backward_preprocess_wide_bf16",
        "fa2_backward_postprocess_wide_f16",
        "fa2tc_backward_bf16_d128",
        "fa2tc_backward_f16_d256",
        "fa2_backward_main_f32_d64_grouped",
        "fa2tc_backward_bf16_d128_grouped",
        "fa2tc_backward_bf16_d128_grouped_varlen_local",
        "fa2tc_backward_f16_d64_varlen",
        "backward_group_sum_f16",
    ] {
        let id: KernelId = name.parse().unwrap();
        assert_eq!(id.to_string(), name);
        assert!(KERNELS.contains(&id), "{name}");
    }
    // FA3's packed and local forms (Hopper module), in the atomic order only.
    for (name, compiled) in [
        ("fa3_backward_bf16_d128_grouped_varlen", true),
        ("fa3_backward_f16_d64_varlen_local", true),
        ("fa3_backward_f16_d96_local", true),
        ("fa3_backward_f16_d96_local_deterministic", false),
        ("fa3_backward_bf16_d64_varlen_deterministic", false),
    ] {
        let id: KernelId = name.parse().unwrap();
        assert_eq!(id.to_string(), name);
        assert_eq!(
            flash_kernels::registry::HOPPER_KERNELS.contains(&id),
            compiled,
            "{name}"
        );
    }
    for bad in [
        "fa2_backward_main_f32",
        "fa2_backward_middle_f32",
        "fa2_backward_f32",
        "fa2tc_backward_bf16",
        "fa2tc_backward_bf16_d128_grouped_grouped",
        "fa2_backward_preprocess_f32_grouped",
        "fa2_backward_wide_bf16",
        "fa2_backward_preprocess_narrow_bf16",
        "fa2_backward_preprocess_wide",
        "backward_group_sum_f64",
    ] {
        assert!(bad.parse::<KernelId>().is_err(), "{bad:?} parsed");
    }
    // A well-formed name of a kernel that is not compiled: the wide passes read 16-bit elements.
    for name in [
        "fa2_backward_preprocess_wide_f32",
        "fa2_backward_postprocess_wide_f32",
    ] {
        let id: KernelId = name.parse().unwrap();
        assert_eq!(id.to_string(), name);
        assert!(!KERNELS.contains(&id), "{name}");
    }
}

#[test]
fn fa3_persistent_grid_has_one_block_per_sm_at_most() {
    let options = AttentionOptions {
        fa3_tiling: Some(
            flash_kernels::fwd::fa3::config::Fa3Tiling::new(2, 128).on_persistent_grid(),
        ),
        ..Default::default()
    };
    let p = plan(Algorithm::Fa3, DType::Bf16, [4, 16, 4096, 128], &options);
    assert_eq!(p.launches[0].launch.grid, (132, 1, 1), "{p}");
    assert!(p.to_string().contains("persistent"), "{p}");
    // 2 row blocks × 3 heads: six tiles, six blocks.
    let p = plan(Algorithm::Fa3, DType::Bf16, [1, 3, 200, 128], &options);
    assert_eq!(p.launches[0].launch.grid, (6, 1, 1), "{p}");
}

/// The tensor-core backward's plan: the default for f16/bf16 at head dims that are multiples of
/// 8 (on the smallest compiled capacity that holds d, with that capacity's tiling), the scalar
/// kernels with the reason elsewhere, deterministic mode's flags, and misaligned rows.
#[test]
fn the_tensor_core_backward_plan_and_its_fallbacks() {
    use flash_kernels::bwd::fa2_tc::config::Fa2TcBackwardTiling;
    use flash_kernels::common::params::TensorView;
    let options = AttentionOptions {
        causal: true,
        ..Default::default()
    };
    let problem_at =
        |d: usize| Problem::new([2, 3, 113, d], [2, 3, 203, d], [2, 3, 203, d], &options).unwrap();
    let plan = |dtype, d, backward: &BackwardOptions, views: Option<&BackwardViews>| {
        BackwardPlan::new(
            &CompiledLimits::H200,
            dtype,
            &problem_at(d),
            backward,
            views,
        )
    };
    // Asked for by name (the default, fa3, runs on the H200 up to d = 128: see
    // `the_fa3_backward_plan_and_its_fallbacks`).
    let default = BackwardOptions {
        algorithm: BackwardAlgorithm::Fa2Tc,
        deterministic: false,
    };
    for d in [8, 16, 40, 64, 72, 96, 128, 136, 192, 200, 256] {
        for dtype in [DType::F16, DType::Bf16] {
            let p = plan(dtype, d, &default, None).unwrap();
            assert_eq!(p.algorithm, BackwardAlgorithm::Fa2Tc, "{p}");
            assert_eq!(p.fallback, None, "{p}");
            let main = p.launches[1];
            let capacity = main.kernel.head_dim_capacity().unwrap();
            let smallest = [64, 128, 192, 256].into_iter().find(|&c| c >= d as u32);
            assert_eq!(Some(capacity), smallest, "d {d}");
            assert!(matches!(main.kernel.family, Family::Fa2TcBackward { .. }));
            assert!(main.kernel.uses_tensor_cores());
            let tiling = Fa2TcBackwardTiling::for_capacity(capacity);
            assert_eq!(
                (p.block_rows, p.block_cols),
                (tiling.block_rows, tiling.block_cols())
            );
            assert_eq!(main.launch.grid, (203u32.div_ceil(p.block_cols), 6, 1));
            assert_eq!(main.launch.threads, 256);
            assert_eq!(main.launch.shared_bytes, tiling.shared_bytes(capacity));
            for l in &p.launches {
                assert!(KERNELS.contains(&l.kernel), "{l:?}");
                assert!(l.launch.threads <= l.kernel.max_threads(), "{l:?}");
                assert!(l.launch.shared_bytes <= 227 * 1024, "d {d}: {l:?}");
            }
            assert!(matches!(
                p.launches[0].kernel.family,
                Family::Fa2Backward(_)
            ));
            assert_eq!(p.dq_flags, 0);
            assert!(p.to_string().contains(&main.kernel.to_string()), "{p}");
        }
    }
    // d = 128: B_c = 128 keys (8 warps of 16), B_r = 32; d = 256: two warps per key tile.
    let p = plan(DType::Bf16, 128, &default, None).unwrap();
    assert_eq!(p.launches[1].kernel.to_string(), "fa2tc_backward_bf16_d128");
    assert_eq!((p.block_rows, p.block_cols), (32, 128));
    assert_eq!(
        plan(DType::Bf16, 256, &default, None).unwrap().block_cols,
        64
    );
    // Head dims that are not multiples of 8, and f32: the scalar kernels, with the reason.
    for d in [1, 20, 33, 100, 255] {
        let p = plan(DType::Bf16, d, &default, None).unwrap();
        assert_eq!(p.algorithm, BackwardAlgorithm::Fa2, "{p}");
        let reason = p.fallback.clone().unwrap();
        assert!(
            reason.starts_with("fa2-tc falls back to fa2: ")
                && reason.contains(&format!("head_dim {d} is not a multiple of 8")),
            "{reason}"
        );
        assert!(p.to_string().contains(&reason), "{p}");
    }
    let p = plan(DType::F32, 64, &default, None).unwrap();
    assert!(
        p.fallback
            .unwrap()
            .contains("f32 has no tensor-core kernel")
    );
    // Asked for explicitly, the scalar kernels run without a fallback.
    let scalar = BackwardOptions {
        algorithm: BackwardAlgorithm::Fa2,
        deterministic: false,
    };
    let p = plan(DType::Bf16, 64, &scalar, None).unwrap();
    assert_eq!((p.algorithm, p.fallback), (BackwardAlgorithm::Fa2, None));
    // Deterministic: one flag per (batch·head, row block of B_r); refused where only the scalar
    // kernels can run.
    let deterministic = BackwardOptions {
        deterministic: true,
        ..Default::default()
    };
    let p = plan(DType::Bf16, 64, &deterministic, None).unwrap();
    assert_eq!(p.dq_flags, 6 * 113usize.div_ceil(p.block_rows as usize));
    assert!(p.to_string().contains("deterministic"), "{p}");
    for (dtype, d) in [(DType::F32, 64), (DType::Bf16, 20)] {
        let err = plan(dtype, d, &deterministic, None).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidArgument {
                    name: "deterministic",
                    ..
                }
            ),
            "{err}"
        );
    }
    // Rows that a 16-byte copy cannot read, or dK's pair stores cannot write aligned.
    let (aligned, views) = aligned_views(64);
    assert_eq!(
        plan(DType::Bf16, 64, &default, Some(&views))
            .unwrap()
            .fallback,
        None
    );
    for (name, view) in [("q", 0), ("d_o", 3), ("dk", 4)] {
        let mut bad = views;
        let shifted = TensorView {
            row_stride: 68,
            ..aligned
        };
        match view {
            0 => bad.q = shifted,
            3 => bad.d_o = shifted,
            _ => bad.dk = shifted,
        }
        // fa2-tc, and fa3 (the default: TMA reads the same rows) through it.
        for backward in [default, BackwardOptions::default()] {
            let p = plan(DType::Bf16, 64, &backward, Some(&bad)).unwrap();
            assert_eq!(p.algorithm, BackwardAlgorithm::Fa2, "{p}");
            let reason = p.fallback.unwrap();
            assert!(
                reason.contains(&format!("{name}'s rows are not 16-byte aligned")),
                "{reason}"
            );
        }
    }
}

/// The packed-batch, window (`local`) and packed-with-window kernels are FA2-TC's default tiling
/// at every head dim it compiles, and FA3's default split on the one-tile grid at each of its
/// head dims, in both 16-bit dtypes: the plans take those defaults for those calls.
#[test]
fn every_head_dim_has_packed_and_local_kernels_at_its_default_tiling() {
    for form in [
        KernelForm::Packed,
        KernelForm::Local,
        KernelForm::PackedLocal,
    ] {
        let of_form = |list: &[KernelId]| -> Vec<KernelId> {
            list.iter()
                .filter(|k| {
                    matches!(k.family, Family::Fa2Tc { form: f, .. } | Family::Fa3 { form: f, .. }
                        if f == form)
                })
                .copied()
                .collect()
        };
        let fa2_tc = of_form(KERNELS.as_slice());
        let fa3 = of_form(flash_kernels::registry::HOPPER_KERNELS.as_slice());
        let head_dims = flash_attn::attention::fa2_tc_head_dims();
        assert_eq!(fa2_tc.len(), 2 * head_dims.len(), "{form:?}: {fa2_tc:?}");
        assert_eq!(fa3.len(), 2 * 5, "{form:?}: {fa3:?}");
        for dtype in [ElementType::F16, ElementType::Bf16] {
            for &d in &head_dims {
                let tiling = Fa2TcTiling::default_for(d);
                let family = Family::Fa2Tc {
                    head_dim: d,
                    tiling,
                    form,
                };
                assert!(
                    fa2_tc.contains(&KernelId::new(family, dtype)),
                    "no {form:?} FA2-TC kernel at d = {d}, {dtype:?}: {fa2_tc:?}"
                );
            }
            for d in [64, 96, 128, 192, 256] {
                let tiling = Fa3Tiling {
                    persistent: false,
                    ..Fa3Tiling::default_for(d, false, 4096)
                };
                let family = Family::Fa3 {
                    head_dim: d,
                    tiling,
                    form,
                };
                assert!(
                    fa3.contains(&KernelId::new(family, dtype)),
                    "no {form:?} FA3 kernel at d = {d}, {dtype:?}: {fa3:?}"
                );
            }
        }
    }
}

/// FA3's backward asked for by name on a 9.0 device: its main kernel between FA2's pre- and
/// post-pass, at the smallest compiled head dim that holds d, its launch sized by its tiling; and
/// each reason it falls back to fa2-tc (or further), named in the plan.
#[test]
fn the_fa3_backward_plan_and_its_fallbacks() {
    use flash_kernels::bwd::fa3::config::Fa3BackwardTiling;
    use flash_kernels::registry::{BackwardStage, HOPPER_KERNELS};
    let causal = AttentionOptions {
        causal: true,
        ..Default::default()
    };
    let problem_at = |d: usize, kv_heads: usize| {
        Problem::new(
            [2, 4, 113, d],
            [2, kv_heads, 203, d],
            [2, kv_heads, 203, d],
            &causal,
        )
        .unwrap()
    };
    // fa3 is the default (its second version measured 1.4-1.6x fa2-tc, call 23).
    let default = BackwardOptions::default();
    assert_eq!(default.algorithm, BackwardAlgorithm::Fa3);
    fn plan_on(
        limits: &CompiledLimits,
        dtype: DType,
        problem: &Problem,
        backward: &BackwardOptions,
        views: Option<&BackwardViews>,
    ) -> flash_attn::Result<BackwardPlan> {
        BackwardPlan::new(limits, dtype, problem, backward, views)
    }
    let h200 = CompiledLimits::H200;
    for (d, compiled) in [
        (8, 64),
        (40, 64),
        (64, 64),
        (72, 96),
        (96, 96),
        (104, 128),
        (128, 128),
    ] {
        for dtype in [DType::F16, DType::Bf16] {
            for kv_heads in [4, 2] {
                let p = plan_on(&h200, dtype, &problem_at(d, kv_heads), &default, None).unwrap();
                assert_eq!(p.algorithm, BackwardAlgorithm::Fa3, "{p}");
                assert_eq!(p.fallback, None, "{p}");
                let main = p.launches[1];
                assert_eq!(
                    main.kernel.family,
                    Family::Fa3Backward {
                        head_dim: compiled,
                        grouped: kv_heads != 4,
                        deterministic: false,
                        form: KernelForm::Dense,
                    },
                    "d {d}"
                );
                assert!(HOPPER_KERNELS.contains(&main.kernel), "{}", main.kernel);
                assert_eq!(main.kernel.module(), Module::Hopper);
                let tiling = Fa3BackwardTiling::for_head_dim(compiled);
                assert_eq!((p.block_rows, p.block_cols), (64, 128));
                assert_eq!(main.launch.grid, (203u32.div_ceil(128), 8, 1));
                assert_eq!(main.launch.threads, 384);
                assert_eq!(main.launch.shared_bytes, tiling.shared_bytes(compiled));
                assert!(main.launch.threads <= main.kernel.max_threads());
                assert!(matches!(
                    p.launches[0].kernel.family,
                    Family::Fa2Backward(BackwardStage::PreprocessWide)
                ));
                assert!(matches!(
                    p.launches[2].kernel.family,
                    Family::Fa2Backward(BackwardStage::PostprocessWide)
                ));
                // Grouped: the group sum after the post-pass.
                assert_eq!(p.launches.len(), if kv_heads == 4 { 3 } else { 4 });
                assert!(p.to_string().contains(&main.kernel.to_string()), "{p}");
            }
        }
    }
    let fa2_tc_reason = |limits: &CompiledLimits, dtype, d, backward: &BackwardOptions| {
        let p = plan_on(limits, dtype, &problem_at(d, 4), backward, None).unwrap();
        assert_eq!(p.algorithm, BackwardAlgorithm::Fa2Tc, "{p}");
        let reason = p.fallback.clone().unwrap();
        assert!(reason.starts_with("fa3 falls back to fa2-tc: "), "{reason}");
        assert!(p.to_string().contains(&reason), "{p}");
        reason
    };
    // Another GPU: fa2-tc, as before this kernel existed.
    let ampere = CompiledLimits {
        hopper: false,
        ..CompiledLimits::H200
    };
    let reason = fa2_tc_reason(&ampere, DType::Bf16, 64, &default);
    assert!(reason.contains("not compute capability 9.0"), "{reason}");
    // Past the largest compiled head dim: fa2-tc's capacities.
    let reason = fa2_tc_reason(&h200, DType::Bf16, 192, &default);
    assert!(
        reason.contains("past the FA3 backward's largest, 128"),
        "{reason}"
    );
    // Deterministic mode: fa3 orders the adds itself (one flag per row block of its B_r).
    let deterministic = BackwardOptions {
        deterministic: true,
        ..default
    };
    let p = plan_on(&h200, DType::F16, &problem_at(128, 4), &deterministic, None).unwrap();
    assert_eq!(
        (p.algorithm, &p.fallback),
        (BackwardAlgorithm::Fa3, &None),
        "{p}"
    );
    assert!(p.deterministic && p.dq_flags > 0, "{p}");
    assert_eq!(p.block_rows, 64, "{p}");
    assert!(
        matches!(
            p.launches[1].kernel.family,
            Family::Fa3Backward {
                deterministic: true,
                ..
            }
        ),
        "{p}"
    );
    // f32 and head dims that are not multiples of 8: both steps of the chain, to fa2.
    for (dtype, d, why) in [
        (DType::F32, 64, "f32 has no FA3 kernel"),
        (DType::Bf16, 20, "head_dim 20 is not a multiple of 8"),
    ] {
        let p = plan_on(&h200, dtype, &problem_at(d, 4), &default, None).unwrap();
        assert_eq!(p.algorithm, BackwardAlgorithm::Fa2, "{p}");
        let reason = p.fallback.unwrap();
        assert!(
            reason.starts_with(&format!("fa3 falls back to fa2-tc: {why}"))
                && reason.contains("; fa2-tc falls back to fa2: "),
            "{reason}"
        );
    }
    // Asked for by name, fa2-tc runs on the H200 with no fallback.
    let fa2_tc = BackwardOptions {
        algorithm: BackwardAlgorithm::Fa2Tc,
        deterministic: false,
    };
    let p = plan_on(&h200, DType::Bf16, &problem_at(64, 4), &fa2_tc, None).unwrap();
    assert_eq!((p.algorithm, p.fallback), (BackwardAlgorithm::Fa2Tc, None));
    assert_eq!(
        "fa3".parse::<BackwardAlgorithm>().unwrap(),
        BackwardAlgorithm::Fa3
    );
}

/// The wide pre- and post-pass (16-byte loads and stores) run wherever the dtype is 16-bit, the
/// head dim a multiple of 8 and O, dO and dQ have 16-byte-aligned rows, whichever main kernel
/// runs; a view that is not aligned runs the element-wise passes, and the plan names it. O and
/// dQ do not move the main kernel (it reads neither); dO moves both.
#[test]
fn the_wide_passes_need_aligned_o_d_o_and_dq() {
    use flash_attn::attention::backward_plan::BackwardViews;
    use flash_kernels::common::params::TensorView;
    use flash_kernels::registry::BackwardStage;
    let problem = Problem::new(
        [2, 3, 113, 72],
        [2, 3, 203, 72],
        [2, 3, 203, 72],
        &Default::default(),
    )
    .unwrap();
    let (aligned, views) = aligned_views(72);
    let plan = |views: &BackwardViews| {
        let options = BackwardOptions::default();
        BackwardPlan::new(
            &CompiledLimits::H200,
            DType::Bf16,
            &problem,
            &options,
            Some(views),
        )
        .unwrap()
    };
    let passes = |p: &BackwardPlan| {
        [p.launches[0], p.launches[2]].map(|l| match l.kernel.family {
            Family::Fa2Backward(stage) => stage,
            other => panic!("{other:?}"),
        })
    };
    let p = plan(&views);
    assert_eq!(
        (p.algorithm, &p.fallback),
        (BackwardAlgorithm::Fa3, &None),
        "{p}"
    );
    assert_eq!(
        passes(&p),
        [
            BackwardStage::PreprocessWide,
            BackwardStage::PostprocessWide
        ]
    );
    assert!(p.has_wide_passes());
    assert_eq!(p.element_wise_passes, None);
    // d = 72: 9 chunks on 16 lanes, 2 rows per warp, 32 rows per block of 256 threads.
    assert_eq!(
        p.launches[0].launch.grid,
        (113u32.div_ceil(32), 6, 1),
        "{p}"
    );
    assert_eq!(
        p.kernel_names(),
        "fa2_backward_preprocess_wide_bf16+fa3_backward_bf16_d96+\
         fa2_backward_postprocess_wide_bf16"
    );
    for (name, moves_main) in [("o", false), ("d_o", true), ("dq", false)] {
        for shifted in [
            TensorView {
                addr: aligned.addr + 2,
                ..aligned
            },
            TensorView {
                row_stride: 76,
                ..aligned
            },
            TensorView {
                head_stride: 203 * 72 + 4,
                ..aligned
            },
        ] {
            let mut bad = views;
            match name {
                "o" => bad.o = shifted,
                "d_o" => bad.d_o = shifted,
                _ => bad.dq = shifted,
            }
            let p = plan(&bad);
            assert_eq!(
                passes(&p),
                [BackwardStage::Preprocess, BackwardStage::Postprocess],
                "{name}: {p}"
            );
            assert!(!p.has_wide_passes());
            let reason = p.element_wise_passes.clone().unwrap();
            assert!(
                reason.starts_with(&format!("{name}'s rows are not 16-byte aligned")),
                "{reason}"
            );
            assert!(p.to_string().contains(&reason), "{p}");
            assert_eq!(p.launches[0].launch.grid, (2, 6, 1), "{p}");
            let main = if moves_main {
                BackwardAlgorithm::Fa2
            } else {
                BackwardAlgorithm::Fa3
            };
            assert_eq!(p.algorithm, main, "{name}: {p}");
        }
    }
}

/// A (batch, 3 heads, 203 rows, `head_dim`) view at a 16-byte-aligned address with contiguous
/// rows, and the backward's views, every one of them that view.
fn aligned_views(head_dim: u64) -> (flash_kernels::common::params::TensorView, BackwardViews) {
    let aligned = flash_kernels::common::params::TensorView {
        addr: 1 << 20,
        batch_stride: 3 * 203 * head_dim,
        head_stride: 203 * head_dim,
        row_stride: head_dim,
    };
    let views = BackwardViews {
        q: aligned,
        k: aligned,
        v: aligned,
        o: aligned,
        d_o: aligned,
        dq: aligned,
        dk: aligned,
        dv: aligned,
    };
    (aligned, views)
}
