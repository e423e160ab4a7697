//! Unit tests of the op set: round trips, signatures, fusion kinds and inference.

use super::*;
use crate::ir::{Dim, TensorType};

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

#[test]
fn binary_broadcasts_with_symbols() {
    for name in [
        "relax.add",
        "relax.subtract",
        "relax.multiply",
        "relax.divide",
        "relax.power",
        "relax.maximum",
        "relax.minimum",
    ] {
        let o = default_instance(name);
        assert_eq!(ok(&o, &[&t(&[2, 1, 4]), &t(&[3, 1])]), t(&[2, 3, 4]));
        let a = td(&[n(), d(1)], DType::F32);
        let b = td(&[d(1), d(8)], DType::F32);
        assert_eq!(ok(&o, &[&a, &b]), td(&[n(), d(8)], DType::F32));
        let e = err(&o, &[&t(&[2, 3]), &t(&[4])]);
        assert!(e.contains("cannot broadcast dims 3 and 4"), "{e}");
        let e = err(&o, &[&t(&[2]), &Type::tensor(&[2], DType::F16)]);
        assert!(e.contains("same dtype") && e.contains("float16"), "{e}");
    }
    // Unprovable symbolic pair: rank only, as TVM.
    let a = td(&[n()], DType::F32);
    let b = td(&[Dim::sym("m")], DType::F32);
    let r = ok(&Op::Add, &[&a, &b]);
    assert_eq!(
        r,
        Type::Tensor(TensorType {
            dims: None,
            ndim: Some(1),
            dtype: Some(DType::F32)
        })
    );
    // Unknown rank and dtype do not panic.
    let u = Type::Tensor(TensorType {
        dims: None,
        ndim: None,
        dtype: None,
    });
    assert_eq!(
        ok(&Op::Add, &[&u, &t(&[2])]),
        Type::Tensor(TensorType {
            dims: None,
            ndim: None,
            dtype: Some(DType::F32)
        })
    );
    let e = err(&Op::Add, &[&t(&[2])]);
    assert!(e.contains("expected 2 arguments, found 1"), "{e}");
    let e = err(&Op::Add, &[&t(&[2]), &Type::Object]);
    assert!(
        e.contains("rhs to be a tensor") && e.contains("Object"),
        "{e}"
    );
}

#[test]
fn unary_ops() {
    let x = td(&[n(), d(4)], DType::F32);
    for name in [
        "relax.exp",
        "relax.log",
        "relax.sqrt",
        "relax.rsqrt",
        "relax.tanh",
        "relax.sigmoid",
        "relax.erf",
        "relax.negative",
        "relax.abs",
        "relax.nn.relu",
        "relax.nn.gelu",
        "relax.nn.gelu_tanh",
        "relax.nn.silu",
    ] {
        assert_eq!(ok(&default_instance(name), &[&x]), x, "{name}");
    }
    let i = Type::tensor(&[4], DType::I32);
    let e = err(&Op::Exp, &[&i]);
    assert!(e.contains("float dtype") && e.contains("int32"), "{e}");
    assert_eq!(ok(&Op::Abs, &[&i]), i);
    let p = Type::Prim(DType::F32);
    assert_eq!(ok(&Op::Clip, &[&x, &p, &p]), x);
    let e = err(&Op::Clip, &[&x, &x, &p]);
    assert!(e.contains("min to be a prim value"), "{e}");
    let o = op("relax.astype", &[("dtype", s("float16"))]);
    assert_eq!(ok(&o, &[&x]), td(&[n(), d(4)], DType::F16));
}

#[test]
fn matmul_numpy_semantics() {
    let m = Op::Matmul { out_dtype: None };
    assert_eq!(ok(&m, &[&t(&[2, 3]), &t(&[3, 4])]), t(&[2, 4]));
    assert_eq!(
        ok(&m, &[&t(&[5, 1, 2, 3]), &t(&[7, 3, 4])]),
        t(&[5, 7, 2, 4])
    );
    assert_eq!(ok(&m, &[&t(&[3]), &t(&[3, 4])]), t(&[4]));
    assert_eq!(ok(&m, &[&t(&[2, 3]), &t(&[3])]), t(&[2]));
    assert_eq!(ok(&m, &[&t(&[3]), &t(&[3])]), t(&[]));
    let a = td(&[n(), d(64)], DType::F16);
    let b = td(&[d(64), d(128)], DType::F16);
    assert_eq!(ok(&m, &[&a, &b]), td(&[n(), d(128)], DType::F16));
    let m32 = Op::Matmul {
        out_dtype: Some(DType::F32),
    };
    assert_eq!(ok(&m32, &[&a, &b]), td(&[n(), d(128)], DType::F32));
    let e = err(&m, &[&t(&[2, 3]), &t(&[4, 5])]);
    assert!(
        e.contains("reduction dims differ") && e.contains("(2, 3)"),
        "{e}"
    );
    let e = err(&m, &[&t(&[]), &t(&[3])]);
    assert!(e.contains("rank at least 1"), "{e}");
    let r2 = Type::Tensor(TensorType {
        dims: None,
        ndim: Some(2),
        dtype: Some(DType::F32),
    });
    assert_eq!(
        ok(&m, &[&r2, &t(&[3])]),
        Type::Tensor(TensorType {
            dims: None,
            ndim: Some(1),
            dtype: Some(DType::F32)
        })
    );
}

#[test]
fn conv2d_layouts_groups_symbols() {
    let c = op("relax.nn.conv2d", &[("padding", ints(&[1, 1]))]);
    assert_eq!(
        ok(&c, &[&t(&[1, 3, 32, 32]), &t(&[16, 3, 3, 3])]),
        t(&[1, 16, 32, 32])
    );
    let c2 = op(
        "relax.nn.conv2d",
        &[("strides", ints(&[2, 2])), ("dilation", ints(&[2, 2]))],
    );
    // (32 - ((3 - 1) * 2 + 1)) // 2 + 1 = 14
    assert_eq!(
        ok(&c2, &[&t(&[1, 3, 32, 32]), &t(&[16, 3, 3, 3])]),
        t(&[1, 16, 14, 14])
    );
    let nhwc = op(
        "relax.nn.conv2d",
        &[
            ("data_layout", s("NHWC")),
            ("kernel_layout", s("OHWI")),
            ("padding", AttrLit::Int(1)),
        ],
    );
    assert_eq!(
        ok(&nhwc, &[&t(&[1, 32, 32, 3]), &t(&[16, 3, 3, 3])]),
        t(&[1, 32, 32, 16])
    );
    let mixed = op(
        "relax.nn.conv2d",
        &[("data_layout", s("NHWC")), ("out_layout", s("NCHW"))],
    );
    assert_eq!(
        ok(&mixed, &[&t(&[1, 8, 8, 3]), &t(&[4, 3, 3, 3])]),
        t(&[1, 4, 6, 6])
    );
    let g = op("relax.nn.conv2d", &[("groups", AttrLit::Int(4))]);
    assert_eq!(
        ok(&g, &[&t(&[1, 8, 5, 5]), &t(&[8, 2, 1, 1])]),
        t(&[1, 8, 5, 5])
    );
    let e = err(&g, &[&t(&[1, 8, 5, 5]), &t(&[8, 3, 1, 1])]);
    assert!(
        e.contains("8 input channels") && e.contains("groups"),
        "{e}"
    );
    // Symbolic batch and height.
    let h = Dim::sym("h");
    let x = td(&[n(), d(3), h.clone(), d(32)], DType::F32);
    let r = ok(&c2, &[&x, &t(&[16, 3, 3, 3])]);
    let Type::Tensor(tt) = &r else { unreachable!() };
    let dims = tt.dims.clone().unwrap_or_default();
    assert_eq!(dims.first(), Some(&n()));
    assert_eq!(dims.get(1), Some(&d(16)));
    assert_eq!(
        dims.get(2).map(Dim::to_string).as_deref(),
        Some("(h - 5) // 2 + 1")
    );
    assert_eq!(dims.get(3), Some(&d(14)));
    let e = err(&c, &[&t(&[1, 3, 32]), &t(&[16, 3, 3, 3])]);
    assert!(e.contains("data to be a 4-D tensor"), "{e}");
    let e = err(
        &c,
        &[&t(&[1, 3, 8, 8]), &Type::tensor(&[16, 3, 3, 3], DType::F16)],
    );
    assert!(e.contains("same dtype"), "{e}");
    let u = Type::Tensor(TensorType {
        dims: None,
        ndim: None,
        dtype: Some(DType::F32),
    });
    assert_eq!(
        ok(&c, &[&u, &t(&[16, 3, 3, 3])]),
        Type::Tensor(TensorType {
            dims: None,
            ndim: Some(4),
            dtype: Some(DType::F32)
        })
    );
}

