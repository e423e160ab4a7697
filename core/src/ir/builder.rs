//! A builder for functions, like TVM's `relax.BlockBuilder`: it infers the type of every value as
//! you emit it (equal shapes share one dims list, see [`ShapeInterner`]), names fresh vars, and
//! keeps the function in normal form.
//!
//! ```
//! use fusebox_core::ir::{builder::FunctionBuilder, Callee, DType, Module, Type};
//! use fusebox_core::op::Op;
//!
//! let module = Module::new();
//! let mut b = FunctionBuilder::new(&module);
//! let x = b.param("x", Type::tensor(&[1, 64], DType::F32));
//! b.begin_dataflow();
//! let xe = b.var(x);
//! let y = b.emit_output("y", Callee::Op(Op::Relu), vec![xe]).unwrap();
//! b.end_dataflow().unwrap();
//! let ye = b.var(y);
//! let f = b.finish(ye).unwrap();
//! assert_eq!(f.bindings().count(), 1);
//! ```
//!
//! builds
//!
//! ```text
//! @R.function
//! def main(x: R.Tensor((1, 64), dtype="float32")) -> R.Tensor((1, 64), dtype="float32"):
//!     with R.dataflow():
//!         y: R.Tensor((1, 64), dtype="float32") = R.nn.relu(x)
//!         R.output(y)
//!     return y
//! ```

use super::infer::{GlobalTypes, infer_kind};
use super::{
    Binding, Block, Callee, Constant, Dim, ExprId, ExprKind, Function, PrimValue, ShapeInterner,
    Sym, Type, VarId,
};
use crate::error::{Error, Result};
use std::collections::{HashMap, HashSet};

/// Builds one function. Types are inferred as values are emitted; a type error is returned at
/// the emit that caused it.
pub struct FunctionBuilder<'g> {
    func: Function,
    globals: &'g dyn GlobalTypes,
    names: HashSet<String>,
    /// Per name asked for more than once, the suffix [`FunctionBuilder::unique`] tries next
    /// (every smaller one is taken): asking for one name `n` times costs `n` set lookups, not
    /// `n²/2`.
    next_suffix: HashMap<String, usize>,
    block: Option<Block>,
    fresh: usize,
    shapes: ShapeInterner,
    origin: super::Origin,
}

impl<'g> FunctionBuilder<'g> {
    /// A builder whose global calls are typed by `globals` (usually the module being built).
    pub fn new(globals: &'g dyn GlobalTypes) -> Self {
        FunctionBuilder {
            func: Function::new(),
            globals,
            names: HashSet::new(),
            next_suffix: HashMap::new(),
            block: None,
            fresh: 0,
            shapes: ShapeInterner::new(),
            origin: super::Origin::default(),
        }
    }

    /// The origin given to the vars bound from now on (see [`super::VarData::origin`]): an
    /// importer sets it to the source node before lowering the node, and back to `None`.
    pub fn set_origin(&mut self, origin: Option<&str>) {
        self.origin = origin.map(super::Origin::one).unwrap_or_default();
    }

    /// Declares a symbolic dim used by this function's types and returns it.
    pub fn sym(&mut self, name: &str) -> Dim {
        let s = Sym::new(name);
        if !self.func.sym_vars.contains(&s) {
            self.func.sym_vars.push(s.clone());
        }
        Dim::Sym(s)
    }

    /// Declares a symbolic dim named `prefix`, or `prefix_1`, `prefix_2`, … when a symbol of
    /// that name is already declared: a fresh dim for an extent only known at run time (the
    /// `R.match_cast` variable of TVM's importers).
    pub fn fresh_sym(&mut self, prefix: &str) -> Dim {
        let taken = |name: &str, f: &Function| f.sym_vars.iter().any(|s| s.name() == name);
        let mut name = prefix.to_string();
        let mut k = 0usize;
        while taken(&name, &self.func) {
            k += 1;
            name = format!("{prefix}_{k}");
        }
        self.sym(&name)
    }

    /// Gives the var `var` bound just before the type `ty`, a refinement of its value's
    /// inferred type (a value-dependent extent named by a [`FunctionBuilder::fresh_sym`] dim):
    /// the annotation TVM's importers write as `R.match_cast`. The executor binds the
    /// annotation's new symbols when the value arrives, and checks the rest. An annotation the
    /// inferred type does not accept is an error.
    pub fn refine(&mut self, var: VarId, ty: Type) -> Result<()> {
        let inferred = self.func.var(var).ty.clone();
        if !inferred.accepts(&ty) {
            return Err(Error::Invalid(format!(
                "the annotation {} does not refine the inferred type {}",
                super::infer::brief(&ty),
                super::infer::brief(&inferred)
            )));
        }
        let ty = self.shapes.intern(ty);
        self.func.set_var_type(var, ty);
        Ok(())
    }

