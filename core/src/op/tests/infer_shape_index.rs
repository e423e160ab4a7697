//! Type inference of the shape and layout, indexing and image ops: reshapes, concat/split,
//! slices, gathers and scatters, value-dependent extents, grid sampling and ROI align.

use super::*;

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
