//! `einsum` (issue 17): a general Einstein summation over any number of operands.
//!
//! Contract: the equation is parsed by [`EinsumSpec`] (numpy semantics: `...` broadcast dims,
//! repeated labels take diagonals, labels missing from the output are summed). Every output
//! element is the sum, over the summed labels, of the product of the operands' elements, in a
//! fixed order (deterministic). Floats accumulate in `f64` and round once; integers wrap in
//! `i64`. Operands must share one numeric dtype; `bool` is refused.
//!
//! Two float operands without diagonals or broadcasting (every contraction that BERT, T5 or
//! LLaMA exports write: `bhid,bhjd->bhij`, `bij,bjk->bik`, `i,j->ij`, …) run as one batched
//! matmul between permutes, with the matmul kernel's accumulation (`f32` for `f32` and half
//! types, `f64` for `f64`).
//!
//! ```text
//! y: R.Tensor((2, 3, 5), dtype="float32") = R.einsum((a, b), subscripts="bij,bjk->bik")
//!     # a: (2, 3, 4), b: (2, 4, 5): a batched matmul
//! ```

use crate::util::{KResult, tensor};
use crate::{layout, matmul};
use fusebox_core::ir::DType;
use fusebox_core::op::einsum::EinsumSpec;
use fusebox_core::runtime::{Storage, Tensor};

/// The most multiply-adds one `einsum` may take (guards against absurd label extents).
const MAX_WORK: usize = 1 << 40;

/// `einsum(operands, subscripts)`.
pub(crate) fn einsum(ops: &[&Tensor], subscripts: &str) -> KResult<Tensor> {
    let Some(first) = ops.first() else {
        return Err("einsum needs at least one operand".to_string());
    };
    let dtype = first.dtype();
    if let Some(t) = ops.iter().find(|t| t.dtype() != dtype) {
        return Err(format!(
            "einsum operands must share one dtype, found {dtype} and {}",
            t.dtype()
        ));
    }
    if dtype == DType::Bool {
        return Err("einsum is not defined on bool tensors".to_string());
    }
    let ranks: Vec<usize> = ops.iter().map(|t| t.rank()).collect();
    let spec = EinsumSpec::parse(subscripts, &ranks)?;
    let shapes: Vec<&[usize]> = ops.iter().map(|t| t.shape()).collect();
    let ext: Vec<usize> = spec
        .label_extents(&shapes, |a, b| a == b, |d| *d == 1, ToString::to_string)?
        .into_iter()
        .map(|e| e.unwrap_or(1))
        .collect();
    if let [a, b] = ops
        && dtype.is_float()
        && let Some(t) = as_matmul(a, b, &spec, &ext)?
    {
        return Ok(t);
    }
    // Loop order: the output labels, then the summed ones.
    let mut order: Vec<usize> = spec.output.clone();
    order.extend((0..spec.n_labels).filter(|l| !spec.output.contains(l)));
    let extents: Vec<usize> = order
        .iter()
        .map(|&l| ext.get(l).copied().unwrap_or(1))
        .collect();
    let out_shape: Vec<usize> = extents.iter().take(spec.output.len()).copied().collect();
    let n_out = out_shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("the output is too large")?;
    let n_sum = extents
        .iter()
        .skip(spec.output.len())
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("the summed extent is too large")?;
    if n_out.checked_mul(n_sum).is_none_or(|w| w > MAX_WORK) {
        return Err(format!(
            "einsum `{subscripts}` would take more than {MAX_WORK} multiply-adds"
        ));
    }
    // Per operand, the stride of each loop label (0 where a dim of extent 1 broadcasts; the
    // strides of a repeated label add up: its diagonal).
    let mut steps: Vec<Vec<usize>> = Vec::with_capacity(ops.len());
    for (t, labels) in ops.iter().zip(&spec.inputs) {
        let mut per_label = vec![0usize; spec.n_labels];
        let mut stride = 1usize;
        for (k, &l) in labels.iter().enumerate().rev() {
            let d = t.shape().get(k).copied().unwrap_or(1);
            if d != 1
                && let Some(s) = per_label.get_mut(l)
            {
                *s = s.saturating_add(stride);
            }
            stride = stride.saturating_mul(d);
        }
        steps.push(
            order
                .iter()
                .map(|&l| per_label.get(l).copied().unwrap_or(0))
                .collect(),
        );
    }
    let float = dtype.is_float();
    let fvals: Vec<Vec<f64>> = if float {
        ops.iter().map(|t| t.to_f64_vec()).collect()
    } else {
        Vec::new()
    };
    let ivals: Vec<Vec<i64>> = if float {
        Vec::new()
    } else {
        ops.iter().map(|t| t.to_i64_vec()).collect()
    };
    let mut fout = vec![0.0f64; if float { n_out } else { 0 }];
    let mut iout = vec![0i64; if float { 0 } else { n_out }];
    if n_out > 0 {
        let nl = order.len();
        let mut idx = vec![0usize; nl];
        let mut offs = vec![0usize; ops.len()];
        let no = spec.output.len();
        let mut o = 0usize;
        loop {
            // One output element: sum over the summed labels.
            let mut facc = 0.0f64;
            let mut iacc = 0i64;
            if n_sum > 0 {
                loop {
                    if float {
                        let mut p = 1.0f64;
                        for (v, &off) in fvals.iter().zip(&offs) {
                            p *= v.get(off).copied().unwrap_or(0.0);
                        }
                        facc += p;
                    } else {
                        let mut p = 1i64;
                        for (v, &off) in ivals.iter().zip(&offs) {
                            p = p.wrapping_mul(v.get(off).copied().unwrap_or(0));
                        }
                        iacc = iacc.wrapping_add(p);
                    }
                    if !advance(&mut idx, &extents, &steps, &mut offs, no, nl) {
                        break;
                    }
                }
            }
            if let Some(slot) = fout.get_mut(o) {
                *slot = facc;
            }
            if let Some(slot) = iout.get_mut(o) {
                *slot = iacc;
            }
            o += 1;
            if !advance(&mut idx, &extents, &steps, &mut offs, 0, no) {
                break;
            }
        }
    }
    let data = if float {
        Storage::from_f64(dtype, fout)
    } else {
        Storage::from_i64(dtype, iout)
    };
    tensor(out_shape, data)
}

