//! Copying expressions between functions: every pass that rebuilds a function maps the old vars
//! to new expressions and copies values through that map.
//!
//! ```text
//! ; copy `R.add(x, y)` from f into g with x -> a, y -> b
//! R.add(a, b)
//! ```

use super::{Binding, Block, Callee, EntityId, ExprId, ExprKind, Function, IfExpr, Seq, VarId};
use crate::error::{Error, Result};
use rustc_hash::FxHashMap;

/// A dense map from the vars of one function (indexed by id) to values.
pub struct VarMap<T>(Vec<Option<T>>);

impl<T: Copy> VarMap<T> {
    /// An empty map for a function with `len` vars.
    pub fn new(len: usize) -> Self {
        VarMap(vec![None; len])
    }

    /// The value for `v`.
    pub fn get(&self, v: &VarId) -> Option<&T> {
        self.0.get(v.index()).and_then(Option::as_ref)
    }

    /// Sets the value for `v` (ignored when `v` is out of range).
    pub fn insert(&mut self, v: VarId, t: T) {
        if let Some(slot) = self.0.get_mut(v.index()) {
            *slot = Some(t);
        }
    }

    /// Removes the value for `v`, if any.
    pub fn remove(&mut self, v: VarId) {
        if let Some(slot) = self.0.get_mut(v.index()) {
            *slot = None;
        }
    }

    /// Whether `v` has a value.
    pub fn contains_key(&self, v: &VarId) -> bool {
        self.get(v).is_some()
    }
}

/// A dense map from the vars of one function to `u32` values: 4 bytes per var, zeroed when
/// made (0 means absent; values are stored plus one), so a map over a large function costs only
/// the pages that are written.
#[derive(Clone, Debug)]
pub struct VarIndex(Vec<u32>);

impl VarIndex {
    /// An empty map for a function with `len` vars.
    pub fn new(len: usize) -> Self {
        VarIndex(vec![0; len])
    }

    /// The value for `v`.
    #[inline]
    pub fn get(&self, v: VarId) -> Option<u32> {
        match self.0.get(v.index()) {
            Some(&x) if x != 0 => Some(x - 1),
            _ => None,
        }
    }

    /// Sets the value for `v` (ignored when `v` is out of range or `x` is `u32::MAX`, which
    /// no arena index reaches).
    #[inline]
    pub fn insert(&mut self, v: VarId, x: u32) {
        if let (Some(slot), Some(x1)) = (self.0.get_mut(v.index()), x.checked_add(1)) {
            *slot = x1;
        }
    }

    /// Removes the value for `v`, if any.
    pub fn remove(&mut self, v: VarId) {
        if let Some(slot) = self.0.get_mut(v.index()) {
            *slot = 0;
        }
    }

    /// Whether `v` has a value.
    #[inline]
    pub fn contains_key(&self, v: VarId) -> bool {
        self.get(v).is_some()
    }
}

/// A dense map from the vars of one function to expressions (of another), over a [`VarIndex`].
#[derive(Clone, Debug)]
pub struct ExprMap(VarIndex);

impl ExprMap {
    /// An empty map for a function with `len` vars.
    pub fn new(len: usize) -> Self {
        ExprMap(VarIndex::new(len))
    }

    /// The expression for `v`.
    #[inline]
    pub fn get(&self, v: VarId) -> Option<ExprId> {
        self.0.get(v).map(|x| ExprId::new(x as usize))
    }

    /// Sets the expression for `v`.
    #[inline]
    pub fn insert(&mut self, v: VarId, e: ExprId) {
        self.0.insert(v, e.as_u32());
    }

    /// Whether `v` has an expression.
    pub fn contains_key(&self, v: VarId) -> bool {
        self.0.contains_key(v)
    }
}

/// Where a copied expression's vars go.
pub trait VarLookup {
    /// The expression that replaces var `v`.
    fn lookup(&self, v: VarId) -> Option<ExprId>;
}

impl VarLookup for ExprMap {
    fn lookup(&self, v: VarId) -> Option<ExprId> {
        self.get(v)
    }
}

impl VarLookup for VarMap<ExprId> {
    fn lookup(&self, v: VarId) -> Option<ExprId> {
        self.get(&v).copied()
    }
}

