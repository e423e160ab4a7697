//! Replacing the uses of bound vars: the shared step of the simplification passes
//! ([`fold_constant`](super::fold_constant), [`remove_identity`](super::remove_identity),
//! [`remove_export_noise`](super::remove_export_noise),
//! [`eliminate_common_subexpr`](super::eliminate_common_subexpr),
//! [`unflatten_matmul`](super::unflatten_matmul)), [`rewrite_entries`], the frame they
//! share (every entry function, inside `if` branches, then dead-code elimination),
//! [`call_of`], the op call a var is bound to, [`rebind`], a binding's new value, and
//! [`bind_chain`], a binding's new value as a chain of calls.
//!
//! Contract: [`Substitution::apply`] rewrites, in one function, every argument, tuple field and
//! tuple-get-item operand that refers to a var in the map (and the returned expression's
//! fields) to the var's replacement. A var the function returns (directly or as a field of the
//! returned tuple) is never replaced: its name is the output's name (ONNX outputs keep their
//! names). A replacement chain (`a → b`, `b → c`) resolves to its end. [`Substitution::allowed`]
//! refuses what would break scoping: a var visible after its dataflow block replaced by a
//! dataflow var. The bindings of replaced vars stay; dead-code elimination removes them.
//!
//! ```text
//! ; map: y -> x
//! y = R.astype(x, dtype="float32")         y = R.astype(x, dtype="float32")   ; now dead
//! z = R.nn.relu(y)                    →    z = R.nn.relu(x)
//! ```

use crate::error::Result;
use crate::ir::Module;
use crate::ir::copy::VarMap;
use crate::ir::{Callee, ExprId, ExprKind, Function, VarId};
use crate::op::Op;
use crate::pattern::matcher::FunctionView;

/// Replacements of vars by expressions (vars or constants) in one function.
pub(crate) struct Substitution {
    map: VarMap<ExprId>,
    /// The vars the function returns (a dense set, as `map`: a function may return any number
    /// of them).
    returned: VarMap<()>,
    any: bool,
}

impl Substitution {
    /// An empty substitution for `f`.
    pub(crate) fn new(f: &Function) -> Self {
        let view = FunctionView::new(f);
        let mut returned = VarMap::new(f.vars.len());
        for &v in view.returned() {
            returned.insert(v, ());
        }
        Substitution {
            map: VarMap::new(f.vars.len()),
            returned,
            any: false,
        }
    }

    /// `e` with replaced vars followed to the end of their chain.
    pub(crate) fn resolve(&self, f: &Function, mut e: ExprId) -> ExprId {
        // Each step moves to an expression recorded earlier: the chain is finite, but bound it.
        for _ in 0..f.vars.len() + 1 {
            match f.as_var(e).and_then(|v| self.map.get(&v)) {
                Some(&next) => e = next,
                None => break,
            }
        }
        e
    }

    /// Whether `var` may be replaced by `by`: `var` is not returned, and `by` is a constant,
    /// or a var that is visible wherever `var` is (a non-dataflow var or param, or `var` is a
    /// dataflow var itself, so its uses are all in its block).
    pub(crate) fn allowed(&self, f: &Function, var: VarId, by: ExprId) -> bool {
        if self.returned.contains_key(&var) {
            return false;
        }
        match &f.expr(by).kind {
            ExprKind::Const(_) => true,
            ExprKind::Var(b) => *b != var && (f.var(var).dataflow || !f.var(*b).dataflow),
            _ => false,
        }
    }

    /// Records `var → by` when [`Substitution::allowed`]; says whether it was recorded.
    pub(crate) fn replace(&mut self, f: &Function, var: VarId, by: ExprId) -> bool {
        let by = self.resolve(f, by);
        if !self.allowed(f, var, by) {
            return false;
        }
        self.map.insert(var, by);
        self.any = true;
        true
    }

    /// Whether anything was recorded.
    pub(crate) fn is_empty(&self) -> bool {
        !self.any
    }

    /// Rewrites the uses in `f` (see the module doc).
    pub(crate) fn apply(&self, f: &mut Function) {
        if !self.any {
            return;
        }
        let ids: Vec<ExprId> = f.exprs.iter().map(|(id, _)| id).collect();
        for id in ids {
            let kind = f.expr(id).kind.clone();
            let new = match kind {
                ExprKind::Call { callee, args } => {
                    let args2: Vec<ExprId> = args.iter().map(|&a| self.resolve(f, a)).collect();
                    (args2 != args).then_some(ExprKind::Call {
                        callee,
                        args: args2,
                    })
                }
                ExprKind::Tuple(fields) => {
                    let f2: Vec<ExprId> = fields.iter().map(|&a| self.resolve(f, a)).collect();
                    (f2 != fields).then_some(ExprKind::Tuple(f2))
                }
                ExprKind::TupleGetItem(t, i) => {
                    let t2 = self.resolve(f, t);
                    (t2 != t).then_some(ExprKind::TupleGetItem(t2, i))
                }
                _ => None,
            };
            if let Some(k) = new {
                f.exprs[id].kind = k;
            }
        }
        // A binding whose value is a replaced var itself (`y = x`) reads the replacement.
        let mut values = Vec::new();
        for b in f.bindings() {
            values.push(self.resolve(f, b.value));
        }
        let mut it = values.into_iter();
        for b in f.blocks.iter_mut().flat_map(|b| b.bindings.iter_mut()) {
            if let Some(v) = it.next() {
                b.value = v;
            }
        }
    }
}

