//! The op set: TVM Relax's ops with typed attributes, type inference and a fusion kind.
//!
//! (Minimal bootstrap version: add, relu, matmul, conv2d. The full op set replaces this file.)

use crate::ir::{DType, Dim, Type};

/// An `f64` attribute with bitwise equality and hashing, so ops are `Eq + Hash`.
#[derive(Clone, Copy, Debug)]
pub struct F64(pub f64);

impl PartialEq for F64 {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for F64 {}
impl std::hash::Hash for F64 {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

/// How an op fuses (TVM's `OpPatternKind`, same numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FusionKind {
    /// Elementwise: output\[i\] depends on input\[i\] only.
    ElemWise = 0,
    /// Broadcasting elementwise.
    Broadcast = 1,
    /// Injective: each output element depends on one input element (reshape, transpose…).
    Injective = 2,
    /// A commutative reduction.
    CommReduce = 3,
    /// An op whose output can absorb an elementwise epilogue (matmul, conv2d).
    OutEWiseFusable = 4,
    /// A tuple node.
    Tuple = 7,
    /// Never fused.
    Opaque = 8,
}

/// A literal attribute value as written in the text format (`axis=1`, `padding=[1, 1]`,
/// `out_dtype=None`).
#[derive(Clone, Debug, PartialEq)]
pub enum AttrLit {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// A list or tuple of literals.
    List(Vec<AttrLit>),
}

/// How a call of an op is spelled: how many expression arguments it takes, and the names of the
/// attributes a positional literal after them fills, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpSig {
    /// Fewest expression arguments.
    pub min_args: usize,
    /// Most expression arguments.
    pub max_args: usize,
    /// Attribute names in positional order.
    pub attr_names: &'static [&'static str],
}

/// Attributes of `relax.nn.conv2d`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dAttrs {
    /// Strides (h, w).
    pub strides: [i64; 2],
    /// Padding (top, left, bottom, right).
    pub padding: [i64; 4],
    /// Dilation (h, w).
    pub dilation: [i64; 2],
    /// Groups.
    pub groups: i64,
    /// Data layout (`NCHW` or `NHWC`).
    pub data_layout: String,
    /// Kernel layout (`OIHW` or `OHWI`).
    pub kernel_layout: String,
    /// Output layout.
    pub out_layout: String,
    /// Output dtype (`None`: same as the input).
    pub out_dtype: Option<DType>,
}

/// An op with its typed attributes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `relax.add`
    Add,
    /// `relax.nn.relu`
    Relu,
    /// `relax.matmul`
    Matmul {
        /// Output dtype (`None`: same as the inputs).
        out_dtype: Option<DType>,
    },
    /// `relax.nn.conv2d`
    Conv2d(Box<Conv2dAttrs>),
}

const NAMES: &[&str] = &[
    "relax.add",
    "relax.nn.relu",
    "relax.matmul",
    "relax.nn.conv2d",
];

