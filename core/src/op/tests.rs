//! Unit tests of the op set: round trips, signatures, printing and fusion kinds here; type
//! inference by op family in [`infer_tensor_nn`] and [`infer_shape_index`].

use super::*;
use crate::ir::{Dim, TensorType};

mod infer_shape_index;
mod infer_tensor_nn;

fn op(name: &str, kw: &[(&str, AttrLit)]) -> Op {
    let kw: Vec<(String, AttrLit)> = kw.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    match Op::from_call(name, &kw) {
        Ok(o) => o,
        Err(e) => unreachable!("from_call({name}) failed: {e}"),
    }
}

fn op_err(name: &str, kw: &[(&str, AttrLit)]) -> String {
    let kw: Vec<(String, AttrLit)> = kw.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    match Op::from_call(name, &kw) {
        Ok(o) => unreachable!("from_call({name}) should fail, gave {o:?}"),
        Err(e) => e,
    }
}

fn ints(v: &[i64]) -> AttrLit {
    AttrLit::List(v.iter().map(|&i| AttrLit::Int(i)).collect())
}

fn s(v: &str) -> AttrLit {
    AttrLit::Str(v.to_string())
}

fn t(shape: &[i64]) -> Type {
    Type::tensor(shape, DType::F32)
}

fn td(dims: &[Dim], dtype: DType) -> Type {
    Type::tensor_dims(dims.to_vec(), dtype)
}

fn n() -> Dim {
    Dim::sym("n")
}

fn d(v: i64) -> Dim {
    Dim::Static(v)
}

fn ok(o: &Op, args: &[&Type]) -> Type {
    match o.infer(args) {
        Ok(t) => t,
        Err(e) => unreachable!("{} failed: {e}", o.name()),
    }
}

fn err(o: &Op, args: &[&Type]) -> String {
    match o.infer(args) {
        Ok(t) => unreachable!("{} should fail, gave {t:?}", o.name()),
        Err(e) => e,
    }
}

fn shape(dims: &[Dim]) -> Type {
    Type::shape(dims.to_vec())
}

/// One instance per op name, some with non-default attributes.
fn samples() -> Vec<Op> {
    let mut out: Vec<Op> = Op::names().iter().map(|n| default_instance(n)).collect();
    out.extend([
        op("relax.matmul", &[("out_dtype", s("float16"))]),
        op(
            "relax.nn.conv2d",
            &[
                ("strides", ints(&[2, 2])),
                ("padding", AttrLit::Int(1)),
                ("groups", AttrLit::Int(2)),
                ("data_layout", s("NHWC")),
                ("kernel_layout", s("OHWI")),
                ("out_dtype", s("float32")),
            ],
        ),
        op(
            "relax.sum",
            &[("axis", ints(&[1])), ("keepdims", AttrLit::Bool(true))],
        ),
        op(
            "relax.nn.max_pool2d",
            &[("pool_size", ints(&[3, 3])), ("padding", ints(&[1, 1]))],
        ),
        op(
            "relax.nn.adaptive_avg_pool2d",
            &[("output_size", ints(&[1, 1]))],
        ),
        op("relax.permute_dims", &[("axes", ints(&[1, 0]))]),
        op(
            "relax.nn.attention",
            &[
                ("scale", AttrLit::Float(0.125)),
                ("causal_mask", s("BottomRight")),
                ("window_size", AttrLit::Int(4)),
            ],
        ),
        op("relax.nn.attention_bias", &[("causal_mask", s("TopLeft"))]),
        op("relax.concat", &[("axis", AttrLit::None)]),
        op(
            "relax.split",
            &[
                ("indices_or_sections", ints(&[2, 5])),
                ("axis", AttrLit::Int(1)),
            ],
        ),
        op("relax.squeeze", &[("axis", ints(&[0]))]),
        op(
            "relax.strided_slice",
            &[
                ("axes", ints(&[0])),
                ("begin", ints(&[1])),
                ("end", ints(&[3])),
                ("strides", ints(&[2])),
            ],
        ),
        op(
            "relax.take",
            &[("axis", AttrLit::Int(0)), ("mode", s("clip"))],
        ),
        op(
            "relax.nn.batch_norm",
            &[
                ("epsilon", AttrLit::Float(1e-3)),
                ("training", AttrLit::Bool(false)),
            ],
        ),
    ]);
    out.extend(index_samples());
    out
}

