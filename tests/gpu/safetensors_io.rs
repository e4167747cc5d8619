//! `flash-attn run`'s file half on the CPU: reading Q, K, V from safetensors files (and every way a
//! file can be wrong), writing outputs, and the CLI reporting file errors before it looks for a
//! GPU. One GPU test runs the whole command and checks O against the f64 reference; without a GPU
//! it prints why it was skipped and passes, unless `FLASH_ATTN_REQUIRE_GPU` is set.
//!
//! Test files are encoded here with plain `to_le_bytes`, independently of the module's encoder.

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use flash_attn::attention::Gradients;
use flash_attn::{AttentionOptions, DType, Element, Error, Problem};
use flash_attn_lab::safetensors_io::{
    AttentionFileOutput, BACKWARD_INPUT_ROLES, GRADIENT_NAMES, HostQkv, INPUT_ROLES,
    LOGSUMEXP_NAME, OUTPUT_NAME, PACKED_OFFSET_NAMES, Qkv, ROW_MAX_NAME, ROW_SUM_NAME,
    read_backward_inputs, read_packed, read_qkv, write_outputs,
};
use half::{bf16, f16};
use ndarray::{Array3, Array4};
use rand::SeedableRng;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use tempfile::TempDir;

/// One tensor of a test file: name, dtype, shape and values (in row-major order).
struct TestTensor<'a> {
    name: &'a str,
    dtype: Dtype,
    shape: Vec<usize>,
    values: Vec<f32>,
}

