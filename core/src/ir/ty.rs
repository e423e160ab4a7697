//! Types (TVM's "struct info"): tensors with static or symbolic shapes, tuples, shapes, prim
//! values, callables and `Object`.

use super::dim::{Dim, Sym};
use super::dtype::DType;
use std::collections::BTreeSet;

/// The type of a tensor: shape (known dims, known rank only, or unknown) and dtype (or unknown).
#[allow(
    clippy::derived_hash_with_manual_eq,
    reason = "the manual equality is the field-wise one that derive would give, so it agrees with the derived hash"
)]
#[derive(Clone, Debug, Eq, Hash)]
pub struct TensorType {
    /// The dims when the shape is known, shared: cloning a type (one per expression and var)
    /// copies a pointer, and equal shapes made from one another compare by pointer first.
    pub dims: Option<std::sync::Arc<[Dim]>>,
    /// The rank when only the rank is known (`R.Tensor(ndim=2)`); `None` with `dims: None` means
    /// unknown rank. When `dims` is set this is ignored and [`TensorType::rank`] uses `dims`.
    pub ndim: Option<usize>,
    /// The element type, `None` when unknown (`dtype="void"`).
    pub dtype: Option<DType>,
}

// Field-wise equality as `derive(PartialEq)` gives, with the cheap fields first and shared dims
// compared by pointer.
impl PartialEq for TensorType {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        self.dtype == other.dtype
            && self.ndim == other.ndim
            && match (&self.dims, &other.dims) {
                (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b) || dims_eq(a, b),
                (None, None) => true,
                _ => false,
            }
    }
}

/// Dims equality with static dims compared inline.
#[inline]
fn dims_eq(a: &[Dim], b: &[Dim]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    for (x, y) in a.iter().zip(b) {
        let same = match (x, y) {
            (Dim::Static(p), Dim::Static(q)) => p == q,
            _ => x == y,
        };
        if !same {
            return false;
        }
    }
    true
}

impl TensorType {
    /// A tensor type with a known shape and dtype.
    pub fn new(dims: Vec<Dim>, dtype: DType) -> Self {
        TensorType {
            ndim: Some(dims.len()),
            dims: Some(dims.into()),
            dtype: Some(dtype),
        }
    }

    /// The rank, if known.
    pub fn rank(&self) -> Option<usize> {
        match &self.dims {
            Some(d) => Some(d.len()),
            None => self.ndim,
        }
    }

    /// The static shape, if every dim is static.
    pub fn static_shape(&self) -> Option<Vec<i64>> {
        self.dims.as_ref()?.iter().map(Dim::as_static).collect()
    }
}

/// A function's type: parameter types and return type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FuncType {
    /// Parameter types.
    pub params: Vec<Type>,
    /// Return type.
    pub ret: Box<Type>,
}

/// The type of an expression.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Type {
    /// `R.Tensor(...)`.
    Tensor(TensorType),
    /// `R.Tuple(...)`.
    Tuple(Vec<Type>),
    /// `R.Shape([...])` with known values, or `R.Shape(ndim=k)`, or `R.Shape`.
    Shape {
        /// The values when known.
        dims: Option<Vec<Dim>>,
        /// The rank when only the rank is known.
        ndim: Option<usize>,
    },
    /// `T.int64` (also read as `R.Prim("int64")`): a scalar that is not a tensor.
    Prim(DType),
    /// A callable (a local function).
    Func(FuncType),
    /// `R.Object`: anything.
    #[default]
    Object,
}

impl Type {
    /// A tensor type with a static shape.
    pub fn tensor(shape: &[i64], dtype: DType) -> Type {
        Type::Tensor(TensorType::new(
            shape.iter().map(|&d| Dim::Static(d)).collect(),
            dtype,
        ))
    }

    /// A tensor type with the given dims.
    pub fn tensor_dims(dims: Vec<Dim>, dtype: DType) -> Type {
        Type::Tensor(TensorType::new(dims, dtype))
    }

    /// A shape type with known values.
    pub fn shape(dims: Vec<Dim>) -> Type {
        Type::Shape {
            ndim: Some(dims.len()),
            dims: Some(dims),
        }
    }