#[test]
fn norms_and_softmax() {
    let x = td(&[n(), d(16), d(8), d(8)], DType::F32);
    let c = t(&[16]);
    let bn = op("relax.nn.batch_norm", &[]);
    assert_eq!(
        ok(&bn, &[&x, &c, &c, &c, &c]),
        Type::Tuple(vec![x.clone(), c.clone(), c.clone()])
    );
    let e = err(&bn, &[&x, &t(&[8]), &c, &c, &c]);
    assert!(e.contains("gamma to have 16 elements"), "{e}");
    let e = err(&bn, &[&x, &c, &c, &c]);
    assert!(e.contains("expected 5 arguments, found 4"), "{e}");
    let bad_axis = op("relax.nn.batch_norm", &[("axis", AttrLit::Int(4))]);
    let e = err(&bad_axis, &[&x, &c, &c, &c, &c]);
    assert!(e.contains("axis 4 is out of range"), "{e}");

    let y = td(&[n(), d(128)], DType::F32);
    let ln = op("relax.nn.layer_norm", &[]);
    let g = t(&[128]);
    assert_eq!(ok(&ln, &[&y, &g, &g]), y);
    let e = err(&ln, &[&y, &t(&[64]), &g]);
    assert!(e.contains("gamma to have shape (128)"), "{e}");
    let rms = op("relax.nn.rms_norm", &[]);
    assert_eq!(ok(&rms, &[&y, &g]), y);
    let e = err(&rms, &[&y, &t(&[2, 128])]);
    assert!(e.contains("weight to be a 1-D tensor"), "{e}");

    for name in ["relax.nn.softmax", "relax.nn.log_softmax"] {
        assert_eq!(ok(&default_instance(name), &[&y]), y);
        let o = op(name, &[("axis", AttrLit::Int(2))]);
        let e = err(&o, &[&y]);
        assert!(
            e.contains("axis 2 is out of range for a tensor of rank 2"),
            "{e}"
        );
    }
    let dr = op("relax.nn.dropout", &[("rate", AttrLit::Float(0.1))]);
    assert_eq!(ok(&dr, &[&y]), Type::Tuple(vec![y.clone(), y.clone()]));
    let lrn = op("relax.nn.lrn", &[]);
    assert_eq!(ok(&lrn, &[&x]), x);
}

#[test]
fn reductions() {
    let x = td(&[n(), d(3), d(4)], DType::F32);
    for name in ["relax.sum", "relax.mean", "relax.max"] {
        let o = op(name, &[("axis", ints(&[1]))]);
        assert_eq!(ok(&o, &[&x]), td(&[n(), d(4)], DType::F32));
        let o = op(
            name,
            &[("axis", ints(&[-1, 0])), ("keepdims", AttrLit::Bool(true))],
        );
        assert_eq!(ok(&o, &[&x]), td(&[d(1), d(3), d(1)], DType::F32));
        assert_eq!(ok(&default_instance(name), &[&x]), td(&[], DType::F32));
        let o = op(name, &[("axis", ints(&[1, -2]))]);
        let e = err(&o, &[&x]);
        assert!(e.contains("repeated"), "{e}");
        let o = op(name, &[("axis", AttrLit::Int(3))]);
        let e = err(&o, &[&x]);
        assert!(e.contains("axis 3 is out of range"), "{e}");
    }
}

#[test]
fn pools() {
    let mp = op(
        "relax.nn.max_pool2d",
        &[
            ("pool_size", ints(&[3, 3])),
            ("strides", ints(&[2, 2])),
            ("padding", ints(&[1, 1])),
        ],
    );
    assert_eq!(ok(&mp, &[&t(&[1, 64, 112, 112])]), t(&[1, 64, 56, 56]));
    let ceil = op(
        "relax.nn.avg_pool2d",
        &[
            ("pool_size", ints(&[2, 2])),
            ("strides", ints(&[2, 2])),
            ("ceil_mode", AttrLit::Bool(true)),
        ],
    );
    assert_eq!(ok(&ceil, &[&t(&[1, 3, 5, 5])]), t(&[1, 3, 3, 3]));
    let nhwc = op(
        "relax.nn.max_pool2d",
        &[
            ("pool_size", ints(&[2, 2])),
            ("strides", ints(&[2, 2])),
            ("layout", s("NHWC")),
        ],
    );
    let x = td(&[n(), d(8), d(8), d(3)], DType::F32);
    assert_eq!(ok(&nhwc, &[&x]), td(&[n(), d(4), d(4), d(3)], DType::F32));
    let big = op("relax.nn.max_pool2d", &[("pool_size", ints(&[9, 9]))]);
    let e = err(&big, &[&t(&[1, 3, 4, 4])]);
    assert!(e.contains("does not fit"), "{e}");
    let ad = op(
        "relax.nn.adaptive_avg_pool2d",
        &[("output_size", ints(&[1, 1]))],
    );
    assert_eq!(
        ok(&ad, &[&x.clone()]),
        td(&[n(), d(8), d(1), d(1)], DType::F32)
    );
    let ad = op("relax.nn.adaptive_avg_pool2d", &[("layout", s("NHWC"))]);
    assert_eq!(ok(&ad, &[&x]), x);
}

/// A tensor type's dims as text: `(n, 4)`.
fn dims_of(t: &Type) -> String {
    let dims = t
        .as_tensor()
        .and_then(|t| t.dims.clone())
        .unwrap_or_default();
    let parts: Vec<String> = dims.iter().map(Dim::to_string).collect();
    format!("({})", parts.join(", "))
}

