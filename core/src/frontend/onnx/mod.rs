//! ONNX import: an ONNX model (protobuf bytes) becomes a module with one function, `main`.
//!
//! Contract:
//!
//! - [`import_onnx`] decodes the model with hand-written `prost` messages ([`proto`]) and builds
//!   `main` with the [`FunctionBuilder`] in one dataflow block, so every value is typed as it is
//!   emitted (a shape error is reported at the node that caused it).
//! - Graph inputs that are not initializers become parameters, in graph order; `dim_param`
//!   dims become symbolic dims (names sanitized to identifiers), unnamed dynamic dims get a
//!   fresh name. Initializers become constants.
//! - `Constant`, `ConstantOfShape`, `Identity`, and integer `Shape → Gather/Slice/Split →
//!   Unsqueeze → Concat → Cast → Add/Sub/Mul/Div/Max/Min` chains are folded in the importer (a
//!   small evaluator on `int64` values that may be symbolic dims), so `Reshape`/`Expand`/`Pad`
//!   targets computed from shapes become shape literals; so are float casts of small
//!   constants. Anything else runs in the IR.
//! - An `If` whose condition is known at import time (folded as above) is replaced by its
//!   taken branch (the sub-graph's initializers and nodes imported in place, nesting bounded);
//!   a condition computed at run time is an error naming the node.
//! - A `Scan` over a static sequence is unrolled: its body imported once per step (`scan.rs`).
//! - The default-domain opset must be in [`MIN_OPSET`]`..=`[`MAX_OPSET`] (1 to 28); ops map
//!   to the op set with ONNX semantics per opset (attributes vs inputs); see [`SUPPORTED_OPS`]. A model using ops outside that list fails with ONE error
//!   that names every unsupported node and its op type.
//! - Initializers may keep their bytes in side files (ONNX external data, as the dynamo
//!   exporter writes and every model over 2 GB needs): [`import_onnx_file`] reads them from the
//!   model's folder, never outside it ([`external`]).
//! - Graph outputs are bound to output vars named after the (sanitized) ONNX output names; `main`
//!   returns the single output, or a tuple of them in graph order ([`output_names`] reads the
//!   names back).
//! - Before any node is converted the graph is checked as onnxruntime checks it (`validate.rs`):
//!   undefined node inputs, values written twice (or shadowing an input or initializer),
//!   duplicate initializers and attributes whose value disagrees with their declared type are
//!   errors naming the file and the node.
//! - Malformed protobuf, undefined inputs, unsupported dtypes and shape errors are errors
//!   ([`Error::Invalid`] prefixed with the file name and the node); nothing panics on input.
//!
//! ```text
//! graph(x: float32[n, 4], w = initializer float32[4, 8]):  y = Relu(MatMul(x, w))
//!
//! @R.function
//! def main(x: R.Tensor(("n", 4), dtype="float32")) -> R.Tensor(("n", 8), dtype="float32"):
//!     n = T.int64()
//!     with R.dataflow():
//!         h: R.Tensor((n, 8), dtype="float32") = R.matmul(x, metadata["relax.expr.Constant"][0], out_dtype=None)
//!         y: R.Tensor((n, 8), dtype="float32") = R.nn.relu(h)
//!         R.output(y)
//!     return y
//! ```

mod dim_bounds;
pub mod external;
mod fold;
mod loop_unroll;
mod ops;
pub mod proto;
mod scan;
mod schema_attrs;
#[cfg(test)]
mod tests;
mod validate;

pub use validate::{MAX_OPSET, MIN_OPSET};

