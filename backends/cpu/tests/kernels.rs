//! Kernel tests against hand-computed values, one section per kernel family, plus naive
//! reference loops for conv2d and matmul on random shapes; the index ops in `kernels/index.rs`.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cloned_ref_to_slice_refs,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::ir::DType;
use fusebox_core::ir::generate::Rng;
use fusebox_core::op::{AttrLit, Op};
use fusebox_cpu::{Prim, Storage, Tensor, Value, eval_op};

#[path = "kernels/index.rs"]
mod index;

fn op(name: &str, kw: &[(&str, AttrLit)]) -> Op {
    let kw: Vec<(String, AttrLit)> = kw.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    Op::from_call(name, &kw).unwrap_or_else(|e| panic!("{e}"))
}

fn ints(v: &[i64]) -> AttrLit {
    AttrLit::List(v.iter().map(|&i| AttrLit::Int(i)).collect())
}

fn s(v: &str) -> AttrLit {
    AttrLit::Str(v.to_string())
}

fn t(shape: &[usize], data: &[f32]) -> Value {
    Value::Tensor(Tensor::from_f32(shape.to_vec(), data.to_vec()).unwrap())
}

fn ti(shape: &[usize], data: &[i64]) -> Value {
    Value::Tensor(Tensor::from_i64(shape.to_vec(), data.to_vec()).unwrap())
}

fn run(o: &Op, args: &[Value]) -> Value {
    eval_op(o, args).unwrap_or_else(|e| panic!("{e}"))
}

fn tensor(v: &Value) -> &Tensor {
    match v {
        Value::Tensor(t) => t,
        v => panic!("expected a tensor, found {v:?}"),
    }
}

fn f32s(v: &Value) -> Vec<f32> {
    tensor(v).to_f32_vec()
}

fn shape(v: &Value) -> Vec<usize> {
    tensor(v).shape().to_vec()
}

fn close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: got {g}, want {w}\n{got:?}\n{want:?}"
        );
    }
}

fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.next_u64() % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

// ---- elementwise -------------------------------------------------------------------------

#[test]
fn binary_broadcasting() {
    let a = t(&[3, 1], &[1.0, 2.0, 3.0]);
    let b = t(&[4], &[10.0, 20.0, 30.0, 40.0]);
    let y = run(&Op::Add, &[a.clone(), b.clone()]);
    assert_eq!(shape(&y), vec![3, 4]);
    assert_eq!(
        f32s(&y),
        vec![11., 21., 31., 41., 12., 22., 32., 42., 13., 23., 33., 43.]
    );
    let y = run(&Op::Subtract, &[b.clone(), a.clone()]);
    assert_eq!(&f32s(&y)[..4], &[9., 19., 29., 39.]);
    // Scalar broadcast, rank-0 operand.
    let k = Value::Tensor(Tensor::scalar_f32(2.0));
    assert_eq!(
        f32s(&run(&Op::Multiply, &[a.clone(), k.clone()])),
        vec![2., 4., 6.]
    );
    assert_eq!(
        f32s(&run(&Op::Divide, &[k.clone(), a.clone()])),
        vec![2., 1., 2.0 / 3.0]
    );
    assert_eq!(
        f32s(&run(&Op::Power, &[a.clone(), k.clone()])),
        vec![1., 4., 9.]
    );
    let m = t(&[3, 1], &[2.0, 2.0, 2.0]);
    assert_eq!(
        f32s(&run(&Op::Maximum, &[a.clone(), m.clone()])),
        vec![2., 2., 3.]
    );
    assert_eq!(f32s(&run(&Op::Minimum, &[a.clone(), m])), vec![1., 2., 2.]);
    // 17 wide with a middle broadcast dim.
    let x: Vec<f32> = (0..2 * 17).map(|i| i as f32).collect();
    let y = run(
        &Op::Add,
        &[t(&[2, 1, 17], &x), t(&[3, 1], &[100., 200., 300.])],
    );
    assert_eq!(shape(&y), vec![2, 3, 17]);
    let v = f32s(&y);
    assert_eq!(v[0], 100.0);
    assert_eq!(v[17 + 16], 216.0);
    assert_eq!(v[3 * 17 + 1], 118.0);
    assert_eq!(v[5 * 17 + 1], 318.0);
    // Mismatched dims are an error.
    assert!(eval_op(&Op::Add, &[t(&[3], &[0.; 3]), t(&[4], &[0.; 4])]).is_err());
    // Mixed dtypes are an error.
    assert!(eval_op(&Op::Add, &[t(&[1], &[0.]), ti(&[1], &[0])]).is_err());
}

