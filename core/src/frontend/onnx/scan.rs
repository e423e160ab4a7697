//! ONNX `Scan` (opset 8, and 9 onwards) unrolled at import time: the body graph is imported
//! once per step of the scanned axis, its state outputs feeding the next step's state inputs,
//! and the per-step scan outputs stacked.
//!
//! Contract:
//!
//! - The scanned extent must be static (every scan input's scan axis the same length ≥ 1) and
//!   the unrolled size bounded: at most [`MAX_STEPS`] steps per `Scan`, and at most
//!   [`MAX_UNROLLED_NODES`] body nodes imported across every `Scan` of the model (nested ones
//!   included): beyond that, an error naming the node, never memory exhaustion.
//! - Opset 9 onwards: inputs are the `N` initial states then the `M = num_scan_inputs` scan
//!   inputs; `scan_input_axes` / `scan_input_directions` (default axis 0, forward) say which
//!   axis each scan input is cut along and in which order; step `t` reads slice `t` (or
//!   `len − 1 − t` in reverse) with that axis removed. Outputs are the `N` final states, then
//!   the `K` scan outputs, each the steps' values stacked along `scan_output_axes` (default 0;
//!   negative counts from the end of the stacked rank) in step order, or reversed where
//!   `scan_output_directions` is 1.
//! - Opset 8: a leading optional `sequence_lens` input (accepted only when it is a constant
//!   equal to the full length in every batch entry), batch axis 0 on every state, scan input
//!   and output, scan axis 1 on scan inputs and outputs, `directions` per scan input: each
//!   batch entry is scanned on its own and the results stacked along axis 0.
//! - The body may read values of the enclosing graph by name; its initializers are constants;
//!   after the unrolling the enclosing graph's names mean what they meant before (a body that
//!   shadows one does not leak its value); each step's values are fresh bindings (names made
//!   unique by the builder), so the output is a plain dataflow graph that every pass and
//!   backend already handles.
//!
//! ```text
//! Scan(initial: float[2], x: float[3, 2], num_scan_inputs=1,
//!      body(sum_in, next) = (sum_out = Add(sum_in, next), scan_out = Identity(sum_out)))
//!
//! lv  = R.take(x, R.const(0, "int64"), axis=0);  sum_out  = R.add(initial, lv)
//! lv1 = R.take(x, R.const(1, "int64"), axis=0);  sum_out1 = R.add(sum_out, lv1)
//! lv2 = R.take(x, R.const(2, "int64"), axis=0);  sum_out2 = R.add(sum_out1, lv2)
//! y = sum_out2;  z = R.stack((sum_out, sum_out1, sum_out2), axis=0)
//! ```

use super::proto::{GraphProto, NodeProto};
use super::{Attrs, Importer, Val, external, import_nodes, invalid, normalize_axis};
use crate::error::Result;
use crate::ir::{Constant, DType, ExprId};
use crate::op::Op;
use std::collections::HashSet;

/// The most steps one `Scan` is unrolled into.
pub(super) const MAX_STEPS: usize = 4096;

/// The most body nodes imported by unrolling, over every `Scan` of a model.
pub(super) const MAX_UNROLLED_NODES: usize = 1 << 16;

/// A scan input: its value, the axis it is cut along, and whether it is read back to front.
struct ScanInput {
    x: ExprId,
    axis: usize,
    reverse: bool,
}

