//! Elementwise programs against the reference: the same Relax function run through the
//! executor with `Primitive` set (one program) and cleared (the op-by-op kernels), bit for
//! bit (NaN for NaN), for every thread count; conv2d + SiLU / hardswish epilogues likewise;
//! views (layout ops and gathers read in place, `elem_view.rs`), DeBERTa's terms against their
//! definition and random chains against the ops one by one; and the fallback of other dtypes,
//! of views strides cannot express and of out-of-range indices.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    reason = "test code: a failure is a panic"
)]

use super::*;
use crate::par::with_threads;
use fusebox_core::runtime::Value;
use proptest::prelude::*;

/// Unary ops by their text form (`{}`: the operand).
const UNARY: &[&str] = &[
    "R.negative({})",
    "R.abs({})",
    "R.nn.relu({})",
    "R.exp({})",
    "R.log({})",
    "R.sqrt({})",
    "R.rsqrt({})",
    "R.tanh({})",
    "R.sigmoid({})",
    "R.erf({})",
    "R.nn.gelu({})",
    "R.nn.gelu_tanh({})",
    "R.nn.silu({})",
    "R.clip({}, R.prim_value(T.float32(-0.5)), R.prim_value(T.float32(1.5)))",
    "R.clip({}, R.prim_value(0), R.prim_value(6))",
    "R.astype({}, dtype=\"float32\")",
    "R.floor({})",
    "R.ceil({})",
    "R.round({})",
    "R.sign({})",
    "R.sin({})",
    "R.cos({})",
    "R.tan({})",
    "R.asin({})",
    "R.acos({})",
    "R.atan({})",
    "R.sinh({})",
    "R.cosh({})",
    "R.asinh({})",
    "R.acosh({})",
    "R.atanh({})",
];

/// Binary ops by their text name.
const BINARY: &[&str] = &[
    "R.add",
    "R.subtract",
    "R.multiply",
    "R.divide",
    "R.power",
    "R.maximum",
    "R.minimum",
    "R.mod",
    "R.floor_mod",
];

/// A deterministic generator of test values, a quarter of them special.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn value(&mut self) -> f32 {
        const SPECIAL: [f32; 14] = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            3.0e38,
            -3.0e38,
            1.0e-40,
            -1.0e-40,
            1.0,
            -1.0,
            0.5,
            2.0,
            -6.0,
        ];
        let r = self.next();
        if r.is_multiple_of(4) {
            let s = SPECIAL[(r >> 8) as usize % SPECIAL.len()];
            // NaNs with distinct payloads and signs: operand order shows in the result.
            if s.is_nan() {
                return f32::from_bits(0x7fc0_0000 | ((r >> 20) as u32 & 0x803f_ffff));
            }
            return s;
        }
        ((r >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
    }
    fn tensor(&mut self, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_f32(shape.to_vec(), (0..n).map(|_| self.value()).collect()).unwrap()
    }
}

fn ty(shape: &[usize], dtype: &str) -> String {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    let comma = if shape.len() == 1 { "," } else { "" };
    format!("R.Tensor(({}{comma}), dtype=\"{dtype}\")", dims.join(", "))
}

/// A module whose `main` calls `fused`, a `Primitive` function of `params` (shapes) with
/// `body` (lines `name = expr`, the last one returned) of result shape `out`.
fn module_src(params: &[Vec<usize>], dtype: &str, body: &[String], out: &[usize]) -> String {
    let ps: Vec<String> = params
        .iter()
        .enumerate()
        .map(|(i, s)| format!("p{i}: {}", ty(s, dtype)))
        .collect();
    let names: Vec<String> = (0..params.len()).map(|i| format!("p{i}")).collect();
    let ret = ty(out, dtype);
    let mut s = format!(
        "@I.ir_module\nclass Module:\n    @R.function(private=True)\n    def fused({}) -> {ret}:\n        R.func_attr({{\"Primitive\": True}})\n        with R.dataflow():\n",
        ps.join(", ")
    );
    for line in body {
        s.push_str(&format!("            {line}\n"));
    }
    let last = body
        .last()
        .and_then(|l| l.split(" = ").next())
        .unwrap_or("p0");
    s.push_str(&format!(
        "            R.output({last})\n        return {last}\n\n    @R.function\n    def main({}) -> {ret}:\n        with R.dataflow():\n            gv = Module.fused({})\n            R.output(gv)\n        return gv\n",
        ps.join(", "),
        names.join(", ")
    ));
    s
}

/// `src` with `Primitive` cleared: the executor interprets `fused` op by op.
fn plain(src: &str) -> String {
    src.replace("\"Primitive\": True", "\"Primitive\": False")
}

/// Whether two results agree: the same bits, or both NaN (a NaN's sign and payload are
/// not specified by Rust: LLVM may commute `a * b` when both are NaN, and the reference
/// kernels' own paths differ there, see the module doc of `elem_program.rs`).
fn same(a: u32, b: u32) -> bool {
    a == b || (f32::from_bits(a).is_nan() && f32::from_bits(b).is_nan())
}

fn bits(v: &Value) -> Vec<u32> {
    match v {
        Value::Tensor(t) => t.to_f32_vec().iter().map(|x| x.to_bits()).collect(),
        v => panic!("not a tensor: {}", v.kind()),
    }
}