#[test]
fn reshape_and_friends() {
    let r = Op::Reshape;
    assert_eq!(ok(&r, &[&t(&[2, 8]), &shape(&[d(4), d(-1)])]), t(&[4, 4]));
    assert_eq!(
        ok(&r, &[&t(&[1, 16]), &shape(&[d(1), d(16), d(1), d(1)])]),
        t(&[1, 16, 1, 1])
    );
    let x = td(&[n(), d(16), d(4)], DType::F32);
    assert_eq!(
        ok(&r, &[&x, &shape(&[n(), d(-1)])]),
        td(&[n(), d(64)], DType::F32)
    );
    assert_eq!(
        ok(&r, &[&x, &shape(&[d(-1), d(4)])]),
        td(&[n().mul(&d(16)), d(4)], DType::F32)
    );
    assert_eq!(
        ok(&r, &[&x, &shape(&[d(8), n(), d(8)])]),
        td(&[d(8), n(), d(8)], DType::F32)
    );
    // A symbol the input's count does not hold: the floor quotient of what does not cancel.
    assert_eq!(
        dims_of(&ok(&r, &[&x, &shape(&[Dim::sym("m"), d(-1)])])),
        "(m, n * 64 // m)"
    );
    // Mamba2's padded sequence viewed as the unpadded one: `batch` cancels.
    let b = Dim::sym("b");
    let padded = n().add(&d(7)).floor_div(&d(8)).mul(&d(8));
    assert_eq!(
        dims_of(&ok(
            &r,
            &[
                &td(&[b.clone(), padded, d(4), d(16)], DType::F32),
                &shape(&[b.clone(), n(), d(-1)])
            ]
        )),
        "(b, n, (n + 7) // 8 * 512 // n)"
    );
    // A symbolic count not provably a multiple: the floor quotient, simplified
    // (`(n * 4) // 32` is `n // 8`), as TVM infers it; the executor checks the count.
    assert_eq!(
        ok(
            &r,
            &[&td(&[n(), d(4)], DType::F32), &shape(&[d(-1), d(8), d(4)])]
        ),
        td(&[n().floor_div(&d(8)), d(8), d(4)], DType::F32)
    );
    assert_eq!(
        ok(&r, &[&td(&[n(), d(6)], DType::F32), &shape(&[d(-1), d(4)])]),
        td(&[n().mul(&d(6)).floor_div(&d(4)), d(4)], DType::F32)
    );
    let e = err(&r, &[&t(&[2, 8]), &shape(&[d(3), d(-1)])]);
    assert!(
        e.contains("cannot infer the -1") && e.contains("16 elements"),
        "{e}"
    );
    let e = err(&r, &[&t(&[2, 8]), &shape(&[d(3), d(5)])]);
    assert!(e.contains("cannot reshape (2, 8)"), "{e}");
    let e = err(&r, &[&t(&[2, 8]), &shape(&[d(-1), d(-1)])]);
    assert!(e.contains("at most one -1"), "{e}");
    let e = err(&r, &[&t(&[2, 8]), &t(&[2])]);
    assert!(e.contains("expected a shape"), "{e}");

    let p = op("relax.permute_dims", &[("axes", ints(&[1, 0]))]);
    assert_eq!(
        ok(&p, &[&td(&[n(), d(3)], DType::F32)]),
        td(&[d(3), n()], DType::F32)
    );
    assert_eq!(
        ok(&default_instance("relax.permute_dims"), &[&t(&[1, 2, 3])]),
        t(&[3, 2, 1])
    );
    let e = err(&p, &[&t(&[1, 2, 3])]);
    assert!(e.contains("expected 3 axes"), "{e}");

    let f = Op::Flatten;
    assert_eq!(
        ok(&f, &[&td(&[n(), d(4)], DType::F32)]),
        td(&[n().mul(&d(4))], DType::F32)
    );
    assert_eq!(ok(&f, &[&t(&[])]), t(&[1]));

    let sq = op("relax.squeeze", &[("axis", ints(&[-1]))]);
    assert_eq!(ok(&sq, &[&t(&[3, 1])]), t(&[3]));
    let e = err(&sq, &[&t(&[3, 2])]);
    assert!(e.contains("cannot squeeze axis 1 of extent 2"), "{e}");
    assert_eq!(
        ok(&default_instance("relax.squeeze"), &[&t(&[1, 3, 1])]),
        t(&[3])
    );

    let ex = op("relax.expand_dims", &[("axis", ints(&[0, -1]))]);
    assert_eq!(
        ok(&ex, &[&td(&[n(), d(3)], DType::F32)]),
        td(&[d(1), n(), d(3), d(1)], DType::F32)
    );
    let ex = op("relax.expand_dims", &[("axis", AttrLit::Int(5))]);
    let e = err(&ex, &[&t(&[2])]);
    assert!(e.contains("out of range"), "{e}");

    let bt = Op::BroadcastTo;
    assert_eq!(
        ok(&bt, &[&t(&[3, 1]), &shape(&[n(), d(3), d(4)])]),
        td(&[n(), d(3), d(4)], DType::F32)
    );
    let e = err(&bt, &[&t(&[3, 2]), &shape(&[d(3), d(4)])]);
    assert!(e.contains("cannot broadcast (3, 2) to (3, 4)"), "{e}");
}

#[test]
fn concat_split() {
    let c = default_instance("relax.concat");
    let tup = Type::Tuple(vec![
        td(&[n(), d(3)], DType::F32),
        td(&[d(2), d(3)], DType::F32),
    ]);
    assert_eq!(ok(&c, &[&tup]), td(&[n().add(&d(2)), d(3)], DType::F32));
    let c1 = op("relax.concat", &[("axis", AttrLit::Int(-1))]);
    let tup = Type::Tuple(vec![t(&[2, 3]), t(&[2, 5])]);
    assert_eq!(ok(&c1, &[&tup]), t(&[2, 8]));
    let e = err(&c, &[&tup]);
    assert!(e.contains("match on the dims other than axis 0"), "{e}");
    let flat = op("relax.concat", &[("axis", AttrLit::None)]);
    assert_eq!(ok(&flat, &[&tup]), t(&[16]));
    let e = err(&c, &[&t(&[2])]);
    assert!(e.contains("expected a tuple of tensors"), "{e}");
    let e = err(&c, &[&Type::Tuple(vec![])]);
    assert!(e.contains("non-empty"), "{e}");

    let sp = op(
        "relax.split",
        &[
            ("indices_or_sections", AttrLit::Int(2)),
            ("axis", AttrLit::Int(1)),
        ],
    );
    assert_eq!(
        ok(&sp, &[&t(&[1, 8])]),
        Type::Tuple(vec![t(&[1, 4]), t(&[1, 4])])
    );
    assert_eq!(
        ok(&sp, &[&t(&[1, 5])]),
        Type::Tuple(vec![t(&[1, 3]), t(&[1, 2])])
    );
    let sym = ok(&sp, &[&td(&[d(1), n()], DType::F32)]);
    let part = n().add(&d(1)).floor_div(&d(2));
    assert_eq!(
        sym,
        Type::Tuple(vec![
            td(&[d(1), part.clone()], DType::F32),
            td(&[d(1), part], DType::F32)
        ])
    );
    let idx = op("relax.split", &[("indices_or_sections", ints(&[2, 5]))]);
    assert_eq!(
        ok(&idx, &[&t(&[8])]),
        Type::Tuple(vec![t(&[2]), t(&[3]), t(&[3])])
    );
    assert_eq!(
        ok(&idx, &[&td(&[n()], DType::F32)]),
        Type::Tuple(vec![t(&[2]), t(&[3]), td(&[n().sub(&d(5))], DType::F32)])
    );
    let e = err(&sp, &[&t(&[8])]);
    assert!(e.contains("axis 1 is out of range"), "{e}");
}

