//! Type inference for one expression, given the types of its operands. Shared by the parser,
//! the builder and the verifier, so the three agree.

use super::expr::{Callee, ExprId, ExprKind, PrimValue};
use super::function::Function;
use super::ty::{FuncType, Type};
use super::{DType, Dim};

/// Looks up the type of a module-level function by name.
pub trait GlobalTypes {
    /// The type of the function `name`, if it exists.
    fn global_type(&self, name: &str) -> Option<FuncType>;
}

impl GlobalTypes for super::Module {
    fn global_type(&self, name: &str) -> Option<FuncType> {
        self.get(name).map(Function::func_type)
    }
}

impl GlobalTypes for std::collections::HashMap<String, FuncType> {
    fn global_type(&self, name: &str) -> Option<FuncType> {
        self.get(name).cloned()
    }
}

/// Infers the type of `kind` inside `func`, whose operand expressions already carry types.
/// Errors say what was expected.
pub fn infer_kind(
    func: &Function,
    globals: &dyn GlobalTypes,
    kind: &ExprKind,
) -> Result<Type, String> {
    let ty = |e: super::ExprId| -> Result<&Type, String> {
        func.exprs
            .get(e)
            .map(|d| &d.ty)
            .ok_or_else(|| format!("expression {e} is out of range"))
    };
    match kind {
        ExprKind::Var(v) => func
            .vars
            .get(*v)
            .map(|d| d.ty.clone())
            .ok_or_else(|| format!("var {v} is out of range")),
        ExprKind::Const(c) => Ok(c.ty()),
        // Refined by the binding's annotation (see the parser).
        ExprKind::ConstRef(_) => Ok(Type::Tensor(crate::ir::TensorType {
            dims: None,
            ndim: None,
            dtype: None,
        })),
        ExprKind::ShapeLit(dims) => Ok(Type::shape(dims.clone())),
        ExprKind::Prim(p) => Ok(match p {
            PrimValue::Int(_) => Type::Prim(DType::I64),
            PrimValue::Float(_, d) => Type::Prim(*d),
            PrimValue::Str(_) => Type::Object,
            PrimValue::Bool(_) => Type::Prim(DType::Bool),
        }),
        ExprKind::If(i) => {
            let c = ty(i.cond)?;
            if !is_condition(c) {
                return Err(format!(
                    "the condition of `if` must be a bool scalar (R.Tensor((), \"bool\") or T.bool), found {}",
                    brief(c)
                ));
            }
            Ok(ty(i.then_branch.body)?.join(ty(i.else_branch.body)?))
        }
        ExprKind::Tuple(fields) => Ok(Type::Tuple(
            fields
                .iter()
                .map(|&f| ty(f).cloned())
                .collect::<Result<_, _>>()?,
        )),
        ExprKind::TupleGetItem(t, i) => match ty(*t)? {
            Type::Tuple(fields) => fields.get(*i as usize).cloned().ok_or_else(|| {
                format!(
                    "tuple index {i} is out of range for a tuple of {} fields",
                    fields.len()
                )
            }),
            other => Err(format!("expected a tuple to index, found {}", brief(other))),
        },
        ExprKind::Function(f) => Ok(Type::Func(f.func_type())),
        ExprKind::Call { callee, args } => {
            let arg_tys: Vec<&Type> = args.iter().map(|&a| ty(a)).collect::<Result<_, _>>()?;
            let check_fn = |fty: &FuncType, what: &str| -> Result<Type, String> {
                if fty.params.len() != arg_tys.len() {
                    return Err(format!(
                        "{what} takes {} arguments, {} given",
                        fty.params.len(),
                        arg_tys.len()
                    ));
                }
                for (i, (p, a)) in fty.params.iter().zip(&arg_tys).enumerate() {
                    // A constant without a value takes the type of the parameter it is given to.
                    let valueless = args.get(i).is_some_and(|&e| {
                        matches!(
                            func.exprs.get(e).map(|d| &d.kind),
                            Some(ExprKind::ConstRef(_))
                        )
                    }) && a.accepts(p);
                    if !p.accepts(a) && !has_syms(p) && !valueless {
                        return Err(format!(
                            "argument {i} of {what}: expected {}, found {}",
                            brief(p),
                            brief(a)
                        ));
                    }
                }
                Ok(instantiate(fty, &arg_tys))
            };
            match callee {
                Callee::Op(op) => op.infer(&arg_tys),
                Callee::Global(name) => {
                    let fty = globals
                        .global_type(name)
                        .ok_or_else(|| format!("no function named `{name}` in the module"))?;
                    check_fn(&fty, &format!("`{name}`"))
                }
                Callee::Local(v) => match func.vars.get(*v).map(|d| &d.ty) {
                    Some(Type::Func(fty)) => {
                        let name = &func.vars[*v].name;
                        check_fn(fty, &format!("`{name}`"))
                    }
                    _ => Err(format!("{v} is not bound to a function")),
                },
            }
        }
    }
}

/// The return type of a call to a function of type `fty` with arguments of types `args`: the
/// callee's symbolic dims are its own (a local function printed by TVM declares fresh ones,
/// `n_1`), so each bare symbolic dim of a parameter is bound to the argument's dim there and
/// substituted in the return type, as Relax derives a call's type. Symbols the parameters do
/// not bind stay.
fn instantiate(fty: &FuncType, args: &[&Type]) -> Type {
    if !has_syms(&fty.ret) {
        return (*fty.ret).clone();
    }
    let mut map = std::collections::BTreeMap::new();
    for (p, a) in fty.params.iter().zip(args) {
        bind_syms(p, a, &mut map);
    }
    if map.iter().all(|(s, d)| matches!(d, Dim::Sym(t) if t == s)) {
        return (*fty.ret).clone();
    }
    subst_type(&fty.ret, &map)
}

