//! Type inference for one expression, given the types of its operands. Shared by the parser,
//! the builder and the verifier, so the three agree.

use super::expr::{Callee, ExprKind, PrimValue};
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

/// The type a constant without a value ([`crate::ir::ConstRef`]) has as argument `i` of `op`,
/// as far as its use tells, given the arguments' types and the call's (annotated) type `out`:
/// the other operand's dtype for a binary elementwise op or `matmul` (a broadcast operand's
/// rank is not told), and for `conv2d`'s weight the data's dtype and, in `NCHW`/`OIHW` layouts
/// with static shapes, the exact shape where only one kernel size gives `out`. `None` when the
/// use tells nothing.
pub fn valueless_from_use(
    op: &crate::op::Op,
    args: &[&Type],
    i: usize,
    out: &Type,
) -> Option<super::TensorType> {
    use crate::op::{FusionKind, Op};
    let tensor = |t: Option<&&Type>| match t {
        Some(Type::Tensor(t)) => Some(t.clone()),
        _ => None,
    };
    let binary = args.len() == 2
        && (matches!(op, Op::Matmul { .. })
            || matches!(
                op.fusion_kind(),
                FusionKind::ElemWise | FusionKind::Broadcast
            ));
    if let Op::Conv2d(a) = op
        && i == 1
    {
        let data = tensor(args.first())?;
        let dtype = data.dtype?;
        let exact = tensor(Some(&out)).and_then(|o| conv2d_weight(a, &data, &o, dtype));
        return Some(exact.unwrap_or(super::TensorType {
            dims: None,
            ndim: Some(4),
            dtype: Some(dtype),
        }));
    }
    if binary && i < 2 {
        let dtype = tensor(args.get(1 - i))?.dtype?;
        return Some(super::TensorType {
            dims: None,
            ndim: None,
            dtype: Some(dtype),
        });
    }
    None
}

/// `conv2d`'s weight shape from its data and output shapes (see [`valueless_from_use`]).
fn conv2d_weight(
    a: &crate::op::Conv2dAttrs,
    data: &super::TensorType,
    out: &super::TensorType,
    dtype: DType,
) -> Option<super::TensorType> {
    if a.data_layout != "NCHW" || a.kernel_layout != "OIHW" || a.out_layout != "NCHW" {
        return None;
    }
    let (x, y) = (data.static_shape()?, out.static_shape()?);
    let [_, c, h, w] = <[i64; 4]>::try_from(x).ok()?;
    let [_, o, oh, ow] = <[i64; 4]>::try_from(y).ok()?;
    if a.groups <= 0 || c % a.groups != 0 {
        return None;
    }
    // out = (len - dil * (k - 1) - 1) / stride + 1 (floor): the `k >= 1` that give `out`, if one.
    let kernel = |len: i64, pads: [i64; 2], dil: i64, stride: i64, out: i64| -> Option<i64> {
        let (len, dil, stride, out) = (
            i128::from(len) + i128::from(pads[0]) + i128::from(pads[1]),
            i128::from(dil),
            i128::from(stride),
            i128::from(out),
        );
        if dil <= 0 || stride <= 0 || out <= 0 {
            return None;
        }
        // dil * (k - 1) in [len - 1 - stride * (out - 1) - (stride - 1), len - 1 - stride * (out - 1)]
        let hi = len - 1 - stride * (out - 1);
        let lo = (hi - (stride - 1)).max(0);
        let first = (lo + dil - 1).div_euclid(dil);
        let last = hi.div_euclid(dil);
        (hi >= 0 && first == last).then(|| i64::try_from(first + 1).ok())?
    };
    let kh = kernel(
        h,
        [a.padding[0], a.padding[2]],
        a.dilation[0],
        a.strides[0],
        oh,
    )?;
    let kw = kernel(
        w,
        [a.padding[1], a.padding[3]],
        a.dilation[1],
        a.strides[1],
        ow,
    )?;
    let dims = [o, c / a.groups, kh, kw].map(Dim::Static).to_vec();
    Some(super::TensorType::new(dims, dtype))
}
