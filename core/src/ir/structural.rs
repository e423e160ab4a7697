//! Structural equality and hashing of functions and modules, ignoring variable and symbolic-dim
//! names (as TVM's `StructuralEqual` with `map_free_vars`).
//!
//! Two functions are equal when their params have equal types, their blocks hold the same
//! bindings in the same order (same dataflow-ness, equal var types, equal values), their
//! returns, return types and attributes are equal — up to a consistent renaming of vars and of
//! symbolic dims. Constants compare by dtype, shape and bytes.
//!
//! ```text
//! def f(x: R.Tensor((n,), "float32")): y = R.exp(x); return y
//! def g(a: R.Tensor((m,), "float32")): b = R.exp(a); return b     # equal to f
//! ```

use super::{Block, Callee, Dim, ExprId, ExprKind, Function, Module, Sym, Type, VarId};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// Whether two modules hold the same function names with structurally equal functions.
pub fn module_eq(a: &Module, b: &Module) -> bool {
    a.functions.len() == b.functions.len()
        && a.functions
            .iter()
            .all(|(name, fa)| b.get(name).is_some_and(|fb| function_eq(fa, fb)))
}

/// Whether two functions are structurally equal (names of vars and symbolic dims ignored).
pub fn function_eq(a: &Function, b: &Function) -> bool {
    Eq2 {
        a,
        b,
        vars: HashMap::new(),
        syms: HashMap::new(),
        rsyms: HashMap::new(),
    }
    .functions()
}

struct Eq2<'f> {
    a: &'f Function,
    b: &'f Function,
    vars: HashMap<VarId, VarId>,
    syms: HashMap<Sym, Sym>,
    rsyms: HashMap<Sym, Sym>,
}