#[test]
fn integer_and_half_arithmetic() {
    let a = ti(&[3], &[7, -7, 9]);
    let b = ti(&[3], &[2, 2, -4]);
    assert_eq!(
        tensor(&run(&Op::Divide, &[a.clone(), b.clone()])).to_i64_vec(),
        vec![3, -3, -2]
    );
    assert_eq!(
        tensor(&run(&Op::Multiply, &[a.clone(), b])).to_i64_vec(),
        vec![14, -14, -36]
    );
    assert!(eval_op(&Op::Divide, &[a.clone(), ti(&[1], &[0])]).is_err());
    let i32s = Value::Tensor(tensor(&a).cast(DType::I32));
    assert_eq!(
        tensor(&run(&Op::Relu, &[i32s.clone()])).to_i64_vec(),
        vec![7, 0, 9]
    );
    assert_eq!(
        tensor(&run(&Op::Abs, &[i32s.clone()])).to_i64_vec(),
        vec![7, 7, 9]
    );
    assert_eq!(tensor(&run(&Op::Negative, &[i32s])).dtype(), DType::I32);
    for dt in [DType::F16, DType::BF16] {
        let x = Value::Tensor(tensor(&t(&[2], &[1.5, -0.25])).cast(dt));
        let y = run(&Op::Add, &[x.clone(), x.clone()]);
        assert_eq!(tensor(&y).dtype(), dt);
        assert_eq!(f32s(&y), vec![3.0, -0.5]);
        let e = run(&Op::Exp, &[x]);
        assert_eq!(tensor(&e).dtype(), dt);
        close(&f32s(&e), &[1.5f32.exp(), (-0.25f32).exp()], 1e-2);
    }
    let b = Value::Tensor(Tensor::new(vec![2], Storage::Bool(vec![true, false])).unwrap());
    let y = run(&Op::Add, &[b.clone(), b.clone()]);
    assert_eq!(
        tensor(&y).storage(),
        fusebox_cpu::StorageRef::Bool(&[true, false])
    );
    assert!(eval_op(&Op::Exp, &[ti(&[1], &[1])]).is_err());
}

#[test]
fn unary_math_and_activations() {
    let x = t(&[5], &[-2.0, -0.5, 0.0, 0.5, 2.0]);
    let xs = [-2.0f64, -0.5, 0.0, 0.5, 2.0];
    let want = |f: fn(f64) -> f64| -> Vec<f32> { xs.iter().map(|&v| f(v) as f32).collect() };
    close(&f32s(&run(&Op::Exp, &[x.clone()])), &want(f64::exp), 1e-6);
    close(&f32s(&run(&Op::Tanh, &[x.clone()])), &want(f64::tanh), 1e-6);
    close(
        &f32s(&run(&Op::Sigmoid, &[x.clone()])),
        &want(|v| 1.0 / (1.0 + (-v).exp())),
        1e-6,
    );
    close(
        &f32s(&run(&Op::Silu, &[x.clone()])),
        &want(|v| v / (1.0 + (-v).exp())),
        1e-6,
    );
    // erf and gelu (erf form) against known values.
    close(
        &f32s(&run(&Op::Erf, &[x.clone()])),
        &[-0.995_322_3, -0.520_499_9, 0.0, 0.520_499_9, 0.995_322_3],
        1e-6,
    );
    close(
        &f32s(&run(&Op::Gelu, &[x.clone()])),
        &[-0.045_500_26, -0.154_268_5, 0.0, 0.345_731_5, 1.954_5],
        1e-5,
    );
    close(
        &f32s(&run(&Op::GeluTanh, &[x.clone()])),
        &[-0.045_402_3, -0.154_286, 0.0, 0.345_714, 1.954_597_7],
        1e-5,
    );
    close(
        &f32s(&run(&Op::Relu, &[x.clone()])),
        &[0.0, 0.0, 0.0, 0.5, 2.0],
        0.0,
    );
    close(
        &f32s(&run(&Op::Abs, &[x.clone()])),
        &[2.0, 0.5, 0.0, 0.5, 2.0],
        0.0,
    );
    close(
        &f32s(&run(&Op::Negative, &[x.clone()])),
        &[2.0, 0.5, -0.0, -0.5, -2.0],
        0.0,
    );
    let p = t(&[3], &[1.0, 4.0, 16.0]);
    close(&f32s(&run(&Op::Sqrt, &[p.clone()])), &[1.0, 2.0, 4.0], 0.0);
    close(
        &f32s(&run(&Op::Rsqrt, &[p.clone()])),
        &[1.0, 0.5, 0.25],
        0.0,
    );
    close(
        &f32s(&run(&Op::Log, &[p])),
        &[0.0, 4f32.ln(), 16f32.ln()],
        1e-7,
    );
    // clip with prim bounds, float and int.
    let c = run(
        &Op::Clip,
        &[
            x.clone(),
            Value::Prim(Prim::Float(-1.0)),
            Value::Prim(Prim::Int(1)),
        ],
    );
    assert_eq!(f32s(&c), vec![-1.0, -0.5, 0.0, 0.5, 1.0]);
    let c = run(
        &Op::Clip,
        &[
            ti(&[3], &[-5, 3, 9]),
            Value::Prim(Prim::Int(0)),
            Value::Prim(Prim::Int(6)),
        ],
    );
    assert_eq!(tensor(&c).to_i64_vec(), vec![0, 3, 6]);
    // astype
    let a = run(&Op::Astype { dtype: DType::I32 }, &[x.clone()]);
    assert_eq!(tensor(&a).dtype(), DType::I32);
    assert_eq!(tensor(&a).to_i64_vec(), vec![-2, 0, 0, 0, 2]);
    let h = run(&Op::Astype { dtype: DType::F16 }, &[x.clone()]);
    assert_eq!(tensor(&h).dtype(), DType::F16);
    assert_eq!(f32s(&h), f32s(&x));
    // dropout (inference): identity and a mask of ones.
    let d = run(
        &op("relax.nn.dropout", &[("rate", AttrLit::Float(0.3))]),
        &[x.clone()],
    );
    let Value::Tuple(parts) = d else {
        panic!("dropout returns a tuple")
    };
    assert_eq!(f32s(&parts[0]), f32s(&x));
    assert_eq!(f32s(&parts[1]), vec![1.0; 5]);
}

// ---- reductions and softmax --------------------------------------------------------------

