//! Type inference under random shapes and attributes, extreme values included (0, ±1, 2^31,
//! 10^6, 2^40, 2^40 + 1, 2^62, i64::MAX, i64::MIN, symbolic dims): building an op and
//! inferring its result never panics, and a result never holds a wrapped or out-of-range dim
//! (every static extent in `0..=MAX_DIM`, every dim printable as text the parser reads back).
//! Where the result has a closed form (conv2d, pooling, tile, pad), it equals the form computed
//! in `i128`, and inference is an error exactly when that form leaves `0..=MAX_DIM`.

#![allow(clippy::panic, reason = "test code: a failure is a panic")]

use fusebox_core::ir::{DType, Dim, MAX_DIM, Type};
use fusebox_core::op::{AttrLit, Op};
use proptest::prelude::*;

const EXTREMES: &[i64] = &[
    0,
    1,
    2,
    3,
    7,
    -1,
    -2,
    1 << 31,
    1_000_000,
    1 << 40,
    (1 << 40) + 1,
    1 << 62,
    i64::MAX,
    i64::MIN,
];

fn int() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => prop::sample::select(EXTREMES),
        2 => 0i64..9,
        1 => any::<i64>(),
    ]
}

fn extent() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => 0i64..9,
        1 => prop::sample::select(&[0i64, 1, 1 << 20, 1_000_000, 1 << 40][..]),
    ]
}

fn dim() -> impl Strategy<Value = Dim> {
    prop_oneof![
        4 => extent().prop_map(Dim::Static),
        1 => prop::sample::select(&["n", "m"][..]).prop_map(Dim::sym),
        1 => extent().prop_map(|c| Dim::sym("n").add(&Dim::Static(c))),
    ]
}

fn tensor() -> impl Strategy<Value = Type> {
    (prop::collection::vec(dim(), 0..5), any::<bool>())
        .prop_map(|(d, float)| Type::tensor_dims(d, if float { DType::F32 } else { DType::I64 }))
}

fn arg() -> impl Strategy<Value = Type> {
    prop_oneof![
        6 => tensor(),
        2 => prop::collection::vec(dim(), 0..5).prop_map(Type::shape),
        1 => prop::collection::vec(tensor(), 1..4).prop_map(Type::Tuple),
        1 => Just(Type::Prim(DType::I64)),
    ]
}

fn lit() -> impl Strategy<Value = AttrLit> {
    let strs = &[
        "NCHW",
        "NHWC",
        "OIHW",
        "HWIO",
        "float32",
        "int64",
        "update",
        "add",
        "constant",
        "edge",
        "reflect",
        "both",
        "values",
        "indices",
        "linear",
        "nearest_neighbor",
        "cubic",
        "half_pixel",
        "align_corners",
        "asymmetric",
        "round",
        "floor",
        "ceil",
        "ij,jk->ik",
        "ii->i",
        "fast",
    ][..];
    prop_oneof![
        4 => prop::collection::vec(int().prop_map(AttrLit::Int), 0..9).prop_map(AttrLit::List),
        3 => int().prop_map(AttrLit::Int),
        1 => any::<bool>().prop_map(AttrLit::Bool),
        1 => prop::sample::select(strs).prop_map(|s| AttrLit::Str(s.to_string())),
        1 => prop::sample::select(&[0.0, 0.5, -1.5, 1e300, f64::NAN, f64::INFINITY][..])
            .prop_map(AttrLit::Float),
        1 => Just(AttrLit::None),
    ]
}

/// Panics unless every dim of `t` is in range (see the module doc).
fn assert_in_range(op: &str, t: &Type) {
    let dims: Vec<&Dim> = match t {
        Type::Tensor(tt) => tt.dims.iter().flat_map(|d| d.iter()).collect(),
        Type::Shape { dims, .. } => dims.iter().flatten().collect(),
        Type::Tuple(ts) => {
            ts.iter().for_each(|t| assert_in_range(op, t));
            return;
        }
        _ => return,
    };
    for d in dims {
        if let Some(v) = d.as_static() {
            assert!((0..=MAX_DIM).contains(&v), "{op}: dim {v} in {t:?}");
        }
        assert!(d.out_of_range().is_none(), "{op}: dim `{d}` in {t:?}");
    }
}

fn build(name: &str, kw: &[(&str, AttrLit)]) -> Result<Op, String> {
    let kw: Vec<(String, AttrLit)> = kw.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    Op::from_call(name, &kw)
}

fn ints(v: &[i64]) -> AttrLit {
    AttrLit::List(v.iter().map(|&i| AttrLit::Int(i)).collect())
}

/// The static dims of a tensor result.
fn static_dims(t: &Type) -> Vec<i64> {
    let Type::Tensor(tt) = t else {
        panic!("expected a tensor, found {t:?}");
    };
    tt.dims
        .iter()
        .flat_map(|d| d.iter())
        .map(|d| d.as_static().unwrap_or(-1))
        .collect()
}

