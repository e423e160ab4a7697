//! `Slice` whose bounds are symbolic dims (computed from input shapes: BERT's
//! `position_ids[:, :seq]`), so models exported with dynamic sequence axes keep symbolic shapes
//! instead of failing at import. (`Range` with a symbolic limit is in `index.rs`, built the same
//! way.)
//!
//! Contract:
//!
//! - `Slice` with a symbolic `start` or `end` on some axis: when the slice is that axis whole
//!   (`0 .. dim`, step 1) it is dropped; otherwise the axis is gathered with `take` at
//!   `start + step · iota(n)`. Symbolic bounds are assumed inside the axis (as TVM's
//!   `assume_inbound`); an index that is not is an error when the model runs, never a silent
//!   wrong value. Axes with static bounds are sliced as usual.
//! - A symbolic start on a sliced axis, or a symbolic step, is an error naming what must be
//!   static.
//!
//! ```text
//! p = Slice(pos: int64[1, 512], [0], Gather(Shape(ids), 1), [1])    # ids: int64[batch, seq]
//!   → lv = R.broadcast_to(R.const(1, "int64"), R.shape([seq]))
//!     lv1 = R.cumsum(lv, axis=0, dtype=None, exclusive=True)
//!     p = R.take(pos, lv1, axis=1, mode="fast")                    # R.Tensor((1, seq), "int64")
//! ```

use super::super::fold::Ints;
use super::super::{Importer, NodeProto, Out, Val, input, invalid, normalize_axis, req};
use crate::error::Result;
use crate::ir::{Constant, DType, Dim, ExprId};
use crate::op::{Op, ScanAttrs, StridedSliceAttrs};

/// `0, 1, …, n-1` as a 1-D tensor of `dtype` whose length is the dim `n`.
pub(super) fn iota(im: &mut Importer<'_>, n: Dim, dtype: DType) -> Result<ExprId> {
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

/// Whether a symbolic dim is negative for every value of its symbols (each at least 1):
/// `c - x` with `x` above `c`, or `x * k` with `k < 0`.
fn provably_negative(x: &Dim) -> bool {
    use crate::ir::DimOp;
    let Dim::Expr(e) = x else {
        return false;
    };
    let lb = super::super::dim_bounds::lower_bound;
    match e.0 {
        DimOp::Sub => {
            e.1.as_static()
                .is_some_and(|c| lb(&e.2).is_some_and(|l| l > c))
        }
        DimOp::Mul => match (e.1.as_static(), e.2.as_static()) {
            (Some(k), None) => k < 0 && lb(&e.2).is_some_and(|l| l >= 1),
            (None, Some(k)) => k < 0 && lb(&e.1).is_some_and(|l| l >= 1),
            _ => false,
        },
        _ => false,
    }
}

/// Whether `name` is a folded integer value holding a symbolic dim.
fn symbolic(im: &Importer<'_>, name: &str) -> bool {
    matches!(im.val(name), Ok(Val::Ints(i)) if i.vals.iter().any(|d| d.as_static().is_none()))
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
        // Negative bounds count from the end: static ones, and symbolic ones that are
        // provably negative (`-n`, exported as `0 - n` or `-1 * n`, for `x[..., -n:]`).
        let norm = |x: &Dim| match x.as_static() {
            Some(i) if i < 0 => d.add(&Dim::Static(i)),
            None if provably_negative(x) => d.add(x),
            _ => x.clone(),
        };
        let (b, mut e) = (norm(b), norm(e));
        // A static end past the axis (`INT64_MAX`: "to the end") stops at its extent.
        if st > 0
            && let Some(ev) = e.as_static()
            && (ev >= 1 << 62 || d.as_static().is_some_and(|dv| ev > dv))
        {
            e = d.clone();
        }
        if b == Dim::Static(0) && e == *d && st == 1 {
            continue; // the whole axis
        }
        let n = count(&b, &e, st);
        let idx = match b.as_static() {
            Some(b0) => affine_iota(im, b0, st, n, DType::I64)?,
            // A symbolic start (MPT's ALiBi bias, `bias[..., max_len - n:]`) is read back at
            // run time and added to the offsets; an index it puts outside the axis is the
            // `take`'s run-time error.
            None if st > 0 => {
                let offsets = affine_iota(im, 0, st, n, DType::I64)?;
                let start = im.ints_tensor(&Ints {
                    dtype: DType::I64,
                    shape: vec![1],
                    vals: vec![b.clone()],
                })?;
                im.emit(Op::Add, vec![offsets, start])?
            }
            None => {
                return Err(invalid(
                    "Slice with a symbolic `start` needs a positive step",
                ));
            }
        };
        v = im.take(v, ax as i64, idx)?;
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