impl Op {
    /// Every op name, in a fixed order.
    pub fn names() -> &'static [&'static str] {
        NAMES
    }

    /// The op's name (`"relax.nn.conv2d"`).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Add => "relax.add",
            Op::Relu => "relax.nn.relu",
            Op::Matmul { .. } => "relax.matmul",
            Op::Conv2d(_) => "relax.nn.conv2d",
        }
    }

    /// The call signature of the op named `name`, or `None` for an unknown op.
    pub fn signature(name: &str) -> Option<OpSig> {
        Some(match name {
            "relax.add" => OpSig {
                min_args: 2,
                max_args: 2,
                attr_names: &[],
            },
            "relax.nn.relu" => OpSig {
                min_args: 1,
                max_args: 1,
                attr_names: &[],
            },
            "relax.matmul" => OpSig {
                min_args: 2,
                max_args: 2,
                attr_names: &["out_dtype"],
            },
            "relax.nn.conv2d" => OpSig {
                min_args: 2,
                max_args: 2,
                attr_names: &[
                    "strides",
                    "padding",
                    "dilation",
                    "groups",
                    "data_layout",
                    "kernel_layout",
                    "out_layout",
                    "out_dtype",
                ],
            },
            _ => return None,
        })
    }

    /// Builds the op named `name` from keyword attributes; missing ones take TVM's defaults.
    /// Errors name the attribute and what was expected.
    pub fn from_call(name: &str, kwargs: &[(String, AttrLit)]) -> Result<Op, String> {
        let sig = Op::signature(name).ok_or_else(|| format!("unknown op `{name}`"))?;
        for (k, _) in kwargs {
            if !sig.attr_names.contains(&k.as_str()) {
                return Err(format!(
                    "`{name}` has no attribute `{k}`; expected one of: {}",
                    sig.attr_names.join(", ")
                ));
            }
        }
        let get = |k: &str| kwargs.iter().find(|(n, _)| n == k).map(|(_, v)| v);
        Ok(match name {
            "relax.add" => Op::Add,
            "relax.nn.relu" => Op::Relu,
            "relax.matmul" => Op::Matmul {
                out_dtype: dtype_attr(get("out_dtype"))?,
            },
            "relax.nn.conv2d" => {
                let strides = ints_attr(get("strides"), &[1, 1], "strides")?;
                let padding = ints_attr(get("padding"), &[0, 0], "padding")?;
                let dilation = ints_attr(get("dilation"), &[1, 1], "dilation")?;
                Op::Conv2d(Box::new(Conv2dAttrs {
                    strides: pair(&strides, "strides")?,
                    padding: quad(&padding)?,
                    dilation: pair(&dilation, "dilation")?,
                    groups: int_attr(get("groups"), 1, "groups")?,
                    data_layout: str_attr(get("data_layout"), "NCHW", "data_layout")?,
                    kernel_layout: str_attr(get("kernel_layout"), "OIHW", "kernel_layout")?,
                    out_layout: match get("out_layout") {
                        Some(_) => str_attr(get("out_layout"), "NCHW", "out_layout")?,
                        None => str_attr(get("data_layout"), "NCHW", "data_layout")?,
                    },
                    out_dtype: dtype_attr(get("out_dtype"))?,
                }))
            }
            _ => return Err(format!("unknown op `{name}`")),
        })
    }

    /// The attributes in printing order, with their values (TVM prints all of them).
    pub fn kwargs(&self) -> Vec<(&'static str, AttrLit)> {
        match self {
            Op::Add | Op::Relu => vec![],
            Op::Matmul { out_dtype } => vec![("out_dtype", dtype_lit(*out_dtype))],
            Op::Conv2d(a) => vec![
                ("strides", ints_lit(&a.strides)),
                ("padding", ints_lit(&a.padding)),
                ("dilation", ints_lit(&a.dilation)),
                ("groups", AttrLit::Int(a.groups)),
                ("data_layout", AttrLit::Str(a.data_layout.clone())),
                ("kernel_layout", AttrLit::Str(a.kernel_layout.clone())),
                ("out_layout", AttrLit::Str(a.out_layout.clone())),
                ("out_dtype", dtype_lit(a.out_dtype)),
            ],
        }
    }

    /// The fusion kind.
    pub fn fusion_kind(&self) -> FusionKind {
        match self {
            Op::Add => FusionKind::Broadcast,
            Op::Relu => FusionKind::ElemWise,
            Op::Matmul { .. } | Op::Conv2d(_) => FusionKind::OutEWiseFusable,
        }
    }

    /// Infers the result type from the argument types.
    pub fn infer(&self, args: &[&Type]) -> Result<Type, String> {
        let t = |i: usize| -> Result<&crate::ir::TensorType, String> {
            args.get(i)
                .and_then(|t| t.as_tensor())
                .ok_or_else(|| format!("argument {i} must be a tensor"))
        };
        match self {
            Op::Relu => Ok(Type::Tensor(t(0)?.clone())),
            Op::Add => {
                let (a, b) = (t(0)?, t(1)?);
                if a.dtype != b.dtype {
                    return Err(format!(
                        "dtypes differ: {} and {}",
                        dt(a.dtype),
                        dt(b.dtype)
                    ));
                }
                match (&a.dims, &b.dims) {
                    (Some(x), Some(y)) => Ok(Type::tensor_dims(
                        broadcast(x, y)?,
                        a.dtype.unwrap_or(DType::F32),
                    )),
                    _ => Ok(Type::Tensor(crate::ir::TensorType {
                        dims: None,
                        ndim: None,
                        dtype: a.dtype,
                    })),
                }
            }
            Op::Matmul { out_dtype } => {
                let (a, b) = (t(0)?, t(1)?);
                let (Some(x), Some(y)) = (&a.dims, &b.dims) else {
                    return Ok(Type::Tensor(crate::ir::TensorType {
                        dims: None,
                        ndim: None,
                        dtype: out_dtype.or(a.dtype),
                    }));
                };
                if x.len() < 2 || y.len() < 2 {
                    return Err("matmul of vectors is not supported here".into());
                }
                let (m, k1) = (&x[x.len() - 2], &x[x.len() - 1]);
                let (k2, n) = (&y[y.len() - 2], &y[y.len() - 1]);
                if k1 != k2 && k1.as_static().is_some() && k2.as_static().is_some() {
                    return Err(format!("reduction dims differ: {k1} and {k2}"));
                }
                let mut out = broadcast(&x[..x.len() - 2], &y[..y.len() - 2])?;
                out.push(m.clone());
                out.push(n.clone());
                Ok(Type::tensor_dims(
                    out,
                    out_dtype.or(a.dtype).unwrap_or(DType::F32),
                ))
            }
            Op::Conv2d(a) => {
                let (x, w) = (t(0)?, t(1)?);
                let (Some(xd), Some(wd)) = (&x.dims, &w.dims) else {
                    return Err("conv2d needs known ranks".into());
                };
                if xd.len() != 4 || wd.len() != 4 {
                    return Err("conv2d needs 4-D data and weight".into());
                }
                let (n, h, wi) = (&xd[0], &xd[2], &xd[3]);
                let (o, kh, kw) = (&wd[0], &wd[2], &wd[3]);
                let out = |i: &Dim, k: &Dim, s: i64, p0: i64, p1: i64, d: i64| {
                    let eff = k
                        .sub(&Dim::Static(1))
                        .mul(&Dim::Static(d))
                        .add(&Dim::Static(1));
                    i.add(&Dim::Static(p0 + p1))
                        .sub(&eff)
                        .floor_div(&Dim::Static(s))
                        .add(&Dim::Static(1))
                };
                let oh = out(
                    h,
                    kh,
                    a.strides[0],
                    a.padding[0],
                    a.padding[2],
                    a.dilation[0],
                );
                let ow = out(
                    wi,
                    kw,
                    a.strides[1],
                    a.padding[1],
                    a.padding[3],
                    a.dilation[1],
                );
                Ok(Type::tensor_dims(
                    vec![n.clone(), o.clone(), oh, ow],
                    a.out_dtype.or(x.dtype).unwrap_or(DType::F32),
                ))
            }
        }
    }
}