#[test]
fn strided_slice_and_take() {
    let ss = |axes: &[i64], b: &[i64], e: &[i64], st: Option<&[i64]>| {
        let mut kw = vec![("axes", ints(axes)), ("begin", ints(b)), ("end", ints(e))];
        if let Some(st) = st {
            kw.push(("strides", ints(st)));
        }
        op("relax.strided_slice", &kw)
    };
    let x = t(&[10, 4]);
    assert_eq!(ok(&ss(&[0], &[2], &[5], None), &[&x]), t(&[3, 4]));
    assert_eq!(ok(&ss(&[0], &[-3], &[100], None), &[&x]), t(&[3, 4]));
    assert_eq!(
        ok(&ss(&[0, 1], &[0, 1], &[10, 4], Some(&[3, 2])), &[&x]),
        t(&[4, 2])
    );
    assert_eq!(ok(&ss(&[0], &[9], &[-11], Some(&[-1])), &[&x]), t(&[10, 4]));
    assert_eq!(ok(&ss(&[0], &[5], &[2], None), &[&x]), t(&[0, 4]));
    let y = td(&[n(), d(4)], DType::F32);
    assert_eq!(
        ok(&ss(&[0], &[1], &[i64::MAX], None), &[&y]),
        td(&[n().sub(&d(1)), d(4)], DType::F32)
    );
    let e = err(&ss(&[2], &[0], &[1], None), &[&x]);
    assert!(e.contains("axis 2 is out of range"), "{e}");

    let tk = default_instance("relax.take");
    let idx = Type::tensor(&[5], DType::I64);
    assert_eq!(ok(&tk, &[&x, &idx]), t(&[5]));
    let tk1 = op("relax.take", &[("axis", AttrLit::Int(0))]);
    let emb = td(&[d(1000), d(64)], DType::F32);
    let ids = td(&[n(), d(7)], DType::I32);
    assert_eq!(ok(&tk1, &[&emb, &ids]), td(&[n(), d(7), d(64)], DType::F32));
    let e = err(&tk1, &[&emb, &t(&[3])]);
    assert!(e.contains("integer dtype") && e.contains("float32"), "{e}");
}

#[test]
fn unknown_shapes_and_extreme_attrs_do_not_panic() {
    let unk = Type::Tensor(TensorType {
        dims: None,
        ndim: None,
        dtype: None,
    });
    let r4 = Type::Tensor(TensorType {
        dims: None,
        ndim: Some(4),
        dtype: None,
    });
    let sh = Type::Shape {
        dims: None,
        ndim: None,
    };
    let p = Type::Prim(DType::F32);
    let tup = Type::Tuple(vec![unk.clone(), r4.clone()]);
    for o in samples() {
        for args in [
            vec![&unk, &unk, &unk, &unk, &unk],
            vec![&r4, &r4, &r4, &r4, &r4],
            vec![&r4, &sh],
            vec![&unk, &p, &p],
            vec![&tup],
            vec![],
        ] {
            let sig = Op::signature(o.name()).map_or(0, |s| s.max_args);
            let args: Vec<&Type> = args.into_iter().take(sig).collect();
            let _ = o.infer(&args);
        }
    }
    let big = i64::MAX;
    let conv = op(
        "relax.nn.conv2d",
        &[
            ("padding", ints(&[big, big])),
            ("strides", ints(&[big, big])),
        ],
    );
    let _ = conv.infer(&[&t(&[1, 3, 8, 8]), &t(&[4, 3, 3, 3])]);
    let pool = op(
        "relax.nn.avg_pool2d",
        &[
            ("padding", ints(&[big])),
            ("ceil_mode", AttrLit::Bool(true)),
            ("strides", ints(&[big])),
        ],
    );
    let _ = pool.infer(&[&t(&[1, 3, 8, 8])]);
    let sl = op(
        "relax.strided_slice",
        &[
            ("axes", ints(&[0])),
            ("begin", ints(&[i64::MIN])),
            ("end", ints(&[big])),
            ("strides", ints(&[big])),
        ],
    );
    assert_eq!(ok(&sl, &[&t(&[10])]), t(&[1]));
    let sl = op(
        "relax.strided_slice",
        &[
            ("axes", ints(&[0])),
            ("begin", ints(&[big])),
            ("end", ints(&[i64::MIN])),
            ("strides", ints(&[i64::MIN])),
        ],
    );
    assert_eq!(ok(&sl, &[&t(&[10])]), t(&[1]));
    let sp = op("relax.split", &[("indices_or_sections", AttrLit::Int(big))]);
    let e = err(&sp, &[&t(&[10])]);
    assert!(e.contains("at most"), "{e}");
    let r = Op::Reshape;
    let _ = r.infer(&[&t(&[big, big]), &shape(&[d(-1)])]);
    let _ = r.infer(&[&t(&[i64::MIN]), &shape(&[d(-1), d(0)])]);
}

