//! Expressions: the arena nodes of a function body.

use super::dim::Dim;
use super::dtype::DType;
use super::entity::entity_id;
use super::function::{Binding, Block, Function};
use super::ty::Type;
use crate::op::Op;
use std::sync::Arc;

entity_id!(
    /// An expression in a function's arena.
    ExprId,
    "e"
);
entity_id!(
    /// A variable (parameter or bound var) in a function's arena.
    VarId,
    "v"
);

/// A tensor constant with its data: little-endian element bytes in row-major order.
///
/// Equality compares every byte; the hash reads the dtype, the shape and a bounded sample of
/// the bytes (all of them up to 4 KB, else 4 KB spread over the data), so
/// hashing a model's weights (deduplicating outlined functions, CSE) does not read hundreds
/// of megabytes. Equal constants hash equally; constants that differ only outside the sample
/// share a hash and are told apart by equality.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Constant {
    /// Element type.
    pub dtype: DType,
    /// Static shape (`[]` for a scalar).
    pub shape: Vec<i64>,
    /// `numel * dtype.size_bytes()` bytes, little-endian.
    pub data: Arc<[u8]>,
}

/// The most bytes of a constant its hash reads (see `Constant`).
pub const HASHED_BYTES: usize = 4096;

impl std::hash::Hash for Constant {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.dtype.hash(h);
        self.shape.hash(h);
        let d = &self.data[..];
        d.len().hash(h);
        if d.len() <= HASHED_BYTES {
            h.write(d);
            return;
        }
        // 64 runs of 64 bytes, the first at the start and the last at the end.
        const RUN: usize = 64;
        let runs = HASHED_BYTES / RUN;
        let span = d.len() - RUN;
        for i in 0..runs {
            let at = span / (runs - 1) * i + if i + 1 == runs { span % (runs - 1) } else { 0 };
            h.write(&d[at..at + RUN]);
        }
    }
}

impl Constant {
    /// A constant from raw bytes; errors when the byte count does not match the shape.
    pub fn from_bytes(dtype: DType, shape: Vec<i64>, data: Vec<u8>) -> Result<Self, String> {
        let numel = numel(&shape).ok_or_else(|| format!("invalid constant shape {shape:?}"))?;
        let want = numel
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| format!("constant shape {shape:?} is too large"))?;
        if data.len() != want {
            return Err(format!(
                "constant of shape {shape:?} and dtype {dtype} needs {want} bytes, got {}",
                data.len()
            ));
        }
        Ok(Constant {
            dtype,
            shape,
            data: data.into(),
        })
    }

    /// A scalar constant holding `v` converted to `dtype`.
    pub fn scalar(v: f64, dtype: DType) -> Self {
        let bytes: Vec<u8> = match dtype {
            DType::F16 => half::f16::from_f64(v).to_le_bytes().to_vec(),
            DType::BF16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
            DType::F32 => (v as f32).to_le_bytes().to_vec(),
            DType::F64 => v.to_le_bytes().to_vec(),
            DType::I8 => (v as i8).to_le_bytes().to_vec(),
            DType::U8 => (v as u8).to_le_bytes().to_vec(),
            DType::I32 => (v as i32).to_le_bytes().to_vec(),
            DType::I64 => (v as i64).to_le_bytes().to_vec(),
            DType::Bool => vec![u8::from(v != 0.0)],
        };
        Constant {
            dtype,
            shape: Vec::new(),
            data: bytes.into(),
        }
    }

    /// A scalar i64 constant (exact for every i64).
    pub fn scalar_i64(v: i64, dtype: DType) -> Self {
        match dtype {
            DType::I64 => Constant {
                dtype,
                shape: Vec::new(),
                data: v.to_le_bytes().to_vec().into(),
            },
            _ => Constant::scalar(v as f64, dtype),
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape).unwrap_or(0)
    }

    /// The type of this constant.
    pub fn ty(&self) -> Type {
        Type::tensor(&self.shape, self.dtype)
    }

    /// Element `i` widened to f64 (ints exactly up to 2^53; bool as 0/1).
    pub fn get_f64(&self, i: usize) -> Option<f64> {
        let s = self.dtype.size_bytes();
        let b = self.data.get(i * s..(i + 1) * s)?;
        Some(match self.dtype {
            DType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
            DType::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
            DType::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DType::F64 => f64::from_le_bytes(b.try_into().ok()?),
            DType::I8 => f64::from(b[0] as i8),
            DType::U8 => f64::from(b[0]),
            DType::I32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DType::I64 => i64::from_le_bytes(b.try_into().ok()?) as f64,
            DType::Bool => f64::from(u8::from(b[0] != 0)),
        })
    }

    /// Element `i` of an integer constant as i64 (exact).
    pub fn get_i64(&self, i: usize) -> Option<i64> {
        match self.dtype {
            DType::I64 => {
                let b = self.data.get(i * 8..(i + 1) * 8)?;
                Some(i64::from_le_bytes(b.try_into().ok()?))
            }
            _ => self.get_f64(i).map(|v| v as i64),
        }
    }
}