use crate::error::{Error, Result};
use crate::ir::builder::FunctionBuilder;
use crate::ir::{Callee, Constant, DType, Dim, ExprId, ExprKind, Function, Module, Type};
use crate::op::Op;
use fold::Ints;
use prost::Message;
use proto::{AttributeProto, ModelProto, NodeProto, TensorProto};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// The ONNX op types the importer converts (domain `""` / `ai.onnx`).
pub const SUPPORTED_OPS: &[&str] = &[
    "Abs",
    "Add",
    "BlackmanWindow",
    "EyeLike",
    "HammingWindow",
    "HannWindow",
    "GRU",
    "LSTM",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "MatMulInteger",
    "NegativeLogLikelihoodLoss",
    "QLinearMatMul",
    "QuantizeLinear",
    "RNN",
    "SoftmaxCrossEntropyLoss",
    "Swish",
    "SwiGLU",
    "AveragePool",
    "BatchNormalization",
    "Cast",
    "Clip",
    "Concat",
    "Constant",
    "ConstantOfShape",
    "Conv",
    "Div",
    "Dropout",
    "Elu",
    "Erf",
    "Exp",
    "Expand",
    "Flatten",
    "Gather",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "Identity",
    "Optional",
    "OptionalGetElement",
    "OptionalHasElement",
    "LRN",
    "LayerNormalization",
    "LeakyRelu",
    "Log",
    "LogSoftmax",
    "MatMul",
    "Max",
    "MaxPool",
    "Min",
    "Mul",
    "Neg",
    "PRelu",
    "Pow",
    "Reciprocal",
    "ReduceMax",
    "ReduceMean",
    "ReduceSum",
    "Relu",
    "Reshape",
    "Selu",
    "Shape",
    "Sigmoid",
    "Slice",
    "Softmax",
    "Softplus",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Sum",
    "Tanh",
    "Transpose",
    "Unsqueeze",
    "Acos",
    "Acosh",
    "And",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "BitShift",
    "BitwiseAnd",
    "BitwiseNot",
    "BitwiseOr",
    "BitwiseXor",
    "CastLike",
    "Ceil",
    "Celu",
    "Cos",
    "Cosh",
    "Equal",
    "Floor",
    "Greater",
    "GreaterOrEqual",
    "HardSigmoid",
    "HardSwish",
    "IsInf",
    "IsNaN",
    "Less",
    "LessOrEqual",
    "Mean",
    "Mish",
    "Mod",
    "Not",
    "Or",
    "Round",
    "Shrink",
    "Sign",
    "Sin",
    "Sinh",
    "Softsign",
    "Tan",
    "ThresholdedRelu",
    "Where",
    "Xor",
    "CenterCropPad",
    "CumProd",
    "CumSum",
    "DepthToSpace",
    "GatherElements",
    "GatherND",
    "OneHot",
    "Pad",
    "Range",
    "Scatter",
    "ScatterElements",
    "ScatterND",
    "Size",
    "SpaceToDepth",
    "TensorScatter",
    "Tile",
    "Trilu",
    "ArgMax",
    "ArgMin",
    "Attention",
    "Einsum",
    "Hardmax",
    "LinearAttention",
    "LpNormalization",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
    "RotaryEmbedding",
    "TopK",
    "CausalConvWithState",
    "ConvTranspose",
    "GlobalLpPool",
    "GlobalMaxPool",
    "GroupNormalization",
    "InstanceNormalization",
    "LpPool",
    "MeanVarianceNormalization",
    "RMSNormalization",
    "Resize",
    "Upsample",
    "GridSample",
    "AffineGrid",
    "RoiAlign",
    "BitCast",
    "Det",
    "TfIdfVectorizer",
    "Col2Im",
    "ConvInteger",
    "QLinearConv",
    "MaxUnpool",
    "ReverseSequence",
    "DeformConv",
    "DFT",
    "STFT",
    "MelWeightMatrix",
    "NonZero",
    "Compress",
    "Unique",
    "NonMaxSuppression",
    "If",
    "Scan",
    "Loop",
];