#[test]
fn index_ops_attrs() {
    fn names(o: &Op) -> Vec<&str> {
        o.kwargs().into_iter().map(|(k, _)| k).collect()
    }
    let pad = op("relax.nn.pad", &[("pad_width", ints(&[1, 1]))]);
    assert_eq!(names(&pad), ["pad_width", "pad_value", "pad_mode"]);
    assert_eq!(
        names(&op("relax.cumsum", &[])),
        ["axis", "dtype", "exclusive"]
    );
    assert_eq!(
        names(&op("relax.scatter_elements", &[])),
        ["axis", "reduction"]
    );
    assert_eq!(
        op("relax.scatter_nd", &[]).kwargs(),
        vec![("reduction", s("update"))]
    );
    // Python-API positional order, and TVM's spellings of the pad modes and reductions.
    assert_eq!(
        Op::signature("relax.nn.pad").map(|s| s.attr_names),
        Some(&["pad_width", "pad_mode", "pad_value"][..])
    );
    let edge = op(
        "relax.nn.pad",
        &[("pad_width", ints(&[1, 1])), ("pad_mode", s("edge"))],
    );
    assert_eq!(edge.kwargs()[2], ("pad_mode", s("replicate")));
    // arange(n) is arange(0, n); integer literals give int64, floats float32.
    let a = op("relax.arange", &[("start", AttrLit::Int(5))]);
    assert_eq!(ok(&a, &[]), Type::tensor(&[5], DType::I64));
    let a = op(
        "relax.arange",
        &[("start", AttrLit::Float(1.0)), ("end", AttrLit::Int(2))],
    );
    assert_eq!(ok(&a, &[]), Type::tensor(&[1], DType::F32));
    assert_eq!(
        exclusive_zero(),
        Op::Cumsum(Box::new(ScanAttrs {
            axis: Some(1),
            dtype: None,
            exclusive: false
        }))
    );
    for (name, kw, want) in [
        (
            "relax.one_hot",
            vec![],
            "missing required attribute `depth`",
        ),
        (
            "relax.one_hot",
            vec![("depth", AttrLit::Int(-1))],
            "must not be negative",
        ),
        (
            "relax.tile",
            vec![("repeats", ints(&[2, -1]))],
            "must not be negative",
        ),
        (
            "relax.nn.pad",
            vec![("pad_width", ints(&[1]))],
            "even number",
        ),
        (
            "relax.nn.pad",
            vec![("pad_width", ints(&[1, 1])), ("pad_mode", s("mirror"))],
            "\"mirror\"",
        ),
        (
            "relax.scatter_nd",
            vec![("reduction", s("mean"))],
            "\"mean\"",
        ),
        (
            "relax.gather_nd",
            vec![("batch_dims", AttrLit::Int(-1))],
            "must not be negative",
        ),
        (
            "relax.arange",
            vec![
                ("start", AttrLit::Int(0)),
                ("end", AttrLit::Int(4)),
                ("step", AttrLit::Int(0)),
            ],
            "not 0",
        ),
        (
            "relax.arange",
            vec![
                ("start", AttrLit::Float(0.5)),
                ("end", AttrLit::Int(4)),
                ("dtype", s("int32")),
            ],
            "must be integers",
        ),
    ] {
        let e = op_err(name, &kw);
        assert!(e.contains(want), "{name}: {e}");
    }
    assert_eq!(op("relax.tril", &[]).fusion_kind(), FusionKind::ElemWise);
    assert_eq!(
        op("relax.gather_nd", &[]).fusion_kind(),
        FusionKind::Injective
    );
    assert_eq!(op("relax.cumsum", &[]).fusion_kind(), FusionKind::Opaque);
}

fn exclusive_zero() -> Op {
    op(
        "relax.cumsum",
        &[("axis", AttrLit::Int(1)), ("exclusive", AttrLit::Int(0))],
    )
}

#[test]
fn index_ops_infer() {
    let i64t = |dims: &[Dim]| td(dims, DType::I64);
    let x = td(&[n(), d(3), d(4)], DType::F32);
    // gather_elements: the indices' shape, the data's dtype.
    let ge = op("relax.gather_elements", &[("axis", AttrLit::Int(1))]);
    assert_eq!(
        ok(&ge, &[&x, &i64t(&[n(), d(5), d(4)])]),
        td(&[n(), d(5), d(4)], DType::F32)
    );
    let e = err(&ge, &[&x, &i64t(&[n(), d(5)])]);
    assert!(e.contains("rank 3") && e.contains("rank 2"), "{e}");
    let e = err(&ge, &[&x, &td(&[n(), d(5), d(4)], DType::F32)]);
    assert!(e.contains("integer dtype"), "{e}");
    // gather_nd: indices' leading dims, then the data's dims after the indexed ones.
    let gn = op("relax.gather_nd", &[]);
    assert_eq!(
        ok(&gn, &[&x, &i64t(&[d(7), d(2)])]),
        td(&[d(7), d(4)], DType::F32)
    );
    let gn1 = op("relax.gather_nd", &[("batch_dims", AttrLit::Int(1))]);
    assert_eq!(
        ok(&gn1, &[&x, &i64t(&[n(), d(2), d(1)])]),
        td(&[n(), d(2), d(4)], DType::F32)
    );
    let e = err(&gn, &[&x, &i64t(&[d(7), d(4)])]);
    assert!(e.contains("last dim of indices"), "{e}");
    // scatters keep the data's type and check the updates.
    let se = op("relax.scatter_elements", &[]);
    let idx = i64t(&[d(2), d(3), d(4)]);
    let upd = td(&[d(2), d(3), d(4)], DType::F32);
    assert_eq!(ok(&se, &[&x, &idx, &upd]), x);
    let e = err(&se, &[&x, &idx, &td(&[d(2), d(3), d(5)], DType::F32)]);
    assert!(e.contains("shape of indices"), "{e}");
    let sn = op("relax.scatter_nd", &[]);
    let t2 = t(&[4, 5, 6]);
    assert_eq!(ok(&sn, &[&t2, &i64t(&[d(3), d(2)]), &t(&[3, 6])]), t2);
    let e = err(&sn, &[&t2, &i64t(&[d(3), d(2)]), &t(&[3, 5])]);
    assert!(e.contains("expected updates of shape (3, 6)"), "{e}");
    let e = err(
        &sn,
        &[&t2, &i64t(&[d(3), d(2)]), &td(&[d(3), d(6)], DType::F16)],
    );
    assert!(e.contains("dtype"), "{e}");
    let mean_nd = Op::ScatterNd {
        reduction: ScatterReduction::Mean,
    };
    let e = err(&mean_nd, &[&t2, &i64t(&[d(3), d(2)]), &t(&[3, 6])]);
    assert!(e.contains("only defined for scatter_elements"), "{e}");
    // one_hot: a new axis; the dtype of the fill values.
    let oh = op("relax.one_hot", &[("depth", AttrLit::Int(10))]);
    let ids = i64t(&[n(), d(3)]);
    let pf = Type::Prim(DType::F32);
    assert_eq!(
        ok(&oh, &[&ids, &pf, &pf]),
        td(&[n(), d(3), d(10)], DType::F32)
    );
    let oh0 = op(
        "relax.one_hot",
        &[("depth", AttrLit::Int(10)), ("axis", AttrLit::Int(0))],
    );
    let pi = Type::Prim(DType::I64);
    assert_eq!(
        ok(&oh0, &[&ids, &pi, &pi]),
        td(&[d(10), n(), d(3)], DType::I64)
    );
    let h = Type::tensor(&[], DType::F16);
    assert_eq!(
        ok(&oh, &[&ids, &h, &h]),
        td(&[n(), d(3), d(10)], DType::F16)
    );
    let e = err(
        &oh,
        &[&ids, &Type::Prim(DType::F64), &Type::Prim(DType::F64)],
    );
    assert!(e.contains("float64 prim value is not supported"), "{e}");
    let e = err(&oh, &[&ids, &h, &pf]);
    assert!(e.contains("one dtype"), "{e}");
    // arange: ceil((end - start) / step) elements, never negative.
    let ar = |s: f64, e: f64, st: f64| {
        op(
            "relax.arange",
            &[
                ("start", AttrLit::Float(s)),
                ("end", AttrLit::Float(e)),
                ("step", AttrLit::Float(st)),
            ],
        )
    };
    assert_eq!(ok(&ar(0.0, 10.0, 3.0), &[]), t(&[4]));
    assert_eq!(ok(&ar(10.0, 4.0, -2.0), &[]), t(&[3]));
    assert_eq!(ok(&ar(5.0, 1.0, 1.0), &[]), t(&[0]));
    let e = err(&ar(0.0, 1e300, 1e-300), &[]);
    assert!(e.contains("too many elements"), "{e}");
    // tile aligns repeats and dims on the right.
    let ti = op("relax.tile", &[("repeats", ints(&[2, 1, 3]))]);
    assert_eq!(
        ok(&ti, &[&td(&[n(), d(4)], DType::F32)]),
        td(&[d(2), n(), d(12)], DType::F32)
    );
    let ti = op("relax.tile", &[("repeats", ints(&[2]))]);
    assert_eq!(ok(&ti, &[&t(&[3, 4])]), t(&[3, 8]));
    // tril / triu need a matrix.
    let tr = op("relax.tril", &[("k", AttrLit::Int(1))]);
    assert_eq!(ok(&tr, &[&x]), x);
    assert!(err(&tr, &[&t(&[4])]).contains("rank at least 2"));
    // scans: same shape (or flattened with axis=None), dtype override.
    let cs = op(
        "relax.cumsum",
        &[("axis", AttrLit::Int(-1)), ("dtype", s("float64"))],
    );
    assert_eq!(ok(&cs, &[&x]), td(&[n(), d(3), d(4)], DType::F64));
    let cf = op("relax.cumprod", &[]);
    assert_eq!(ok(&cf, &[&t(&[3, 4])]), t(&[12]));
    assert!(err(&op("relax.cumsum", &[("axis", AttrLit::Int(3))]), &[&x]).contains("out of range"));
    // pad: before + after per axis; cropping below zero is an error.
    let pd = op("relax.nn.pad", &[("pad_width", ints(&[0, 0, 1, 2, -1, 0]))]);
    assert_eq!(ok(&pd, &[&x]), td(&[n(), d(6), d(3)], DType::F32));
    let e = err(&pd, &[&t(&[3, 4])]);
    assert!(e.contains("expected pad_width to have 4 values"), "{e}");
    let crop = op("relax.nn.pad", &[("pad_width", ints(&[-2, -2]))]);
    assert!(err(&crop, &[&t(&[3])]).contains("below zero"));
}

