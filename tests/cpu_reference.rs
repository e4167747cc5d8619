//! CPU tests: the f64 reference (hand-computed cases and properties) and the host API's argument
//! checks, none of which need a GPU.

mod common;

use flash_attn::attention::{AttentionOptions, Problem, fa1_blocks, fa2_blocks};
use flash_attn::{Algorithm, DType, Error};
use flash_attn_lab::model::reference::{attention_in_dtype, attention_reference};
use flash_kernels::registry::KernelForm;
use ndarray::{Array4, Axis, array, s};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

fn random(dims: [usize; 4], rng: &mut impl rand::Rng) -> Array4<f64> {
    Array4::from_shape_simple_fn(dims, || StandardNormal.sample(rng))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * (1.0 + b.abs())
}

#[test]
fn hand_computed_two_keys() {
    // q = [1, 0]; keys [1, 0] and [0, 1]; scale 1 → scores [1, 0]; P = [e, 1]/(e + 1).
    let q = array![[[[1.0, 0.0]]]];
    let k = array![[[[1.0, 0.0], [0.0, 1.0]]]];
    let v = array![[[[1.0, 2.0], [3.0, 4.0]]]];
    let r = attention_reference(q.view(), k.view(), v.view(), false, 1.0);
    let e = std::f64::consts::E;
    let (p0, p1) = (e / (e + 1.0), 1.0 / (e + 1.0));
    assert!(close(r.o[[0, 0, 0, 0]], p0 * 1.0 + p1 * 3.0));
    assert!(close(r.o[[0, 0, 0, 1]], p0 * 2.0 + p1 * 4.0));
    assert!(close(r.logsumexp[[0, 0, 0]], (e + 1.0).ln()));
}

#[test]
fn causal_mask_is_bottom_right_aligned() {
    // seqlen_q = 2, seqlen_k = 3: query 0 sees keys 0 and 1, query 1 sees all three.
    let q = Array4::<f64>::zeros((1, 1, 2, 1));
    let k = Array4::<f64>::zeros((1, 1, 3, 1));
    let v = array![[[[3.0], [6.0], [30.0]]]];
    let r = attention_reference(q.view(), k.view(), v.view(), true, 1.0);
    assert!(close(r.o[[0, 0, 0, 0]], 4.5)); // mean of 3 and 6
    assert!(close(r.o[[0, 0, 1, 0]], 13.0)); // mean of all three
    assert!(close(r.logsumexp[[0, 0, 0]], 2f64.ln()));
}

#[test]
fn rows_without_visible_keys_give_zero_and_minus_infinity() {
    // seqlen_q = 4 > seqlen_k = 2: queries 0 and 1 see no key.
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let (q, k, v) = (
        random([1, 2, 4, 8], &mut rng),
        random([1, 2, 2, 8], &mut rng),
        random([1, 2, 2, 8], &mut rng),
    );
    let r = attention_reference(q.view(), k.view(), v.view(), true, 0.5);
    for h in 0..2 {
        for i in 0..2 {
            assert!(r.o.slice(s![0, h, i, ..]).iter().all(|&x| x == 0.0));
            assert_eq!(r.logsumexp[[0, h, i]], f64::NEG_INFINITY);
        }
        assert!(r.logsumexp[[0, h, 2]].is_finite());
    }
}

#[test]
fn rows_of_p_sum_to_one() {
    // With V = 1 everywhere, O = P·1 = rowsum(P).
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let (q, k) = (
        random([2, 3, 17, 5], &mut rng),
        random([2, 3, 23, 5], &mut rng),
    );
    let v = Array4::<f64>::ones((2, 3, 23, 5));
    for causal in [false, true] {
        let r = attention_reference(q.view(), k.view(), v.view(), causal, 0.7);
        assert!(
            r.o.iter().all(|&x| (x - 1.0).abs() < 1e-12),
            "causal = {causal}"
        );
    }
}

