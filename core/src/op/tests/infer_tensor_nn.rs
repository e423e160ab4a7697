//! Type inference of the elementwise, linear-algebra, nn, reduction and pooling ops: shapes
//! with symbols, broadcasting, layouts and the errors for what does not fit.

use super::*;

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
