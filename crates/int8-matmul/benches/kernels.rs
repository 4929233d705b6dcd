//! Speed of each 8-bit kernel this CPU runs, on the dense products of one
//! encoder layer (MiniLM-L12 and multilingual-e5-small share the shapes:
//! hidden 384, fused q/k/v 1152, intermediate 1536), for 4 tokens (a very
//! short text), 16 (a short one) and 128 (a full window).
//!
//! - `minilm_layer/<kernel>/<tokens>`: MiniLM's weights, f32 quantised to
//!   8 bits (the grouped form);
//! - `e5_layer/<kernel>/<tokens>`: e5's 4-bit weights widened (the narrow
//!   form).
//!
//! - `layer_stages/<stage>`: one MiniLM layer for 16 tokens cut into its
//!   stages on the best kernel: the four products (the intermediate one
//!   with its GELU), attention, the two residual layer norms, GELU alone,
//!   and the activations' quantisation alone (a product with 8 output
//!   columns, whose multiply-adds are negligible).
//!
//! Throughput is in multiply-adds, so Criterion's `Gelem/s` reads as
//! giga multiply-adds per second. The products stay on one thread (two
//! calls are held open, as when requests queue), so the figure is the
//! kernel's and not the pool's.
//!
//! Times are the benchmark thread's CPU time, not the wall clock: this
//! project's machines are small and shared (other builds run on the same
//! two cores), and the wall clock then counts the time the thread waited
//! for a core, which doubled some figures from one run to the next. CPU
//! time still feels other work's cache misses, but not its turns on the
//! core. `INT8_BENCH_CLOCK=wall` measures the wall clock instead.
//! Run: `cargo bench -p int8-matmul`.

use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{BenchmarkId, Criterion, Throughput};
use int8_matmul::attention::attention;
use int8_matmul::{ops, Activation, Call, Int8Matrix, Kernel, Scratch, BLOCK};

/// (output columns, shared dimension) of a layer's four products.
const LAYER: [(usize, usize); 4] = [(1152, 384), (384, 384), (1536, 384), (384, 1536)];

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// 4-bit weights widened to `i8` (`[-8, 7]`) with their block scales.
fn four_bit(rows: usize, cols: usize, seed: u64) -> (Vec<i8>, Vec<f32>) {
    let v = values(rows * cols, seed)
        .iter()
        .map(|v| ((v * 16.0).round() as i32).clamp(-8, 7) as i8)
        .collect();
    (v, vec![0.02; rows * cols / BLOCK])
}

fn layer(kernel: Kernel, narrow: bool) -> Vec<Int8Matrix> {
    LAYER
        .iter()
        .enumerate()
        .map(|(i, &(n, k))| {
            let m = if narrow {
                let (v, s) = four_bit(n, k, i as u64);
                Int8Matrix::from_blocks_with(v, s, n, k, kernel)
            } else {
                Int8Matrix::quantize_with(&values(n * k, i as u64), n, k, kernel)
            };
            m.expect("a kernel this CPU runs")
        })
        .collect()
}

fn kernels<M: Measurement>(c: &mut Criterion<M>) {
    let _calls = (Call::enter(), Call::enter());
    let available = Kernel::available();
    for k in Kernel::ALL.iter().filter(|k| !available.contains(k)) {
        eprintln!(
            "skipped the {} kernel: this CPU lacks {}",
            k.name(),
            k.needs()
        );
    }
    for (name, narrow) in [("minilm_layer", false), ("e5_layer", true)] {
        let mut group = c.benchmark_group(name);
        for tokens in [4usize, 16, 128] {
            let macs: usize = LAYER.iter().map(|(n, k)| tokens * n * k).sum();
            group.throughput(Throughput::Elements(macs as u64));
            for &kernel in &available {
                let matrices = layer(kernel, narrow);
                let inputs: Vec<Vec<f32>> =
                    LAYER.iter().map(|&(_, k)| values(tokens * k, 99)).collect();
                let mut outs: Vec<Vec<f32>> =
                    LAYER.iter().map(|&(n, _)| vec![0f32; tokens * n]).collect();
                let mut scratch = Scratch::default();
                group.bench_function(BenchmarkId::new(kernel.name(), tokens), |b| {
                    b.iter(|| {
                        for ((w, x), out) in matrices.iter().zip(&inputs).zip(&mut outs) {
                            w.matmul_with(&mut scratch, x, tokens, None, Activation::Identity, out);
                        }
                    })
                });
            }
        }
        group.finish();
    }
}