impl<'a> TestTensor<'a> {
    /// Values from [`pattern`], all exact in f16 and bf16, so every dtype reads back exactly.
    fn patterned(name: &'a str, dtype: Dtype, shape: &[usize]) -> Self {
        let len = shape.iter().product();
        Self {
            name,
            dtype,
            shape: shape.to_vec(),
            values: (0..len).map(pattern).collect(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let values = self.values.iter().copied();
        match self.dtype {
            Dtype::F32 => values.flat_map(f32::to_le_bytes).collect(),
            Dtype::F16 => values
                .flat_map(|x| f16::from_f32(x).to_le_bytes())
                .collect(),
            Dtype::BF16 => values
                .flat_map(|x| bf16::from_f32(x).to_le_bytes())
                .collect(),
            Dtype::F64 => values.flat_map(|x| f64::from(x).to_le_bytes()).collect(),
            Dtype::I32 => values.flat_map(|x| (x as i32).to_le_bytes()).collect(),
            Dtype::I64 => values.flat_map(|x| (x as i64).to_le_bytes()).collect(),
            other => panic!("the tests do not encode {other}"),
        }
    }
}

/// The i-th value of a patterned tensor: multiples of 1/4 in [−2, 2].
fn pattern(i: usize) -> f32 {
    (i % 17) as f32 * 0.25 - 2.0
}

/// Writes `tensors` to `dir/file` with the safetensors crate.
fn write_file(dir: &TempDir, file: &str, tensors: &[TestTensor]) -> PathBuf {
    let path = dir.path().join(file);
    let bytes: Vec<Vec<u8>> = tensors.iter().map(TestTensor::bytes).collect();
    let views = tensors.iter().zip(&bytes).map(|(t, b)| {
        let view = TensorView::new(t.dtype, t.shape.clone(), b).expect("a consistent test tensor");
        (t.name, view)
    });
    safetensors::serialize_to_file(views, None, &path).expect("writing a test file");
    path
}

/// A file with q (2, 3, 5, 4) and k, v (2, 3, 7, 4), all of `dtype`, under the default names.
fn qkv_file(dir: &TempDir, dtype: Dtype) -> PathBuf {
    write_file(
        dir,
        "qkv.safetensors",
        &[
            TestTensor::patterned("q", dtype, &[2, 3, 5, 4]),
            TestTensor::patterned("k", dtype, &[2, 3, 7, 4]),
            TestTensor::patterned("v", dtype, &[2, 3, 7, 4]),
        ],
    )
}

fn temp_dir() -> TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

/// Q, K and V's values as f64, in row-major order, whatever their element type.
fn qkv_values(qkv: &HostQkv) -> [Vec<f64>; 3] {
    fn values<T: Element>(qkv: &Qkv<T>) -> [Vec<f64>; 3] {
        [&qkv.q, &qkv.k, &qkv.v].map(|a| a.iter().map(|x| x.to_f64()).collect())
    }
    match qkv {
        HostQkv::F32(qkv) => values(qkv),
        HostQkv::F16(qkv) => values(qkv),
        HostQkv::Bf16(qkv) => values(qkv),
    }
}

/// The error `read_qkv` gives for `tensors`, with its message.
fn read_error(tensors: &[TestTensor]) -> (Error, String) {
    let dir = temp_dir();
    let path = write_file(&dir, "bad.safetensors", tensors);
    let error = read_qkv(&path, INPUT_ROLES).expect_err("the file should be refused");
    let message = error.to_string();
    (error, message)
}

#[test]
fn reads_each_dtype_with_shapes_and_values() {
    for (file_dtype, dtype) in [
        (Dtype::F32, DType::F32),
        (Dtype::F16, DType::F16),
        (Dtype::BF16, DType::Bf16),
    ] {
        let dir = temp_dir();
        let qkv = read_qkv(&qkv_file(&dir, file_dtype), INPUT_ROLES).expect("a valid file");
        assert_eq!(qkv.dtype(), dtype);
        assert_eq!(qkv.dims(), [[2, 3, 5, 4], [2, 3, 7, 4], [2, 3, 7, 4]]);
        for (values, len) in qkv_values(&qkv).iter().zip([120, 168, 168]) {
            let expected: Vec<f64> = (0..len).map(|i| f64::from(pattern(i))).collect();
            assert_eq!(values, &expected, "{dtype}");
        }
    }
}

#[test]
fn reads_tensors_under_other_names_and_ignores_the_rest() {
    let dir = temp_dir();
    let path = write_file(
        &dir,
        "named.safetensors",
        &[
            TestTensor::patterned("query", Dtype::BF16, &[1, 2, 3, 8]),
            TestTensor::patterned("key", Dtype::BF16, &[1, 2, 4, 8]),
            TestTensor::patterned("value", Dtype::BF16, &[1, 2, 4, 8]),
            TestTensor::patterned("mask", Dtype::I32, &[3, 4]),
        ],
    );
    let qkv = read_qkv(&path, ["query", "key", "value"]).expect("a valid file");
    assert_eq!(qkv.dtype(), DType::Bf16);
    assert_eq!(qkv.dims(), [[1, 2, 3, 8], [1, 2, 4, 8], [1, 2, 4, 8]]);
}

#[test]
fn a_missing_tensor_is_named_with_the_tensors_the_file_has() {
    let (error, message) = read_error(&[
        TestTensor::patterned("v", Dtype::F32, &[1, 1, 2, 4]),
        TestTensor::patterned("q", Dtype::F32, &[1, 1, 2, 4]),
        TestTensor::patterned("extra", Dtype::F32, &[1, 1, 2, 4]),
    ]);
    assert!(matches!(error, Error::File(_)), "{error:?}");
    assert!(message.contains("bad.safetensors"), "{message}");
    assert!(message.contains("no tensor named `k`"), "{message}");
    assert!(message.contains("extra, q, v"), "{message}");
}

#[test]
fn a_tensor_that_is_not_4d_is_refused_with_its_shape() {
    let (error, message) = read_error(&[
        TestTensor::patterned("q", Dtype::F16, &[2, 3, 4]),
        TestTensor::patterned("k", Dtype::F16, &[1, 2, 3, 4]),
        TestTensor::patterned("v", Dtype::F16, &[1, 2, 3, 4]),
    ]);
    assert!(
        matches!(error, Error::InvalidArgument { name: "q", .. }),
        "{error:?}"
    );
    assert!(message.contains("tensor `q`"), "{message}");
    assert!(message.contains("[2, 3, 4]"), "{message}");
    assert!(
        message.contains("(batch, heads, seqlen, head_dim)"),
        "{message}"
    );
}

#[test]
fn q_k_and_v_must_share_one_dtype() {
    let (error, message) = read_error(&[
        TestTensor::patterned("q", Dtype::F32, &[1, 2, 3, 4]),
        TestTensor::patterned("k", Dtype::F16, &[1, 2, 3, 4]),
        TestTensor::patterned("v", Dtype::F32, &[1, 2, 3, 4]),
    ]);
    assert!(
        matches!(error, Error::InvalidArgument { name: "k", .. }),
        "{error:?}"
    );
    assert!(message.contains("dtype F16"), "{message}");
    assert!(message.contains("q (tensor `q`"), "{message}");
    assert!(message.contains("is F32"), "{message}");
}

#[test]
fn dtypes_the_kernels_do_not_take_are_refused() {
    for dtype in [Dtype::F64, Dtype::I32] {
        let (error, message) = read_error(&[
            TestTensor::patterned("q", Dtype::F32, &[1, 2, 3, 4]),
            TestTensor::patterned("k", Dtype::F32, &[1, 2, 3, 4]),
            TestTensor::patterned("v", dtype, &[1, 2, 3, 4]),
        ]);
        assert!(
            matches!(error, Error::InvalidArgument { name: "v", .. }),
            "{error:?}"
        );
        assert!(message.contains(&format!("dtype {dtype}")), "{message}");
        assert!(message.contains("F32, F16, BF16"), "{message}");
    }
}

#[test]
fn unreadable_and_malformed_files_are_reported_with_their_path() {
    let dir = temp_dir();
    let valid = std::fs::read(qkv_file(&dir, Dtype::F32)).expect("the test file");
    let garbage: Vec<u8> = (0..200u8).map(|i| i.wrapping_mul(37)).collect();
    let cases: [(&str, &[u8]); 4] = [
        ("garbage.safetensors", &garbage),
        ("empty.safetensors", &[]),
        ("truncated.safetensors", &valid[..valid.len() - 3]),
        ("header-only.safetensors", &valid[..8]),
    ];
    for (file, bytes) in cases {
        let path = dir.path().join(file);
        std::fs::write(&path, bytes).expect("writing a test file");
        let error = read_qkv(&path, INPUT_ROLES).expect_err(file);
        let message = error.to_string();
        assert!(matches!(error, Error::File(_)), "{file}: {error:?}");
        assert!(message.contains(file), "{message}");
        assert!(
            message.contains("not a valid safetensors file"),
            "{message}"
        );
    }
    let missing = dir.path().join("missing.safetensors");
    let message = read_qkv(&missing, INPUT_ROLES)
        .expect_err("no such file")
        .to_string();
    assert!(
        message.contains("cannot read") && message.contains("missing.safetensors"),
        "{message}"
    );
}

#[test]
fn shape_disagreements_are_left_to_problem_new() {
    let dir = temp_dir();
    let path = write_file(
        &dir,
        "shapes.safetensors",
        &[
            TestTensor::patterned("q", Dtype::F32, &[1, 2, 3, 64]),
            TestTensor::patterned("k", Dtype::F32, &[1, 2, 3, 32]),
            TestTensor::patterned("v", Dtype::F32, &[1, 2, 3, 64]),
        ],
    );
    let [q, k, v] = read_qkv(&path, INPUT_ROLES).expect("4-D tensors").dims();
    let error = Problem::new(q, k, v, &AttentionOptions::default()).expect_err("k's head_dim");
    assert!(
        matches!(error, Error::InvalidArgument { name: "k", .. }),
        "{error:?}"
    );
}

/// A tensor of an output file: dtype, shape and values as f64 (decoded here, not by the module).
fn tensor_values(file: &SafeTensors, name: &str) -> (Dtype, Vec<usize>, Vec<f64>) {
    let view = file.tensor(name).expect(name);
    let data = view.data();
    let values = match view.dtype() {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes(b.try_into().unwrap()).to_f64())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes(b.try_into().unwrap()).to_f64())
            .collect(),
        other => panic!("`{name}` has dtype {other}"),
    };
    (view.dtype(), view.shape().to_vec(), values)
}

fn names(file: &SafeTensors) -> BTreeSet<String> {
    file.names().into_iter().map(String::from).collect()
}

fn names_of(expected: &[&str]) -> BTreeSet<String> {
    expected.iter().map(|s| s.to_string()).collect()
}

