//! The reduction family of issue 17 (`min`, `prod`, `argmax`, `argmin`, `einsum`) lowered to
//! the kernel IR, evaluated on the CPU against the CPU reference (every element), and compiled
//! to CUBIN with NVRTC where it is available; `topk` (a sort) is refused with a clear error.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

mod check;
use fusebox_cuda::testing as common;

use check::{check_function, random_args};
use fusebox_core::text::parse_module_str;
use fusebox_cuda::nvrtc::{Arch, CompileOptions};

/// `main(params) { body }` with a dataflow block whose last binding is the output.
fn module(params: &str, body: &[&str]) -> String {
    let mut s = format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main({params}):\n        with R.dataflow():\n"
    );
    for b in body {
        s.push_str(&format!("            {b}\n"));
    }
    let last = body
        .last()
        .and_then(|b| b.split('=').next())
        .map(str::trim)
        .unwrap_or("gv");
    s.push_str(&format!(
        "            R.output({last})\n        return {last}\n"
    ));
    s
}

fn f32t(shape: &str) -> String {
    format!("R.Tensor(({shape}), dtype=\"float32\")")
}

fn run(name: &str, params: &str, body: &[&str]) -> usize {
    let src = module(params, body).replace(
        "def main(",
        &format!("def {}(", fusebox_cuda::lower::sanitize(name)),
    );
    let fname = fusebox_cuda::lower::sanitize(name);
    let m = parse_module_str(&src).unwrap_or_else(|e| panic!("{name}: {e}\n{src}"));
    let mut kernels = 0;
    for seed in [1u64, 7, 42] {
        let args = random_args(&m, &fname, seed);
        let (k, _) = check_function(&m, &fname, &args, None)
            .unwrap_or_else(|e| panic!("{name} (seed {seed}): {e}\n{src}"));
        kernels = k;
    }
    if common::nvrtc_or_skip(name) {
        let low = fusebox_cuda::lower::lower(&fname, m.get(&fname).unwrap()).unwrap();
        for k in &low.kernels {
            let src = fusebox_cuda::emit::emit(k);
            for arch in [Arch::Sm80, Arch::Sm90, Arch::Sm90a] {
                let opts = CompileOptions {
                    ptxas_verbose: true,
                    ..CompileOptions::default()
                };
                let c = fusebox_cuda::compile_cached(None, &src, &k.name, arch, &opts)
                    .unwrap_or_else(|e| panic!("{name}: {e}\n{src}"));
                assert!(!c.has_spills(), "{name} spills on {arch}: {}", c.log);
            }
        }
    }
    kernels
}

#[test]
fn min_and_prod() {
    let p = format!("x: {}", f32t("4, 6, 5"));
    for op in ["min", "prod"] {
        run(
            op,
            &p,
            &[&format!("gv = R.{op}(x, axis=[2], keepdims=False)")],
        );
        run(
            op,
            &p,
            &[&format!("gv = R.{op}(x, axis=[0], keepdims=True)")],
        );
        run(
            op,
            &p,
            &[&format!("gv = R.{op}(x, axis=[1, 2], keepdims=False)")],
        );
        run(op, &p, &[&format!("gv = R.{op}(x)")]);
    }
    // A row reduction feeding an elementwise epilogue (one row kernel).
    run(
        "prod then add",
        &p,
        &["a = R.prod(x, axis=[2], keepdims=True)", "gv = R.add(x, a)"],
    );
}

#[test]
fn argmax_and_argmin() {
    let p = format!("x: {}", f32t("4, 6, 5"));
    for op in ["argmax", "argmin"] {
        run(
            op,
            &p,
            &[&format!("gv = R.{op}(x, axis=-1, keepdims=False)")],
        );
        run(op, &p, &[&format!("gv = R.{op}(x, axis=1, keepdims=True)")]);
        run(
            op,
            &p,
            &[&format!("gv = R.{op}(x, axis=0, keepdims=False)")],
        );
        run(op, &p, &[&format!("gv = R.{op}(x)")]);
    }
    // Ties resolve to the first index, as on the CPU.
    run(
        "argmax ties",
        &p,
        &[
            "a = R.nn.relu(x)",
            "gv = R.argmax(a, axis=2, keepdims=False)",
        ],
    );
}

#[test]
fn einsum_equations() {
    let cases = [
        ("bhid,bhjd->bhij", "2, 3, 4, 8", "2, 3, 5, 8"),
        ("bij,bjk->bik", "3, 4, 6", "3, 6, 2"),
        ("i,j->ij", "7,", "5,"),
        ("...ij,...jk->...ik", "2, 1, 3, 4", "5, 4, 2"),
    ];
    for (eq, a, b) in cases {
        run(
            eq,
            &format!("a: {}, b: {}", f32t(a), f32t(b)),
            &[&format!("gv = R.einsum((a, b), subscripts=\"{eq}\")")],
        );
    }
    let p = format!("x: {}", f32t("3, 3"));
    for eq in ["ii->i", "ij->ji", "ij->", "ii"] {
        run(
            eq,
            &p,
            &[&format!("gv = R.einsum((x,), subscripts=\"{eq}\")")],
        );
    }
}

#[test]
fn topk_is_refused_with_a_reason() {
    let src = module(
        &format!("x: {}", f32t("4, 6")),
        &["gv = R.topk(x, k=2, axis=-1, ret_type=\"values\", largest=True, dtype=\"int64\")"],
    );
    let m = parse_module_str(&src).unwrap();
    let err = fusebox_cuda::lower::lower("main", m.get("main").unwrap()).unwrap_err();
    assert!(err.to_string().contains("topk"), "{err}");
}
