//! The index ops (gathers, scatters, one-hot, arange, tile, triangles, cumulative sums,
//! pads, take) and `shape_to_tensor` against naive definitions, over every dtype they accept.

use super::*;

fn typed(shape: &[usize], dtype: DType, data: &[f64]) -> Value {
    Value::Tensor(Tensor::new(shape.to_vec(), Storage::from_f64(dtype, data.to_vec())).unwrap())
}

fn f64s(v: &Value) -> Vec<f64> {
    tensor(v).to_f64_vec()
}

fn err_of(o: &Op, args: &[Value]) -> String {
    match eval_op(o, args) {
        Ok(v) => panic!("{} should fail, gave {v:?}", o.name()),
        Err(e) => e.to_string(),
    }
}

const ALL_DTYPES: [DType; 9] = [
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::I8,
    DType::U8,
    DType::I32,
    DType::I64,
    DType::Bool,
];

/// Small non-negative values every dtype holds exactly (0/1 for bool).
fn sample(dtype: DType, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| {
            if dtype == DType::Bool {
                (i % 2) as f64
            } else {
                (i % 7) as f64
            }
        })
        .collect()
}

#[test]
fn gather_elements_and_gather_nd() {
    // ONNX's documented examples, plus negative indices.
    let ge = op("relax.gather_elements", &[("axis", AttrLit::Int(1))]);
    let x = t(&[2, 2], &[1., 2., 3., 4.]);
    let y = run(&ge, &[x.clone(), ti(&[2, 2], &[0, 0, 1, 0])]);
    assert_eq!(f32s(&y), vec![1., 1., 4., 3.]);
    let y = run(&ge, &[x.clone(), ti(&[2, 2], &[-1, -2, -2, 0])]);
    assert_eq!(f32s(&y), vec![2., 1., 3., 3.]);
    let ge0 = op("relax.gather_elements", &[]);
    let x3 = t(&[3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
    let y = run(&ge0, &[x3.clone(), ti(&[2, 3], &[1, 2, 0, 2, 0, 0])]);
    assert_eq!(shape(&y), vec![2, 3]);
    assert_eq!(f32s(&y), vec![4., 8., 3., 7., 2., 3.]);
    let e = err_of(&ge0, &[x3.clone(), ti(&[1, 1], &[3])]);
    assert!(e.contains("index 3 is out of range"), "{e}");
    let e = err_of(&ge0, &[x3.clone(), ti(&[1, 4], &[0, 0, 0, 0])]);
    assert!(e.contains("larger than the data"), "{e}");
    let e = err_of(&ge0, &[x3.clone(), t(&[1, 1], &[0.])]);
    assert!(e.contains("integer dtype"), "{e}");

    let gn = op("relax.gather_nd", &[]);
    let d = ti(&[2, 2], &[0, 1, 2, 3]);
    let y = run(&gn, &[d.clone(), ti(&[2, 2], &[0, 0, 1, 1])]);
    assert_eq!(tensor(&y).to_i64_vec(), vec![0, 3]);
    let y = run(&gn, &[d.clone(), ti(&[2, 1], &[1, -2])]);
    assert_eq!(shape(&y), vec![2, 2]);
    assert_eq!(tensor(&y).to_i64_vec(), vec![2, 3, 0, 1]);
    let d3 = ti(&[2, 2, 2], &[0, 1, 2, 3, 4, 5, 6, 7]);
    let gn1 = op("relax.gather_nd", &[("batch_dims", AttrLit::Int(1))]);
    let y = run(&gn1, &[d3.clone(), ti(&[2, 1], &[1, 0])]);
    assert_eq!(tensor(&y).to_i64_vec(), vec![2, 3, 4, 5]);
    let e = err_of(&gn, &[d.clone(), ti(&[1, 3], &[0, 0, 0])]);
    assert!(e.contains("last dim of indices"), "{e}");
    let e = err_of(&gn, &[d, ti(&[1, 2], &[0, 2])]);
    assert!(e.contains("out of range"), "{e}");
    // Every dtype moves bit for bit.
    for dt in ALL_DTYPES {
        let v = sample(dt, 6);
        let y = run(&ge, &[typed(&[2, 3], dt, &v), ti(&[2, 1], &[2, -3])]);
        assert_eq!(tensor(&y).dtype(), dt);
        assert_eq!(f64s(&y), vec![v[2], v[3]], "{dt}");
        let y = run(&gn, &[typed(&[2, 3], dt, &v), ti(&[1, 2], &[1, 1])]);
        assert_eq!(f64s(&y), vec![v[4]], "{dt}");
    }
}

/// Naive scatter_elements along axis 1 of a 2-D tensor, written from the ONNX definition.
fn naive_scatter2(
    data: &[f64],
    cols: usize,
    idx: &[i64],
    upd: &[f64],
    icols: usize,
    f: impl Fn(f64, f64) -> f64,
) -> Vec<f64> {
    let mut out = data.to_vec();
    for r in 0..idx.len() / icols {
        for c in 0..icols {
            let j = idx[r * icols + c];
            let j = if j < 0 { j + cols as i64 } else { j } as usize;
            let p = r * cols + j;
            out[p] = f(out[p], upd[r * icols + c]);
        }
    }
    out
}

#[test]
fn scatters() {
    let data: Vec<f64> = vec![1., 2., 3., 4., 5., 6., 7., 8.];
    let idx = vec![1i64, -1, 1, 0, 3, 3];
    let upd: Vec<f64> = vec![10., 20., 30., 40., 50., 60.];
    for (red, f) in [
        ("update", (|_, b| b) as fn(f64, f64) -> f64),
        ("add", |a, b| a + b),
        ("mul", |a, b| a * b),
        ("max", f64::max),
        ("min", f64::min),
        ("mean", |a, b| (a + b) / 2.0),
    ] {
        let o = op(
            "relax.scatter_elements",
            &[("axis", AttrLit::Int(1)), ("reduction", s(red))],
        );
        for dt in [DType::F32, DType::F64, DType::I32, DType::I64, DType::F16] {
            let y = run(
                &o,
                &[
                    typed(&[2, 4], dt, &data),
                    ti(&[2, 3], &idx),
                    typed(&[2, 3], dt, &upd),
                ],
            );
            assert_eq!(tensor(&y).dtype(), dt);
            let want = naive_scatter2(&data, 4, &idx, &upd, 3, f);
            let want: Vec<f64> = tensor(&typed(&[8], dt, &want)).to_f64_vec();
            assert_eq!(f64s(&y), want, "{red} {dt}");
        }
    }
    // Every dtype, replacing (the last of duplicate indices wins).
    let upd_small: Vec<f64> = vec![1., 0., 1., 1., 0., 1.];
    for dt in ALL_DTYPES {
        let o = op("relax.scatter_elements", &[("axis", AttrLit::Int(1))]);
        let d = sample(dt, 8);
        let y = run(
            &o,
            &[
                typed(&[2, 4], dt, &d),
                ti(&[2, 3], &idx),
                typed(&[2, 3], dt, &upd_small),
            ],
        );
        let want = naive_scatter2(&d, 4, &idx, &upd_small, 3, |_, b| b);
        assert_eq!(f64s(&y), want, "{dt}");
    }
    // Extreme pad widths are errors or crops, never overflows.
    let o = op(
        "relax.nn.pad",
        &[
            ("pad_width", ints(&[i64::MIN, i64::MAX])),
            ("pad_mode", s("reflect")),
        ],
    );
    let y = run(&o, &[t(&[3], &[1., 2., 3.])]);
    assert_eq!(shape(&y), vec![2]);
    // ONNX ScatterND examples.
    let sn = op("relax.scatter_nd", &[]);
    let y = run(
        &sn,
        &[
            t(&[8], &[1., 2., 3., 4., 5., 6., 7., 8.]),
            ti(&[4, 1], &[4, 3, 1, 7]),
            t(&[4], &[9., 10., 11., 12.]),
        ],
    );
    assert_eq!(f32s(&y), vec![1., 11., 3., 10., 9., 6., 7., 12.]);
    let sna = op("relax.scatter_nd", &[("reduction", s("add"))]);
    let y = run(
        &sna,
        &[
            t(&[2, 2], &[1., 2., 3., 4.]),
            ti(&[2, 1], &[0, 0]),
            t(&[2, 2], &[10., 20., 30., 40.]),
        ],
    );
    assert_eq!(f32s(&y), vec![41., 62., 3., 4.]);
    let snm = op("relax.scatter_nd", &[("reduction", s("mul"))]);
    let y = run(
        &snm,
        &[
            ti(&[2, 2], &[1, 2, 3, 4]),
            ti(&[1, 2], &[-1, -1]),
            ti(&[1], &[5]),
        ],
    );
    assert_eq!(tensor(&y).to_i64_vec(), vec![1, 2, 3, 20]);
    let e = err_of(&sn, &[t(&[4], &[0.; 4]), ti(&[1, 1], &[4]), t(&[1], &[1.])]);
    assert!(e.contains("out of range"), "{e}");
    let e = err_of(
        &sn,
        &[t(&[4], &[0.; 4]), ti(&[1, 1], &[0]), t(&[2], &[1., 2.])],
    );
    assert!(e.contains("expected updates of shape [1]"), "{e}");
    let se = op("relax.scatter_elements", &[]);
    let e = err_of(&se, &[t(&[2], &[0.; 2]), ti(&[1], &[0]), ti(&[1], &[1])]);
    assert!(e.contains("dtype"), "{e}");
}

#[test]
fn one_hot_arange_tile() {
    let oh = op("relax.one_hot", &[("depth", AttrLit::Int(3))]);
    let y = run(
        &oh,
        &[
            ti(&[4], &[0, 2, -1, 5]),
            Value::Prim(Prim::Int(7)),
            Value::Prim(Prim::Int(1)),
        ],
    );
    assert_eq!(shape(&y), vec![4, 3]);
    assert_eq!(tensor(&y).dtype(), DType::I64);
    assert_eq!(
        tensor(&y).to_i64_vec(),
        vec![7, 1, 1, 1, 1, 7, 1, 1, 7, 1, 1, 1]
    );
    // axis 0 with rank-0 tensor fills of another dtype.
    let oh0 = op(
        "relax.one_hot",
        &[("depth", AttrLit::Int(2)), ("axis", AttrLit::Int(0))],
    );
    let on = typed(&[], DType::F16, &[2.5]);
    let off = typed(&[], DType::F16, &[-1.0]);
    let y = run(&oh0, &[ti(&[3], &[1, 0, 1]), on, off]);
    assert_eq!(shape(&y), vec![2, 3]);
    assert_eq!(tensor(&y).dtype(), DType::F16);
    assert_eq!(f64s(&y), vec![-1., 2.5, -1., 2.5, -1., 2.5]);

    let ar = |kw: &[(&str, AttrLit)]| run(&op("relax.arange", kw), &[]);
    let y = ar(&[
        ("start", AttrLit::Int(10)),
        ("end", AttrLit::Int(3)),
        ("step", AttrLit::Int(-3)),
    ]);
    assert_eq!(tensor(&y).to_i64_vec(), vec![10, 7, 4]);
    let y = ar(&[
        ("start", AttrLit::Float(1.0)),
        ("end", AttrLit::Float(2.0)),
        ("step", AttrLit::Float(0.25)),
        ("dtype", s("float64")),
    ]);
    assert_eq!(f64s(&y), vec![1.0, 1.25, 1.5, 1.75]);
    let y = ar(&[("start", AttrLit::Int(0)), ("end", AttrLit::Int(-4))]);
    assert_eq!(shape(&y), vec![0]);

    let tl = op("relax.tile", &[("repeats", ints(&[2, 3]))]);
    let x = t(&[2], &[1., 2.]);
    let y = run(&tl, &[x]);
    assert_eq!(shape(&y), vec![2, 6]);
    assert_eq!(
        f32s(&y),
        vec![1., 2., 1., 2., 1., 2., 1., 2., 1., 2., 1., 2.]
    );
    // Naive tile of a (2, 3) int tensor by (3, 2).
    let v: Vec<i64> = (0..6).collect();
    let y = run(
        &op("relax.tile", &[("repeats", ints(&[3, 2]))]),
        &[ti(&[2, 3], &v)],
    );
    let mut want = Vec::new();
    for r in 0..6 {
        for c in 0..6 {
            want.push(v[(r % 2) * 3 + c % 3]);
        }
    }
    assert_eq!(tensor(&y).to_i64_vec(), want);
    let big = op("relax.tile", &[("repeats", ints(&[1 << 40]))]);
    let e = err_of(&big, &[t(&[4], &[0.; 4])]);
    assert!(e.contains("at most"), "{e}");
}

#[test]
fn tril_triu_every_dtype() {
    for k in [-2i64, -1, 0, 1, 3] {
        for dt in ALL_DTYPES {
            let v: Vec<f64> = sample(dt, 24)
                .iter()
                .map(|x| x + f64::from(dt != DType::Bool))
                .collect();
            let x = typed(&[2, 3, 4], dt, &v);
            let lo = run(&op("relax.tril", &[("k", AttrLit::Int(k))]), &[x.clone()]);
            let up = run(&op("relax.triu", &[("k", AttrLit::Int(k))]), &[x]);
            let (l, u) = (f64s(&lo), f64s(&up));
            for b in 0..2 {
                for r in 0..3i64 {
                    for c in 0..4i64 {
                        let p = b * 12 + (r * 4 + c) as usize;
                        let want_l = if c - r <= k { v[p] } else { 0.0 };
                        let want_u = if c - r >= k { v[p] } else { 0.0 };
                        assert_eq!(l[p], want_l, "tril k={k} {dt} at {p}");
                        assert_eq!(u[p], want_u, "triu k={k} {dt} at {p}");
                    }
                }
            }
        }
    }
    let e = err_of(&op("relax.tril", &[]), &[t(&[3], &[1., 2., 3.])]);
    assert!(e.contains("rank at least 2"), "{e}");
}

#[test]
fn cumsum_cumprod() {
    let x = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let cs = |kw: &[(&str, AttrLit)]| op("relax.cumsum", kw);
    let y = run(&cs(&[("axis", AttrLit::Int(1))]), &[x.clone()]);
    assert_eq!(f32s(&y), vec![1., 3., 6., 4., 9., 15.]);
    let y = run(&cs(&[("axis", AttrLit::Int(0))]), &[x.clone()]);
    assert_eq!(f32s(&y), vec![1., 2., 3., 5., 7., 9.]);
    let y = run(
        &cs(&[
            ("axis", AttrLit::Int(-1)),
            ("exclusive", AttrLit::Bool(true)),
        ]),
        &[x.clone()],
    );
    assert_eq!(f32s(&y), vec![0., 1., 3., 0., 4., 9.]);
    let y = run(&cs(&[]), &[x.clone()]);
    assert_eq!(shape(&y), vec![6]);
    assert_eq!(f32s(&y), vec![1., 3., 6., 10., 15., 21.]);
    let y = run(
        &cs(&[("axis", AttrLit::Int(1)), ("dtype", s("int64"))]),
        &[x.clone()],
    );
    assert_eq!(tensor(&y).dtype(), DType::I64);
    assert_eq!(tensor(&y).to_i64_vec(), vec![1, 3, 6, 4, 9, 15]);
    let cp = op("relax.cumprod", &[("axis", AttrLit::Int(1))]);
    let y = run(&cp, &[x.clone()]);
    assert_eq!(f32s(&y), vec![1., 2., 6., 4., 20., 120.]);
    let cpe = op(
        "relax.cumprod",
        &[
            ("axis", AttrLit::Int(0)),
            ("exclusive", AttrLit::Bool(true)),
        ],
    );
    let y = run(&cpe, &[ti(&[2, 3], &[1, 2, 3, 4, 5, 6])]);
    assert_eq!(tensor(&y).to_i64_vec(), vec![1, 1, 1, 1, 2, 3]);
    // Integer dtypes keep their type.
    for dt in [
        DType::I8,
        DType::U8,
        DType::I32,
        DType::F16,
        DType::BF16,
        DType::F64,
    ] {
        let y = run(
            &cs(&[("axis", AttrLit::Int(0))]),
            &[typed(&[3], dt, &[1., 2., 3.])],
        );
        assert_eq!(tensor(&y).dtype(), dt);
        assert_eq!(f64s(&y), vec![1., 3., 6.], "{dt}");
    }
    let e = err_of(&cs(&[("axis", AttrLit::Int(2))]), &[x]);
    assert!(e.contains("out of range"), "{e}");
}

/// Naive 1-D pad from numpy's definitions of the modes.
fn naive_pad(v: &[f64], b: i64, a: i64, mode: &str, fill: f64) -> Vec<f64> {
    let n = v.len() as i64;
    (0..n + b + a)
        .map(|o| {
            let i = o - b;
            if (0..n).contains(&i) {
                return v[i as usize];
            }
            let j = match mode {
                "constant" => return fill,
                "replicate" => i.clamp(0, n - 1),
                "circular" => ((i % n) + n) % n,
                _ => {
                    // Reflect by walking back and forth.
                    let mut j = i;
                    while !(0..n).contains(&j) {
                        j = if j < 0 { -j } else { 2 * (n - 1) - j };
                    }
                    j
                }
            };
            v[j as usize]
        })
        .collect()
}

#[test]
fn pad_modes() {
    let v = [1., 2., 3., 4.];
    for mode in ["constant", "reflect", "replicate", "circular"] {
        for (b, a) in [(0, 0), (2, 1), (3, 6), (-1, 2), (1, -2)] {
            let o = op(
                "relax.nn.pad",
                &[
                    ("pad_width", ints(&[b, a])),
                    ("pad_mode", s(mode)),
                    ("pad_value", AttrLit::Float(-7.0)),
                ],
            );
            let y = run(&o, &[t(&[4], &[1., 2., 3., 4.])]);
            let want = naive_pad(&v, b, a, mode, -7.0);
            assert_eq!(f64s(&y), want, "{mode} ({b}, {a})");
        }
    }
    // 2-D: rows padded with edge, columns with a constant; an int tensor.
    let o = op("relax.nn.pad", &[("pad_width", ints(&[1, 0, 0, 1]))]);
    let y = run(&o, &[ti(&[2, 2], &[1, 2, 3, 4])]);
    assert_eq!(shape(&y), vec![3, 3]);
    assert_eq!(tensor(&y).to_i64_vec(), vec![0, 0, 0, 1, 2, 0, 3, 4, 0]);
    for dt in ALL_DTYPES {
        let o = op(
            "relax.nn.pad",
            &[("pad_width", ints(&[1, 1])), ("pad_mode", s("reflect"))],
        );
        let v = sample(dt, 3);
        let y = run(&o, &[typed(&[3], dt, &v)]);
        assert_eq!(f64s(&y), vec![v[1], v[0], v[1], v[2], v[1]], "{dt}");
    }
    let e = err_of(
        &op("relax.nn.pad", &[("pad_width", ints(&[1, 1]))]),
        &[t(&[2, 2], &[0.; 4])],
    );
    assert!(e.contains("expected pad_width to have 4 values"), "{e}");
    let e = err_of(
        &op("relax.nn.pad", &[("pad_width", ints(&[-3, 0]))]),
        &[t(&[2], &[0.; 2])],
    );
    assert!(e.contains("invalid extent"), "{e}");
    let e = err_of(
        &op(
            "relax.nn.pad",
            &[("pad_width", ints(&[1, 0])), ("pad_mode", s("reflect"))],
        ),
        &[t(&[0], &[])],
    );
    assert!(e.contains("empty axis"), "{e}");
}

#[test]
fn take_fast_counts_negative_indices_from_the_end() {
    let tk = op("relax.take", &[("axis", AttrLit::Int(0))]);
    let data = t(&[3], &[1., 2., 3.]);
    let y = run(&tk, &[data.clone(), ti(&[3], &[-1, -3, 0])]);
    assert_eq!(f32s(&y), vec![3., 1., 1.]);
    let e = err_of(&tk, &[data, ti(&[1], &[-4])]);
    assert!(e.contains("index -4 is out of range"), "{e}");
}

#[test]
fn shape_to_tensor_reads_the_shape_value() {
    let o = op("relax.shape_to_tensor", &[]);
    let y = run(&o, &[Value::Shape(vec![2, 3, 5])]);
    assert_eq!(tensor(&y).shape(), &[3]);
    assert_eq!(tensor(&y).dtype(), DType::I64);
    assert_eq!(tensor(&y).to_f64_vec(), vec![2.0, 3.0, 5.0]);
    let y = run(&o, &[Value::Shape(vec![])]);
    assert_eq!(tensor(&y).shape(), &[0]);
    let e = eval_op(&o, &[ti(&[1], &[4])]).unwrap_err().to_string();
    assert!(e.contains("to be a shape"), "{e}");
}