/// (batch, heads, seqlen_q) statistics with a −∞ row, as standard attention and FA2 give for a
/// row that sees no key.
fn statistics(offset: f32) -> Array3<f32> {
    Array3::from_shape_fn((2, 3, 5), |(b, h, i)| {
        if i == 0 {
            f32::NEG_INFINITY
        } else {
            offset + (b * 15 + h * 5 + i) as f32 * 0.5
        }
    })
}

fn write_and_read_back<T: flash_attn_lab::safetensors_io::SafetensorsElement>(
    with_fa1_statistics: bool,
    with_gradients: bool,
) {
    let dir = temp_dir();
    let path = dir.path().join("out.safetensors");
    let o = Array4::from_shape_fn((2, 3, 5, 4), |(b, h, i, d)| {
        T::from_f64(f64::from(pattern(((b * 3 + h) * 5 + i) * 4 + d)))
    });
    let output = AttentionFileOutput {
        o: o.clone(),
        logsumexp: statistics(1.0),
        row_max_and_sum: with_fa1_statistics.then(|| (statistics(-3.0), statistics(7.0))),
        // Distinct values per gradient: a swapped name shows.
        gradients: with_gradients.then(|| Gradients {
            dq: o.mapv(|x| T::from_f64(x.to_f64() + 0.25)),
            dk: o.mapv(|x| T::from_f64(x.to_f64() - 0.5)),
            dv: o.mapv(|x| T::from_f64(-x.to_f64())),
        }),
        caches: None,
    };
    let metadata = HashMap::from([("algorithm".to_string(), "fa1".to_string())]);
    write_outputs(&path, &output, metadata.clone()).expect("writing the outputs");

    let bytes = std::fs::read(&path).expect("the output file");
    let file = SafeTensors::deserialize(&bytes).expect("a valid safetensors file");
    let mut expected_names = vec![OUTPUT_NAME, LOGSUMEXP_NAME];
    if with_fa1_statistics {
        expected_names.extend([ROW_MAX_NAME, ROW_SUM_NAME]);
    }
    if with_gradients {
        expected_names.extend(GRADIENT_NAMES);
    }
    assert_eq!(names(&file), names_of(&expected_names));
    let (_, header) = SafeTensors::read_metadata(&bytes).expect("a header");
    assert_eq!(header.metadata().as_ref(), Some(&metadata));

    let file_dtype = T::SAFETENSORS_DTYPE;
    let o_values: Vec<f64> = o.iter().map(|x| x.to_f64()).collect();
    assert_eq!(
        tensor_values(&file, OUTPUT_NAME),
        (file_dtype, vec![2, 3, 5, 4], o_values)
    );
    let mut statistics_written = vec![(LOGSUMEXP_NAME, &output.logsumexp)];
    if let Some((row_max, row_sum)) = &output.row_max_and_sum {
        statistics_written.extend([(ROW_MAX_NAME, row_max), (ROW_SUM_NAME, row_sum)]);
    }
    if let Some(g) = &output.gradients {
        for (name, gradient) in GRADIENT_NAMES.into_iter().zip([&g.dq, &g.dk, &g.dv]) {
            let values: Vec<f64> = gradient.iter().map(|x| x.to_f64()).collect();
            assert_eq!(
                tensor_values(&file, name),
                (file_dtype, vec![2, 3, 5, 4], values),
                "{name}"
            );
        }
    }
    for (name, written) in statistics_written {
        let values: Vec<f64> = written.iter().map(|&x| f64::from(x)).collect();
        assert_eq!(
            tensor_values(&file, name),
            (Dtype::F32, vec![2, 3, 5], values),
            "{name}"
        );
    }
}

#[test]
fn writes_outputs_that_read_back_with_names_dtypes_shapes_and_values() {
    write_and_read_back::<f32>(false, false);
    write_and_read_back::<f32>(false, true);
    write_and_read_back::<f16>(true, false);
    write_and_read_back::<f16>(false, true);
    write_and_read_back::<bf16>(false, false);
    write_and_read_back::<bf16>(true, true);
}

#[test]
fn reads_the_backward_inputs_with_do_and_refuses_a_missing_or_mismatched_do() {
    let dir = temp_dir();
    let tensors = |do_dtype| {
        [
            TestTensor::patterned("q", Dtype::BF16, &[1, 2, 3, 8]),
            TestTensor::patterned("k", Dtype::BF16, &[1, 2, 4, 8]),
            TestTensor::patterned("v", Dtype::BF16, &[1, 2, 4, 8]),
            TestTensor::patterned("do", do_dtype, &[1, 2, 3, 8]),
        ]
    };
    let path = write_file(&dir, "backward.safetensors", &tensors(Dtype::BF16));
    let HostQkv::Bf16(inputs) = read_backward_inputs(&path, BACKWARD_INPUT_ROLES).expect("valid")
    else {
        panic!("bf16 inputs read as another dtype");
    };
    let d_o = inputs.d_o.expect("dO read");
    assert_eq!(d_o.dim(), (1, 2, 3, 8));
    let expected: Vec<f64> = (0..48).map(|i| f64::from(pattern(i))).collect();
    let values: Vec<f64> = d_o.iter().map(|x| x.to_f64()).collect();
    assert_eq!(values, expected);
    // The forward's reader leaves dO out.
    let HostQkv::Bf16(forward) = read_qkv(&path, INPUT_ROLES).expect("valid") else {
        panic!("bf16 inputs read as another dtype");
    };
    assert_eq!(forward.d_o, None);

    let mismatched = write_file(&dir, "mismatched.safetensors", &tensors(Dtype::F32));
    let message = read_backward_inputs(&mismatched, BACKWARD_INPUT_ROLES)
        .expect_err("dO of another dtype")
        .to_string();
    assert!(
        message.contains("`do`") && message.contains("share one dtype"),
        "{message}"
    );
    let missing = read_backward_inputs(&path, ["q", "k", "v", "grad_out"])
        .expect_err("no such tensor")
        .to_string();
    assert!(
        missing.contains("no tensor named `grad_out`") && missing.contains("do, k, q, v"),
        "{missing}"
    );
}

