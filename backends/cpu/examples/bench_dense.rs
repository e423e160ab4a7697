//! The packed-weight GEMM (`gemm_packed.rs`) against faer's, through the public executor: a
//! stack of GPT-2-sized dense layers (`128 × 768 @ 768 × 3072`, then `@ 3072 × 768`, six
//! times: 12 weights, 113 MB, so each run reads them from memory as a model does) run twice in
//! one executor, once with the weights as constants (packed once, then the packed kernel) and
//! once as parameters (faer's GEMM, which packs on every call). Alternated, median of the
//! rounds; prints both times, the ratio and the largest difference between the two results.
//!
//! `cargo run --release -p fusebox-cpu --example bench_dense [ROUNDS] [THREADS]`
//! (default 7 rounds, 2 threads).

#![allow(clippy::print_stdout, reason = "a benchmark prints its timings")]

use fusebox_core::ir::generate::Rng;
use fusebox_core::ir::{Constant, DType};
use fusebox_core::text::{ConstTable, NS_CONSTANT, parse_module};
use fusebox_cpu::{Executor, Tensor, Value};
use std::time::Instant;

const ROWS: usize = 128;
const DIM: usize = 768;
const HIDDEN: usize = 3072;
const PAIRS: usize = 6;

/// The module: `x` through `2 · PAIRS` matmuls, the weights either `metadata` constants or
/// parameters of `main`.
fn source(constants: bool) -> String {
    let mut params = format!("x: R.Tensor(({ROWS}, {DIM}), dtype=\"float32\")");
    let mut body = String::new();
    let mut prev = "x".to_string();
    for i in 0..2 * PAIRS {
        let (k, n) = if i % 2 == 0 {
            (DIM, HIDDEN)
        } else {
            (HIDDEN, DIM)
        };
        let w = if constants {
            format!("metadata[\"relax.expr.Constant\"][{i}]")
        } else {
            params.push_str(&format!(", w{i}: R.Tensor(({k}, {n}), dtype=\"float32\")"));
            format!("w{i}")
        };
        body.push_str(&format!("            y{i} = R.matmul({prev}, {w})\n"));
        prev = format!("y{i}");
    }
    format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main({params}) -> R.Tensor(({ROWS}, {DIM}), dtype=\"float32\"):\n        with R.dataflow():\n{body}            R.output({prev})\n        return {prev}\n"
    )
}

/// `n` values uniform in `[-scale, scale]`.
fn values(n: usize, rng: &mut Rng, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| ((rng.next_u64() % 2001) as f32 / 1000.0 - 1.0) * scale)
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(Ok(7), |s| s.parse())?;
    let threads: usize = args.next().map_or(Ok(2), |s| s.parse())?;
    fusebox_cpu::par::set_threads(Some(threads));
    let mut rng = Rng::new(7);
    let x = values(ROWS * DIM, &mut rng, 1.0);
    let mut consts = ConstTable::new();
    let mut weights = Vec::new();
    for i in 0..2 * PAIRS {
        let (k, n) = if i % 2 == 0 {
            (DIM, HIDDEN)
        } else {
            (HIDDEN, DIM)
        };
        // 1/sqrt(k) keeps the activations' scale through the stack.
        let w = values(k * n, &mut rng, 1.7 / (k as f32).sqrt());
        let bytes = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        consts.insert(
            NS_CONSTANT,
            i,
            Constant::from_bytes(DType::F32, vec![k as i64, n as i64], bytes)?,
        );
        weights.push(Value::Tensor(Tensor::from_f32(vec![k, n], w)?));
    }
    let packed = parse_module(&source(true), "bench_dense_constants.relax", &consts)?;
    let plain = parse_module(&source(false), "bench_dense_params.relax", &consts)?;
    let input = Value::Tensor(Tensor::from_f32(vec![ROWS, DIM], x)?);
    let ex = Executor::new();
    let run_packed = || ex.run(&packed, "main", vec![input.clone()], None);
    let run_plain = || {
        let mut a = vec![input.clone()];
        a.extend(weights.iter().cloned());
        ex.run(&plain, "main", a, None)
    };
    // Warm-up: packs the constants once.
    let (a, b) = (run_packed()?, run_plain()?);
    let (Value::Tensor(a), Value::Tensor(b)) = (a, b) else {
        return Err("expected tensors".into());
    };
    let diff = a
        .to_f32_vec()
        .iter()
        .zip(b.to_f32_vec())
        .map(|(p, q)| (p - q).abs())
        .fold(0.0f32, f32::max);
    let (mut tp, mut tf) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        run_packed()?;
        tp.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        run_plain()?;
        tf.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (p, f) = (median(tp), median(tf));
    let flops = 2.0 * (2 * PAIRS * ROWS * DIM * HIDDEN) as f64;
    println!(
        "{} dense layers of {ROWS} x {DIM} <-> {HIDDEN} ({:.0} MB of weights), {threads} threads, median of {rounds} alternated rounds",
        2 * PAIRS,
        (2 * PAIRS * DIM * HIDDEN * 4) as f64 / 1e6
    );
    println!(
        "faer (weights as parameters): {f:.2} ms, {:.0} GFLOP/s",
        flops / f / 1e6
    );
    println!(
        "packed (weights as constants): {p:.2} ms, {:.0} GFLOP/s",
        flops / p / 1e6
    );
    println!("packed / faer: {:.3}; max |difference| {diff:.2e}", p / f);
    println!("{ex:?}");
    Ok(())
}
