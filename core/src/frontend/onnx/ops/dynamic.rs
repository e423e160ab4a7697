//! `Range` and `Slice` whose bounds are symbolic dims (computed from input shapes), so models
//! exported with dynamic sequence axes keep symbolic shapes instead of failing at import.
//!
//! Contract:
//!
//! - `Range(start, limit, delta)` with static integral `start` and `delta` and a symbolic
//!   `limit` (GPT-2's and LLaMA's position ids, `arange(seq)`) has `n = ceil((limit − start) /
//!   delta)` elements, a symbolic dim. It is built as `start + delta · cumsum(ones(n),
//!   exclusive)`: `ones(n)` is a `broadcast_to` of a shape literal, so the length comes from the
//!   bound dims at run time.
//! - `Slice` with a symbolic `start` or `end` on some axis: when the slice is that axis whole
//!   (`0 .. dim`, step 1) it is dropped; otherwise the axis is gathered with `take` at
//!   `start + step · iota(n)`. Symbolic bounds are assumed inside the axis (as TVM's
//!   `assume_inbound`); an index that is not is an error when the model runs, never a silent
//!   wrong value. Axes with static bounds are sliced as usual.
//! - Anything else symbolic (a symbolic step, a non-integral float range) is an error naming
//!   what must be static.
//!
//! ```text
//! p = Range(0, Gather(Shape(ids), 1), 1)      # ids: int64[batch, seq]
//!   → lv = R.broadcast_to(R.const(1, "int64"), R.shape([seq]))
//!     p = R.cumsum(lv, axis=0, dtype=None, exclusive=True)     # R.Tensor((seq,), "int64")
//! ```

use super::super::{Importer, NodeProto, Out, Val, input, invalid, normalize_axis, req};
use crate::error::Result;
use crate::ir::{Constant, DType, Dim, ExprId};
use crate::op::{Op, ScanAttrs, StridedSliceAttrs, TakeMode};

/// `0, 1, …, n-1` as a 1-D tensor of `dtype` whose length is the dim `n`.
fn iota(im: &mut Importer<'_>, n: Dim, dtype: DType) -> Result<ExprId> {
    let one = im.b.constant(Constant::scalar_i64(1, dtype));
    let shape = im.b.shape(vec![n]);
    let ones = im.emit(Op::BroadcastTo, vec![one, shape])?;
    im.emit(
        Op::Cumsum(Box::new(ScanAttrs {
            axis: Some(0),
            dtype: None,
            exclusive: true,
        })),
        vec![ones],
    )
}

/// `start + step · iota(n)` (the multiply and add left out when they are identities).
fn affine_iota(
    im: &mut Importer<'_>,
    start: i64,
    step: i64,
    n: Dim,
    dtype: DType,
) -> Result<ExprId> {
    let mut v = iota(im, n, dtype)?;
    if step != 1 {
        let s = im.b.constant(Constant::scalar_i64(step, dtype));
        v = im.emit(Op::Multiply, vec![v, s])?;
    }
    if start != 0 {
        let s = im.b.constant(Constant::scalar_i64(start, dtype));
        v = im.emit(Op::Add, vec![v, s])?;
    }
    Ok(v)
}

/// `ceil((end − start) / step)` as a dim (`step` ≠ 0).
fn count(start: &Dim, end: &Dim, step: i64) -> Dim {
    if step > 0 {
        end.sub(start)
            .add(&Dim::Static(step - 1))
            .floor_div(&Dim::Static(step))
    } else {
        start
            .sub(end)
            .add(&Dim::Static(-step - 1))
            .floor_div(&Dim::Static(-step))
    }
}

/// One scalar of a folded input, as a dim.
fn scalar_dim(im: &Importer<'_>, name: &str, what: &str) -> Result<Dim> {
    match im.const_dims(name)?.as_slice() {
        [d] => Ok(d.clone()),
        v => Err(invalid(format!(
            "`{what}` must be a scalar, found {} values",
            v.len()
        ))),
    }
}

/// Whether `name` is a folded integer value holding a symbolic dim.
fn symbolic(im: &Importer<'_>, name: &str) -> bool {
    matches!(im.val(name), Ok(Val::Ints(i)) if i.vals.iter().any(|d| d.as_static().is_none()))
}

/// Whether a `Range` node has a symbolic bound (and so is converted here).
pub(crate) fn is_symbolic_range(im: &Importer<'_>, node: &NodeProto) -> bool {
    (0..3).any(|i| input(node, i).is_some_and(|n| symbolic(im, n)))
}