#[test]
fn cli_refuses_backward_options_without_backward_and_fa1_with_it() {
    let dir = temp_dir();
    let input = qkv_file(&dir, Dtype::F32);
    let output = dir.path().join("out.safetensors");
    let io = ["--input", path_str(&input), "--output", path_str(&output)];
    for (extra, expected) in [
        (&["--deterministic"][..], "it applies only with --backward"),
        (
            &["--backward-algorithm", "fa2"][..],
            "it applies only with --backward",
        ),
        (
            &["--backward-algorithm", "fa9"][..],
            "allowed: auto, fa3, fa2-tc, fa2",
        ),
        (&["--backward", "--algorithm", "fa1"][..], "L = m + log ℓ"),
        // The file has no `do`: reported before any GPU is looked for.
        (&["--backward"][..], "no tensor named `do`"),
    ] {
        let result = run_cli(&[&["run"][..], &io, extra].concat());
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(!result.status.success(), "{extra:?}: {stderr}");
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
        assert!(!output.exists(), "no output after an error");
    }
}

#[test]
fn cli_names_bad_windows_and_soft_caps_before_looking_for_a_gpu() {
    let dir = temp_dir();
    let input = qkv_file(&dir, Dtype::F32);
    let output = dir.path().join("out.safetensors");
    let io = ["--input", path_str(&input), "--output", path_str(&output)];
    for (extra, expected) in [
        (&["--window", "-2,0"][..], "invalid argument `window`"),
        (&["--window", "5"][..], "comma-separated window sides"),
        (&["--softcap", "-1"][..], "invalid argument `softcap`"),
        (&["--softcap", "inf"][..], "invalid argument `softcap`"),
    ] {
        let result = run_cli(&[&["run"][..], &io, extra].concat());
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(!result.status.success(), "{extra:?}: {stderr}");
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
        assert!(!output.exists(), "no output after an error");
    }
}

