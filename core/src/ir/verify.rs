//! The verifier: checks a module against the IR's invariants and reports every violation at once.
//!
//! Invariants (each violation names the function and, where there is one, the binding):
//!
//! 1. **Ids in range.** Every `ExprId` and `VarId` a function mentions is in its arenas.
//! 2. **Topological arena.** An expression's operands have smaller ids than the expression, so
//!    expressions form no cycle.
//! 3. **SSA.** Every var is defined exactly once: as a parameter or by one binding.
//! 4. **Scope.** Every var use is preceded by its definition; a dataflow var is bound only in a
//!    dataflow block and used only inside that block (never after it, never in `return`). A var
//!    bound in a branch of an `if` is visible only in that branch (the `if`'s own var is its
//!    result); an `if` is bound only in a non-dataflow block (as in Relax).
//! 5. **Normal form.** Call arguments, tuple fields and the operand of `t[i]` are leaves: vars,
//!    constants, shape literals, prim values, or tuples of leaves. The returned expression, the
//!    condition of an `if` and the body of each branch are leaves. Local functions and `if`s
//!    appear only as the value of a binding.
//! 6. **Callees.** A global callee names a function of the module; a local callee is a var
//!    bound to a local function.
//! 7. **Types.** Every expression's recorded type equals the type inferred from its operands
//!    (the op set's inference, callee signatures, tuple rules; an `if`'s condition is a bool
//!    scalar and its type joins its branches'); each binding's var type accepts
//!    its value's type; the declared return type accepts the returned expression's type.
//! 8. **Symbolic dims.** Every symbolic dim in a type is declared in the function's `sym_vars`
//!    (or in an enclosing function's).
//! 9. **Attributes.** A function with `Codegen` is public (has `global_symbol`); no two functions
//!    share a `global_symbol`; `Composite` and `Codegen` are non-empty.
//!
//! ```text
//! @R.function
//! def main(x: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
//!     with R.dataflow():
//!         y: R.Tensor((4,), dtype="float32") = R.exp(x)
//!     return y          # error: dataflow var `y` used outside its dataflow block
//! ```

use super::infer::{brief, infer_kind};
use super::{Callee, EntityId, ExprId, ExprKind, Function, Module, Sym, Type, VarId};
use std::collections::{BTreeSet, HashMap};
use std::fmt;

/// One violated invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    /// The function (nested functions as `outer/local_var`).
    pub function: String,
    /// The binding's var name, when the violation is in a binding.
    pub binding: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.binding {
            Some(b) => write!(
                f,
                "in function `{}`, binding `{b}`: {}",
                self.function, self.message
            ),
            None => write!(f, "in function `{}`: {}", self.function, self.message),
        }
    }
}

/// Every violation found, in function order then binding order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyErrors(pub Vec<VerifyError>);

