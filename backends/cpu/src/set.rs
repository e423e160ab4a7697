//! The kernels of the value-dependent ops: `relax.nonzero`, `relax.unique` and
//! `relax.vision.all_class_non_max_suppression` (see `fusebox_core::op`'s `set` module for
//! their types).
//!
//! Contract:
//!
//! - `nonzero(x)`: `int64` of shape `(max(rank, 1), nnz)`, column `j` the index of the `j`-th
//!   non-zero element in row-major order (NaN is non-zero, `-0.0` is zero; a rank-0 input has
//!   the one index 0), as numpy's `nonzero` and ONNX's `NonZero`.
//! - `unique(x)`: numpy's `unique` as ONNX's `Unique` defines it: the distinct elements (or,
//!   with `axis`, the distinct slices along it, compared element by element in row-major
//!   order), ascending when `sorted`, else in order of first occurrence; `-0.0` equals `0.0`
//!   and every NaN equals every other (NaNs sort last). Then, as asked, the index of each
//!   value's first occurrence, the inverse (per element or slice of `x`, the index of its
//!   value in the result) and the counts, all `int64`.
//! - `all_class_non_max_suppression`: ONNX's `NonMaxSuppression` with corner boxes (any two
//!   opposite corners, `[y1, x1, y2, x2]`): per batch and class, the boxes whose score exceeds
//!   `score_threshold` (all of them when it is `-inf`), highest score first (ties: lower box
//!   index first), each kept unless its IoU with a box already kept in that class exceeds
//!   `iou_threshold`, at most `max_output_boxes_per_class` (below 0: none) per class. IoU in
//!   `f32` for `f16`/`bf16`/`f32` boxes (as ONNX's reference on `float32`), `f64` for `f64`.
//!   The result: `(B·C·N, 3)` rows `[batch, class, box]`, the kept ones first in batch, class,
//!   selection order, zeros after them, and their count as a `(1,)` tensor.
//!
//! ```text
//! nonzero([[1, 0], [0, 3]])                      = [[0, 1], [0, 1]]
//! unique([2, 1, 1, 3], sorted=False, counts)     = ([2, 1, 3], [1, 2, 1])
//! ```

use crate::util::{KResult, norm_axis, strides, tensor};
use fusebox_core::ir::DType;
use fusebox_core::op::UniqueAttrs;
use fusebox_core::runtime::{Storage, StorageRef, Tensor, Value};
use std::cmp::Ordering;

/// Whether each element is non-zero.
fn nonzero_mask(x: &Tensor) -> Vec<bool> {
    match x.storage() {
        StorageRef::Bool(v) => v.to_vec(),
        StorageRef::I8(v) => v.iter().map(|&a| a != 0).collect(),
        StorageRef::U8(v) => v.iter().map(|&a| a != 0).collect(),
        StorageRef::I32(v) => v.iter().map(|&a| a != 0).collect(),
        StorageRef::I64(v) => v.iter().map(|&a| a != 0).collect(),
        // Floats: NaN != 0 holds; -0.0 == 0.0.
        _ => x.to_f64_vec().iter().map(|&a| a != 0.0).collect(),
    }
}

/// `relax.nonzero`.
pub(crate) fn nonzero(x: &Tensor) -> KResult<Tensor> {
    let mask = nonzero_mask(x);
    let nnz = mask.iter().filter(|&&m| m).count();
    let shape = x.shape();
    let rows = shape.len().max(1);
    fusebox_core::runtime::check_alloc("relax.nonzero", DType::I64, &[rows, nnz])
        .map_err(|e| e.to_string())?;
    let st = strides(shape);
    let mut out = vec![0i64; rows * nnz];
    for (j, i) in mask
        .iter()
        .enumerate()
        .filter(|(_, m)| **m)
        .map(|(i, _)| i)
        .enumerate()
    {
        for (axis, (&s, &n)) in st.iter().zip(shape).enumerate() {
            out[axis * nnz + j] = ((i / s) % n) as i64;
        }
    }
    tensor(vec![rows, nnz], Storage::from_i64(DType::I64, out))
}