/// `[1, 8, n, 3]`: a shape as the importer's errors write it.
pub(crate) fn dims_str(d: &[Dim]) -> String {
    let parts: Vec<String> = d.iter().map(ToString::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// Imports an ONNX model held in memory. `file` names the model in error messages. A model
/// with external data needs its folder: use [`import_onnx_file`].
pub fn import_onnx(bytes: &[u8], file: &str) -> Result<Module> {
    let model = ModelProto::decode(bytes)
        .map_err(|e| Error::Invalid(format!("{file}: not a valid ONNX model: {e}")))?;
    import_model(&model, file)
}

/// Imports the ONNX model at `path` (a `.onnx` file, or a folder: see [`find_model`]); tensors with external data are read from side files in
/// the model's folder (see [`external`]).
pub fn import_onnx_file(path: &Path) -> Result<Module> {
    let found = find_model(path)?;
    let path = found.as_path();
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(Error::Invalid(format!(
            "{}: not a regular file",
            path.display()
        )));
    }
    let bytes = std::fs::read(path).map_err(io)?;
    let file = path.display().to_string();
    let model = ModelProto::decode(bytes.as_slice())
        .map_err(|e| Error::Invalid(format!("{file}: not a valid ONNX model: {e}")))?;
    drop(bytes);
    let base = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    import_model_in(&model, &file, Some(base))
}

/// The ONNX model a path names: the path itself, or for a folder (an exported model with its
/// external data side files) its `model.onnx`, else its only `*.onnx` file.
pub fn find_model(path: &Path) -> Result<std::path::PathBuf> {
    if !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let default = path.join("model.onnx");
    if default.is_file() {
        return Ok(default);
    }
    let rd = std::fs::read_dir(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut found: Vec<std::path::PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    found.sort();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(Error::Invalid(format!(
            "{}: a folder without model.onnx or any other .onnx file",
            path.display()
        ))),
        many => Err(Error::Invalid(format!(
            "{}: several .onnx files and no model.onnx; name one: {}",
            path.display(),
            many.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Whether `path` names an ONNX model: a `.onnx` file, or a folder holding one.
pub fn is_onnx_path(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "onnx") || path.is_dir()
}

/// Imports an already decoded model (see [`import_onnx`]).
pub fn import_model(model: &ModelProto, file: &str) -> Result<Module> {
    import_model_in(model, file, None)
}

/// Imports an already decoded model whose external data (if any) is in the folder `base`.
pub fn import_model_in(model: &ModelProto, file: &str, base: Option<&Path>) -> Result<Module> {
    let mut ext = external::ExternalData::new(base);
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| Error::Invalid(format!("{file}: the model has no graph")))?;
    let opset = validate::opset(model, file)?;
    validate::graph(graph, file)?;
    // One error listing every unsupported node.
    let unsupported: Vec<String> = graph
        .node
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            !(n.domain.is_empty() || n.domain == "ai.onnx")
                || !SUPPORTED_OPS.contains(&n.op_type.as_str())
        })
        .map(|(i, n)| {
            let op = if n.domain.is_empty() {
                n.op_type.clone()
            } else {
                format!("{}:{}", n.domain, n.op_type)
            };
            format!("`{}` ({op})", node_name(n, i))
        })
        .collect();
    if !unsupported.is_empty() {
        return Err(Error::Invalid(format!(
            "{file}: {} unsupported ONNX node(s): {}",
            unsupported.len(),
            unsupported.join(", ")
        )));
    }
    let module = Module::new();
    let mut im = Importer {
        b: FunctionBuilder::new(&module),
        vals: HashMap::new(),
        cache: HashMap::new(),
        missing: HashMap::new(),
        unrolled: 0,
        opset,
        file: file.to_string(),
    };
    let inits: HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    for vi in &graph.input {
        if inits.contains(vi.name.as_str()) {
            continue;
        }
        let ty = im.input_type(vi)?;
        let p = im.b.param(&sanitize(&vi.name), ty);
        let e = im.b.var(p);
        im.vals.insert(vi.name.clone(), Val::Expr(e));
    }
    for t in &graph.initializer {
        let c = ext
            .constant(t)
            .map_err(|m| Error::Invalid(format!("{file}: initializer `{}`: {m}", t.name)))?;
        im.vals.insert(t.name.clone(), Val::Const(c));
    }
    let outputs: HashSet<&str> = graph.output.iter().map(|o| o.name.as_str()).collect();
    im.b.begin_dataflow();
    import_nodes(&mut im, &graph.node, &outputs, &mut ext, 0)?;
    im.b.set_origin(None);
    let mut rets = Vec::new();
    // The output vars already returned (a set: a graph may list any number of outputs).
    let mut returned = HashSet::new();
    for o in &graph.output {
        let e = im
            .expr(&o.name)
            .map_err(|e| Error::Invalid(format!("{file}: graph output `{}`: {e}", o.name)))?;
        let is_output_var = matches!(
            &im.b.func().exprs.get(e).map(|d| &d.kind),
            Some(ExprKind::Var(v)) if !im.b.func().var(*v).dataflow
        );
        if is_output_var && returned.insert(e) {
            rets.push(e);
        } else {
            let v = im.b.bind(&sanitize(&o.name), e, true)?;
            rets.push(im.b.var(v));
        }
    }
    im.b.end_dataflow()?;
    let ret = match rets.as_slice() {
        [] => return Err(Error::Invalid(format!("{file}: the graph has no outputs"))),
        [one] => *one,
        _ => im.b.tuple(rets)?,
    };
    let mut f = im.b.finish(ret)?;
    f.attrs.global_symbol = Some("main".to_string());
    let mut m = Module::new();
    m.insert("main", f);
    Ok(m)
}

/// The most nested `If` branches [`import_nodes`] inlines.
const MAX_IF_DEPTH: usize = 32;

/// Converts `nodes` in order into bindings of `im`'s function (`outputs`: the graph outputs,
/// bound as output vars). An `If` whose condition is known at import time is replaced by its
/// taken branch, inlined here (its initializers become constants, its nodes bindings, its
/// outputs the `If`'s); a condition computed at run time is an error naming the node.
fn import_nodes(
    im: &mut Importer<'_>,
    nodes: &[NodeProto],
    outputs: &HashSet<&str>,
    ext: &mut external::ExternalData,
    depth: usize,
) -> Result<()> {
    let file = im.file.clone();
    for (i, node) in nodes.iter().enumerate() {
        let at = || format!("{file}: node `{}` ({})", node_name(node, i), node.op_type);
        if node.op_type == "If" && (node.domain.is_empty() || node.domain == "ai.onnx") {
            inline_if(im, node, outputs, ext, depth).map_err(|e| match e {
                Error::Invalid(m) if m.starts_with(&file) => Error::Invalid(m),
                Error::Invalid(m) => Error::Invalid(format!("{}: {m}", at())),
                e => Error::Invalid(format!("{}: {e}", at())),
            })?;
            continue;
        }
        let unrolled = matches!(node.op_type.as_str(), "Scan" | "Loop");
        if unrolled && (node.domain.is_empty() || node.domain == "ai.onnx") {
            im.b.set_origin(Some(&format!(
                "onnx node `{}` ({})",
                node_name(node, i),
                node.op_type
            )));
            let r = if depth >= MAX_IF_DEPTH {
                Err(invalid(format!(
                    "sub-graphs nest deeper than {MAX_IF_DEPTH} levels"
                )))
            } else if node.op_type == "Scan" {
                scan::inline_scan(im, node, ext, depth)
            } else {
                loop_unroll::inline_loop(im, node, ext, depth)
            };
            r.map_err(|e| match e {
                Error::Invalid(m) if m.starts_with(&file) => Error::Invalid(m),
                Error::Invalid(m) => Error::Invalid(format!("{}: {m}", at())),
                e => Error::Invalid(format!("{}: {e}", at())),
            })?;
            continue;
        }
        // Provenance: every binding this node lowers to names the node.
        im.b.set_origin(Some(&format!(
            "onnx node `{}` ({})",
            node_name(node, i),
            node.op_type
        )));
        let outs = im.convert(node).map_err(|e| match e {
            Error::Invalid(m) => Error::Invalid(format!("{}: {m}", at())),
            e => Error::Invalid(format!("{}: {e}", at())),
        })?;
        for (k, name) in node.output.iter().enumerate() {
            if name.is_empty() {
                continue;
            }
            let Some(out) = outs.get(k) else {
                im.missing.insert(
                    name.clone(),
                    format!(
                        "output {k} of node `{}` ({}) is not supported",
                        node_name(node, i),
                        node.op_type
                    ),
                );
                continue;
            };
            let val = match out.clone() {
                Out::Val(v) => v,
                Out::Kind(kind) => {
                    let is_out = outputs.contains(name.as_str());
                    let v = im
                        .bind_value(&sanitize(name), kind, is_out)
                        .map_err(|e| Error::Invalid(format!("{}: {e}", at())))?;
                    Val::Expr(im.b.var(v))
                }
                Out::Refined(kind, ty) => {
                    let is_out = outputs.contains(name.as_str());
                    let v =
                        im.b.emit_value(&sanitize(name), kind, is_out)
                            .and_then(|v| im.b.refine(v, ty).map(|()| v))
                            .map_err(|e| Error::Invalid(format!("{}: {e}", at())))?;
                    Val::Expr(im.b.var(v))
                }
            };
            im.vals.insert(name.clone(), val);
        }
    }
    Ok(())
}

/// An `If` node replaced by the branch its import-time condition selects (see
/// [`import_nodes`]).
fn inline_if(
    im: &mut Importer<'_>,
    node: &NodeProto,
    outputs: &HashSet<&str>,
    ext: &mut external::ExternalData,
    depth: usize,
) -> Result<()> {
    if depth >= MAX_IF_DEPTH {
        return Err(invalid(format!(
            "`If` branches nest deeper than {MAX_IF_DEPTH} levels"
        )));
    }
    let cond_name = req(node, 0)?;
    let cond = match im.val(cond_name)? {
        Val::Const(c) if c.numel() == 1 => c.get_f64(0).map(|v| v != 0.0),
        Val::Ints(i) if i.vals.len() == 1 => i.vals[0].as_static().map(|v| v != 0),
        _ => None,
    };
    let Some(cond) = cond else {
        return Err(invalid(format!(
            "the condition `{cond_name}` is computed at run time; fusebox imports an `If` only \
             when its condition is known at import time (it inlines the taken branch)"
        )));
    };
    let which = if cond { "then_branch" } else { "else_branch" };
    let branch = Attrs(node)
        .get(which)
        .and_then(|a| a.g.as_deref())
        .ok_or_else(|| invalid(format!("`If` has no `{which}` graph")))?;
    if branch.output.len() != node.output.len() {
        return Err(invalid(format!(
            "`{which}` has {} outputs, the `If` node {}",
            branch.output.len(),
            node.output.len()
        )));
    }
    for t in &branch.initializer {
        let c = ext
            .constant(t)
            .map_err(|m| invalid(format!("`{which}` initializer `{}`: {m}", t.name)))?;
        im.vals.insert(t.name.clone(), Val::Const(c));
    }
    import_nodes(im, &branch.node, outputs, ext, depth + 1)?;
    for (name, out) in node.output.iter().zip(&branch.output) {
        if name.is_empty() {
            continue;
        }
        let v = im
            .val(&out.name)
            .map_err(|e| invalid(format!("`{which}` output `{}`: {e}", out.name)))?;
        im.vals.insert(name.clone(), v);
    }
    Ok(())
}

/// The names of what `f` returns: the var name of the returned value, or of each field of a
/// returned tuple (`output` for anything else). For an imported model these are the sanitized
/// ONNX output names.
pub fn output_names(f: &Function) -> Vec<String> {
    let name_of = |e: ExprId| match f.exprs.get(e).map(|d| &d.kind) {
        Some(ExprKind::Var(v)) => f.var(*v).name.clone(),
        _ => "output".to_string(),
    };
    match f.ret.and_then(|r| f.exprs.get(r).map(|d| (r, &d.kind))) {
        Some((_, ExprKind::Tuple(fields))) => fields.iter().map(|&e| name_of(e)).collect(),
        Some((r, _)) => vec![name_of(r)],
        None => Vec::new(),
    }
}

/// `name` as an identifier: characters other than ASCII letters, digits and `_` become `_`, and
/// a leading digit (or an empty name) gets a `v` in front.
pub fn sanitize(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, 'v');
    }
    s
}