#[test]
fn reductions() {
    let x: Vec<f32> = (0..3 * 17).map(|i| i as f32).collect();
    let xv = t(&[3, 17], &x);
    let sum1 = op(
        "relax.sum",
        &[("axis", ints(&[1])), ("keepdims", AttrLit::Bool(true))],
    );
    let y = run(&sum1, &[xv.clone()]);
    assert_eq!(shape(&y), vec![3, 1]);
    assert_eq!(f32s(&y), vec![136.0, 425.0, 714.0]);
    let y = run(&op("relax.sum", &[("axis", ints(&[0]))]), &[xv.clone()]);
    assert_eq!(shape(&y), vec![17]);
    assert_eq!(f32s(&y)[0], 51.0);
    let y = run(&op("relax.sum", &[]), &[xv.clone()]);
    assert_eq!(shape(&y), Vec::<usize>::new());
    assert_eq!(f32s(&y), vec![1275.0]);
    let y = run(&op("relax.mean", &[("axis", ints(&[-1]))]), &[xv.clone()]);
    assert_eq!(f32s(&y), vec![8.0, 25.0, 42.0]);
    let y = run(&op("relax.max", &[("axis", ints(&[1]))]), &[xv.clone()]);
    assert_eq!(f32s(&y), vec![16.0, 33.0, 50.0]);
    // Non-adjacent axes of a 3-D tensor.
    let z: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let y = run(
        &op("relax.sum", &[("axis", ints(&[0, 2]))]),
        &[t(&[2, 3, 4], &z)],
    );
    assert_eq!(f32s(&y), vec![60.0, 92.0, 124.0]);
    // Integers.
    let y = run(&op("relax.sum", &[]), &[ti(&[3], &[1, 2, 3])]);
    assert_eq!(tensor(&y).to_i64_vec(), vec![6]);
    let y = run(&op("relax.mean", &[]), &[ti(&[2], &[3, 4])]);
    assert_eq!(tensor(&y).to_i64_vec(), vec![3]);
}

#[test]
fn softmax_rows_sum_to_one() {
    let mut rng = Rng::new(7);
    let x = random(&mut rng, 3 * 17);
    for axis in [-1i64, 0] {
        let y = run(&Op::Softmax { axis }, &[t(&[3, 17], &x)]);
        let v = f32s(&y);
        if axis == -1 {
            for r in 0..3 {
                let s: f32 = v[r * 17..(r + 1) * 17].iter().sum();
                assert!((s - 1.0).abs() < 1e-6, "row {r} sums to {s}");
            }
        } else {
            for c in 0..17 {
                let s: f32 = (0..3).map(|r| v[r * 17 + c]).sum();
                assert!((s - 1.0).abs() < 1e-6, "column {c} sums to {s}");
            }
        }
        let l = f32s(&run(&Op::LogSoftmax { axis }, &[t(&[3, 17], &x)]));
        let exp: Vec<f32> = l.iter().map(|v| v.exp()).collect();
        close(&exp, &v, 1e-6);
    }
    let y = run(&Op::Softmax { axis: -1 }, &[t(&[2], &[0.0, 3f32.ln()])]);
    close(&f32s(&y), &[0.25, 0.75], 1e-7);
}

// ---- norms and lrn -----------------------------------------------------------------------

#[test]
fn norms() {
    let x = t(&[1, 4], &[1.0, 2.0, 3.0, 4.0]);
    let ln = op(
        "relax.nn.layer_norm",
        &[("axes", ints(&[-1])), ("epsilon", AttrLit::Float(0.0))],
    );
    let y = run(&ln, &[x.clone(), t(&[4], &[1.0; 4]), t(&[4], &[0.0; 4])]);
    let sd = 1.25f32.sqrt();
    close(&f32s(&y), &[-1.5 / sd, -0.5 / sd, 0.5 / sd, 1.5 / sd], 1e-6);
    let y = run(&ln, &[x.clone(), t(&[4], &[2.0; 4]), t(&[4], &[1.0; 4])]);
    close(
        &f32s(&y),
        &[
            1.0 - 3.0 / sd,
            1.0 - 1.0 / sd,
            1.0 + 1.0 / sd,
            1.0 + 3.0 / sd,
        ],
        1e-6,
    );
    let rms = op(
        "relax.nn.rms_norm",
        &[("axes", ints(&[-1])), ("epsilon", AttrLit::Float(0.0))],
    );
    let y = run(&rms, &[t(&[2], &[3.0, 4.0]), t(&[2], &[1.0, 2.0])]);
    let r = 12.5f32.sqrt();
    close(&f32s(&y), &[3.0 / r, 8.0 / r], 1e-6);
    // batch_norm, inference mode: (out, moving_mean, moving_var).
    let bn = op(
        "relax.nn.batch_norm",
        &[
            ("epsilon", AttrLit::Float(0.0)),
            ("training", AttrLit::Bool(false)),
        ],
    );
    let y = run(
        &bn,
        &[
            t(&[1, 2, 1, 1], &[1.0, 2.0]),
            t(&[2], &[2.0, 3.0]),
            t(&[2], &[1.0, 1.0]),
            t(&[2], &[0.0, 1.0]),
            t(&[2], &[4.0, 1.0]),
        ],
    );
    let Value::Tuple(parts) = y else {
        panic!("batch_norm returns a tuple")
    };
    assert_eq!(parts.len(), 3);
    close(&f32s(&parts[0]), &[2.0, 4.0], 1e-7);
    assert_eq!(f32s(&parts[1]), vec![0.0, 1.0]);
    assert_eq!(f32s(&parts[2]), vec![4.0, 1.0]);
    // lrn across 3 channels.
    let l = op(
        "relax.nn.lrn",
        &[
            ("size", AttrLit::Int(3)),
            ("alpha", AttrLit::Float(3.0)),
            ("beta", AttrLit::Float(1.0)),
            ("bias", AttrLit::Float(1.0)),
        ],
    );
    let y = run(&l, &[t(&[1, 3, 1, 1], &[1.0, 2.0, 3.0])]);
    close(&f32s(&y), &[1.0 / 6.0, 2.0 / 15.0, 3.0 / 14.0], 1e-6);
}