/// Replaces a `Scan` node by its unrolled body (see the module doc).
pub(super) fn inline_scan(
    im: &mut Importer<'_>,
    node: &NodeProto,
    ext: &mut external::ExternalData,
    depth: usize,
) -> Result<()> {
    let a = Attrs(node);
    let body = body_of(&a, "Scan")?;
    let m = usize::try_from(a.int("num_scan_inputs", 0))
        .ok()
        .filter(|&m| m >= 1)
        .ok_or_else(|| invalid("`Scan` needs `num_scan_inputs` ≥ 1"))?;
    let opset8 = im.opset < 9;
    let (seq_lens, rest) = if opset8 {
        match node.input.split_first() {
            Some((s, r)) => (Some(s.as_str()).filter(|s| !s.is_empty()), r),
            None => (None, &node.input[..]),
        }
    } else {
        (None, &node.input[..])
    };
    if rest.len() < m {
        return Err(invalid(format!(
            "`Scan` has {} state and scan inputs, fewer than num_scan_inputs = {m}",
            rest.len()
        )));
    }
    let n = rest.len() - m;
    if body.input.len() != n + m {
        return Err(invalid(format!(
            "`Scan`'s body takes {} inputs; the node gives {n} states and {m} scan inputs",
            body.input.len()
        )));
    }
    if body.output.len() < n {
        return Err(invalid(format!(
            "`Scan`'s body returns {} values, fewer than its {n} states",
            body.output.len()
        )));
    }
    let k = body.output.len() - n;
    if node.output.len() > n + k {
        return Err(invalid(format!(
            "`Scan` has {} outputs; its body gives {n} states and {k} scan outputs",
            node.output.len()
        )));
    }
    let mut states = Vec::with_capacity(n);
    for name in &rest[..n] {
        if name.is_empty() {
            return Err(invalid("`Scan`'s initial states must all be given"));
        }
        states.push(im.val(name)?);
    }
    let in_dirs = if opset8 {
        a.ints("directions")
    } else {
        a.ints("scan_input_directions")
    }
    .unwrap_or_default();
    let in_axes = if opset8 {
        None
    } else {
        a.ints("scan_input_axes")
    };
    let out_axes = if opset8 {
        None
    } else {
        a.ints("scan_output_axes")
    };
    let out_dirs = if opset8 {
        None
    } else {
        a.ints("scan_output_directions")
    };
    for (what, v, len) in [
        ("directions", Some(&in_dirs), m),
        ("scan_input_axes", in_axes.as_ref(), m),
        ("scan_output_axes", out_axes.as_ref(), k),
        ("scan_output_directions", out_dirs.as_ref(), k),
    ] {
        if let Some(v) = v
            && !v.is_empty()
            && v.len() != len
        {
            return Err(invalid(format!(
                "`Scan`'s `{what}` has {} values, expected {len}",
                v.len()
            )));
        }
    }
    let dir_of = |v: Option<&Vec<i64>>, j: usize| -> Result<bool> {
        match v.and_then(|v| v.get(j)).copied().unwrap_or(0) {
            0 => Ok(false),
            1 => Ok(true),
            d => Err(invalid(format!(
                "`Scan` direction {d} (expected 0, forward, or 1, reverse)"
            ))),
        }
    };
    // Opset 8 scans axis 1 of each input (axis 0 is the batch).
    let base = usize::from(opset8);
    let mut xs = Vec::with_capacity(m);
    let mut len: Option<i64> = None;
    for (j, name) in rest[n..].iter().enumerate() {
        if name.is_empty() {
            return Err(invalid("`Scan`'s scan inputs must all be given"));
        }
        let x = im.expr(name)?;
        let (xd, _) = im.dims(x)?;
        let axis = match in_axes.as_ref().and_then(|v| v.get(j)) {
            Some(&ax) => normalize_axis(ax, xd.len())?,
            None => base,
        };
        let ext_len = xd
            .get(axis)
            .ok_or_else(|| {
                invalid(format!(
                    "`Scan` input `{name}` has rank {}, no scan axis {axis}",
                    xd.len()
                ))
            })?
            .as_static()
            .ok_or_else(|| {
                invalid(format!(
                    "`Scan` input `{name}`'s scan axis has a symbolic extent `{}`; fusebox \
                     unrolls a Scan and needs a static sequence length",
                    xd[axis]
                ))
            })?;
        if let Some(l) = len
            && l != ext_len
        {
            return Err(invalid(format!(
                "`Scan`'s scan inputs differ in length: {l} and {ext_len} (`{name}`)"
            )));
        }
        len = Some(ext_len);
        xs.push(ScanInput {
            x,
            axis,
            reverse: dir_of(Some(&in_dirs), j)?,
        });
    }
    let len = usize::try_from(len.unwrap_or(0)).unwrap_or(0);
    if len == 0 {
        return Err(invalid(
            "`Scan` over an empty sequence is not supported (the scan outputs' shapes would \
             come from a body that never runs)",
        ));
    }
    if len > MAX_STEPS {
        return Err(invalid(format!(
            "`Scan` over {len} steps: fusebox unrolls a Scan, at most {MAX_STEPS} steps"
        )));
    }
    let scope = BodyScope::enter(im, body, ext, "Scan")?;
    let scoped = &scope.scoped;
    let (finals, scanned): (Vec<Val>, Vec<ExprId>) = if opset8 {
        if let Some(s) = seq_lens {
            let lens = im.const_i64s(s).map_err(|_| {
                invalid(
                    "`Scan`'s `sequence_lens` must be a constant (fusebox unrolls a Scan over \
                     the full length)",
                )
            })?;
            if lens.iter().any(|&l| l != len as i64) {
                return Err(invalid(format!(
                    "`Scan`'s `sequence_lens` {lens:?} differ from the full length {len}: \
                     shorter sequences are not supported"
                )));
            }
        }
        let batch = match xs.first() {
            Some(x) => im.dims(x.x)?.0[0]
                .as_static()
                .ok_or_else(|| invalid("`Scan` (opset 8) needs a static batch extent (axis 0)"))?,
            None => 0,
        };
        // Every state and scan input holds the batch on axis 0.
        let mut batched: Vec<(&str, ExprId)> = Vec::with_capacity(n + m);
        for (name, s) in rest[..n].iter().zip(&states) {
            batched.push((name, val_expr(im, s)?));
        }
        for (name, x) in rest[n..].iter().zip(&xs) {
            batched.push((name, x.x));
        }
        for (name, e) in batched {
            let first = im.dims(e)?.0.first().and_then(|d| d.as_static());
            if first != Some(batch) {
                return Err(invalid(format!(
                    "`Scan` (opset 8): `{name}` must have the batch extent {batch} on axis 0, \
                     found {}",
                    first.map_or_else(|| "none or a symbolic one".to_string(), |d| d.to_string())
                )));
            }
        }
        let batch = usize::try_from(batch).unwrap_or(0);
        if batch == 0 {
            return Err(invalid(
                "`Scan` (opset 8) over an empty batch is not supported",
            ));
        }
        let mut per_state: Vec<Vec<ExprId>> = vec![Vec::with_capacity(batch); n];
        let mut per_out: Vec<Vec<ExprId>> = vec![Vec::with_capacity(batch); k];
        for b in 0..batch {
            let idx = im.b.constant(Constant::scalar_i64(b as i64, DType::I64));
            let mut st = Vec::with_capacity(n);
            for s in &states {
                let e = val_expr(im, s)?;
                st.push(Val::Expr(im.take(e, 0, idx)?));
            }
            let mut xb = Vec::with_capacity(m);
            for x in &xs {
                xb.push(ScanInput {
                    x: im.take(x.x, 0, idx)?,
                    axis: 0,
                    reverse: x.reverse,
                });
            }
            let (fin, elems) = unroll(im, body, scoped, st, &xb, len, ext, depth)?;
            for (i, f) in fin.iter().enumerate() {
                let e = val_expr(im, f)?;
                per_state[i].push(e);
            }
            for (j, e) in elems.into_iter().enumerate() {
                let s = stack(im, e, 0)?;
                per_out[j].push(s);
            }
        }
        let mut finals = Vec::with_capacity(n);
        for v in per_state {
            finals.push(Val::Expr(stack(im, v, 0)?));
        }
        let mut scanned = Vec::with_capacity(k);
        for v in per_out {
            scanned.push(stack(im, v, 0)?);
        }
        (finals, scanned)
    } else {
        let (finals, elems) = unroll(im, body, scoped, states, &xs, len, ext, depth)?;
        let mut scanned = Vec::with_capacity(k);
        for (j, mut e) in elems.into_iter().enumerate() {
            if dir_of(out_dirs.as_ref(), j)? {
                e.reverse();
            }
            let axis = out_axes
                .as_ref()
                .and_then(|v| v.get(j))
                .copied()
                .unwrap_or(0);
            scanned.push(stack(im, e, axis)?);
        }
        (finals, scanned)
    };
    scope.restore(im);
    let results = finals.into_iter().chain(scanned.into_iter().map(Val::Expr));
    for (name, v) in node.output.iter().zip(results) {
        if name.is_empty() {
            continue;
        }
        im.cache.remove(name);
        im.vals.insert(name.clone(), v);
    }
    Ok(())
}