fn node_name(n: &NodeProto, i: usize) -> String {
    if n.name.is_empty() {
        format!("#{i}")
    } else {
        n.name.clone()
    }
}

/// The dtype of an ONNX `TensorProto.DataType` code.
pub fn dtype_of(code: i32) -> Option<DType> {
    Some(match code {
        1 => DType::F32,
        2 => DType::U8,
        3 => DType::I8,
        6 => DType::I32,
        7 => DType::I64,
        9 => DType::Bool,
        10 => DType::F16,
        11 => DType::F64,
        16 => DType::BF16,
        _ => return None,
    })
}

/// The ONNX `TensorProto.DataType` code of a dtype.
pub fn onnx_code(d: DType) -> i32 {
    match d {
        DType::F32 => 1,
        DType::U8 => 2,
        DType::I8 => 3,
        DType::I32 => 6,
        DType::I64 => 7,
        DType::Bool => 9,
        DType::F16 => 10,
        DType::F64 => 11,
        DType::BF16 => 16,
    }
}

/// The most elements a constant made at import time (`ConstantOfShape`) may have: a guard
/// against absurd shapes in a small file (2^28 elements: room for VGG-19's 4096×25088 layer).
const MAX_CONST_ELEMS: usize = 1 << 28;

/// A `TensorProto` as a constant (raw data or the typed data fields).
pub fn tensor_to_constant(t: &TensorProto) -> Result<Constant, String> {
    let dtype = dtype_of(t.data_type)
        .ok_or_else(|| format!("unsupported tensor data type {}", t.data_type))?;
    if t.data_location == external::EXTERNAL {
        return Err(
            "the tensor's data is in a side file; only initializers of a model imported by \
             path may have external data"
                .into(),
        );
    }
    if let Some(d) = t.dims.iter().find(|d| **d < 0) {
        return Err(format!("negative dim {d} in {:?}", t.dims));
    }
    // No size cap here: the data is already in memory, and `from_bytes` checks its length.
    let n = crate::ir::numel(&t.dims)
        .ok_or_else(|| format!("tensor shape {:?} is too large", t.dims))?;
    let bytes: Vec<u8> = if !t.raw_data.is_empty() || n == 0 {
        t.raw_data.clone()
    } else {
        match dtype {
            DType::F32 => t.float_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F64 => t.double_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::I64 => t.int64_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::I32 => t.int32_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::I8 | DType::U8 => t.int32_data.iter().map(|&v| v as u8).collect(),
            DType::Bool => t.int32_data.iter().map(|&v| u8::from(v != 0)).collect(),
            DType::F16 | DType::BF16 => t
                .int32_data
                .iter()
                .flat_map(|&v| (v as u16).to_le_bytes())
                .collect(),
        }
    };
    Constant::from_bytes(dtype, t.dims.clone(), bytes)
}