    /// The tensor type, if this is a tensor.
    pub fn as_tensor(&self) -> Option<&TensorType> {
        match self {
            Type::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// Whether a value of type `actual` may be annotated with (or passed as) `self`: `self` is
    /// the same as `actual` or less specific (unknown dims, rank, dtype, or `Object`).
    pub fn accepts(&self, actual: &Type) -> bool {
        match (self, actual) {
            (Type::Object, _) => true,
            (Type::Tensor(a), Type::Tensor(b)) => {
                let dtype_ok = a.dtype.is_none() || a.dtype == b.dtype;
                let rank_ok = a.rank().is_none() || a.rank() == b.rank();
                let dims_ok = match (&a.dims, &b.dims) {
                    (None, _) => true,
                    (Some(_), None) => false,
                    (Some(x), Some(y)) => x == y,
                };
                dtype_ok && rank_ok && dims_ok
            }
            (Type::Tuple(a), Type::Tuple(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.accepts(y))
            }
            (Type::Shape { dims: da, ndim: na }, Type::Shape { dims: db, ndim: nb }) => {
                let rb = db.as_ref().map(Vec::len).or(*nb);
                let ra = da.as_ref().map(Vec::len).or(*na);
                (ra.is_none() || ra == rb)
                    && match (da, db) {
                        (None, _) => true,
                        (Some(_), None) => false,
                        (Some(x), Some(y)) => x == y,
                    }
            }
            (Type::Prim(a), Type::Prim(b)) => a == b,
            (Type::Func(a), Type::Func(b)) => a == b,
            _ => false,
        }
    }

    /// The most specific type that accepts both `self` and `other` (the type of an `if` whose
    /// branches yield them, as Relax unifies struct info): equal types give themselves; tensors
    /// keep the dtype, rank and dims they agree on; tuples of one length join field-wise;
    /// anything else gives `Object`.
    pub fn join(&self, other: &Type) -> Type {
        if self == other {
            return self.clone();
        }
        match (self, other) {
            (Type::Tensor(a), Type::Tensor(b)) => {
                let ndim = if a.rank() == b.rank() { a.rank() } else { None };
                let dims = match (&a.dims, &b.dims) {
                    (Some(x), Some(y)) if x == y => Some(x.clone()),
                    _ => None,
                };
                Type::Tensor(TensorType {
                    dims,
                    ndim,
                    dtype: if a.dtype == b.dtype { a.dtype } else { None },
                })
            }
            (Type::Tuple(a), Type::Tuple(b)) if a.len() == b.len() => {
                Type::Tuple(a.iter().zip(b).map(|(x, y)| x.join(y)).collect())
            }
            (Type::Shape { .. }, Type::Shape { .. }) => {
                let rank = |t: &Type| match t {
                    Type::Shape { dims, ndim } => dims.as_ref().map(Vec::len).or(*ndim),
                    _ => None,
                };
                let (ra, rb) = (rank(self), rank(other));
                Type::Shape {
                    dims: None,
                    ndim: if ra == rb { ra } else { None },
                }
            }
            _ => Type::Object,
        }
    }

    /// Calls `f` for every symbolic variable in this type (no allocation).
    pub fn for_each_sym(&self, f: &mut dyn FnMut(&Sym)) {
        match self {
            Type::Tensor(t) => t
                .dims
                .iter()
                .flat_map(|d| d.iter())
                .for_each(|d| d.for_each_sym(f)),
            Type::Shape { dims, .. } => dims.iter().flatten().for_each(|d| d.for_each_sym(f)),
            Type::Tuple(ts) => ts.iter().for_each(|t| t.for_each_sym(f)),
            Type::Func(ft) => {
                ft.params.iter().for_each(|t| t.for_each_sym(f));
                ft.ret.for_each_sym(f);
            }
            Type::Prim(_) | Type::Object => {}
        }
    }

    /// This type with every shape that mentions a symbol outside `defined` reduced to its rank
    /// (TVM's `EraseToWellDefined`: what a function's return type may say when only its
    /// parameters define symbols).
    pub fn erase_undefined(&self, defined: &BTreeSet<Sym>) -> Type {
        let undefined = |dims: &[Dim]| {
            let mut s = BTreeSet::new();
            dims.iter().for_each(|d| d.collect_syms(&mut s));
            s.iter().any(|x| !defined.contains(x))
        };
        match self {
            Type::Tensor(t) => match &t.dims {
                Some(d) if undefined(d) => Type::Tensor(TensorType {
                    dims: None,
                    ndim: Some(d.len()),
                    dtype: t.dtype,
                }),
                _ => self.clone(),
            },
            Type::Shape { dims: Some(d), .. } if undefined(d) => Type::Shape {
                dims: None,
                ndim: Some(d.len()),
            },
            Type::Tuple(ts) => Type::Tuple(ts.iter().map(|t| t.erase_undefined(defined)).collect()),
            _ => self.clone(),
        }
    }

    /// Adds every symbolic variable in this type to `out`.
    pub fn collect_syms(&self, out: &mut BTreeSet<Sym>) {
        match self {
            Type::Tensor(t) => t
                .dims
                .iter()
                .flat_map(|d| d.iter())
                .for_each(|d| d.collect_syms(out)),
            Type::Shape { dims, .. } => dims.iter().flatten().for_each(|d| d.collect_syms(out)),
            Type::Tuple(ts) => ts.iter().for_each(|t| t.collect_syms(out)),
            Type::Func(f) => {
                f.params.iter().for_each(|t| t.collect_syms(out));
                f.ret.collect_syms(out);
            }
            Type::Prim(_) | Type::Object => {}
        }
    }
}

/// Shares equal shapes: the types passed through one interner point at one copy of each
/// distinct dims list, so the many types of a function that have the same shape clone and
/// compare by pointer (builders and the parser intern every type they attach).
#[derive(Debug, Default)]
pub struct ShapeInterner {
    shapes: rustc_hash::FxHashSet<std::sync::Arc<[Dim]>>,
}

impl ShapeInterner {
    /// An empty interner.
    pub fn new() -> Self {
        Self::default()
    }

    /// `ty` with its dims (and those of nested types) replaced by the interned equal ones.
    pub fn intern(&mut self, ty: Type) -> Type {
        match ty {
            Type::Tensor(mut t) => {
                if let Some(d) = t.dims.take() {
                    t.dims = Some(self.dims(d));
                }
                Type::Tensor(t)
            }
            Type::Tuple(ts) => Type::Tuple(ts.into_iter().map(|t| self.intern(t)).collect()),
            Type::Func(f) => Type::Func(FuncType {
                params: f.params.into_iter().map(|t| self.intern(t)).collect(),
                ret: Box::new(self.intern(*f.ret)),
            }),
            other => other,
        }
    }

    fn dims(&mut self, d: std::sync::Arc<[Dim]>) -> std::sync::Arc<[Dim]> {
        if let Some(x) = self.shapes.get(&d[..]) {
            return x.clone();
        }
        self.shapes.insert(d.clone());
        d
    }
}