fn run_cli(args: &[&str]) -> Output {
    Command::new(common::cli())
        .args(args)
        .output()
        .expect("starting the flash-attn CLI")
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

#[test]
fn cli_reports_file_and_shape_errors_before_looking_for_a_gpu() {
    let dir = temp_dir();
    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"not a safetensors file").expect("writing a test file");
    // F32 Q, K, V of the given shapes.
    let qkv = |file, [q, k, v]: [&[usize]; 3]| {
        let tensors = [("q", q), ("k", k), ("v", v)]
            .map(|(name, shape)| TestTensor::patterned(name, Dtype::F32, shape));
        write_file(&dir, file, &tensors)
    };
    let shapes = qkv(
        "shapes.safetensors",
        [&[1, 2, 3, 64], &[1, 2, 3, 32], &[1, 2, 3, 64]],
    );
    // 4 query heads: 3 K/V heads do not divide them; 2 do, but `--kv-heads 1` asks for MQA.
    let groups = qkv(
        "groups.safetensors",
        [&[1, 4, 3, 64], &[1, 3, 3, 64], &[1, 3, 3, 64]],
    );
    let grouped = qkv(
        "grouped.safetensors",
        [&[1, 4, 3, 64], &[1, 2, 3, 64], &[1, 2, 3, 64]],
    );
    let output = dir.path().join("out.safetensors");
    for (input, extra, expected) in [
        (&garbage, None, "not a valid safetensors file"),
        (&shapes, None, "invalid argument `k`"),
        (&groups, None, "must divide q's"),
        (&grouped, Some("1"), "invalid argument `kv-heads`"),
    ] {
        let mut args = vec![
            "run",
            "--input",
            path_str(input),
            "--output",
            path_str(&output),
        ];
        if let Some(heads) = extra {
            args.extend(["--kv-heads", heads]);
        }
        let result = run_cli(&args);
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(!result.status.success(), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
        assert!(!output.exists(), "no output after an error");
    }
}

/// max |got − want| / max |want|, the f32 rule of `flash_attn_lab::tools::check`.
fn relative_error(got: &[f64], want: &[f64]) -> f64 {
    let max_error = got
        .iter()
        .zip(want)
        .fold(0.0f64, |m, (g, w)| m.max((g - w).abs()));
    let max_want = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
    max_error / max_want
}

/// The whole command: random f32 Q, K, V to a file, `flash-attn run` (FA2, then FA1 for its extra
/// outputs), and O and L read back against the f64 reference. seqlen_q > seqlen_k with the causal
/// mask, so the first rows see no key (O = 0, L = −∞).
#[test]
fn run_command_matches_the_reference_on_a_gpu() {
    check_run_command("run_command_matches_the_reference_on_a_gpu", 3, 3, &[]);
}

/// The same with grouped K/V heads: 6 query heads on 2 K/V heads, `--kv-heads 2`.
#[test]
fn run_command_takes_grouped_kv_heads_on_a_gpu() {
    check_run_command(
        "run_command_takes_grouped_kv_heads_on_a_gpu",
        6,
        2,
        &["--kv-heads", "2"],
    );
}

/// One `flash-attn run` check of [`run_command_matches_the_reference_on_a_gpu`]: `heads_q` query
/// heads on `heads_kv` K/V heads, with `extra` arguments.
fn check_run_command(test: &str, heads_q: usize, heads_kv: usize, extra: &[&str]) {
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    drop(gpu);
    let seed: u64 = rand::random();
    println!("{test}: seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (q_dims, kv_dims) = ([2, heads_q, 53, 64], [2, heads_kv, 37, 64]);
    let q = flash_attn_lab::tools::check::random_tensor::<f32>(q_dims, &mut rng);
    let k = flash_attn_lab::tools::check::random_tensor::<f32>(kv_dims, &mut rng);
    let v = flash_attn_lab::tools::check::random_tensor::<f32>(kv_dims, &mut rng);
    let dir = temp_dir();
    let tensor = |name, a: &Array4<f32>| TestTensor {
        name,
        dtype: Dtype::F32,
        shape: a.shape().to_vec(),
        values: a.iter().copied().collect(),
    };
    let input = write_file(
        &dir,
        "qkv.safetensors",
        &[tensor("q", &q), tensor("k", &k), tensor("v", &v)],
    );
    let to_f64 = |a: &Array4<f32>| a.mapv(f64::from);
    let reference = flash_attn_lab::model::reference::attention_reference(
        to_f64(&q).view(),
        to_f64(&k).view(),
        to_f64(&v).view(),
        true,
        1.0 / 8.0,
    );
    let reference_o: Vec<f64> = reference.o.iter().copied().collect();

    for (algorithm, outputs) in [
        ("fa2", names_of(&[OUTPUT_NAME, LOGSUMEXP_NAME])),
        (
            "fa1",
            names_of(&[OUTPUT_NAME, LOGSUMEXP_NAME, ROW_MAX_NAME, ROW_SUM_NAME]),
        ),
    ] {
        let output = dir.path().join(format!("{algorithm}.safetensors"));
        let mut args = vec![
            "run",
            "--input",
            path_str(&input),
            "--output",
            path_str(&output),
            "--algorithm",
            algorithm,
            "--causal",
        ];
        args.extend_from_slice(extra);
        let result = run_cli(&args);
        let stdout = String::from_utf8_lossy(&result.stdout);
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(result.status.success(), "{algorithm}: {stderr}");
        println!("{stdout}");
        assert!(stdout.contains(path_str(&output)), "{stdout}");

        let bytes = std::fs::read(&output).expect("the output file");
        let file = SafeTensors::deserialize(&bytes).expect("a valid output file");
        assert_eq!(names(&file), outputs, "{algorithm}");
        let (dtype, shape, o) = tensor_values(&file, OUTPUT_NAME);
        assert_eq!((dtype, shape), (Dtype::F32, q_dims.to_vec()));
        let error = relative_error(&o, &reference_o);
        println!("{algorithm}: O relative error {error:.2e}");
        assert!(error <= 1e-4, "{algorithm}: O relative error {error:.2e}");

        let (dtype, shape, lse) = tensor_values(&file, LOGSUMEXP_NAME);
        assert_eq!((dtype, shape), (Dtype::F32, vec![2, heads_q, 53]));
        for (got, want) in lse.iter().zip(&reference.logsumexp) {
            let close = if want.is_finite() {
                (got - want).abs() <= flash_attn_lab::tools::check::LOGSUMEXP_TOLERANCE
            } else {
                got == want
            };
            assert!(close, "{algorithm}: L {got} where the reference has {want}");
        }
    }
}

/// `flash-attn run --backward` on bf16 Q, K, V, dO (fa2-tc, fa2 and standard on the same file): O, L and
/// dQ, dK, dV in the output file, the gradients within `tools::check_backward`'s bound of the f64
/// reference; the backward plan in the file's metadata.
#[test]
fn run_backward_command_matches_the_reference_gradients_on_a_gpu() {
    check_run_backward_command(
        "run_backward_command_matches_the_reference_gradients_on_a_gpu",
        2,
    );
}

/// The same with one K/V head for both query heads (MQA): dK and dV summed over them, the
/// group sum in the plan.
#[test]
fn run_backward_command_takes_grouped_kv_heads_on_a_gpu() {
    check_run_backward_command("run_backward_command_takes_grouped_kv_heads_on_a_gpu", 1);
}

/// One check of [`run_backward_command_matches_the_reference_gradients_on_a_gpu`]: 2 query
/// heads on `heads_kv` K/V heads.
fn check_run_backward_command(test: &str, heads_kv: usize) {
    use flash_attn_lab::tools::check_backward::{BackwardInputs, check_gradients};
    let Some(gpu) = common::gpu_or_skip(test) else {
        return;
    };
    drop(gpu);
    let mut rng = common::seeded_rng(test);
    let (q_dims, kv_dims) = ([1, 2, 71, 64], [1, heads_kv, 90, 64]);
    let random = |dims, rng: &mut rand::rngs::StdRng| {
        flash_attn_lab::tools::check::random_tensor::<bf16>(dims, rng)
    };
    let (q, k, v, d_o) = (
        random(q_dims, &mut rng),
        random(kv_dims, &mut rng),
        random(kv_dims, &mut rng),
        random(q_dims, &mut rng),
    );
    let dir = temp_dir();
    let tensor = |name, a: &Array4<bf16>| TestTensor {
        name,
        dtype: Dtype::BF16,
        shape: a.shape().to_vec(),
        values: a.iter().map(|x| x.to_f32()).collect(),
    };
    let input = write_file(
        &dir,
        "qkv_do.safetensors",
        &[
            tensor("q", &q),
            tensor("k", &k),
            tensor("v", &v),
            tensor("do", &d_o),
        ],
    );
    for backward_algorithm in ["fa2-tc", "fa2", "standard"] {
        let output = dir.path().join(format!("{backward_algorithm}.safetensors"));
        let result = run_cli(&[
            "run",
            "--input",
            path_str(&input),
            "--output",
            path_str(&output),
            "--algorithm",
            "fa2-tc",
            "--causal",
            "--backward",
            "--backward-algorithm",
            backward_algorithm,
        ]);
        let stdout = String::from_utf8_lossy(&result.stdout);
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(result.status.success(), "{backward_algorithm}: {stderr}");
        println!("{stdout}");
        assert!(stdout.contains("backward plan:"), "{stdout}");

        let bytes = std::fs::read(&output).expect("the output file");
        let file = SafeTensors::deserialize(&bytes).expect("a valid output file");
        let mut expected = vec![OUTPUT_NAME, LOGSUMEXP_NAME];
        expected.extend(GRADIENT_NAMES);
        assert_eq!(names(&file), names_of(&expected));
        let (_, header) = SafeTensors::read_metadata(&bytes).expect("a header");
        let metadata = header.metadata().clone().unwrap_or_default();
        let kernels = metadata.get("backward_kernel").cloned().unwrap_or_default();
        let expected_family = match backward_algorithm {
            "fa2-tc" => "fa2tc_backward",
            "fa2" => "fa2_backward_main",
            _ => "standard_backward_dkdv",
        };
        assert!(kernels.contains(expected_family), "{kernels}");
        assert_eq!(
            kernels.ends_with("backward_group_sum_bf16"),
            heads_kv != 2,
            "{kernels}"
        );
        let gradient = |name: &str, dims: [usize; 4]| {
            let (dtype, shape, values) = tensor_values(&file, name);
            assert_eq!((dtype, shape), (Dtype::BF16, dims.to_vec()), "{name}");
            Array4::from_shape_vec(dims, values).expect("the gradient's shape")
        };
        let got = Gradients {
            dq: gradient("dq", q_dims),
            dk: gradient("dk", kv_dims),
            dv: gradient("dv", kv_dims),
        };
        let inputs = BackwardInputs {
            q: &q,
            k: &k,
            v: &v,
            d_o: &d_o,
        };
        for check in check_gradients(&inputs, true, 1.0 / 8.0, &got) {
            println!("{backward_algorithm}: {check:?}");
            assert!(check.passed(), "{backward_algorithm}: {check:?}");
        }
    }
}

/// Offsets as a test tensor (exact in f32 below 2^24).
fn offsets_tensor<'a>(name: &'a str, dtype: Dtype, offsets: &[i64]) -> TestTensor<'a> {
    TestTensor {
        name,
        dtype,
        shape: vec![offsets.len()],
        values: offsets.iter().map(|&x| x as f32).collect(),
    }
}