/// The profile entries of a run of `src`.
fn profile(src: &str, args: Vec<Value>) -> Vec<String> {
    let m = fusebox_core::text::parse_module_str(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let (_, p) = crate::run_profiled(&m, "main", args).unwrap();
    p.into_iter().map(|p| p.name).collect()
}

/// Runs `src` as written on 1, 2 and 3 threads and with `Primitive` cleared; asserts every
/// result has the reference's bits and that the fused runs took the program (`kernel` in
/// the profile, and none of the op-by-op kernels).
fn check(src: &str, args: &[Value], kernel: &str) {
    let parse =
        |s: &str| fusebox_core::text::parse_module_str(s).unwrap_or_else(|e| panic!("{e}\n{s}"));
    let (fused, reference) = (parse(src), parse(&plain(src)));
    let want = bits(&crate::run(&reference, "main", args.to_vec()).unwrap());
    for t in [1, 2, 3] {
        let got = bits(&with_threads(t, || crate::run(&fused, "main", args.to_vec())).unwrap());
        assert_eq!(got.len(), want.len(), "{t} thread(s)\n{src}");
        if let Some(i) = (0..got.len()).find(|&i| !same(got[i], want[i])) {
            let inputs: Vec<String> = args
                .iter()
                .map(|a| match a {
                    Value::Tensor(t) => {
                        let v = t.to_f32_vec();
                        format!("{:?}", v.get(i % v.len().max(1)))
                    }
                    _ => String::new(),
                })
                .collect();
            panic!(
                "{t} thread(s): element {i}: {:?} ({:#x}), want {:?} ({:#x}); inputs there (if not broadcast) {inputs:?}\n{src}",
                f32::from_bits(got[i]),
                got[i],
                f32::from_bits(want[i]),
                want[i]
            );
        }
    }
    let names = profile(src, args.to_vec());
    assert!(
        names.iter().any(|n| n == kernel),
        "no `{kernel}` in {names:?}\n{src}"
    );
    assert!(
        names.iter().all(|n| n == kernel || n == "fused"),
        "op-by-op kernels ran: {names:?}\n{src}"
    );
}

/// Values past the exponential's clamps both ways, infinities, NaN and signed zeros, which a
/// test writes over the start of an input.
const EDGES: [f32; 8] = [
    -100.0,
    100.0,
    -88.5,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    -0.0,
    0.0,
];

/// The program's leaves in its order (first use), all parameters: `args[i]` for parameter `i`.
fn param_leaves(prog: &Program, args: &[Tensor]) -> Vec<Tensor> {
    prog.leaves
        .iter()
        .map(|l| match l {
            Leaf::Param(i) => args[*i].clone(),
            Leaf::Const(_) => panic!("no constants here"),
        })
        .collect()
}

/// The profile name of a text op (`R.nn.relu(..)` → `relax.nn.relu`).
fn op_name(text: &str) -> String {
    let head = text.split('(').next().unwrap_or(text);
    format!("relax.{}", head.trim_start_matches("R."))
}

#[test]
fn every_op_gives_its_kernels_bits() {
    let mut r = Rng(7);
    // Large enough (36,000 elements) for the reference kernels' chunked paths (`erf32_row`,
    // GELU's row kernel, the threaded same-shape binary ops).
    let shape = [3, 12000];
    for u in UNARY {
        // op, then `negative` (exact: it flips the sign bit) so the group has two bindings.
        let body = vec![
            format!("a = {}", u.replace("{}", "p0")),
            "b = R.negative(a)".to_string(),
        ];
        let src = module_src(&[shape.to_vec()], "float32", &body, &shape);
        let args = [Value::Tensor(r.tensor(&shape))];
        check(&src, &args, &format!("{}+relax.negative", op_name(u)));
    }
    for b in BINARY {
        // Both operand orders, a broadcast operand, and the op's result fed back.
        let body = vec![format!("a = {b}(p0, p1)"), format!("c = {b}(p1, a)")];
        let src = module_src(&[shape.to_vec(), vec![12000]], "float32", &body, &shape);
        let args = [
            Value::Tensor(r.tensor(&shape)),
            Value::Tensor(r.tensor(&[12000])),
        ];
        let name = op_name(b);
        check(&src, &args, &format!("{name}+{name}"));
    }
}

/// A random broadcast of `out`: the full shape, a scalar, one value per channel (dim 1), the
/// last dim only, or random dims set to 1 and leading dims dropped.
fn broadcast_of(out: &[usize], pick: u64) -> Vec<usize> {
    match pick % 6 {
        0 | 1 => out.to_vec(),
        2 => Vec::new(),
        3 if out.len() >= 2 => out
            .iter()
            .enumerate()
            .map(|(j, &d)| if j == 1 { d } else { 1 })
            .collect(),
        4 => out.last().map(|&d| vec![d]).unwrap_or_default(),
        _ => {
            let drop = (pick >> 3) as usize % (out.len() + 1);
            out[drop..]
                .iter()
                .enumerate()
                .map(|(j, &d)| if (pick >> (8 + j)) & 1 == 1 { 1 } else { d })
                .collect()
        }
    }
}

/// A random group over result shape `out`: `steps` instructions (op choices and operand
/// picks from `picks`), the first reading a full-shape input; returns the param shapes, the
/// body and the result shape.
fn random_group(out: &[usize], picks: &[u64]) -> (Vec<Vec<usize>>, Vec<String>, Vec<usize>) {
    let mut params: Vec<Vec<usize>> = vec![out.to_vec()];
    // (name, shape) of the values so far: the params, then each binding.
    let mut vals: Vec<(String, Vec<usize>)> = vec![("p0".to_string(), out.to_vec())];
    let mut body = Vec::new();
    for (k, &p) in picks.iter().enumerate() {
        let running = vals.last().cloned().unwrap_or_default();
        // An operand: the running value, an earlier value, or a new input.
        let mut operand = |q: u64| -> (String, Vec<usize>) {
            match q % 4 {
                0 | 1 => running.clone(),
                2 => vals[(q >> 2) as usize % vals.len()].clone(),
                _ => {
                    let s = broadcast_of(out, q >> 2);
                    params.push(s.clone());
                    (format!("p{}", params.len() - 1), s)
                }
            }
        };
        let name = format!("v{k}");
        let (expr, shape) = if p % 3 == 0 {
            let (a, sa) = operand(p >> 4);
            (
                UNARY[(p >> 12) as usize % UNARY.len()].replace("{}", &a),
                sa,
            )
        } else {
            let (a, sa) = operand(p >> 4);
            let (b, sb) = operand(p >> 20);
            let op = BINARY[(p >> 36) as usize % BINARY.len()];
            let (a, b, sa, sb) = if (p >> 44) & 1 == 1 {
                (b, a, sb, sa)
            } else {
                (a, b, sa, sb)
            };
            let s = broadcast_shapes(&sa, &sb).unwrap();
            (format!("{op}({a}, {b})"), s)
        };
        body.push(format!("{name} = {expr}"));
        vals.push((name, shape));
    }
    // A result smaller than `out` (only broadcast inputs read at the end): add the full input,
    // so every value broadcasts to the result (else the program declines, rightly).
    if vals.last().is_some_and(|v| v.1 != out) {
        let k = body.len();
        let last = vals.last().map(|v| v.0.clone()).unwrap_or_default();
        body.push(format!("v{k} = R.add({last}, p0)"));
    }
    (params, body, out.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_chains_give_the_op_by_op_bits(
        shape in prop::sample::select(vec![
            vec![7usize],
            vec![2, 3, 5],
            vec![1, 4, 3, 3],
            vec![3, 1100],
            vec![2, 4, 80, 80],
        ]),
        picks in prop::collection::vec(any::<u64>(), 2..7),
        seed in 1u64..u64::MAX,
    ) {
        let (params, body, out) = random_group(&shape, &picks);
        let src = module_src(&params, "float32", &body, &out);
        let mut r = Rng(seed);
        let args: Vec<Value> = params.iter().map(|s| Value::Tensor(r.tensor(s))).collect();
        let names: Vec<String> = body
            .iter()
            .map(|l| op_name(l.split(" = ").nth(1).unwrap_or("")))
            .collect();
        check(&src, &args, &names.join("+"));
    }
}

#[test]
fn registers_are_reused_and_never_alias_an_operand() {
    // a feeds b and d; b feeds c; the last reads c and a.
    let src = module_src(
        &[vec![4, 300]],
        "float32",
        &[
            "a = R.exp(p0)".to_string(),
            "b = R.sigmoid(a)".to_string(),
            "c = R.multiply(b, b)".to_string(),
            "d = R.tanh(c)".to_string(),
            "e = R.subtract(d, a)".to_string(),
        ],
        &[4, 300],
    );
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    let g = compile(m.get("fused").unwrap()).unwrap();
    // a lives throughout (r0); b takes r1, c a new r2 (never its operand's), d takes r1
    // back (b's, freed after c); e writes the output: three registers, not four.
    assert_eq!(g.prog.nregs, 3);
    let dsts: Vec<Dst> = g.prog.insts.iter().map(|i| i.dst).collect();
    assert_eq!(
        dsts,
        [Dst::Reg(0), Dst::Reg(1), Dst::Reg(2), Dst::Reg(1), Dst::Out]
    );
    for i in &g.prog.insts {
        for s in [Some(i.a), i.b].into_iter().flatten() {
            if let (Src::Reg(r), Dst::Reg(d)) = (s, i.dst) {
                assert_ne!(r, d, "{i:?}");
            }
        }
    }
    let mut r = Rng(3);
    check(
        &src,
        &[Value::Tensor(r.tensor(&[4, 300]))],
        "relax.exp+relax.sigmoid+relax.multiply+relax.tanh+relax.subtract",
    );
}

#[test]
fn a_sigmoid_times_its_operand_is_one_silu_instruction() {
    // (body, the kinds compiled): the product in either order is one SiLU; a sigmoid read
    // again, or multiplied by another value (a squeeze-and-excite gate), stays two.
    let silu = Kind::Un(Un::Silu);
    let (sig, mul) = (Kind::Un(Un::Sigmoid), Kind::Bin(Bin::Arith(BinOp::Mul)));
    let add = Kind::Bin(Bin::Arith(BinOp::Add));
    for (body, kinds) in [
        (
            [
                "a = R.add(p0, p1)",
                "b = R.sigmoid(a)",
                "c = R.multiply(a, b)",
            ],
            vec![add, silu],
        ),
        (
            [
                "a = R.add(p0, p1)",
                "b = R.sigmoid(a)",
                "c = R.multiply(b, a)",
            ],
            vec![add, silu],
        ),
        (
            [
                "a = R.sigmoid(p0)",
                "b = R.multiply(p0, a)",
                "c = R.add(b, a)",
            ],
            vec![sig, mul, add],
        ),
        (
            [
                "a = R.add(p0, p1)",
                "b = R.sigmoid(a)",
                "c = R.multiply(p0, b)",
            ],
            vec![add, sig, mul],
        ),
    ] {
        let body: Vec<String> = body.iter().map(|s| s.to_string()).collect();
        let src = module_src(&[vec![3, 700], vec![3, 1]], "float32", &body, &[3, 700]);
        let m = fusebox_core::text::parse_module_str(&src).unwrap();
        let g = compile(m.get("fused").unwrap()).unwrap();
        let got: Vec<Kind> = g.prog.insts.iter().map(|i| i.kind).collect();
        assert_eq!(got, kinds, "{body:?}");
        let mut r = Rng(5);
        let mut x = r.tensor(&[3, 700]).to_f32_vec();
        x[..EDGES.len()].copy_from_slice(&EDGES);
        let args = [
            Value::Tensor(Tensor::from_f32(vec![3, 700], x).unwrap()),
            Value::Tensor(r.tensor(&[3, 1])),
        ];
        let ops: Vec<String> = body
            .iter()
            .map(|b| op_name(b.split_once(" = ").map_or(b.as_str(), |(_, e)| e)))
            .collect();
        check(&src, &args, &ops.join("+"));
    }
}

#[test]
fn broadcast_inputs_are_read_by_merged_dims() {
    // (1, C, 1, 1) over (N, C, H, W): N with stride 0, C with 1, H·W merged with stride 0.
    let a = access(&[1, 3, 1, 1], &[2, 3, 4, 5], &[0.0; 3]);
    assert!(matches!(a, Some(Access::Strided(d)) if d == vec![(2, 0), (3, 1), (20, 0)]));
    let a = access(&[5], &[2, 3, 5], &[0.0; 5]);
    assert!(matches!(a, Some(Access::Strided(d)) if d == vec![(6, 0), (5, 1)]));
    assert!(matches!(
        access(&[1, 1], &[2, 3], &[1.5]),
        Some(Access::Scalar(v)) if v == 1.5
    ));
    assert!(matches!(
        access(&[1, 6], &[6], &[0.0; 6]),
        Some(Access::Full)
    ));
    // A block inside one channel's run reads one value; one across channels gathers.
    let dims = [(2, 0), (3, 1), (20, 0)];
    let data = [10.0, 11.0, 12.0];
    let mut buf = [0.0f32; 8];
    assert_eq!(gather(&dims, &data, 21, &mut buf), Some(11.0));
    assert_eq!(gather(&dims, &data, 36, &mut buf), None);
    assert_eq!(buf, [11.0, 11.0, 11.0, 11.0, 12.0, 12.0, 12.0, 12.0]);
    assert_eq!(gather(&dims, &data, 56, &mut buf), None);
    assert_eq!(buf, [12.0, 12.0, 12.0, 12.0, 10.0, 10.0, 10.0, 10.0]);
}

#[test]
fn a_repeated_run_is_gathered_as_element_by_element_indexing_reads_it() {
    // dims ending in (m, 0), (k, 1): a per-channel `(1, C/16, 1, 1, 16)` over `NCHW16c`, a
    // bias over the last axis; blocks starting at every phase of the run, crossing outer
    // indices, shorter than one run and longer than several stretches.
    let by_index = |dims: &[(usize, usize)], data: &[f32], at: usize, len: usize| {
        (at..at + len)
            .map(|g| {
                let (mut rest, mut o) = (g, 0);
                for &(e, st) in dims.iter().rev() {
                    o += (rest % e) * st;
                    rest /= e;
                }
                data[o]
            })
            .collect::<Vec<f32>>()
    };
    let cases: [(&[(usize, usize)], usize); 4] = [
        (&[(3, 16), (49, 0), (16, 1)], 48),
        (&[(2, 0), (3, 5), (4, 0), (5, 1)], 15),
        (&[(6, 0), (5, 1)], 5),
        (&[(2, 7), (3, 0), (7, 1)], 14),
    ];
    for (dims, n) in cases {
        let data: Vec<f32> = (0..n).map(|i| i as f32 + 0.5).collect();
        let total: usize = dims.iter().map(|d| d.0).product();
        for len in [7, 16, 33, 100, 1024] {
            for at in [0, 1, 5, 15, 16, 17, 40, 100] {
                if at + len > total {
                    continue;
                }
                let mut buf = vec![f32::NAN; len];
                let konst = gather(dims, &data, at, &mut buf);
                let want = by_index(dims, &data, at, len);
                match konst {
                    Some(v) => assert!(want.iter().all(|&w| w == v), "{dims:?} {at} {len}"),
                    None => assert_eq!(buf, want, "{dims:?} at {at} len {len}"),
                }
            }
        }
    }
}

#[test]
fn groups_of_other_forms_do_not_compile() {
    let shape = [2, 3];
    // One binding; a reduction; the result not the last binding.
    let one = module_src(
        &[shape.to_vec()],
        "float32",
        &["a = R.exp(p0)".into()],
        &shape,
    );
    let sum = module_src(
        &[shape.to_vec()],
        "float32",
        &[
            "a = R.exp(p0)".into(),
            "b = R.sum(a, axis=[1], keepdims=True)".into(),
        ],
        &[2, 1],
    );
    for src in [one, sum] {
        let m = fusebox_core::text::parse_module_str(&src).unwrap();
        assert!(compile(m.get("fused").unwrap()).is_none(), "{src}");
    }
}

#[test]
fn other_dtypes_run_op_by_op_with_the_right_values() {
    let body = [
        "a = R.add(p0, p1)".to_string(),
        "b = R.multiply(a, p1)".to_string(),
        "c = R.negative(b)".to_string(),
    ];
    // int64: (x + y) * y, negated.
    let src = module_src(&[vec![4], vec![4]], "int64", &body, &[4]);
    let x = Tensor::from_i64(vec![4], vec![1, -2, 3, i64::MAX]).unwrap();
    let y = Tensor::from_i64(vec![4], vec![2, 5, -1, 1]).unwrap();
    let args = vec![Value::Tensor(x), Value::Tensor(y)];
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    let Value::Tensor(got) = crate::run(&m, "main", args.clone()).unwrap() else {
        panic!("not a tensor")
    };
    // i64::MAX + 1 wraps to i64::MIN; times 1, negated, wraps back to i64::MIN.
    assert_eq!(got.to_i64_vec(), vec![-6, -15, 2, i64::MIN]);
    let names = profile(&src, args);
    assert!(names.iter().any(|n| n == "relax.add"), "{names:?}");
    assert!(!names.iter().any(|n| n.contains('+')), "{names:?}");

    // float16: each op rounds to half precision (1000 * 70 = 70000 overflows to inf).
    let src = module_src(&[vec![3], vec![3]], "float16", &body, &[3]);
    let h = |v: &[f32]| {
        Tensor::new(
            vec![v.len()],
            fusebox_core::runtime::Storage::F16(
                v.iter().map(|&x| half::f16::from_f32(x)).collect(),
            ),
        )
        .unwrap()
    };
    let args = vec![
        Value::Tensor(h(&[1.0, 930.0, -0.5])),
        Value::Tensor(h(&[2.0, 70.0, 0.25])),
    ];
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    let Value::Tensor(got) = crate::run(&m, "main", args.clone()).unwrap() else {
        panic!("not a tensor")
    };
    assert_eq!(got.dtype(), fusebox_core::ir::DType::F16);
    assert_eq!(got.to_f32_vec(), vec![-6.0, f32::NEG_INFINITY, 0.0625]);
    let names = profile(&src, args);
    assert!(!names.iter().any(|n| n.contains('+')), "{names:?}");
}

#[test]
fn values_that_do_not_fit_are_declined() {
    let src = module_src(
        &[vec![2, 3], vec![3]],
        "float32",
        &["a = R.add(p0, p1)".into(), "b = R.exp(a)".into()],
        &[2, 3],
    );
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    let g = compile(m.get("fused").unwrap()).unwrap();
    let mut r = Rng(5);
    let (x, y) = (r.tensor(&[2, 3]), r.tensor(&[3]));
    assert!(bind(&g.prog, &[x.clone(), y.clone()], None).is_some());
    // Shapes that do not broadcast; a result larger than the head's output; float16.
    assert!(bind(&g.prog, &[x.clone(), r.tensor(&[4])], None).is_none());
    assert!(bind(&g.prog, &[x.clone(), r.tensor(&[5, 1, 3])], Some(&[2, 3])).is_none());
    assert!(bind(&g.prog, &[x.cast(fusebox_core::ir::DType::F16), y], None).is_none());
}

/// A conv2d group as FuseOps makes it: conv2d of a `2 × 8 × hw × hw` image, per-channel bias
/// add, then `tail` (lines over `lv1`, the last named `gv`), with scalar params `s0`, `s1`.
fn conv_group(groups: usize, hw: usize, tail: &[&str]) -> String {
    let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
    let w = if groups == 1 {
        "8, 8, 3, 3"
    } else {
        "8, 1, 3, 3"
    };
    let mut body = String::new();
    for l in tail {
        body.push_str(&format!("            {l}\n"));
    }
    format!(
        "@I.ir_module\nclass Module:\n    @R.function(private=True)\n    def fused(x: {x}, w: {w}, b: {b}, s0: {s}, s1: {s}) -> {x}:\n        R.func_attr({{\"Primitive\": True}})\n        with R.dataflow():\n            lv = R.nn.conv2d(x, w, padding=[1, 1, 1, 1], groups={groups})\n            lv1 = R.add(lv, b)\n{body}            R.output(gv)\n        return gv\n\n    @R.function\n    def main(x: {x}, w: {w}, b: {b}, s0: {s}, s1: {s}) -> {x}:\n        with R.dataflow():\n            gv = Module.fused(x, w, b, s0, s1)\n            R.output(gv)\n        return gv\n",
        x = t(&format!("2, 8, {hw}, {hw}")),
        w = t(w),
        b = t("1, 8, 1, 1"),
        s = t(""),
    )
}

#[test]
fn conv_silu_and_hardswish_run_as_one_kernel_bit_for_bit() {
    let silu = ["lv2 = R.sigmoid(lv1)", "gv = R.multiply(lv1, lv2)"];
    let hardswish = [
        "lv2 = R.multiply(lv1, s0)",
        "lv3 = R.add(lv2, s1)",
        "lv4 = R.clip(lv3, R.prim_value(T.float32(0.0)), R.prim_value(T.float32(1.0)))",
        "gv = R.multiply(lv1, lv4)",
    ];
    // 20 × 20 planes run the program as the epilogue; 6 × 6 ones in a pass after the conv.
    for (groups, hw) in [(1, 20), (8, 20), (1, 6), (8, 6)] {
        for (tail, ops) in [
            (&silu[..], "relax.sigmoid+relax.multiply"),
            (
                &hardswish[..],
                "relax.multiply+relax.add+relax.clip+relax.multiply",
            ),
        ] {
            let src = conv_group(groups, hw, tail);
            let mut r = Rng(11 + groups as u64);
            let wshape = if groups == 1 {
                [8, 8, 3, 3]
            } else {
                [8, 1, 3, 3]
            };
            let args = vec![
                Value::Tensor(r.tensor(&[2, 8, hw, hw])),
                Value::Tensor(r.tensor(&wshape)),
                Value::Tensor(r.tensor(&[1, 8, 1, 1])),
                Value::Tensor(Tensor::from_f32(vec![], vec![1.0 / 6.0]).unwrap()),
                Value::Tensor(Tensor::from_f32(vec![], vec![0.5]).unwrap()),
            ];
            check(&src, &args, &format!("relax.nn.conv2d+relax.add+{ops}"));
        }
    }
}

#[test]
fn a_squeeze_excite_group_runs_the_program_after_its_conv() {
    // conv2d on pooled values (1 × 1 planes), bias, sigmoid, then a multiply by the feature
    // map: the result is larger than the convolution's output.
    let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
    let src = format!(
        "@I.ir_module\nclass Module:\n    @R.function(private=True)\n    def fused(p: {p}, w: {w}, b: {b}, f: {f}) -> {f}:\n        R.func_attr({{\"Primitive\": True}})\n        with R.dataflow():\n            lv = R.nn.conv2d(p, w)\n            lv1 = R.add(lv, b)\n            lv2 = R.sigmoid(lv1)\n            gv = R.multiply(f, lv2)\n            R.output(gv)\n        return gv\n\n    @R.function\n    def main(p: {p}, w: {w}, b: {b}, f: {f}) -> {f}:\n        with R.dataflow():\n            gv = Module.fused(p, w, b, f)\n            R.output(gv)\n        return gv\n",
        p = t("1, 4, 1, 1"),
        w = t("16, 4, 1, 1"),
        b = t("1, 16, 1, 1"),
        f = t("1, 16, 30, 30"),
    );
    let mut r = Rng(17);
    let args = vec![
        Value::Tensor(r.tensor(&[1, 4, 1, 1])),
        Value::Tensor(r.tensor(&[16, 4, 1, 1])),
        Value::Tensor(r.tensor(&[1, 16, 1, 1])),
        Value::Tensor(r.tensor(&[1, 16, 30, 30])),
    ];
    check(
        &src,
        &args,
        "relax.nn.conv2d+relax.add+relax.sigmoid+relax.multiply",
    );
}

#[test]
fn matmul_groups_run_the_program_over_the_matmul_output() {
    // A classifier's dense + hardswish (in place), and a matmul whose result a broadcast add
    // enlarges (a pass of its own).
    let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
    let module = |out: &str, c: &str, tail: &str| {
        format!(
            "@I.ir_module\nclass Module:\n    @R.function(private=True)\n    def fused(x: {x}, w: {w}, b: {b}, c: {c}) -> {o}:\n        R.func_attr({{\"Primitive\": True}})\n        with R.dataflow():\n            lv = R.matmul(x, w, out_dtype=\"void\")\n            lv1 = R.add(lv, b)\n{tail}            R.output(gv)\n        return gv\n\n    @R.function\n    def main(x: {x}, w: {w}, b: {b}, c: {c}) -> {o}:\n        with R.dataflow():\n            gv = Module.fused(x, w, b, c)\n            R.output(gv)\n        return gv\n",
            x = t("5, 37"),
            w = t("37, 300"),
            b = t("300,"),
            c = t(c),
            o = t(out),
        )
    };
    let hardswish = "            lv2 = R.multiply(lv1, c)\n            lv3 = R.add(lv2, R.const(0.5, \"float32\"))\n            lv4 = R.clip(lv3, R.prim_value(T.float32(0.0)), R.prim_value(T.float32(1.0)))\n            gv = R.multiply(lv1, lv4)\n";
    let wider = "            gv = R.add(lv1, c)\n";
    let mut r = Rng(23);
    let (x, w, b) = (r.tensor(&[5, 37]), r.tensor(&[37, 300]), r.tensor(&[300]));
    for (src, c, ops) in [
        (
            module("5, 300", "", hardswish),
            r.tensor(&[]),
            "relax.matmul+relax.add+relax.multiply+relax.add+relax.clip+relax.multiply",
        ),
        (
            module("2, 5, 300", "2, 1, 1", wider),
            r.tensor(&[2, 1, 1]),
            "relax.matmul+relax.add+relax.add",
        ),
    ] {
        let args = [x.clone(), w.clone(), b.clone(), c].map(Value::Tensor);
        check(&src, &args, ops);
    }
}

#[test]
fn a_conv_chain_fuse_rs_covers_keeps_its_kernel() {
    // conv2d + bias + relu is fuse.rs's chain: it keeps running (and is named) as before.
    let src = conv_group(1, 20, &["gv = R.nn.relu(lv1)"]);
    let mut r = Rng(2);
    let args = vec![
        Value::Tensor(r.tensor(&[2, 8, 20, 20])),
        Value::Tensor(r.tensor(&[8, 8, 3, 3])),
        Value::Tensor(r.tensor(&[1, 8, 1, 1])),
        Value::Tensor(Tensor::from_f32(vec![], vec![0.0]).unwrap()),
        Value::Tensor(Tensor::from_f32(vec![], vec![0.0]).unwrap()),
    ];
    let names = profile(&src, args);
    assert!(
        names
            .iter()
            .any(|n| n == "relax.nn.conv2d+relax.add+relax.nn.relu"),
        "{names:?}"
    );
}

/// A module whose `fused` has the parameters `params` (`name: type` texts) and `body`
/// (lines, the last named `gv`), called by `main` with `args` (texts: parameter names or
/// shape literals) from `main`'s tensor parameters `main_params`.
fn view_module(
    params: &[&str],
    body: &[&str],
    out: &str,
    main_params: &[&str],
    args: &[&str],
) -> String {
    let mut s = format!(
        "@I.ir_module\nclass Module:\n    @R.function(private=True)\n    def fused({}) -> {out}:\n        R.func_attr({{\"Primitive\": True}})\n        with R.dataflow():\n",
        params.join(", ")
    );
    for line in body {
        s.push_str(&format!("            {line}\n"));
    }
    s.push_str(&format!(
        "            R.output(gv)\n        return gv\n\n    @R.function\n    def main({}) -> {out}:\n        with R.dataflow():\n            gv = Module.fused({})\n            R.output(gv)\n        return gv\n",
        main_params.join(", "),
        args.join(", ")
    ));
    s
}

fn i64_tensor(shape: &[usize], f: impl Fn(usize) -> i64) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_i64(shape.to_vec(), (0..n).map(f).collect()).unwrap()
}

#[test]
fn relative_position_gathers_are_read_in_place_bit_for_bit() {
    // DeBERTa's disentangled attention terms as FuseOps groups them: the positions broadcast
    // over the heads, gathered from the [H, S, 2K] scores (one gather transposed), divided
    // and added; the positions partly negative (counted from the end).
    let (h, s, k2) = (3usize, 37usize, 16usize);
    let t = |sh: &str, d: &str| format!("R.Tensor(({sh}), dtype=\"{d}\")");
    let (hss, hsk) = (format!("{h}, {s}, {s}"), format!("{h}, {s}, {k2}"));
    let params = [
        format!("pos: {}", t(&format!("1, {s}, {s}"), "int64")),
        format!("sh: R.Shape([{hss}])"),
        format!("c2p: {}", t(&hsk, "float32")),
        format!("scale: {}", t("", "float32")),
        format!("zero: {}", t("", "float32")),
        format!("pos2: {}", t(&format!("1, {s}, {s}"), "int64")),
        format!("p2c: {}", t(&hsk, "float32")),
    ];
    let body = [
        "lv = R.broadcast_to(pos, sh)",
        "lv1 = R.gather_elements(c2p, lv, axis=-1)",
        "lv2 = R.divide(lv1, scale)",
        "lv3 = R.add(lv2, zero)",
        "lv4 = R.broadcast_to(pos2, sh)",
        "lv5 = R.gather_elements(p2c, lv4, axis=-1)",
        "lv6 = R.permute_dims(lv5, axes=[0, 2, 1])",
        "lv7 = R.divide(lv6, scale)",
        "gv = R.add(lv3, lv7)",
    ];
    let main_params: Vec<String> = params
        .iter()
        .filter(|p| !p.starts_with("sh:"))
        .cloned()
        .collect();
    let p: Vec<&str> = params.iter().map(String::as_str).collect();
    let mp: Vec<&str> = main_params.iter().map(String::as_str).collect();
    let shape_lit = format!("R.shape([{hss}])");
    let src = view_module(
        &p,
        &body,
        &t(&hss, "float32"),
        &mp,
        &["pos", &shape_lit, "c2p", "scale", "zero", "pos2", "p2c"],
    );
    let k = k2 as i64;
    // Relative positions clipped into [0, 2K) as the exporter does, some written negative.
    let rel = |i: usize, j: usize, sign: i64| -> i64 {
        let d = (sign * (i as i64 - j as i64) + k / 2).clamp(0, k - 1);
        if (i + j).is_multiple_of(3) { d - k } else { d }
    };
    let pos = i64_tensor(&[1, s, s], |q| rel(q / s, q % s, 1));
    let pos2 = i64_tensor(&[1, s, s], |q| rel(q / s, q % s, -1));
    let mut r = Rng(41);
    let (c2p, p2c) = (r.tensor(&[h, s, k2]), r.tensor(&[h, s, k2]));
    let scale = Tensor::from_f32(vec![], vec![13.856406]).unwrap();
    let zero = Tensor::from_f32(vec![], vec![0.0]).unwrap();
    let args = [
        pos.clone(),
        c2p.clone(),
        scale,
        zero,
        pos2.clone(),
        p2c.clone(),
    ]
    .map(Value::Tensor);
    check(
        &src,
        &args,
        "relax.broadcast_to+relax.gather_elements+relax.divide+relax.add+relax.broadcast_to+relax.gather_elements+relax.permute_dims+relax.divide+relax.add",
    );
    // And the definition, element by element.
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    let Value::Tensor(got) = crate::run(&m, "main", args.to_vec()).unwrap() else {
        panic!("not a tensor")
    };
    let (c, p, pv, pv2) = (
        c2p.to_f32_vec(),
        p2c.to_f32_vec(),
        pos.to_i64_vec(),
        pos2.to_i64_vec(),
    );
    let at = |j: i64| usize::try_from(if j < 0 { j + k } else { j }).unwrap();
    let got = got.to_f32_vec();
    for hh in 0..h {
        for i in 0..s {
            for j in 0..s {
                let a = c[(hh * s + i) * k2 + at(pv[i * s + j])] / 13.856406 + 0.0;
                let b = p[(hh * s + j) * k2 + at(pv2[j * s + i])] / 13.856406;
                let g = got[(hh * s + i) * s + j];
                assert!(
                    same(g.to_bits(), (a + b).to_bits()),
                    "[{hh}, {i}, {j}]: {g} vs {}",
                    a + b
                );
            }
        }
    }
}

#[test]
fn layout_chains_of_parameters_are_read_in_place() {
    // permute_dims, a reshape that splits a dim, expand_dims, squeeze and a literal
    // broadcast_to of one parameter, gathered along axis 0 from a box smaller than the data
    // and multiplied with another.
    let t = |sh: &str, d: &str| format!("R.Tensor(({sh}), dtype=\"{d}\")");
    let params = [
        format!("x: {}", t("6, 4", "float32")),
        format!("y: {}", t("5, 3, 2, 4", "float32")),
        format!("d: {}", t("7, 5", "float32")),
        format!("idx: {}", t("3, 4", "int64")),
    ];
    let body = [
        "lv = R.permute_dims(x, axes=[1, 0])",
        "lv1 = R.reshape(lv, R.shape([4, 3, 2]))",
        "lv2 = R.expand_dims(lv1, axis=[0, 2])",
        "lv3 = R.squeeze(lv2, axis=[2])",
        "lv4 = R.permute_dims(lv3, axes=[0, 2, 3, 1])",
        "lv5 = R.broadcast_to(lv4, R.shape([5, 3, 2, 4]))",
        "lv6 = R.multiply(y, lv5)",
        "lv7 = R.gather_elements(d, idx, axis=0)",
        "lv8 = R.permute_dims(lv7, axes=None)",
        "lv9 = R.reshape(lv8, R.shape([2, -1, 3]))",
        "lv10 = R.permute_dims(lv9, axes=[2, 0, 1])",
        "lv11 = R.reshape(lv10, R.shape([3, 1, 4]))",
        "lv12 = R.squeeze(lv11, axis=None)",
        "lv13 = R.expand_dims(lv12, axis=[1])",
        "lv14 = R.subtract(lv6, lv13)",
        "gv = R.exp(lv14)",
    ];
    let p: Vec<&str> = params.iter().map(String::as_str).collect();
    let src = view_module(
        &p,
        &body,
        &t("5, 3, 2, 4", "float32"),
        &p,
        &["x", "y", "d", "idx"],
    );
    let mut r = Rng(3);
    let idx = i64_tensor(&[3, 4], |q| (q as i64 * 5) % 14 - 7);
    let args = [
        r.tensor(&[6, 4]),
        r.tensor(&[5, 3, 2, 4]),
        r.tensor(&[7, 5]),
        idx,
    ]
    .map(Value::Tensor);
    let name = [
        "permute_dims",
        "reshape",
        "expand_dims",
        "squeeze",
        "permute_dims",
        "broadcast_to",
        "multiply",
        "gather_elements",
        "permute_dims",
        "reshape",
        "permute_dims",
        "reshape",
        "squeeze",
        "expand_dims",
        "subtract",
        "exp",
    ]
    .map(|o| format!("relax.{o}"))
    .join("+");
    check(&src, &args, &name);
}

#[test]
fn layout_transforms_of_parameters_are_read_in_place() {
    // An SE block's scale in `NCHW16c`: `(1, 48, 1, 1)` split into `(1, 3, 1, 1, 16)` and
    // broadcast over the blocked planes; and a `(1, 3, 1, 1, 16)` value fused back to
    // `(1, 48, 1, 1)` (the parts lie contiguous on 1 × 1 planes) and broadcast over `NCHW`.
    let t = |sh: &str| format!("R.Tensor(({sh}), dtype=\"float32\")");
    let split = "T.index_map(lambda i0, i1, i2, i3: (i0, i1 // 16, i2, i3, i1 % 16))";
    let fuse = "T.index_map(lambda i0, i1, i2, i3, i4: (i0, i1 * 16 + i4, i2, i3))";
    let params = [
        format!("s: {}", t("1, 48, 1, 1")),
        format!("x: {}", t("1, 3, 5, 5, 16")),
        format!("b: {}", t("1, 3, 1, 1, 16")),
        format!("y: {}", t("1, 48, 5, 5")),
    ];
    let p: Vec<&str> = params.iter().map(String::as_str).collect();
    let mut r = Rng(17);
    let (s, x, b, y) = (
        r.tensor(&[1, 48, 1, 1]),
        r.tensor(&[1, 3, 5, 5, 16]),
        r.tensor(&[1, 3, 1, 1, 16]),
        r.tensor(&[1, 48, 5, 5]),
    );
    let into = view_module(
        &p[..2],
        &[
            &format!("lv = R.layout_transform(s, index_map={split}, pad_value=None)"),
            "gv = R.multiply(lv, x)",
        ],
        &t("1, 3, 5, 5, 16"),
        &p[..2],
        &["s", "x"],
    );
    // The program's values, its bits checked against the bindings one by one.
    let run = |src: &str, args: [Tensor; 2], kernel: &str| -> Vec<f32> {
        let args = args.map(Value::Tensor);
        check(src, &args, kernel);
        let m = fusebox_core::text::parse_module_str(src).unwrap();
        let Value::Tensor(got) = crate::run(&m, "main", args.to_vec()).unwrap() else {
            panic!("not a tensor")
        };
        got.to_f32_vec()
    };
    let got = run(
        &into,
        [s.clone(), x.clone()],
        "relax.layout_transform+relax.multiply",
    );
    // And the definition: channel `16·cb + c` of `s` scales block `cb`, lane `c`.
    let (sv, xv) = (s.to_f32_vec(), x.to_f32_vec());
    for (i, g) in got.iter().enumerate() {
        let (cb, c) = (i / (25 * 16), i % 16);
        assert_eq!(g.to_bits(), (sv[cb * 16 + c] * xv[i]).to_bits(), "{i}");
    }
    let back = view_module(
        &p[2..],
        &[
            &format!("lv = R.layout_transform(b, index_map={fuse}, pad_value=None)"),
            "gv = R.add(y, lv)",
        ],
        &t("1, 48, 5, 5"),
        &p[2..],
        &["b", "y"],
    );
    let got = run(
        &back,
        [b.clone(), y.clone()],
        "relax.layout_transform+relax.add",
    );
    let (bv, yv) = (b.to_f32_vec(), y.to_f32_vec());
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.to_bits(), (yv[i] + bv[i / 25]).to_bits(), "{i}");
    }
    // Fused back from planes of more than one pixel, the parts are not contiguous: not a
    // strided view, declined at bind; the bindings run one by one.
    let wide = back
        .replace("1, 3, 1, 1, 16", "1, 3, 5, 5, 16")
        .replace("R.add(y, lv)", "R.add(lv, y)");
    let m = fusebox_core::text::parse_module_str(&wide).unwrap();
    let g = compile(m.get("fused").unwrap()).unwrap();
    let args = [x.clone(), y.clone()];
    assert!(bind(&g.prog, &args, None).is_none());
    let want = crate::run(
        &fusebox_core::text::parse_module_str(&plain(&wide)).unwrap(),
        "main",
        args.iter().cloned().map(Value::Tensor).collect(),
    )
    .unwrap();
    let got = crate::run(&m, "main", args.map(Value::Tensor).to_vec()).unwrap();
    assert_eq!(bits(&got), bits(&want));
}