/// A value of the graph while importing.
#[derive(Clone, Debug)]
pub(crate) enum Val {
    /// A value of the function (a param, a bound var, or a leaf).
    Expr(ExprId),
    /// A folded constant, materialized on first use as a tensor.
    Const(Constant),
    /// A folded integer tensor with symbolic values (a shape of a dynamic tensor).
    Ints(Ints),
}

/// What a converter produces for one output.
#[derive(Clone, Debug)]
pub(crate) enum Out {
    /// An existing value (identity, folded constant).
    Val(Val),
    /// A value to bind to a var named after the output.
    Kind(ExprKind),
    /// A value to bind to a var named after the output, whose type refines the value's
    /// inferred one (an extent only known at run time, named by a fresh symbolic dim).
    Refined(ExprKind, Type),
}

pub(crate) struct Importer<'m> {
    pub(crate) b: FunctionBuilder<'m>,
    vals: HashMap<String, Val>,
    cache: HashMap<String, ExprId>,
    missing: HashMap<String, String>,
    /// Body nodes imported by unrolling `Scan`s so far (bounded: see [`scan`]).
    unrolled: usize,
    pub(crate) opset: i64,
    file: String,
}

fn invalid(m: impl Into<String>) -> Error {
    Error::Invalid(m.into())
}

