//! The text form of an op: its call signature ([`Op::signature`]), building it from the keyword
//! literals of a call ([`Op::from_call`]: TVM's defaults for attributes left out, errors that
//! say what was expected for unknown attributes and literals of the wrong kind) and writing
//! them back in TVM 0.27's printing order ([`Op::kwargs`]), so that
//! `Op::from_call(op.name(), &op.kwargs()) == op`.
//!
//! ```text
//! lv: R.Tensor((n, 16, 32, 32), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1],
//!     padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW",
//!     kernel_layout="OIHW", out_layout="NCHW", out_dtype=None)
//! ```

use super::*;

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
    check_split_layout(kw, "layout", &layout, "NCHW")?;
    let out_layout = kw.string("out_layout", Some(&layout))?;
    check_split_layout(kw, "out_layout", &out_layout, "NCHW")?;
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
            "relax.astype" | "relax.bitcast" => sig(1, 1, &["dtype"]),
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
            "relax.layout_transform" => sig(1, 1, &["index_map", "pad_value"]),
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
            "relax.reverse_sequence" => sig(2, 2, &["seq_axis", "batch_axis"]),
            "relax.cumsum" | "relax.cumprod" => sig(1, 1, &["axis", "dtype", "exclusive"]),
            "relax.nn.pad" => sig(1, 1, &["pad_width", "pad_mode", "pad_value"]),
            "relax.min" | "relax.prod" | "relax.argmax" | "relax.argmin" => {
                sig(1, 1, &["axis", "keepdims"])
            }
            "relax.topk" => sig(1, 1, &["k", "axis", "ret_type", "largest", "dtype"]),
            "relax.einsum" => sig(1, 1, &["subscripts"]),
            "relax.nonzero" | "relax.det" => sig(1, 1, &[]),
            "relax.unique" => sig(1, 1, set::UNIQUE_ATTRS),
            "relax.vision.all_class_non_max_suppression" => sig(5, 5, &["output_format"]),
            "relax.vision.roi_align" => sig(2, 2, vision::ROI_ALIGN_ATTRS),
            "relax.nn.conv2d_transpose" => sig(2, 2, nn::CONV2D_TRANSPOSE_ATTRS),
            "relax.image.resize2d" => sig(2, 2, nn::RESIZE2D_ATTRS),
            "relax.image.grid_sample" => sig(2, 2, image::GRID_SAMPLE_ATTRS),
            "relax.image.affine_grid" => sig(2, 2, image::AFFINE_GRID_ATTRS),
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
            "relax.det" => Op::Det,
            "relax.bitcast" => Op::Bitcast {
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
                check_split_layout(&kw, "data_layout", &data_layout, "NCHW")?;
                let kernel_layout = kw.string("kernel_layout", Some("OIHW"))?;
                check_split_layout(&kw, "kernel_layout", &kernel_layout, "OIHW")?;
                let out_layout = kw.string("out_layout", Some(&data_layout))?;
                check_split_layout(&kw, "out_layout", &out_layout, "NCHW")?;
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
                check_split_layout(&kw, "layout", &layout, "NCHW")?;
                let out_layout = kw.string("out_layout", Some(&layout))?;
                check_split_layout(&kw, "out_layout", &out_layout, "NCHW")?;
                Op::AdaptiveAvgPool2d(Box::new(AdaptivePool2dAttrs {
                    output_size,
                    layout,
                    out_layout,
                }))
            }
            "relax.reshape" => Op::Reshape,
            "relax.layout_transform" => {
                let map = match kw.raw("index_map") {
                    Some(AttrLit::IndexMap(m)) => m.clone(),
                    Some(AttrLit::Str(s)) => {
                        IndexMap::parse(s).map_err(|e| kw.invalid("index_map", &e))?
                    }
                    Some(v) => {
                        return Err(kw.error("index_map", "T.index_map(lambda ...: (...))", v));
                    }
                    None => {
                        return Err(format!("`{name}`: missing required attribute `index_map`"));
                    }
                };
                map.validate().map_err(|e| kw.invalid("index_map", &e))?;
                match kw.raw("pad_value") {
                    None | Some(AttrLit::None) => {}
                    Some(v) => {
                        return Err(kw.error(
                            "pad_value",
                            "None (the maps move whole elements; padding is not supported)",
                            v,
                        ));
                    }
                }
                Op::LayoutTransform(Box::new(map))
            }
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
            "relax.image.grid_sample" => Op::GridSample(image::grid_sample_attrs(&kw)?),
            "relax.vision.roi_align" => Op::RoiAlign(vision::roi_align_attrs(&kw)?),
            "relax.image.affine_grid" => Op::AffineGrid {
                align_corners: kw.bool("align_corners", true)?,
            },
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
                None => match set::from_call(name, &kw)? {
                    Some(op) => op,
                    None => return Err(format!("unknown op `{name}`")),
                },
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
            | Op::Det
            | Op::Relu
            | Op::Gelu
            | Op::GeluTanh
            | Op::Silu
            | Op::Reshape
            | Op::Flatten
            | Op::BroadcastTo
            | Op::ShapeToTensor => vec![],
            Op::Astype { dtype } | Op::Bitcast { dtype } => {
                vec![("dtype", dtype_lit(Some(*dtype)))]
            }
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
            Op::LayoutTransform(m) => vec![
                ("index_map", AttrLit::IndexMap((**m).clone())),
                ("pad_value", AttrLit::None),
            ],
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
            | Op::ReverseSequence { .. }
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
            Op::Nonzero | Op::Unique(_) | Op::AllClassNms => set::kwargs(self).unwrap_or_default(),
            Op::Conv2dTranspose(a) => nn::conv2d_transpose_kwargs(a),
            Op::Resize2d(a) => nn::resize2d_kwargs(a),
            Op::GridSample(a) => image::grid_sample_kwargs(a),
            Op::RoiAlign(a) => vision::roi_align_kwargs(a),
            Op::AffineGrid { align_corners } => {
                vec![("align_corners", AttrLit::Bool(*align_corners))]
            }
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
}