#[test]
fn views_strides_cannot_express_or_bad_indices_run_op_by_op() {
    let t = |sh: &str, d: &str| format!("R.Tensor(({sh}), dtype=\"{d}\")");
    // A transpose merged across its transposed dims: not a strided view; the bindings run
    // one by one, with the same values.
    let params = [format!("x: {}", t("3, 4", "float32"))];
    let p: Vec<&str> = params.iter().map(String::as_str).collect();
    let src = view_module(
        &p,
        &[
            "lv = R.permute_dims(x, axes=[1, 0])",
            "lv1 = R.reshape(lv, R.shape([12]))",
            "gv = R.exp(lv1)",
        ],
        &t("12,", "float32"),
        &p,
        &["x"],
    );
    let mut r = Rng(9);
    let x = r.tensor(&[3, 4]);
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    let g = compile(m.get("fused").unwrap()).unwrap();
    assert!(bind(&g.prog, std::slice::from_ref(&x), None).is_none());
    let want = crate::run(
        &fusebox_core::text::parse_module_str(&plain(&src)).unwrap(),
        "main",
        vec![Value::Tensor(x.clone())],
    )
    .unwrap();
    assert_eq!(
        bits(&crate::run(&m, "main", vec![Value::Tensor(x.clone())]).unwrap()),
        bits(&want)
    );
    let names = profile(&src, vec![Value::Tensor(x)]);
    assert!(names.iter().any(|n| n == "relax.reshape"), "{names:?}");

    // An index out of range: declined at bind, and the op-by-op run reports it.
    let params = [
        format!("d: {}", t("2, 3", "float32")),
        format!("idx: {}", t("2, 3", "int64")),
    ];
    let p: Vec<&str> = params.iter().map(String::as_str).collect();
    let src = view_module(
        &p,
        &["lv = R.gather_elements(d, idx, axis=1)", "gv = R.exp(lv)"],
        &t("2, 3", "float32"),
        &p,
        &["d", "idx"],
    );
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    let g = compile(m.get("fused").unwrap()).unwrap();
    let d = r.tensor(&[2, 3]);
    for (bad, ok) in [(3, false), (-4, false), (2, true), (-3, true)] {
        let idx = i64_tensor(&[2, 3], |q| if q == 4 { bad } else { 0 });
        assert_eq!(
            bind(&g.prog, &[d.clone(), idx.clone()], None).is_some(),
            ok,
            "{bad}"
        );
        let got = crate::run(
            &m,
            "main",
            vec![Value::Tensor(d.clone()), Value::Tensor(idx)],
        );
        match got {
            Ok(_) => assert!(ok, "{bad}"),
            Err(e) => {
                assert!(!ok, "{bad}: {e}");
                let want = format!("index {bad} is out of range for an axis of extent 3");
                assert!(e.to_string().contains(&want), "{e}");
            }
        }
    }

    // A view of a computed value is not covered.
    let params = [format!("x: {}", t("3, 4", "float32"))];
    let p: Vec<&str> = params.iter().map(String::as_str).collect();
    let src = view_module(
        &p,
        &[
            "lv = R.exp(x)",
            "lv1 = R.permute_dims(lv, axes=[1, 0])",
            "gv = R.negative(lv1)",
        ],
        &t("4, 3", "float32"),
        &p,
        &["x"],
    );
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    assert!(compile(m.get("fused").unwrap()).is_none());
}