// ---- pooling -----------------------------------------------------------------------------

fn pool(name: &str, kw: &[(&str, AttrLit)], x: &Value) -> Value {
    run(&op(name, kw), std::slice::from_ref(x))
}

#[test]
fn pooling_with_padding_and_ceil_mode() {
    let x: Vec<f32> = (1..=9).map(|i| i as f32).collect();
    let xv = t(&[1, 1, 3, 3], &x);
    let base = [
        ("pool_size", ints(&[2, 2])),
        ("strides", ints(&[2, 2])),
        ("padding", ints(&[1, 1])),
    ];
    let y = pool("relax.nn.max_pool2d", &base, &xv);
    assert_eq!(shape(&y), vec![1, 1, 2, 2]);
    assert_eq!(f32s(&y), vec![1.0, 3.0, 7.0, 9.0]);
    let y = pool("relax.nn.avg_pool2d", &base, &xv);
    assert_eq!(f32s(&y), vec![1.0, 2.5, 5.5, 7.0]);
    let mut inc = base.to_vec();
    inc.push(("count_include_pad", AttrLit::Bool(true)));
    let y = pool("relax.nn.avg_pool2d", &inc, &xv);
    assert_eq!(f32s(&y), vec![0.25, 1.25, 2.75, 7.0]);
    let ceil = [
        ("pool_size", ints(&[2, 2])),
        ("strides", ints(&[2, 2])),
        ("ceil_mode", AttrLit::Bool(true)),
    ];
    assert_eq!(
        f32s(&pool("relax.nn.max_pool2d", &ceil, &xv)),
        vec![5.0, 6.0, 8.0, 9.0]
    );
    assert_eq!(
        f32s(&pool("relax.nn.avg_pool2d", &ceil, &xv)),
        vec![3.0, 4.5, 7.5, 9.0]
    );
    // NHWC gives the same numbers in its own layout (one channel: same data).
    let mut nhwc = base.to_vec();
    nhwc.push(("layout", s("NHWC")));
    let y = pool("relax.nn.max_pool2d", &nhwc, &t(&[1, 3, 3, 1], &x));
    assert_eq!(shape(&y), vec![1, 2, 2, 1]);
    assert_eq!(f32s(&y), vec![1.0, 3.0, 7.0, 9.0]);
    // Adaptive: 3x3 -> 2x2 averages overlapping 2x2 windows.
    let y = pool(
        "relax.nn.adaptive_avg_pool2d",
        &[("output_size", ints(&[2, 2]))],
        &xv,
    );
    assert_eq!(f32s(&y), vec![3.0, 4.0, 6.0, 7.0]);
    let y = pool(
        "relax.nn.adaptive_avg_pool2d",
        &[("output_size", ints(&[1, 1]))],
        &xv,
    );
    assert_eq!(f32s(&y), vec![5.0]);
}

// ---- conv2d ------------------------------------------------------------------------------

struct ConvCase {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    kh: usize,
    kw: usize,
    stride: [usize; 2],
    pad: [usize; 4],
    dil: [usize; 2],
    groups: usize,
}

/// Direct convolution in NCHW/OIHW.
fn naive_conv(cs: &ConvCase, x: &[f32], wt: &[f32]) -> (Vec<usize>, Vec<f32>) {
    let ci = cs.c / cs.groups;
    let og = cs.o / cs.groups;
    let oh = (cs.h + cs.pad[0] + cs.pad[2] - (cs.kh - 1) * cs.dil[0] - 1) / cs.stride[0] + 1;
    let ow = (cs.w + cs.pad[1] + cs.pad[3] - (cs.kw - 1) * cs.dil[1] - 1) / cs.stride[1] + 1;
    let mut out = vec![0.0f32; cs.n * cs.o * oh * ow];
    for n in 0..cs.n {
        for o in 0..cs.o {
            let g = o / og;
            for y in 0..oh {
                for xx in 0..ow {
                    let mut acc = 0.0f64;
                    for i in 0..ci {
                        for ky in 0..cs.kh {
                            for kx in 0..cs.kw {
                                let iy = (y * cs.stride[0] + ky * cs.dil[0]) as isize
                                    - cs.pad[0] as isize;
                                let ix = (xx * cs.stride[1] + kx * cs.dil[1]) as isize
                                    - cs.pad[1] as isize;
                                if iy < 0 || ix < 0 || iy >= cs.h as isize || ix >= cs.w as isize {
                                    continue;
                                }
                                let c = g * ci + i;
                                let xv =
                                    x[((n * cs.c + c) * cs.h + iy as usize) * cs.w + ix as usize];
                                let wv = wt[((o * ci + i) * cs.kh + ky) * cs.kw + kx];
                                acc += f64::from(xv) * f64::from(wv);
                            }
                        }
                    }
                    out[((n * cs.o + o) * oh + y) * ow + xx] = acc as f32;
                }
            }
        }
    }
    (vec![cs.n, cs.o, oh, ow], out)
}