impl Eq2<'_> {
    fn functions(&mut self) -> bool {
        let (a, b) = (self.a, self.b);
        if a.params.len() != b.params.len()
            || a.blocks.len() != b.blocks.len()
            || a.attrs != b.attrs
        {
            return false;
        }
        for (&pa, &pb) in a.params.iter().zip(&b.params) {
            if !self.ty(&a.var(pa).ty, &b.var(pb).ty) {
                return false;
            }
            self.vars.insert(pa, pb);
        }
        if !self.blocks(&a.blocks, &b.blocks) {
            return false;
        }
        match (a.ret, b.ret) {
            (Some(ra), Some(rb)) => self.expr(ra, rb) && self.ty(&a.ret_ty, &b.ret_ty),
            (None, None) => true,
            _ => false,
        }
    }

    fn blocks(&mut self, xa: &[Block], xb: &[Block]) -> bool {
        let (a, b) = (self.a, self.b);
        if xa.len() != xb.len() {
            return false;
        }
        for (ba, bb) in xa.iter().zip(xb) {
            if ba.dataflow != bb.dataflow || ba.bindings.len() != bb.bindings.len() {
                return false;
            }
            for (x, y) in ba.bindings.iter().zip(&bb.bindings) {
                let (Some(va), Some(vb)) = (a.vars.get(x.var), b.vars.get(y.var)) else {
                    return false;
                };
                if va.dataflow != vb.dataflow
                    || !self.ty(&va.ty, &vb.ty)
                    || !self.expr(x.value, y.value)
                {
                    return false;
                }
                self.vars.insert(x.var, y.var);
            }
        }
        true
    }

    fn expr(&mut self, ea: ExprId, eb: ExprId) -> bool {
        let (Some(da), Some(db)) = (self.a.exprs.get(ea), self.b.exprs.get(eb)) else {
            return false;
        };
        match (&da.kind, &db.kind) {
            (ExprKind::Var(x), ExprKind::Var(y)) => self.vars.get(x) == Some(y),
            (ExprKind::Const(x), ExprKind::Const(y)) => x == y,
            // No value to compare: equal only when they are the same constant.
            (ExprKind::ConstRef(x), ExprKind::ConstRef(y)) => x == y && da.ty == db.ty,
            (ExprKind::Prim(x), ExprKind::Prim(y)) => x == y,
            (ExprKind::ShapeLit(x), ExprKind::ShapeLit(y)) => self.dims(x, y),
            (ExprKind::Tuple(x), ExprKind::Tuple(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(&p, &q)| self.expr(p, q))
            }
            (ExprKind::TupleGetItem(x, i), ExprKind::TupleGetItem(y, j)) => {
                i == j && self.expr(*x, *y)
            }
            (
                ExprKind::Call {
                    callee: ca,
                    args: xa,
                },
                ExprKind::Call {
                    callee: cb,
                    args: xb,
                },
            ) => {
                let callee_eq = match (ca, cb) {
                    (Callee::Op(p), Callee::Op(q)) => p == q,
                    (Callee::Global(p), Callee::Global(q)) => p == q,
                    (Callee::Local(p), Callee::Local(q)) => self.vars.get(p) == Some(q),
                    _ => false,
                };
                callee_eq
                    && xa.len() == xb.len()
                    && xa.iter().zip(xb).all(|(&p, &q)| self.expr(p, q))
                    && self.ty(&da.ty, &db.ty)
            }
            (ExprKind::Function(fa), ExprKind::Function(fb)) => function_eq(fa, fb),
            (ExprKind::If(x), ExprKind::If(y)) => {
                self.expr(x.cond, y.cond)
                    && x.branches().into_iter().zip(y.branches()).all(|(p, q)| {
                        self.blocks(&p.blocks, &q.blocks) && self.expr(p.body, q.body)
                    })
                    && self.ty(&da.ty, &db.ty)
            }
            _ => false,
        }
    }

    fn sym(&mut self, x: &Sym, y: &Sym) -> bool {
        match (self.syms.get(x), self.rsyms.get(y)) {
            (Some(m), Some(r)) => m == y && r == x,
            (None, None) => {
                self.syms.insert(x.clone(), y.clone());
                self.rsyms.insert(y.clone(), x.clone());
                true
            }
            _ => false,
        }
    }

    fn dim(&mut self, x: &Dim, y: &Dim) -> bool {
        match (x, y) {
            (Dim::Static(p), Dim::Static(q)) => p == q,
            (Dim::Sym(p), Dim::Sym(q)) => self.sym(p, q),
            (Dim::Expr(p), Dim::Expr(q)) => {
                p.0 == q.0 && self.dim(&p.1, &q.1) && self.dim(&p.2, &q.2)
            }
            _ => false,
        }
    }

    fn dims(&mut self, x: &[Dim], y: &[Dim]) -> bool {
        x.len() == y.len() && x.iter().zip(y).all(|(p, q)| self.dim(p, q))
    }

    fn opt_dims(&mut self, x: Option<&[Dim]>, y: Option<&[Dim]>) -> bool {
        match (x, y) {
            (Some(p), Some(q)) => self.dims(p, q),
            (None, None) => true,
            _ => false,
        }
    }

    fn ty(&mut self, x: &Type, y: &Type) -> bool {
        match (x, y) {
            (Type::Tensor(p), Type::Tensor(q)) => {
                p.dtype == q.dtype
                    && p.rank() == q.rank()
                    && self.opt_dims(p.dims.as_deref(), q.dims.as_deref())
            }
            (Type::Tuple(p), Type::Tuple(q)) => {
                p.len() == q.len() && p.iter().zip(q).all(|(s, t)| self.ty(s, t))
            }
            (Type::Shape { dims: p, ndim: n }, Type::Shape { dims: q, ndim: m }) => {
                (p.is_some() || n == m) && self.opt_dims(p.as_deref(), q.as_deref())
            }
            (Type::Prim(p), Type::Prim(q)) => p == q,
            (Type::Object, Type::Object) => true,
            (Type::Func(p), Type::Func(q)) => {
                p.params.len() == q.params.len()
                    && p.params.iter().zip(&q.params).all(|(s, t)| self.ty(s, t))
                    && self.ty(&p.ret, &q.ret)
            }
            _ => false,
        }
    }
}

/// A structural hash consistent with [`function_eq`]: equal functions hash equally.
pub fn function_hash(f: &Function) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    let mut syms: HashMap<Sym, usize> = HashMap::new();
    hash_function(f, &mut h, &mut syms);
    h.finish()
}