/// A packed batch in flash-attn's varlen layout: Q (5, 2, 8), K and V (7, 1, 8), two sequences.
fn packed_tensors(offsets_dtype: Dtype) -> Vec<TestTensor<'static>> {
    vec![
        TestTensor::patterned("q", Dtype::F16, &[5, 2, 8]),
        TestTensor::patterned("k", Dtype::F16, &[7, 1, 8]),
        TestTensor::patterned("v", Dtype::F16, &[7, 1, 8]),
        offsets_tensor("cu_seqlens_q", offsets_dtype, &[0, 2, 5]),
        offsets_tensor("cu_seqlens_k", Dtype::I64, &[0, 3, 7]),
    ]
}

#[test]
fn reads_a_packed_batch_in_flash_attn_layout() {
    let dir = temp_dir();
    let path = write_file(&dir, "packed.safetensors", &packed_tensors(Dtype::I32));
    let (qkv, batch) = read_packed(&path, &INPUT_ROLES, PACKED_OFFSET_NAMES).unwrap();
    assert_eq!(qkv.dims(), [[1, 2, 5, 8], [1, 1, 7, 8], [1, 1, 7, 8]]);
    assert_eq!(
        (batch.cu_seqlens_q(), batch.cu_seqlens_k()),
        (&[0, 2, 5][..], &[0, 3, 7][..])
    );
    // Logical (0, h, t, c) is stored at (t, h, c).
    let HostQkv::F16(qkv) = qkv else {
        panic!("f16 inputs")
    };
    for (h, t, c) in [(0, 0, 0), (1, 0, 3), (0, 4, 7), (1, 3, 5)] {
        assert_eq!(qkv.q[[0, h, t, c]].to_f32(), pattern((t * 2 + h) * 8 + c));
    }
    let problem = batch
        .problem(
            [[1, 2, 5, 8], [1, 1, 7, 8], [1, 1, 7, 8]],
            &AttentionOptions::default(),
        )
        .unwrap();
    assert_eq!(
        (problem.batch, problem.seqlen_q, problem.seqlen_k),
        (2, 3, 4)
    );
}

#[test]
fn a_packed_file_names_what_is_wrong() {
    let dir = temp_dir();
    let refused = |tensors: &[TestTensor]| {
        let path = write_file(&dir, "bad-packed.safetensors", tensors);
        read_packed(&path, &INPUT_ROLES, PACKED_OFFSET_NAMES)
            .expect_err("the file should be refused")
    };
    // 4-D Q: not the varlen layout.
    let mut tensors = packed_tensors(Dtype::I32);
    tensors[0] = TestTensor::patterned("q", Dtype::F16, &[1, 5, 2, 8]);
    let err = refused(&tensors);
    assert!(
        matches!(err, Error::InvalidArgument { name: "q", .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("(total tokens, heads, head_dim)"),
        "{err}"
    );
    // Float offsets, negative offsets, decreasing offsets, a missing one.
    let mut tensors = packed_tensors(Dtype::F32);
    assert!(matches!(
        refused(&tensors),
        Error::InvalidArgument {
            name: "cu_seqlens_q",
            ..
        }
    ));
    tensors[3] = offsets_tensor("cu_seqlens_q", Dtype::I32, &[0, -2, 5]);
    let err = refused(&tensors).to_string();
    assert!(err.contains("holding -2"), "{err}");
    tensors[3] = offsets_tensor("cu_seqlens_q", Dtype::I32, &[0, 4, 3]);
    let err = refused(&tensors);
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                name: "cu_seqlens_q",
                ..
            }
        ),
        "{err}"
    );
    tensors.remove(4);
    let err = refused(&tensors).to_string();
    assert!(err.contains("no tensor named `cu_seqlens_k`"), "{err}");
}

#[test]
fn cli_checks_a_packed_input_before_looking_for_a_gpu() {
    let dir = temp_dir();
    let output = dir.path().join("out.safetensors");
    // Offsets that end past Q's rows.
    let mut tensors = packed_tensors(Dtype::I32);
    tensors[3] = offsets_tensor("cu_seqlens_q", Dtype::I32, &[0, 2, 6]);
    let bad = write_file(&dir, "packed.safetensors", &tensors);
    let result = run_cli(&[
        "run",
        "--packed",
        "--algorithm",
        "fa2-tc",
        "--input",
        path_str(&bad),
        "--output",
        path_str(&output),
    ]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        !result.status.success() && stderr.contains("invalid argument `cu_seqlens_q`"),
        "{stderr}"
    );
    assert!(!output.exists());
    // The backward needs dO: a file without it is refused by name, before the GPU.
    let good = write_file(
        &dir,
        "packed-no-do.safetensors",
        &packed_tensors(Dtype::I32),
    );
    let result = run_cli(&[
        "run",
        "--packed",
        "--backward",
        "--input",
        path_str(&good),
        "--output",
        path_str(&output),
    ]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        !result.status.success() && stderr.contains("no tensor named `do`"),
        "{stderr}"
    );
    assert!(!output.exists());
}

/// The run tests' packed f16 batch: two sequences (13 × 40, 32 × 30 rows), d = 32, 4 query heads
/// on 2 K/V heads, patterned values; with `d_o` also dO.
fn run_test_batch(d_o: bool) -> Vec<TestTensor<'static>> {
    let mut tensors = vec![
        TestTensor::patterned("q", Dtype::F16, &[45, 4, 32]),
        TestTensor::patterned("k", Dtype::F16, &[70, 2, 32]),
        TestTensor::patterned("v", Dtype::F16, &[70, 2, 32]),
        offsets_tensor("cu_seqlens_q", Dtype::I32, &[0, 13, 45]),
        offsets_tensor("cu_seqlens_k", Dtype::I32, &[0, 40, 70]),
    ];
    if d_o {
        tensors.push(TestTensor::patterned("do", Dtype::F16, &[45, 4, 32]));
    }
    tensors
}