#[test]
fn window_extents_are_exact_or_an_error_never_wrapped() {
    let x = t(&[1, 1, 4, 4]);
    let w = t(&[1, 1, 3, 3]);
    // dilation 2^62: (k - 1) * d overflows i64; it used to leave an unprintable dim.
    let c = op("relax.nn.conv2d", &[("dilation", ints(&[1 << 62, 1]))]);
    let e = err(&c, &[&x, &w]);
    assert!(e.starts_with("relax.nn.conv2d: "), "{e}");
    // pads of 2^40 on both sides: 2^41 + 2 is beyond what the parser reads back.
    let c = op(
        "relax.nn.conv2d",
        &[("padding", ints(&[1 << 40, 0, 1 << 40, 0]))],
    );
    let e = err(&c, &[&x, &w]);
    assert!(
        e.contains("the result dim `2199023255554` is out of range"),
        "{e}"
    );
    // Huge pads and a huge stride whose exact result is small: computed exactly.
    let c = op(
        "relax.nn.conv2d",
        &[
            ("padding", ints(&[1 << 62, 0, 1 << 62, 0])),
            ("strides", ints(&[1 << 62, 1])),
        ],
    );
    assert_eq!(ok(&c, &[&x, &w]), t(&[1, 1, 3, 2]));
    // adaptive pooling to 2^40 + 1 rows.
    let p = op(
        "relax.nn.adaptive_avg_pool2d",
        &[("output_size", ints(&[(1 << 40) + 1, 1]))],
    );
    let e = err(&p, &[&x]);
    assert!(e.contains("out of range"), "{e}");
}

#[test]
fn grid_sample_and_affine_grid_infer_channel_first_grids() {
    let gs = op("relax.image.grid_sample", &[]);
    // (N, C, H, W) sampled at a (N, 2, Ho, Wo) grid.
    let x = td(&[n(), d(3), d(8), d(8)], DType::F32);
    let g = td(&[n(), d(2), d(4), d(5)], DType::F32);
    assert_eq!(ok(&gs, &[&x, &g]), td(&[n(), d(3), d(4), d(5)], DType::F32));
    // Volumetric.
    let gs3 = op("relax.image.grid_sample", &[("layout", s("NCDHW"))]);
    let x3 = t(&[1, 2, 4, 4, 4]);
    let g3 = t(&[1, 3, 2, 3, 5]);
    assert_eq!(ok(&gs3, &[&x3, &g3]), t(&[1, 2, 2, 3, 5]));
    // Errors: a channel-last grid, a batch mismatch, a wrong rank, integer data.
    assert!(err(&gs, &[&t(&[1, 3, 8, 8]), &t(&[1, 4, 5, 2])]).contains("2 coordinates"));
    assert!(err(&gs, &[&t(&[1, 3, 8, 8]), &t(&[2, 2, 4, 5])]).contains("batch"));
    assert!(err(&gs, &[&x3, &g3]).contains("4-D"));
    let xi = Type::tensor(&[1, 3, 8, 8], DType::I32);
    assert!(err(&gs, &[&xi, &t(&[1, 2, 4, 5])]).contains("float"));
    // Unknown grid dims keep the rank.
    let g_unknown = Type::Tensor(TensorType {
        dims: None,
        ndim: Some(4),
        dtype: Some(DType::F32),
    });
    assert_eq!(
        ok(&gs, &[&t(&[1, 3, 8, 8]), &g_unknown]),
        Type::Tensor(TensorType {
            dims: None,
            ndim: Some(4),
            dtype: Some(DType::F32),
        })
    );

    let ag = op("relax.image.affine_grid", &[]);
    let theta = td(&[n(), d(2), d(3)], DType::F32);
    assert_eq!(
        ok(&ag, &[&theta, &shape(&[d(4), d(5)])]),
        td(&[n(), d(2), d(4), d(5)], DType::F32)
    );
    assert_eq!(
        ok(&ag, &[&t(&[2, 3, 4]), &shape(&[d(2), d(3), d(4)])]),
        t(&[2, 3, 2, 3, 4])
    );
    assert!(err(&ag, &[&t(&[2, 3, 4]), &shape(&[d(4), d(5)])]).contains("(N, 2, 3)"));
    assert!(err(&ag, &[&theta, &shape(&[d(4)])]).contains("2 (height, width)"));
    assert!(err(&ag, &[&theta, &shape(&[d(0), d(5)])]).contains("≥ 1"));
}

