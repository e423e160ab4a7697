//! The executor on parsed modules: symbolic dims, shapes, tuples, module and local function
//! calls, and errors instead of panics.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::text::parse_module_str;
use fusebox_cpu::{Tensor, Value, run};

const SRC: &str = r#"# from tvm.script import ir as I
# from tvm.script import tir as T
# from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function(private=True)
    def fused(a: R.Tensor(("n", 4), dtype="float32"), b: R.Tensor((4,), dtype="float32")) -> R.Tensor(("n", 4), dtype="float32"):
        n = T.int64()
        R.func_attr({"Composite": "cpu.add_relu", "Primitive": True})
        with R.dataflow():
            lv: R.Tensor((n, 4), dtype="float32") = R.add(a, b)
            gv: R.Tensor((n, 4), dtype="float32") = R.nn.relu(lv)
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor(("n", 4), dtype="float32"), b: R.Tensor((4,), dtype="float32")) -> R.Tuple(R.Tensor(("n * 4",), dtype="float32"), R.Tensor(("n", 4), dtype="float32")):
        n = T.int64()
        cls = Module
        with R.dataflow():
            y: R.Tensor((n, 4), dtype="float32") = cls.fused(x, b)
            t: R.Tuple(R.Tensor((n, 4), dtype="float32"), R.Tensor((n, 4), dtype="float32")) = (y, x)
            z: R.Tensor((n, 4), dtype="float32") = t[1]
            s: R.Tensor((n * 4,), dtype="float32") = R.reshape(z, R.shape([n * 4]))
            R.output(s, y)
        return (s, y)
"#;

fn tensor(v: &Value) -> &Tensor {
    match v {
        Value::Tensor(t) => t,
        v => panic!("expected a tensor, found {v:?}"),
    }
}

#[test]
fn runs_calls_tuples_and_symbolic_shapes() {
    let m = parse_module_str(SRC).unwrap_or_else(|e| panic!("{e}"));
    let x = Tensor::from_f32(vec![3, 4], (0..12).map(|i| i as f32 - 6.0).collect()).unwrap();
    let b = Tensor::from_f32(vec![4], vec![0.5, 0.0, -0.5, 1.0]).unwrap();
    let out = run(&m, "main", vec![Value::Tensor(x.clone()), Value::Tensor(b)])
        .unwrap_or_else(|e| panic!("{e}"));
    let Value::Tuple(parts) = out else {
        panic!("expected a tuple")
    };
    assert_eq!(tensor(&parts[0]).shape(), &[12]);
    assert_eq!(tensor(&parts[0]).to_f32_vec(), x.to_f32_vec());
    let y = tensor(&parts[1]).to_f32_vec();
    assert_eq!(&y[..4], &[0.0, 0.0, 0.0, 0.0]);
    assert_eq!(&y[8..], &[2.5, 3.0, 3.5, 6.0]);
    // n = 1 works as well (same module, other extent).
    let x1 = Tensor::from_f32(vec![1, 4], vec![1.0; 4]).unwrap();
    let b1 = Tensor::from_f32(vec![4], vec![0.0; 4]).unwrap();
    assert!(run(&m, "main", vec![Value::Tensor(x1), Value::Tensor(b1)]).is_ok());
}

#[test]
fn wrong_arguments_are_errors() {
    let m = parse_module_str(SRC).unwrap_or_else(|e| panic!("{e}"));
    let x = Tensor::from_f32(vec![3, 5], vec![0.0; 15]).unwrap();
    let b = Tensor::from_f32(vec![4], vec![0.0; 4]).unwrap();
    let e = run(&m, "main", vec![Value::Tensor(x), Value::Tensor(b.clone())]);
    assert!(e.is_err());
    let e = run(&m, "main", vec![Value::Tensor(b.clone())]);
    assert!(e.is_err());
    let e = run(&m, "nope", vec![]);
    assert!(e.is_err());
    let i = Tensor::from_i64(vec![3, 4], vec![0; 12]).unwrap();
    let e = run(&m, "main", vec![Value::Tensor(i), Value::Tensor(b)]);
    assert!(e.unwrap_err().to_string().contains("dtype"));
}

/// What the ONNX importer makes of `Range(3, Shape(x)[1], 2)` for a dynamic sequence length,
/// run for two lengths; plus a causal mask (`tril`) and a gather of the positions.
#[test]
fn symbolic_range_runs() {
    let src = r#"# from tvm.script import ir as I
# from tvm.script import tir as T
# from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor(("b", "seq"), dtype="float32"), m: R.Tensor(("seq", "seq"), dtype="float32")):
        b = T.int64()
        seq = T.int64()
        with R.dataflow():
            lv = R.broadcast_to(R.const(1, "int64"), R.shape([(seq - 2) // 2]))
            lv1 = R.cumsum(lv, axis=0, dtype=None, exclusive=True)
            lv2 = R.multiply(lv1, R.const(2, "int64"))
            pos = R.add(lv2, R.const(3, "int64"))
            g = R.take(x, pos, axis=1, mode="fast")
            c = R.tril(m, k=0)
            R.output(pos, g, c)
        return (pos, g, c)
"#;
    let m = parse_module_str(src).unwrap_or_else(|e| panic!("{e}"));
    for seq in [4usize, 7, 8] {
        let x =
            Tensor::from_f32(vec![1, seq], (0..seq).map(|i| i as f32 * 10.0).collect()).unwrap();
        let mm = Tensor::from_f32(vec![seq, seq], vec![1.0; seq * seq]).unwrap();
        let out = run(&m, "main", vec![Value::Tensor(x), Value::Tensor(mm)])
            .unwrap_or_else(|e| panic!("seq {seq}: {e}"));
        let Value::Tuple(parts) = out else {
            panic!("expected a tuple")
        };
        // numpy: np.arange(3, seq, 2)
        let want: Vec<i64> = (3..seq as i64).step_by(2).collect();
        assert_eq!(tensor(&parts[0]).to_i64_vec(), want, "seq {seq}");
        let g: Vec<f32> = want.iter().map(|&i| i as f32 * 10.0).collect();
        assert_eq!(tensor(&parts[1]).to_f32_vec(), g, "seq {seq}");
        let c = tensor(&parts[2]).to_f32_vec();
        for r in 0..seq {
            for k in 0..seq {
                assert_eq!(c[r * seq + k], if k <= r { 1.0 } else { 0.0 });
            }
        }
    }
}