impl VarLookup for FxHashMap<VarId, ExprId> {
    fn lookup(&self, v: VarId) -> Option<ExprId> {
        self.get(&v).copied()
    }
}

impl VarLookup for std::collections::HashMap<VarId, ExprId> {
    fn lookup(&self, v: VarId) -> Option<ExprId> {
        self.get(&v).copied()
    }
}

/// Copies expression `e` of `src` into `dst`, mapping vars through `map`.
pub fn copy_expr(
    src: &Function,
    e: ExprId,
    dst: &mut Function,
    map: &impl VarLookup,
) -> Result<ExprId> {
    let d = src.expr(e);
    let kind = match &d.kind {
        ExprKind::Var(v) => {
            return map.lookup(*v).ok_or_else(|| {
                Error::Invalid(format!(
                    "internal: `{}` has no mapping while outlining",
                    src.var(*v).name
                ))
            });
        }
        ExprKind::Call { callee, args } => {
            let callee = match callee {
                Callee::Local(v) => {
                    let ne = map.lookup(*v).ok_or_else(|| {
                        Error::Invalid(format!(
                            "internal: local callee `{}` has no mapping",
                            src.var(*v).name
                        ))
                    })?;
                    match dst.as_var(ne) {
                        Some(nv) => Callee::Local(nv),
                        None => {
                            return Err(Error::Invalid(
                                "internal: local callee is not a var".into(),
                            ));
                        }
                    }
                }
                other => other.clone(),
            };
            let args = args
                .iter()
                .map(|&a| copy_expr(src, a, dst, map))
                .collect::<Result<_>>()?;
            ExprKind::Call { callee, args }
        }
        ExprKind::Tuple(xs) => ExprKind::Tuple(
            xs.iter()
                .map(|&x| copy_expr(src, x, dst, map))
                .collect::<Result<_>>()?,
        ),
        ExprKind::TupleGetItem(x, i) => ExprKind::TupleGetItem(copy_expr(src, *x, dst, map)?, *i),
        ExprKind::If(i) => {
            let cond = copy_expr(src, i.cond, dst, map)?;
            let then_branch = copy_seq(src, &i.then_branch, dst, map)?;
            let else_branch = copy_seq(src, &i.else_branch, dst, map)?;
            ExprKind::If(Box::new(IfExpr {
                cond,
                then_branch,
                else_branch,
            }))
        }
        other @ (ExprKind::Const(_)
        | ExprKind::ConstRef(_)
        | ExprKind::ShapeLit(_)
        | ExprKind::Prim(_)
        | ExprKind::Function(_)) => other.clone(),
    };
    Ok(dst.add_expr(kind, d.ty.clone()))
}

/// The vars of an outer lookup plus those a branch being copied has bound so far.
struct Overlay<'a> {
    base: &'a dyn VarLookup,
    own: FxHashMap<VarId, ExprId>,
}

impl VarLookup for Overlay<'_> {
    fn lookup(&self, v: VarId) -> Option<ExprId> {
        self.own.get(&v).copied().or_else(|| self.base.lookup(v))
    }
}

/// Copies a branch of an `if` into `dst`: each binding gets a new var (same name, type,
/// dataflow-ness and origin), visible to the rest of the branch only.
pub fn copy_seq(src: &Function, s: &Seq, dst: &mut Function, map: &impl VarLookup) -> Result<Seq> {
    let mut local = Overlay {
        base: map,
        own: FxHashMap::default(),
    };
    let mut blocks = Vec::with_capacity(s.blocks.len());
    for block in &s.blocks {
        let mut out = Block {
            dataflow: block.dataflow,
            bindings: Vec::with_capacity(block.bindings.len()),
        };
        for b in &block.bindings {
            let value = copy_expr(src, b.value, dst, &local)?;
            let vd = src.var(b.var);
            let var = dst.add_var_from(
                vd.name.clone(),
                vd.ty.clone(),
                vd.dataflow,
                vd.origin.clone(),
            );
            local.own.insert(b.var, dst.var_expr(var));
            out.bindings.push(Binding { var, value });
        }
        blocks.push(out);
    }
    let body = copy_expr(src, s.body, dst, &local)?;
    Ok(Seq { blocks, body })
}
