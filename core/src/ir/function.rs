//! Functions: typed params, blocks of bindings, a returned expression and attributes.

use super::dim::Sym;
use super::entity::Arena;
use super::expr::{Callee, ExprData, ExprId, ExprKind, VarData, VarId};
use super::ty::Type;
use std::collections::BTreeMap;

/// A free-form attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A bool.
    Bool(bool),
}

impl AttrValue {
    /// Truthiness as TVM reads `Primitive`: `True`, or a non-zero integer.
    pub fn is_truthy(&self) -> bool {
        match self {
            AttrValue::Bool(b) => *b,
            AttrValue::Int(i) => *i != 0,
            AttrValue::Float(f) => *f != 0.0,
            AttrValue::Str(s) => !s.is_empty(),
        }
    }
}

/// Function attributes: the ones fusebox interprets, typed, plus free-form others.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FuncAttrs {
    /// `Composite`: the pattern name that made this function (`"dnnl.conv2d_relu"`).
    pub composite: Option<String>,
    /// `Codegen`: the backend that compiles this function.
    pub codegen: Option<String>,
    /// `Primitive`: kept as written (`True` or `1`) so printing round-trips.
    pub primitive: Option<AttrValue>,
    /// `global_symbol`: the exported name; `None` for private functions.
    pub global_symbol: Option<String>,
    /// Every other attribute, in key order.
    pub extra: BTreeMap<String, AttrValue>,
}

impl FuncAttrs {
    /// Whether `Primitive` is set and truthy.
    pub fn is_primitive(&self) -> bool {
        self.primitive.as_ref().is_some_and(AttrValue::is_truthy)
    }
}

/// A binding `var = value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The bound var.
    pub var: VarId,
    /// The value.
    pub value: ExprId,
}

/// A block of bindings: a dataflow block (`with R.dataflow():`) or a plain one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block {
    /// Whether this is a dataflow block.
    pub dataflow: bool,
    /// The bindings, in order.
    pub bindings: Vec<Binding>,
}

/// A function: params, blocks, a returned expression, attributes, and the arenas that hold its
/// vars and expressions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Function {
    /// Parameters, in order.
    pub params: Vec<VarId>,
    /// Blocks, in order.
    pub blocks: Vec<Block>,
    /// The returned expression (`None` only while a function is being built).
    pub ret: Option<ExprId>,
    /// The declared (or inferred) return type.
    pub ret_ty: Type,
    /// Attributes.
    pub attrs: FuncAttrs,
    /// Symbolic dims the function uses, in the order they are first defined.
    pub sym_vars: Vec<Sym>,
    /// The vars.
    pub vars: Arena<VarId, VarData>,
    /// The expressions.
    pub exprs: Arena<ExprId, ExprData>,
}

impl Function {
    /// An empty function.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a var (and the expression that refers to it), with no origin.
    pub fn add_var(&mut self, name: impl Into<String>, ty: Type, dataflow: bool) -> VarId {
        self.add_var_from(name, ty, dataflow, super::expr::Origin::default())
    }

    /// Adds a var with the given origin (see [`VarData::origin`]): a pass that moves a
    /// binding passes the old var's `origin.clone()`.
    pub fn add_var_from(
        &mut self,
        name: impl Into<String>,
        ty: Type,
        dataflow: bool,
        origin: super::expr::Origin,
    ) -> VarId {
        let next = self.vars.len();
        let expr = self.exprs.push(ExprData {
            kind: ExprKind::Var(super::entity::EntityId::new(next)),
            ty: ty.clone(),
        });
        self.vars.push(VarData {
            name: name.into(),
            ty,
            dataflow,
            expr,
            origin,
        })
    }

    /// Gives every var of this function (and of the local functions inside) without an origin
    /// the origin `<prefix>/<name>`: what a parser does for the module as the user wrote it.
    pub fn set_origins(&mut self, prefix: &str) {
        for (_, v) in self.vars.iter_mut() {
            if v.origin.is_empty() {
                v.origin = super::expr::Origin::one(&format!("{prefix}/{}", v.name));
            }
        }
        for (_, e) in self.exprs.iter_mut() {
            if let ExprKind::Function(inner) = &mut e.kind {
                inner.set_origins(prefix);
            }
        }
    }

    /// Adds an expression.
    pub fn add_expr(&mut self, kind: ExprKind, ty: Type) -> ExprId {
        self.exprs.push(ExprData { kind, ty })
    }

    /// The expression data.
    pub fn expr(&self, e: ExprId) -> &ExprData {
        &self.exprs[e]
    }

    /// The var data.
    pub fn var(&self, v: VarId) -> &VarData {
        &self.vars[v]
    }

    /// Gives var `v` (and the expression that refers to it) the type `ty`: a binding's
    /// annotation that refines its value's type.
    pub fn set_var_type(&mut self, v: VarId, ty: Type) {
        let e = self.vars[v].expr;
        self.vars[v].ty = ty.clone();
        self.exprs[e].ty = ty;
    }

    /// The expression that refers to `v`.
    pub fn var_expr(&self, v: VarId) -> ExprId {
        self.vars[v].expr
    }

    /// The var an expression refers to, if it is a var use.
    pub fn as_var(&self, e: ExprId) -> Option<VarId> {
        match self.exprs.get(e)?.kind {
            ExprKind::Var(v) => Some(v),
            _ => None,
        }
    }

    /// All bindings in order, across blocks.
    pub fn bindings(&self) -> impl Iterator<Item = &Binding> {
        self.blocks.iter().flat_map(|b| b.bindings.iter())
    }

    /// Whether this function is private (has no `global_symbol`).
    pub fn is_private(&self) -> bool {
        self.attrs.global_symbol.is_none()
    }

    /// The function's type (params and return).
    pub fn func_type(&self) -> super::ty::FuncType {
        super::ty::FuncType {
            params: self
                .params
                .iter()
                .map(|&p| self.vars[p].ty.clone())
                .collect(),
            ret: Box::new(self.ret_ty.clone()),
        }
    }

    /// Number of op calls in this function (nested functions included).
    pub fn num_op_calls(&self) -> usize {
        self.exprs
            .iter()
            .map(|(_, e)| match &e.kind {
                ExprKind::Call {
                    callee: Callee::Op(_),
                    ..
                } => 1,
                ExprKind::Function(f) => f.num_op_calls(),
                _ => 0,
            })
            .sum()
    }
}
