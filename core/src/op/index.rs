//! The indexing, shape and layout ops of issue 17: their attribute types, how they are read
//! from keyword literals ([`from_call`]) and written back ([`kwargs`]).
//!
//! Contract: names, attribute names, defaults and printing order are TVM Relax's
//! (`relax.gather_elements`, `relax.gather_nd`, `relax.scatter_elements`, `relax.scatter_nd`,
//! `relax.one_hot`, `relax.arange`, `relax.tile`, `relax.tril`, `relax.triu`, `relax.cumsum`,
//! `relax.cumprod`, `relax.nn.pad`), with two departures, both because an op's type is inferred
//! from its argument *types* alone here: `relax.arange` takes `start`, `end` and `step` as
//! attributes (TVM passes prim values), and `relax.tril` / `relax.triu` take `k` as an attribute
//! (TVM passes a prim value). `relax.one_hot`'s fill values are prim values as in TVM (an
//! integer one gives int64, a float one float32: a prim value's dtype is not kept at run time)
//! or rank-0 tensors of any dtype (what the ONNX importer passes). Malformed attributes are
//! errors that name the attribute.
//!
//! ```text
//! lv: R.Tensor((2, 3), dtype="float32") = R.gather_elements(x, idx, axis=1)
//! lv1: R.Tensor((10,), dtype="int64") = R.arange(start=0, end=10, step=1, dtype="int64")
//! lv2: R.Tensor((1, 3, 14, 12), dtype="float32") = R.nn.pad(x, pad_width=[0, 0, 0, 0, 2, 2, 1, 1], pad_value=0.0, pad_mode="constant")
//! lv3: R.Tensor((4, 4), dtype="float32") = R.tril(m, k=0)
//! lv4: R.Tensor((4, 8), dtype="float32") = R.one_hot(ids, R.prim_value(1.0), R.prim_value(0.0), depth=8, axis=-1)
//! ```

use super::attrs::{Kwargs, dtype_lit, ints_lit, opt_int_lit, str_lit};
use super::{AttrLit, F64, Op};
use crate::ir::DType;

/// The most elements `arange` may produce (2^40), a guard against absurd attributes.
const MAX_ARANGE: f64 = 1_099_511_627_776.0;

impl ArangeAttrs {
    /// The number of elements, `max(0, ceil((end - start) / step))`; an error for a zero or
    /// non-finite step, or more than 2^40 elements.
    pub fn numel(&self) -> Result<i64, String> {
        let (s, e, st) = (self.start.0, self.end.0, self.step.0);
        if st == 0.0 || !st.is_finite() {
            return Err("the step must be finite and not 0".to_string());
        }
        let n = ((e - s) / st).ceil();
        if !n.is_finite() || n > MAX_ARANGE {
            return Err(format!(
                "arange({s}, {e}, {st}) would have too many elements (at most 2^40)"
            ));
        }
        Ok(n.max(0.0) as i64)
    }
}

/// How `relax.scatter_elements` / `relax.scatter_nd` combine an update with what is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScatterReduction {
    /// Replace (`"update"`; ONNX `none`).
    Update,
    /// Add.
    Add,
    /// Multiply.
    Mul,
    /// Keep the larger.
    Max,
    /// Keep the smaller.
    Min,
    /// `(old + update) / 2`, one update at a time (TVM's `scatter_elements` only).
    Mean,
}

impl ScatterReduction {
    /// TVM's spelling.
    pub fn name(self) -> &'static str {
        match self {
            ScatterReduction::Update => "update",
            ScatterReduction::Add => "add",
            ScatterReduction::Mul => "mul",
            ScatterReduction::Max => "max",
            ScatterReduction::Min => "min",
            ScatterReduction::Mean => "mean",
        }
    }

    /// Parses TVM's spelling (ONNX's `none` is accepted for `update`).
    pub fn from_name(s: &str) -> Option<ScatterReduction> {
        Some(match s {
            "update" | "none" => ScatterReduction::Update,
            "add" => ScatterReduction::Add,
            "mul" => ScatterReduction::Mul,
            "max" => ScatterReduction::Max,
            "min" => ScatterReduction::Min,
            "mean" => ScatterReduction::Mean,
            _ => return None,
        })
    }
}

/// Attributes of `relax.cumsum` and `relax.cumprod`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScanAttrs {
    /// The scanned axis (`None`: the flattened tensor).
    pub axis: Option<i64>,
    /// The result (and accumulator) dtype (`None`: the input's).
    pub dtype: Option<DType>,
    /// Whether element `i` of the result leaves out element `i` of the input.
    pub exclusive: bool,
}