/// The element count of a static shape, `None` on a negative dim or overflow.
pub fn numel(shape: &[i64]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        let d = usize::try_from(d).ok()?;
        acc.checked_mul(d)
    })
}

/// A scalar that is not a tensor (`R.prim_value(0)`, `R.str("x")`).
#[derive(Clone, Debug, PartialEq)]
pub enum PrimValue {
    /// An int64 value.
    Int(i64),
    /// A float value of the given dtype.
    Float(f64, DType),
    /// A string (`R.str(...)`).
    Str(String),
    /// A bool (`R.prim_value(T.bool(True))`, printed by TVM as `q: T.bool = True`).
    Bool(bool),
}

impl Eq for PrimValue {}

impl std::hash::Hash for PrimValue {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            PrimValue::Int(v) => (0u8, v).hash(state),
            PrimValue::Float(v, d) => (1u8, v.to_bits(), d).hash(state),
            PrimValue::Str(s) => (2u8, s).hash(state),
            PrimValue::Bool(b) => (3u8, b).hash(state),
        }
    }
}

/// A constant whose value was not given: `metadata["ns"][index]` read with no side file
/// (TVM's `mod.script()` omits metadata). Everything but running works on it: its type is the
/// binding's annotation (or an unknown tensor), it prints back as written, and structural
/// equality compares it by identity (namespace and index), never by value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConstRef {
    /// The metadata namespace (`relax.expr.Constant`, `ir.GenericConst`).
    pub ns: Arc<str>,
    /// The index in that namespace.
    pub index: u32,
}

impl std::fmt::Display for ConstRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The namespace quoted as the text format writes strings, so this reads back.
        write!(
            f,
            "metadata[{}][{}]",
            crate::text::lexer::quote(&self.ns),
            self.index
        )
    }
}

/// What a call calls.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Callee {
    /// An op of the op set, with its typed attributes.
    Op(Op),
    /// A function of the module (`cls.fused_x(...)`).
    Global(Arc<str>),
    /// A local function bound to a var of this function (`local_func(...)`).
    Local(VarId),
}

/// One expression.
#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    /// A use of a parameter or bound var.
    Var(VarId),
    /// A tensor constant (inline `R.const` or `metadata[...]`).
    Const(Constant),
    /// A constant without its value (see [`ConstRef`]).
    ConstRef(ConstRef),
    /// A call. Arguments are leaves (vars, constants, shapes, prim values, tuples of leaves).
    Call {
        /// The callee.
        callee: Callee,
        /// The arguments.
        args: Vec<ExprId>,
    },
    /// A tuple literal.
    Tuple(Vec<ExprId>),
    /// `t[i]`.
    TupleGetItem(ExprId, u32),
    /// `R.shape([...])`.
    ShapeLit(Vec<Dim>),
    /// `R.prim_value(...)`.
    Prim(PrimValue),
    /// A nested (local) function definition, bound to a var.
    Function(Box<Function>),
    /// `if cond: ... else: ...` (TVM Relax's `If`), bound to a var: its value is the body of
    /// the branch taken.
    If(Box<IfExpr>),
}