    /// Adds a parameter.
    pub fn param(&mut self, name: &str, ty: Type) -> VarId {
        let name = self.unique(name);
        let ty = self.shapes.intern(ty);
        let v = self.func.add_var(name, ty, false);
        self.func.params.push(v);
        v
    }

    /// The expression that refers to `v`.
    pub fn var(&self, v: VarId) -> ExprId {
        self.func.var_expr(v)
    }

    /// A constant leaf.
    pub fn constant(&mut self, c: Constant) -> ExprId {
        let ty = self.shapes.intern(c.ty());
        self.func.add_expr(ExprKind::Const(c), ty)
    }

    /// A shape literal leaf (`R.shape([...])`).
    pub fn shape(&mut self, dims: Vec<Dim>) -> ExprId {
        let ty = Type::shape(dims.clone());
        self.func.add_expr(ExprKind::ShapeLit(dims), ty)
    }

    /// A prim value leaf (`R.prim_value(...)`).
    pub fn prim(&mut self, p: PrimValue) -> ExprId {
        let kind = ExprKind::Prim(p);
        let ty = infer_kind(&self.func, self.globals, &kind).unwrap_or(Type::Object);
        self.func.add_expr(kind, ty)
    }

    /// A tuple of leaves (for example the argument of `concat`).
    pub fn tuple(&mut self, fields: Vec<ExprId>) -> Result<ExprId> {
        self.value(ExprKind::Tuple(fields))
    }

    /// Adds an expression after inferring its type; it is not bound to a var.
    pub fn value(&mut self, kind: ExprKind) -> Result<ExprId> {
        let ty = infer_kind(&self.func, self.globals, &kind).map_err(|m| Error::Type {
            op: describe(&kind),
            message: m,
        })?;
        let ty = self.shapes.intern(ty);
        Ok(self.func.add_expr(kind, ty))
    }

    /// Starts a dataflow block.
    pub fn begin_dataflow(&mut self) {
        self.flush();
        self.block = Some(Block {
            dataflow: true,
            bindings: Vec::new(),
        });
    }

    /// Ends the current dataflow block.
    pub fn end_dataflow(&mut self) -> Result<()> {
        match &self.block {
            Some(b) if b.dataflow => {
                self.flush();
                Ok(())
            }
            _ => Err(Error::Invalid("end_dataflow without begin_dataflow".into())),
        }
    }

    /// Binds a call to a fresh var. Inside a dataflow block the var is a dataflow var.
    pub fn emit(&mut self, name: &str, callee: Callee, args: Vec<ExprId>) -> Result<VarId> {
        self.emit_value(name, ExprKind::Call { callee, args }, false)
    }

    /// Binds a call to a var that is visible after the dataflow block (`R.output`).
    pub fn emit_output(&mut self, name: &str, callee: Callee, args: Vec<ExprId>) -> Result<VarId> {
        self.emit_value(name, ExprKind::Call { callee, args }, true)
    }

    /// Binds any value to a fresh var; `output` makes it visible after a dataflow block.
    pub fn emit_value(&mut self, name: &str, kind: ExprKind, output: bool) -> Result<VarId> {
        let value = self.value(kind)?;
        self.bind(name, value, output)
    }

    /// Binds an existing expression to a fresh var.
    pub fn bind(&mut self, name: &str, value: ExprId, output: bool) -> Result<VarId> {
        let ty = self
            .func
            .exprs
            .get(value)
            .map(|e| e.ty.clone())
            .ok_or_else(|| Error::Invalid(format!("expression {value} is not in this function")))?;
        let dataflow = matches!(&self.block, Some(b) if b.dataflow) && !output;
        let name = if name.is_empty() {
            self.fresh_name()
        } else {
            self.unique(name)
        };
        let var = self
            .func
            .add_var_from(name, ty, dataflow, self.origin.clone());
        let block = self.block.get_or_insert_with(|| Block {
            dataflow: false,
            bindings: Vec::new(),
        });
        block.bindings.push(Binding { var, value });
        Ok(var)
    }