#[test]
fn reverse_sequence_keeps_the_data_type_and_checks_its_lengths() {
    let o = op("relax.reverse_sequence", &[]);
    assert_eq!(
        o,
        Op::ReverseSequence {
            seq_axis: 1,
            batch_axis: 0
        }
    );
    let x = td(&[n(), d(7), d(3)], DType::F32);
    let lens = td(&[n()], DType::I64);
    assert_eq!(ok(&o, &[&x, &lens]), x);
    let x5 = td(&[d(5), d(7), d(3)], DType::F32);
    assert!(err(&o, &[&x5, &td(&[d(4)], DType::I64)]).contains("one sequence length per batch"));
    assert!(err(&o, &[&x, &td(&[n()], DType::F32)]).contains("integer"));
    let same = op(
        "relax.reverse_sequence",
        &[
            ("seq_axis", AttrLit::Int(0)),
            ("batch_axis", AttrLit::Int(-3)),
        ],
    );
    assert!(err(&same, &[&x, &lens]).contains("same axis"));
    assert!(err(&o, &[&t(&[5]), &lens]).contains("rank at least 2"));
}

#[test]
fn grid_sample_attributes_default_check_and_print_in_tvm_order() {
    let o = op("relax.image.grid_sample", &[]);
    let Op::GridSample(a) = &o else {
        unreachable!("{o:?}")
    };
    assert_eq!(
        (
            a.method.as_str(),
            a.layout.as_str(),
            a.padding_mode.as_str()
        ),
        ("bilinear", "NCHW", "zeros")
    );
    assert!(!a.align_corners);
    assert_eq!(a.spatial(), 2);
    let names: Vec<&str> = o.kwargs().iter().map(|(k, _)| *k).collect();
    assert_eq!(names, ["method", "layout", "padding_mode", "align_corners"]);
    let o3 = op(
        "relax.image.grid_sample",
        &[
            ("method", s("nearest")),
            ("layout", s("NCDHW")),
            ("padding_mode", s("reflection")),
            ("align_corners", AttrLit::Bool(true)),
        ],
    );
    let kw: Vec<(String, AttrLit)> = o3
        .kwargs()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(Op::from_call(o3.name(), &kw), Ok(o3.clone()));
    for (k, v, want) in [
        ("method", "linear", "bicubic"),
        ("padding_mode", "wrap", "reflection"),
        ("layout", "NHWC", "NCDHW"),
    ] {
        assert!(
            op_err("relax.image.grid_sample", &[(k, s(v))]).contains(want),
            "{k}={v}"
        );
    }
    let e = op_err(
        "relax.image.grid_sample",
        &[("method", s("bicubic")), ("layout", s("NCDHW"))],
    );
    assert!(e.contains("2-D only"), "{e}");
    assert_eq!(
        op("relax.image.affine_grid", &[]),
        Op::AffineGrid {
            align_corners: true
        }
    );
    let near = |a: &[f64], b: &[f64]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-15)
    };
    assert!(near(
        &affine_grid_base(4, true),
        &[-1.0, -1.0 / 3.0, 1.0 / 3.0, 1.0]
    ));
    assert_eq!(affine_grid_base(4, false), vec![-0.75, -0.25, 0.25, 0.75]);
    assert_eq!(affine_grid_base(1, true), vec![-1.0]);
    assert_eq!(affine_grid_base(1, false), vec![0.0]);
}

#[test]
fn split_layouts_in_conv_pool_and_layout_transform() {
    // Shapes as TVM 0.27 infers them for the same calls (printed by its TVMScript parser).
    let to16 = op(
        "relax.layout_transform",
        &[(
            "index_map",
            s("lambda n, c, h, w: (n, c // 16, h, w, c % 16)"),
        )],
    );
    assert_eq!(ok(&to16, &[&t(&[1, 64, 14, 14])]), t(&[1, 4, 14, 14, 16]));
    let e = err(&to16, &[&t(&[1, 60, 14, 14])]);
    assert!(e.contains("multiple of 16"), "{e}");
    let e = err(&to16, &[&t(&[1, 64, 14])]);
    assert!(e.contains("rank 3"), "{e}");
    let back = op(
        "relax.layout_transform",
        &[(
            "index_map",
            s("lambda n, c, h, w, c1: (n, c * 16 + c1, h, w)"),
        )],
    );
    assert_eq!(ok(&back, &[&t(&[1, 8, 12, 12, 16])]), t(&[1, 128, 12, 12]));
    assert_eq!(back.fusion_kind(), FusionKind::Injective);
    // Round trip through the printed attributes.
    assert_eq!(
        op(
            back.name(),
            &back
                .kwargs()
                .iter()
                .map(|(k, v)| (*k, v.clone()))
                .collect::<Vec<_>>()
        ),
        back
    );
    let e = op_err(
        "relax.layout_transform",
        &[
            ("index_map", s("lambda a: (a,)")),
            ("pad_value", AttrLit::Float(0.0)),
        ],
    );
    assert!(e.contains("pad_value"), "{e}");

    let conv = op(
        "relax.nn.conv2d",
        &[
            ("data_layout", s("NCHW16c")),
            ("kernel_layout", s("OIHW")),
            ("out_layout", s("NCHW16c")),
        ],
    );
    assert_eq!(
        ok(&conv, &[&t(&[1, 4, 14, 14, 16]), &t(&[128, 64, 1, 1])]),
        t(&[1, 8, 14, 14, 16])
    );
    let e = err(&conv, &[&t(&[1, 4, 14, 14, 16]), &t(&[120, 64, 1, 1])]);
    assert!(e.contains("multiple of 16"), "{e}");
    let e = err(&conv, &[&t(&[1, 4, 14, 14, 8]), &t(&[128, 64, 1, 1])]);
    assert!(e.contains("extent 16"), "{e}");
    let e = err(&conv, &[&t(&[1, 64, 14, 14]), &t(&[128, 64, 1, 1])]);
    assert!(e.contains("5-D"), "{e}");
    let kb = op(
        "relax.nn.conv2d",
        &[
            ("kernel_layout", s("OIHW16i16o")),
            ("padding", ints(&[1, 1])),
        ],
    );
    assert_eq!(
        ok(&kb, &[&t(&[1, 32, 8, 8]), &t(&[2, 2, 3, 3, 16, 16])]),
        t(&[1, 32, 8, 8])
    );
    let e = op_err("relax.nn.conv2d", &[("data_layout", s("NCHW16"))]);
    assert!(e.contains("sub-axis"), "{e}");

    let pool = op(
        "relax.nn.max_pool2d",
        &[
            ("pool_size", ints(&[3, 3])),
            ("strides", ints(&[2, 2])),
            ("padding", ints(&[1, 1])),
            ("layout", s("NCHW16c")),
        ],
    );
    assert_eq!(ok(&pool, &[&t(&[1, 4, 14, 14, 16])]), t(&[1, 4, 7, 7, 16]));
    let gap = op(
        "relax.nn.adaptive_avg_pool2d",
        &[
            ("output_size", ints(&[1, 1])),
            ("layout", s("NCHW16c")),
            ("out_layout", s("NCHW")),
        ],
    );
    assert_eq!(ok(&gap, &[&t(&[1, 4, 7, 7, 16])]), t(&[1, 64, 1, 1]));
}

