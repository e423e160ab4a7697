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

fn run1(src: &str, args: Vec<Tensor>) -> Tensor {
    let m = parse(src);
    let args = args.into_iter().map(Value::Tensor).collect();
    out_tensor(run(&m, "main", args).unwrap_or_else(|e| panic!("{e}")))
}

fn module(params: &str, value: &str) -> String {
    format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main({params}):\n        with R.dataflow():\n            out = {value}\n            R.output(out)\n        return out\n"
    )
}

fn data(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec()
}

/// Sample values with repeats, negatives and a non-trivial order.
fn sample(i: usize) -> f32 {
    ((i * 37 + 11) % 23) as f32 - 11.0
}

#[test]
fn stack_matches_a_naive_reference() {
    let x = f32_tensor(&[2, 3], sample);
    let y = f32_tensor(&[2, 3], |i| sample(i + 100));
    let (xd, yd) = (data(&x), data(&y));
    for axis in [0i64, 1, 2, -1, -3] {
        let src = module(
            r#"x: R.Tensor((2, 3), dtype="float32"), y: R.Tensor((2, 3), dtype="float32")"#,
            &format!("R.stack((x, y), axis={axis})"),
        );
        let out = run1(&src, vec![x.clone(), y.clone()]);
        let ax = if axis < 0 { axis + 3 } else { axis } as usize;
        let mut shape = vec![2usize, 3];
        shape.insert(ax, 2);
        assert_eq!(out.shape(), shape.as_slice(), "axis {axis}");
        // out[idx] = inputs[idx[ax]][idx without ax]
        let got = data(&out);
        let mut k = 0;
        for a in 0..shape[0] {
            for b in 0..shape[1] {
                for c in 0..shape[2] {
                    let idx = [a, b, c];
                    let which = idx[ax];
                    let rest: Vec<usize> = (0..3).filter(|&d| d != ax).map(|d| idx[d]).collect();
                    let src = if which == 0 { &xd } else { &yd };
                    assert_eq!(got[k], src[rest[0] * 3 + rest[1]], "axis {axis} at {idx:?}");
                    k += 1;
                }
            }
        }
    }
}

/// A naive 1-D pool over (n, c, w): `max` or average, with TVM's attribute meanings.
#[allow(
    clippy::too_many_arguments,
    reason = "the reference takes every pool attribute"
)]
fn pool1d_ref(
    x: &[f64],
    (n, c, w): (usize, usize, usize),
    k: usize,
    s: usize,
    d: usize,
    (p0, p1): (usize, usize),
    ceil: bool,
    include_pad: bool,
    max: bool,
) -> (usize, Vec<f64>) {
    let span = (k - 1) * d + 1;
    let padded = w + p0 + p1;
    let mut ow = if ceil {
        (padded - span).div_ceil(s) + 1
    } else {
        (padded - span) / s + 1
    };
    if ceil && (ow - 1) * s >= w + p0 {
        ow -= 1;
    }
    let mut out = Vec::new();
    for plane in 0..n * c {
        for o in 0..ow {
            let mut vals = Vec::new();
            let mut in_padded = 0;
            for j in 0..k {
                let pos = (o * s + j * d) as i64 - p0 as i64;
                if pos < (w + p1) as i64 {
                    in_padded += 1;
                }
                if pos >= 0 && (pos as usize) < w {
                    vals.push(x[plane * w + pos as usize]);
                }
            }
            out.push(if max {
                vals.iter().copied().fold(f64::NEG_INFINITY, f64::max)
            } else {
                let cnt = if include_pad { in_padded } else { vals.len() };
                vals.iter().sum::<f64>() / cnt as f64
            });
        }
    }
    (ow, out)
}

fn close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
            "{what}: element {i}: {x} vs {y}"
        );
    }
}