fn index_samples() -> Vec<Op> {
    vec![
        op("relax.gather_elements", &[("axis", AttrLit::Int(-1))]),
        op("relax.gather_nd", &[("batch_dims", AttrLit::Int(1))]),
        op(
            "relax.scatter_elements",
            &[("axis", AttrLit::Int(1)), ("reduction", s("max"))],
        ),
        op("relax.scatter_nd", &[("reduction", s("mul"))]),
        op("relax.scatter_elements", &[("reduction", s("mean"))]),
        op(
            "relax.one_hot",
            &[("depth", AttrLit::Int(10)), ("axis", AttrLit::Int(0))],
        ),
        op(
            "relax.arange",
            &[
                ("start", AttrLit::Float(0.5)),
                ("end", AttrLit::Float(3.0)),
                ("step", AttrLit::Float(0.25)),
                ("dtype", s("float64")),
            ],
        ),
        op(
            "relax.arange",
            &[
                ("start", AttrLit::Int(10)),
                ("end", AttrLit::Int(-2)),
                ("step", AttrLit::Int(-3)),
            ],
        ),
        op("relax.tile", &[("repeats", ints(&[2, 1, 3]))]),
        op("relax.tril", &[("k", AttrLit::Int(-2))]),
        op("relax.triu", &[("k", AttrLit::Int(3))]),
        op(
            "relax.cumsum",
            &[
                ("axis", AttrLit::Int(1)),
                ("dtype", s("float64")),
                ("exclusive", AttrLit::Bool(true)),
            ],
        ),
        op("relax.cumprod", &[("axis", AttrLit::Int(-1))]),
        op(
            "relax.nn.pad",
            &[
                ("pad_width", ints(&[0, 0, 2, 1])),
                ("pad_mode", s("reflect")),
                ("pad_value", AttrLit::Float(1.5)),
            ],
        ),
    ]
}

fn default_instance(name: &str) -> Op {
    match name {
        "relax.astype" => op(name, &[("dtype", s("float16"))]),
        "relax.bitcast" => op(name, &[("dtype", s("int32"))]),
        "relax.split" => op(name, &[("indices_or_sections", AttrLit::Int(2))]),
        "relax.expand_dims" => op(name, &[("axis", ints(&[0]))]),
        "relax.strided_slice" => op(
            name,
            &[
                ("axes", ints(&[0])),
                ("begin", ints(&[0])),
                ("end", ints(&[2])),
            ],
        ),
        "relax.one_hot" => op(name, &[("depth", AttrLit::Int(4))]),
        "relax.tile" => op(name, &[("repeats", ints(&[2]))]),
        "relax.nn.pad" => op(name, &[("pad_width", ints(&[1, 1]))]),
        "relax.einsum" => op(name, &[("subscripts", s("ij,jk->ik"))]),
        "relax.layout_transform" => {
            op(name, &[("index_map", s("lambda a, b: (a // 2, b, a % 2)"))])
        }
        "relax.nn.group_norm" => op(
            name,
            &[
                ("num_groups", AttrLit::Int(2)),
                ("channel_axis", AttrLit::Int(1)),
                ("axes", ints(&[2, 3])),
            ],
        ),
        "relax.vision.roi_align" => op(
            name,
            &[
                ("pooled_size", ints(&[7])),
                ("spatial_scale", AttrLit::Float(0.25)),
            ],
        ),
        "relax.nn.instance_norm" => op(
            name,
            &[("channel_axis", AttrLit::Int(1)), ("axes", ints(&[2, 3]))],
        ),
        _ => op(name, &[]),
    }
}

#[test]
fn every_name_has_a_signature_and_round_trips() {
    let names = Op::names();
    // The ops before issue 17 and shape_to_tensor, then the families of issue 17:
    // elementwise, index (12), reduce (6) and nn (4); issue 20's stack and 1-D / 3-D pools (7);
    // issue 19's attention and attention_bias (2); grid_sample, affine_grid and
    // reverse_sequence (3); layout_transform (1); the value-dependent nonzero, unique and
    // all_class_non_max_suppression (3); roi_align, bitcast and det (3).
    assert_eq!(
        names.len(),
        48 + crate::op::ElemOp::ALL.len() + 12 + 6 + 4 + 7 + 2 + 3 + 1 + 3 + 3
    );
    for name in names {
        let sig = Op::signature(name);
        assert!(sig.is_some(), "{name} has no signature");
        let o = default_instance(name);
        assert_eq!(o.name(), *name);
        if let Some(sig) = sig {
            // Every printed attribute is one the signature knows, and vice versa.
            let printed: Vec<&str> = o.kwargs().iter().map(|(k, _)| *k).collect();
            let mut a = printed.clone();
            // Extensions of TVM's ops print only when set (not in a default instance).
            let mut b: Vec<&str> = sig
                .attr_names
                .iter()
                .copied()
                .filter(|n| {
                    name != &"relax.image.resize2d" || !super::nn::RESIZE2D_EXTENSIONS.contains(n)
                })
                .collect();
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "{name}");
            assert!(sig.min_args <= sig.max_args);
        }
    }
    for o in samples() {
        let kw: Vec<(String, AttrLit)> = o
            .kwargs()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(
            Op::from_call(o.name(), &kw),
            Ok(o.clone()),
            "round trip of {o:?}"
        );
    }
    assert!(Op::signature("relax.nope").is_none());
}

