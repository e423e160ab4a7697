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
//! Where this op set departs from TVM 0.27: `relax.bitcast` (ONNX's `BitCast`) and
//! `relax.det` (ONNX's `Det`) are fusebox's own, and `relax.vision.roi_align` has one more mode (`onnx_max`, ONNX's `max`);
//! `relax.strided_slice` takes `axes`, `begin`, `end` and `strides` as attributes (TVM passes them as expression arguments), and with symbolic
//! dims it does not clamp (as with `assume_inbound=True`). `relax.arange` takes `start`, `end`
//! and `step`, and `relax.tril` / `relax.triu` take `k`, as attributes (TVM passes prim values),
//! so their types follow from the attributes.

mod attention;
mod attrs;
pub mod einsum;
mod elem;
mod image;
mod index;
mod infer;
pub mod layout;
mod nn;
mod pool;
mod set;
#[cfg(test)]
mod tests;
mod text;
mod vision;

use crate::ir::{DType, Dim, Type};
pub use attention::{AttentionAttrs, CausalMask};
use attrs::{
    Kwargs, at_least, check_split_layout, dtype_lit, ints_lit, opt_int_lit, opt_ints_lit, pair,
    quad, str_lit,
};
pub use elem::{ElemClass, ElemOp};
pub use image::{GridSampleAttrs, affine_grid_base};
pub use index::{ArangeAttrs, PadAttrs, PadMode, ScanAttrs, ScatterReduction};
pub use layout::{IndexMap, Layout, LayoutAxis, MapExpr, Permute};
pub use nn::{Conv2dTransposeAttrs, GroupNormAttrs, Resize2dAttrs, Taps};
pub use pool::{AdaptivePoolAttrs, PoolAttrs};
pub use set::UniqueAttrs;
pub use vision::RoiAlignAttrs;

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
    /// `T.index_map(lambda ...: (...))` (the index map of `relax.layout_transform`).
    IndexMap(IndexMap),
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
        AttrLit::IndexMap(m) => m.hash(state),
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
    /// `relax.bitcast(x, dtype)` (a fusebox extension: TVM 0.27 reinterprets only through
    /// `R.memory.view`): each element's bits, little-endian, read as `dtype` of the same
    /// width (ONNX's `BitCast`); the shape is unchanged.
    Bitcast {
        /// The target dtype, as wide as the input's.
        dtype: DType,
    },
    /// `relax.det(x)` (a fusebox extension, ONNX's `Det`): the determinant of each square
    /// matrix of the last two axes, `(*, M, M)` → `(*)`, of a float dtype.
    Det,
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
    /// `relax.layout_transform(x, index_map=T.index_map(...), pad_value=None)`: the elements
    /// moved by an index map between layouts ([`layout`]).
    LayoutTransform(Box<IndexMap>),
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
    /// `relax.reverse_sequence(data, seq_lengths)`: for each batch index `b`, the first
    /// `seq_lengths[b]` elements along `seq_axis` reversed, the rest kept.
    ReverseSequence {
        /// The axis whose leading elements are reversed.
        seq_axis: i64,
        /// The axis `seq_lengths` indexes.
        batch_axis: i64,
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
    /// `relax.nonzero(x)`: the indices of the non-zero elements, one row per axis (`int64`;
    /// the extent of axis 1 depends on the values).
    Nonzero,
    /// `relax.unique(x)`: the distinct values or slices (extents depend on the values).
    Unique(Box<UniqueAttrs>),
    /// `relax.vision.all_class_non_max_suppression(boxes, scores, max_output_boxes_per_class,
    /// iou_threshold, score_threshold)` in ONNX's output format: the `(B·C·N, 3)` selected
    /// `[batch, class, box]` rows (zeros after the first `count`) and `count` as `(1,)`.
    AllClassNms,
    /// `relax.vision.roi_align(data, rois)`: bilinear samples of each box, pooled to a fixed
    /// grid of bins.
    RoiAlign(Box<RoiAlignAttrs>),
    /// `relax.einsum` of a tuple of tensors.
    Einsum {
        /// The equation (`"bij,bjk->bik"`).
        subscripts: Box<str>,
    },
    /// `relax.nn.conv2d_transpose(x, w)`
    Conv2dTranspose(Box<Conv2dTransposeAttrs>),
    /// `relax.image.resize2d(x, size)`
    Resize2d(Box<Resize2dAttrs>),
    /// `relax.image.grid_sample(data, grid)`: `data` sampled at the normalised positions of a
    /// channel-first grid.
    GridSample(Box<GridSampleAttrs>),
    /// `relax.image.affine_grid(theta, size)`: the normalised sampling grid of an affine
    /// transform, channel-first.
    AffineGrid {
        /// Whether -1 and 1 are the centres of the corner pixels (else their outer edges).
        align_corners: bool,
    },
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
    "relax.layout_transform",
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
    "relax.reverse_sequence",
    "relax.cumsum",
    "relax.cumprod",
    "relax.nn.pad",
    "relax.min",
    "relax.prod",
    "relax.argmax",
    "relax.argmin",
    "relax.topk",
    "relax.nonzero",
    "relax.unique",
    "relax.vision.all_class_non_max_suppression",
    "relax.vision.roi_align",
    "relax.bitcast",
    "relax.det",
    "relax.einsum",
    "relax.nn.conv2d_transpose",
    "relax.image.resize2d",
    "relax.image.grid_sample",
    "relax.image.affine_grid",
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
            Op::Bitcast { .. } => "relax.bitcast",
            Op::Det => "relax.det",
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
            Op::LayoutTransform(_) => "relax.layout_transform",
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
            Op::ReverseSequence { .. } => "relax.reverse_sequence",
            Op::Triu { .. } => "relax.triu",
            Op::Cumsum(_) => "relax.cumsum",
            Op::Cumprod(_) => "relax.cumprod",
            Op::Pad(_) => "relax.nn.pad",
            Op::Min(_) => "relax.min",
            Op::Prod(_) => "relax.prod",
            Op::Argmax { .. } => "relax.argmax",
            Op::Argmin { .. } => "relax.argmin",
            Op::Topk(_) => "relax.topk",
            Op::Nonzero => "relax.nonzero",
            Op::Unique(_) => "relax.unique",
            Op::AllClassNms => "relax.vision.all_class_non_max_suppression",
            Op::RoiAlign(_) => "relax.vision.roi_align",
            Op::Einsum { .. } => "relax.einsum",
            Op::Conv2dTranspose(_) => "relax.nn.conv2d_transpose",
            Op::Resize2d(_) => "relax.image.resize2d",
            Op::GridSample(_) => "relax.image.grid_sample",
            Op::AffineGrid { .. } => "relax.image.affine_grid",
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
            | Op::Bitcast { .. }
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
            | Op::LayoutTransform(_)
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
            Op::ReverseSequence { .. } => FusionKind::Injective,
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
            Op::Topk(_) | Op::Nonzero | Op::Unique(_) | Op::AllClassNms => FusionKind::Opaque,
            Op::Conv2dTranspose(_) => FusionKind::OutEWiseFusable,
            Op::Resize2d(_) | Op::GridSample(_) | Op::AffineGrid { .. } => FusionKind::Injective,
            Op::RoiAlign(_) => FusionKind::OutEWiseFusable,
            Op::GroupNorm(_) | Op::InstanceNorm(_) => FusionKind::CommReduce,
            Op::Stack { .. } => FusionKind::Injective,
            Op::MaxPool1d(_)
            | Op::AvgPool1d(_)
            | Op::MaxPool3d(_)
            | Op::AvgPool3d(_)
            | Op::AdaptiveAvgPool1d(_)
            | Op::AdaptiveAvgPool3d(_) => FusionKind::OutEWiseFusable,
            Op::Attention(_) | Op::AttentionBias(_) => FusionKind::Opaque,
            Op::Det => FusionKind::Opaque,
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