/// Runs the body `len` times from `states`; returns the final states and, per scan output,
/// its value at each step in step order.
#[allow(
    clippy::too_many_arguments,
    reason = "the importer's state, the body, and one scan's inputs"
)]
fn unroll(
    im: &mut Importer<'_>,
    body: &GraphProto,
    scoped: &[String],
    mut states: Vec<Val>,
    xs: &[ScanInput],
    len: usize,
    ext: &mut external::ExternalData,
    depth: usize,
) -> Result<(Vec<Val>, Vec<Vec<ExprId>>)> {
    let n = states.len();
    let k = body.output.len() - n;
    let mut elems: Vec<Vec<ExprId>> = vec![Vec::with_capacity(len); k];
    for t in 0..len {
        count_step(im, body)?;
        // The body's names are bound anew each step: forget last step's values.
        forget(im, scoped);
        for (inp, s) in body.input.iter().zip(states.iter()) {
            im.vals.insert(inp.name.clone(), s.clone());
        }
        for (inp, x) in body.input[n..].iter().zip(xs) {
            let i = if x.reverse { len - 1 - t } else { t };
            let idx = im.b.constant(Constant::scalar_i64(i as i64, DType::I64));
            let slice = im.take(x.x, x.axis as i64, idx)?;
            im.vals.insert(inp.name.clone(), Val::Expr(slice));
        }
        import_step(im, body, ext, depth, || format!("`Scan` body, step {t}"))?;
        let mut next = Vec::with_capacity(n);
        for o in &body.output[..n] {
            next.push(
                im.val(&o.name)
                    .map_err(|e| invalid(format!("`Scan` body output `{}`: {e}", o.name)))?,
            );
        }
        states = next;
        for (j, o) in body.output[n..].iter().enumerate() {
            let e = im
                .expr(&o.name)
                .map_err(|e| invalid(format!("`Scan` body output `{}`: {e}", o.name)))?;
            elems[j].push(e);
        }
    }
    Ok((states, elems))
}