/// How `relax.nn.pad` fills the border.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PadMode {
    /// With `pad_value` (ONNX `constant`).
    Constant,
    /// Mirrored, without repeating the edge (ONNX `reflect`).
    Reflect,
    /// Repeating the edge (ONNX `edge`).
    Replicate,
    /// Wrapping around (ONNX `wrap`).
    Circular,
}

impl PadMode {
    /// TVM's spelling.
    pub fn name(self) -> &'static str {
        match self {
            PadMode::Constant => "constant",
            PadMode::Reflect => "reflect",
            PadMode::Replicate => "replicate",
            PadMode::Circular => "circular",
        }
    }
}

/// Attributes of `relax.nn.pad`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PadAttrs {
    /// `(before, after)` per axis, flattened: `[b0, a0, b1, a1, ...]` (negative values crop).
    pub pad_width: Vec<i64>,
    /// The fill value of `constant` mode.
    pub pad_value: F64,
    /// The fill mode.
    pub pad_mode: PadMode,
}

/// Attributes of `relax.arange`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ArangeAttrs {
    /// The first value.
    pub start: F64,
    /// The end (exclusive).
    pub end: F64,
    /// The step (not 0).
    pub step: F64,
    /// The element type.
    pub dtype: DType,
}

fn reduction(kw: &Kwargs<'_>, mean: bool) -> Result<ScatterReduction, String> {
    let s = kw.string("reduction", Some("update"))?;
    match ScatterReduction::from_name(&s) {
        Some(ScatterReduction::Mean) if !mean => None,
        r => r,
    }
    .ok_or_else(|| {
        let also = if mean { ", \"mean\"" } else { "" };
        kw.invalid(
            "reduction",
            &format!(
                "expected \"update\", \"add\", \"mul\", \"max\"{also} or \"min\", found \"{s}\""
            ),
        )
    })
}

fn scan(kw: &Kwargs<'_>) -> Result<Box<ScanAttrs>, String> {
    Ok(Box::new(ScanAttrs {
        axis: kw.opt_int("axis", None)?,
        dtype: kw.opt_dtype("dtype")?,
        exclusive: match kw.raw("exclusive") {
            // TVM prints `exclusive=0` in places; accept 0/1 as well as booleans.
            Some(AttrLit::Int(i)) => *i != 0,
            _ => kw.bool("exclusive", false)?,
        },
    }))
}

fn is_int_lit(v: Option<&AttrLit>) -> bool {
    !matches!(v, Some(AttrLit::Float(_)))
}

