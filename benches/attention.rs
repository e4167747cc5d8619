//! Criterion benchmarks: each algorithm at a few fixed shapes, timed on the GPU with CUDA events
//! (`iter_custom`), on fresh N(0, 1) inputs. Without a GPU they print that they were skipped.

use std::io::Write;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use flash_attn::{Algorithm, Attention, AttentionOptions, DeviceTensor, Gpu, Layout};
use flash_attn_lab::tools::check::random_tensor;

/// (batch, heads, seqlen, head_dim, causal): the papers' setup at 16k tokens and hidden 2048.
const SHAPES: [(usize, usize, usize, usize, bool); 3] = [
    (8, 16, 2048, 128, false),
    (8, 16, 2048, 128, true),
    (4, 32, 4096, 64, false),
];

fn attention_benches(c: &mut Criterion) {
    let gpu = match Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "attention benchmarks skipped: {e}");
            return;
        }
    };
    let mut rng = rand::rng();
    let mut group = c.benchmark_group("attention_bf16");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (batch, heads, seqlen, head_dim, causal) in SHAPES {
        let dims = [batch, heads, seqlen, head_dim];
        let upload = |rng: &mut _| {
            DeviceTensor::from_array(
                &gpu,
                random_tensor::<half::bf16>(dims, rng).view(),
                Layout::BatchHeadSeqDim,
            )
        };
        let (q, k, v) = match (upload(&mut rng), upload(&mut rng), upload(&mut rng)) {
            (Ok(q), Ok(k), Ok(v)) => (q, k, v),
            _ => return,
        };
        let options = AttentionOptions {
            causal,
            ..Default::default()
        };
        let flops = 4.0 * (batch * heads * seqlen * seqlen * head_dim) as f64
            / if causal { 2.0 } else { 1.0 };
        group.throughput(Throughput::Elements(flops as u64));
        for algorithm in Algorithm::FAMILIES {
            // FA1 runs one block per (batch, head) and standard attention materialises S: keep
            // the benchmark to shapes where each finishes in well under a second.
            if algorithm == Algorithm::Standard && seqlen > 2048 {
                continue;
            }
            let call = Attention::new(&q, &k, &v)
                .options(options)
                .algorithm(algorithm);
            let Ok(mut output) = call.forward(&gpu) else {
                continue;
            };
            let id = BenchmarkId::new(
                algorithm.name(),
                format!(
                    "b{batch}_h{heads}_n{seqlen}_d{head_dim}{}",
                    if causal { "_causal" } else { "" }
                ),
            );
            group.bench_function(id, |b| {
                b.iter_custom(|iterations| {
                    let ms = gpu
                        .time_ms(|| {
                            for _ in 0..iterations {
                                call.forward_into(&gpu, output.tensors())?;
                            }
                            Ok(())
                        })
                        .expect("a timed launch failed");
                    Duration::from_secs_f64(ms as f64 / 1e3)
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, attention_benches);
criterion_main!(benches);