/// One MiniLM layer's stages for `TOKENS` tokens, on the best kernel.
fn stages<M: Measurement>(c: &mut Criterion<M>) {
    const TOKENS: usize = 16;
    const HIDDEN: usize = 384;
    let _calls = (Call::enter(), Call::enter());
    eprintln!(
        "layer_stages on the {} kernel",
        Kernel::available().last().unwrap().name()
    );
    let mut group = c.benchmark_group("layer_stages");
    let layer = layer(*Kernel::available().last().unwrap(), false);
    let mut scratch = Scratch::default();
    let x = values(TOKENS * HIDDEN, 1);
    let wide = values(TOKENS * 4 * HIDDEN, 2);
    let mut qkv = vec![0f32; TOKENS * 3 * HIDDEN];
    let mut hidden = vec![0f32; TOKENS * HIDDEN];
    let mut inter = vec![0f32; TOKENS * 4 * HIDDEN];
    let bias = |n: usize| vec![0.01f32; n];
    let (b3, b1, b4) = (bias(3 * HIDDEN), bias(HIDDEN), bias(4 * HIDDEN));
    let mut product = |name: &str, w: &Int8Matrix, x: &[f32], b: &[f32], act, out: &mut [f32]| {
        group.bench_function(name, |bench| {
            bench.iter(|| w.matmul_with(&mut scratch, x, TOKENS, Some(b), act, out))
        });
    };
    product(
        "qkv_product",
        &layer[0],
        &x,
        &b3,
        Activation::Identity,
        &mut qkv,
    );
    product(
        "attention_out_product",
        &layer[1],
        &x,
        &b1,
        Activation::Identity,
        &mut hidden,
    );
    product(
        "intermediate_product_gelu",
        &layer[2],
        &x,
        &b4,
        Activation::Gelu,
        &mut inter,
    );
    product(
        "intermediate_product",
        &layer[2],
        &x,
        &b4,
        Activation::Identity,
        &mut inter,
    );
    product(
        "output_product",
        &layer[3],
        &wide,
        &b1,
        Activation::Identity,
        &mut hidden,
    );
    let q8 = Int8Matrix::quantize(&values(8 * 4 * HIDDEN, 3), 8, 4 * HIDDEN);
    let mut small = vec![0f32; TOKENS * 8];
    group.bench_function("quantise_16x1536", |b| {
        b.iter(|| {
            q8.matmul_with(
                &mut scratch,
                &wide,
                TOKENS,
                None,
                Activation::Identity,
                &mut small,
            )
        })
    });
    let qkv_in = values(TOKENS * 3 * HIDDEN, 4);
    let whole = 0..TOKENS;
    group.bench_function("attention", |b| {
        b.iter(|| attention(&qkv_in, std::slice::from_ref(&whole), 12, 32, &mut hidden))
    });
    let (gamma, beta) = (vec![1.0f32; HIDDEN], vec![0.0f32; HIDDEN]);
    let residual = values(TOKENS * HIDDEN, 5);
    let mut normed = x.clone();
    group.bench_function("add_layer_norm", |b| {
        b.iter(|| ops::add_layer_norm(&mut normed, Some(&residual), &gamma, &beta, 1e-12))
    });
    let mut g = wide.clone();
    group.bench_function("gelu_16x1536", |b| b.iter(|| ops::gelu_in_place(&mut g)));
    let mut pooled = vec![0f32; HIDDEN];
    group.bench_function("mean_pool", |b| {
        b.iter(|| ops::mean_pool_unit(&x, &mut pooled))
    });
    group.finish();
}

/// The calling thread's CPU time (see the module's comment).
struct ThreadCpuTime;

fn thread_cpu_time() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

impl Measurement for ThreadCpuTime {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        thread_cpu_time()
    }

    fn end(&self, started: Duration) -> Duration {
        thread_cpu_time() - started
    }

    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }

    fn zero(&self) -> Duration {
        Duration::ZERO
    }

    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        // Both are nanoseconds: the wall clock's formatter reads these too.
        WallTime.formatter()
    }
}

fn config<M: Measurement>(measurement: M) -> Criterion<M> {
    Criterion::default()
        .with_measurement(measurement)
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

fn main() {
    if std::env::var("INT8_BENCH_CLOCK").is_ok_and(|v| v == "wall") {
        let mut c = config(WallTime).configure_from_args();
        kernels(&mut c);
        stages(&mut c);
    } else {
        eprintln!("times are this thread's CPU time (INT8_BENCH_CLOCK=wall for the wall clock)");
        let mut c = config(ThreadCpuTime).configure_from_args();
        kernels(&mut c);
        stages(&mut c);
    }
    Criterion::default().configure_from_args().final_summary();
}