/// Builds an op of this family from its keyword literals; `Ok(None)` for a name outside it.
pub(super) fn from_call(name: &str, kw: &Kwargs<'_>) -> Result<Option<Op>, String> {
    Ok(Some(match name {
        "relax.gather_elements" => Op::GatherElements {
            axis: kw.int("axis", Some(0))?,
        },
        "relax.gather_nd" => {
            let batch_dims = kw.int("batch_dims", Some(0))?;
            if batch_dims < 0 {
                return Err(kw.invalid("batch_dims", "must not be negative"));
            }
            Op::GatherNd { batch_dims }
        }
        "relax.scatter_elements" => Op::ScatterElements {
            axis: kw.int("axis", Some(0))?,
            reduction: reduction(kw, true)?,
        },
        "relax.scatter_nd" => Op::ScatterNd {
            reduction: reduction(kw, false)?,
        },
        "relax.one_hot" => {
            let depth = kw.int("depth", None)?;
            if depth < 0 {
                return Err(kw.invalid("depth", &format!("must not be negative, found {depth}")));
            }
            Op::OneHot {
                depth,
                axis: kw.int("axis", Some(-1))?,
            }
        }
        "relax.arange" => {
            // As TVM's Python API: arange(n) is arange(0, n).
            let (start, end) = match kw.raw("end") {
                None | Some(AttrLit::None) => (F64(0.0), kw.float("start", 0.0)?),
                Some(_) => (kw.float("start", 0.0)?, kw.float("end", 0.0)?),
            };
            let step = kw.float("step", 1.0)?;
            if step.0 == 0.0 || !step.0.is_finite() {
                return Err(kw.invalid("step", "must be finite and not 0"));
            }
            if !start.0.is_finite() || !end.0.is_finite() {
                return Err(kw.invalid("start", "start and end must be finite"));
            }
            let dtype = match kw.opt_dtype("dtype")? {
                Some(d) => d,
                None if ["start", "end", "step"]
                    .iter()
                    .all(|k| is_int_lit(kw.raw(k))) =>
                {
                    DType::I64
                }
                None => DType::F32,
            };
            if !dtype.is_float()
                && [start, end, step]
                    .iter()
                    .any(|v| v.0.fract() != 0.0 || v.0.abs() > 9.0e15)
            {
                return Err(kw.invalid(
                    "start",
                    &format!("start, end and step must be integers for dtype {dtype}"),
                ));
            }
            Op::Arange(Box::new(ArangeAttrs {
                start,
                end,
                step,
                dtype,
            }))
        }
        "relax.tile" => {
            let repeats = kw.ints("repeats", None)?;
            if let Some(r) = repeats.iter().find(|&&r| r < 0) {
                return Err(kw.invalid("repeats", &format!("must not be negative, found {r}")));
            }
            Op::Tile { repeats }
        }
        "relax.reverse_sequence" => Op::ReverseSequence {
            seq_axis: kw.int("seq_axis", Some(1))?,
            batch_axis: kw.int("batch_axis", Some(0))?,
        },
        "relax.tril" => Op::Tril {
            k: kw.int("k", Some(0))?,
        },
        "relax.triu" => Op::Triu {
            k: kw.int("k", Some(0))?,
        },
        "relax.cumsum" => Op::Cumsum(scan(kw)?),
        "relax.cumprod" => Op::Cumprod(scan(kw)?),
        "relax.nn.pad" => {
            let pad_width = kw.ints("pad_width", None)?;
            if pad_width.len() % 2 != 0 {
                return Err(kw.invalid(
                    "pad_width",
                    &format!(
                        "expected an even number of values (before and after per axis), found {}",
                        pad_width.len()
                    ),
                ));
            }
            let mode = kw.string("pad_mode", Some("constant"))?;
            let pad_mode = match mode.as_str() {
                "constant" => PadMode::Constant,
                "reflect" => PadMode::Reflect,
                "replicate" | "edge" => PadMode::Replicate,
                "circular" | "wrap" => PadMode::Circular,
                other => {
                    return Err(kw.invalid(
                            "pad_mode",
                            &format!(
                                "expected \"constant\", \"reflect\", \"replicate\" or \"circular\", found \"{other}\""
                            ),
                        ));
                }
            };
            Op::Pad(Box::new(PadAttrs {
                pad_width,
                pad_value: kw.float("pad_value", 0.0)?,
                pad_mode,
            }))
        }
        _ => return Ok(None),
    }))
}

/// The attributes of an op of this family in TVM's printing order (`None` for other ops).
pub(super) fn kwargs(op: &Op) -> Option<Vec<(&'static str, AttrLit)>> {
    let float = |f: &F64| AttrLit::Float(f.0);
    let scan = |a: &ScanAttrs| {
        vec![
            ("axis", opt_int_lit(a.axis)),
            ("dtype", dtype_lit(a.dtype)),
            ("exclusive", AttrLit::Bool(a.exclusive)),
        ]
    };
    Some(match op {
        Op::GatherElements { axis } => vec![("axis", AttrLit::Int(*axis))],
        Op::GatherNd { batch_dims } => vec![("batch_dims", AttrLit::Int(*batch_dims))],
        Op::ScatterElements { axis, reduction } => vec![
            ("axis", AttrLit::Int(*axis)),
            ("reduction", str_lit(reduction.name())),
        ],
        Op::ScatterNd { reduction } => vec![("reduction", str_lit(reduction.name()))],
        Op::OneHot { depth, axis } => vec![
            ("depth", AttrLit::Int(*depth)),
            ("axis", AttrLit::Int(*axis)),
        ],
        Op::Arange(a) => {
            let num = |f: &F64| {
                if a.dtype.is_float() {
                    float(f)
                } else {
                    AttrLit::Int(f.0 as i64)
                }
            };
            vec![
                ("start", num(&a.start)),
                ("end", num(&a.end)),
                ("step", num(&a.step)),
                ("dtype", dtype_lit(Some(a.dtype))),
            ]
        }
        Op::Tile { repeats } => vec![("repeats", ints_lit(repeats))],
        Op::Tril { k } | Op::Triu { k } => vec![("k", AttrLit::Int(*k))],
        Op::ReverseSequence {
            seq_axis,
            batch_axis,
        } => vec![
            ("seq_axis", AttrLit::Int(*seq_axis)),
            ("batch_axis", AttrLit::Int(*batch_axis)),
        ],
        Op::Cumsum(a) | Op::Cumprod(a) => scan(a),
        Op::Pad(a) => vec![
            ("pad_width", ints_lit(&a.pad_width)),
            ("pad_value", float(&a.pad_value)),
            ("pad_mode", str_lit(a.pad_mode.name())),
        ],
        _ => return None,
    })
}