#[test]
fn shifting_a_row_of_scores_leaves_o_unchanged() {
    // An extra dimension with q = c/scale and k = 1 adds c to every score of a row.
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let (q, k, v) = (
        random([1, 2, 9, 4], &mut rng),
        random([1, 2, 11, 4], &mut rng),
        random([1, 2, 11, 4], &mut rng),
    );
    let scale = 0.5;
    let base = attention_reference(q.view(), k.view(), v.view(), false, scale);
    let shifts = [3.0, -7.5, 40.0, 0.1, 12.0, -1.0, 5.0, 9.0, -20.0];
    let extend = |a: &Array4<f64>, extra: &dyn Fn(usize) -> f64| {
        let mut out = Array4::<f64>::zeros((a.dim().0, a.dim().1, a.dim().2, 5));
        out.slice_mut(s![.., .., .., ..4]).assign(a);
        for (i, mut row) in out.axis_iter_mut(Axis(2)).enumerate() {
            row.slice_mut(s![.., .., 4]).fill(extra(i));
        }
        out
    };
    let q_shifted = extend(&q, &|i| shifts[i] / scale);
    let (k_shifted, v_shifted) = (extend(&k, &|_| 1.0), extend(&v, &|_| 0.0));
    let shifted = attention_reference(
        q_shifted.view(),
        k_shifted.view(),
        v_shifted.view(),
        false,
        scale,
    );
    for (a, b) in shifted
        .o
        .slice(s![.., .., .., ..4])
        .iter()
        .zip(base.o.iter())
    {
        assert!((a - b).abs() < 1e-12);
    }
    for (i, shift) in shifts.iter().enumerate() {
        let moved = shifted.logsumexp[[0, 0, i]] - base.logsumexp[[0, 0, i]];
        assert!((moved - shift).abs() < 1e-9);
    }
}

#[test]
fn dtype_baseline_rounds_p_and_o() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let (q, k, v) = (
        random([1, 1, 33, 16], &mut rng),
        random([1, 1, 40, 16], &mut rng),
        random([1, 1, 40, 16], &mut rng),
    );
    let rows: Vec<usize> = (0..33).collect();
    let exact = attention_reference(q.view(), k.view(), v.view(), false, 0.25).o;
    let f32_error = (&attention_in_dtype::<f32>(q.view(), k.view(), v.view(), false, 0.25, &rows)
        - &exact)
        .mapv(f64::abs)
        .fold(0.0f64, |m, &x| m.max(x));
    let bf16_error =
        (&attention_in_dtype::<half::bf16>(q.view(), k.view(), v.view(), false, 0.25, &rows)
            - &exact)
            .mapv(f64::abs)
            .fold(0.0f64, |m, &x| m.max(x));
    assert!(f32_error < 1e-6, "{f32_error}");
    assert!(bf16_error > 1e-4 && bf16_error < 5e-2, "{bf16_error}");
}

fn expect_invalid(result: flash_attn::Result<Problem>, argument: &str) {
    match result {
        Err(Error::InvalidArgument { name, .. }) => assert_eq!(name, argument),
        Err(other) => panic!("expected an invalid `{argument}`, got {other}"),
        Ok(p) => panic!("expected an invalid `{argument}`, got {p:?}"),
    }
}