#[test]
fn op_is_small() {
    assert!(
        std::mem::size_of::<Op>() <= 32,
        "size_of::<Op>() = {}",
        std::mem::size_of::<Op>()
    );
}

#[test]
fn kwargs_print_in_tvm_order() {
    fn names(o: &Op) -> Vec<&str> {
        o.kwargs().into_iter().map(|(k, _)| k).collect()
    }
    let conv = op("relax.nn.conv2d", &[("padding", ints(&[1, 1]))]);
    assert_eq!(
        conv.kwargs(),
        vec![
            ("strides", ints(&[1, 1])),
            ("padding", ints(&[1, 1, 1, 1])),
            ("dilation", ints(&[1, 1])),
            ("groups", AttrLit::Int(1)),
            ("data_layout", s("NCHW")),
            ("kernel_layout", s("OIHW")),
            ("out_layout", s("NCHW")),
            ("out_dtype", AttrLit::None),
        ]
    );
    assert_eq!(
        op("relax.matmul", &[]).kwargs(),
        vec![("out_dtype", AttrLit::None)]
    );
    assert_eq!(
        op("relax.nn.batch_norm", &[]).kwargs(),
        vec![
            ("axis", AttrLit::Int(1)),
            ("epsilon", AttrLit::Float(1e-5)),
            ("center", AttrLit::Bool(true)),
            ("scale", AttrLit::Bool(true)),
            ("momentum", AttrLit::Float(0.1)),
            ("training", AttrLit::Bool(true)),
        ]
    );
    assert_eq!(
        names(&op("relax.nn.max_pool2d", &[])),
        [
            "pool_size",
            "strides",
            "dilation",
            "padding",
            "ceil_mode",
            "count_include_pad",
            "layout",
            "out_layout"
        ]
    );
    assert_eq!(
        op(
            "relax.split",
            &[
                ("indices_or_sections", AttrLit::Int(2)),
                ("axis", AttrLit::Int(1))
            ]
        )
        .kwargs(),
        vec![
            ("indices_or_sections", AttrLit::Int(2)),
            ("axis", AttrLit::Int(1))
        ]
    );
    assert_eq!(
        op("relax.sum", &[("axis", ints(&[1]))]).kwargs(),
        vec![("axis", ints(&[1])), ("keepdims", AttrLit::Bool(false))]
    );
    assert_eq!(
        op("relax.nn.softmax", &[]).kwargs(),
        vec![("axis", AttrLit::Int(-1))]
    );
    assert_eq!(
        op("relax.permute_dims", &[]).kwargs(),
        vec![("axes", AttrLit::None)]
    );
    assert_eq!(
        op("relax.take", &[]).kwargs(),
        vec![("axis", AttrLit::None), ("mode", s("fast"))]
    );
}

#[test]
fn from_call_accepts_tvm_spellings() {
    // out_dtype="void" is None; a bare int or a 2-list for padding; out_layout follows data_layout.
    assert_eq!(
        op("relax.matmul", &[("out_dtype", s("void"))]),
        Op::Matmul { out_dtype: None }
    );
    let Op::Conv2d(a) = op(
        "relax.nn.conv2d",
        &[("padding", AttrLit::Int(1)), ("data_layout", s("NHWC"))],
    ) else {
        unreachable!()
    };
    assert_eq!(a.padding, [1, 1, 1, 1]);
    assert_eq!(a.out_layout, "NHWC");
    let Op::Conv2d(a) = op(
        "relax.nn.conv2d",
        &[("padding", ints(&[1, 2])), ("strides", AttrLit::Int(2))],
    ) else {
        unreachable!()
    };
    assert_eq!(a.padding, [1, 2, 1, 2]);
    assert_eq!(a.strides, [2, 2]);
    assert_eq!(
        op(
            "relax.nn.layer_norm",
            &[("axes", AttrLit::Int(-1)), ("epsilon", AttrLit::Int(1))]
        ),
        Op::LayerNorm(Box::new(LayerNormAttrs {
            axes: vec![-1],
            epsilon: F64(1.0),
            center: true,
            scale: true
        }))
    );
}