/// A random chain of view ops over `x` (shape `shape`), at most one `gather_elements`, then
/// multiplied by `y` of the chain's shape: the body, the typed params, the arguments and the
/// profile name. Reshapes only split dims or name one `-1` (a split is always a view).
fn random_views(shape: &[usize], picks: &[u64], r: &mut Rng) -> (String, Vec<Value>, String) {
    let t = |sh: &[usize], d: &str| {
        let dims: Vec<String> = sh.iter().map(ToString::to_string).collect();
        let comma = if sh.len() == 1 { "," } else { "" };
        format!("R.Tensor(({}{comma}), dtype=\"{d}\")", dims.join(", "))
    };
    let lit = |sh: &[usize]| {
        let dims: Vec<String> = sh.iter().map(ToString::to_string).collect();
        format!("R.shape([{}])", dims.join(", "))
    };
    let mut params = vec![format!("x: {}", t(shape, "float32"))];
    let mut args = vec![Value::Tensor(r.tensor(shape))];
    let mut body: Vec<String> = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    let mut cur = "x".to_string();
    let mut sh = shape.to_vec();
    let mut gathered = false;
    for (k, &p) in picks.iter().enumerate() {
        let rank = sh.len();
        let numel: usize = sh.iter().product();
        let bit = |i: u32| (p >> i) as usize;
        let (expr, op, next) = match p % 6 {
            0 if rank >= 2 => {
                let mut perm: Vec<usize> = (0..rank).collect();
                for i in (1..rank).rev() {
                    perm.swap(i, bit(8 + 4 * i as u32) % (i + 1));
                }
                let axes: Vec<String> = perm.iter().map(ToString::to_string).collect();
                let next = perm.iter().map(|&a| sh[a]).collect();
                (
                    format!("R.permute_dims({cur}, axes=[{}])", axes.join(", ")),
                    "permute_dims",
                    next,
                )
            }
            1 if rank < 6 => {
                let a = bit(8) % (rank + 1);
                let mut next = sh.clone();
                next.insert(a, 1);
                (
                    format!("R.expand_dims({cur}, axis=[{a}])"),
                    "expand_dims",
                    next,
                )
            }
            2 if sh.contains(&1) => {
                let ones: Vec<usize> = (0..rank).filter(|&j| sh[j] == 1).collect();
                let a = ones[bit(8) % ones.len()];
                let mut next = sh.clone();
                next.remove(a);
                (format!("R.squeeze({cur}, axis=[{a}])"), "squeeze", next)
            }
            3 if (1..6).contains(&rank) => {
                let d = bit(8) % rank;
                let divs: Vec<usize> = (1..=sh[d]).filter(|a| sh[d].is_multiple_of(*a)).collect();
                let a = divs[bit(16) % divs.len()];
                let mut next = sh.clone();
                next[d] = sh[d] / a;
                next.insert(d, a);
                let mut written: Vec<String> = next.iter().map(ToString::to_string).collect();
                if bit(24) % 2 == 0 {
                    let at = bit(28) % written.len();
                    written[at] = "-1".to_string();
                }
                (
                    format!("R.reshape({cur}, R.shape([{}]))", written.join(", ")),
                    "reshape",
                    next,
                )
            }
            4 if numel * 4 <= 4000 => {
                let mut next: Vec<usize> = sh
                    .iter()
                    .enumerate()
                    .map(|(j, &e)| {
                        if e == 1 {
                            1 + bit(8 + 2 * j as u32) % 4
                        } else {
                            e
                        }
                    })
                    .collect();
                if rank < 6 && bit(30) % 2 == 0 {
                    next.insert(0, 2);
                }
                (
                    format!("R.broadcast_to({cur}, {})", lit(&next)),
                    "broadcast_to",
                    next,
                )
            }
            5 if !gathered && rank >= 1 => {
                gathered = true;
                let ax = bit(8) % rank;
                let n = sh[ax] as i64;
                let is: Vec<usize> = sh
                    .iter()
                    .enumerate()
                    .map(|(j, &e)| {
                        if j == ax {
                            1 + bit(12) % 5
                        } else {
                            e - bit(16 + j as u32) % e.min(2)
                        }
                    })
                    .collect();
                let seed = r.next();
                let idx = i64_tensor(&is, |q| {
                    ((seed >> (q % 40)) as i64 + q as i64 * 7).rem_euclid(2 * n) - n
                });
                let pname = format!("i{k}");
                params.push(format!("{pname}: {}", t(&is, "int64")));
                args.push(Value::Tensor(idx));
                (
                    format!("R.gather_elements({cur}, {pname}, axis={ax})"),
                    "gather_elements",
                    is,
                )
            }
            _ => continue,
        };
        let name = format!("v{k}");
        body.push(format!("{name} = {expr}"));
        names.push(op);
        cur = name;
        sh = next;
    }
    params.push(format!("y: {}", t(&sh, "float32")));
    args.push(Value::Tensor(r.tensor(&sh)));
    body.push(format!("gv = R.multiply({cur}, y)"));
    names.push("multiply");
    let name = names
        .iter()
        .map(|o| format!("relax.{o}"))
        .collect::<Vec<_>>()
        .join("+");
    let out = t(&sh, "float32");
    let p: Vec<&str> = params.iter().map(String::as_str).collect();
    let b: Vec<&str> = body.iter().map(String::as_str).collect();
    let call: Vec<String> = params
        .iter()
        .map(|q| q.split(':').next().unwrap_or("").to_string())
        .collect();
    let c: Vec<&str> = call.iter().map(String::as_str).collect();
    (view_module(&p, &b, &out, &p, &c), args, name)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_view_chains_give_the_op_by_op_bits(
        shape in prop::sample::select(vec![
            vec![6usize],
            vec![2, 3, 4],
            vec![1, 4, 1, 3],
            vec![5, 12],
            vec![3, 1, 2, 2, 2],
        ]),
        picks in prop::collection::vec(any::<u64>(), 1..8),
        seed in 1u64..u64::MAX,
    ) {
        let mut r = Rng(seed);
        let (src, args, name) = random_views(&shape, &picks, &mut r);
        check(&src, &args, &name);
    }
}