/// A sequence of blocks and the value it yields (TVM Relax's `SeqExpr`): a branch of an
/// [`IfExpr`]. Its bindings' vars live in the enclosing function's arenas and are visible only
/// inside the sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct Seq {
    /// The blocks, in order (dataflow blocks allowed).
    pub blocks: Vec<Block>,
    /// The value: a leaf (var, constant, shape, prim value, or tuple of those).
    pub body: ExprId,
}

impl Seq {
    /// The bindings, in order, across blocks (not those of nested `if`s).
    pub fn bindings(&self) -> impl Iterator<Item = &Binding> {
        self.blocks.iter().flat_map(|b| b.bindings.iter())
    }
}

/// `if cond: <then_branch> else: <else_branch>`.
#[derive(Clone, Debug, PartialEq)]
pub struct IfExpr {
    /// A leaf of type `Tensor((), bool)` or `Prim(bool)`.
    pub cond: ExprId,
    /// What runs when `cond` holds.
    pub then_branch: Seq,
    /// What runs otherwise.
    pub else_branch: Seq,
}

impl IfExpr {
    /// Both branches, then first.
    pub fn branches(&self) -> [&Seq; 2] {
        [&self.then_branch, &self.else_branch]
    }
}

/// Calls `cb` for every var that `e` reads: its operands, a local callee, and for an `if`
/// its condition and everything its branches read (vars bound inside them included). The
/// body of a local function is not entered (it has its own arenas).
pub fn for_each_use(f: &Function, e: ExprId, cb: &mut dyn FnMut(VarId)) {
    let Some(d) = f.exprs.get(e) else { return };
    match &d.kind {
        ExprKind::Var(v) => cb(*v),
        ExprKind::Call { callee, args } => {
            if let Callee::Local(v) = callee {
                cb(*v);
            }
            for &a in args {
                for_each_use(f, a, cb);
            }
        }
        ExprKind::Tuple(xs) => {
            for &x in xs {
                for_each_use(f, x, cb);
            }
        }
        ExprKind::TupleGetItem(x, _) => for_each_use(f, *x, cb),
        ExprKind::If(i) => {
            for_each_use(f, i.cond, cb);
            for s in i.branches() {
                for b in s.bindings() {
                    for_each_use(f, b.value, cb);
                }
                for_each_use(f, s.body, cb);
            }
        }
        ExprKind::Const(_)
        | ExprKind::ConstRef(_)
        | ExprKind::ShapeLit(_)
        | ExprKind::Prim(_)
        | ExprKind::Function(_) => {}
    }
}

/// Calls `cb` for every binding of `blocks` and, recursively, of the branches of the `if`s
/// they bind: an `if`'s branch bindings (then branch first) before the `if` binding itself.
pub fn for_each_binding_deep(f: &Function, blocks: &[Block], cb: &mut dyn FnMut(&Binding)) {
    for b in blocks.iter().flat_map(|b| b.bindings.iter()) {
        if let Some(ExprKind::If(i)) = f.exprs.get(b.value).map(|d| &d.kind) {
            for s in i.branches() {
                for_each_binding_deep(f, &s.blocks, cb);
            }
        }
        cb(b);
    }
}

/// An expression with its type.
#[derive(Clone, Debug, PartialEq)]
pub struct ExprData {
    /// What it is.
    pub kind: ExprKind,
    /// Its (inferred) type.
    pub ty: Type,
}

/// A variable: a parameter or the var of a binding.
#[derive(Clone, Debug, PartialEq)]
pub struct VarData {
    /// Its name (printing keeps it; structural equality ignores it).
    pub name: String,
    /// Its type.
    pub ty: Type,
    /// A dataflow var is local to its dataflow block; others are visible after the block.
    pub dataflow: bool,
    /// The `ExprKind::Var` expression that refers to it.
    pub expr: ExprId,
    /// Where the value comes from in what the user gave (its provenance, see [`Origin`]).
    /// Not printed; structural equality ignores it.
    pub origin: Origin,
}