#[test]
fn mismatched_and_unsupported_shapes_are_named_errors() {
    let o = AttentionOptions::default();
    expect_invalid(
        Problem::new([2, 3, 16, 64], [2, 4, 16, 64], [2, 4, 16, 64], &o),
        "k",
    );
    expect_invalid(
        Problem::new([2, 3, 16, 64], [2, 3, 16, 64], [2, 3, 15, 64], &o),
        "v",
    );
    expect_invalid(
        Problem::new([2, 3, 16, 64], [2, 3, 16, 32], [2, 3, 16, 32], &o),
        "k",
    );
    expect_invalid(
        Problem::new([2, 3, 0, 64], [2, 3, 16, 64], [2, 3, 16, 64], &o),
        "q",
    );
    expect_invalid(
        Problem::new([1, 1, 16, 257], [1, 1, 16, 257], [1, 1, 16, 257], &o),
        "head_dim",
    );
    for bad in [f32::NAN, f32::INFINITY, 0.0, -1.0] {
        let o = AttentionOptions {
            softmax_scale: Some(bad),
            ..Default::default()
        };
        expect_invalid(
            Problem::new([1, 1, 4, 8], [1, 1, 4, 8], [1, 1, 4, 8], &o),
            "softmax_scale",
        );
    }
    expect_invalid(
        Problem::new([300, 300, 4, 8], [300, 300, 4, 8], [300, 300, 4, 8], &o),
        "batch × heads",
    );
    let message = Problem::new([1, 1, 16, 300], [1, 1, 16, 300], [1, 1, 16, 300], &o)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("head_dim") && message.contains("300") && message.contains("1 to 256"),
        "{message}"
    );
}

#[test]
fn names_parse_or_list_the_allowed_values() {
    assert_eq!("fa2".parse::<Algorithm>().unwrap(), Algorithm::Fa2);
    assert_eq!("bf16".parse::<DType>().unwrap(), DType::Bf16);
    let message = "fa9".parse::<Algorithm>().unwrap_err().to_string();
    assert!(
        message.contains("auto, fa3, fa2-tc, fa2, fa1, standard"),
        "{message}"
    );
    assert_eq!("auto".parse::<Algorithm>().unwrap(), Algorithm::default());
}

#[test]
fn block_sizes_fit_the_device_and_follow_the_formulas() {
    const H200_SHARED: u32 = 232_448;
    for d in [1usize, 32, 59, 64, 128, 256] {
        let (m, blocks) = fa1_blocks(d, H200_SHARED, None).unwrap();
        assert!(blocks.shared_bytes(d as u32) <= H200_SHARED as u64);
        assert_eq!(blocks.block_cols, m.div_ceil(4 * d as u32));
        assert_eq!(blocks.block_rows, blocks.block_cols.min(d as u32));
        let (r, c) = fa2_blocks(d, H200_SHARED, None).unwrap();
        assert!(
            flash_kernels::fwd::fa2::config::shared_bytes(r, c, d as u32) <= H200_SHARED as u64
        );
    }
    assert_eq!(fa2_blocks(256, H200_SHARED, None).unwrap(), (64, 64));
    assert!(fa2_blocks(64, H200_SHARED, Some((96, 64))).is_err());
    assert!(fa2_blocks(256, H200_SHARED, Some((128, 128))).is_err());
    assert!(fa1_blocks(64, H200_SHARED, Some(10_000_000)).is_err());
}

#[test]
fn a_row_subset_of_the_reference_equals_those_rows_of_the_whole() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let (q, k, v) = (
        random([1, 2, 50, 8], &mut rng),
        random([1, 2, 30, 8], &mut rng),
        random([1, 2, 30, 8], &mut rng),
    );
    let whole = attention_reference(q.view(), k.view(), v.view(), true, 0.3);
    let rows = [0, 19, 20, 21, 49];
    let part = flash_attn_lab::model::reference::attention_reference_rows(
        q.view(),
        k.view(),
        v.view(),
        true,
        0.3,
        &rows,
    );
    for (i, &row) in rows.iter().enumerate() {
        assert_eq!(
            part.o.slice(s![.., .., i, ..]),
            whole.o.slice(s![.., .., row, ..])
        );
        assert_eq!(
            part.logsumexp.slice(s![.., .., i]),
            whole.logsumexp.slice(s![.., .., row])
        );
    }
    let sample = flash_attn_lab::tools::check::rows_to_compare(5000, &mut rng);
    assert_eq!(sample.len(), flash_attn_lab::tools::check::FULL_CHECK_ROWS);
    assert!(
        sample.windows(2).all(|w| w[0] < w[1])
            && sample[0] == 0
            && sample[sample.len() - 1] == 4999
    );
}