impl Importer<'_> {
    fn input_type(&mut self, vi: &proto::ValueInfoProto) -> Result<Type> {
        let tt = vi
            .r#type
            .as_ref()
            .and_then(|t| t.tensor_type.as_ref())
            .ok_or_else(|| {
                invalid(format!(
                    "{}: input `{}` is not a tensor (or has no type)",
                    self.file, vi.name
                ))
            })?;
        let dtype = dtype_of(tt.elem_type).ok_or_else(|| {
            invalid(format!(
                "{}: input `{}` has an unsupported element type {}",
                self.file, vi.name, tt.elem_type
            ))
        })?;
        let Some(shape) = &tt.shape else {
            return Ok(Type::Tensor(crate::ir::TensorType {
                dims: None,
                ndim: None,
                dtype: Some(dtype),
            }));
        };
        let mut dims = Vec::new();
        for (i, d) in shape.dim.iter().enumerate() {
            dims.push(match (&d.dim_param, d.dim_value) {
                (Some(p), _) if !p.is_empty() => self.b.sym(&sanitize(p)),
                (_, Some(v)) if v >= 0 => Dim::Static(v),
                (_, Some(v)) => {
                    return Err(invalid(format!(
                        "{}: input `{}` has a negative dim {v}",
                        self.file, vi.name
                    )));
                }
                _ => self.b.sym(&format!("{}_d{i}", sanitize(&vi.name))),
            });
        }
        Ok(Type::tensor_dims(dims, dtype))
    }

    /// The value named `name`.
    pub(crate) fn val(&self, name: &str) -> Result<Val> {
        if let Some(v) = self.vals.get(name) {
            return Ok(v.clone());
        }
        Err(invalid(match self.missing.get(name) {
            Some(why) => format!("input `{name}`: {why}"),
            None => format!("input `{name}` is not defined"),
        }))
    }

    /// The value named `name` as an expression (constants are materialized once).
    pub(crate) fn expr(&mut self, name: &str) -> Result<ExprId> {
        if let Some(e) = self.cache.get(name) {
            return Ok(*e);
        }
        let e = match self.val(name)? {
            Val::Expr(e) => return Ok(e),
            Val::Const(c) => self.b.constant(c),
            Val::Ints(i) => match i.to_constant() {
                Some(c) => self.b.constant(c),
                // Symbolic values used as data (`seq * arange(seq)`, say): the dims read back
                // at run time, `R.shape_to_tensor(R.shape([...]))`, in the value's shape and type.
                None => self.ints_tensor(&i)?,
            },
        };
        self.cache.insert(name.to_string(), e);
        Ok(e)
    }

    /// A folded integer value with symbolic elements as a tensor computed at run time.
    fn ints_tensor(&mut self, i: &Ints) -> Result<ExprId> {
        let shape = self.b.shape(i.vals.clone());
        let mut t = self.emit(Op::ShapeToTensor, vec![shape])?;
        if i.shape.len() != 1 {
            let to = self
                .b
                .shape(i.shape.iter().map(|&d| Dim::Static(d as i64)).collect());
            t = self.emit(Op::Reshape, vec![t, to])?;
        }
        if i.dtype != DType::I64 {
            t = self.emit(Op::Astype { dtype: i.dtype }, vec![t])?;
        }
        Ok(t)
    }

    /// The type of an expression.
    pub(crate) fn ty(&self, e: ExprId) -> Type {
        self.b
            .func()
            .exprs
            .get(e)
            .map(|d| d.ty.clone())
            .unwrap_or_default()
    }

    /// The dims and dtype of a tensor expression with a known shape.
    pub(crate) fn dims(&self, e: ExprId) -> Result<(Vec<Dim>, DType)> {
        match self.ty(e) {
            Type::Tensor(t) => match (t.dims, t.dtype) {
                (Some(d), Some(dt)) => Ok((d.to_vec(), dt)),
                _ => Err(invalid("expected a tensor of known shape and dtype")),
            },
            t => Err(invalid(format!("expected a tensor, found {t:?}"))),
        }
    }

    /// Emits an op call bound to a fresh dataflow var; returns the var's expression.
    pub(crate) fn emit(&mut self, op: Op, args: Vec<ExprId>) -> Result<ExprId> {
        let kind = ExprKind::Call {
            callee: Callee::Op(op),
            args,
        };
        let v = self.bind_value("", kind, false)?;
        Ok(self.b.var(v))
    }

    /// Binds `kind` to a fresh var named `name` (`output`: visible after the dataflow block),
    /// its broadcast's shape annotated where [`Importer::refine_broadcast`] decides it: every
    /// value the importer binds goes through here.
    fn bind_value(&mut self, name: &str, kind: ExprKind, output: bool) -> Result<crate::ir::VarId> {
        let refine = Self::broadcasts(&kind);
        let v = self.b.emit_value(name, kind, output)?;
        if let Some(args) = refine {
            self.refine_broadcast(v, &args)?;
        }
        Ok(v)
    }

    /// Annotates the var `v`, bound to a broadcasting elementwise op whose inferred type
    /// kept only the rank (a pair of symbolic dims core inference cannot show equal), with
    /// the shape [`dim_bounds::broadcast_dims`] decides under the importer's assumptions
    /// (MPT's ALiBi bias `(16, 1, T.min(n, 2048))` added to scores `(b, 16, n, n)` gives
    /// `(b, 16, n, n)`); the executor checks the annotation when the value arrives. Anything
    /// else is left as it is.
    fn refine_broadcast(&mut self, v: crate::ir::VarId, args: &[ExprId]) -> Result<()> {
        let f = self.b.func();
        let Type::Tensor(t) = &f.var(v).ty else {
            return Ok(());
        };
        if t.dims.is_some() {
            return Ok(());
        }
        let dtype = t.dtype;
        let mut shapes = Vec::with_capacity(args.len());
        for &a in args {
            match f.exprs.get(a).map(|e| &e.ty) {
                Some(Type::Tensor(t)) if t.dims.is_some() => shapes.push(t.dims.clone()),
                _ => return Ok(()),
            }
        }
        let shapes: Vec<&[Dim]> = shapes.iter().flatten().map(|d| &d[..]).collect();
        if let Some(dims) = dim_bounds::broadcast_dims(&shapes) {
            let ndim = Some(dims.len());
            self.b.refine(
                v,
                Type::Tensor(crate::ir::TensorType {
                    dims: Some(dims.into()),
                    ndim,
                    dtype,
                }),
            )?;
        }
        Ok(())
    }

    /// The arguments of `kind` when it is a call of a broadcasting elementwise op (the calls
    /// [`Importer::refine_broadcast`] looks at).
    fn broadcasts(kind: &ExprKind) -> Option<Vec<ExprId>> {
        let ExprKind::Call {
            callee: Callee::Op(op),
            args,
        } = kind
        else {
            return None;
        };
        // TVM's `Broadcast` pattern kind: the binary elementwise ops and `where` (and
        // `broadcast_to`, whose shape argument keeps it out of the refinement).
        let yes = op.fusion_kind() == crate::op::FusionKind::Broadcast;
        yes.then(|| args.clone())
    }

    /// Emits an op call bound to a fresh var typed `ty`, a refinement of the call's inferred
    /// type (see [`FunctionBuilder::refine`]); returns the var's expression.
    pub(crate) fn emit_refined(&mut self, op: Op, args: Vec<ExprId>, ty: Type) -> Result<ExprId> {
        let v = self.b.emit("", Callee::Op(op), args)?;
        self.b.refine(v, ty)?;
        Ok(self.b.var(v))
    }

    /// An `int64` constant of `shape` from row-major values (index tables the importer builds).
    pub(crate) fn i64_const(&mut self, shape: Vec<i64>, v: &[i64]) -> Result<ExprId> {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let c = Constant::from_bytes(DType::I64, shape, bytes).map_err(invalid)?;
        Ok(self.b.constant(c))
    }

    /// A `float64` constant of `shape` from row-major values.
    pub(crate) fn f64_const(&mut self, shape: Vec<i64>, v: &[f64]) -> Result<ExprId> {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let c = Constant::from_bytes(DType::F64, shape, bytes).map_err(invalid)?;
        Ok(self.b.constant(c))
    }

    /// `relax.take(x, idx, axis)` in its fast mode (the indices are the importer's own, in
    /// range by construction).
    pub(crate) fn take(&mut self, x: ExprId, axis: i64, idx: ExprId) -> Result<ExprId> {
        self.emit(
            Op::Take {
                axis: Some(axis),
                mode: crate::op::TakeMode::Fast,
            },
            vec![x, idx],
        )
    }

    /// A scalar constant.
    pub(crate) fn scalar(&mut self, v: f64, dtype: DType) -> ExprId {
        self.b.constant(Constant::scalar(v, dtype))
    }

    /// The integer values of a folded input (a constant or a symbolic shape).
    pub(crate) fn const_dims(&self, name: &str) -> Result<Vec<Dim>> {
        match self.val(name)? {
            Val::Ints(i) => Ok(i.vals),
            Val::Const(c) => Ints::from_constant(&c)
                .map(|i| i.vals)
                .ok_or_else(|| invalid(format!("`{name}` must be an integer tensor"))),
            Val::Expr(_) => Err(invalid(format!(
                "`{name}` must be a constant (computed at import time); it is computed at run time"
            ))),
        }
    }

    /// The static integer values of a constant input.
    pub(crate) fn const_i64s(&self, name: &str) -> Result<Vec<i64>> {
        self.const_dims(name)?
            .iter()
            .map(|d| {
                d.as_static().ok_or_else(|| {
                    invalid(format!("`{name}` must be static, found symbolic dim `{d}`"))
                })
            })
            .collect()
    }

    /// The values of a constant input widened to f64.
    pub(crate) fn const_f64s(&self, name: &str) -> Result<Vec<f64>> {
        match self.val(name)? {
            Val::Const(c) => Ok((0..c.numel()).filter_map(|i| c.get_f64(i)).collect()),
            Val::Ints(_) => Ok(self.const_i64s(name)?.iter().map(|&v| v as f64).collect()),
            Val::Expr(_) => Err(invalid(format!("`{name}` must be a constant"))),
        }
    }

    fn convert(&mut self, node: &NodeProto) -> Result<Vec<Out>> {
        if let Some(outs) = fold::try_fold(self, node)? {
            return Ok(outs);
        }
        ops::convert(self, node)
    }
}

