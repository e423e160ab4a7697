//! Running `if`/`else`: only the branch the condition selects runs (the other may hold an op
//! with no kernel), conditions may be bool scalar tensors or `T.bool` values, nested `if`s and
//! dataflow blocks inside branches run, and a module partitioned inside its branches gives the
//! same values. Expected values come from a naive reference written here.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::ir::verify::verify;
use fusebox_core::pattern::parse_pattern;
use fusebox_core::runtime::Prim;
use fusebox_core::text::parse_module_str;
use fusebox_core::transform::{FusionPattern, PartitionOptions, fuse_ops, fuse_ops_by_pattern};
use fusebox_cpu::{Tensor, Value, run};

const SRC: &str = r#"
@I.ir_module
class Module:
    @R.function
    def main(c: R.Tensor((), dtype="bool"), d: R.Prim("bool"), x: R.Tensor((2, 3), dtype="float32"), w: R.Tensor((3, 3), dtype="float32")) -> R.Tensor((2, 3), dtype="float32"):
        with R.dataflow():
            s = R.add(x, x)
            R.output(s)
        if c:
            with R.dataflow():
                m = R.matmul(s, w)
                r = R.nn.relu(m)
                R.output(r)
            y = r
        else:
            if d:
                with R.dataflow():
                    e = R.negative(x)
                    f = R.multiply(e, s)
                    R.output(f)
                z = f
            else:
                z: R.Tensor((2, 3), dtype="float32") = R.not_an_op_of_the_set(x)
            y = z
        out = R.subtract(y, x)
        return out
"#;

fn tensor(v: &Value) -> &Tensor {
    match v {
        Value::Tensor(t) => t,
        v => panic!("expected a tensor, found {v:?}"),
    }
}

const X: [f32; 6] = [1.0, -2.0, 3.0, 0.5, -1.5, 2.5];
const W: [f32; 9] = [0.5, -1.0, 2.0, 1.5, 0.25, -0.5, -2.0, 1.0, 0.75];

/// The naive reference: `relu((x + x) @ w) - x` or `(-x) * (x + x) - x`.
fn expected(c: bool) -> Vec<f32> {
    let mut out = vec![0.0f32; 6];
    for i in 0..2 {
        for j in 0..3 {
            let y = if c {
                let mut acc = 0.0f32;
                for k in 0..3 {
                    acc += 2.0 * X[i * 3 + k] * W[k * 3 + j];
                }
                acc.max(0.0)
            } else {
                let x = X[i * 3 + j];
                -x * (2.0 * x)
            };
            out[i * 3 + j] = y - X[i * 3 + j];
        }
    }
    out
}

fn args(c: bool, d: bool) -> Vec<Value> {
    vec![
        Value::Tensor(Tensor::new(vec![], fusebox_core::runtime::Storage::Bool(vec![c])).unwrap()),
        Value::Prim(Prim::Int(i64::from(d))),
        Value::Tensor(Tensor::from_f32(vec![2, 3], X.to_vec()).unwrap()),
        Value::Tensor(Tensor::from_f32(vec![3, 3], W.to_vec()).unwrap()),
    ]
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
    }
}

#[test]
fn runs_only_the_taken_branch() {
    let m = parse_module_str(SRC).unwrap();
    verify(&m).unwrap();
    for c in [true, false] {
        let out = run(&m, "main", args(c, true)).unwrap();
        close(&tensor(&out).to_f32_vec(), &expected(c));
    }
    // The branch with the op outside the op set fails only when taken.
    let err = run(&m, "main", args(false, false)).unwrap_err().to_string();
    assert!(err.contains("relax.not_an_op_of_the_set"), "{err}");
}

#[test]
fn partitioned_branches_give_the_same_values() {
    let m = parse_module_str(SRC).unwrap();
    let pats = vec![
        FusionPattern::new(
            "cpu.mm_relu",
            parse_pattern("relax.nn.relu(relax.matmul(_, _))").unwrap(),
        ),
        FusionPattern::new(
            "cpu.neg_mul",
            parse_pattern("relax.multiply(relax.negative(_), _)").unwrap(),
        ),
    ];
    let p = fuse_ops_by_pattern(&m, &pats, PartitionOptions::default()).unwrap();
    let p = fuse_ops(&p.module, 2, 256).unwrap();
    verify(&p).unwrap();
    // Both branch groups were outlined and are called from inside the branches.
    let text = fusebox_core::text::print_module(&p).text;
    assert!(text.contains("Composite\": \"cpu.mm_relu"), "{text}");
    assert!(text.contains("Composite\": \"cpu.neg_mul"), "{text}");
    assert!(!text.contains("fusebox.if"), "{text}");
    for c in [true, false] {
        let out = run(&p, "main", args(c, true)).unwrap();
        close(&tensor(&out).to_f32_vec(), &expected(c));
    }
}

#[test]
fn a_condition_must_be_a_scalar_when_run() {
    let src = SRC.replace(
        "c: R.Tensor((), dtype=\"bool\")",
        "c: R.Tensor(dtype=\"bool\")",
    );
    let m = parse_module_str(&src).unwrap();
    let mut a = args(true, true);
    a[0] = Value::Tensor(
        Tensor::new(
            vec![2],
            fusebox_core::runtime::Storage::Bool(vec![true, false]),
        )
        .unwrap(),
    );
    let err = run(&m, "main", a).unwrap_err().to_string();
    assert!(err.contains("condition of `if` must be a scalar"), "{err}");
}