/// Writes `tensors` to a file, runs `flash-attn run --packed` on it with `arguments`, asserts
/// that it succeeded, and returns its stdout and the output file's bytes.
fn run_packed_command(tensors: &[TestTensor], arguments: &[&str]) -> (String, Vec<u8>) {
    let dir = temp_dir();
    let input = write_file(&dir, "packed.safetensors", tensors);
    let output = dir.path().join("out.safetensors");
    let mut command = vec!["run", "--packed"];
    command.extend_from_slice(arguments);
    command.extend_from_slice(&["--input", path_str(&input), "--output", path_str(&output)]);
    let result = run_cli(&command);
    let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
    assert!(
        result.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&result.stderr)
    );
    (stdout, std::fs::read(&output).expect("the output file"))
}

/// Logical (1, heads, rows, d) f64 of rows `rows` of a stored f16 (total, heads, d) tensor.
fn logical_rows(t: &TestTensor, rows: std::ops::Range<usize>) -> Array4<f64> {
    let (h, d) = (t.shape[1], t.shape[2]);
    Array4::from_shape_fn((1, h, rows.len(), d), |(_, head, r, c)| {
        f64::from(f16::from_f32(t.values[((rows.start + r) * h + head) * d + c]).to_f32())
    })
}

/// The whole `run --packed` command on a GPU: a packed f16 batch (two sequences, d = 32, 4 query
/// heads on 2 K/V heads, causal) in flash-attn's layout to a file, run, and O (total_q, heads, d)
/// and L (heads, total_q) read back against the f64 reference of the packed batch. The kernels'
/// accuracy is `check --packed`'s and `gpu/packed.rs`'s to judge; this checks the file's layouts,
/// so a loose bound (a transposed axis errs by O(1)).
#[test]
fn run_command_takes_a_packed_batch_on_a_gpu() {
    let Some(gpu) = common::gpu_or_skip("run_command_takes_a_packed_batch_on_a_gpu") else {
        return;
    };
    drop(gpu);
    let (heads, d) = (4, 32);
    let tensors = run_test_batch(false);
    let (stdout, bytes) = run_packed_command(&tensors, &["--causal", "--algorithm", "fa3"]);
    assert!(stdout.contains("_varlen"), "{stdout}");
    let file = SafeTensors::deserialize(&bytes).expect("a safetensors output");
    let (_, o_shape, o) = tensor_values(&file, OUTPUT_NAME);
    let (_, l_shape, l) = tensor_values(&file, LOGSUMEXP_NAME);
    assert_eq!((o_shape, l_shape), (vec![45, heads, d], vec![heads, 45]));
    // The reference on logical (1, heads, total, d) arrays of the stored values.
    let logical = |t: &TestTensor| logical_rows(t, 0..t.shape[0]);
    let batch = flash_attn::attention::PackedBatch::new(&[0, 13, 45], &[0, 40, 70]).unwrap();
    let reference = flash_attn_lab::model::reference::packed_attention_reference(
        logical(&tensors[0]).view(),
        logical(&tensors[1]).view(),
        logical(&tensors[2]).view(),
        &batch,
        true,
        1.0 / (d as f64).sqrt(),
    );
    let o_error = (0..45 * heads * d).fold(0.0f64, |m, i| {
        let (r, h, c) = (i / (heads * d), i / d % heads, i % d);
        m.max((o[i] - reference.o[[0, h, r, c]]).abs())
    });
    let l_error = (0..heads * 45).fold(0.0f64, |m, i| {
        m.max((l[i] - reference.logsumexp[[0, i / 45, i % 45]]).abs())
    });
    assert!(
        o_error < 2e-2 && l_error < 1e-3,
        "O error {o_error}, L error {l_error}"
    );
}

/// `run --packed --backward` on a GPU: the packed batch above with a dO, a window and
/// soft-capping; dQ, dK, dV come back in the inputs' (total, heads, d) layout, each sequence's
/// against its own f64 reference gradients (a layout check: a loose bound, as above).
#[test]
fn run_command_takes_a_packed_backward_on_a_gpu() {
    let Some(gpu) = common::gpu_or_skip("run_command_takes_a_packed_backward_on_a_gpu") else {
        return;
    };
    drop(gpu);
    let (heads, heads_kv, d) = (4, 2, 32);
    let tensors = run_test_batch(true);
    let arguments = [
        "--backward",
        "--causal",
        "--window",
        "16,0",
        "--softcap",
        "5",
    ];
    let (stdout, bytes) = run_packed_command(&tensors, &arguments);
    assert!(
        stdout.contains("backward plan:") && stdout.contains("_varlen_local"),
        "{stdout}"
    );
    let file = SafeTensors::deserialize(&bytes).expect("a safetensors output");
    let logical = logical_rows;
    let scoring = flash_attn::scoring::Scoring {
        window: flash_kernels::common::mask::KeyWindow::from_params(true, 16, 0),
        softcap: 5.0,
    };
    let mut worst = 0.0f64;
    for (queries, keys) in [(0..13, 0..40), (13..45, 40..70)] {
        let reference = flash_attn_lab::model::reference_backward::attention_backward_reference(
            logical(&tensors[0], queries.clone()).view(),
            logical(&tensors[1], keys.clone()).view(),
            logical(&tensors[2], keys.clone()).view(),
            logical(&tensors[5], queries.clone()).view(),
            scoring,
            1.0 / (d as f64).sqrt(),
        )
        .gradients;
        for (name, rows, want, h) in [
            ("dq", queries.clone(), &reference.dq, heads),
            ("dk", keys.clone(), &reference.dk, heads_kv),
            ("dv", keys.clone(), &reference.dv, heads_kv),
        ] {
            let (_, shape, got) = tensor_values(&file, name);
            assert_eq!(shape[1..], [h, d], "{name}");
            for (r, row) in rows.clone().enumerate() {
                for h_ in 0..h {
                    for c in 0..d {
                        let x = got[(row * h + h_) * d + c];
                        worst = worst.max((x - want[[0, h_, r, c]]).abs());
                    }
                }
            }
        }
    }
    assert!(worst < 5e-2, "gradients off by {worst}");
}

