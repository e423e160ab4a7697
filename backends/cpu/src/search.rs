//! Search ops (issue 17): `argmax` / `argmin` along one axis (or over the flattened tensor),
//! and `topk` along one axis.
//!
//! Values compare in `f64` for floats (exact for every float dtype) and in `i64` for integers
//! and `bool`. As numpy: `argmax`/`argmin` return the first index of the extreme value and a
//! NaN counts as the extreme; `topk` orders NaN above every number, and equal values keep
//! their index order (the smaller index first), as ONNX's reference. An empty axis (for
//! `argmax`/`argmin` with outputs to fill) or `k` beyond the axis is an error.
//!
//! ```text
//! i: R.Tensor((2,), dtype="int64") = R.argmax(x, axis=1, keepdims=False)   # x: [[1, 3, 3], [4, 0, 2]] → [1, 0]
//! t = R.topk(x, k=2, axis=-1, ret_type="both", largest=True, dtype="int64")
//!     # values [[3, 3], [4, 2]], indices [[1, 2], [0, 2]]
//! ```

use crate::reduce::around;
use crate::util::{KResult, norm_axis, tensor};
use fusebox_core::ir::DType;
use fusebox_core::runtime::{Storage, Tensor};
use std::cmp::Ordering;

/// The elements as compare keys: `f64` for floats, `i64` for integers and `bool` (widening
/// an `i64` to `f64` would not be exact).
enum Keys {
    F(Vec<f64>),
    I(Vec<i64>),
}

impl Keys {
    fn of(t: &Tensor) -> Keys {
        if t.dtype().is_float() {
            Keys::F(t.to_f64_vec())
        } else {
            Keys::I(t.to_i64_vec())
        }
    }

    /// `a` against `b` with NaN above every number (and equal to NaN).
    fn cmp(&self, a: usize, b: usize) -> Ordering {
        match self {
            Keys::F(v) => {
                let (x, y) = (v.get(a).copied(), v.get(b).copied());
                match (x, y) {
                    (Some(x), Some(y)) => match (x.is_nan(), y.is_nan()) {
                        (true, true) => Ordering::Equal,
                        (true, false) => Ordering::Greater,
                        (false, true) => Ordering::Less,
                        (false, false) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
                    },
                    _ => Ordering::Equal,
                }
            }
            Keys::I(v) => v.get(a).cmp(&v.get(b)),
        }
    }
}

/// `argmax` (`largest`) or `argmin` along `axis` (`None`: over every element), int64.
pub(crate) fn arg_reduce(
    t: &Tensor,
    axis: Option<i64>,
    keepdims: bool,
    largest: bool,
) -> KResult<Tensor> {
    let r = t.rank();
    let (outer, len, inner, out_shape) = match axis {
        Some(a) => {
            let ax = norm_axis(a, r)?;
            let (o, l, i) = around(t.shape(), ax);
            let mut shape = t.shape().to_vec();
            if keepdims {
                shape[ax] = 1;
            } else {
                shape.remove(ax);
            }
            (o, l, i, shape)
        }
        None => {
            let shape = if keepdims { vec![1; r] } else { vec![] };
            (1, t.numel(), 1, shape)
        }
    };
    let n_out = outer * inner;
    if len == 0 && n_out > 0 {
        return Err(format!(
            "{} over an empty extent",
            if largest { "argmax" } else { "argmin" }
        ));
    }
    let keys = Keys::of(t);
    // A NaN is the extreme either way (numpy's argmax and argmin both return the first NaN).
    let is_nan = |i: usize| matches!(&keys, Keys::F(v) if v.get(i).is_some_and(|x| x.is_nan()));
    let mut out = Vec::with_capacity(n_out);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * len + j) * inner + i;
            let mut best = 0usize;
            for j in 1..len {
                if is_nan(at(best)) {
                    break;
                }
                let c = keys.cmp(at(j), at(best));
                let better = if largest {
                    c == Ordering::Greater
                } else {
                    c == Ordering::Less || is_nan(at(j))
                };
                if better {
                    best = j;
                }
            }
            out.push(i64::try_from(best).map_err(|_| "index out of range".to_string())?);
        }
    }
    tensor(out_shape, Storage::from_i64(DType::I64, out))
}

/// `topk` along `axis`: the `k` largest (or smallest) values in order, and their indices.
pub(crate) fn topk(
    t: &Tensor,
    k: i64,
    axis: i64,
    largest: bool,
    idx_dtype: DType,
) -> KResult<(Tensor, Tensor)> {
    let ax = norm_axis(axis, t.rank())?;
    let (outer, len, inner) = around(t.shape(), ax);
    let k = usize::try_from(k).map_err(|_| format!("k must not be negative, found {k}"))?;
    if k > len {
        return Err(format!(
            "k = {k} is larger than the extent {len} of axis {axis}"
        ));
    }
    if !idx_dtype.is_int() {
        return Err(format!(
            "the indices need an integer dtype, found {idx_dtype}"
        ));
    }
    let keys = Keys::of(t);
    let mut shape = t.shape().to_vec();
    shape[ax] = k;
    let n = outer
        .checked_mul(k)
        .and_then(|v| v.checked_mul(inner))
        .ok_or("the output is too large")?;
    let mut src = vec![0usize; n];
    let mut idx = vec![0i64; n];
    let mut order: Vec<usize> = Vec::with_capacity(len);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * len + j) * inner + i;
            order.clear();
            order.extend(0..len);
            // A stable sort keeps equal values in index order.
            order.sort_by(|&a, &b| {
                let c = keys.cmp(at(a), at(b));
                if largest { c.reverse() } else { c }
            });
            for (r, &j) in order.iter().take(k).enumerate() {
                let dst = (o * k + r) * inner + i;
                src[dst] = at(j);
                idx[dst] = i64::try_from(j).map_err(|_| "index out of range".to_string())?;
            }
        }
    }
    let values = match &keys {
        Keys::F(v) => Storage::from_f64(
            t.dtype(),
            src.iter()
                .map(|&s| v.get(s).copied().unwrap_or(0.0))
                .collect(),
        ),
        Keys::I(v) => Storage::from_i64(
            t.dtype(),
            src.iter()
                .map(|&s| v.get(s).copied().unwrap_or(0))
                .collect(),
        ),
    };
    Ok((
        tensor(shape.clone(), values)?,
        tensor(shape, Storage::from_i64(idx_dtype, idx))?,
    ))
}