/// An element as a sort key: integers exactly, floats with `-0.0` as `0.0` and one NaN.
#[derive(Clone, Copy, PartialEq)]
enum Key {
    I(i64),
    F(f64),
}

impl Key {
    fn cmp(&self, other: &Key) -> Ordering {
        match (self, other) {
            (Key::I(a), Key::I(b)) => a.cmp(b),
            (Key::F(a), Key::F(b)) => a.total_cmp(b),
            // One tensor has one dtype: never mixed.
            (Key::I(_), Key::F(_)) => Ordering::Less,
            (Key::F(_), Key::I(_)) => Ordering::Greater,
        }
    }
}

fn keys(x: &Tensor) -> Vec<Key> {
    if x.dtype().is_float() {
        x.to_f64_vec()
            .into_iter()
            .map(|v| {
                Key::F(if v.is_nan() {
                    f64::NAN
                } else if v == 0.0 {
                    0.0
                } else {
                    v
                })
            })
            .collect()
    } else {
        x.to_i64_vec().into_iter().map(Key::I).collect()
    }
}

/// Picks the elements of `x` at `src` (flat offsets) into a tensor of `shape`.
fn pick(x: &Tensor, shape: Vec<usize>, src: &[usize]) -> KResult<Tensor> {
    macro_rules! go {
        ($($var:ident),*) => {
            match x.storage() {
                $(StorageRef::$var(v) => Storage::$var(src.iter().map(|&i| v[i]).collect()),)*
            }
        };
    }
    let data = go!(F16, BF16, F32, F64, I8, U8, I32, I64, Bool);
    tensor(shape, data)
}

