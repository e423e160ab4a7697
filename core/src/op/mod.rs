//! The op set: TVM Relax's ops with typed attributes, type inference and a fusion kind.
//!
//! Contract:
//!
//! - [`Op`] is a closed enum, one variant per op, carrying typed attributes (big attribute
//!   structs are boxed so an `Op` stays within 32 bytes). The attribute-free elementwise
//!   comparison / logic / bitwise / `where` / math family is one variant, [`Op::Elem`], with one
//!   [`ElemOp`] per TVM op.
//! - [`Op::from_call`] builds an op from the keyword literals written in the text format;
//!   attributes left out take TVM's defaults, unknown attributes and literals of the wrong
//!   kind are errors that say what was expected. [`Op::kwargs`] gives back every attribute in
//!   the order TVM 0.27 prints them, so `Op::from_call(op.name(), &op.kwargs()) == op`.
//! - [`Op::signature`] says how many expression arguments a call takes and which attributes
//!   positional literals fill (Python API order).
//! - [`Op::infer`] computes the result type from the argument types, following TVM's
//!   struct-info inference: shapes may be symbolic ([`Dim`] arithmetic, constants folded),
//!   negative axes are normalised, unknown shapes or dtypes give a less specific type, and
//!   errors (never panics) say what was expected and what was found.
//! - [`Op::fusion_kind`] is TVM's `OpPatternKind` for the op.
//!
//! ```text
//! lv: R.Tensor((n, 16, 32, 32), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1],
//!     padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW",
//!     kernel_layout="OIHW", out_layout="NCHW", out_dtype=None)
//! lv1: R.Tensor((n, 16, 32, 32), dtype="float32") = R.nn.relu(lv)
//! lv2: R.Tensor((n, 16384), dtype="float32") = R.reshape(lv1, R.shape([n, 16384]))
//! ```
//!
//! Where this op set departs from TVM 0.27: `relax.strided_slice` takes `axes`, `begin`, `end`
//! and `strides` as attributes (TVM passes them as expression arguments), and with symbolic
//! dims it does not clamp (as with `assume_inbound=True`). `relax.arange` takes `start`, `end`
//! and `step`, and `relax.tril` / `relax.triu` take `k`, as attributes (TVM passes prim values),
//! so their types follow from the attributes.

mod attention;
mod attrs;
pub mod einsum;
mod elem;
mod index;
mod infer;
mod nn;
mod pool;
#[cfg(test)]
mod tests;

use crate::ir::{DType, Dim, Type};
pub use attention::{AttentionAttrs, CausalMask};
use attrs::{
    Kwargs, at_least, check_layout, dtype_lit, ints_lit, opt_int_lit, opt_ints_lit, pair, quad,
    str_lit,
};
pub use elem::{ElemClass, ElemOp};
pub use index::{ArangeAttrs, PadAttrs, PadMode, ScanAttrs, ScatterReduction};
pub use nn::{Conv2dTransposeAttrs, GroupNormAttrs, Resize2dAttrs, Taps};
pub use pool::{AdaptivePoolAttrs, PoolAttrs};

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
    /// Data layout: a permutation of `NCHW`.
    pub data_layout: String,
    /// Kernel layout: a permutation of `OIHW`.
    pub kernel_layout: String,
    /// Output layout: a permutation of `NCHW`.
    pub out_layout: String,
    /// Output dtype (`None`: same as the input).
    pub out_dtype: Option<DType>,
}

/// Attributes of `relax.nn.batch_norm`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BatchNormAttrs {
    /// The channel axis.
    pub axis: i64,
    /// Added to the variance.
    pub epsilon: F64,
    /// Whether `beta` is added.
    pub center: bool,
    /// Whether `gamma` multiplies.
    pub scale: bool,
    /// Moving-average momentum.
    pub momentum: F64,
    /// Training mode (statistics from the batch).
    pub training: bool,
}

/// Attributes of `relax.nn.layer_norm`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LayerNormAttrs {
    /// The normalised axes.
    pub axes: Vec<i64>,
    /// Added to the variance.
    pub epsilon: F64,
    /// Whether `beta` is added.
    pub center: bool,
    /// Whether `gamma` multiplies.
    pub scale: bool,
}

/// Attributes of `relax.nn.rms_norm`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RmsNormAttrs {
    /// The normalised axes.
    pub axes: Vec<i64>,
    /// Added to the mean square.
    pub epsilon: F64,
}

/// Attributes of the reductions `relax.sum`, `relax.mean` and `relax.max`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReduceAttrs {
    /// The reduced axes (`None`: all).
    pub axis: Option<Vec<i64>>,
    /// Whether reduced axes stay as extent-1 dims.
    pub keepdims: bool,
}

/// Attributes of `relax.nn.max_pool2d` and `relax.nn.avg_pool2d`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dAttrs {
    /// Window size (h, w).
    pub pool_size: [i64; 2],
    /// Strides (h, w).
    pub strides: [i64; 2],
    /// Dilation (h, w).
    pub dilation: [i64; 2],
    /// Padding (top, left, bottom, right).
    pub padding: [i64; 4],
    /// Round the output extent up instead of down.
    pub ceil_mode: bool,
    /// Whether padding counts in the average.
    pub count_include_pad: bool,
    /// Data layout: a permutation of `NCHW`.
    pub layout: String,
    /// Output layout: a permutation of `NCHW`.
    pub out_layout: String,
}

/// Attributes of `relax.nn.adaptive_avg_pool2d`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AdaptivePool2dAttrs {
    /// Output (h, w) (`None`: same as the input).
    pub output_size: Option<[i64; 2]>,
    /// Data layout: a permutation of `NCHW`.
    pub layout: String,
    /// Output layout: a permutation of `NCHW`.
    pub out_layout: String,
}

/// How `relax.split` splits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SplitSpec {
    /// Into this many (nearly) equal parts.
    Sections(i64),
    /// At these indices.
    Indices(Vec<i64>),
}

/// Attributes of `relax.split`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SplitAttrs {
    /// Sections or split indices.
    pub indices_or_sections: SplitSpec,
    /// The split axis.
    pub axis: i64,
}

/// Attributes of `relax.strided_slice`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StridedSliceAttrs {
    /// The sliced axes.
    pub axes: Vec<i64>,
    /// Start per axis.
    pub begin: Vec<i64>,
    /// End (exclusive) per axis.
    pub end: Vec<i64>,
    /// Step per axis (`None`: all 1).
    pub strides: Option<Vec<i64>>,
    /// Whether indices are known to be in bounds.
    pub assume_inbound: bool,
}

/// How `relax.take` treats out-of-range indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TakeMode {
    /// No checks (`"fast"`).
    Fast,
    /// Clamp into range (`"clip"`).
    Clip,
    /// Wrap around (`"wrap"`).
    Wrap,
}

impl TakeMode {
    /// TVM's spelling.
    pub fn name(self) -> &'static str {
        match self {
            TakeMode::Fast => "fast",
            TakeMode::Clip => "clip",
            TakeMode::Wrap => "wrap",
        }
    }
}

/// Attributes of `relax.nn.lrn`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LrnAttrs {
    /// Window size along `axis`.
    pub size: i64,
    /// The channel axis.
    pub axis: i64,
    /// Scale.
    pub alpha: F64,
    /// Exponent.
    pub beta: F64,
    /// Offset.
    pub bias: F64,
}

/// Attributes of `relax.topk`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TopkAttrs {
    /// How many elements to select (at least 0).
    pub k: i64,
    /// The axis along which to select.
    pub axis: i64,
    /// What the op returns: `"both"` (a tuple of values and indices), `"values"` or
    /// `"indices"`.
    pub ret_type: String,
    /// Select the largest elements (`false`: the smallest).
    pub largest: bool,
    /// The dtype of the indices (`None`: `int32`, TVM's default).
    pub dtype: Option<DType>,
}

