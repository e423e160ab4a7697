//! TVM compatibility (issue 20): ops outside the op set, the ops TVM's importers emit
//! (`relax.stack`, the pooling family), constants without values, and `If`.
//!
//! Kernels are checked against naive references written here, independently of the kernels.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::text::{self, ConstTable};
use fusebox_cpu::{Storage, Tensor, Value, run};

fn parse(src: &str) -> fusebox_core::ir::Module {
    text::parse_module(src, "<input>", &ConstTable::new()).unwrap_or_else(|e| panic!("{e}"))
}

fn f32_tensor(shape: &[usize], f: impl Fn(usize) -> f32) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::new(shape.to_vec(), Storage::F32((0..n).map(f).collect())).unwrap()
}

fn out_tensor(v: Value) -> Tensor {
    match v {
        Value::Tensor(t) => t,
        other => panic!("expected a tensor, found {}", other.kind()),
    }
}

#[test]
fn running_an_opaque_op_fails_naming_it() {
    let m = parse(
        r#"@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((2, 3), dtype="float32")):
        with R.dataflow():
            a = R.nn.relu(x)
            s: R.Tensor((2, 3), dtype="float32") = R.my_op(a, k=2)
            R.output(s)
        return s
"#,
    );
    let x = f32_tensor(&[2, 3], |i| i as f32);
    let e = run(&m, "main", vec![Value::Tensor(x)]).expect_err("an opaque op has no kernel");
    let msg = e.to_string();
    assert!(msg.contains("no kernel for `relax.my_op`"), "{msg}");
}