    /// Binds `if cond: <then> else: <else>` to a fresh var (outside any dataflow block): each
    /// closure emits its branch's bindings (dataflow blocks allowed, nested `if`s too) and
    /// returns the branch's value, a leaf. The names a branch binds are its own.
    pub fn emit_if(
        &mut self,
        name: &str,
        cond: ExprId,
        then_branch: impl FnOnce(&mut Self) -> Result<ExprId>,
        else_branch: impl FnOnce(&mut Self) -> Result<ExprId>,
    ) -> Result<VarId> {
        if matches!(&self.block, Some(b) if b.dataflow) {
            return Err(Error::Invalid(
                "emit_if inside a dataflow block (Relax allows `if` only outside)".into(),
            ));
        }
        let t = self.branch(then_branch)?;
        let e = self.branch(else_branch)?;
        self.emit_value(
            name,
            ExprKind::If(Box::new(super::IfExpr {
                cond,
                then_branch: t,
                else_branch: e,
            })),
            false,
        )
    }

    fn branch(&mut self, body: impl FnOnce(&mut Self) -> Result<ExprId>) -> Result<super::Seq> {
        self.flush();
        let outer = std::mem::take(&mut self.func.blocks);
        let names = self.names.clone();
        let suffixes = self.next_suffix.clone();
        let r = body(self);
        let open_dataflow = matches!(&self.block, Some(b) if b.dataflow);
        self.flush();
        let blocks = std::mem::replace(&mut self.func.blocks, outer);
        self.names = names;
        self.next_suffix = suffixes;
        let body = r?;
        if open_dataflow {
            return Err(Error::Invalid(
                "a branch of emit_if ends inside an open dataflow block".into(),
            ));
        }
        Ok(super::Seq { blocks, body })
    }

    /// Sets an attribute set for the function.
    pub fn attrs(&mut self) -> &mut super::FuncAttrs {
        &mut self.func.attrs
    }

    /// Finishes the function, returning `ret`; the return type is inferred.
    pub fn finish(mut self, ret: ExprId) -> Result<Function> {
        if matches!(&self.block, Some(b) if b.dataflow) {
            return Err(Error::Invalid(
                "finish inside an open dataflow block".into(),
            ));
        }
        self.flush();
        let ty = self
            .func
            .exprs
            .get(ret)
            .map(|e| e.ty.clone())
            .ok_or_else(|| Error::Invalid(format!("expression {ret} is not in this function")))?;
        // A symbol only a binding's annotation defines (a value-dependent extent) is not
        // visible to callers: the return type keeps the rank there, as TVM's does.
        let mut defined = std::collections::BTreeSet::new();
        for &p in &self.func.params {
            self.func.var(p).ty.collect_syms(&mut defined);
        }
        self.func.ret = Some(ret);
        self.func.ret_ty = ty.erase_undefined(&defined);
        Ok(self.func)
    }

    /// The function built so far.
    pub fn func(&self) -> &Function {
        &self.func
    }

    fn flush(&mut self) {
        if let Some(b) = self.block.take()
            && (b.dataflow || !b.bindings.is_empty())
        {
            self.func.blocks.push(b);
        }
    }

    fn unique(&mut self, name: &str) -> String {
        if self.names.insert(name.to_string()) {
            return name.to_string();
        }
        // The first free `{name}{i}` from i = 1, as a scan from 1 would find it: names leave
        // the set only when a branch ends, and the kept suffixes go back with them, so the
        // suffixes below the one kept here are still taken.
        let mut i = self.next_suffix.get(name).copied().unwrap_or(1);
        loop {
            let cand = format!("{name}{i}");
            i += 1;
            if self.names.insert(cand.clone()) {
                self.next_suffix.insert(name.to_string(), i);
                return cand;
            }
        }
    }

    fn fresh_name(&mut self) -> String {
        loop {
            let cand = if self.fresh == 0 {
                "lv".to_string()
            } else {
                format!("lv{}", self.fresh)
            };
            self.fresh += 1;
            if self.names.insert(cand.clone()) {
                return cand;
            }
        }
    }
}

fn describe(kind: &ExprKind) -> String {
    match kind {
        ExprKind::Call {
            callee: Callee::Op(op),
            ..
        } => op.name().to_string(),
        ExprKind::Call {
            callee: Callee::Global(g),
            ..
        } => format!("call of `{g}`"),
        ExprKind::Call {
            callee: Callee::Local(v),
            ..
        } => format!("call of local {v}"),
        ExprKind::Tuple(_) => "tuple".into(),
        ExprKind::TupleGetItem(..) => "tuple-get-item".into(),
        _ => "expression".into(),
    }
}