/// Permutes a 4-D row-major array: output dim i is input dim perm[i].
fn permute4(shape: &[usize], data: &[f32], perm: [usize; 4]) -> (Vec<usize>, Vec<f32>) {
    let v = Tensor::from_f32(shape.to_vec(), data.to_vec()).unwrap();
    let axes: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
    let y = run(&Op::PermuteDims { axes: Some(axes) }, &[Value::Tensor(v)]);
    (shape_of(&y), f32s(&y))
}

fn shape_of(v: &Value) -> Vec<usize> {
    shape(v)
}

fn conv_op(cs: &ConvCase, data_layout: &str, kernel_layout: &str) -> Op {
    let i = |v: &[usize]| ints(&v.iter().map(|&x| x as i64).collect::<Vec<_>>());
    op(
        "relax.nn.conv2d",
        &[
            ("strides", i(&cs.stride)),
            ("padding", i(&cs.pad)),
            ("dilation", i(&cs.dil)),
            ("groups", AttrLit::Int(cs.groups as i64)),
            ("data_layout", s(data_layout)),
            ("kernel_layout", s(kernel_layout)),
        ],
    )
}

#[test]
fn conv2d_hand_computed() {
    // 3x3 input 1..9, a 2x2 kernel of ones, padding 1, stride 2.
    let x: Vec<f32> = (1..=9).map(|i| i as f32).collect();
    let cs = ConvCase {
        n: 1,
        c: 1,
        h: 3,
        w: 3,
        o: 1,
        kh: 2,
        kw: 2,
        stride: [2, 2],
        pad: [1, 1, 1, 1],
        dil: [1, 1],
        groups: 1,
    };
    let y = run(
        &conv_op(&cs, "NCHW", "OIHW"),
        &[t(&[1, 1, 3, 3], &x), t(&[1, 1, 2, 2], &[1.0; 4])],
    );
    assert_eq!(shape(&y), vec![1, 1, 2, 2]);
    assert_eq!(f32s(&y), vec![1.0, 5.0, 11.0, 28.0]);
    // Depthwise (groups = 2): each channel scaled by its own 1x1 weight.
    let cs = ConvCase {
        n: 1,
        c: 2,
        h: 2,
        w: 2,
        o: 2,
        kh: 1,
        kw: 1,
        stride: [1, 1],
        pad: [0; 4],
        dil: [1, 1],
        groups: 2,
    };
    let y = run(
        &conv_op(&cs, "NCHW", "OIHW"),
        &[
            t(&[1, 2, 2, 2], &[1., 2., 3., 4., 10., 20., 30., 40.]),
            t(&[2, 1, 1, 1], &[2.0, 3.0]),
        ],
    );
    assert_eq!(f32s(&y), vec![2., 4., 6., 8., 30., 60., 90., 120.]);
    // A channel-count mismatch is an error, not a panic.
    assert!(
        eval_op(
            &conv_op(&cs, "NCHW", "OIHW"),
            &[t(&[1, 3, 2, 2], &[0.0; 12]), t(&[2, 1, 1, 1], &[1.0; 2])]
        )
        .is_err()
    );
}

#[test]
fn conv2d_matches_direct_convolution_in_both_layouts() {
    let mut rng = Rng::new(11);
    let cases = [
        ConvCase {
            n: 1,
            c: 3,
            h: 17,
            w: 17,
            o: 5,
            kh: 3,
            kw: 3,
            stride: [1, 1],
            pad: [1, 1, 1, 1],
            dil: [1, 1],
            groups: 1,
        },
        ConvCase {
            n: 2,
            c: 4,
            h: 9,
            w: 7,
            o: 6,
            kh: 3,
            kw: 2,
            stride: [2, 1],
            pad: [0, 1, 2, 0],
            dil: [1, 2],
            groups: 2,
        },
        ConvCase {
            n: 1,
            c: 6,
            h: 8,
            w: 8,
            o: 6,
            kh: 3,
            kw: 3,
            stride: [2, 2],
            pad: [1, 1, 1, 1],
            dil: [2, 2],
            groups: 6,
        },
        ConvCase {
            n: 1,
            c: 1,
            h: 1,
            w: 1,
            o: 3,
            kh: 1,
            kw: 1,
            stride: [1, 1],
            pad: [0; 4],
            dil: [1, 1],
            groups: 1,
        },
    ];
    for cs in &cases {
        let x = random(&mut rng, cs.n * cs.c * cs.h * cs.w);
        let w = random(&mut rng, cs.o * (cs.c / cs.groups) * cs.kh * cs.kw);
        let xs = [cs.n, cs.c, cs.h, cs.w];
        let ws = [cs.o, cs.c / cs.groups, cs.kh, cs.kw];
        let (want_shape, want) = naive_conv(cs, &x, &w);
        let y = run(&conv_op(cs, "NCHW", "OIHW"), &[t(&xs, &x), t(&ws, &w)]);
        assert_eq!(shape(&y), want_shape);
        close(&f32s(&y), &want, 1e-5);
        // NHWC data, OHWI kernel: output in NHWC.
        let (xs2, x2) = permute4(&xs, &x, [0, 2, 3, 1]);
        let (ws2, w2) = permute4(&ws, &w, [0, 2, 3, 1]);
        let y = run(&conv_op(cs, "NHWC", "OHWI"), &[t(&xs2, &x2), t(&ws2, &w2)]);
        let (want_shape2, want2) = permute4(&want_shape, &want, [0, 2, 3, 1]);
        assert_eq!(shape(&y), want_shape2);
        close(&f32s(&y), &want2, 1e-5);
    }
}