/// A call of an op outside the op set (`R.foo(x, axis=1)` where `relax.foo` is not an op of
/// [`Op::names`]): its name and keyword attributes are kept verbatim, in the order written, and
/// its result type is the one the binding's annotation gives. It prints back as written, pattern
/// names can match it, FuseOps treats it as [`FusionKind::Opaque`], and running it fails with
/// "no kernel for `relax.foo`".
#[derive(Clone, Debug)]
pub struct OpaqueOp {
    /// The full name (`relax.foo`).
    pub name: Box<str>,
    /// The keyword attributes, in the order written.
    pub attrs: Vec<(Box<str>, AttrLit)>,
    /// The result type (from the binding's annotation).
    pub ty: Type,
}

/// Equality of literals with floats compared bitwise (so `Eq` is reflexive, NaN included).
fn lit_eq(a: &AttrLit, b: &AttrLit) -> bool {
    match (a, b) {
        (AttrLit::Float(x), AttrLit::Float(y)) => x.to_bits() == y.to_bits(),
        (AttrLit::List(x), AttrLit::List(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| lit_eq(p, q))
        }
        _ => a == b,
    }
}

fn lit_hash<H: std::hash::Hasher>(l: &AttrLit, state: &mut H) {
    use std::hash::Hash;
    std::mem::discriminant(l).hash(state);
    match l {
        AttrLit::None => {}
        AttrLit::Bool(b) => b.hash(state),
        AttrLit::Int(i) => i.hash(state),
        AttrLit::Float(f) => f.to_bits().hash(state),
        AttrLit::Str(s) => s.hash(state),
        AttrLit::List(v) => {
            v.len().hash(state);
            for x in v {
                lit_hash(x, state);
            }
        }
    }
}

impl PartialEq for OpaqueOp {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.ty == other.ty
            && self.attrs.len() == other.attrs.len()
            && self
                .attrs
                .iter()
                .zip(&other.attrs)
                .all(|((k, a), (l, b))| k == l && lit_eq(a, b))
    }
}
impl Eq for OpaqueOp {}
impl std::hash::Hash for OpaqueOp {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.ty.hash(state);
        self.attrs.len().hash(state);
        for (k, v) in &self.attrs {
            k.hash(state);
            lit_hash(v, state);
        }
    }
}

/// An op with its typed attributes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `relax.add`
    Add,
    /// `relax.subtract`
    Subtract,
    /// `relax.multiply`
    Multiply,
    /// `relax.divide`
    Divide,
    /// `relax.power`
    Power,
    /// `relax.maximum`
    Maximum,
    /// `relax.minimum`
    Minimum,
    /// `relax.exp`
    Exp,
    /// `relax.log`
    Log,
    /// `relax.sqrt`
    Sqrt,
    /// `relax.rsqrt`
    Rsqrt,
    /// `relax.tanh`
    Tanh,
    /// `relax.sigmoid`
    Sigmoid,
    /// `relax.erf`
    Erf,
    /// `relax.negative`
    Negative,
    /// `relax.abs`
    Abs,
    /// `relax.clip(x, min, max)` with prim-value bounds.
    Clip,
    /// `relax.astype`
    Astype {
        /// The target dtype.
        dtype: DType,
    },
    /// `relax.nn.relu`
    Relu,
    /// `relax.nn.gelu`
    Gelu,
    /// `relax.nn.gelu_tanh`
    GeluTanh,
    /// `relax.nn.silu`
    Silu,
    /// `relax.matmul`
    Matmul {
        /// Output dtype (`None`: same as the inputs).
        out_dtype: Option<DType>,
    },
    /// `relax.nn.conv2d`
    Conv2d(Box<Conv2dAttrs>),
    /// `relax.nn.batch_norm`
    BatchNorm(Box<BatchNormAttrs>),
    /// `relax.nn.layer_norm`
    LayerNorm(Box<LayerNormAttrs>),
    /// `relax.nn.rms_norm`
    RmsNorm(Box<RmsNormAttrs>),
    /// `relax.nn.softmax`
    Softmax {
        /// The normalised axis.
        axis: i64,
    },
    /// `relax.nn.log_softmax`
    LogSoftmax {
        /// The normalised axis.
        axis: i64,
    },
    /// `relax.nn.dropout`
    Dropout {
        /// Probability of dropping an element.
        rate: F64,
    },
    /// `relax.sum`
    Sum(Box<ReduceAttrs>),
    /// `relax.mean`
    Mean(Box<ReduceAttrs>),
    /// `relax.max`
    Max(Box<ReduceAttrs>),
    /// `relax.nn.max_pool2d`
    MaxPool2d(Box<Pool2dAttrs>),
    /// `relax.nn.avg_pool2d`
    AvgPool2d(Box<Pool2dAttrs>),
    /// `relax.nn.adaptive_avg_pool2d`
    AdaptiveAvgPool2d(Box<AdaptivePool2dAttrs>),
    /// `relax.reshape(x, shape)`
    Reshape,
    /// `relax.permute_dims`
    PermuteDims {
        /// The permutation (`None`: reverse).
        axes: Option<Vec<i64>>,
    },
    /// `relax.concat` of a tuple of tensors.
    Concat {
        /// The axis (`None`: flatten every input first).
        axis: Option<i64>,
    },
    /// `relax.split`
    Split(Box<SplitAttrs>),
    /// `relax.flatten`
    Flatten,
    /// `relax.squeeze`
    Squeeze {
        /// The removed axes (`None`: every extent-1 axis).
        axis: Option<Vec<i64>>,
    },
    /// `relax.expand_dims`
    ExpandDims {
        /// Where the new extent-1 axes go, in the output's numbering.
        axis: Vec<i64>,
    },
    /// `relax.strided_slice`
    StridedSlice(Box<StridedSliceAttrs>),
    /// `relax.take(x, indices)`
    Take {
        /// The axis (`None`: index the flattened tensor).
        axis: Option<i64>,
        /// Out-of-range handling.
        mode: TakeMode,
    },
    /// `relax.broadcast_to(x, shape)`
    BroadcastTo,
    /// `relax.shape_to_tensor(shape)`: a shape value as a 1-D `int64` tensor.
    ShapeToTensor,
    /// `relax.nn.lrn`
    Lrn(Box<LrnAttrs>),
    /// The elementwise comparison / logic / bitwise / `where` / math family (`relax.equal`,
    /// `relax.where`, `relax.sin`, …): one [`ElemOp`] per TVM op, none with attributes.
    Elem(ElemOp),
    /// `relax.gather_elements(data, indices)`
    GatherElements {
        /// The gathered axis.
        axis: i64,
    },
    /// `relax.gather_nd(data, indices)`
    GatherNd {
        /// The number of leading batch dims shared by `data` and `indices`.
        batch_dims: i64,
    },
    /// `relax.scatter_elements(data, indices, updates)`
    ScatterElements {
        /// The scattered axis.
        axis: i64,
        /// How an update combines with the value there.
        reduction: ScatterReduction,
    },
    /// `relax.scatter_nd(data, indices, updates)`
    ScatterNd {
        /// How an update combines with the value there.
        reduction: ScatterReduction,
    },
    /// `relax.one_hot(indices, on_value, off_value)` with prim-value fills.
    OneHot {
        /// The extent of the new axis.
        depth: i64,
        /// Where the new axis goes (`-1`: last).
        axis: i64,
    },
    /// `relax.arange` (bounds as attributes, see the module docs).
    Arange(Box<ArangeAttrs>),
    /// `relax.tile`
    Tile {
        /// Repetitions per axis (aligned right with the input's axes).
        repeats: Vec<i64>,
    },
    /// `relax.tril` (`k` as an attribute, see the module docs).
    Tril {
        /// The diagonal: elements with `col - row > k` become 0.
        k: i64,
    },
    /// `relax.triu` (`k` as an attribute, see the module docs).
    Triu {
        /// The diagonal: elements with `col - row < k` become 0.
        k: i64,
    },
    /// `relax.cumsum`
    Cumsum(Box<ScanAttrs>),
    /// `relax.cumprod`
    Cumprod(Box<ScanAttrs>),
    /// `relax.nn.pad`
    Pad(Box<PadAttrs>),
    /// `relax.min`
    Min(Box<ReduceAttrs>),
    /// `relax.prod`
    Prod(Box<ReduceAttrs>),
    /// `relax.argmax`: the index (int64) of the first largest element along `axis`.
    Argmax {
        /// The axis (`None`: the flattened tensor).
        axis: Option<i64>,
        /// Whether the reduced axis stays as an extent-1 dim.
        keepdims: bool,
    },
    /// `relax.argmin`: the index (int64) of the first smallest element along `axis`.
    Argmin {
        /// The axis (`None`: the flattened tensor).
        axis: Option<i64>,
        /// Whether the reduced axis stays as an extent-1 dim.
        keepdims: bool,
    },
    /// `relax.topk`
    Topk(Box<TopkAttrs>),
    /// `relax.einsum` of a tuple of tensors.
    Einsum {
        /// The equation (`"bij,bjk->bik"`).
        subscripts: Box<str>,
    },
    /// `relax.nn.conv2d_transpose(x, w)`
    Conv2dTranspose(Box<Conv2dTransposeAttrs>),
    /// `relax.image.resize2d(x, size)`
    Resize2d(Box<Resize2dAttrs>),
    /// `relax.nn.group_norm(x, gamma, beta)`
    GroupNorm(Box<GroupNormAttrs>),
    /// `relax.nn.instance_norm(x, gamma, beta)`
    InstanceNorm(Box<GroupNormAttrs>),
    /// `relax.stack` of a tuple of tensors of one shape, along a new axis.
    Stack {
        /// Where the new axis goes, in the output's numbering.
        axis: i64,
    },
    /// `relax.nn.max_pool1d`
    MaxPool1d(Box<PoolAttrs>),
    /// `relax.nn.avg_pool1d`
    AvgPool1d(Box<PoolAttrs>),
    /// `relax.nn.max_pool3d`
    MaxPool3d(Box<PoolAttrs>),
    /// `relax.nn.avg_pool3d`
    AvgPool3d(Box<PoolAttrs>),
    /// `relax.nn.adaptive_avg_pool1d`
    AdaptiveAvgPool1d(Box<AdaptivePoolAttrs>),
    /// `relax.nn.adaptive_avg_pool3d`
    AdaptiveAvgPool3d(Box<AdaptivePoolAttrs>),
    /// `relax.nn.attention(query, key, value)`
    Attention(Box<AttentionAttrs>),
    /// `relax.nn.attention_bias(query, key, value, bias)`
    AttentionBias(Box<AttentionAttrs>),
    /// An op outside the op set, kept verbatim (see [`OpaqueOp`]).
    Opaque(Box<OpaqueOp>),
}

