//! The kernel lists (`flash_kernels::registry::KERNELS`, `HOPPER_KERNELS`) against the PTX
//! modules the build produced, and the launch plan's choices, on the CPU.

use flash_attn::attention::{
    Algorithm, AttentionOptions, Blocks, CompiledLimits, Plan, Problem, StatisticsKind,
};
use flash_attn::{DType, Error};
use flash_kernels::fwd::fa2_tc::config::Fa2TcTiling;
use flash_kernels::registry::{ElementType, Family, KERNELS, KernelId, Module};

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
        },
        ElementType::Bf16,
    );
    assert_eq!(id.to_string(), "fa2tc_forward_bf16_d128_w4r2s1c64");
    assert_eq!(id.max_threads(), 128);
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

fn plan(algorithm: Algorithm, dtype: DType, dims: [usize; 4], options: &AttentionOptions) -> Plan {
    let problem = Problem::new(dims, dims, dims, options).unwrap();
    Plan::new(
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
    let err = Plan::new(
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
    let p = plan(Algorithm::Fa3, DType::Bf16, [2, 16, 4096, 128], &options);
    assert_eq!(p.fallback, None, "{p}");
    assert_eq!(p.kernel_names(), "fa3_forward_bf16_d128_w2c128");
    // 2 consumer warpgroups of 64 rows: B_r = 128; 384 threads.
    assert_eq!(p.launches[0].launch.grid, (32, 32, 1));
    assert_eq!(p.launches[0].launch.threads, 384);
    let p = plan(Algorithm::Fa3, DType::F16, [1, 4, 1000, 80], &options);
    assert_eq!(p.kernel_names(), "fa3_forward_f16_d96_w2c128", "{p}");
    let p = plan(Algorithm::Fa3, DType::Bf16, [1, 4, 1000, 64], &options);
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
    let p = Plan::new(
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
    let err = Plan::new(
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