/// `Range` with a symbolic `limit` (see the module docs).
pub(crate) fn range(im: &mut Importer<'_>, node: &NodeProto) -> Result<Vec<Out>> {
    let dtype = match im.val(req(node, 0)?)? {
        Val::Ints(i) => i.dtype,
        Val::Const(c) => c.dtype,
        Val::Expr(_) => return Err(invalid("Range's `start` must be known at import time")),
    };
    if !dtype.is_int() {
        return Err(invalid(format!(
            "a Range with a symbolic bound must be of an integer type, found {dtype}"
        )));
    }
    let start = scalar_dim(im, req(node, 0)?, "start")?;
    let limit = scalar_dim(im, req(node, 1)?, "limit")?;
    let delta = scalar_dim(im, req(node, 2)?, "delta")?;
    let (Some(s), Some(d)) = (start.as_static(), delta.as_static()) else {
        return Err(invalid(
            "Range with a symbolic `start` or `delta` is not supported (only `limit` may be \
             symbolic)",
        ));
    };
    if d == 0 {
        return Err(invalid("Range's `delta` must not be 0"));
    }
    let n = count(&start, &limit, d);
    let v = affine_iota(im, s, d, n, dtype)?;
    Ok(vec![Out::Val(Val::Expr(v))])
}

/// `Slice` (opset ≥ 10) with a symbolic `start` or `end`: `None` when every bound is static.
pub(crate) fn slice(im: &mut Importer<'_>, node: &NodeProto) -> Result<Option<Vec<Out>>> {
    if im.opset < 10
        || ![1, 2]
            .iter()
            .any(|&i| input(node, i).is_some_and(|n| symbolic(im, n)))
    {
        return Ok(None);
    }
    let x = im.expr(req(node, 0)?)?;
    let (dims, _) = im.dims(x)?;
    let starts = im.const_dims(req(node, 1)?)?;
    let ends = im.const_dims(req(node, 2)?)?;
    let axes: Vec<usize> = match input(node, 3) {
        Some(n) => im
            .const_i64s(n)?
            .iter()
            .map(|&a| normalize_axis(a, dims.len()))
            .collect::<Result<_>>()?,
        None => (0..starts.len()).collect(),
    };
    let steps = match input(node, 4) {
        Some(n) => im
            .const_i64s(n)
            .map_err(|_| invalid("Slice's `steps` must be static"))?,
        None => vec![1; starts.len()],
    };
    if ends.len() != axes.len() || starts.len() != axes.len() || steps.len() != axes.len() {
        return Err(invalid("starts, ends, axes and steps differ in length"));
    }
    let mut v = x;
    let mut static_axes = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (k, &ax) in axes.iter().enumerate() {
        let (b, e, st) = (&starts[k], &ends[k], steps[k]);
        if st == 0 {
            return Err(invalid("Slice step 0"));
        }
        if let (Some(b), Some(e)) = (b.as_static(), e.as_static()) {
            static_axes.0.push(ax as i64);
            static_axes.1.push(b);
            static_axes.2.push(e);
            static_axes.3.push(st);
            continue;
        }
        let d = &dims[ax];
        // Negative static bounds count from the end.
        let norm = |x: &Dim| match x.as_static() {
            Some(i) if i < 0 => d.add(&Dim::Static(i)),
            _ => x.clone(),
        };
        let (b, e) = (norm(b), norm(e));
        if b == Dim::Static(0) && e == *d && st == 1 {
            continue; // the whole axis
        }
        let Some(b0) = b.as_static() else {
            return Err(invalid(
                "Slice with a symbolic `start` is not supported (only `end` may be symbolic)",
            ));
        };
        let n = count(&b, &e, st);
        let idx = affine_iota(im, b0, st, n, DType::I64)?;
        v = im.emit(
            Op::Take {
                axis: Some(ax as i64),
                mode: TakeMode::Fast,
            },
            vec![v, idx],
        )?;
    }
    if !static_axes.0.is_empty() {
        v = im.emit(
            Op::StridedSlice(Box::new(StridedSliceAttrs {
                axes: static_axes.0,
                begin: static_axes.1,
                end: static_axes.2,
                strides: Some(static_axes.3),
                assume_inbound: false,
            })),
            vec![v],
        )?;
    }
    Ok(Some(vec![Out::Val(Val::Expr(v))]))
}
