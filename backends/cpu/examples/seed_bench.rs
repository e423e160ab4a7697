//! Times the reference executor on seed 003's `Conv2dReLUx2` (two 64→64 3x3 convolutions on a
//! 1x64x56x56 input, each followed by relu): `cargo run --release --example seed_bench`.

#![allow(clippy::print_stdout, reason = "a benchmark prints its timings")]

use fusebox_core::ir::generate::Rng;
use fusebox_cpu::{Tensor, Value, run};
use std::time::Instant;

fn random(shape: Vec<usize>, rng: &mut Rng, scale: f32) -> Result<Value, fusebox_core::Error> {
    let n = shape.iter().product();
    let data = (0..n)
        .map(|_| ((rng.next_u64() % 2001) as f32 / 1000.0 - 1.0) * scale)
        .collect();
    Ok(Value::Tensor(Tensor::from_f32(shape, data)?))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/seed/conv2d_relu_x2.relax"
    );
    let m = fusebox_core::text::read_module(std::path::Path::new(path))?;
    let mut rng = Rng::new(1);
    let args = vec![
        random(vec![1, 64, 56, 56], &mut rng, 1.0)?,
        random(vec![64, 64, 3, 3], &mut rng, 0.05)?,
        random(vec![64, 64, 3, 3], &mut rng, 0.05)?,
    ];
    // 2 convs x 2 * 64 * 576 * (56*56 or 54*54) flops.
    let flops = 2.0 * 64.0 * 576.0 * (56.0 * 56.0 + 54.0 * 54.0);
    for i in 0..5 {
        let t = Instant::now();
        let out = run(&m, "main", args.clone())?;
        let s = t.elapsed().as_secs_f64();
        let Value::Tensor(y) = out else {
            return Err("expected a tensor".into());
        };
        println!(
            "run {i}: {:.1} ms ({:.1} GFLOP/s), output {:?}",
            s * 1e3,
            flops / s / 1e9,
            y.shape()
        );
    }
    Ok(())
}