/// The names of the ops outside the [`ElemOp`] family (those are [`ElemOp::NAMES`]).
const OTHER_NAMES: &[&str] = &[
    "relax.add",
    "relax.subtract",
    "relax.multiply",
    "relax.divide",
    "relax.power",
    "relax.maximum",
    "relax.minimum",
    "relax.exp",
    "relax.log",
    "relax.sqrt",
    "relax.rsqrt",
    "relax.tanh",
    "relax.sigmoid",
    "relax.erf",
    "relax.negative",
    "relax.abs",
    "relax.clip",
    "relax.astype",
    "relax.nn.relu",
    "relax.nn.gelu",
    "relax.nn.gelu_tanh",
    "relax.nn.silu",
    "relax.matmul",
    "relax.nn.conv2d",
    "relax.nn.batch_norm",
    "relax.nn.layer_norm",
    "relax.nn.rms_norm",
    "relax.nn.softmax",
    "relax.nn.log_softmax",
    "relax.nn.dropout",
    "relax.sum",
    "relax.mean",
    "relax.max",
    "relax.nn.max_pool2d",
    "relax.nn.avg_pool2d",
    "relax.nn.adaptive_avg_pool2d",
    "relax.reshape",
    "relax.permute_dims",
    "relax.concat",
    "relax.split",
    "relax.flatten",
    "relax.squeeze",
    "relax.expand_dims",
    "relax.strided_slice",
    "relax.take",
    "relax.broadcast_to",
    "relax.shape_to_tensor",
    "relax.nn.lrn",
    "relax.gather_elements",
    "relax.gather_nd",
    "relax.scatter_elements",
    "relax.scatter_nd",
    "relax.one_hot",
    "relax.arange",
    "relax.tile",
    "relax.tril",
    "relax.triu",
    "relax.cumsum",
    "relax.cumprod",
    "relax.nn.pad",
    "relax.min",
    "relax.prod",
    "relax.argmax",
    "relax.argmin",
    "relax.topk",
    "relax.einsum",
    "relax.nn.conv2d_transpose",
    "relax.image.resize2d",
    "relax.nn.group_norm",
    "relax.nn.instance_norm",
    "relax.stack",
    "relax.nn.max_pool1d",
    "relax.nn.avg_pool1d",
    "relax.nn.max_pool3d",
    "relax.nn.avg_pool3d",
    "relax.nn.adaptive_avg_pool1d",
    "relax.nn.adaptive_avg_pool3d",
    "relax.nn.attention",
    "relax.nn.attention_bias",
];

const CONV2D_ATTRS: &[&str] = &[
    "strides",
    "padding",
    "dilation",
    "groups",
    "data_layout",
    "kernel_layout",
    "out_layout",
    "out_dtype",
];
const BATCH_NORM_ATTRS: &[&str] = &["axis", "epsilon", "center", "scale", "momentum", "training"];
/// Python-API (positional) order; TVM prints `dilation` before `padding`.
const POOL2D_ATTRS: &[&str] = &[
    "pool_size",
    "strides",
    "padding",
    "dilation",
    "ceil_mode",
    "count_include_pad",
    "layout",
    "out_layout",
];

fn sig(min_args: usize, max_args: usize, attr_names: &'static [&'static str]) -> OpSig {
    OpSig {
        min_args,
        max_args,
        attr_names,
    }
}

fn pool2d_attrs(kw: &Kwargs<'_>) -> Result<Box<Pool2dAttrs>, String> {
    let pool_size = pair(kw, "pool_size", &kw.ints("pool_size", Some(&[1, 1]))?)?;
    let strides = pair(kw, "strides", &kw.ints("strides", Some(&[1, 1]))?)?;
    let dilation = pair(kw, "dilation", &kw.ints("dilation", Some(&[1, 1]))?)?;
    let padding = quad(kw, "padding", &kw.ints("padding", Some(&[0, 0]))?)?;
    at_least(kw, "pool_size", &pool_size, 1)?;
    at_least(kw, "strides", &strides, 1)?;
    at_least(kw, "dilation", &dilation, 1)?;
    at_least(kw, "padding", &padding, 0)?;
    let layout = kw.string("layout", Some("NCHW"))?;
    check_layout(kw, "layout", &layout, "NCHW")?;
    let out_layout = kw.string("out_layout", Some(&layout))?;
    check_layout(kw, "out_layout", &out_layout, "NCHW")?;
    Ok(Box::new(Pool2dAttrs {
        pool_size,
        strides,
        dilation,
        padding,
        ceil_mode: kw.bool("ceil_mode", false)?,
        count_include_pad: kw.bool("count_include_pad", false)?,
        layout,
        out_layout,
    }))
}

