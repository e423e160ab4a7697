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

use check::{lower_check_compile as run, module, tensor_ty};
use fusebox_core::text::parse_module_str;

#[test]
fn min_and_prod() {
    let p = format!("x: {}", tensor_ty("4, 6, 5", "float32"));
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
    let p = format!("x: {}", tensor_ty("4, 6, 5", "float32"));
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
            &format!(
                "a: {}, b: {}",
                tensor_ty(a, "float32"),
                tensor_ty(b, "float32")
            ),
            &[&format!("gv = R.einsum((a, b), subscripts=\"{eq}\")")],
        );
    }
    let p = format!("x: {}", tensor_ty("3, 3", "float32"));
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
        "main",
        &format!("x: {}", tensor_ty("4, 6", "float32")),
        &["gv = R.topk(x, k=2, axis=-1, ret_type=\"values\", largest=True, dtype=\"int64\")"],
    );
    let m = parse_module_str(&src).unwrap();
    let err = fusebox_cuda::lower::lower("main", m.get("main").unwrap()).unwrap_err();
    assert!(err.to_string().contains("topk"), "{err}");
}