/// A body graph's names while it is unrolled: what the enclosing graph binds under them (ONNX
/// forbids a body to shadow them, but a model may), restored by [`BodyScope::restore`] after
/// the unrolling, and the body's initializers bound as constants meanwhile.
pub(super) struct BodyScope {
    /// The names the body binds each step ([`scoped_names`]).
    pub(super) scoped: Vec<String>,
    shadowed: Vec<(String, Option<Val>, Option<ExprId>)>,
}

impl BodyScope {
    /// Saves what the enclosing graph binds under `body`'s names and binds its initializers;
    /// `what` (`Scan`, `Loop`) names the node in errors.
    pub(super) fn enter(
        im: &mut Importer<'_>,
        body: &GraphProto,
        ext: &mut external::ExternalData,
        what: &str,
    ) -> Result<BodyScope> {
        let scoped = scoped_names(body);
        let shadowed = scoped
            .iter()
            .chain(body.initializer.iter().map(|t| &t.name))
            .map(|n| (n.clone(), im.vals.get(n).cloned(), im.cache.get(n).copied()))
            .collect();
        for t in &body.initializer {
            let c = ext
                .constant(t)
                .map_err(|e| invalid(format!("`{what}` body initializer `{}`: {e}", t.name)))?;
            im.vals.insert(t.name.clone(), Val::Const(c));
            im.cache.remove(&t.name);
        }
        Ok(BodyScope { scoped, shadowed })
    }

    /// Gives the enclosing graph's names back what they meant before [`BodyScope::enter`].
    pub(super) fn restore(self, im: &mut Importer<'_>) {
        for (name, val, cached) in self.shadowed {
            match val {
                Some(v) => im.vals.insert(name.clone(), v),
                None => im.vals.remove(&name),
            };
            match cached {
                Some(e) => im.cache.insert(name, e),
                None => im.cache.remove(&name),
            };
        }
    }
}