#[test]
fn value_dependent_ops_leave_their_extents_out_of_the_type() {
    let x = td(&[n(), d(4)], DType::F32);
    let rank2 = |dtype| {
        Type::Tensor(TensorType {
            dims: None,
            ndim: Some(2),
            dtype: Some(dtype),
        })
    };
    let rank1 = |dtype| {
        Type::Tensor(TensorType {
            dims: None,
            ndim: Some(1),
            dtype: Some(dtype),
        })
    };
    assert_eq!(ok(&op("relax.nonzero", &[]), &[&x]), rank2(DType::I64));
    // unique: the values alone, or a tuple with the outputs asked for, in order.
    let u = op("relax.unique", &[]);
    assert_eq!(ok(&u, &[&x]), rank1(DType::F32));
    let u = op(
        "relax.unique",
        &[
            ("return_inverse", AttrLit::Bool(true)),
            ("return_counts", AttrLit::Bool(true)),
            ("axis", AttrLit::Int(-1)),
        ],
    );
    assert_eq!(
        ok(&u, &[&x]),
        Type::Tuple(vec![
            rank2(DType::F32),
            rank1(DType::I64),
            rank1(DType::I64)
        ])
    );
    let u3 = op("relax.unique", &[("axis", AttrLit::Int(2))]);
    assert!(err(&u3, &[&x]).contains("out of range"));
    // all_class_non_max_suppression: B·C·N rows of triples and the count.
    let nms = op("relax.vision.all_class_non_max_suppression", &[]);
    let boxes = td(&[d(2), d(6), d(4)], DType::F32);
    let scores = td(&[d(2), d(3), d(6)], DType::F32);
    let one_i = td(&[d(1)], DType::I64);
    let one_f = td(&[], DType::F32);
    assert_eq!(
        ok(&nms, &[&boxes, &scores, &one_i, &one_f, &one_f]),
        Type::Tuple(vec![
            td(&[d(36), d(3)], DType::I64),
            td(&[d(1)], DType::I64)
        ])
    );
    let five = td(&[d(2), d(5), d(4)], DType::F32);
    assert!(err(&nms, &[&five, &scores, &one_i, &one_f, &one_f]).contains("disagree"));
    let two = td(&[d(2)], DType::F32);
    assert!(err(&nms, &[&boxes, &scores, &one_i, &two, &one_f]).contains("one value"));
    let e = op_err(
        "relax.vision.all_class_non_max_suppression",
        &[("output_format", s("tensorflow"))],
    );
    assert!(e.contains("only \"onnx\""), "{e}");
}

#[test]
fn roi_align_attributes_default_check_print_in_tvm_order_and_infer() {
    let o = op(
        "relax.vision.roi_align",
        &[
            ("pooled_size", ints(&[7])),
            ("spatial_scale", AttrLit::Float(0.25)),
        ],
    );
    let Op::RoiAlign(a) = &o else {
        unreachable!("{o:?}")
    };
    assert_eq!(a.pooled_size, [7, 7]);
    assert_eq!((a.sample_ratio, a.aligned), (-1, false));
    assert_eq!((a.layout.as_str(), a.mode.as_str()), ("NCHW", "avg"));
    let names: Vec<&str> = o.kwargs().iter().map(|(k, _)| *k).collect();
    assert_eq!(
        names,
        [
            "pooled_size",
            "spatial_scale",
            "sample_ratio",
            "aligned",
            "layout",
            "mode"
        ]
    );
    assert_eq!(op("relax.vision.roi_align", &o.kwargs()), o);
    // Required attributes, closed sets, sizes.
    let scale = ("spatial_scale", AttrLit::Float(1.0));
    assert!(
        op_err("relax.vision.roi_align", &[("pooled_size", ints(&[2]))])
            .contains("missing required attribute `spatial_scale`")
    );
    assert!(op_err("relax.vision.roi_align", std::slice::from_ref(&scale)).contains("pooled_size"));
    for bad in [
        ("pooled_size", ints(&[0, 2])),
        ("pooled_size", ints(&[1, 2, 3])),
        ("mode", AttrLit::Str("min".into())),
        ("layout", AttrLit::Str("NCDHW".into())),
    ] {
        let mut kw = vec![("pooled_size", ints(&[2])), scale.clone()];
        kw.retain(|(k, _)| *k != bad.0);
        kw.push(bad.clone());
        assert!(
            op_err("relax.vision.roi_align", &kw).contains(bad.0),
            "{bad:?}"
        );
    }
    let inf = op_err(
        "relax.vision.roi_align",
        &[
            ("pooled_size", ints(&[2])),
            ("spatial_scale", AttrLit::Float(f64::INFINITY)),
        ],
    );
    assert!(inf.contains("finite"), "{inf}");
    // (R, C, PH, PW), or (R, PH, PW, C) for NHWC; symbolic box counts flow through.
    let x = td(
        &[n(), Dim::Static(16), Dim::Static(50), Dim::Static(40)],
        DType::F32,
    );
    let rois = td(&[Dim::sym("k"), Dim::Static(5)], DType::F32);
    let want = td(
        &[
            Dim::sym("k"),
            Dim::Static(16),
            Dim::Static(7),
            Dim::Static(7),
        ],
        DType::F32,
    );
    assert_eq!(ok(&o, &[&x, &rois]), want);
    let nhwc = op(
        "relax.vision.roi_align",
        &[
            ("pooled_size", ints(&[3, 2])),
            scale,
            ("layout", AttrLit::Str("NHWC".into())),
        ],
    );
    assert_eq!(
        ok(&nhwc, &[&x, &rois]),
        td(
            &[
                Dim::sym("k"),
                Dim::Static(3),
                Dim::Static(2),
                Dim::Static(40)
            ],
            DType::F32
        )
    );
    assert!(err(&o, &[&x, &t(&[3, 4])]).contains("(num_roi, 5)"));
    assert!(err(&o, &[&t(&[1, 2, 3]), &rois]).contains("4-D"));
    let ints_rois = Type::tensor(&[3, 5], DType::I64);
    assert!(err(&o, &[&x, &ints_rois]).contains("float"));
}

#[test]
fn bitcast_keeps_the_shape_and_needs_equal_widths() {
    let o = op("relax.bitcast", &[("dtype", s("int32"))]);
    assert_eq!(o.kwargs(), vec![("dtype", s("int32"))]);
    let x = td(&[n(), Dim::Static(3)], DType::F32);
    assert_eq!(ok(&o, &[&x]), td(&[n(), Dim::Static(3)], DType::I32));
    let wide = td(&[n()], DType::F64);
    let e = err(&o, &[&wide]);
    assert!(e.contains("float64 (8 bytes) as int32 (4 bytes)"), "{e}");
    assert!(op_err("relax.bitcast", &[]).contains("dtype"));
}

#[test]
fn det_drops_the_matrix_axes() {
    let o = op("relax.det", &[]);
    let x = td(&[n(), Dim::sym("m"), Dim::sym("m")], DType::F32);
    assert_eq!(ok(&o, &[&x]), td(&[n()], DType::F32));
    assert_eq!(ok(&o, &[&t(&[4, 4])]), td(&[], DType::F32));
    assert!(err(&o, &[&t(&[2, 3])]).contains("2 × 3"));
    assert!(err(&o, &[&t(&[3])]).contains("square"));
    assert!(err(&o, &[&Type::tensor(&[2, 2], DType::I64)]).contains("float"));
}