/// Runs a per-function rewrite of a simplification pass: `rewrite` on every function without
/// `Primitive`, `Composite` or `Codegen` (saying whether it changed it), inside the branches of
/// `if`s too (see [`super::regions`]), then dead-code elimination when anything changed.
pub(crate) fn rewrite_entries(
    m: &Module,
    mut rewrite: impl FnMut(&mut Function) -> bool,
) -> Result<Module> {
    super::regions::map_regions(m, |m| {
        let mut out = m.clone();
        let mut changed = false;
        for (_, f) in out.functions.iter_mut() {
            if super::fuse_ops_by_pattern::is_entry(f) {
                changed |= rewrite(f);
            }
        }
        if changed {
            out = super::dead_code_elimination(&out)?;
        }
        Ok(out)
    })
}

/// The op call bound to the var `e` names, through the view (`None`: not a var, not bound,
/// or bound to something other than an op call).
pub(crate) fn call_of<'f>(
    view: &FunctionView<'_>,
    f: &'f Function,
    e: ExprId,
) -> Option<(&'f Op, &'f [ExprId])> {
    let v = f.as_var(e)?;
    let (_, value) = view.bound(v)?;
    match &f.expr(value).kind {
        ExprKind::Call {
            callee: Callee::Op(op),
            args,
        } => Some((op, args.as_slice())),
        _ => None,
    }
}

/// Binds `var` to `value`, with `before` bound just before it (in order).
pub(crate) fn rebind(
    f: &mut Function,
    var: VarId,
    value: ExprId,
    before: impl IntoIterator<Item = crate::ir::Binding>,
) {
    for block in f.blocks.iter_mut() {
        if let Some(i) = block.bindings.iter().position(|b| b.var == var) {
            block.bindings[i] = crate::ir::Binding { var, value };
            block.bindings.splice(i..i, before);
            return;
        }
    }
}

/// One call of a chain [`bind_chain`] binds: the op, its arguments after the chained value (a
/// reshape's target from [`shape_arg`], a weight), the result's dims and the suffix of its
/// var's name.
pub(crate) type ChainCall = (Op, Vec<ExprId>, Vec<crate::ir::Dim>, &'static str);

/// The shape literal `dims`, as a reshape's target.
pub(crate) fn shape_arg(f: &mut Function, dims: &[crate::ir::Dim]) -> ExprId {
    f.add_expr(
        ExprKind::ShapeLit(dims.to_vec()),
        crate::ir::Type::shape(dims.to_vec()),
    )
}

/// Rebinds `y` to the last of `calls` applied in turn to `x` (each call's first argument the
/// previous result; results of dtype `dtype`), each earlier result bound just before `y` to a
/// new var named `<y>_<suffix>` (made unique), with `y`'s dataflow flag and origin. With no
/// calls, `y` is bound to `x` itself.
pub(crate) fn bind_chain(
    f: &mut Function,
    y: VarId,
    x: ExprId,
    calls: Vec<ChainCall>,
    dtype: crate::ir::DType,
) {
    let dataflow = f.var(y).dataflow;
    let origin = f.var(y).origin.clone();
    let y_name = f.var(y).name.clone();
    let last = calls.len();
    let mut before = Vec::new();
    let mut cur = x;
    let mut value = x;
    for (i, (op, rest, dims, suffix)) in calls.into_iter().enumerate() {
        let mut args = vec![cur];
        args.extend(rest);
        let ty = crate::ir::Type::tensor_dims(dims, dtype);
        value = f.add_expr(
            ExprKind::Call {
                callee: Callee::Op(op),
                args,
            },
            ty.clone(),
        );
        if i + 1 < last {
            let base = format!("{y_name}_{suffix}");
            let taken = |c: &str| f.vars.iter().any(|(_, v)| v.name == c);
            let name = super::outline::unique_name(&base, &taken);
            let var = f.add_var_from(name, ty, dataflow, origin.clone());
            before.push(crate::ir::Binding { var, value });
            cur = f.var(var).expr;
        }
    }
    rebind(f, y, value, before);
}