#[test]
fn values_smaller_than_the_result_are_computed_at_their_own_shape() {
    // A squeeze-and-excite gate: `add` and `sigmoid` read only `(1, C, 1, 1)` values, so they
    // run once per channel; the `multiply` by the feature map is what is left.
    let (c, hw) = (16usize, 20usize);
    let body = [
        "v0 = R.add(p1, p2)".to_string(),
        "v1 = R.sigmoid(v0)".to_string(),
        "v2 = R.multiply(p0, v1)".to_string(),
        "v3 = R.multiply(v2, v1)".to_string(),
    ];
    let params = vec![vec![1, c, hw, hw], vec![1, c, 1, 1], vec![1, c, 1, 1]];
    let src = module_src(&params, "float32", &body, &[1, c, hw, hw]);
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    let group = compile(m.get("fused").unwrap()).unwrap();
    let mut r = Rng(5);
    let args: Vec<Tensor> = params.iter().map(|s| r.tensor(s)).collect();
    let leaves = param_leaves(&group.prog, &args);
    let (p, all) = hoist(&group.prog, &leaves).unwrap();
    assert_eq!(p.insts.len(), 2, "{:?}", p.insts);
    assert_eq!(all.len(), leaves.len() + 2);
    assert_eq!(all[leaves.len() + 1].shape(), [1, c, 1, 1]);
    // What is left reads the feature map and the gate, not the gate's operands.
    assert_eq!(p.feeds.len(), 2);
    // And the whole group keeps the op-by-op bits (on a plane past one block, so that blocks
    // straddle channels).
    let args: Vec<Value> = args.into_iter().map(Value::Tensor).collect();
    check(
        &src,
        &args,
        "relax.add+relax.sigmoid+relax.multiply+relax.multiply",
    );
    // Nothing smaller than the result: nothing hoisted.
    let full = [
        "v0 = R.add(p0, p1)".to_string(),
        "v1 = R.sigmoid(v0)".to_string(),
    ];
    let fsrc = module_src(&params[..2], "float32", &full, &[1, c, hw, hw]);
    let fm = fusebox_core::text::parse_module_str(&fsrc).unwrap();
    let fg = compile(fm.get("fused").unwrap()).unwrap();
    let fa: Vec<Tensor> = params[..2].iter().map(|s| r.tensor(s)).collect();
    let fl = param_leaves(&fg.prog, &fa);
    assert!(hoist(&fg.prog, &fl).is_none());
}

