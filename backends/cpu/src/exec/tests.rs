//! The executor's unit tests: facts, drop plans, fused convolutions and the direct path.

#![allow(clippy::panic, reason = "test code: a failure is a panic")]

use super::*;
use fusebox_core::text::parse_module_str;

#[test]
fn kept_facts_serve_only_the_function_they_were_derived_from() {
    let t = "R.Tensor((2,), dtype=\"float32\")";
    let src = format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def inner(x: {t}) -> {t}:\n        a: {t} = R.nn.relu(x)\n        b: {t} = R.add(a, a)\n        return b\n    @R.function\n    def main(x: {t}) -> {t}:\n        y: {t} = cls.inner(x)\n        return y\n"
    );
    let mut m = parse_module_str(&src).unwrap_or_else(|e| panic!("{e}"));
    let ex = Executor::new();
    let run = |ex: &Executor, m: &Module| {
        let x = Tensor::from_f32(vec![2], vec![-1.5, 2.0]).unwrap_or_else(|e| panic!("{e}"));
        match ex.run(m, "main", vec![Value::Tensor(x)], None) {
            Ok(Value::Tensor(t)) => t.as_f32().map(<[f32]>::to_vec),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(run(&ex, &m), Some(vec![0.0, 4.0]));
    // A function that calls another has none (what a chain takes in depends on the callee).
    let main = m.get("main").unwrap_or_else(|| panic!("no main"));
    assert!(ex.facts(&m, main, false, true).is_none());
    // The callee's were kept by the run, and are handed out again.
    let inner = m.get("inner").unwrap_or_else(|| panic!("no inner"));
    let (Some(first), Some(again)) = (
        ex.facts(&m, inner, false, true),
        ex.facts(&m, inner, false, true),
    ) else {
        panic!("no facts for a function without calls")
    };
    assert!(Arc::ptr_eq(&first, &again));
    let at = std::ptr::from_ref(inner) as usize;
    // The same address with other contents: `add(a, a)` becomes `add(a, x)`. The kept
    // entry must not serve it (its drop plan would free `x` too early, say).
    let Some(f) = m.functions.get_mut("inner") else {
        panic!("no inner")
    };
    let (Some(&x), Some(b)) = (f.params.first(), f.bindings().nth(1).copied()) else {
        panic!("unexpected inner")
    };
    let x_expr = f.add_expr(ExprKind::Var(x), f.var(x).ty.clone());
    if let ExprKind::Call { args, .. } = &mut f.exprs[b.value].kind {
        args[1] = x_expr;
    }
    let inner = m.get("inner").unwrap_or_else(|| panic!("no inner"));
    assert_eq!(std::ptr::from_ref(inner) as usize, at);
    let Some(now) = ex.facts(&m, inner, false, true) else {
        panic!("no facts")
    };
    assert!(!Arc::ptr_eq(&first, &now));
    assert!(now.func.as_ref() == Some(inner));
    assert_eq!(run(&ex, &m), Some(vec![-1.5, 4.0]));
}

#[test]
fn values_are_dropped_after_their_last_use() {
    let src = "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor((2,), dtype=\"float32\"), unused: R.Tensor((2,), dtype=\"float32\")) -> R.Tensor((2,), dtype=\"float32\"):\n        a: R.Tensor((2,), dtype=\"float32\") = R.nn.relu(x)\n        dead: R.Tensor((2,), dtype=\"float32\") = R.nn.relu(a)\n        b: R.Tensor((2,), dtype=\"float32\") = R.nn.relu(a)\n        c: R.Tensor((2,), dtype=\"float32\") = R.add(a, b)\n        return c\n";
    let m = parse_module_str(src).unwrap_or_else(|e| panic!("{e}"));
    let Some(f) = m.get("main") else {
        panic!("no main")
    };
    let (plan, unused) = drop_plan(f);
    assert_eq!(unused, vec![false, true]);
    let names: Vec<Vec<&str>> = plan
        .iter()
        .map(|vs| vs.iter().map(|&v| f.var(v).name.as_str()).collect())
        .collect();
    // x after `a`; `dead` right away (nothing reads it); a and b after `c`; c never.
    assert_eq!(names, vec![vec!["x"], vec!["dead"], vec![], vec!["a", "b"]]);
}

/// conv2d → bias add → residual add → relu (a ResNet block's tail once FoldBatchNorm put
/// the batch_norm into the weights) runs as one fused chain, bit for bit what the bindings
/// give one by one (forced by a second use of the conv's result, which breaks the chain).
/// `main`'s result of the fused module and the first field of the plain one's (which also
/// returns the intermediate, so nothing fuses), on the same arguments.
fn fused_and_plain(fused: &Module, plain: &Module, args: Vec<Value>) -> (Tensor, Tensor) {
    let got = crate::run(fused, "main", args.clone()).unwrap_or_else(|e| panic!("{e}"));
    let want = crate::run(plain, "main", args).unwrap_or_else(|e| panic!("{e}"));
    let Value::Tuple(mut items) = want else {
        panic!("not a tuple")
    };
    match (got, items.swap_remove(0)) {
        (Value::Tensor(a), Value::Tensor(b)) => (a, b),
        _ => panic!("not tensors"),
    }
}

/// The bit patterns of an `f32` tensor.
fn bits(t: &Tensor) -> Vec<u32> {
    t.to_f32_vec().iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_conv_with_bias_and_relu6_fuses_bit_for_bit() {
    // MobileNet's tail: conv2d → bias add → clip(0, 6), depthwise (groups = 4) and plain.
    let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
    for (groups, wi) in [(1, "4, 4, 3, 3"), (4, "4, 1, 3, 3")] {
        let body = |extra: &str, ret: &str, ret_ty: &str| {
            format!(
                "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: {x}, w: {w}, b: {b}) -> {ret_ty}:\n        with R.dataflow():\n            c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1], groups={groups})\n            d = R.add(c, b)\n            g = R.clip(d, R.prim_value(0), R.prim_value(T.float32(0.75)))\n{extra}            R.output({ret})\n        return {ret}\n",
                x = t("1, 4, 6, 6"),
                w = t(wi),
                b = t("1, 4, 1, 1"),
            )
        };
        let fused =
            parse_module_str(&body("", "g", &t("1, 4, 6, 6"))).unwrap_or_else(|e| panic!("{e}"));
        let plain = parse_module_str(&body(
            "            h = (g, c)\n",
            "h",
            &format!("R.Tuple({}, {})", t("1, 4, 6, 6"), t("1, 4, 6, 6")),
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let f = fused.get("main").unwrap_or_else(|| panic!("no main"));
        let chain = crate::fuse::plan(&fused, f, &|_| true)[0].clone();
        assert_eq!(
            chain.map(|c| crate::fuse::name(&c)).as_deref(),
            Some("relax.nn.conv2d+relax.add+relax.clip")
        );
        let fp = plain.get("main").unwrap_or_else(|| panic!("no main"));
        let alone = crate::fuse::plan(&plain, fp, &|_| true);
        assert_eq!(
            alone[0].as_ref().map(|c| c.links.len()),
            Some(0),
            "a conv2d read twice is a chain of itself"
        );
        let tensor = |shape: Vec<usize>, k: u32| {
            let n: usize = shape.iter().product();
            let v = (0..n)
                .map(|i| {
                    ((i as u32).wrapping_mul(2654435761).wrapping_add(k) % 1000) as f32 / 500.0
                        - 1.0
                })
                .collect();
            Value::Tensor(Tensor::from_f32(shape, v).unwrap_or_else(|e| panic!("{e}")))
        };
        let wshape: Vec<usize> = wi.split(", ").map(|d| d.parse().unwrap_or(0)).collect();
        let args = vec![
            tensor(vec![1, 4, 6, 6], 1),
            tensor(wshape, 2),
            tensor(vec![1, 4, 1, 1], 3),
        ];
        let (a, b) = fused_and_plain(&fused, &plain, args);
        assert_eq!(bits(&a), bits(&b), "groups={groups}");
        assert!(a.to_f32_vec().contains(&0.75) && a.to_f32_vec().contains(&0.0));
    }
}

#[test]
fn a_conv_with_bias_and_residual_adds_fuses_bit_for_bit() {
    let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
    let body = |extra: &str, ret: &str, ret_ty: &str| {
        format!(
            "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: {x}, w: {w}, b: {b}, r: {x}) -> {ret_ty}:\n        with R.dataflow():\n            c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])\n            d = R.add(c, b)\n            e = R.add(d, r)\n            g = R.nn.relu(e)\n{extra}            R.output({ret})\n        return {ret}\n",
            x = t("1, 4, 6, 6"),
            w = t("4, 4, 3, 3"),
            b = t("1, 4, 1, 1"),
        )
    };
    let fused =
        parse_module_str(&body("", "g", &t("1, 4, 6, 6"))).unwrap_or_else(|e| panic!("{e}"));
    let plain = parse_module_str(&body(
        "            h = (g, c)\n",
        "h",
        &format!("R.Tuple({}, {})", t("1, 4, 6, 6"), t("1, 4, 6, 6")),
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let f = fused.get("main").unwrap_or_else(|| panic!("no main"));
    let chains = crate::fuse::plan(&fused, f, &|_| true);
    let links = chains
        .first()
        .and_then(|c| c.as_ref())
        .map_or(0, |c| c.links.len());
    assert_eq!(links, 3, "conv2d + add + add + relu is one chain");
    let fp = plain.get("main").unwrap_or_else(|| panic!("no main"));
    let alone = crate::fuse::plan(&plain, fp, &|_| true);
    assert_eq!(
        alone[0].as_ref().map(|c| c.links.len()),
        Some(0),
        "a conv2d read twice is a chain of itself"
    );
    let vals = |n: usize, k: u32| -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(k) % 1000) as f32 / 500.0 - 1.0
            })
            .collect()
    };
    let tensor = |shape: Vec<usize>, k: u32| {
        let n = shape.iter().product();
        Value::Tensor(Tensor::from_f32(shape, vals(n, k)).unwrap_or_else(|e| panic!("{e}")))
    };
    let args = vec![
        tensor(vec![1, 4, 6, 6], 1),
        tensor(vec![4, 4, 3, 3], 2),
        tensor(vec![1, 4, 1, 1], 3),
        tensor(vec![1, 4, 6, 6], 4),
    ];
    let (a, b) = fused_and_plain(&fused, &plain, args);
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn a_blocked_1x1_conv_with_bias_residual_and_relu_fuses_bit_for_bit() {
    // The same chain in NCHW16c: 32 → 48 channels on a 5×5 plane; the bias (1, 3, 1, 1, 16)
    // and the residual in the output's layout.
    let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
    let body = |extra: &str, ret: &str, ret_ty: &str| {
        format!(
            "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: {x}, w: {w}, b: {b}, r: {y}) -> {ret_ty}:\n        with R.dataflow():\n            c = R.nn.conv2d(x, w, data_layout=\"NCHW16c\", out_layout=\"NCHW16c\")\n            d = R.add(c, b)\n            e = R.add(d, r)\n            g = R.nn.relu(e)\n{extra}            R.output({ret})\n        return {ret}\n",
            x = t("1, 2, 5, 5, 16"),
            w = t("48, 32, 1, 1"),
            b = t("1, 3, 1, 1, 16"),
            y = t("1, 3, 5, 5, 16"),
        )
    };
    let out = t("1, 3, 5, 5, 16");
    let fused = parse_module_str(&body("", "g", &out)).unwrap_or_else(|e| panic!("{e}"));
    let plain = parse_module_str(&body(
        "            h = (g, c)\n",
        "h",
        &format!("R.Tuple({out}, {out})"),
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let f = fused.get("main").unwrap_or_else(|| panic!("no main"));
    let chains = crate::fuse::plan(&fused, f, &|_| true);
    assert_eq!(
        chains[0].as_ref().map(crate::fuse::name).as_deref(),
        Some("relax.nn.conv2d+relax.add+relax.add+relax.nn.relu")
    );
    let args = vec![
        seeded(vec![1, 2, 5, 5, 16], 1),
        seeded(vec![48, 32, 1, 1], 2),
        seeded(vec![1, 3, 1, 1, 16], 3),
        seeded(vec![1, 3, 5, 5, 16], 4),
    ];
    let (a, b) = fused_and_plain(&fused, &plain, args.clone());
    assert_eq!(bits(&a), bits(&b));
    let v = a.to_f32_vec();
    assert!(v.contains(&0.0) && v.iter().any(|&x| x > 0.0));
    // On an AVX-512 or AVX2 CPU the chain ran the NCHW16c kernel (elsewhere, through NCHW).
    let (Value::Tensor(x), Value::Tensor(w)) = (&args[0], &args[1]) else {
        panic!("not tensors")
    };
    let kw = [("data_layout", "NCHW16c"), ("out_layout", "NCHW16c")]
        .map(|(k, v)| (k.to_string(), fusebox_core::op::AttrLit::Str(v.into())));
    let Ok(fusebox_core::op::Op::Conv2d(attrs)) =
        fusebox_core::op::Op::from_call("relax.nn.conv2d", &kw)
    else {
        panic!("no conv2d")
    };
    assert_eq!(
        crate::conv::blocked_geom(x, w, &attrs).is_some(),
        !crate::conv::blocked_blocks(crate::simd::f32_lanes()).is_empty()
    );
}

/// A FuseOps function of conv2d → bias → residual add, batch `n` symbolic, called by
/// `main`; `ret` binds its result `out` (a tuple that stops the fast path), else `gv` is
/// returned.
fn whole_chain_module(ret: &str, ret_ty: &str) -> Module {
    let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
    let (x, w, b) = (t("n, 4, 5, 5"), t("4, 4, 3, 3"), t("1, 4, 1, 1"));
    let out = if ret.is_empty() { "gv" } else { "out" };
    let src = format!(
        "@I.ir_module\nclass Module:\n    @R.function(private=True)\n    def fused(x: {x}, w: {w}, b: {b}, r: {x}) -> {ret_ty}:\n        n = T.int64()\n        R.func_attr({{\"Primitive\": True}})\n        with R.dataflow():\n            c: {x} = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])\n            d: {x} = R.add(c, b)\n            gv: {x} = R.add(d, r)\n{ret}            R.output({out})\n        return {out}\n\n    @R.function\n    def main(x: {x}, w: {w}, b: {b}, r: {x}) -> {ret_ty}:\n        n = T.int64()\n        with R.dataflow():\n            y = Module.fused(x, w, b, r)\n            R.output(y)\n        return y\n"
    );
    parse_module_str(&src).unwrap_or_else(|e| panic!("{e}\n{src}"))
}

fn seeded(shape: Vec<usize>, k: u32) -> Value {
    let n: usize = shape.iter().product();
    let v = (0..n)
        .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(k) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    Value::Tensor(Tensor::from_f32(shape, v).unwrap_or_else(|e| panic!("{e}")))
}

#[test]
fn a_whole_chain_function_runs_from_its_arguments_bit_for_bit() {
    let x_ty = "R.Tensor((n, 4, 5, 5), dtype=\"float32\")";
    let m = whole_chain_module("", x_ty);
    // The tuple result is not a tensor type: the same function interpreted binding by
    // binding (the chain still fused), the reference here.
    let tuple = whole_chain_module("            out = (gv,)\n", &format!("R.Tuple({x_ty})"));
    let fused = m.get("fused").unwrap_or_else(|| panic!("no fused"));
    let ex = Executor::new();
    let whole = ex.facts(&m, fused, false, true);
    let whole = whole.as_ref().and_then(|d| d.whole.as_ref());
    assert!(
        matches!(whole, Some(w) if w.syms == 1 && w.params.len() == 4),
        "{whole:?}"
    );
    let tf = tuple.get("fused").unwrap_or_else(|| panic!("no fused"));
    assert!(
        ex.facts(&tuple, tf, false, true)
            .is_some_and(|d| d.whole.is_none())
    );
    let args = |n: usize, rn: usize| {
        vec![
            seeded(vec![n, 4, 5, 5], 1),
            seeded(vec![4, 4, 3, 3], 2),
            seeded(vec![1, 4, 1, 1], 3),
            seeded(vec![rn, 4, 5, 5], 4),
        ]
    };
    let bits = |v: &Value| match v {
        Value::Tensor(t) => t
            .to_f32_vec()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>(),
        Value::Tuple(items) if items.len() == 1 => match &items[0] {
            Value::Tensor(t) => t.to_f32_vec().iter().map(|x| x.to_bits()).collect(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    let shared = Arc::new(m.clone());
    for n in [1, 3] {
        let want = crate::run(&tuple, "fused", args(n, n)).unwrap_or_else(|e| panic!("{e}"));
        let got = ex
            .run(&m, "fused", args(n, n), None)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bits(&got), bits(&want), "n={n}");
        assert_eq!(bits(&want).len(), n * 100);
        // Through `main` on the pinned module, twice (facts kept from the first run).
        for _ in 0..2 {
            let got = ex
                .run_shared(&shared, "main", args(n, n), None)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(bits(&got), bits(&want), "n={n}");
        }
    }
    // Arguments that do not fit the types take the interpreted path and its errors: a
    // symbol bound to two extents, a wrong rank.
    for (run_args, expect) in [
        (args(2, 3), "dim `n` is 2 elsewhere, found 3"),
        (
            vec![
                seeded(vec![4, 5, 5], 1),
                seeded(vec![4, 4, 3, 3], 2),
                seeded(vec![1, 4, 1, 1], 3),
                seeded(vec![2, 4, 5, 5], 4),
            ],
            "expected rank 4",
        ),
    ] {
        match ex.run(&m, "fused", run_args, None) {
            Err(e) => assert!(e.to_string().contains(expect), "{e}"),
            Ok(v) => panic!("ran: {v:?}"),
        }
    }
}

#[test]
fn a_pinned_module_keeps_the_facts_of_functions_that_call_others() {
    let x_ty = "R.Tensor((n, 4, 5, 5), dtype=\"float32\")";
    let first = Arc::new(whole_chain_module("", x_ty));
    let other = Arc::new(whole_chain_module("", x_ty));
    let ex = Executor::new();
    let args = || {
        vec![
            seeded(vec![2, 4, 5, 5], 1),
            seeded(vec![4, 4, 3, 3], 2),
            seeded(vec![1, 4, 1, 1], 3),
            seeded(vec![2, 4, 5, 5], 4),
        ]
    };
    let a = ex
        .run_shared(&first, "main", args(), None)
        .unwrap_or_else(|e| panic!("{e}"));
    // The first module run shared is pinned: `main` (which calls `fused`) keeps its
    // facts for runs without a hook, and they are the same on the next lookup.
    let main = first.get("main").unwrap_or_else(|| panic!("no main"));
    let interp = ex.interp(&first, None, None, false);
    assert!(interp.pinned);
    let (Some(p), Some(q)) = (
        ex.facts(&first, main, true, true),
        ex.facts(&first, main, true, true),
    ) else {
        panic!("no facts for the pinned main")
    };
    assert!(Arc::ptr_eq(&p, &q) && p.func.is_none());
    // A run with a call hook plans `main` itself (the hook decides what a chain takes in).
    assert!(ex.facts(&first, main, true, false).is_none());
    // Another module is not pinned: its `main` is derived on every call, and it runs.
    assert!(!ex.interp(&other, None, None, false).pinned);
    let om = other.get("main").unwrap_or_else(|| panic!("no main"));
    assert!(ex.facts(&other, om, false, true).is_none());
    let b = ex
        .run_shared(&other, "main", args(), None)
        .unwrap_or_else(|e| panic!("{e}"));
    let (Value::Tensor(a), Value::Tensor(b)) = (a, b) else {
        panic!("not tensors")
    };
    assert_eq!(a.to_f32_vec(), b.to_f32_vec());
}

#[test]
fn a_pinned_main_planned_without_a_hook_leaves_a_hooked_run_its_calls() {
    // conv2d → batch_norm → a call of `relu(t[0])`: without a hook the chain takes the
    // call in; with a hook that takes it, the hook must see the call.
    let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
    let (y, c) = (t("1, 4, 5, 5"), t("4,"));
    let src = format!(
        "@I.ir_module\nclass Module:\n    @R.function(private=True)\n    def fused_relu(t: R.Tuple({y}, {c}, {c})) -> {y}:\n        R.func_attr({{\"Primitive\": True}})\n        with R.dataflow():\n            a = t[0]\n            gv = R.nn.relu(a)\n            R.output(gv)\n        return gv\n\n    @R.function\n    def main(x: {y}, w: {w}, g: {c}, be: {c}, mu: {c}, var: {c}) -> {y}:\n        cls = Module\n        with R.dataflow():\n            cv = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])\n            bn = R.nn.batch_norm(cv, g, be, mu, var, axis=1, training=False)\n            r = cls.fused_relu(bn)\n            R.output(r)\n        return r\n",
        w = t("4, 4, 3, 3"),
    );
    let m = Arc::new(parse_module_str(&src).unwrap_or_else(|e| panic!("{e}\n{src}")));
    let main = m.get("main").unwrap_or_else(|| panic!("no main"));
    let plan = crate::fuse::plan(&m, main, &|_| true);
    assert_eq!(
        plan[0].as_ref().map(crate::fuse::name).as_deref(),
        Some("relax.nn.conv2d+relax.nn.batch_norm+relax.nn.relu")
    );
    let args = || {
        vec![
            seeded(vec![1, 4, 5, 5], 1),
            seeded(vec![4, 4, 3, 3], 2),
            seeded(vec![4], 3),
            seeded(vec![4], 4),
            seeded(vec![4], 5),
            Value::Tensor(
                Tensor::from_f32(vec![4], vec![1.0; 4]).unwrap_or_else(|e| panic!("{e}")),
            ),
        ]
    };
    let ex = Executor::new();
    let plain = ex
        .run_shared(&m, "main", args(), None)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(ex.facts(&m, main, true, true).is_some());
    assert!(
        ex.facts(&m, main, true, false).is_none(),
        "hookless facts served a hook"
    );
    let seen = std::sync::atomic::AtomicUsize::new(0);
    let marker =
        Tensor::from_f32(vec![1, 4, 5, 5], vec![7.0; 100]).unwrap_or_else(|e| panic!("{e}"));
    let hook = |g: &str, _: &[Value]| {
        (g == "fused_relu").then(|| {
            seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(Value::Tensor(marker.clone()))
        })
    };
    let hooked = ex
        .run_shared(&m, "main", args(), Some(&hook))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(seen.load(std::sync::atomic::Ordering::Relaxed), 1);
    let (Value::Tensor(h), Value::Tensor(p)) = (hooked, plain) else {
        panic!("not tensors")
    };
    assert_eq!(h.to_f32_vec(), vec![7.0; 100]);
    assert!(p.to_f32_vec().iter().all(|&v| v >= 0.0) && p.to_f32_vec() != vec![7.0; 100]);
}

/// `main(x, w, b, r) = fused(x, w, b[, r])` where `fused` is `conv2d(x, w) + b` (then `+ r`
/// with `residual`) and clipped, with `main`'s `w` and `b` arguments replaced by constants:
/// the call site FuseOps makes of a model's layer.
fn constant_site_module(residual: bool) -> Module {
    let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
    let (x, w, b) = (t("n, 4, 5, 5"), t("4, 4, 3, 3"), t("1, 4, 1, 1"));
    let (rp, radd, ra, e) = if residual {
        (
            format!(", r: {x}"),
            format!("            e: {x} = R.add(d, r)\n"),
            ", r",
            "e",
        )
    } else {
        (String::new(), String::new(), "", "d")
    };
    let src = format!(
        "@I.ir_module\nclass Module:\n    @R.function(private=True)\n    def fused(x: {x}, w: {w}, b: {b}{rp}) -> {x}:\n        n = T.int64()\n        R.func_attr({{\"Primitive\": True}})\n        with R.dataflow():\n            c: {x} = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])\n            d: {x} = R.add(c, b)\n{radd}            gv: {x} = R.clip({e}, R.prim_value(T.float32(0.0)), R.prim_value(T.float32(6.0)))\n            R.output(gv)\n        return gv\n\n    @R.function\n    def main(x: {x}, w: {w}, b: {b}{rp}) -> {x}:\n        n = T.int64()\n        with R.dataflow():\n            y = Module.fused(x, w, b{ra})\n            R.output(y)\n        return y\n"
    );
    let mut m = parse_module_str(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let constant = |shape: Vec<i64>, k: u32| {
        let Value::Tensor(t) = seeded(shape.iter().map(|&d| d as usize).collect(), k) else {
            panic!("not a tensor")
        };
        let bytes = t
            .to_f32_vec()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        fusebox_core::ir::Constant::from_bytes(DType::F32, shape, bytes)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let main = m
        .functions
        .get_mut("main")
        .unwrap_or_else(|| panic!("no main"));
    let call = main
        .bindings()
        .next()
        .map(|b| b.value)
        .unwrap_or_else(|| panic!("no binding"));
    let ExprKind::Call { args, .. } = main.expr(call).kind.clone() else {
        panic!("not a call")
    };
    main.exprs[args[1]].kind = ExprKind::Const(constant(vec![4, 4, 3, 3], 2));
    main.exprs[args[2]].kind = ExprKind::Const(constant(vec![1, 4, 1, 1], 3));
    m
}

#[test]
fn a_call_site_of_the_pinned_main_resolves_its_callee_and_constants_once() {
    for residual in [false, true] {
        let m = Arc::new(constant_site_module(residual));
        let args = |n: usize| {
            let mut a = vec![
                seeded(vec![n, 4, 5, 5], 1),
                seeded(vec![4, 4, 3, 3], 7),
                seeded(vec![1, 4, 1, 1], 8),
            ];
            if residual {
                a.push(seeded(vec![n, 4, 5, 5], 4));
            }
            a
        };
        let bits = |v: Value| match v {
            Value::Tensor(t) => t
                .to_f32_vec()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        // The reference: the same module not pinned (no sites), on its own executor.
        let want = |n: usize| {
            bits(
                Executor::new()
                    .run(&m, "main", args(n), None)
                    .unwrap_or_else(|e| panic!("{e}")),
            )
        };
        let ex = Executor::new();
        // Data of one shape, then another (what the site derived for the first shape must
        // not serve it), then the first again.
        for n in [1, 1, 3, 1] {
            let got = ex
                .run_shared(&m, "main", args(n), None)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(bits(got), want(n), "residual {residual}, n={n}");
        }
        let main = m.get("main").unwrap_or_else(|| panic!("no main"));
        let facts = ex
            .facts(&m, main, true, true)
            .unwrap_or_else(|| panic!("no facts for the pinned main"));
        let Some(Some(site)) = facts.sites.first().and_then(OnceLock::get) else {
            panic!("the call site was not resolved")
        };
        assert_eq!(
            m.functions.get_index(site.callee).map(|(g, _)| g.as_str()),
            Some("fused")
        );
        assert!(site.facts.as_ref().is_some_and(|d| d.whole.is_some()));
        assert_eq!(
            site.consts.iter().map(Option::is_some).collect::<Vec<_>>(),
            [false, true, true, false][..site.consts.len()]
        );
        // Without a residual the epilogue is the site's own, made for the first shape; a
        // residual (an argument that changes) keeps the per-call path.
        match site.ready.get() {
            Some(Some(r)) => {
                assert!(!residual);
                assert_eq!(r.x_shape, [1, 4, 5, 5]);
                assert_eq!(r.steps.len(), 2, "{:?}", r.steps);
            }
            Some(None) => assert!(residual),
            None => panic!("the site's epilogue was not looked at"),
        }
    }
}

#[test]
fn a_blocked_depthwise_conv_with_bias_and_relu6_fuses_and_matches_nchw_bit_for_bit() {
    // MobileNet's depthwise layer held in NCHW16c (what ConvertLayout makes of it): 32
    // channels, stride 2, conv2d → bias (1, 2, 1, 1, 16) → clip(0, 0.75); NaN and infinities
    // in the image. Fused, one op at a time, and the same layer in NCHW give the same bits.
    let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
    let body = |layout: &str, x: &str, b: &str, extra: &str, ret: &str, ret_ty: &str| {
        format!(
            "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: {x}, w: {w}, b: {b}) -> {ret_ty}:\n        with R.dataflow():\n            c = R.nn.conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1], groups=32, data_layout=\"{layout}\", out_layout=\"{layout}\")\n            d = R.add(c, b)\n            g = R.clip(d, R.prim_value(0), R.prim_value(T.float32(0.75)))\n{extra}            R.output({ret})\n        return {ret}\n",
            x = t(x),
            w = t("32, 1, 3, 3"),
            b = t(b),
        )
    };
    let (xb, bb, ob) = ("1, 2, 9, 9, 16", "1, 2, 1, 1, 16", "1, 2, 5, 5, 16");
    let out = t(ob);
    let fused =
        parse_module_str(&body("NCHW16c", xb, bb, "", "g", &out)).unwrap_or_else(|e| panic!("{e}"));
    let plain = parse_module_str(&body(
        "NCHW16c",
        xb,
        bb,
        "            h = (g, c)\n",
        "h",
        &format!("R.Tuple({out}, {out})"),
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let nchw = parse_module_str(&body(
        "NCHW",
        "1, 32, 9, 9",
        "1, 32, 1, 1",
        "",
        "g",
        &t("1, 32, 5, 5"),
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let f = fused.get("main").unwrap_or_else(|| panic!("no main"));
    let chains = crate::fuse::plan(&fused, f, &|_| true);
    assert_eq!(
        chains[0].as_ref().map(crate::fuse::name).as_deref(),
        Some("relax.nn.conv2d+relax.add+relax.clip")
    );
    // The image in NCHW with its specials, then blocked: [c / 16][h][w][c % 16].
    let Value::Tensor(x) = seeded(vec![1, 32, 9, 9], 1) else {
        panic!("not a tensor")
    };
    let mut xv = x.to_f32_vec();
    xv[5] = f32::NAN;
    xv[200] = f32::INFINITY;
    xv[1000] = f32::NEG_INFINITY;
    xv[2000] = -0.0;
    let block = |v: &[f32], c: usize, hw: usize| -> Vec<f32> {
        let mut o = vec![0.0; v.len()];
        for ch in 0..c {
            for p in 0..hw {
                o[((ch / 16) * hw + p) * 16 + ch % 16] = v[ch * hw + p];
            }
        }
        o
    };
    let tensor = |shape: Vec<usize>, v: Vec<f32>| {
        Value::Tensor(Tensor::from_f32(shape, v).unwrap_or_else(|e| panic!("{e}")))
    };
    let w = seeded(vec![32, 1, 3, 3], 2);
    let Value::Tensor(b) = seeded(vec![1, 32, 1, 1], 3) else {
        panic!("not a tensor")
    };
    let bv = b.to_f32_vec();
    let blocked_args = vec![
        tensor(vec![1, 2, 9, 9, 16], block(&xv, 32, 81)),
        w.clone(),
        tensor(vec![1, 2, 1, 1, 16], block(&bv, 32, 1)),
    ];
    let (a, p) = fused_and_plain(&fused, &plain, blocked_args.clone());
    assert_eq!(bits(&a), bits(&p));
    let Value::Tensor(n) = crate::run(
        &nchw,
        "main",
        vec![tensor(vec![1, 32, 9, 9], xv), w, b.into()],
    )
    .unwrap_or_else(|e| panic!("{e}")) else {
        panic!("not a tensor")
    };
    let want: Vec<u32> = block(&n.to_f32_vec(), 32, 25)
        .iter()
        .map(|x| x.to_bits())
        .collect();
    assert_eq!(bits(&a), want);
    // Both bounds of the clip were reached (the clip maps NaN to its lower bound).
    let v = a.to_f32_vec();
    assert!(v.contains(&0.75) && v.contains(&0.0));
}

#[test]
fn a_primitive_call_of_constants_and_shapes_runs_once_per_shape() {
    // DeBERTa's position embeddings broadcast to the batch and transposed per layer: a
    // `Primitive` function of a constant and a shape. Its result is kept per shape (the same
    // tensor comes back while the first is alive); a call with a var argument runs each time;
    // one whose shape reads the caller's symbol is kept per value of the symbol.
    let src = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def fused(c: R.Tensor((2, 3), dtype="float32"), s: R.Shape(["n", 2, 3])) -> R.Tensor(("n", 3, 2), dtype="float32"):
        n = T.int64()
        R.func_attr({"Primitive": True})
        with R.dataflow():
            lv = R.broadcast_to(c, s)
            gv = R.permute_dims(lv, axes=[0, 2, 1])
            R.output(gv)
        return gv

    @R.function(private=True)
    def outer(c: R.Tensor((2, 3), dtype="float32")) -> R.Tensor(("n", 2, 3), dtype="float32"):
        n = T.int64()
        R.func_attr({"Primitive": True})
        with R.dataflow():
            gv = R.broadcast_to(c, R.shape([n, 2, 3]))
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor(("n", 3, 2), dtype="float32"), y: R.Tensor((2, 3), dtype="float32")) -> R.Tuple(R.Tensor(("n", 3, 2), dtype="float32"), R.Tensor(("n", 3, 2), dtype="float32"), R.Tensor(("n", 2, 3), dtype="float32")):
        n = T.int64()
        with R.dataflow():
            a = Module.fused(metadata["relax.expr.Constant"][0], R.shape([n, 2, 3]))
            b = Module.fused(y, R.shape([n, 2, 3]))
            c = Module.outer(metadata["relax.expr.Constant"][0])
            gv = (a, b, c)
            R.output(gv)
        return gv
"#;
    let y = Tensor::from_f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let bytes = y
        .to_f32_vec()
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let c = fusebox_core::ir::Constant::from_bytes(DType::F32, vec![2, 3], bytes).unwrap();
    let mut table = fusebox_core::text::ConstTable::new();
    table.insert("relax.expr.Constant", 0, c);
    let m = Arc::new(
        fusebox_core::text::parse_module(src, "test", &table).unwrap_or_else(|e| panic!("{e}")),
    );
    let ex = Executor::default();
    let run = |n: usize, shared: bool| -> (Tensor, Tensor, Tensor) {
        let x = Tensor::from_f32(vec![n, 3, 2], vec![0.0; n * 6]).unwrap();
        let args = vec![Value::Tensor(x), Value::Tensor(y.clone())];
        let v = if shared {
            ex.run_shared(&m, "main", args, None)
        } else {
            ex.run(&m, "main", args, None)
        }
        .unwrap_or_else(|e| panic!("{e}"));
        match v {
            Value::Tuple(items) => match <[Value; 3]>::try_from(items) {
                Ok([Value::Tensor(a), Value::Tensor(b), Value::Tensor(c)]) => (a, b, c),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    };
    // [n, 3, 2]: element [k, i, j] is c[j, i].
    let want = |n: usize| -> Vec<f32> {
        (0..n * 6)
            .map(|q| {
                let (i, j) = ((q % 6) / 2, q % 2);
                (j * 3 + i + 1) as f32
            })
            .collect()
    };
    for shared in [false, true] {
        let (a1, b1, c1) = run(2, shared);
        let (a2, b2, c2) = run(2, shared);
        let (a3, b3, c3) = run(3, shared);
        // A shape inside the function read from the caller's `n`: kept per `n` too.
        for (c, n) in [(&c1, 2), (&c2, 2), (&c3, 3)] {
            assert_eq!(c.shape(), &[n, 2, 3], "shared={shared}");
            assert_eq!(c.to_f32_vec(), y.to_f32_vec().repeat(n));
        }
        assert_eq!(c1.storage_ptr(), c2.storage_ptr(), "shared={shared}");
        for (t, n) in [(&a1, 2), (&b1, 2), (&a2, 2), (&b2, 2), (&a3, 3), (&b3, 3)] {
            assert_eq!(t.shape(), &[n, 3, 2]);
            assert_eq!(t.to_f32_vec(), want(n));
        }
        assert_eq!(a1.storage_ptr(), a2.storage_ptr(), "shared={shared}");
        assert_ne!(a1.storage_ptr(), a3.storage_ptr(), "shared={shared}");
        assert_ne!(b1.storage_ptr(), b2.storage_ptr(), "shared={shared}");
    }
}

#[test]
fn a_conv_alone_is_a_chain_that_gives_the_ops_bits() {
    // 3×3 convolutions read only by what is not an epilogue (DenseNet's, before a concat):
    // one that runs as Winograd and one that does not.
    for (c, o, hw) in [(32, 32, 14), (4, 8, 6)] {
        let t = |s: String| format!("R.Tensor(({s}), dtype=\"float32\")");
        let text = format!(
            "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: {x}, w: {w}) -> {y}:\n        with R.dataflow():\n            c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])\n            R.output(c)\n        return c\n",
            x = t(format!("1, {c}, {hw}, {hw}")),
            w = t(format!("{o}, {c}, 3, 3")),
            y = t(format!("1, {o}, {hw}, {hw}")),
        );
        let m = parse_module_str(&text).unwrap_or_else(|e| panic!("{e}"));
        let main = m.get("main").unwrap_or_else(|| panic!("no main"));
        let chains = crate::fuse::plan(&m, main, &|_| true);
        let Some(Some(chain)) = chains.first() else {
            panic!("no chain")
        };
        assert!(chain.links.is_empty());
        let vals = |n: usize, k: u32| -> Vec<f32> {
            (0..n)
                .map(|i| {
                    ((i as u32).wrapping_mul(2654435761).wrapping_add(k) % 1000) as f32 / 500.0
                        - 1.0
                })
                .collect()
        };
        let x = Tensor::from_f32(vec![1, c, hw, hw], vals(c * hw * hw, 1))
            .unwrap_or_else(|e| panic!("{e}"));
        let w = Tensor::from_f32(vec![o, c, 3, 3], vals(o * c * 9, 2))
            .unwrap_or_else(|e| panic!("{e}"));
        // The chain's value is the convolution's output itself.
        let y = Tensor::from_f32(vec![1], vec![0.5]).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            crate::fuse::result(chain, y, &[]),
            Some(Value::Tensor(t)) if t.to_f32_vec() == [0.5]
        ));
        let got = crate::run(
            &m,
            "main",
            vec![Value::Tensor(x.clone()), Value::Tensor(w.clone())],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let fusebox_core::ir::ExprKind::Call {
            callee: fusebox_core::ir::Callee::Op(Op::Conv2d(attrs)),
            ..
        } = &main
            .expr(
                main.bindings()
                    .next()
                    .unwrap_or_else(|| panic!("empty"))
                    .value,
            )
            .kind
        else {
            panic!("not a conv2d")
        };
        let want = crate::conv::conv2d(&x, &w, attrs).unwrap_or_else(|e| panic!("{e}"));
        let Value::Tensor(got) = got else {
            panic!("not a tensor")
        };
        assert_eq!(bits(&got), bits(&want), "{c} -> {o} on {hw}×{hw}");
    }
}