impl fmt::Display for VerifyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the module violates {} IR invariant(s):", self.0.len())?;
        for e in &self.0 {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

/// Verifies every function of the module; `Ok` or every violation at once.
pub fn verify(m: &Module) -> Result<(), VerifyErrors> {
    let mut errs = Vec::new();
    let mut symbols: HashMap<&str, &str> = HashMap::new();
    for (name, f) in &m.functions {
        if let Some(gs) = &f.attrs.global_symbol
            && let Some(other) = symbols.insert(gs, name)
        {
            errs.push(VerifyError {
                function: name.clone(),
                binding: None,
                message: format!("global_symbol `{gs}` is also used by function `{other}`"),
            });
        }
        if f.attrs.codegen.is_some() && f.attrs.global_symbol.is_none() {
            errs.push(VerifyError {
                function: name.clone(),
                binding: None,
                message: "a function with `Codegen` must be public (have a global_symbol)".into(),
            });
        }
        Verifier {
            m,
            f,
            fname: name.clone(),
            errs: &mut errs,
            outer_syms: &BTreeSet::new(),
        }
        .run();
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(VerifyErrors(errs))
    }
}

/// Where each var is defined (while it is in scope), indexed by var; and whether it was ever
/// defined (a var bound in one branch and again in the other is defined twice).
struct DefTable(Vec<Option<Def>>, Vec<bool>);

impl DefTable {
    fn new(n: usize) -> Self {
        DefTable(vec![None; n], vec![false; n])
    }

    fn get(&self, v: &VarId) -> Option<&Def> {
        self.0.get(v.index()).and_then(Option::as_ref)
    }

    /// Records a definition; whether `v` was defined before (a double definition).
    fn insert(&mut self, v: VarId, d: Def) -> bool {
        if let Some(slot) = self.0.get_mut(v.index()) {
            *slot = Some(d);
        }
        self.1
            .get_mut(v.index())
            .is_some_and(|seen| std::mem::replace(seen, true))
    }

    /// Ends the scope of `v` (a var bound in a branch, after the `if`).
    fn hide(&mut self, v: VarId) {
        if let Some(slot) = self.0.get_mut(v.index()) {
            *slot = None;
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Def {
    /// Defined as a param or a non-dataflow binding.
    Global,
    /// A dataflow var of the block with this index.
    Dataflow(usize),
}

struct Verifier<'a> {
    m: &'a Module,
    f: &'a Function,
    fname: String,
    errs: &'a mut Vec<VerifyError>,
    outer_syms: &'a BTreeSet<Sym>,
}

impl Verifier<'_> {
    fn err(&mut self, binding: Option<VarId>, message: String) {
        let binding = binding
            .and_then(|v| self.f.vars.get(v))
            .map(|d| d.name.clone());
        self.errs.push(VerifyError {
            function: self.fname.clone(),
            binding,
            message,
        });
    }

    fn run(&mut self) {
        let f = self.f;
        for &s in [&f.attrs.composite, &f.attrs.codegen].iter() {
            if s.as_deref() == Some("") {
                self.err(None, "`Composite` and `Codegen` must not be empty".into());
            }
        }
        // (1), (2): arena shape.
        for (id, d) in f.exprs.iter() {
            let if_ops: Vec<ExprId>;
            let ops: &[ExprId] = match &d.kind {
                ExprKind::If(i) => {
                    if_ops = std::iter::once(i.cond)
                        .chain(i.branches().into_iter().flat_map(|s| {
                            s.bindings().map(|b| b.value).chain(std::iter::once(s.body))
                        }))
                        .collect();
                    &if_ops
                }
                ExprKind::Var(v) => {
                    if f.vars.get(*v).is_none_or(|vd| vd.expr != id) {
                        self.err(None, format!("expression {id} refers to var {v}, which is out of range or owned by another expression"));
                    }
                    &[]
                }
                ExprKind::Call { callee, args } => {
                    if let Callee::Local(v) = callee
                        && f.vars.get(*v).is_none()
                    {
                        self.err(None, format!("local callee {v} is out of range"));
                    }
                    args
                }
                ExprKind::Tuple(xs) => xs,
                ExprKind::TupleGetItem(x, _) => std::slice::from_ref(x),
                _ => &[],
            };
            for &o in ops {
                if o.index() >= id.index() {
                    self.err(
                        None,
                        format!("expression {id} uses {o}, which is not defined before it"),
                    );
                }
            }
        }
        let mut syms: BTreeSet<Sym> = self.outer_syms.clone();
        syms.extend(f.sym_vars.iter().cloned());
        // (3), (4): definitions and scope.
        let mut def = DefTable::new(f.vars.len());
        for &p in &f.params {
            if f.vars.get(p).is_none() {
                self.err(None, format!("parameter {p} is out of range"));
                continue;
            }
            if def.insert(p, Def::Global) {
                self.err(
                    None,
                    format!("parameter `{}` is defined twice", f.var(p).name),
                );
            }
            self.check_syms(None, &f.var(p).ty.clone(), &syms);
        }
        let mut next_block = 0;
        let mut scoped = Vec::new();
        self.check_blocks(&f.blocks, &mut def, &syms, &mut next_block, &mut scoped);
        match f.ret {
            None => self.err(None, "the function has no return expression".into()),
            Some(r) if f.exprs.get(r).is_none() => {
                self.err(None, format!("return {r} is out of range"))
            }
            Some(r) => {
                self.check_leaf(None, r, "returned expression");
                self.check_uses(None, r, &def, None, true);
                let actual = f.expr(r).ty.clone();
                if !f.ret_ty.accepts(&actual) {
                    self.err(
                        None,
                        format!(
                            "declared return type {} does not accept the returned {}",
                            brief(&f.ret_ty),
                            brief(&actual)
                        ),
                    );
                }
                self.check_syms(None, &f.ret_ty.clone(), &syms);
            }
        }
    }

    /// Checks the bindings of `blocks` (numbered from `next_block` for dataflow scoping),
    /// recording each bound var in `def` and `scoped`; the branches of an `if` are checked in
    /// their own scope.
    fn check_blocks(
        &mut self,
        blocks: &[super::Block],
        def: &mut DefTable,
        syms: &BTreeSet<Sym>,
        next_block: &mut usize,
        scoped: &mut Vec<VarId>,
    ) {
        let f = self.f;
        for block in blocks {
            let bi = *next_block;
            *next_block += 1;
            for b in &block.bindings {
                let Some(vd) = f.vars.get(b.var) else {
                    self.err(None, format!("binding var {} is out of range", b.var));
                    continue;
                };
                let Some(value) = f.exprs.get(b.value) else {
                    self.err(Some(b.var), format!("value {} is out of range", b.value));
                    continue;
                };
                if vd.dataflow && !block.dataflow {
                    self.err(
                        Some(b.var),
                        "a dataflow var is bound outside a dataflow block".into(),
                    );
                }
                // Uses in the value.
                self.check_uses(Some(b.var), b.value, def, Some(bi), true);
                if let ExprKind::Call {
                    callee: Callee::Local(v),
                    ..
                } = &value.kind
                {
                    self.check_use(Some(b.var), *v, def, Some(bi));
                }
                // (5) normal form of the value.
                match &value.kind {
                    ExprKind::Call { args, .. } => {
                        for &a in args {
                            self.check_leaf(Some(b.var), a, "call argument");
                        }
                    }
                    ExprKind::Tuple(xs) => {
                        for &x in xs {
                            self.check_leaf(Some(b.var), x, "tuple field");
                        }
                    }
                    ExprKind::TupleGetItem(x, _) => {
                        self.check_leaf(Some(b.var), *x, "tuple-get-item operand")
                    }
                    ExprKind::Function(inner) => {
                        let mut sub = Verifier {
                            m: self.m,
                            f: inner,
                            fname: format!("{}/{}", self.fname, vd.name),
                            errs: self.errs,
                            outer_syms: syms,
                        };
                        sub.run();
                    }
                    ExprKind::If(i) => {
                        if block.dataflow {
                            self.err(
                                Some(b.var),
                                "an `if` is bound inside a dataflow block (Relax allows it only outside)".into(),
                            );
                        }
                        self.check_leaf(Some(b.var), i.cond, "condition of `if`");
                        self.check_uses(Some(b.var), i.cond, def, None, false);
                        for s in i.branches() {
                            let mark = scoped.len();
                            self.check_blocks(&s.blocks, def, syms, next_block, scoped);
                            self.check_leaf(Some(b.var), s.body, "body of a branch");
                            self.check_uses(Some(b.var), s.body, def, None, true);
                            for v in scoped.drain(mark..) {
                                def.hide(v);
                            }
                        }
                    }
                    _ => {}
                }
                // (6), (7) callees and types.
                self.check_types(b.var, b.value);
                self.check_syms(Some(b.var), &vd.ty.clone(), syms);
                scoped.push(b.var);
                if def.insert(
                    b.var,
                    if vd.dataflow {
                        Def::Dataflow(bi)
                    } else {
                        Def::Global
                    },
                ) {
                    self.err(
                        Some(b.var),
                        format!("`{}` is defined more than once", vd.name),
                    );
                }
            }
        }
    }

    fn check_use(&mut self, at: Option<VarId>, v: VarId, def: &DefTable, block: Option<usize>) {
        let name = self
            .f
            .vars
            .get(v)
            .map_or_else(|| v.to_string(), |d| d.name.clone());
        match def.get(&v) {
            None => self.err(at, format!("`{name}` is used before it is defined")),
            Some(Def::Dataflow(b)) if Some(*b) != block => self.err(
                at,
                format!("dataflow var `{name}` is used outside its dataflow block"),
            ),
            Some(_) => {}
        }
    }

    fn check_uses(
        &mut self,
        at: Option<VarId>,
        e: ExprId,
        def: &DefTable,
        block: Option<usize>,
        top: bool,
    ) {
        let Some(d) = self.f.exprs.get(e) else { return };
        match &d.kind {
            ExprKind::Var(v) => self.check_use(at, *v, def, block),
            ExprKind::Call { args, .. } if top => {
                for &a in args {
                    self.check_uses(at, a, def, block, false);
                }
            }
            ExprKind::Tuple(xs) => {
                for &x in xs {
                    self.check_uses(at, x, def, block, false);
                }
            }
            ExprKind::TupleGetItem(x, _) if top => self.check_uses(at, *x, def, block, false),
            _ => {}
        }
    }

    fn check_leaf(&mut self, at: Option<VarId>, e: ExprId, what: &str) {
        let Some(d) = self.f.exprs.get(e) else {
            self.err(at, format!("{what} {e} is out of range"));
            return;
        };
        match &d.kind {
            ExprKind::Var(_)
            | ExprKind::Const(_)
            | ExprKind::ConstRef(_)
            | ExprKind::ShapeLit(_)
            | ExprKind::Prim(_) => {}
            ExprKind::Tuple(xs) => {
                for &x in xs {
                    self.check_leaf(at, x, what);
                }
            }
            _ => self.err(at, format!("{what} must be a var, constant, shape, prim value or tuple of those (normal form)")),
        }
    }

    fn check_types(&mut self, var: VarId, value: ExprId) {
        let f = self.f;
        let d = f.expr(value);
        if let ExprKind::Call {
            callee: Callee::Global(g),
            ..
        } = &d.kind
            && self.m.get(g).is_none()
        {
            self.err(
                Some(var),
                format!("calls `{g}`, which is not a function of the module"),
            );
            return;
        }
        match infer_kind(f, self.m, &d.kind) {
            Err(msg) => self.err(Some(var), format!("type error: {msg}")),
            Ok(t) => {
                // A constant without a value has the type its binding's annotation gave.
                let refined = matches!(d.kind, ExprKind::ConstRef(_)) && t.accepts(&d.ty);
                if t != d.ty && !refined {
                    self.err(
                        Some(var),
                        format!(
                            "recorded type {} differs from the inferred {}",
                            brief(&d.ty),
                            brief(&t)
                        ),
                    );
                }
                let vt = &f.var(var).ty;
                // An annotation may refine a less specific value type (see the parser).
                let refines = d.ty.accepts(vt);
                if !vt.accepts(&d.ty) && !refines {
                    self.err(
                        Some(var),
                        format!(
                            "var type {} does not accept the value's type {}",
                            brief(vt),
                            brief(&d.ty)
                        ),
                    );
                }
            }
        }
    }

    fn check_syms(&mut self, at: Option<VarId>, t: &Type, syms: &BTreeSet<Sym>) {
        let mut used = BTreeSet::new();
        t.collect_syms(&mut used);
        for s in used.difference(syms) {
            self.err(
                at,
                format!("symbolic dim `{s}` is not declared in the function"),
            );
        }
    }
}