#[test]
fn a_concat_group_runs_the_program_over_the_concatenation() {
    // DenseNet's batch norm and ReLU after a concatenation of the block's features.
    let params = vec![
        vec![1, 8, 9, 9],
        vec![1, 4, 9, 9],
        vec![1, 4, 9, 9],
        vec![1, 16, 1, 1],
        vec![1, 16, 1, 1],
    ];
    let body = [
        "v0 = R.concat((p0, p1, p2), axis=1)".to_string(),
        "v1 = R.multiply(v0, p3)".to_string(),
        "v2 = R.add(v1, p4)".to_string(),
        "v3 = R.nn.relu(v2)".to_string(),
    ];
    let src = module_src(&params, "float32", &body, &[1, 16, 9, 9]);
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    let group = compile(m.get("fused").unwrap()).unwrap();
    assert!(matches!(group.head, Some(Head::Concat { ref parts, .. }) if parts.len() == 3));
    let mut r = Rng(23);
    let args: Vec<Value> = params.iter().map(|s| Value::Tensor(r.tensor(s))).collect();
    check(
        &src,
        &args,
        "relax.concat+relax.multiply+relax.add+relax.nn.relu",
    );
    // A concatenation the program's result outgrows (a broadcast over a new leading axis):
    // the program runs as its own pass after it.
    let params2 = vec![vec![1, 2, 3], vec![1, 2, 3], vec![5, 1, 1, 1]];
    let body2 = [
        "v0 = R.concat((p0, p1), axis=2)".to_string(),
        "v1 = R.add(v0, p2)".to_string(),
    ];
    let src2 = module_src(&params2, "float32", &body2, &[5, 1, 2, 6]);
    let args2: Vec<Value> = params2.iter().map(|s| Value::Tensor(r.tensor(s))).collect();
    check(&src2, &args2, "relax.concat+relax.add");
}