#[test]
fn device_errors_say_which_problem_it_is() {
    use flash_attn::device::check_capability;
    // A device older than the PTX's target: named, with both capabilities.
    let err = check_capability(0, "Tesla T4", (7, 5), "sm_90")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Tesla T4")
            && err.contains("7.5")
            && err.contains("sm_90")
            && err.contains("9.0"),
        "{err}"
    );
    assert!(check_capability(0, "NVIDIA H200", (9, 0), "sm_90").is_ok());
    assert!(check_capability(0, "NVIDIA A100", (8, 0), "sm_80").is_ok());
    // sm_80 and sm_90 PTX also run on later devices; sm_90a's Hopper-only instructions (wgmma,
    // setmaxnreg) run on 9.0 alone.
    assert!(check_capability(0, "NVIDIA H200", (9, 0), "sm_80").is_ok());
    assert!(check_capability(0, "NVIDIA B200", (10, 0), "sm_90").is_ok());
    assert!(check_capability(0, "NVIDIA H200", (9, 0), "sm_90a").is_ok());
    for (name, capability) in [("NVIDIA B200", (10, 0)), ("NVIDIA A100", (8, 0))] {
        let err = check_capability(0, name, capability, "sm_90a")
            .unwrap_err()
            .to_string();
        let (major, minor) = capability;
        assert!(
            err.contains(name)
                && err.contains(&format!("{major}.{minor}"))
                && err.contains("sm_90a"),
            "{err}"
        );
    }
    assert!(
        check_capability(0, "NVIDIA B200", (10, 0), "sm_90a")
            .unwrap_err()
            .to_string()
            .contains("run only on 9.0")
    );
    // Module-load and driver errors name what failed.
    let load = Error::ModuleLoad {
        ordinal: 0,
        arch: "sm_90",
        detail: "CUDA_ERROR_INVALID_PTX".into(),
    }
    .to_string();
    assert!(
        load.contains("failed to load") && load.contains("CUDA_ERROR_INVALID_PTX"),
        "{load}"
    );
    assert!(Error::NoDriver.to_string().contains("libcuda"));
    // On a machine without a driver (CI), opening a GPU is that typed error, not a panic.
    if let Err(e) = flash_attn::Gpu::open(0) {
        assert!(matches!(e, Error::NoDriver | Error::NoDevice { .. }), "{e}");
    }
}

/// The README's main command on a machine without a GPU: one line saying so, then the predicted
/// HBM-traffic table, exit 0. (With a GPU this test leaves the sweep to the bundle's scripts.)
#[test]
fn bench_without_a_gpu_prints_the_predicted_traffic() {
    if flash_attn::Gpu::open(0).is_ok() {
        return;
    }
    let output = std::process::Command::new(common::cli())
        .args(["bench", "--quick"])
        .output()
        .expect("the CLI runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout
            .lines()
            .next()
            .is_some_and(|l| l.starts_with("no GPU")),
        "{stdout}"
    );
    for algorithm in ["standard", "fa1", "fa2", "fa2-tc"] {
        assert!(
            stdout.contains(&format!("| {algorithm} |")),
            "{algorithm} missing:\n{stdout}"
        );
    }
}