/// Attribute look-ups on a node.
pub(crate) struct Attrs<'n>(pub(crate) &'n NodeProto);

impl<'n> Attrs<'n> {
    fn get(&self, name: &str) -> Option<&'n AttributeProto> {
        self.0.attribute.iter().find(|a| a.name == name)
    }
    pub(crate) fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
    pub(crate) fn int(&self, name: &str, default: i64) -> i64 {
        self.get(name).map_or(default, |a| a.i)
    }
    pub(crate) fn float(&self, name: &str, default: f64) -> f64 {
        self.get(name).map_or(default, |a| f64::from(a.f))
    }
    pub(crate) fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.get(name).map(|a| a.ints.clone())
    }
    pub(crate) fn string(&self, name: &str, default: &str) -> String {
        self.get(name).map_or(default.to_string(), |a| {
            String::from_utf8_lossy(&a.s).into()
        })
    }
    pub(crate) fn tensor(&self, name: &str) -> Option<&'n TensorProto> {
        self.get(name).and_then(|a| a.t.as_ref())
    }
    pub(crate) fn strings(&self, name: &str) -> Option<Vec<String>> {
        self.get(name).map(|a| {
            a.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
    }
    pub(crate) fn floats(&self, name: &str) -> Option<Vec<f32>> {
        self.get(name).map(|a| a.floats.clone())
    }
}

/// Input `i` of a node when present and non-empty.
pub(crate) fn input(node: &NodeProto, i: usize) -> Option<&str> {
    node.input
        .get(i)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

/// Input `i` of a node, required.
pub(crate) fn req(node: &NodeProto, i: usize) -> Result<&str> {
    input(node, i).ok_or_else(|| invalid(format!("missing required input {i}")))
}

/// `ax` (negative counts from the end) as an index into `rank` axes.
pub(crate) fn normalize_axis(ax: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if ax < 0 { ax + r } else { ax };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(invalid(format!(
            "axis {ax} is out of range for rank {rank}"
        )))
    }
}
