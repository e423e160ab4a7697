//! ONNX `Loop` unrolled at import time, when its trip count and its condition are known then
//! (constants, or values the importer folds: `Range`'s function body, loops over a fixed
//! count): the body imported once per iteration, its loop-carried outputs feeding the next
//! iteration, its scan outputs stacked.
//!
//! Contract:
//!
//! - The loop runs while `iteration < M` (no `M`: no bound) and the condition holds; the
//!   initial condition (absent: true) and every iteration's `cond_out` must fold to a constant
//!   at import time, else the node is an error naming what is computed at run time. A loop
//!   without `M` must stop through its condition within [`MAX_STEPS`] iterations.
//! - Each iteration binds the body's inputs to the iteration number (an `int64` scalar
//!   constant), the current condition and the loop-carried values; the outputs are the final
//!   loop-carried values, then each scan output's per-iteration values stacked along a new
//!   axis 0. A loop that runs zero times with scan outputs is an error (their shapes would come
//!   from a body that never ran); without them it passes its initial values through.
//! - Bounds, shadowing and the body's reads of the enclosing graph are as for `Scan`
//!   ([`super::scan`]): at most [`MAX_STEPS`] iterations, at most [`super::scan::MAX_UNROLLED_NODES`] body
//!   nodes over every unrolled `Scan` and `Loop` of a model.
//!
//! ```text
//! Loop(M = 3, cond = true, y0; body(i, c, y) = (c, y + x[i], y + x[i]))
//!   → y1 = y0 + x[0]; y2 = y1 + x[1]; y3 = y2 + x[2]; outputs y3, R.stack((y1, y2, y3), axis=0)
//! ```

use super::proto::NodeProto;
use super::scan::{BodyScope, MAX_STEPS, body_of, count_step, forget, import_step, stack};
use super::{Attrs, Importer, Val, external, invalid};
use crate::error::Result;
use crate::ir::{Constant, DType, ExprId};

/// A folded scalar's truth, if it is known at import time.
fn truth(v: &Val) -> Option<bool> {
    match v {
        Val::Const(c) if c.numel() == 1 => c.get_f64(0).map(|x| x != 0.0),
        Val::Ints(i) if i.vals.len() == 1 => i.vals[0].as_static().map(|x| x != 0),
        _ => None,
    }
}

/// Replaces a `Loop` node by its unrolled body (see the module doc).
pub(super) fn inline_loop(
    im: &mut Importer<'_>,
    node: &NodeProto,
    ext: &mut external::ExternalData,
    depth: usize,
) -> Result<()> {
    let a = Attrs(node);
    let body = body_of(&a, "Loop")?;
    let given = |k: usize| node.input.get(k).filter(|s| !s.is_empty());
    let max = match given(0) {
        Some(name) => match im.const_i64s(name)?.as_slice() {
            [m] => Some((*m).max(0)),
            v => {
                return Err(invalid(format!(
                    "`Loop`'s trip count must be one integer, found {} values",
                    v.len()
                )));
            }
        },
        None => None,
    };
    let mut cond = match given(1) {
        Some(name) => truth(&im.val(name)?).ok_or_else(|| {
            invalid(format!(
                "`Loop`'s condition `{name}` is computed at run time; fusebox unrolls a Loop \
                 only when its trip count and condition are known at import time"
            ))
        })?,
        None => true,
    };
    let carried: Vec<&String> = node.input.iter().skip(2).collect();
    let n = carried.len();
    if body.input.len() != n + 2 {
        return Err(invalid(format!(
            "`Loop`'s body takes {} inputs; the node gives the iteration number, the condition \
             and {n} loop-carried values",
            body.input.len()
        )));
    }
    if body.output.len() < n + 1 {
        return Err(invalid(format!(
            "`Loop`'s body returns {} values, fewer than the condition and its {n} loop-carried \
             values",
            body.output.len()
        )));
    }
    let k = body.output.len() - 1 - n;
    if node.output.len() > n + k {
        return Err(invalid(format!(
            "`Loop` has {} outputs; its body gives {n} loop-carried values and {k} scan outputs",
            node.output.len()
        )));
    }
    let mut states = Vec::with_capacity(n);
    for name in &carried {
        if name.is_empty() {
            return Err(invalid("`Loop`'s loop-carried inputs must all be given"));
        }
        states.push(im.val(name)?);
    }
    let scope = BodyScope::enter(im, body, ext, "Loop")?;
    let mut elems: Vec<Vec<ExprId>> = vec![Vec::new(); k];
    let mut i: i64 = 0;
    while cond && max.is_none_or(|m| i < m) {
        if i as usize >= MAX_STEPS {
            return Err(invalid(format!(
                "`Loop` runs more than {MAX_STEPS} iterations: fusebox unrolls a Loop, at most \
                 {MAX_STEPS}"
            )));
        }
        count_step(im, body)?;
        forget(im, &scope.scoped);
        let iter = Constant::scalar_i64(i, DType::I64);
        im.vals.insert(body.input[0].name.clone(), Val::Const(iter));
        let c = Constant::scalar(1.0, DType::Bool);
        im.vals.insert(body.input[1].name.clone(), Val::Const(c));
        for (inp, s) in body.input[2..].iter().zip(&states) {
            im.vals.insert(inp.name.clone(), s.clone());
        }
        import_step(im, body, ext, depth, || {
            format!("`Loop` body, iteration {i}")
        })?;
        let cond_name = &body.output[0].name;
        cond = truth(&im.val(cond_name)?).ok_or_else(|| {
            invalid(format!(
                "`Loop`'s body computes its condition `{cond_name}` at run time (iteration \
                 {i}); fusebox unrolls a Loop only when its condition is known at import time"
            ))
        })?;
        let mut next = Vec::with_capacity(n);
        for o in &body.output[1..=n] {
            next.push(
                im.val(&o.name)
                    .map_err(|e| invalid(format!("`Loop` body output `{}`: {e}", o.name)))?,
            );
        }
        states = next;
        for (j, o) in body.output[n + 1..].iter().enumerate() {
            let e = im
                .expr(&o.name)
                .map_err(|e| invalid(format!("`Loop` body output `{}`: {e}", o.name)))?;
            elems[j].push(e);
        }
        i += 1;
    }
    let mut scanned = Vec::with_capacity(k);
    for (j, e) in elems.into_iter().enumerate() {
        let wanted = node.output.get(n + j).is_some_and(|s| !s.is_empty());
        if e.is_empty() {
            if wanted {
                return Err(invalid(
                    "`Loop` runs zero times but has scan outputs (their shapes would come from \
                     a body that never ran)",
                ));
            }
            scanned.push(None);
        } else {
            scanned.push(Some(stack(im, e, 0)?));
        }
    }
    // The enclosing graph's names mean what they meant before.
    scope.restore(im);
    let mut results: Vec<Option<Val>> = states.into_iter().map(Some).collect();
    results.extend(scanned.into_iter().map(|s| s.map(Val::Expr)));
    for (name, v) in node.output.iter().zip(results) {
        let Some(v) = v else { continue };
        if name.is_empty() {
            continue;
        }
        im.cache.remove(name);
        im.vals.insert(name.clone(), v);
    }
    Ok(())
}