#[test]
fn from_call_errors() {
    let e = op_err("relax.nn.conv2d", &[("stride", ints(&[1, 1]))]);
    assert!(
        e.contains("no attribute `stride`") && e.contains("strides, padding"),
        "{e}"
    );
    let e = op_err("relax.nn.softmax", &[("axis", s("x"))]);
    assert!(
        e.contains("expected an integer") && e.contains("\"x\""),
        "{e}"
    );
    let e = op_err("relax.nn.conv2d", &[("padding", ints(&[1, 2, 3]))]);
    assert!(e.contains("1, 2 or 4 integers"), "{e}");
    let e = op_err("relax.nn.conv2d", &[("data_layout", s("NCHX"))]);
    assert!(e.contains("permutation of \"NCHW\""), "{e}");
    let e = op_err("relax.nn.conv2d", &[("strides", ints(&[0, 1]))]);
    assert!(e.contains("at least 1"), "{e}");
    let e = op_err("relax.astype", &[]);
    assert!(e.contains("missing required attribute `dtype`"), "{e}");
    let e = op_err("relax.astype", &[("dtype", s("float7"))]);
    assert!(e.contains("a dtype"), "{e}");
    let e = op_err("relax.add", &[("axis", AttrLit::Int(0))]);
    assert!(e.contains("takes no attributes"), "{e}");
    let e = op_err("relax.take", &[("mode", s("raise"))]);
    assert!(e.contains("\"fast\""), "{e}");
    let e = op_err(
        "relax.split",
        &[("indices_or_sections", AttrLit::Float(2.0))],
    );
    assert!(e.contains("an integer or a list"), "{e}");
    let e = op_err("relax.sum", &[("keepdims", AttrLit::Int(1))]);
    assert!(e.contains("True or False"), "{e}");
    let e = op_err(
        "relax.sum",
        &[("axis", AttrLit::None), ("axis", AttrLit::None)],
    );
    assert!(e.contains("twice"), "{e}");
    let e = op_err(
        "relax.strided_slice",
        &[
            ("axes", ints(&[0, 1])),
            ("begin", ints(&[0])),
            ("end", ints(&[1, 1])),
        ],
    );
    assert!(
        e.contains("`begin`") && e.contains("expected 2 values"),
        "{e}"
    );
    let e = op_err("relax.nope", &[]);
    assert!(e.contains("unknown op"), "{e}");
}

#[test]
fn fusion_kinds() {
    let kind = |n: &str| default_instance(n).fusion_kind();
    assert_eq!(kind("relax.add"), FusionKind::Broadcast);
    assert_eq!(kind("relax.minimum"), FusionKind::Broadcast);
    assert_eq!(kind("relax.exp"), FusionKind::ElemWise);
    assert_eq!(kind("relax.nn.relu"), FusionKind::ElemWise);
    assert_eq!(kind("relax.clip"), FusionKind::ElemWise);
    assert_eq!(kind("relax.astype"), FusionKind::ElemWise);
    assert_eq!(kind("relax.matmul"), FusionKind::OutEWiseFusable);
    assert_eq!(kind("relax.nn.conv2d"), FusionKind::OutEWiseFusable);
    assert_eq!(kind("relax.nn.max_pool2d"), FusionKind::OutEWiseFusable);
    assert_eq!(
        kind("relax.nn.adaptive_avg_pool2d"),
        FusionKind::OutEWiseFusable
    );
    assert_eq!(kind("relax.nn.softmax"), FusionKind::CommReduce);
    assert_eq!(kind("relax.nn.layer_norm"), FusionKind::CommReduce);
    assert_eq!(kind("relax.sum"), FusionKind::CommReduce);
    assert_eq!(kind("relax.reshape"), FusionKind::Injective);
    assert_eq!(kind("relax.take"), FusionKind::Injective);
    assert_eq!(kind("relax.strided_slice"), FusionKind::Injective);
    assert_eq!(kind("relax.broadcast_to"), FusionKind::Broadcast);
    assert_eq!(kind("relax.nn.batch_norm"), FusionKind::Opaque);
    assert_eq!(kind("relax.nn.dropout"), FusionKind::Opaque);
    assert_eq!(kind("relax.nn.lrn"), FusionKind::Opaque);
}