#[test]
fn pool1d_matches_a_naive_reference() {
    let (n, c, w) = (2usize, 3usize, 11usize);
    let x = f32_tensor(&[n, c, w], sample);
    let xd = data(&x);
    let cases = [
        (2usize, 2usize, 1usize, (0usize, 0usize), false, false),
        (3, 1, 1, (1, 1), false, true),
        (3, 2, 1, (1, 0), true, false),
        (3, 2, 2, (2, 1), true, true),
        (4, 3, 1, (1, 2), false, false),
    ];
    for (k, s, d, (p0, p1), ceil, inc) in cases {
        for max in [true, false] {
            let name = if max { "max_pool1d" } else { "avg_pool1d" };
            let (ow, want) = pool1d_ref(&xd, (n, c, w), k, s, d, (p0, p1), ceil, inc, max);
            let py = |b: bool| if b { "True" } else { "False" };
            let src = module(
                &format!(r#"x: R.Tensor(({n}, {c}, {w}), dtype="float32")"#),
                &format!(
                    "R.nn.{name}(x, pool_size=[{k}], strides=[{s}], dilation=[{d}], padding=[{p0}, {p1}], ceil_mode={}, count_include_pad={})",
                    py(ceil),
                    py(inc)
                ),
            );
            let out = run1(&src, vec![x.clone()]);
            assert_eq!(out.shape(), &[n, c, ow], "{src}");
            close(&data(&out), &want, &src);
        }
    }
}

#[test]
fn pool1d_in_nwc_layout_is_the_transposed_ncw_pool() {
    let x = f32_tensor(&[1, 9, 2], sample); // (n, w, c)
    let xd = data(&x);
    let ncw: Vec<f64> = (0..2)
        .flat_map(|c| (0..9).map(move |w| (c, w)))
        .map(|(c, w)| xd[w * 2 + c])
        .collect();
    let (ow, want) = pool1d_ref(&ncw, (1, 2, 9), 3, 2, 1, (1, 1), false, false, true);
    let src = module(
        r#"x: R.Tensor((1, 9, 2), dtype="float32")"#,
        r#"R.nn.max_pool1d(x, pool_size=[3], strides=[2], padding=[1, 1], layout="NWC")"#,
    );
    let out = run1(&src, vec![x]);
    assert_eq!(out.shape(), &[1, ow, 2]);
    let od = data(&out);
    let back: Vec<f64> = (0..2)
        .flat_map(|c| (0..ow).map(move |o| (c, o)))
        .map(|(c, o)| od[o * 2 + c])
        .collect();
    close(&back, &want, "NWC max_pool1d");
}

#[test]
fn pool3d_matches_a_naive_reference() {
    let (n, c, dd, h, w) = (1usize, 2usize, 4usize, 5usize, 3usize);
    let x = f32_tensor(&[n, c, dd, h, w], sample);
    let xd = data(&x);
    // pool_size (2, 3, 2), strides (2, 1, 1), padding front/top/left 1,1,0 back/bottom/right 0,1,1.
    let (k, s, p0, p1) = (
        [2usize, 3, 2],
        [2usize, 1, 1],
        [1usize, 1, 0],
        [0usize, 1, 1],
    );
    let ext = [dd, h, w];
    let outs: Vec<usize> = (0..3)
        .map(|i| (ext[i] + p0[i] + p1[i] - k[i]) / s[i] + 1)
        .collect();
    for max in [true, false] {
        let mut want = Vec::new();
        for plane in 0..n * c {
            for a in 0..outs[0] {
                for b in 0..outs[1] {
                    for e in 0..outs[2] {
                        let (mut vals, mut padded) = (Vec::new(), 0);
                        for i in 0..k[0] {
                            for j in 0..k[1] {
                                for l in 0..k[2] {
                                    let pos = [
                                        (a * s[0] + i) as i64 - p0[0] as i64,
                                        (b * s[1] + j) as i64 - p0[1] as i64,
                                        (e * s[2] + l) as i64 - p0[2] as i64,
                                    ];
                                    if (0..3).all(|q| pos[q] < (ext[q] + p1[q]) as i64) {
                                        padded += 1;
                                    }
                                    if (0..3).all(|q| pos[q] >= 0 && (pos[q] as usize) < ext[q]) {
                                        let off = ((plane * dd + pos[0] as usize) * h
                                            + pos[1] as usize)
                                            * w
                                            + pos[2] as usize;
                                        vals.push(xd[off]);
                                    }
                                }
                            }
                        }
                        want.push(if max {
                            vals.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                        } else {
                            vals.iter().sum::<f64>() / padded as f64
                        });
                    }
                }
            }
        }
        let name = if max { "max_pool3d" } else { "avg_pool3d" };
        let src = module(
            &format!(r#"x: R.Tensor(({n}, {c}, {dd}, {h}, {w}), dtype="float32")"#),
            &format!(
                "R.nn.{name}(x, pool_size=[2, 3, 2], strides=[2, 1, 1], padding=[1, 1, 0, 0, 1, 1], count_include_pad=True)"
            ),
        );
        let out = run1(&src, vec![x.clone()]);
        assert_eq!(out.shape(), &[n, c, outs[0], outs[1], outs[2]], "{name}");
        close(&data(&out), &want, name);
    }
}

#[test]
fn adaptive_pools_match_a_naive_reference() {
    // 1-D: (1, 2, 7) to 3 cells: [0, 3), [2, 5), [4, 7).
    let x = f32_tensor(&[1, 2, 7], sample);
    let xd = data(&x);
    let cells = [(0usize, 3usize), (2, 5), (4, 7)];
    let want: Vec<f64> = (0..2)
        .flat_map(|p| cells.iter().map(move |&(a, b)| (p, a, b)))
        .map(|(p, a, b)| xd[p * 7 + a..p * 7 + b].iter().sum::<f64>() / (b - a) as f64)
        .collect();
    let src = module(
        r#"x: R.Tensor((1, 2, 7), dtype="float32")"#,
        "R.nn.adaptive_avg_pool1d(x, output_size=[3])",
    );
    let out = run1(&src, vec![x]);
    assert_eq!(out.shape(), &[1, 2, 3]);
    close(&data(&out), &want, "adaptive_avg_pool1d");
    // 3-D to (1, 1, 1) is the mean of each plane.
    let v = f32_tensor(&[2, 3, 2, 3, 4], sample);
    let vd = data(&v);
    let want: Vec<f64> = vd
        .chunks(24)
        .map(|p| p.iter().sum::<f64>() / 24.0)
        .collect();
    let src = module(
        r#"v: R.Tensor((2, 3, 2, 3, 4), dtype="float32")"#,
        "R.nn.adaptive_avg_pool3d(v, output_size=[1])",
    );
    let out = run1(&src, vec![v]);
    assert_eq!(out.shape(), &[2, 3, 1, 1, 1]);
    close(&data(&out), &want, "adaptive_avg_pool3d");
}

const VALUELESS: &str = r#"@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), dtype="float32")) -> R.Tensor((1, 4, 8, 8), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((1, 4, 8, 8), dtype="float32") = R.nn.conv2d(x, metadata["ir.GenericConst"][0], padding=[1, 1])
            lv1: R.Tensor((1, 4, 8, 8), dtype="float32") = R.add(lv, metadata["ir.GenericConst"][1])
            gv: R.Tensor((1, 4, 8, 8), dtype="float32") = R.nn.relu(lv1)
            R.output(gv)
        return gv
"#;

#[test]
fn running_fails_naming_every_constant_without_a_value() {
    let m = parse(VALUELESS);
    let x = f32_tensor(&[1, 3, 8, 8], sample);
    let e = run(&m, "main", vec![Value::Tensor(x)]).expect_err("constants lack values");
    let msg = e.to_string();
    assert!(
        msg.contains(r#"2 constants have no value: metadata["ir.GenericConst"][0], metadata["ir.GenericConst"][1]"#),
        "{msg}"
    );
}

#[test]
fn valueless_constants_compare_by_identity() {
    use fusebox_core::ir::structural::module_eq;
    let a = parse(VALUELESS);
    assert!(module_eq(&a, &parse(VALUELESS)), "the same constants");
    let swapped = VALUELESS.replace(r#"["ir.GenericConst"][1]"#, r#"["ir.GenericConst"][2]"#);
    assert!(
        !module_eq(&a, &parse(&swapped)),
        "another constant is not equal"
    );
    let other_ns = VALUELESS.replace(
        r#"metadata["ir.GenericConst"][0]"#,
        r#"metadata["relax.expr.Constant"][0]"#,
    );
    assert!(
        !module_eq(&a, &parse(&other_ns)),
        "another namespace is not equal"
    );
    // The report says what deduplication could not compare.
    let r = fusebox_core::report::build(&a, &[]);
    assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
    assert!(r.notes[0].contains("could not compare"), "{}", r.notes[0]);
    assert!(
        fusebox_core::report::build(
            &parse(&module(
                r#"x: R.Tensor((2,), dtype="float32")"#,
                "R.nn.relu(x)"
            )),
            &[]
        )
        .notes
        .is_empty()
    );
}

#[test]
fn written_module_with_valued_and_valueless_constants_reads_back_equal() {
    use fusebox_core::ir::structural::module_eq;
    use fusebox_core::ir::{Constant, DType};
    // metadata["relax.expr.Constant"][0] has no value; [1] comes from the table.
    let src = r#"@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
        with R.dataflow():
            a: R.Tensor((4,), dtype="float32") = R.add(x, metadata["relax.expr.Constant"][0])
            b: R.Tensor((4,), dtype="float32") = R.multiply(a, metadata["relax.expr.Constant"][1])
            R.output(b)
        return b
"#;
    let mut table = ConstTable::new();
    let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    table.insert(
        "relax.expr.Constant",
        1,
        Constant::from_bytes(DType::F32, vec![4], bytes).unwrap(),
    );
    let m = text::parse_module(src, "<input>", &table).unwrap();
    assert_eq!(m.valueless_constants().len(), 1);
    // The valued constant prints past the valueless one's index.
    let printed = text::print_module(&m);
    assert_eq!(printed.first_index, 1);
    assert!(
        printed
            .text
            .contains(r#"R.add(x, metadata["relax.expr.Constant"][0])"#)
    );
    assert!(
        printed
            .text
            .contains(r#"R.multiply(a, metadata["relax.expr.Constant"][1])"#)
    );
    let dir = std::env::temp_dir().join(format!("fusebox-tvmcompat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.relax");
    text::write_module(&path, &m).unwrap();
    let back = text::read_module(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        module_eq(&m, &back),
        "read back:\n{}",
        text::print_module(&back).text
    );
}

#[test]
fn a_valueless_constant_namespace_with_escapes_prints_back() {
    // Found by the parse_text fuzz target: the namespace is printed as a quoted string.
    let src = r#"@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
        y: R.Tensor((4,), dtype="float32") = R.add(x, metadata["a\\b\n\"c"][3])
        return y
"#;
    let m = parse(src);
    let printed = text::print_module(&m).text;
    assert!(printed.contains(r#"metadata["a\\b\n\"c"][3]"#), "{printed}");
    let again = text::print_module(&parse(&printed)).text;
    assert_eq!(again, printed);
    assert!(fusebox_core::ir::structural::module_eq(
        &m,
        &parse(&printed)
    ));
}