/// `NCHW` (`n × c × h × w`) to `NCHW{k}c`, by the definition of the layout: element
/// `(n, c, y, x)` at `(n, c / k, y, x, c % k)`.
fn to_nchwc(shape: &[usize], data: &[f32], k: usize) -> (Vec<usize>, Vec<f32>) {
    let [n, c, h, w] = [shape[0], shape[1], shape[2], shape[3]];
    let mut out = vec![0.0; data.len()];
    for ni in 0..n {
        for ci in 0..c {
            for y in 0..h {
                for x in 0..w {
                    out[(((ni * (c / k) + ci / k) * h + y) * w + x) * k + ci % k] =
                        data[((ni * c + ci) * h + y) * w + x];
                }
            }
        }
    }
    (vec![n, c / k, h, w, k], out)
}

#[test]
fn layout_transform_moves_elements_as_its_index_map_says() {
    let mut rng = Rng::new(3);
    let xs = [2, 32, 3, 5];
    let x = random(&mut rng, xs.iter().product());
    let to = op(
        "relax.layout_transform",
        &[(
            "index_map",
            s("lambda n, c, h, w: (n, c // 16, h, w, c % 16)"),
        )],
    );
    let y = run(&to, &[t(&xs, &x)]);
    let (want_shape, want) = to_nchwc(&xs, &x, 16);
    assert_eq!(shape(&y), want_shape);
    assert_eq!(f32s(&y), want);
    // And back, through the fused form.
    let back = op(
        "relax.layout_transform",
        &[(
            "index_map",
            s("lambda n, c, h, w, c1: (n, c * 16 + c1, h, w)"),
        )],
    );
    let z = run(&back, &[y]);
    assert_eq!(shape(&z), xs.to_vec());
    assert_eq!(f32s(&z), x);
    // A split moved ahead of the axes it came from: element (a, b) at (b % 4, a, b // 4).
    let m = op(
        "relax.layout_transform",
        &[("index_map", s("lambda a, b: (b % 4, a, b // 4)"))],
    );
    let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let y = run(&m, &[t(&[2, 12], &v)]);
    assert_eq!(shape(&y), vec![4, 2, 3]);
    let got = f32s(&y);
    for a in 0..2 {
        for b in 0..12 {
            assert_eq!(got[((b % 4) * 2 + a) * 3 + b / 4], v[a * 12 + b]);
        }
    }
    let e = eval_op(&to, &[t(&[1, 20, 1, 1], &[0.0; 20])]).unwrap_err();
    assert!(e.to_string().contains("multiple of 16"), "{e}");
}

#[test]
fn conv2d_and_pools_in_split_layouts_match_the_direct_convolution() {
    let mut rng = Rng::new(17);
    let case = |c, h, w, o, k: usize, stride, pad| ConvCase {
        n: 1,
        c,
        h,
        w,
        o,
        kh: k,
        kw: k,
        stride: [stride; 2],
        pad: [pad; 4],
        dil: [1, 1],
        groups: 1,
    };
    // 1×1 convolutions (the NCHW16c kernel on AVX-512), a 3×3 of stride 2 and a 1×1 with
    // padding (both through NCHW).
    let cases = [
        case(32, 7, 7, 48, 1, 1, 0),
        case(144, 5, 3, 80, 1, 1, 0),
        case(16, 9, 9, 32, 3, 2, 1),
        case(16, 4, 4, 16, 1, 1, 1),
    ];
    for cs in &cases {
        let x = random(&mut rng, cs.c * cs.h * cs.w);
        let w = random(&mut rng, cs.o * cs.c * cs.kh * cs.kw);
        let (xs, ws) = ([1, cs.c, cs.h, cs.w], [cs.o, cs.c, cs.kh, cs.kw]);
        let (want_shape, want) = naive_conv(cs, &x, &w);
        let (bshape, bx) = to_nchwc(&xs, &x, 16);
        let (want_bshape, want_b) = to_nchwc(&want_shape, &want, 16);
        let i = |v: &[usize]| ints(&v.iter().map(|&x| x as i64).collect::<Vec<_>>());
        let conv = op(
            "relax.nn.conv2d",
            &[
                ("strides", i(&cs.stride)),
                ("padding", i(&cs.pad)),
                ("data_layout", s("NCHW16c")),
                ("kernel_layout", s("OIHW")),
                ("out_layout", s("NCHW16c")),
            ],
        );
        let y = run(&conv, &[t(&bshape, &bx), t(&ws, &w)]);
        assert_eq!(shape(&y), want_bshape);
        close(&f32s(&y), &want_b, 1e-5);
        // Blocked data, NCHW result.
        let conv = op(
            "relax.nn.conv2d",
            &[
                ("strides", i(&cs.stride)),
                ("padding", i(&cs.pad)),
                ("data_layout", s("NCHW16c")),
                ("out_layout", s("NCHW")),
            ],
        );
        let y = run(&conv, &[t(&bshape, &bx), t(&ws, &w)]);
        assert_eq!(shape(&y), want_shape);
        close(&f32s(&y), &want, 1e-5);
        // A max pool of the blocked result, against the pool of the NCHW one, blocked.
        let pool = |layout: &str| {
            op(
                "relax.nn.max_pool2d",
                &[
                    ("pool_size", ints(&[2, 2])),
                    ("padding", ints(&[1, 1])),
                    ("layout", s(layout)),
                ],
            )
        };
        let p = run(&pool("NCHW16c"), &[t(&want_bshape, &want_b)]);
        let q = run(&pool("NCHW"), &[t(&want_shape, &want)]);
        let (qs, qb) = to_nchwc(&shape(&q), &f32s(&q), 16);
        assert_eq!(shape(&p), qs);
        assert_eq!(f32s(&p), qb);
    }
    // A weight in OIHW16i16o: element (o, i, y, x) at (o / 16, i / 16, y, x, i % 16, o % 16).
    let cs = case(32, 6, 6, 32, 3, 1, 1);
    let x = random(&mut rng, 32 * 36);
    let w = random(&mut rng, 32 * 32 * 9);
    let mut wb = vec![0.0; w.len()];
    for o in 0..32 {
        for ic in 0..32 {
            for k in 0..9 {
                wb[((((o / 16) * 2 + ic / 16) * 9 + k) * 16 + ic % 16) * 16 + o % 16] =
                    w[(o * 32 + ic) * 9 + k];
            }
        }
    }
    let conv = op(
        "relax.nn.conv2d",
        &[
            ("padding", ints(&[1, 1])),
            ("kernel_layout", s("OIHW16i16o")),
        ],
    );
    let y = run(
        &conv,
        &[t(&[1, 32, 6, 6], &x), t(&[2, 2, 3, 3, 16, 16], &wb)],
    );
    close(&f32s(&y), &naive_conv(&cs, &x, &w).1, 1e-5);
}