/// A KV-cache file: f16 Q (2, 8, 1, 64), caches (2, 2, 48, 64), the lengths `lengths` (I32) and,
/// with `append`, three new keys and values per sequence; the values drawn from `rng`.
fn decode_file(
    dir: &TempDir,
    lengths: &[f32],
    append: bool,
    rng: &mut rand::rngs::StdRng,
) -> PathBuf {
    let draw = |dims: [usize; 4], rng: &mut rand::rngs::StdRng| {
        flash_attn_lab::tools::check::random_tensor::<f16>(dims, rng)
            .iter()
            .map(|x| x.to_f32())
            .collect::<Vec<f32>>()
    };
    let tensor = |name, dims: [usize; 4], rng: &mut rand::rngs::StdRng| TestTensor {
        name,
        dtype: Dtype::F16,
        shape: dims.to_vec(),
        values: draw(dims, rng),
    };
    let mut tensors = vec![
        tensor("q", [2, 8, 1, 64], rng),
        tensor("k", [2, 2, 48, 64], rng),
        tensor("v", [2, 2, 48, 64], rng),
        TestTensor {
            name: "cache_seqlens",
            dtype: Dtype::I32,
            shape: vec![lengths.len()],
            values: lengths.to_vec(),
        },
    ];
    if append {
        tensors.push(tensor("k_new", [2, 2, 3, 64], rng));
        tensors.push(tensor("v_new", [2, 2, 3, 64], rng));
    }
    write_file(dir, "decode.safetensors", &tensors)
}

#[test]
fn cli_checks_a_kv_cache_file_before_looking_for_a_gpu() {
    let dir = temp_dir();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let output = dir.path().join("out.safetensors");
    let run = |input: &Path, extra: &[&str]| {
        let io = ["--input", path_str(input), "--output", path_str(&output)];
        run_cli(&[&["run", "--decode"][..], &io, extra].concat())
    };
    // A length past the cache's 48 keys (with 3 appended: 46 + 3 > 48).
    let past = decode_file(&dir, &[10.0, 46.0], true, &mut rng);
    for (extra, expected) in [
        (&["--append", "k_new,v_new"][..], "cache_seqlens"),
        (
            &["--algorithm", "fa3"][..],
            "a KV-cache call runs the split-KV decode kernels",
        ),
        (
            &["--cache-seqlens", "lengths"][..],
            "no tensor named `lengths`",
        ),
        (&["--window", "4,0"][..], "window"),
    ] {
        let result = run(&past, extra);
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(!result.status.success(), "{extra:?}: {stderr}");
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
        assert!(
            !stderr.contains("GPU"),
            "{extra:?}: checked after the GPU: {stderr}"
        );
    }
    let result = run_cli(&[
        "run",
        "--input",
        path_str(&past),
        "--output",
        path_str(&output),
        "--block-table",
        "table",
    ]);
    assert!(!result.status.success());
    assert!(String::from_utf8_lossy(&result.stderr).contains("--decode"));
    assert!(!output.exists(), "no output after an error");
}

/// `flash-attn run --decode --append` writes what the library's own KV-cache call gives on the
/// same tensors (the same kernels: bit for bit), and the caches with the keys appended.
#[test]
fn run_decode_command_matches_the_library_on_a_gpu() {
    let Some(gpu) = common::gpu_or_skip("run_decode_command") else {
        return;
    };
    let dir = temp_dir();
    let seed: u64 = rand::random();
    println!("run_decode_command: seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let input = decode_file(&dir, &[17.0, 40.0], true, &mut rng);
    let output = dir.path().join("out.safetensors");
    let result = run_cli(&[
        "run",
        "--decode",
        "--causal",
        "--append",
        "k_new,v_new",
        "--input",
        path_str(&input),
        "--output",
        path_str(&output),
    ]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{stderr}");
    println!("{}", String::from_utf8_lossy(&result.stdout));

    // The library's call on the same tensors.
    let file = flash_attn_lab::safetensors_io::read_decode(
        &input,
        ["q", "k", "v"],
        Some(["k_new", "v_new"]),
        "cache_seqlens",
        None,
    )
    .expect("the input reads");
    let HostQkv::F16(qkv) = &file.tensors else {
        panic!("f16 tensors")
    };
    let upload = |a: &Array4<f16>| {
        flash_attn::DeviceTensor::from_array(&gpu, a.view(), flash_attn::Layout::BatchHeadSeqDim)
            .expect("upload")
    };
    let (q, k_cache, v_cache) = (upload(&qkv.q), upload(&qkv.k), upload(&qkv.v));
    let (k_new, v_new) = qkv.appended.as_ref().expect("appended");
    let (k_new, v_new) = (upload(k_new), upload(v_new));
    let seqlens = flash_attn::CacheSeqlens::new(&gpu, &file.cache_seqlens).expect("lengths");
    let out = flash_attn::Attention::new(&q, &k_cache, &v_cache)
        .causal(true)
        .kv_cache(flash_attn::KvCache {
            seqlens: &seqlens,
            block_table: None,
            append: Some(((&k_new).into(), (&v_new).into())),
        })
        .forward(&gpu)
        .expect("the library's call");
    let bytes = std::fs::read(&output).expect("the output file");
    let written = SafeTensors::deserialize(&bytes).expect("a valid output file");
    assert_eq!(
        names(&written),
        names_of(&[OUTPUT_NAME, LOGSUMEXP_NAME, "k_cache", "v_cache"])
    );
    let values = |a: &Array4<f16>| a.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    let (_, shape, o) = tensor_values(&written, OUTPUT_NAME);
    assert_eq!(shape, vec![2, 8, 1, 64]);
    assert_eq!(o, values(&out.o.to_array(&gpu).expect("download")), "O");
    let (_, _, lse) = tensor_values(&written, LOGSUMEXP_NAME);
    let want: Vec<f64> = out
        .stats
        .logsumexp(&gpu)
        .expect("L")
        .iter()
        .map(|&x| f64::from(x))
        .collect();
    assert_eq!(lse, want, "L");
    for (name, cache) in [("k_cache", &k_cache), ("v_cache", &v_cache)] {
        let (_, _, got) = tensor_values(&written, name);
        assert_eq!(
            got,
            values(&cache.to_array(&gpu).expect("download")),
            "{name}"
        );
    }
}