fn hash_function(f: &Function, h: &mut impl Hasher, syms: &mut HashMap<Sym, usize>) {
    // Var positions: params first, then bindings in order.
    let mut pos: HashMap<VarId, usize> = HashMap::new();
    f.params.len().hash(h);
    for &p in &f.params {
        let n = pos.len();
        pos.insert(p, n);
        hash_ty(&f.var(p).ty, h, syms);
    }
    hash_blocks(f, &f.blocks, h, &mut pos, syms);
    if let Some(r) = f.ret {
        hash_expr(f, r, h, &mut pos, syms);
    }
    hash_ty(&f.ret_ty, h, syms);
    let a = &f.attrs;
    (&a.composite, &a.codegen, &a.global_symbol).hash(h);
    a.is_primitive().hash(h);
    a.extra.len().hash(h);
    for k in a.extra.keys() {
        k.hash(h);
    }
}

fn hash_blocks(
    f: &Function,
    blocks: &[Block],
    h: &mut impl Hasher,
    pos: &mut HashMap<VarId, usize>,
    syms: &mut HashMap<Sym, usize>,
) {
    blocks.len().hash(h);
    for b in blocks {
        (b.dataflow, b.bindings.len()).hash(h);
        for bind in &b.bindings {
            if let Some(v) = f.vars.get(bind.var) {
                v.dataflow.hash(h);
                hash_ty(&v.ty, h, syms);
            }
            hash_expr(f, bind.value, h, pos, syms);
            let n = pos.len();
            pos.insert(bind.var, n);
        }
    }
}

fn hash_expr(
    f: &Function,
    e: ExprId,
    h: &mut impl Hasher,
    pos: &mut HashMap<VarId, usize>,
    syms: &mut HashMap<Sym, usize>,
) {
    let Some(d) = f.exprs.get(e) else { return };
    std::mem::discriminant(&d.kind).hash(h);
    match &d.kind {
        ExprKind::Var(v) => pos.get(v).hash(h),
        ExprKind::Const(c) => c.hash(h),
        ExprKind::ConstRef(c) => c.hash(h),
        ExprKind::Prim(p) => p.hash(h),
        ExprKind::ShapeLit(ds) => ds.iter().for_each(|x| hash_dim(x, h, syms)),
        ExprKind::Tuple(xs) => xs.iter().for_each(|&x| hash_expr(f, x, h, pos, syms)),
        ExprKind::TupleGetItem(x, i) => {
            i.hash(h);
            hash_expr(f, *x, h, pos, syms);
        }
        ExprKind::Call { callee, args } => {
            match callee {
                Callee::Op(op) => op.hash(h),
                Callee::Global(g) => g.hash(h),
                Callee::Local(v) => pos.get(v).hash(h),
            }
            args.iter().for_each(|&x| hash_expr(f, x, h, pos, syms));
        }
        ExprKind::Function(inner) => function_hash(inner).hash(h),
        ExprKind::If(i) => {
            hash_expr(f, i.cond, h, pos, syms);
            for s in i.branches() {
                hash_blocks(f, &s.blocks, h, pos, syms);
                hash_expr(f, s.body, h, pos, syms);
            }
        }
    }
}

fn hash_dim(d: &Dim, h: &mut impl Hasher, syms: &mut HashMap<Sym, usize>) {
    match d {
        Dim::Static(v) => (0u8, v).hash(h),
        Dim::Sym(s) => {
            let n = syms.len();
            (1u8, *syms.entry(s.clone()).or_insert(n)).hash(h);
        }
        Dim::Expr(e) => {
            (2u8, e.0).hash(h);
            hash_dim(&e.1, h, syms);
            hash_dim(&e.2, h, syms);
        }
    }
}

fn hash_ty(t: &Type, h: &mut impl Hasher, syms: &mut HashMap<Sym, usize>) {
    std::mem::discriminant(t).hash(h);
    match t {
        Type::Tensor(tt) => {
            (tt.dtype, tt.rank()).hash(h);
            if let Some(ds) = &tt.dims {
                ds.iter().for_each(|d| hash_dim(d, h, syms));
            }
        }
        Type::Tuple(ts) => {
            ts.len().hash(h);
            ts.iter().for_each(|x| hash_ty(x, h, syms));
        }
        Type::Shape { dims, ndim } => {
            ndim.hash(h);
            dims.iter().flatten().for_each(|d| hash_dim(d, h, syms));
        }
        Type::Prim(d) => d.hash(h),
        Type::Func(ft) => {
            ft.params.iter().for_each(|x| hash_ty(x, h, syms));
            hash_ty(&ft.ret, h, syms);
        }
        Type::Object => {}
    }
}