// ---- matmul ------------------------------------------------------------------------------

#[test]
fn matmul_vectors_and_batches() {
    let a = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let y = run(
        &Op::Matmul { out_dtype: None },
        &[a.clone(), t(&[3], &[1., 1., 1.])],
    );
    assert_eq!(shape(&y), vec![2]);
    assert_eq!(f32s(&y), vec![6.0, 15.0]);
    let y = run(
        &Op::Matmul { out_dtype: None },
        &[t(&[2], &[1., 1.]), a.clone()],
    );
    assert_eq!(f32s(&y), vec![5.0, 7.0, 9.0]);
    let y = run(
        &Op::Matmul { out_dtype: None },
        &[a.clone(), t(&[3, 2], &[1., 0., 0., 1., 1., 1.])],
    );
    assert_eq!(f32s(&y), vec![4.0, 5.0, 10.0, 11.0]);
    // Batch broadcast (2, 1, 2, 3) @ (3, 3, 4) -> (2, 3, 2, 4) against a naive loop.
    let mut rng = Rng::new(5);
    let x = random(&mut rng, 2 * 2 * 3);
    let w = random(&mut rng, 3 * 3 * 4);
    let y = run(
        &Op::Matmul { out_dtype: None },
        &[t(&[2, 1, 2, 3], &x), t(&[3, 3, 4], &w)],
    );
    assert_eq!(shape(&y), vec![2, 3, 2, 4]);
    let v = f32s(&y);
    for b0 in 0..2 {
        for b1 in 0..3 {
            for i in 0..2 {
                for j in 0..4 {
                    let want: f32 = (0..3)
                        .map(|k| x[(b0 * 2 + i) * 3 + k] * w[(b1 * 3 + k) * 4 + j])
                        .sum();
                    let got = v[((b0 * 3 + b1) * 2 + i) * 4 + j];
                    assert!((got - want).abs() < 1e-5, "{got} vs {want}");
                }
            }
        }
    }
    // Integers and out_dtype.
    let y = run(
        &Op::Matmul { out_dtype: None },
        &[ti(&[1, 2], &[2, 3]), ti(&[2, 1], &[4, 5])],
    );
    assert_eq!(tensor(&y).to_i64_vec(), vec![23]);
    let y = run(
        &Op::Matmul {
            out_dtype: Some(DType::F16),
        },
        &[a.clone(), t(&[3], &[1., 1., 1.])],
    );
    assert_eq!(tensor(&y).dtype(), DType::F16);
    assert!(eval_op(&Op::Matmul { out_dtype: None }, &[a.clone(), a]).is_err());
}

// ---- layout ------------------------------------------------------------------------------

#[test]
fn split_concat_round_trip() {
    let x: Vec<f32> = (0..3 * 17).map(|i| i as f32).collect();
    let xv = t(&[3, 17], &x);
    for (spec, axis, lens) in [
        (AttrLit::Int(3), 1i64, vec![6usize, 6, 5]),
        (ints(&[1, 3]), 0, vec![1, 2, 0]),
        (ints(&[4, 10]), -1, vec![4, 6, 7]),
    ] {
        let sp = op(
            "relax.split",
            &[("indices_or_sections", spec), ("axis", AttrLit::Int(axis))],
        );
        let Value::Tuple(parts) = run(&sp, &[xv.clone()]) else {
            panic!("split returns a tuple")
        };
        let ax = if axis < 0 { 1 } else { axis as usize };
        let got: Vec<usize> = parts.iter().map(|p| shape(p)[ax]).collect();
        assert_eq!(got, lens);
        let back = run(&Op::Concat { axis: Some(axis) }, &[Value::Tuple(parts)]);
        assert_eq!(shape(&back), vec![3, 17]);
        assert_eq!(f32s(&back), x);
    }
    // axis=None flattens.
    let y = run(
        &Op::Concat { axis: None },
        &[Value::Tuple(vec![
            t(&[2, 2], &[1., 2., 3., 4.]),
            t(&[1], &[5.]),
        ])],
    );
    assert_eq!(f32s(&y), vec![1., 2., 3., 4., 5.]);
    // Concat along axis 1 interleaves rows.
    let y = run(
        &Op::Concat { axis: Some(1) },
        &[Value::Tuple(vec![
            t(&[2, 1], &[1., 2.]),
            t(&[2, 2], &[3., 4., 5., 6.]),
        ])],
    );
    assert_eq!(f32s(&y), vec![1., 3., 4., 2., 5., 6.]);
}