fn dt(d: Option<DType>) -> &'static str {
    d.map_or("void", DType::name)
}

fn broadcast(x: &[Dim], y: &[Dim]) -> Result<Vec<Dim>, String> {
    let n = x.len().max(y.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let a = (i + x.len()).checked_sub(n).map(|j| &x[j]);
        let b = (i + y.len()).checked_sub(n).map(|j| &y[j]);
        out.push(match (a, b) {
            (Some(a), None) => a.clone(),
            (None, Some(b)) => b.clone(),
            (Some(a), Some(b)) if a == b => a.clone(),
            (Some(Dim::Static(1)), Some(b)) => b.clone(),
            (Some(a), Some(Dim::Static(1))) => a.clone(),
            (Some(a), Some(b)) => return Err(format!("cannot broadcast dims {a} and {b}")),
            (None, None) => return Err("broadcast rank".into()),
        });
    }
    Ok(out)
}

fn dtype_attr(v: Option<&AttrLit>) -> Result<Option<DType>, String> {
    match v {
        None | Some(AttrLit::None) => Ok(None),
        Some(AttrLit::Str(s)) if s == "void" || s.is_empty() => Ok(None),
        Some(AttrLit::Str(s)) => DType::from_name(s)
            .map(Some)
            .ok_or_else(|| format!("unknown dtype \"{s}\"")),
        Some(other) => Err(format!("expected a dtype string or None, found {other:?}")),
    }
}

fn dtype_lit(d: Option<DType>) -> AttrLit {
    d.map_or(AttrLit::None, |d| AttrLit::Str(d.name().to_string()))
}

fn ints_attr(v: Option<&AttrLit>, default: &[i64], name: &str) -> Result<Vec<i64>, String> {
    match v {
        None => Ok(default.to_vec()),
        Some(AttrLit::Int(i)) => Ok(vec![*i]),
        Some(AttrLit::List(items)) => items
            .iter()
            .map(|x| match x {
                AttrLit::Int(i) => Ok(*i),
                _ => Err(format!("`{name}` expects integers")),
            })
            .collect(),
        Some(_) => Err(format!("`{name}` expects a list of integers")),
    }
}

fn pair(v: &[i64], name: &str) -> Result<[i64; 2], String> {
    match *v {
        [a] => Ok([a, a]),
        [a, b] => Ok([a, b]),
        _ => Err(format!(
            "`{name}` expects 1 or 2 integers, found {}",
            v.len()
        )),
    }
}

fn quad(v: &[i64]) -> Result<[i64; 4], String> {
    match *v {
        [a] => Ok([a, a, a, a]),
        [a, b] => Ok([a, b, a, b]),
        [a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(format!(
            "`padding` expects 1, 2 or 4 integers, found {}",
            v.len()
        )),
    }
}

fn int_attr(v: Option<&AttrLit>, default: i64, name: &str) -> Result<i64, String> {
    match v {
        None => Ok(default),
        Some(AttrLit::Int(i)) => Ok(*i),
        Some(_) => Err(format!("`{name}` expects an integer")),
    }
}

fn str_attr(v: Option<&AttrLit>, default: &str, name: &str) -> Result<String, String> {
    match v {
        None => Ok(default.to_string()),
        Some(AttrLit::Str(s)) => Ok(s.clone()),
        Some(_) => Err(format!("`{name}` expects a string")),
    }
}

fn ints_lit(v: &[i64]) -> AttrLit {
    AttrLit::List(v.iter().map(|&i| AttrLit::Int(i)).collect())
}