/// The provenance of a var: the user's bindings whose value it is or computes, first its own.
/// `main/logits` for a binding of a parsed module, ``onnx node `conv1` (Conv)`` for one an ONNX
/// node lowered to. A pass that moves a binding gives the new var the old one's origin; the
/// call an outliner leaves in `main` carries the origins of every binding of its group (two
/// groups that share one deduplicated function stay distinguishable there). Empty for what a
/// pass made up (a lifted constant's param, a wrapper's `local_func`). Cloning is a reference
/// count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin(Option<Arc<[Arc<str>]>>);

impl Origin {
    /// One origin.
    pub fn one(name: &str) -> Origin {
        Origin(Some(Arc::from(vec![Arc::<str>::from(name)])))
    }

    /// The origins, in order (its own first).
    pub fn names(&self) -> &[Arc<str>] {
        self.0.as_deref().unwrap_or(&[])
    }

    /// Its own origin, if any.
    pub fn first(&self) -> Option<&str> {
        self.names().first().map(|s| &**s)
    }

    /// Whether it has no origin.
    pub fn is_empty(&self) -> bool {
        self.names().is_empty()
    }

    /// Whether `name` is among the origins.
    pub fn contains(&self, name: &str) -> bool {
        self.names().iter().any(|n| &**n == name)
    }

    /// The origins of `parts`, in order, each once.
    pub fn merge<'a>(parts: impl IntoIterator<Item = &'a Origin>) -> Origin {
        let mut out: Vec<Arc<str>> = Vec::new();
        for p in parts {
            for n in p.names() {
                if !out.contains(n) {
                    out.push(n.clone());
                }
            }
        }
        if out.is_empty() {
            Origin(None)
        } else {
            Origin(Some(out.into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash_of(c: &Constant) -> u64 {
        // One hasher state for the whole test, so hashes compare.
        thread_local!(static S: std::collections::hash_map::RandomState = Default::default());
        S.with(|s| {
            let mut h = s.build_hasher();
            c.hash(&mut h);
            std::hash::Hasher::finish(&h)
        })
    }

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn a_constant_hash_samples_large_data_and_equality_reads_every_byte() {
        for n in [16usize, HASHED_BYTES, HASHED_BYTES + 4, 40_000] {
            let a = Constant::from_bytes(DType::U8, vec![n as i64], bytes(n)).unwrap();
            let b = Constant::from_bytes(DType::U8, vec![n as i64], bytes(n)).unwrap();
            assert_eq!(a, b);
            assert_eq!(hash_of(&a), hash_of(&b), "{n} bytes");
            // The first and the last byte are always read.
            for at in [0, n - 1] {
                let mut d = bytes(n);
                d[at] ^= 1;
                let c = Constant::from_bytes(DType::U8, vec![n as i64], d).unwrap();
                assert_ne!(a, c);
                assert_ne!(hash_of(&a), hash_of(&c), "{n} bytes, byte {at}");
            }
        }
        // A byte outside the sample: the same hash, but not equal.
        let n = 40_000;
        let a = Constant::from_bytes(DType::U8, vec![n as i64], bytes(n)).unwrap();
        let mut d = bytes(n);
        d[100] ^= 1;
        let c = Constant::from_bytes(DType::U8, vec![n as i64], d).unwrap();
        assert_eq!(hash_of(&a), hash_of(&c));
        assert_ne!(a, c);
        // Shapes and dtypes are hashed.
        let f = Constant::from_bytes(DType::F32, vec![2, 2], bytes(16)).unwrap();
        let g = Constant::from_bytes(DType::F32, vec![4], bytes(16)).unwrap();
        let i = Constant::from_bytes(DType::I32, vec![2, 2], bytes(16)).unwrap();
        assert_ne!(hash_of(&f), hash_of(&g));
        assert_ne!(hash_of(&f), hash_of(&i));
    }
}