#[test]
fn reshape_permute_and_friends() {
    let x: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let xv = t(&[3, 4], &x);
    let y = run(&Op::Reshape, &[xv.clone(), Value::Shape(vec![2, -1])]);
    assert_eq!(shape(&y), vec![2, 6]);
    assert!(eval_op(&Op::Reshape, &[xv.clone(), Value::Shape(vec![5, -1])]).is_err());
    let y = run(&Op::PermuteDims { axes: None }, &[xv.clone()]);
    assert_eq!(shape(&y), vec![4, 3]);
    assert_eq!(&f32s(&y)[..4], &[0., 4., 8., 1.]);
    let y = run(&Op::Flatten, &[xv.clone()]);
    assert_eq!(shape(&y), vec![12]);
    let y = run(&Op::ExpandDims { axis: vec![0, -1] }, &[xv.clone()]);
    assert_eq!(shape(&y), vec![1, 3, 4, 1]);
    let z = run(&Op::Squeeze { axis: None }, &[y.clone()]);
    assert_eq!(shape(&z), vec![3, 4]);
    let z = run(
        &Op::Squeeze {
            axis: Some(vec![3]),
        },
        &[y],
    );
    assert_eq!(shape(&z), vec![1, 3, 4]);
    assert!(
        eval_op(
            &Op::Squeeze {
                axis: Some(vec![0])
            },
            &[xv.clone()]
        )
        .is_err()
    );
    let y = run(
        &Op::BroadcastTo,
        &[t(&[3, 1], &[1., 2., 3.]), Value::Shape(vec![2, 3, 2])],
    );
    assert_eq!(
        f32s(&y),
        vec![1., 1., 2., 2., 3., 3., 1., 1., 2., 2., 3., 3.]
    );
    assert!(eval_op(&Op::BroadcastTo, &[xv.clone(), Value::Shape(vec![3, 5])]).is_err());
    // strided_slice: positive steps with clamping, then a negative step.
    let ss = op(
        "relax.strided_slice",
        &[
            ("axes", ints(&[0, 1])),
            ("begin", ints(&[1, -3])),
            ("end", ints(&[100, 4])),
            ("strides", ints(&[1, 2])),
        ],
    );
    let y = run(&ss, &[xv.clone()]);
    assert_eq!(shape(&y), vec![2, 2]);
    assert_eq!(f32s(&y), vec![5., 7., 9., 11.]);
    let ss = op(
        "relax.strided_slice",
        &[
            ("axes", ints(&[0])),
            ("begin", ints(&[4])),
            ("end", ints(&[-6])),
            ("strides", ints(&[-2])),
        ],
    );
    let y = run(&ss, &[t(&[5], &[0., 1., 2., 3., 4.])]);
    assert_eq!(f32s(&y), vec![4., 2., 0.]);
    // take: modes.
    let data = t(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
    let tk = |axis: Option<i64>, mode: &str| {
        let mut kw = vec![("mode", s(mode))];
        if let Some(a) = axis {
            kw.push(("axis", AttrLit::Int(a)));
        }
        op("relax.take", &kw)
    };
    let y = run(&tk(Some(0), "fast"), &[data.clone(), ti(&[2], &[2, 0])]);
    assert_eq!(shape(&y), vec![2, 2]);
    assert_eq!(f32s(&y), vec![5., 6., 1., 2.]);
    let y = run(&tk(Some(1), "clip"), &[data.clone(), ti(&[1], &[7])]);
    assert_eq!(f32s(&y), vec![2., 4., 6.]);
    let y = run(&tk(None, "wrap"), &[data.clone(), ti(&[2], &[-1, 7])]);
    assert_eq!(f32s(&y), vec![6., 2.]);
    assert!(eval_op(&tk(Some(0), "fast"), &[data, ti(&[1], &[3])]).is_err());
}

#[test]
fn ceil_mode_pool_wider_than_its_input() {
    // PyTorch/onnxruntime: one output whose window is clipped to the input (HF EfficientNet's
    // 320-wide pool on a 1×1 map); without ceil mode it is an error.
    let x = t(&[1, 2, 1, 1], &[3.0, -5.0]);
    for (name, want) in [
        ("relax.nn.avg_pool2d", [3.0, -5.0]),
        ("relax.nn.max_pool2d", [3.0, -5.0]),
    ] {
        let o = op(
            name,
            &[
                ("pool_size", ints(&[4, 4])),
                ("strides", ints(&[4, 4])),
                ("ceil_mode", AttrLit::Bool(true)),
            ],
        );
        let y = run(&o, &[x.clone()]);
        assert_eq!(tensor(&y).shape(), &[1, 2, 1, 1]);
        assert_eq!(f32s(&y), want);
        let floor = op(
            name,
            &[("pool_size", ints(&[4, 4])), ("strides", ints(&[4, 4]))],
        );
        let e = eval_op(&floor, &[x.clone()]).unwrap_err().to_string();
        assert!(e.contains("larger than the padded input"), "{e}");
    }
}