/// A 1×1 conv2d group of `(1, c, hw, hw)` into `o` channels with `tail` after the conv
/// (lines over `lv`, the last named `gv`) and parameters `q: q_shape`, `s: ()`.
fn pointwise_group(c: usize, o: usize, hw: usize, q_shape: &str, tail: &[&str]) -> String {
    let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
    let body: String = tail.iter().map(|l| format!("            {l}\n")).collect();
    format!(
        "@I.ir_module\nclass Module:\n    @R.function(private=True)\n    def fused(x: {x}, w: {w}, q: {q}, s: {s}) -> {y}:\n        R.func_attr({{\"Primitive\": True}})\n        with R.dataflow():\n            lv = R.nn.conv2d(x, w)\n{body}            R.output(gv)\n        return gv\n\n    @R.function\n    def main(x: {x}, w: {w}, q: {q}, s: {s}) -> {y}:\n        with R.dataflow():\n            gv = Module.fused(x, w, q, s)\n            R.output(gv)\n        return gv\n",
        x = t(&format!("1, {c}, {hw}, {hw}")),
        w = t(&format!("{o}, {c}, 1, 1")),
        q = t(q_shape),
        s = t(""),
        y = t(&format!("1, {o}, {hw}, {hw}")),
    )
}

#[test]
fn a_program_of_convolution_steps_runs_as_them() {
    let (c, o, hw) = (16usize, 24usize, 28usize);
    let out = format!("1, {o}, {hw}, {hw}");
    let chan = format!("1, {o}, 1, 1");
    // `head`, then SiLU of its result as the exporters write it.
    let then_silu = |head: &str| -> Vec<String> {
        vec![
            head.to_string(),
            "lv2 = R.sigmoid(lv1)".into(),
            "gv = R.multiply(lv1, lv2)".into(),
        ]
    };
    let relu6 = "R.clip(lv1, R.prim_value(T.float32(0.0)), R.prim_value(T.float32(6.0)))";
    // (q's shape, the tail, the steps expected: `None` where the program stays a program).
    type Want = Option<Vec<&'static str>>;
    let cases: Vec<(String, Vec<String>, Want)> = vec![
        (
            chan.clone(),
            then_silu("lv1 = R.add(lv, q)"),
            Some(vec!["Bias(first: false)", "Silu"]),
        ),
        (
            chan.clone(),
            vec!["lv1 = R.add(q, lv)".into(), "gv = R.nn.relu(lv1)".into()],
            Some(vec!["Bias(first: true)", "Relu"]),
        ),
        (
            out.clone(),
            vec!["lv1 = R.add(lv, q)".into(), format!("gv = {relu6}")],
            Some(vec!["Residual(first: true)", "Clip"]),
        ),
        (
            chan.clone(),
            then_silu("lv1 = R.add(s, lv)"),
            Some(vec!["Bias(first: true)", "Silu"]),
        ),
        // A multiply, a spatial broadcast, a hardswish: programs.
        (chan.clone(), then_silu("lv1 = R.multiply(lv, q)"), None),
        (
            format!("1, 1, {hw}, {hw}"),
            then_silu("lv1 = R.add(lv, q)"),
            None,
        ),
        (
            chan.clone(),
            vec![
                "lv1 = R.add(lv, q)".into(),
                "lv2 = R.add(lv1, s)".into(),
                "lv3 = R.clip(lv2, R.prim_value(T.float32(0.0)), R.prim_value(T.float32(6.0)))"
                    .into(),
                "gv = R.multiply(lv1, lv3)".into(),
            ],
            None,
        ),
    ];
    let name = |s: &Step| match s {
        Step::Bias { bias_first, .. } => format!("Bias(first: {bias_first})"),
        Step::Residual { prev_first, .. } => format!("Residual(first: {prev_first})"),
        Step::Relu => "Relu".into(),
        Step::Clip { .. } => "Clip".into(),
        Step::Silu => "Silu".into(),
        s => format!("{s:?}"),
    };
    for (q_shape, tail, want) in cases {
        let tail: Vec<&str> = tail.iter().map(String::as_str).collect();
        let src = pointwise_group(c, o, hw, &q_shape, &tail);
        let m = fusebox_core::text::parse_module_str(&src).unwrap_or_else(|e| panic!("{e}"));
        let group = compile(m.get("fused").unwrap()).unwrap();
        let mut r = Rng(29);
        let q_dims: Vec<usize> = q_shape.split(", ").map(|d| d.parse().unwrap()).collect();
        let mut x = r.tensor(&[1, c, hw, hw]).to_f32_vec();
        x[..EDGES.len()].copy_from_slice(&EDGES);
        let args = [
            Tensor::from_f32(vec![1, c, hw, hw], x).unwrap(),
            r.tensor(&[o, c, 1, 1]),
            r.tensor(&q_dims),
            Tensor::from_f32(vec![], vec![0.5]).unwrap(),
        ];
        let leaves = param_leaves(&group.prog, &args);
        let bound = bind(&group.prog, &leaves, Some(&[1, o, hw, hw])).unwrap();
        let got = bound
            .conv_steps()
            .map(|s| s.iter().map(name).collect::<Vec<_>>());
        assert_eq!(
            got,
            want.map(|w| w.iter().map(|s| s.to_string()).collect()),
            "{tail:?}"
        );
        // The per-channel values are the bias's, a scalar's repeated.
        if let Some(steps) = bound.conv_steps()
            && let Step::Bias { b, .. } = &steps[0]
        {
            let want = if tail[0].contains("(s, lv)") {
                vec![0.5; o]
            } else {
                args[2].to_f32_vec()
            };
            assert_eq!(b, &want);
        }
        // Either way the group gives the op-by-op bits (the steps in the 1×1 kernel's
        // registers on AVX-512).
        let ops: Vec<String> = tail
            .iter()
            .map(|b| op_name(b.split_once(" = ").map_or(*b, |(_, e)| e)))
            .collect();
        check(
            &src,
            &args.map(Value::Tensor),
            &format!("relax.nn.conv2d+{}", ops.join("+")),
        );
    }
}