fn reduce_attrs(kw: &Kwargs<'_>) -> Result<Box<ReduceAttrs>, String> {
    Ok(Box::new(ReduceAttrs {
        axis: kw.opt_ints("axis")?,
        keepdims: kw.bool("keepdims", false)?,
    }))
}

fn pool2d_kwargs(a: &Pool2dAttrs) -> Vec<(&'static str, AttrLit)> {
    vec![
        ("pool_size", ints_lit(&a.pool_size)),
        ("strides", ints_lit(&a.strides)),
        ("dilation", ints_lit(&a.dilation)),
        ("padding", ints_lit(&a.padding)),
        ("ceil_mode", AttrLit::Bool(a.ceil_mode)),
        ("count_include_pad", AttrLit::Bool(a.count_include_pad)),
        ("layout", str_lit(&a.layout)),
        ("out_layout", str_lit(&a.out_layout)),
    ]
}

fn reduce_kwargs(a: &ReduceAttrs) -> Vec<(&'static str, AttrLit)> {
    vec![
        ("axis", opt_ints_lit(a.axis.as_deref())),
        ("keepdims", AttrLit::Bool(a.keepdims)),
    ]
}

impl Op {
    /// Every op name, in a fixed order.
    pub fn names() -> &'static [&'static str] {
        static NAMES: std::sync::LazyLock<Vec<&'static str>> = std::sync::LazyLock::new(|| {
            OTHER_NAMES
                .iter()
                .chain(ElemOp::NAMES.iter())
                .copied()
                .collect()
        });
        NAMES.as_slice()
    }

    /// The op's name (`"relax.nn.conv2d"`).
    pub fn name(&self) -> &str {
        match self {
            Op::Opaque(o) => &o.name,
            _ => self.static_name().unwrap_or_default(),
        }
    }

    /// The name of an op of the op set as a `'static` literal; `None` for [`Op::Opaque`].
    pub fn static_name(&self) -> Option<&'static str> {
        Some(match self {
            Op::Opaque(_) => return None,
            Op::Add => "relax.add",
            Op::Subtract => "relax.subtract",
            Op::Multiply => "relax.multiply",
            Op::Divide => "relax.divide",
            Op::Power => "relax.power",
            Op::Maximum => "relax.maximum",
            Op::Minimum => "relax.minimum",
            Op::Exp => "relax.exp",
            Op::Log => "relax.log",
            Op::Sqrt => "relax.sqrt",
            Op::Rsqrt => "relax.rsqrt",
            Op::Tanh => "relax.tanh",
            Op::Sigmoid => "relax.sigmoid",
            Op::Erf => "relax.erf",
            Op::Negative => "relax.negative",
            Op::Abs => "relax.abs",
            Op::Clip => "relax.clip",
            Op::Astype { .. } => "relax.astype",
            Op::Relu => "relax.nn.relu",
            Op::Gelu => "relax.nn.gelu",
            Op::GeluTanh => "relax.nn.gelu_tanh",
            Op::Silu => "relax.nn.silu",
            Op::Matmul { .. } => "relax.matmul",
            Op::Conv2d(_) => "relax.nn.conv2d",
            Op::BatchNorm(_) => "relax.nn.batch_norm",
            Op::LayerNorm(_) => "relax.nn.layer_norm",
            Op::RmsNorm(_) => "relax.nn.rms_norm",
            Op::Softmax { .. } => "relax.nn.softmax",
            Op::LogSoftmax { .. } => "relax.nn.log_softmax",
            Op::Dropout { .. } => "relax.nn.dropout",
            Op::Sum(_) => "relax.sum",
            Op::Mean(_) => "relax.mean",
            Op::Max(_) => "relax.max",
            Op::MaxPool2d(_) => "relax.nn.max_pool2d",
            Op::AvgPool2d(_) => "relax.nn.avg_pool2d",
            Op::AdaptiveAvgPool2d(_) => "relax.nn.adaptive_avg_pool2d",
            Op::Reshape => "relax.reshape",
            Op::PermuteDims { .. } => "relax.permute_dims",
            Op::Concat { .. } => "relax.concat",
            Op::Split(_) => "relax.split",
            Op::Flatten => "relax.flatten",
            Op::Squeeze { .. } => "relax.squeeze",
            Op::ExpandDims { .. } => "relax.expand_dims",
            Op::StridedSlice(_) => "relax.strided_slice",
            Op::Take { .. } => "relax.take",
            Op::BroadcastTo => "relax.broadcast_to",
            Op::ShapeToTensor => "relax.shape_to_tensor",
            Op::Lrn(_) => "relax.nn.lrn",
            Op::Elem(e) => e.name(),
            Op::GatherElements { .. } => "relax.gather_elements",
            Op::GatherNd { .. } => "relax.gather_nd",
            Op::ScatterElements { .. } => "relax.scatter_elements",
            Op::ScatterNd { .. } => "relax.scatter_nd",
            Op::OneHot { .. } => "relax.one_hot",
            Op::Arange(_) => "relax.arange",
            Op::Tile { .. } => "relax.tile",
            Op::Tril { .. } => "relax.tril",
            Op::Triu { .. } => "relax.triu",
            Op::Cumsum(_) => "relax.cumsum",
            Op::Cumprod(_) => "relax.cumprod",
            Op::Pad(_) => "relax.nn.pad",
            Op::Min(_) => "relax.min",
            Op::Prod(_) => "relax.prod",
            Op::Argmax { .. } => "relax.argmax",
            Op::Argmin { .. } => "relax.argmin",
            Op::Topk(_) => "relax.topk",
            Op::Einsum { .. } => "relax.einsum",
            Op::Conv2dTranspose(_) => "relax.nn.conv2d_transpose",
            Op::Resize2d(_) => "relax.image.resize2d",
            Op::GroupNorm(_) => "relax.nn.group_norm",
            Op::InstanceNorm(_) => "relax.nn.instance_norm",
            Op::Stack { .. } => "relax.stack",
            Op::MaxPool1d(_) => "relax.nn.max_pool1d",
            Op::AvgPool1d(_) => "relax.nn.avg_pool1d",
            Op::MaxPool3d(_) => "relax.nn.max_pool3d",
            Op::AvgPool3d(_) => "relax.nn.avg_pool3d",
            Op::AdaptiveAvgPool1d(_) => "relax.nn.adaptive_avg_pool1d",
            Op::AdaptiveAvgPool3d(_) => "relax.nn.adaptive_avg_pool3d",
            Op::Attention(_) => "relax.nn.attention",
            Op::AttentionBias(_) => "relax.nn.attention_bias",
        })
    }

    /// The call signature of the op named `name`, or `None` for an unknown op. Attribute names
    /// are in the order positional literals fill them (TVM's Python API order).
    pub fn signature(name: &str) -> Option<OpSig> {
        Some(match name {
            "relax.add" | "relax.subtract" | "relax.multiply" | "relax.divide" | "relax.power"
            | "relax.maximum" | "relax.minimum" | "relax.reshape" | "relax.broadcast_to" => {
                sig(2, 2, &[])
            }
            "relax.exp"
            | "relax.log"
            | "relax.sqrt"
            | "relax.rsqrt"
            | "relax.tanh"
            | "relax.sigmoid"
            | "relax.erf"
            | "relax.negative"
            | "relax.abs"
            | "relax.nn.relu"
            | "relax.nn.gelu"
            | "relax.nn.gelu_tanh"
            | "relax.nn.silu"
            | "relax.flatten"
            | "relax.shape_to_tensor" => sig(1, 1, &[]),
            "relax.clip" => sig(3, 3, &[]),
            "relax.astype" => sig(1, 1, &["dtype"]),
            "relax.matmul" => sig(2, 2, &["out_dtype"]),
            "relax.nn.conv2d" => sig(2, 2, CONV2D_ATTRS),
            "relax.nn.batch_norm" => sig(5, 5, BATCH_NORM_ATTRS),
            "relax.nn.layer_norm" => sig(3, 3, &["axes", "epsilon", "center", "scale"]),
            "relax.nn.rms_norm" => sig(2, 2, &["axes", "epsilon"]),
            "relax.nn.softmax" | "relax.nn.log_softmax" => sig(1, 1, &["axis"]),
            "relax.nn.dropout" => sig(1, 1, &["rate"]),
            "relax.sum" | "relax.mean" | "relax.max" => sig(1, 1, &["axis", "keepdims"]),
            "relax.nn.max_pool2d" | "relax.nn.avg_pool2d" => sig(1, 1, POOL2D_ATTRS),
            "relax.nn.adaptive_avg_pool2d" => sig(1, 1, &["output_size", "layout", "out_layout"]),
            "relax.permute_dims" => sig(1, 1, &["axes"]),
            "relax.concat" => sig(1, 1, &["axis"]),
            "relax.split" => sig(1, 1, &["indices_or_sections", "axis"]),
            "relax.squeeze" | "relax.expand_dims" => sig(1, 1, &["axis"]),
            "relax.strided_slice" => {
                sig(1, 1, &["axes", "begin", "end", "strides", "assume_inbound"])
            }
            "relax.take" => sig(2, 2, &["axis", "mode"]),
            "relax.nn.lrn" => sig(1, 1, &["size", "axis", "alpha", "beta", "bias"]),
            n if ElemOp::from_name(n).is_some() => {
                let k = ElemOp::from_name(n).map_or(1, ElemOp::arity);
                sig(k, k, &[])
            }
            "relax.gather_elements" => sig(2, 2, &["axis"]),
            "relax.gather_nd" => sig(2, 2, &["batch_dims"]),
            "relax.scatter_elements" => sig(3, 3, &["axis", "reduction"]),
            "relax.scatter_nd" => sig(3, 3, &["reduction"]),
            "relax.one_hot" => sig(3, 3, &["depth", "axis"]),
            "relax.arange" => sig(0, 0, &["start", "end", "step", "dtype"]),
            "relax.tile" => sig(1, 1, &["repeats"]),
            "relax.tril" | "relax.triu" => sig(1, 1, &["k"]),
            "relax.cumsum" | "relax.cumprod" => sig(1, 1, &["axis", "dtype", "exclusive"]),
            "relax.nn.pad" => sig(1, 1, &["pad_width", "pad_mode", "pad_value"]),
            "relax.min" | "relax.prod" | "relax.argmax" | "relax.argmin" => {
                sig(1, 1, &["axis", "keepdims"])
            }
            "relax.topk" => sig(1, 1, &["k", "axis", "ret_type", "largest", "dtype"]),
            "relax.einsum" => sig(1, 1, &["subscripts"]),
            "relax.nn.conv2d_transpose" => sig(2, 2, nn::CONV2D_TRANSPOSE_ATTRS),
            "relax.image.resize2d" => sig(2, 2, nn::RESIZE2D_ATTRS),
            "relax.nn.group_norm" => sig(3, 3, nn::GROUP_NORM_ATTRS),
            "relax.nn.instance_norm" => sig(3, 3, nn::INSTANCE_NORM_ATTRS),
            "relax.stack" => sig(1, 1, &["axis"]),
            "relax.nn.max_pool1d"
            | "relax.nn.avg_pool1d"
            | "relax.nn.max_pool3d"
            | "relax.nn.avg_pool3d" => sig(1, 1, pool::POOL_ATTRS),
            "relax.nn.adaptive_avg_pool1d" | "relax.nn.adaptive_avg_pool3d" => {
                sig(1, 1, &["output_size", "layout", "out_layout"])
            }
            "relax.nn.attention" => sig(3, 3, attention::ATTENTION_ATTRS),
            "relax.nn.attention_bias" => sig(4, 4, attention::ATTENTION_ATTRS),
            _ => return None,
        })
    }

    /// Builds the op named `name` from keyword attributes; missing ones take TVM's defaults.
    /// Errors name the attribute and what was expected (an unknown attribute lists the valid
    /// ones).
    pub fn from_call(name: &str, kwargs: &[(String, AttrLit)]) -> Result<Op, String> {
        let sig = Op::signature(name).ok_or_else(|| format!("unknown op `{name}`"))?;
        let kw = Kwargs::new(name, sig.attr_names, kwargs)?;
        Ok(match name {
            "relax.add" => Op::Add,
            "relax.subtract" => Op::Subtract,
            "relax.multiply" => Op::Multiply,
            "relax.divide" => Op::Divide,
            "relax.power" => Op::Power,
            "relax.maximum" => Op::Maximum,
            "relax.minimum" => Op::Minimum,
            "relax.exp" => Op::Exp,
            "relax.log" => Op::Log,
            "relax.sqrt" => Op::Sqrt,
            "relax.rsqrt" => Op::Rsqrt,
            "relax.tanh" => Op::Tanh,
            "relax.sigmoid" => Op::Sigmoid,
            "relax.erf" => Op::Erf,
            "relax.negative" => Op::Negative,
            "relax.abs" => Op::Abs,
            "relax.clip" => Op::Clip,
            "relax.astype" => Op::Astype {
                dtype: kw.dtype("dtype")?,
            },
            "relax.nn.relu" => Op::Relu,
            "relax.nn.gelu" => Op::Gelu,
            "relax.nn.gelu_tanh" => Op::GeluTanh,
            "relax.nn.silu" => Op::Silu,
            "relax.matmul" => Op::Matmul {
                out_dtype: kw.opt_dtype("out_dtype")?,
            },
            "relax.nn.conv2d" => {
                let strides = pair(&kw, "strides", &kw.ints("strides", Some(&[1, 1]))?)?;
                let padding = quad(&kw, "padding", &kw.ints("padding", Some(&[0, 0]))?)?;
                let dilation = pair(&kw, "dilation", &kw.ints("dilation", Some(&[1, 1]))?)?;
                let groups = kw.int("groups", Some(1))?;
                at_least(&kw, "strides", &strides, 1)?;
                at_least(&kw, "padding", &padding, 0)?;
                at_least(&kw, "dilation", &dilation, 1)?;
                at_least(&kw, "groups", &[groups], 1)?;
                let data_layout = kw.string("data_layout", Some("NCHW"))?;
                check_layout(&kw, "data_layout", &data_layout, "NCHW")?;
                let kernel_layout = kw.string("kernel_layout", Some("OIHW"))?;
                check_layout(&kw, "kernel_layout", &kernel_layout, "OIHW")?;
                let out_layout = kw.string("out_layout", Some(&data_layout))?;
                check_layout(&kw, "out_layout", &out_layout, "NCHW")?;
                Op::Conv2d(Box::new(Conv2dAttrs {
                    strides,
                    padding,
                    dilation,
                    groups,
                    data_layout,
                    kernel_layout,
                    out_layout,
                    out_dtype: kw.opt_dtype("out_dtype")?,
                }))
            }
            "relax.nn.batch_norm" => Op::BatchNorm(Box::new(BatchNormAttrs {
                axis: kw.int("axis", Some(1))?,
                epsilon: kw.float("epsilon", 1e-5)?,
                center: kw.bool("center", true)?,
                scale: kw.bool("scale", true)?,
                momentum: kw.float("momentum", 0.1)?,
                training: kw.bool("training", true)?,
            })),
            "relax.nn.layer_norm" => Op::LayerNorm(Box::new(LayerNormAttrs {
                axes: kw.ints("axes", Some(&[-1]))?,
                epsilon: kw.float("epsilon", 1e-5)?,
                center: kw.bool("center", true)?,
                scale: kw.bool("scale", true)?,
            })),
            "relax.nn.rms_norm" => Op::RmsNorm(Box::new(RmsNormAttrs {
                axes: kw.ints("axes", Some(&[-1]))?,
                epsilon: kw.float("epsilon", 1e-5)?,
            })),
            "relax.nn.softmax" => Op::Softmax {
                axis: kw.int("axis", Some(-1))?,
            },
            "relax.nn.log_softmax" => Op::LogSoftmax {
                axis: kw.int("axis", Some(-1))?,
            },
            "relax.nn.dropout" => Op::Dropout {
                rate: kw.float("rate", 0.5)?,
            },
            "relax.sum" => Op::Sum(reduce_attrs(&kw)?),
            "relax.mean" => Op::Mean(reduce_attrs(&kw)?),
            "relax.max" => Op::Max(reduce_attrs(&kw)?),
            "relax.nn.max_pool2d" => Op::MaxPool2d(pool2d_attrs(&kw)?),
            "relax.nn.avg_pool2d" => Op::AvgPool2d(pool2d_attrs(&kw)?),
            "relax.nn.adaptive_avg_pool2d" => {
                let output_size = match kw.opt_ints("output_size")? {
                    None => None,
                    Some(v) => {
                        let p = pair(&kw, "output_size", &v)?;
                        at_least(&kw, "output_size", &p, 1)?;
                        Some(p)
                    }
                };
                let layout = kw.string("layout", Some("NCHW"))?;
                check_layout(&kw, "layout", &layout, "NCHW")?;
                let out_layout = kw.string("out_layout", Some(&layout))?;
                check_layout(&kw, "out_layout", &out_layout, "NCHW")?;
                Op::AdaptiveAvgPool2d(Box::new(AdaptivePool2dAttrs {
                    output_size,
                    layout,
                    out_layout,
                }))
            }
            "relax.reshape" => Op::Reshape,
            "relax.permute_dims" => Op::PermuteDims {
                axes: kw.opt_ints("axes")?,
            },
            "relax.concat" => Op::Concat {
                axis: kw.opt_int("axis", Some(0))?,
            },
            "relax.split" => {
                let spec = match kw.raw("indices_or_sections") {
                    None => {
                        return Err(format!(
                            "`{name}`: missing required attribute `indices_or_sections`"
                        ));
                    }
                    Some(AttrLit::Int(n)) if *n >= 1 => SplitSpec::Sections(*n),
                    Some(AttrLit::Int(n)) => {
                        return Err(kw.invalid(
                            "indices_or_sections",
                            &format!("the number of sections must be at least 1, found {n}"),
                        ));
                    }
                    Some(v @ AttrLit::List(items)) => SplitSpec::Indices(
                        items
                            .iter()
                            .map(|x| match x {
                                AttrLit::Int(i) => Ok(*i),
                                _ => Err(kw.error(
                                    "indices_or_sections",
                                    "an integer or a list of integers",
                                    v,
                                )),
                            })
                            .collect::<Result<_, _>>()?,
                    ),
                    Some(v) => {
                        return Err(kw.error(
                            "indices_or_sections",
                            "an integer or a list of integers",
                            v,
                        ));
                    }
                };
                Op::Split(Box::new(SplitAttrs {
                    indices_or_sections: spec,
                    axis: kw.int("axis", Some(0))?,
                }))
            }
            "relax.flatten" => Op::Flatten,
            "relax.squeeze" => Op::Squeeze {
                axis: kw.opt_ints("axis")?,
            },
            "relax.expand_dims" => Op::ExpandDims {
                axis: kw.ints("axis", None)?,
            },
            "relax.strided_slice" => {
                let axes = kw.ints("axes", None)?;
                let begin = kw.ints("begin", None)?;
                let end = kw.ints("end", None)?;
                let strides = kw.opt_ints("strides")?;
                for (k, v) in [
                    ("begin", Some(&begin)),
                    ("end", Some(&end)),
                    ("strides", strides.as_ref()),
                ] {
                    if let Some(v) = v
                        && v.len() != axes.len()
                    {
                        return Err(kw.invalid(
                            k,
                            &format!(
                                "expected {} values (one per axis in `axes`), found {}",
                                axes.len(),
                                v.len()
                            ),
                        ));
                    }
                }
                if let Some(s) = &strides
                    && s.contains(&0)
                {
                    return Err(kw.invalid("strides", "a stride of 0 is not allowed"));
                }
                Op::StridedSlice(Box::new(StridedSliceAttrs {
                    axes,
                    begin,
                    end,
                    strides,
                    assume_inbound: kw.bool("assume_inbound", false)?,
                }))
            }
            "relax.take" => {
                let mode = match kw.string("mode", Some("fast"))?.as_str() {
                    "fast" => TakeMode::Fast,
                    "clip" => TakeMode::Clip,
                    "wrap" => TakeMode::Wrap,
                    other => {
                        return Err(kw.invalid(
                            "mode",
                            &format!("expected \"fast\", \"clip\" or \"wrap\", found \"{other}\""),
                        ));
                    }
                };
                Op::Take {
                    axis: kw.opt_int("axis", None)?,
                    mode,
                }
            }
            "relax.broadcast_to" => Op::BroadcastTo,
            "relax.shape_to_tensor" => Op::ShapeToTensor,
            "relax.nn.lrn" => {
                let size = kw.int("size", Some(5))?;
                at_least(&kw, "size", &[size], 1)?;
                Op::Lrn(Box::new(LrnAttrs {
                    size,
                    axis: kw.int("axis", Some(1))?,
                    alpha: kw.float("alpha", 0.0001)?,
                    beta: kw.float("beta", 0.75)?,
                    bias: kw.float("bias", 1.0)?,
                }))
            }
            n if ElemOp::from_name(n).is_some() => match ElemOp::from_name(n) {
                Some(e) => Op::Elem(e),
                None => return Err(format!("unknown op `{name}`")),
            },
            "relax.min" => Op::Min(reduce_attrs(&kw)?),
            "relax.prod" => Op::Prod(reduce_attrs(&kw)?),
            "relax.argmax" => Op::Argmax {
                axis: kw.opt_int("axis", None)?,
                keepdims: kw.bool("keepdims", false)?,
            },
            "relax.argmin" => Op::Argmin {
                axis: kw.opt_int("axis", None)?,
                keepdims: kw.bool("keepdims", false)?,
            },
            "relax.topk" => {
                let k = kw.int("k", Some(1))?;
                at_least(&kw, "k", &[k], 0)?;
                let ret_type = kw.string("ret_type", Some("both"))?;
                if !matches!(ret_type.as_str(), "both" | "values" | "indices") {
                    return Err(kw.invalid(
                        "ret_type",
                        &format!(
                            "expected \"both\", \"values\" or \"indices\", found \"{ret_type}\""
                        ),
                    ));
                }
                let dtype = kw.opt_dtype("dtype")?;
                if let Some(d) = dtype
                    && !d.is_int()
                {
                    return Err(kw.invalid(
                        "dtype",
                        &format!("expected an integer dtype for the indices, found {d}"),
                    ));
                }
                Op::Topk(Box::new(TopkAttrs {
                    k,
                    axis: kw.int("axis", Some(-1))?,
                    ret_type,
                    largest: kw.bool("largest", true)?,
                    dtype,
                }))
            }
            "relax.einsum" => Op::Einsum {
                subscripts: kw.string("subscripts", None)?.into_boxed_str(),
            },
            "relax.nn.conv2d_transpose" => Op::Conv2dTranspose(nn::conv2d_transpose_attrs(&kw)?),
            "relax.image.resize2d" => Op::Resize2d(nn::resize2d_attrs(&kw)?),
            "relax.nn.group_norm" => Op::GroupNorm(nn::group_norm_attrs(&kw, false)?),
            "relax.nn.instance_norm" => Op::InstanceNorm(nn::group_norm_attrs(&kw, true)?),
            "relax.stack" => Op::Stack {
                axis: kw.int("axis", Some(0))?,
            },
            "relax.nn.max_pool1d" => Op::MaxPool1d(pool::pool_attrs(&kw, 1, false)?),
            "relax.nn.avg_pool1d" => Op::AvgPool1d(pool::pool_attrs(&kw, 1, true)?),
            "relax.nn.max_pool3d" => Op::MaxPool3d(pool::pool_attrs(&kw, 3, false)?),
            "relax.nn.avg_pool3d" => Op::AvgPool3d(pool::pool_attrs(&kw, 3, true)?),
            "relax.nn.adaptive_avg_pool1d" => Op::AdaptiveAvgPool1d(pool::adaptive_attrs(&kw, 1)?),
            "relax.nn.adaptive_avg_pool3d" => Op::AdaptiveAvgPool3d(pool::adaptive_attrs(&kw, 3)?),
            "relax.nn.attention" => Op::Attention(attention::attention_attrs(&kw)?),
            "relax.nn.attention_bias" => Op::AttentionBias(attention::attention_attrs(&kw)?),
            _ => match index::from_call(name, &kw)? {
                Some(op) => op,
                None => return Err(format!("unknown op `{name}`")),
            },
        })
    }

    /// The attributes TVM holds as a `float32` immediate (`FloatImm`), which it prints as
    /// `T.float32(0.125)` rather than a bare number: `relax.nn.attention*`'s `scale`.
    pub fn float32_imm_attrs(&self) -> &'static [&'static str] {
        match self {
            Op::Attention(_) | Op::AttentionBias(_) => attention::FLOAT32_IMM_ATTRS,
            _ => &[],
        }
    }

    /// The attributes in TVM 0.27's printing order, with their values (TVM prints all of
    /// them, unset optional ones as `None`).
    pub fn kwargs(&self) -> Vec<(&str, AttrLit)> {
        match self {
            Op::Opaque(o) => o.attrs.iter().map(|(k, v)| (&**k, v.clone())).collect(),
            Op::Add
            | Op::Subtract
            | Op::Multiply
            | Op::Divide
            | Op::Power
            | Op::Maximum
            | Op::Minimum
            | Op::Exp
            | Op::Log
            | Op::Sqrt
            | Op::Rsqrt
            | Op::Tanh
            | Op::Sigmoid
            | Op::Erf
            | Op::Negative
            | Op::Abs
            | Op::Clip
            | Op::Relu
            | Op::Gelu
            | Op::GeluTanh
            | Op::Silu
            | Op::Reshape
            | Op::Flatten
            | Op::BroadcastTo
            | Op::ShapeToTensor => vec![],
            Op::Astype { dtype } => vec![("dtype", dtype_lit(Some(*dtype)))],
            Op::Matmul { out_dtype } => vec![("out_dtype", dtype_lit(*out_dtype))],
            Op::Conv2d(a) => vec![
                ("strides", ints_lit(&a.strides)),
                ("padding", ints_lit(&a.padding)),
                ("dilation", ints_lit(&a.dilation)),
                ("groups", AttrLit::Int(a.groups)),
                ("data_layout", str_lit(&a.data_layout)),
                ("kernel_layout", str_lit(&a.kernel_layout)),
                ("out_layout", str_lit(&a.out_layout)),
                ("out_dtype", dtype_lit(a.out_dtype)),
            ],
            Op::BatchNorm(a) => vec![
                ("axis", AttrLit::Int(a.axis)),
                ("epsilon", AttrLit::Float(a.epsilon.0)),
                ("center", AttrLit::Bool(a.center)),
                ("scale", AttrLit::Bool(a.scale)),
                ("momentum", AttrLit::Float(a.momentum.0)),
                ("training", AttrLit::Bool(a.training)),
            ],
            Op::LayerNorm(a) => vec![
                ("axes", ints_lit(&a.axes)),
                ("epsilon", AttrLit::Float(a.epsilon.0)),
                ("center", AttrLit::Bool(a.center)),
                ("scale", AttrLit::Bool(a.scale)),
            ],
            Op::RmsNorm(a) => {
                vec![
                    ("axes", ints_lit(&a.axes)),
                    ("epsilon", AttrLit::Float(a.epsilon.0)),
                ]
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } => vec![("axis", AttrLit::Int(*axis))],
            Op::Dropout { rate } => vec![("rate", AttrLit::Float(rate.0))],
            Op::Sum(a) | Op::Mean(a) | Op::Max(a) => reduce_kwargs(a),
            Op::MaxPool2d(a) | Op::AvgPool2d(a) => pool2d_kwargs(a),
            Op::AdaptiveAvgPool2d(a) => vec![
                (
                    "output_size",
                    opt_ints_lit(a.output_size.as_ref().map(|p| p.as_slice())),
                ),
                ("layout", str_lit(&a.layout)),
                ("out_layout", str_lit(&a.out_layout)),
            ],
            Op::PermuteDims { axes } => vec![("axes", opt_ints_lit(axes.as_deref()))],
            Op::Concat { axis } => vec![("axis", opt_int_lit(*axis))],
            Op::Split(a) => vec![
                (
                    "indices_or_sections",
                    match &a.indices_or_sections {
                        SplitSpec::Sections(n) => AttrLit::Int(*n),
                        SplitSpec::Indices(v) => ints_lit(v),
                    },
                ),
                ("axis", AttrLit::Int(a.axis)),
            ],
            Op::Squeeze { axis } => vec![("axis", opt_ints_lit(axis.as_deref()))],
            Op::ExpandDims { axis } => vec![("axis", ints_lit(axis))],
            Op::StridedSlice(a) => vec![
                ("axes", ints_lit(&a.axes)),
                ("begin", ints_lit(&a.begin)),
                ("end", ints_lit(&a.end)),
                ("strides", opt_ints_lit(a.strides.as_deref())),
                ("assume_inbound", AttrLit::Bool(a.assume_inbound)),
            ],
            Op::Take { axis, mode } => {
                vec![("axis", opt_int_lit(*axis)), ("mode", str_lit(mode.name()))]
            }
            Op::Lrn(a) => vec![
                ("size", AttrLit::Int(a.size)),
                ("axis", AttrLit::Int(a.axis)),
                ("alpha", AttrLit::Float(a.alpha.0)),
                ("beta", AttrLit::Float(a.beta.0)),
                ("bias", AttrLit::Float(a.bias.0)),
            ],
            Op::Elem(_) => vec![],
            Op::GatherElements { .. }
            | Op::GatherNd { .. }
            | Op::ScatterElements { .. }
            | Op::ScatterNd { .. }
            | Op::OneHot { .. }
            | Op::Arange(_)
            | Op::Tile { .. }
            | Op::Tril { .. }
            | Op::Triu { .. }
            | Op::Cumsum(_)
            | Op::Cumprod(_)
            | Op::Pad(_) => index::kwargs(self).unwrap_or_default(),
            Op::Min(a) | Op::Prod(a) => reduce_kwargs(a),
            Op::Argmax { axis, keepdims } | Op::Argmin { axis, keepdims } => vec![
                ("axis", opt_int_lit(*axis)),
                ("keepdims", AttrLit::Bool(*keepdims)),
            ],
            Op::Topk(a) => vec![
                ("k", AttrLit::Int(a.k)),
                ("axis", AttrLit::Int(a.axis)),
                ("ret_type", str_lit(&a.ret_type)),
                ("largest", AttrLit::Bool(a.largest)),
                ("dtype", dtype_lit(a.dtype)),
            ],
            Op::Einsum { subscripts } => vec![("subscripts", str_lit(subscripts))],
            Op::Conv2dTranspose(a) => nn::conv2d_transpose_kwargs(a),
            Op::Resize2d(a) => nn::resize2d_kwargs(a),
            Op::GroupNorm(a) => nn::group_norm_kwargs(a, false),
            Op::InstanceNorm(a) => nn::group_norm_kwargs(a, true),
            Op::Stack { axis } => vec![("axis", AttrLit::Int(*axis))],
            Op::MaxPool1d(a) | Op::AvgPool1d(a) | Op::MaxPool3d(a) | Op::AvgPool3d(a) => {
                pool::pool_kwargs(a)
            }
            Op::AdaptiveAvgPool1d(a) | Op::AdaptiveAvgPool3d(a) => pool::adaptive_kwargs(a),
            Op::Attention(a) | Op::AttentionBias(a) => attention::attention_kwargs(a),
        }
    }

    /// The fusion kind (TVM's `OpPatternKind`).
    ///
    /// Judgement calls: `batch_norm` is `Opaque` (it returns a tuple of three and legalizes to
    /// a mix of reductions and injective stages, which TVM's pattern analysis does not fuse
    /// as one); `dropout` is `Opaque` (it returns a tuple and has no fusable lowering);
    /// `lrn` is `Opaque` (a windowed reduction across channels, as in Relay);
    /// `einsum` is `OutEWiseFusable` (a contraction, like matmul); `topk` is `Opaque` (a sort);
    /// `adaptive_avg_pool2d` is `OutEWiseFusable` like the other pools (Relay's pattern);
    /// `broadcast_to` is `Broadcast` (Relay's pattern, and what TVM's TIR analysis finds).
    /// Index ops (issue 17): `tril`/`triu` are `ElemWise` and gathers, `one_hot`, `arange`,
    /// `tile` and `pad` are `Injective` (what TVM's TIR analysis finds for their `te.compute`
    /// legalizations); scatters and scans are `Opaque` (topi builds them with the IR builder,
    /// as Relay registers them).
    /// `broadcast_to` is `Broadcast` (Relay's pattern, and what TVM's TIR analysis finds);
    /// `conv2d_transpose` is `OutEWiseFusable` and `resize2d` is `Injective` (Relay's patterns);
    /// `group_norm` and `instance_norm` are `CommReduce` like `layer_norm`.
    /// `attention` / `attention_bias` are `Opaque` (TVM registers no `TOpPattern` for them,
    /// which FuseOps reads as opaque; they reach a kernel through the `*.attention` patterns).
    pub fn fusion_kind(&self) -> FusionKind {
        match self {
            Op::Add
            | Op::Subtract
            | Op::Multiply
            | Op::Divide
            | Op::Power
            | Op::Maximum
            | Op::Minimum
            | Op::BroadcastTo => FusionKind::Broadcast,
            Op::Exp
            | Op::Log
            | Op::Sqrt
            | Op::Rsqrt
            | Op::Tanh
            | Op::Sigmoid
            | Op::Erf
            | Op::Negative
            | Op::Abs
            | Op::Clip
            | Op::Astype { .. }
            | Op::Relu
            | Op::Gelu
            | Op::GeluTanh
            | Op::Silu => FusionKind::ElemWise,
            Op::Matmul { .. }
            | Op::Conv2d(_)
            | Op::MaxPool2d(_)
            | Op::AvgPool2d(_)
            | Op::AdaptiveAvgPool2d(_) => FusionKind::OutEWiseFusable,
            Op::LayerNorm(_)
            | Op::RmsNorm(_)
            | Op::Softmax { .. }
            | Op::LogSoftmax { .. }
            | Op::Sum(_)
            | Op::Mean(_)
            | Op::Max(_) => FusionKind::CommReduce,
            Op::Reshape
            | Op::PermuteDims { .. }
            | Op::Concat { .. }
            | Op::Split(_)
            | Op::Flatten
            | Op::Squeeze { .. }
            | Op::ExpandDims { .. }
            | Op::StridedSlice(_)
            | Op::Take { .. } => FusionKind::Injective,
            Op::BatchNorm(_) | Op::Dropout { .. } | Op::Lrn(_) | Op::ShapeToTensor => {
                FusionKind::Opaque
            }
            Op::Elem(e) => e.fusion_kind(),
            Op::Tril { .. } | Op::Triu { .. } => FusionKind::ElemWise,
            Op::GatherElements { .. }
            | Op::GatherNd { .. }
            | Op::OneHot { .. }
            | Op::Arange(_)
            | Op::Tile { .. }
            | Op::Pad(_) => FusionKind::Injective,
            Op::ScatterElements { .. } | Op::ScatterNd { .. } | Op::Cumsum(_) | Op::Cumprod(_) => {
                FusionKind::Opaque
            }
            Op::Min(_) | Op::Prod(_) | Op::Argmax { .. } | Op::Argmin { .. } => {
                FusionKind::CommReduce
            }
            Op::Einsum { .. } => FusionKind::OutEWiseFusable,
            Op::Topk(_) => FusionKind::Opaque,
            Op::Conv2dTranspose(_) => FusionKind::OutEWiseFusable,
            Op::Resize2d(_) => FusionKind::Injective,
            Op::GroupNorm(_) | Op::InstanceNorm(_) => FusionKind::CommReduce,
            Op::Stack { .. } => FusionKind::Injective,
            Op::MaxPool1d(_)
            | Op::AvgPool1d(_)
            | Op::MaxPool3d(_)
            | Op::AvgPool3d(_)
            | Op::AdaptiveAvgPool1d(_)
            | Op::AdaptiveAvgPool3d(_) => FusionKind::OutEWiseFusable,
            Op::Attention(_) | Op::AttentionBias(_) => FusionKind::Opaque,
            Op::Opaque(_) => FusionKind::Opaque,
        }
    }

    /// Infers the result type from the argument types (see the module docs). Every static
    /// extent of the result is in `0..=MAX_DIM` and every dim prints as text the parser reads
    /// back; shape arithmetic that overflows is an error naming the op, never a wrapped dim.
    pub fn infer(&self, args: &[&Type]) -> Result<Type, String> {
        if let Op::Opaque(o) = self {
            return Ok(o.ty.clone());
        }
        let t = infer::infer(self, args)?;
        if let Some(d) = first_negative_dim(&t) {
            return Err(format!(
                "{}: the result would have a negative extent ({d}); check the shapes and attributes",
                self.name()
            ));
        }
        if let Some((d, why)) = first_out_of_range_dim(&t) {
            return Err(format!(
                "{}: the result dim `{d}` is out of range: {why}; check the shapes and attributes",
                self.name()
            ));
        }
        Ok(t)
    }
}

/// The first static dim below zero in a (possibly tuple) type.
fn first_negative_dim(t: &Type) -> Option<i64> {
    match t {
        Type::Tensor(tt) => tt
            .dims
            .iter()
            .flat_map(|d| d.iter())
            .find_map(|d| d.as_static().filter(|v| *v < 0)),
        Type::Shape { dims, .. } => dims
            .iter()
            .flatten()
            .find_map(|d| d.as_static().filter(|v| *v < 0)),
        Type::Tuple(ts) => ts.iter().find_map(first_negative_dim),
        _ => None,
    }
}

/// The first dim of a (possibly tuple) type without a text form, with why.
fn first_out_of_range_dim(t: &Type) -> Option<(&Dim, String)> {
    let check = |d: &'_ Dim| d.out_of_range();
    match t {
        Type::Tensor(tt) => tt
            .dims
            .iter()
            .flat_map(|d| d.iter())
            .find_map(|d| check(d).map(|w| (d, w))),
        Type::Shape { dims, .. } => dims.iter().flatten().find_map(|d| check(d).map(|w| (d, w))),
        Type::Tuple(ts) => ts.iter().find_map(first_out_of_range_dim),
        _ => None,
    }
}