#[test]
fn a_module_override_is_read_from_its_file_as_ptx_or_cubin_and_a_bad_one_is_named() {
    use flash_attn::device::{Module, ModuleSource, module_source, ptx};
    assert_eq!(
        module_source(Module::Main, None).unwrap(),
        ModuleSource::Ptx(ptx(Module::Main).to_string())
    );
    assert!(ptx(Module::Main).contains(".visible .entry fa2tc_forward_bf16_d128_w4r2s2c64("));
    assert!(ptx(Module::Hopper).contains(".visible .entry fa3_forward_bf16_d128_w2c128("));
    assert!(ptx(Module::Hopper).contains(".target sm_90a"));
    let dir = std::env::temp_dir().join(format!("flash-attn-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let variant = dir.join("variant.ptx");
    std::fs::write(&variant, ".version 8.0\n.target sm_90\n").unwrap();
    assert_eq!(
        module_source(Module::Main, Some(variant.clone().into())).unwrap(),
        ModuleSource::Ptx(".version 8.0\n.target sm_90\n".into())
    );
    // A cubin is recognised by its ELF header and passed on as bytes.
    let cubin = dir.join("hopper.cubin");
    let elf = b"\x7fELF\x02\x01\x01\x33\x00\xff".to_vec();
    std::fs::write(&cubin, &elf).unwrap();
    assert_eq!(
        module_source(Module::Hopper, Some(cubin.into())).unwrap(),
        ModuleSource::Cubin(elf)
    );
    // An empty value is unset.
    assert_eq!(
        module_source(Module::Hopper, Some("".into())).unwrap(),
        ModuleSource::Ptx(ptx(Module::Hopper).to_string())
    );
    let missing = dir.join("missing.ptx");
    let err = module_source(Module::Hopper, Some(missing.clone().into()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("FLASH_ATTN_HOPPER_PTX")
            && err.contains("missing.ptx")
            && err.contains("readable"),
        "{err}"
    );
    let garbage = dir.join("garbage.bin");
    std::fs::write(&garbage, [0xffu8, 0xfe, 0x00]).unwrap();
    let err = module_source(Module::Main, Some(garbage.into()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("FLASH_ATTN_PTX") && err.contains("neither an ELF cubin"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fa2_tc_tilings_are_parsed_and_checked_per_head_dim() {
    use flash_attn::attention::{fa2_tc_tiling, parse_fa2_tc_tiling};
    use flash_kernels::fwd::fa2_tc::config::Fa2TcTiling;
    let default = Fa2TcTiling::new(4, 2, 2, 64);
    assert_eq!(parse_fa2_tc_tiling("4x2").unwrap(), default);
    assert_eq!(parse_fa2_tc_tiling("4x2s2").unwrap(), default);
    assert_eq!(parse_fa2_tc_tiling("4x2s2c64").unwrap(), default);
    assert_eq!(
        parse_fa2_tc_tiling("8x1s1").unwrap(),
        Fa2TcTiling::new(8, 1, 1, 64)
    );
    assert_eq!(
        parse_fa2_tc_tiling("4x2s1c32").unwrap(),
        Fa2TcTiling::new(4, 2, 1, 32)
    );
    assert_eq!(
        parse_fa2_tc_tiling("4x2c32").unwrap().to_string(),
        "4x2s2c32"
    );
    for bad in [
        "4", "4x", "x2", "4x2s", "4xtwo", "4x2s1s", "4x2c", "4x2s1c", "4x2c32s1",
    ] {
        let err = parse_fa2_tc_tiling(bad).unwrap_err().to_string();
        assert!(
            err.contains("fa2-tc-tiling") && err.contains(bad) && err.contains("4x2s1c32"),
            "{err}"
        );
    }
    // The measured defaults (docs/perf, FA2-TC v5): two K/V stages up to d = 64, one above.
    for (d, expected) in [
        (32, default),
        (64, default),
        (96, Fa2TcTiling::new(4, 2, 1, 64)),
        (128, Fa2TcTiling::new(4, 2, 1, 64)),
    ] {
        assert_eq!(fa2_tc_tiling(d, None, KernelForm::Dense).unwrap(), expected);
        for tiling in flash_attn::attention::fa2_tc_tilings(d as u32) {
            assert_eq!(
                fa2_tc_tiling(d, Some(tiling), KernelForm::Dense).unwrap(),
                tiling
            );
        }
    }
    // d = 256: one row tile per warp only (two would need 512 accumulator registers per lane).
    assert_eq!(
        fa2_tc_tiling(256, None, KernelForm::Dense).unwrap(),
        Fa2TcTiling::new(4, 1, 1, 64)
    );
    let err = fa2_tc_tiling(256, Some(default), KernelForm::Dense)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("fa2_tc_tiling")
            && err.contains("4x2s2c64")
            && err.contains("allowed at head_dim 256: 4x1s2c64, 8x1s2c64, 4x1s1c64, 8x1s1c64"),
        "{err}"
    );
    let err = fa2_tc_tiling(64, Some(Fa2TcTiling::new(2, 4, 2, 64)), KernelForm::Dense)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "allowed at head_dim 64: 4x1s2c64, 8x1s2c64, 4x2s2c64, 4x1s1c64, 8x1s1c64, \
             4x2s1c64, 4x2s2c32, 4x2s1c32, 4x2s2c48"
        ),
        "{err}"
    );
}

/// `flash-attn check`'s shape filters (used to split compute-sanitizer runs) reject a value
/// the shape set does not have, naming the argument and the values it has, before any GPU work.
#[test]
fn check_filters_name_the_bad_value_and_the_allowed_ones() {
    let run = |shapes: &str, args: &[&str]| {
        let output = std::process::Command::new(common::cli())
            .args(["check", "--shapes", shapes])
            .args(args)
            .output()
            .expect("the CLI runs");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, err) = run("sanitizer", &["--head-dims", "7"]);
    assert!(
        !ok && err.contains("`head-dims`: got [7]")
            && err.contains("[8, 40, 64, 96, 128, 192, 256]"),
        "{err}"
    );
    let (ok, err) = run("sanitizer", &["--head-dims", "40", "--seqlens", "5"]);
    assert!(
        !ok && err.contains("`seqlens`: got [5]") && err.contains("[1, 17, 1000]"),
        "{err}"
    );
    // Every value asked for needs a case: the standard set has seqlen_q = 113 at d = 59 and 64
    // only, so d = 128 there is refused rather than dropped.
    let (ok, err) = run("standard", &["--head-dims", "64,128", "--seqlens", "113"]);
    assert!(
        !ok && err.contains("`head-dims`: got [64, 128]") && err.contains("any of [59, 64]"),
        "{err}"
    );
    let (ok, err) = run("sanitizer", &["--causal", "maybe"]);
    assert!(
        !ok && err.contains("`causal`: got maybe") && err.contains("off, on, both"),
        "{err}"
    );
}

/// `flash-attn check --decode`: a dtype decoding does not take is refused by name before any GPU
/// work, the flags of the attention checks conflict with it, and its cases reach the decode
/// paths (paged with appending, the direct single split, a 128k cache) at compiled head dims.
#[test]
fn check_decode_names_what_it_refuses_and_plans_every_case() {
    let run = |args: &[&str]| {
        let output = std::process::Command::new(common::cli())
            .args(["check", "--decode"])
            .args(args)
            .output()
            .expect("the CLI runs");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, err) = run(&["--dtypes", "bf16,f32"]);
    assert!(
        !ok && err.contains("`dtypes`: got f32")
            && err.contains("allowed with --decode: bf16, f16"),
        "{err}"
    );
    let (ok, err) = run(&["--backward"]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    for dtype in flash_attn_lab::tools::check_decode::DECODE_DTYPES {
        let cases = flash_attn_lab::tools::check_decode::standard_decode_cases(dtype);
        assert!(cases.len() >= 10 && cases.iter().all(|c| c.dtype == dtype));
        assert!(cases.iter().all(|c| {
            flash_kernels::decode::config::HEAD_DIMS.contains(&(c.head_dim as u32))
                && c.heads_q.is_multiple_of(c.heads_kv)
        }));
        assert!(
            cases
                .iter()
                .any(|c| c.page_size.is_some() && c.new_tokens > 0)
        );
        assert!(cases.iter().any(|c| c.splits == Some(1)));
        assert!(cases.iter().any(|c| c.cache_seqlens.contains(&131_072)));
    }
}
