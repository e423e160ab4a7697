//! ONNX ops whose output is fixed at import time: the window functions (`HannWindow`,
//! `HammingWindow`, `BlackmanWindow`) and `EyeLike` of a static shape. They become constants.
//!
//! Contract: the window length is a constant input (as exporters write it); its values follow
//! ONNX's definitions (periodic windows divide by `size`, symmetric ones by `size - 1`), are
//! computed in `f64` and stored in `output_datatype`. `EyeLike` needs a static 2-D input shape
//! and writes ones on diagonal `k` in `dtype` (default: the input's). Sizes are bounded like
//! every constant the importer makes.
//!
//! ```text
//! w = HannWindow(size=4)                → w = metadata[...] float32[0, 0.5, 1, 0.5]
//! e = EyeLike(x: float32[2, 3]; k=1)    → e = metadata[...] float32[[0,1,0],[0,0,1]]
//! ```

use super::super::{Attrs, Importer, MAX_CONST_ELEMS, Out, Val, dtype_of, invalid, req};
use crate::error::Result;
use crate::ir::{Constant, DType};
use crate::op::Op;
use std::f64::consts::PI;

/// Encodes `vals` as a constant of `dtype` and shape `shape`.
fn constant(vals: &[f64], dtype: DType, shape: Vec<i64>) -> Result<Constant> {
    let mut bytes = Vec::with_capacity(vals.len() * dtype.size_bytes());
    for &v in vals {
        bytes.extend(Constant::scalar(v, dtype).data.iter());
    }
    Constant::from_bytes(dtype, shape, bytes).map_err(invalid)
}

fn out_dtype(a: &Attrs<'_>, name: &str, default: DType) -> Result<DType> {
    if !a.has(name) {
        return Ok(default);
    }
    let code = a.int(name, 1);
    dtype_of(i32::try_from(code).unwrap_or(-1))
        .ok_or_else(|| invalid(format!("`{name}` = {code} is not a supported data type")))
}

/// `HannWindow`, `HammingWindow`, `BlackmanWindow`.
pub(crate) fn window(im: &mut Importer<'_>, node: &super::super::NodeProto) -> Result<Vec<Out>> {
    let a = Attrs(node);
    let size_name = req(node, 0)?;
    let size = match im.const_i64s(size_name)?.as_slice() {
        [n] => *n,
        v => {
            return Err(invalid(format!("`size` must be one integer, found {v:?}")));
        }
    };
    let n = usize::try_from(size)
        .ok()
        .filter(|&n| n <= MAX_CONST_ELEMS)
        .ok_or_else(|| {
            invalid(format!(
                "window size {size} must be in 0..={MAX_CONST_ELEMS}"
            ))
        })?;
    let dtype = out_dtype(&a, "output_datatype", DType::F32)?;
    let periodic = a.int("periodic", 1) != 0;
    let denom = if periodic { n as f64 } else { n as f64 - 1.0 };
    let vals: Vec<f64> = (0..n)
        .map(|i| {
            let x = 2.0 * PI * i as f64 / denom;
            match node.op_type.as_str() {
                "HannWindow" => 0.5 - 0.5 * x.cos(),
                "HammingWindow" => 25.0 / 46.0 - (21.0 / 46.0) * x.cos(),
                _ => 0.42 - 0.5 * x.cos() + 0.08 * (2.0 * x).cos(),
            }
        })
        .map(|v| if v.is_finite() { v } else { 1.0 })
        .collect();
    Ok(vec![Out::Val(Val::Const(constant(
        &vals,
        dtype,
        vec![n as i64],
    )?))])
}

/// `EyeLike` of a 2-D input: a constant for a static shape, else ones of the input's symbolic
/// shape off-diagonal-zeroed by `tril` and `triu`.
pub(crate) fn eye_like(im: &mut Importer<'_>, node: &super::super::NodeProto) -> Result<Vec<Out>> {
    let a = Attrs(node);
    let x = im.expr(req(node, 0)?)?;
    let (dims, dt) = im.dims(x)?;
    let [r, c] = dims.as_slice() else {
        return Err(invalid(format!(
            "EyeLike needs a 2-D input, found rank {}",
            dims.len()
        )));
    };
    let (Some(r), Some(c)) = (r.as_static(), c.as_static()) else {
        // A symbolic shape (XLNet's `EyeLike(ConstantOfShape([n, n]))`): ones of that shape
        // with everything off the k-th diagonal zeroed, `triu(tril(ones, k), k)`.
        let dtype = out_dtype(&a, "dtype", dt)?;
        let k = a.int("k", 0);
        let one = im.b.constant(Constant::scalar(1.0, dtype));
        let shape = im.b.shape(vec![r.clone(), c.clone()]);
        let ones = im.emit(Op::BroadcastTo, vec![one, shape])?;
        let lower = im.emit(Op::Tril { k }, vec![ones])?;
        let eye = im.emit(Op::Triu { k }, vec![lower])?;
        return Ok(vec![Out::Val(Val::Expr(eye))]);
    };
    let numel = r
        .checked_mul(c)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= MAX_CONST_ELEMS)
        .ok_or_else(|| invalid(format!("EyeLike of shape [{r}, {c}] is too large")))?;
    let dtype = out_dtype(&a, "dtype", dt)?;
    let k = a.int("k", 0);
    let mut vals = vec![0.0; numel];
    for i in 0..r {
        if let Some(j) = i.checked_add(k).filter(|j| (0..c).contains(j)) {
            vals[(i * c + j) as usize] = 1.0;
        }
    }
    Ok(vec![Out::Val(Val::Const(constant(
        &vals,
        dtype,
        vec![r, c],
    )?))])
}