type SymMap = std::collections::BTreeMap<super::Sym, Dim>;

fn bind_dims(p: &[Dim], a: &[Dim], map: &mut SymMap) {
    if p.len() == a.len() {
        for (x, y) in p.iter().zip(a) {
            if let Dim::Sym(s) = x {
                map.entry(s.clone()).or_insert_with(|| y.clone());
            }
        }
    }
}

fn bind_syms(param: &Type, arg: &Type, map: &mut SymMap) {
    match (param, arg) {
        (Type::Tensor(p), Type::Tensor(a)) => {
            if let (Some(pd), Some(ad)) = (&p.dims, &a.dims) {
                bind_dims(pd, ad, map);
            }
        }
        (Type::Shape { dims: Some(pd), .. }, Type::Shape { dims: Some(ad), .. }) => {
            bind_dims(pd, ad, map);
        }
        (Type::Tuple(ps), Type::Tuple(xs)) => {
            for (p, x) in ps.iter().zip(xs) {
                bind_syms(p, x, map);
            }
        }
        _ => {}
    }
}

fn subst_dim(d: &Dim, map: &SymMap) -> Dim {
    match d {
        Dim::Static(_) => d.clone(),
        Dim::Sym(s) => map.get(s).cloned().unwrap_or_else(|| d.clone()),
        Dim::Expr(e) => Dim::binary(e.0, subst_dim(&e.1, map), subst_dim(&e.2, map)),
    }
}

fn subst_type(t: &Type, map: &SymMap) -> Type {
    match t {
        Type::Tensor(tt) => Type::Tensor(super::ty::TensorType {
            dims: tt
                .dims
                .as_ref()
                .map(|ds| ds.iter().map(|d| subst_dim(d, map)).collect()),
            ndim: tt.ndim,
            dtype: tt.dtype,
        }),
        Type::Shape { dims, ndim } => Type::Shape {
            dims: dims
                .as_ref()
                .map(|ds| ds.iter().map(|d| subst_dim(d, map)).collect()),
            ndim: *ndim,
        },
        Type::Tuple(ts) => Type::Tuple(ts.iter().map(|t| subst_type(t, map)).collect()),
        Type::Func(f) => Type::Func(FuncType {
            params: f.params.iter().map(|t| subst_type(t, map)).collect(),
            ret: Box::new(subst_type(&f.ret, map)),
        }),
        Type::Prim(_) | Type::Object => t.clone(),
    }
}

fn has_syms(t: &Type) -> bool {
    let mut s = std::collections::BTreeSet::new();
    t.collect_syms(&mut s);
    !s.is_empty()
}

/// Whether a value of type `t` may be the condition of an `if`: a bool scalar tensor (or a
/// bool tensor of unknown shape, checked when run) or a bool prim value.
pub fn is_condition(t: &Type) -> bool {
    match t {
        Type::Prim(d) => *d == DType::Bool,
        Type::Tensor(tt) => tt.dtype == Some(DType::Bool) && tt.rank().is_none_or(|r| r == 0),
        _ => false,
    }
}

/// A short human-readable rendering of a type for error messages.
pub fn brief(t: &Type) -> String {
    match t {
        Type::Tensor(tt) => {
            let shape = match (&tt.dims, tt.ndim) {
                (Some(d), _) => {
                    let parts: Vec<String> = d.iter().map(Dim::to_string).collect();
                    format!("({})", parts.join(", "))
                }
                (None, Some(n)) => format!("ndim={n}"),
                (None, None) => "?".to_string(),
            };
            format!("Tensor({shape}, {})", tt.dtype.map_or("void", DType::name))
        }
        Type::Tuple(ts) => {
            let parts: Vec<String> = ts.iter().map(brief).collect();
            format!("Tuple({})", parts.join(", "))
        }
        Type::Shape { dims: Some(d), .. } => {
            let parts: Vec<String> = d.iter().map(Dim::to_string).collect();
            format!("Shape([{}])", parts.join(", "))
        }
        Type::Shape { .. } => "Shape".to_string(),
        Type::Prim(d) => format!("Prim({d})"),
        Type::Func(_) => "Callable".to_string(),
        Type::Object => "Object".to_string(),
    }
}

/// Whether `e` is a constant without a value ([`crate::ir::ConstRef`]), or a call or tuple
/// with one among its arguments (or among the fields of a tuple argument): its inferred type
/// is then less specific than the truth, and an annotation may refine it.
pub fn reads_valueless(f: &Function, e: ExprId) -> bool {
    let kind = |x: ExprId| f.exprs.get(x).map(|d| &d.kind);
    let is_ref = |x: ExprId| matches!(kind(x), Some(ExprKind::ConstRef(_)));
    let direct = |x: ExprId| {
        is_ref(x) || matches!(kind(x), Some(ExprKind::Tuple(fs)) if fs.iter().any(|&y| is_ref(y)))
    };
    match kind(e) {
        Some(ExprKind::ConstRef(_)) => true,
        Some(ExprKind::Call { args, .. }) => args.iter().any(|&a| direct(a)),
        Some(ExprKind::Tuple(fs)) => fs.iter().any(|&a| direct(a)),
        _ => false,
    }
}