/// Steps the odometer over loop labels `lo..hi` (the last fastest), keeping the operand
/// offsets in step; returns `false` (with those labels back at 0) when it wraps around.
fn advance(
    idx: &mut [usize],
    extents: &[usize],
    steps: &[Vec<usize>],
    offs: &mut [usize],
    lo: usize,
    hi: usize,
) -> bool {
    let mut k = hi;
    while k > lo {
        k -= 1;
        let e = extents.get(k).copied().unwrap_or(1);
        let Some(i) = idx.get_mut(k) else {
            return false;
        };
        *i += 1;
        for (off, st) in offs.iter_mut().zip(steps) {
            *off += st.get(k).copied().unwrap_or(0);
        }
        if *i < e {
            return true;
        }
        let back = *i;
        *i = 0;
        for (off, st) in offs.iter_mut().zip(steps) {
            *off -= st.get(k).copied().unwrap_or(0) * back;
        }
    }
    false
}

/// `einsum` of two operands as permutes around one batched matmul, when every label is a
/// batch (both operands and the output), row (first operand and output), column (second
/// operand and output) or contracted (both operands, not the output) label, no operand
/// repeats a label and no dim broadcasts; `None` otherwise.
fn as_matmul(a: &Tensor, b: &Tensor, spec: &EinsumSpec, ext: &[usize]) -> KResult<Option<Tensor>> {
    let (Some(la), Some(lb)) = (spec.inputs.first(), spec.inputs.get(1)) else {
        return Ok(None);
    };
    let out = &spec.output;
    let distinct = |ls: &[usize]| ls.iter().enumerate().all(|(i, l)| !ls[..i].contains(l));
    if !distinct(la) || !distinct(lb) {
        return Ok(None);
    }
    for (labels, t) in [(la, a), (lb, b)] {
        for (k, &l) in labels.iter().enumerate() {
            if t.shape().get(k) != ext.get(l) {
                return Ok(None);
            }
        }
    }
    let pick = |f: &dyn Fn(usize) -> bool, from: &[usize]| -> Vec<usize> {
        from.iter().copied().filter(|&l| f(l)).collect()
    };
    let batch = pick(&|l| la.contains(&l) && lb.contains(&l), out);
    let rows = pick(&|l| la.contains(&l) && !lb.contains(&l), out);
    let cols = pick(&|l| !la.contains(&l) && lb.contains(&l), out);
    let inner = pick(&|l| lb.contains(&l) && !out.contains(&l), la);
    if la.len() != batch.len() + rows.len() + inner.len()
        || lb.len() != batch.len() + cols.len() + inner.len()
    {
        return Ok(None);
    }
    let pos = |ls: &[usize], l: usize| -> KResult<i64> {
        ls.iter()
            .position(|&x| x == l)
            .and_then(|p| i64::try_from(p).ok())
            .ok_or_else(|| "internal: einsum label missing".to_string())
    };
    let extent = |ls: &[usize]| -> KResult<i64> {
        ls.iter()
            .try_fold(1i64, |acc, &l| {
                acc.checked_mul(i64::try_from(ext.get(l).copied().unwrap_or(1)).ok()?)
            })
            .ok_or_else(|| "the einsum operands are too large".to_string())
    };
    let perm_a: Vec<i64> = batch
        .iter()
        .chain(&rows)
        .chain(&inner)
        .map(|&l| pos(la, l))
        .collect::<KResult<_>>()?;
    let perm_b: Vec<i64> = batch
        .iter()
        .chain(&inner)
        .chain(&cols)
        .map(|&l| pos(lb, l))
        .collect::<KResult<_>>()?;
    let (nb, nm, nk, nn) = (
        extent(&batch)?,
        extent(&rows)?,
        extent(&inner)?,
        extent(&cols)?,
    );
    let a3 = layout::reshape(&layout::permute_dims(a, Some(&perm_a))?, &[nb, nm, nk])?;
    let b3 = layout::reshape(&layout::permute_dims(b, Some(&perm_b))?, &[nb, nk, nn])?;
    let c = matmul::matmul(&a3, &b3, None, None)?;
    let order: Vec<usize> = batch.iter().chain(&rows).chain(&cols).copied().collect();
    let mid: Vec<i64> = order
        .iter()
        .map(|&l| extent(&[l]))
        .collect::<KResult<_>>()?;
    let c = layout::reshape(&c, &mid)?;
    let perm_o: Vec<i64> = out
        .iter()
        .map(|&l| pos(&order, l))
        .collect::<KResult<_>>()?;
    layout::permute_dims(&c, Some(&perm_o)).map(Some)
}