/// `(i + p0 + p1 - d * (k - 1) - 1) // s + 1` in `i128` (floor division).
fn window(i: i64, k: i64, s: i64, p0: i64, p1: i64, d: i64) -> i128 {
    let num =
        i128::from(i) + i128::from(p0) + i128::from(p1) - i128::from(d) * (i128::from(k) - 1) - 1;
    num.div_euclid(i128::from(s)) + 1
}

/// Checks a result against closed-form dims: equal when all are in `min..=MAX_DIM`, an error
/// otherwise.
fn check_form(op: &str, got: Result<Type, String>, want: &[i128], min: i128) {
    let fits = want
        .iter()
        .all(|&w| (min..=i128::from(MAX_DIM)).contains(&w));
    match got {
        Ok(t) => {
            assert!(fits, "{op}: expected an error for dims {want:?}, got {t:?}");
            let want: Vec<i64> = want.iter().map(|&w| w as i64).collect();
            assert_eq!(static_dims(&t), want, "{op}");
        }
        Err(e) => assert!(!fits, "{op}: expected dims {want:?}, got the error {e}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Any op of the op set, any attributes its signature names, any arguments.
    #[test]
    fn inference_never_panics_or_wraps(
        which in any::<prop::sample::Index>(),
        picks in prop::collection::vec((any::<bool>(), lit()), 8),
        args in prop::collection::vec(arg(), 0..4),
    ) {
        let names = Op::names();
        let name = names[which.index(names.len())];
        let Some(sig) = Op::signature(name) else { return Ok(()); };
        let kw: Vec<(&str, AttrLit)> = sig
            .attr_names
            .iter()
            .zip(&picks)
            .filter(|(_, (on, _))| *on)
            .map(|(n, (_, v))| (*n, v.clone()))
            .collect();
        let Ok(op) = build(name, &kw) else { return Ok(()); };
        let n = args.len().clamp(sig.min_args, sig.max_args.max(sig.min_args));
        let mut args = args;
        args.resize(n, Type::tensor(&[2, 3], DType::F32));
        let refs: Vec<&Type> = args.iter().collect();
        if let Ok(t) = op.infer(&refs) {
            assert_in_range(name, &t);
        }
    }

    /// conv2d (NCHW/OIHW) and max/avg pooling: the output extent of a window.
    #[test]
    fn windows_match_their_closed_form(
        (h, w) in (extent(), extent()),
        (kh, kw) in (0i64..5, 0i64..5),
        strides in prop::collection::vec(int(), 2),
        pads in prop::collection::vec(int(), 4),
        dil in prop::collection::vec(int(), 2),
    ) {
        let x = Type::tensor(&[1, 2, h, w], DType::F32);
        let wt = Type::tensor(&[3, 2, kh, kw], DType::F32);
        let kw_attrs = [
            ("strides", ints(&strides)),
            ("padding", ints(&pads)),
            ("dilation", ints(&dil)),
        ];
        if let Ok(op) = build("relax.nn.conv2d", &kw_attrs) {
            let want = [
                1,
                3,
                window(h, kh, strides[0], pads[0], pads[2], dil[0]),
                window(w, kw, strides[1], pads[1], pads[3], dil[1]),
            ];
            check_form("conv2d", op.infer(&[&x, &wt]), &want, 0);
        }
        for pool in ["relax.nn.max_pool2d", "relax.nn.avg_pool2d"] {
            let mut kw_attrs = kw_attrs.to_vec();
            kw_attrs.push(("pool_size", ints(&[kh, kw])));
            if let Ok(op) = build(pool, &kw_attrs) {
                let want = [
                    1,
                    2,
                    window(h, kh, strides[0], pads[0], pads[2], dil[0]),
                    window(w, kw, strides[1], pads[1], pads[3], dil[1]),
                ];
                // A pooling window must fit: an empty output is an error.
                check_form(pool, op.infer(&[&x]), &want, 1);
            }
        }
    }

    /// tile and pad: products and sums of extents.
    #[test]
    fn tile_and_pad_match_their_closed_form(
        shape in prop::collection::vec(extent(), 1..4),
        reps in prop::collection::vec(int(), 1..4),
        pads in prop::collection::vec(int(), 8),
    ) {
        let x = Type::tensor(&shape, DType::F32);
        if let Ok(op) = build("relax.tile", &[("repeats", ints(&reps))]) {
            let n = shape.len().max(reps.len());
            let get = |v: &[i64], i: usize| {
                (i + v.len()).checked_sub(n).map_or(1, |j| i128::from(v[j]))
            };
            let want: Vec<i128> = (0..n).map(|i| get(&shape, i) * get(&reps, i)).collect();
            check_form("tile", op.infer(&[&x]), &want, 0);
        }
        let pw = &pads[..2 * shape.len()];
        if let Ok(op) = build("relax.nn.pad", &[("pad_width", ints(pw))]) {
            let want: Vec<i128> = shape
                .iter()
                .enumerate()
                .map(|(i, &d)| i128::from(d) + i128::from(pw[2 * i]) + i128::from(pw[2 * i + 1]))
                .collect();
            check_form("pad", op.infer(&[&x]), &want, 0);
        }
    }
}