/// The `body` graph attribute of a `Scan` or `Loop` (`what`).
pub(super) fn body_of<'n>(a: &Attrs<'n>, what: &str) -> Result<&'n GraphProto> {
    a.get("body")
        .and_then(|x| x.g.as_deref())
        .ok_or_else(|| invalid(format!("`{what}` has no `body` graph")))
}

/// Imports one unrolled step of a `Scan` or `Loop` body, an error in it named after the step
/// (`label()`, such as "`Scan` body, step 3"; the file is named once, before the node).
pub(super) fn import_step(
    im: &mut Importer<'_>,
    body: &GraphProto,
    ext: &mut external::ExternalData,
    depth: usize,
    label: impl Fn() -> String,
) -> Result<()> {
    let file = im.file.clone();
    import_nodes(im, &body.node, &HashSet::new(), ext, depth + 1).map_err(|e| {
        let m = e.to_string();
        let m = m.strip_prefix(file.as_str()).unwrap_or(&m);
        invalid(format!("{}: {}", label(), m.trim_start_matches(": ")))
    })
}

/// Counts one more unrolled step of `body` against [`MAX_UNROLLED_NODES`] (over every `Scan`
/// and `Loop` of the model).
pub(super) fn count_step(im: &mut Importer<'_>, body: &GraphProto) -> Result<()> {
    im.unrolled = im.unrolled.saturating_add(body.node.len().max(1));
    if im.unrolled > MAX_UNROLLED_NODES {
        return Err(invalid(format!(
            "unrolling `Scan` and `Loop` bodies would import more than {MAX_UNROLLED_NODES} \
             nodes (steps × body nodes, over the model)"
        )));
    }
    Ok(())
}

/// Forgets the values of `names` (a body's, before its next step is imported).
pub(super) fn forget(im: &mut Importer<'_>, names: &[String]) {
    for name in names {
        im.cache.remove(name);
        im.missing.remove(name);
        im.vals.remove(name);
    }
}

/// The values stacked along a new `axis` of their rank + 1 (negative counts from the end).
pub(super) fn stack(im: &mut Importer<'_>, mut vals: Vec<ExprId>, axis: i64) -> Result<ExprId> {
    if vals.is_empty() {
        return Err(invalid("internal: nothing to stack"));
    }
    let rank = im.dims(vals[0])?.0.len();
    let ax = normalize_axis(axis, rank + 1)? as i64;
    if vals.len() == 1 {
        let v = vals.remove(0);
        return im.emit(Op::ExpandDims { axis: vec![ax] }, vec![v]);
    }
    let t = im.b.tuple(vals)?;
    im.emit(Op::Stack { axis: ax }, vec![t])
}

/// A folded or emitted value as an expression.
pub(super) fn val_expr(im: &mut Importer<'_>, v: &Val) -> Result<ExprId> {
    match v {
        Val::Expr(e) => Ok(*e),
        Val::Const(c) => Ok(im.b.constant(c.clone())),
        Val::Ints(i) => match i.to_constant() {
            Some(c) => Ok(im.b.constant(c)),
            None => im.ints_tensor(i),
        },
    }
}

/// The names a body binds each step: its inputs and every node output, nested graphs'
/// included (not its initializers, which hold the same constant every step).
fn scoped_names(g: &GraphProto) -> Vec<String> {
    let mut out: Vec<String> = g.input.iter().map(|i| i.name.clone()).collect();
    fn nodes(ns: &[NodeProto], out: &mut Vec<String>, depth: usize) {
        for n in ns {
            out.extend(n.output.iter().filter(|o| !o.is_empty()).cloned());
            if depth < 64 {
                for a in &n.attribute {
                    if let Some(g) = a.g.as_deref() {
                        out.extend(g.input.iter().map(|i| i.name.clone()));
                        nodes(&g.node, out, depth + 1);
                    }
                }
            }
        }
    }
    nodes(&g.node, &mut out, 0);
    out
}