/// `relax.unique`: a tensor, or a tuple with the extra outputs asked for.
pub(crate) fn unique(x: &Tensor, a: &UniqueAttrs) -> KResult<Value> {
    let k = keys(x);
    let shape = x.shape().to_vec();
    // Slices: `n` of them along the axis (moved to the front), `len` elements each, element
    // `e` of slice `s` at flat offset `at(s, e)` of `x`.
    let (axis, n, len) = match a.axis {
        None => (None, k.len(), 1),
        Some(ax) => {
            let ax = norm_axis(ax, shape.len())?;
            let n = shape[ax];
            (Some(ax), n, k.len().checked_div(n).unwrap_or(0))
        }
    };
    let inner = axis.map_or(1, |ax| shape[ax + 1..].iter().product::<usize>());
    let at = |s: usize, e: usize| match axis {
        None => s,
        // Element e of the slice: outer index e / inner, inner index e % inner.
        Some(_) => ((e / inner) * n + s) * inner + e % inner,
    };
    let cmp = |p: &usize, q: &usize| -> Ordering {
        for e in 0..len {
            let o = k[at(*p, e)].cmp(&k[at(*q, e)]);
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    };
    // Stable: within a group of equal slices the first occurrence comes first.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(cmp);
    // Groups of equal slices, in ascending order: (first occurrence, count).
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let mut group_of = vec![0usize; n];
    for (pos, &s) in order.iter().enumerate() {
        let new = pos == 0 || cmp(&order[pos - 1], &s) != Ordering::Equal;
        if new {
            groups.push((s, 0));
        }
        let g = groups.len() - 1;
        groups[g].1 += 1;
        group_of[s] = g;
    }
    // The output order of the groups, and each group's place in it.
    let mut out_order: Vec<usize> = (0..groups.len()).collect();
    if !a.sorted {
        out_order.sort_by_key(|&g| groups[g].0);
    }
    let mut place = vec![0usize; groups.len()];
    for (p, &g) in out_order.iter().enumerate() {
        place[g] = p;
    }
    let u = groups.len();
    let mut src = Vec::with_capacity(u * len);
    let values = match axis {
        None => {
            src.extend(out_order.iter().map(|&g| groups[g].0));
            pick(x, vec![u], &src)?
        }
        Some(ax) => {
            let mut out_shape = shape.clone();
            out_shape[ax] = u;
            // Row-major over the output: outer index, then slice, then inner index.
            let outer: usize = shape[..ax].iter().product();
            for o in 0..outer {
                for &g in &out_order {
                    let s = groups[g].0;
                    for i in 0..inner {
                        src.push((o * n + s) * inner + i);
                    }
                }
            }
            pick(x, out_shape, &src)?
        }
    };
    if !a.returns_tuple() {
        return Ok(Value::Tensor(values));
    }
    let ints = |v: Vec<i64>| -> KResult<Value> {
        Ok(Value::Tensor(tensor(
            vec![v.len()],
            Storage::from_i64(DType::I64, v),
        )?))
    };
    let mut out = vec![Value::Tensor(values)];
    if a.return_index {
        out.push(ints(
            out_order.iter().map(|&g| groups[g].0 as i64).collect(),
        )?);
    }
    if a.return_inverse {
        out.push(ints((0..n).map(|s| place[group_of[s]] as i64).collect())?);
    }
    if a.return_counts {
        out.push(ints(
            out_order.iter().map(|&g| groups[g].1 as i64).collect(),
        )?);
    }
    Ok(Value::Tuple(out))
}

/// One value of a threshold tensor.
fn one_value(t: &Tensor, what: &str) -> KResult<f64> {
    match t.to_f64_vec().as_slice() {
        [v] => Ok(*v),
        v => Err(format!(
            "expected {what} to hold one value, found {}",
            v.len()
        )),
    }
}

/// Whether corner boxes `a` and `b` (`[y1, x1, y2, x2]`, any two opposite corners) overlap by
/// an IoU above `thr`, in `T` arithmetic as ONNX's reference.
fn suppresses<T>(a: [T; 4], b: [T; 4], thr: T) -> bool
where
    T: Copy
        + PartialOrd
        + std::ops::Sub<Output = T>
        + std::ops::Mul<Output = T>
        + std::ops::Add<Output = T>
        + std::ops::Div<Output = T>
        + Default,
{
    let order = |p: T, q: T| if p >= q { (q, p) } else { (p, q) };
    let max = |p: T, q: T| if p >= q { p } else { q };
    let min = |p: T, q: T| if p <= q { p } else { q };
    let zero = T::default();
    let (ax0, ax1) = order(a[1], a[3]);
    let (bx0, bx1) = order(b[1], b[3]);
    let (ix0, ix1) = (max(ax0, bx0), min(ax1, bx1));
    if ix1 <= ix0 {
        return false;
    }
    let (ay0, ay1) = order(a[0], a[2]);
    let (by0, by1) = order(b[0], b[2]);
    let (iy0, iy1) = (max(ay0, by0), min(ay1, by1));
    if iy1 <= iy0 {
        return false;
    }
    let inter = (ix1 - ix0) * (iy1 - iy0);
    if inter <= zero {
        return false;
    }
    let area_a = (ax1 - ax0) * (ay1 - ay0);
    let area_b = (bx1 - bx0) * (by1 - by0);
    let union = area_a + area_b - inter;
    if area_a <= zero || area_b <= zero || union <= zero {
        return false;
    }
    inter / union > thr
}

/// `relax.vision.all_class_non_max_suppression` (ONNX output format).
pub(crate) fn all_class_nms(args: [&Tensor; 5]) -> KResult<Value> {
    let [boxes, scores, max_out, iou, score_thr] = args;
    let (bs, ss) = (boxes.shape(), scores.shape());
    if bs.len() != 3 || bs[2] != 4 || ss.len() != 3 || ss[0] != bs[0] || ss[2] != bs[1] {
        return Err(format!(
            "expected boxes (batch, boxes, 4) and scores (batch, classes, boxes), found {bs:?} \
             and {ss:?}"
        ));
    }
    let (nb, nc, n) = (ss[0], ss[1], ss[2]);
    let max_out = match max_out.to_i64_vec().as_slice() {
        [v] => (*v).max(0) as usize,
        v => {
            return Err(format!(
                "expected max_output_boxes_per_class to hold one value, found {}",
                v.len()
            ));
        }
    };
    let iou = one_value(iou, "iou_threshold")?;
    let score_thr = one_value(score_thr, "score_threshold")?;
    let wide = boxes.dtype() == DType::F64;
    let bx = boxes.to_f64_vec();
    let sc = scores.to_f64_vec();
    let corner = |b: usize, i: usize| -> [f64; 4] {
        let o = (b * n + i) * 4;
        [bx[o], bx[o + 1], bx[o + 2], bx[o + 3]]
    };
    let over = |p: [f64; 4], q: [f64; 4]| {
        if wide {
            suppresses(p, q, iou)
        } else {
            let f = |v: [f64; 4]| v.map(|c| c as f32);
            suppresses(f(p), f(q), iou as f32)
        }
    };
    let rows = nb * nc * n;
    let mut out = vec![0i64; rows * 3];
    let mut count = 0usize;
    for b in 0..nb {
        for c in 0..nc {
            let s = &sc[(b * nc + c) * n..(b * nc + c + 1) * n];
            let score_of = |i: usize| if wide { s[i] } else { s[i] as f32 as f64 };
            let thr = if wide {
                score_thr
            } else {
                score_thr as f32 as f64
            };
            let mut cand: Vec<usize> = (0..n)
                .filter(|&i| score_thr == f64::NEG_INFINITY || score_of(i) > thr)
                .collect();
            // Highest score first, ties by lower index (NaN scores last).
            cand.sort_by(|&p, &q| {
                score_of(q)
                    .partial_cmp(&score_of(p))
                    .unwrap_or_else(|| score_of(p).is_nan().cmp(&score_of(q).is_nan()))
                    .then(p.cmp(&q))
            });
            let mut kept: Vec<usize> = Vec::new();
            for i in cand {
                if kept.len() >= max_out {
                    break;
                }
                if kept.iter().all(|&j| !over(corner(b, i), corner(b, j))) {
                    kept.push(i);
                }
            }
            for i in kept {
                out[count * 3..count * 3 + 3].copy_from_slice(&[b as i64, c as i64, i as i64]);
                count += 1;
            }
        }
    }
    Ok(Value::Tuple(vec![
        Value::Tensor(tensor(vec![rows, 3], Storage::from_i64(DType::I64, out))?),
        Value::Tensor(tensor(
            vec![1],
            Storage::from_i64(DType::I64, vec![count as i64]),
        )?),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ints(t: &Value, i: usize) -> Vec<i64> {
        match t {
            Value::Tuple(f) => match &f[i] {
                Value::Tensor(t) => t.to_i64_vec(),
                v => panic!("field {i} is a {}", v.kind()),
            },
            v => panic!("expected a tuple, found {}", v.kind()),
        }
    }

    fn attrs(sorted: bool, axis: Option<i64>) -> UniqueAttrs {
        UniqueAttrs {
            sorted,
            return_index: true,
            return_inverse: true,
            return_counts: true,
            axis,
        }
    }

    /// Unique by definition: walk the elements, keep each value not seen before (quadratic,
    /// no sorting), then order by value when sorted.
    fn unique_definition(x: &[i64], sorted: bool) -> (Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>) {
        let mut firsts: Vec<usize> = Vec::new();
        for (i, v) in x.iter().enumerate() {
            if !firsts.iter().any(|&f| x[f] == *v) {
                firsts.push(i);
            }
        }
        if sorted {
            firsts.sort_by_key(|&f| x[f]);
        }
        let values = firsts.iter().map(|&f| x[f]).collect::<Vec<_>>();
        let inverse = x
            .iter()
            .map(|v| values.iter().position(|u| u == v).unwrap() as i64)
            .collect();
        let counts = values
            .iter()
            .map(|u| x.iter().filter(|v| *v == u).count() as i64)
            .collect();
        (
            values,
            firsts.iter().map(|&f| f as i64).collect(),
            inverse,
            counts,
        )
    }

    proptest! {
        #[test]
        fn unique_matches_its_definition(
            x in proptest::collection::vec(-4i64..4, 0..40),
            sorted in any::<bool>(),
        ) {
            let t = Tensor::from_i64(vec![x.len()], x.clone()).unwrap();
            let got = unique(&t, &attrs(sorted, None)).unwrap();
            let (values, firsts, inverse, counts) = unique_definition(&x, sorted);
            prop_assert_eq!(ints(&got, 0), values);
            prop_assert_eq!(ints(&got, 1), firsts);
            prop_assert_eq!(ints(&got, 2), inverse);
            prop_assert_eq!(ints(&got, 3), counts);
        }

        #[test]
        fn nonzero_lists_every_nonzero_element_in_row_major_order(
            x in proptest::collection::vec(prop_oneof![Just(0.0f32), Just(-0.0), Just(f32::NAN), -2.0f32..2.0], 12),
        ) {
            let t = Tensor::new(vec![3, 4], Storage::F32(x.clone())).unwrap();
            let nz = nonzero(&t).unwrap();
            let want: Vec<(i64, i64)> = (0..3)
                .flat_map(|r| (0..4).map(move |c| (r, c)))
                .filter(|&(r, c)| x[(r * 4 + c) as usize] != 0.0)
                .collect();
            prop_assert_eq!(nz.shape(), &[2, want.len()]);
            let v = nz.to_i64_vec();
            let got: Vec<(i64, i64)> = (0..want.len()).map(|j| (v[j], v[want.len() + j])).collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn unique_along_an_axis_compares_whole_slices() {
        // ONNX's example 3: rows [1, 0, 0] twice and [2, 3, 4].
        let x = Tensor::from_i64(vec![3, 3], vec![1, 0, 0, 1, 0, 0, 2, 3, 4]).unwrap();
        let got = unique(&x, &attrs(true, Some(0))).unwrap();
        let Value::Tuple(f) = &got else { panic!() };
        let Value::Tensor(y) = &f[0] else { panic!() };
        assert_eq!(y.shape(), &[2, 3]);
        assert_eq!(y.to_i64_vec(), [1, 0, 0, 2, 3, 4]);
        assert_eq!(ints(&got, 1), [0, 2]);
        assert_eq!(ints(&got, 2), [0, 0, 1]);
        assert_eq!(ints(&got, 3), [2, 1]);
        // Columns of a (2, 3) tensor, unsorted: column 2 equals column 0.
        let x = Tensor::from_i64(vec![2, 3], vec![5, 1, 5, 7, 0, 7]).unwrap();
        let got = unique(&x, &attrs(false, Some(-1))).unwrap();
        let Value::Tuple(f) = &got else { panic!() };
        let Value::Tensor(y) = &f[0] else { panic!() };
        assert_eq!(y.shape(), &[2, 2]);
        assert_eq!(y.to_i64_vec(), [5, 1, 7, 0]);
        assert_eq!(ints(&got, 2), [0, 1, 0]);
        // Floats: -0.0 equals 0.0, NaNs equal each other and sort last.
        let x = Tensor::new(
            vec![5],
            Storage::F32(vec![f32::NAN, 0.0, -0.0, 1.0, f32::NAN]),
        )
        .unwrap();
        let got = unique(&x, &attrs(true, None)).unwrap();
        assert_eq!(ints(&got, 3), [2, 1, 2]);
        assert_eq!(ints(&got, 1), [1, 3, 0]);
    }

    /// NMS by its definition, in f64 on corner boxes `[y1, x1, y2, x2]` with y1 < y2, x1 < x2.
    fn iou(a: [f64; 4], b: [f64; 4]) -> f64 {
        let ih = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
        let iw = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
        let inter = ih * iw;
        let area = |r: [f64; 4]| (r[2] - r[0]) * (r[3] - r[1]);
        inter / (area(a) + area(b) - inter)
    }

    #[test]
    fn nms_keeps_the_best_box_of_each_overlapping_group_per_class() {
        // Six boxes: three overlapping near the origin, two near (10, 10), one alone.
        let boxes: Vec<f32> = vec![
            0.0, 0.0, 1.0, 1.0, //
            0.0, 0.1, 1.0, 1.1, //
            0.0, -0.1, 1.0, 0.9, //
            10.0, 10.0, 11.0, 11.0, //
            10.0, 10.1, 11.0, 11.1, //
            0.0, 100.0, 1.0, 101.0,
        ];
        let scores: Vec<f32> = vec![
            0.9, 0.75, 0.6, 0.95, 0.5, 0.3, // class 0
            0.1, 0.2, 0.3, 0.4, 0.5, 0.6, // class 1
        ];
        let b = Tensor::new(vec![1, 6, 4], Storage::F32(boxes.clone())).unwrap();
        let s = Tensor::new(vec![1, 2, 6], Storage::F32(scores.clone())).unwrap();
        let run = |max: i64, iou_thr: f32, score_thr: f32| {
            let m = Tensor::from_i64(vec![1], vec![max]).unwrap();
            let i = Tensor::new(vec![1], Storage::F32(vec![iou_thr])).unwrap();
            let st = Tensor::new(vec![1], Storage::F32(vec![score_thr])).unwrap();
            let out = all_class_nms([&b, &s, &m, &i, &st]).unwrap();
            let n = ints(&out, 1)[0] as usize;
            let rows = ints(&out, 0);
            assert!(rows[n * 3..].iter().all(|&v| v == 0), "padding is zeros");
            rows[..n * 3]
                .chunks(3)
                .map(|r| r.to_vec())
                .collect::<Vec<_>>()
        };
        // The definition: per class, candidates above the score threshold by descending score,
        // each kept when its IoU with every kept box is at most the threshold.
        let define = |max: usize, iou_thr: f64, score_thr: f64| {
            let mut out = Vec::new();
            for c in 0..2 {
                let mut cand: Vec<usize> = (0..6)
                    .filter(|&i| f64::from(scores[c * 6 + i]) > score_thr)
                    .collect();
                cand.sort_by(|&p, &q| scores[c * 6 + q].total_cmp(&scores[c * 6 + p]));
                let corner = |i: usize| {
                    let v = &boxes[i * 4..i * 4 + 4];
                    [v[0], v[1], v[2], v[3]].map(f64::from)
                };
                let mut kept: Vec<usize> = Vec::new();
                for i in cand {
                    if kept.len() < max
                        && kept.iter().all(|&k| iou(corner(i), corner(k)) <= iou_thr)
                    {
                        kept.push(i);
                    }
                }
                out.extend(kept.into_iter().map(|i| vec![0, c as i64, i as i64]));
            }
            out
        };
        for (max, iou_thr, score_thr) in [
            (3, 0.5, 0.0),
            (1, 0.5, 0.0),
            (6, 0.95, 0.0),
            (6, 0.5, 0.45),
            (0, 0.5, 0.0),
        ] {
            assert_eq!(
                run(max, iou_thr, score_thr),
                define(max as usize, f64::from(iou_thr), f64::from(score_thr)),
                "max {max}, iou {iou_thr}, score {score_thr}"
            );
        }
        // Class 0 with IoU 0.5: boxes 3 (0.95), 0 (0.9), 5 (0.3); the others overlap.
        assert_eq!(
            run(6, 0.5, 0.0)[..3],
            [vec![0, 0, 3], vec![0, 0, 0], vec![0, 0, 5]]
        );
        // No score threshold (-inf) keeps a box of score -inf; a finite one drops it.
        let s2 = Tensor::new(vec![1, 1, 1], Storage::F32(vec![f32::NEG_INFINITY])).unwrap();
        let b2 = Tensor::new(vec![1, 1, 4], Storage::F32(vec![0.0, 0.0, 1.0, 1.0])).unwrap();
        let m = Tensor::from_i64(vec![1], vec![5]).unwrap();
        let i = Tensor::new(vec![1], Storage::F32(vec![0.5])).unwrap();
        for (thr, n) in [(f32::NEG_INFINITY, 1), (-1e30, 0)] {
            let st = Tensor::new(vec![1], Storage::F32(vec![thr])).unwrap();
            let out = all_class_nms([&b2, &s2, &m, &i, &st]).unwrap();
            assert_eq!(ints(&out, 1), [n]);
        }
        // Mismatched shapes are an error, not a panic.
        let bad = Tensor::new(vec![1, 5, 4], Storage::F32(vec![0.0; 20])).unwrap();
        assert!(all_class_nms([&bad, &s, &m, &i, &i]).is_err());
    }
}
