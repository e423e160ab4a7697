//! The composite path: each `cpu.*` composite form run through the executor (fused, by
//! [`crate::composite`]) and with its `Composite` attribute removed (interpreted op by op), the
//! two results compared; and the forms the recogniser must decline.

use super::*;

/// The TorchScript exporter's attention, as a composite; with `Composite` the executor runs
/// the fused kernel, without it the ops one by one.
const ATTN: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def attn(q: R.Tensor((2, 2, 10, 8), dtype="float32"), kt: R.Tensor((2, 2, 8, 10), dtype="float32"), mask: R.Tensor((2, 1, 10, 10), dtype="float32"), v: R.Tensor((2, 2, 10, 8), dtype="float32")) -> R.Tensor((2, 2, 10, 8), dtype="float32"):
        R.func_attr({"Composite": "cpu.attention", "Primitive": True})
        with R.dataflow():
            lv: R.Tensor((2, 2, 10, 8), dtype="float32") = R.multiply(q, R.const(0.5, "float32"))
            lv1: R.Tensor((2, 2, 8, 10), dtype="float32") = R.multiply(kt, R.const(0.5, "float32"))
            lv2: R.Tensor((2, 2, 10, 10), dtype="float32") = R.matmul(lv, lv1, out_dtype=None)
            lv3: R.Tensor((2, 2, 10, 10), dtype="float32") = R.add(lv2, mask)
            lv4: R.Tensor((2, 2, 10, 10), dtype="float32") = R.nn.softmax(lv3, axis=-1)
            lv5: R.Tensor((2, 2, 10, 10), dtype="bool") = R.isnan(lv4)
            lv6: R.Tensor((2, 2, 10, 10), dtype="float32") = R.where(lv5, R.const(0.0, "float32"), lv4)
            gv: R.Tensor((2, 2, 10, 8), dtype="float32") = R.matmul(lv6, v, out_dtype=None)
            R.output(gv)
        return gv

    @R.function
    def main(q: R.Tensor((2, 2, 10, 8), dtype="float32"), kt: R.Tensor((2, 2, 8, 10), dtype="float32"), mask: R.Tensor((2, 1, 10, 10), dtype="float32"), v: R.Tensor((2, 2, 10, 8), dtype="float32")) -> R.Tensor((2, 2, 10, 8), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((2, 2, 10, 8), dtype="float32") = Module.attn(q, kt, mask, v)
            R.output(gv)
        return gv
"#;

/// Runs `src`'s main as written and with every `Composite` attribute removed (interpreted).
fn fused_and_interpreted(src: &str, args: Vec<Value>) -> (Vec<f32>, Vec<f32>) {
    fused_and_interpreted_with(src, &[], args)
}

#[test]
fn the_attention_composite_runs_fused_and_agrees_with_its_body() {
    let m = fusebox_core::text::parse_module_str(ATTN).unwrap();
    let plan = crate::composite::recognise(m.get("attn").unwrap());
    assert!(
        matches!(&plan, Some(crate::composite::Plan::Attention { masks, .. }) if masks.len() == 1),
        "{plan:?}"
    );
    let mut r = Rng(21);
    let mask: Vec<f32> = (0..200)
        .map(|i| {
            if i % 10 >= 8 && i >= 100 {
                -3.4e38
            } else {
                0.0
            }
        })
        .collect();
    let args = vec![
        Value::Tensor(r.tensor(&[2, 2, 10, 8])),
        Value::Tensor(r.tensor(&[2, 2, 8, 10])),
        Value::Tensor(Tensor::from_f32(vec![2, 1, 10, 10], mask).unwrap()),
        Value::Tensor(r.tensor(&[2, 2, 10, 8])),
    ];
    let (fused, interp) = fused_and_interpreted(ATTN, args);
    close(&fused, &interp, 1e-5);
    // Not the same bits: the fused path really ran (online softmax in f32).
    assert_ne!(fused, interp);
}

/// The same attention with the heads' transposes inside (`cpu.attention_heads`): q, k, v as
/// `[B, S, H, D]`, the grouped key/value heads (3 query heads on 1), the output back to
/// `[B, S, H, D]`; the scale divides q only.
const ATTN_HEADS: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def attn(q: R.Tensor((2, 10, 3, 8), dtype="float32"), k: R.Tensor((2, 12, 1, 8), dtype="float32"), mask: R.Tensor((2, 1, 10, 12), dtype="float32"), v: R.Tensor((2, 12, 1, 8), dtype="float32")) -> R.Tensor((2, 10, 3, 8), dtype="float32"):
        R.func_attr({"Composite": "cpu.attention_heads", "Primitive": True})
        with R.dataflow():
            qh: R.Tensor((2, 3, 10, 8), dtype="float32") = R.permute_dims(q, axes=[0, 2, 1, 3])
            kh: R.Tensor((2, 1, 8, 12), dtype="float32") = R.permute_dims(k, axes=[0, 2, 3, 1])
            vh: R.Tensor((2, 1, 12, 8), dtype="float32") = R.permute_dims(v, axes=[0, 2, 1, 3])
            lv: R.Tensor((2, 3, 10, 8), dtype="float32") = R.divide(qh, R.const(2.0, "float32"))
            lv2: R.Tensor((2, 3, 10, 12), dtype="float32") = R.matmul(lv, kh, out_dtype=None)
            lv3: R.Tensor((2, 3, 10, 12), dtype="float32") = R.add(lv2, mask)
            lv4: R.Tensor((2, 3, 10, 12), dtype="float32") = R.nn.softmax(lv3, axis=-1)
            lv5: R.Tensor((2, 3, 10, 8), dtype="float32") = R.matmul(lv4, vh, out_dtype=None)
            gv: R.Tensor((2, 10, 3, 8), dtype="float32") = R.permute_dims(lv5, axes=[0, 2, 1, 3])
            R.output(gv)
        return gv

    @R.function
    def main(q: R.Tensor((2, 10, 3, 8), dtype="float32"), k: R.Tensor((2, 12, 1, 8), dtype="float32"), mask: R.Tensor((2, 1, 10, 12), dtype="float32"), v: R.Tensor((2, 12, 1, 8), dtype="float32")) -> R.Tensor((2, 10, 3, 8), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((2, 10, 3, 8), dtype="float32") = Module.attn(q, k, mask, v)
            R.output(gv)
        return gv
"#;

#[test]
fn the_heads_attention_composite_runs_fused_and_agrees_with_its_body() {
    let m = fusebox_core::text::parse_module_str(ATTN_HEADS).unwrap();
    let plan = crate::composite::recognise(m.get("attn").unwrap());
    let Some(crate::composite::Plan::Attention {
        perms, out_perm, ..
    }) = &plan
    else {
        panic!("{plan:?}")
    };
    assert_eq!(
        perms,
        &[
            Some(vec![0, 2, 1, 3]),
            Some(vec![0, 2, 3, 1]),
            Some(vec![0, 2, 1, 3])
        ]
    );
    assert_eq!(out_perm, &Some(vec![0, 2, 1, 3]));
    let mut r = Rng(23);
    let args = vec![
        Value::Tensor(r.tensor(&[2, 10, 3, 8])),
        Value::Tensor(r.tensor(&[2, 12, 1, 8])),
        Value::Tensor(r.tensor(&[2, 1, 10, 12])),
        Value::Tensor(r.tensor(&[2, 12, 1, 8])),
    ];
    let (fused, interp) = fused_and_interpreted(ATTN_HEADS, args);
    close(&fused, &interp, 1e-5);
    assert_ne!(fused, interp);
    // An output transpose that moves the last dim: recognised, but the kernel declines it
    // (its rows would not be runs) and the body is interpreted.
    let src = ATTN_HEADS
        .replace(
            "gv: R.Tensor((2, 10, 3, 8), dtype=\"float32\") = R.permute_dims(lv5, axes=[0, 2, 1, 3])",
            "gv: R.Tensor((2, 3, 8, 10), dtype=\"float32\") = R.permute_dims(lv5, axes=[0, 1, 3, 2])",
        )
        .replace(
            "-> R.Tensor((2, 10, 3, 8), dtype=\"float32\"):",
            "-> R.Tensor((2, 3, 8, 10), dtype=\"float32\"):",
        )
        .replace(
            "gv: R.Tensor((2, 10, 3, 8), dtype=\"float32\") = Module.attn",
            "gv: R.Tensor((2, 3, 8, 10), dtype=\"float32\") = Module.attn",
        );
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    assert!(crate::composite::recognise(m.get("attn").unwrap()).is_some());
    let args = vec![
        Value::Tensor(r.tensor(&[2, 10, 3, 8])),
        Value::Tensor(r.tensor(&[2, 12, 1, 8])),
        Value::Tensor(r.tensor(&[2, 1, 10, 12])),
        Value::Tensor(r.tensor(&[2, 12, 1, 8])),
    ];
    let (fused, interp) = fused_and_interpreted(&src, args);
    assert_eq!(fused, interp);
}

/// LongT5's local attention (`cpu.attention_einsum`): the scores and the product as einsums,
/// q `[B, N, S, H, D]` and k, v `[B, N, T, H, D]` by block, a position bias per block.
const ATTN_EINSUM: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def attn(q: R.Tensor((2, 3, 5, 2, 8), dtype="float32"), k: R.Tensor((2, 3, 7, 2, 8), dtype="float32"), bias: R.Tensor((1, 3, 2, 5, 7), dtype="float32"), v: R.Tensor((2, 3, 7, 2, 8), dtype="float32")) -> R.Tensor((2, 3, 5, 2, 8), dtype="float32"):
        R.func_attr({"Composite": "cpu.attention_einsum", "Primitive": True})
        with R.dataflow():
            lv: R.Tensor((2, 3, 2, 5, 7), dtype="float32") = R.einsum((q, k), subscripts="...qhd,...khd->...hqk")
            lv1: R.Tensor((2, 3, 2, 5, 7), dtype="float32") = R.add(lv, bias)
            lv2: R.Tensor((2, 3, 2, 5, 7), dtype="float32") = R.nn.softmax(lv1, axis=-1)
            gv: R.Tensor((2, 3, 5, 2, 8), dtype="float32") = R.einsum((lv2, v), subscripts="...hqk,...khd->...qhd")
            R.output(gv)
        return gv

    @R.function
    def main(q: R.Tensor((2, 3, 5, 2, 8), dtype="float32"), k: R.Tensor((2, 3, 7, 2, 8), dtype="float32"), bias: R.Tensor((1, 3, 2, 5, 7), dtype="float32"), v: R.Tensor((2, 3, 7, 2, 8), dtype="float32")) -> R.Tensor((2, 3, 5, 2, 8), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((2, 3, 5, 2, 8), dtype="float32") = Module.attn(q, k, bias, v)
            R.output(gv)
        return gv
"#;

#[test]
fn the_einsum_attention_composite_runs_fused_and_agrees_with_its_body() {
    let m = fusebox_core::text::parse_module_str(ATTN_EINSUM).unwrap();
    let plan = crate::composite::recognise(m.get("attn").unwrap());
    let Some(crate::composite::Plan::Attention {
        perms,
        out_perm,
        masks,
        ..
    }) = &plan
    else {
        panic!("{plan:?}")
    };
    // q as [.., H, S, D], k as kᵀ [.., H, D, T], v as [.., H, T, D], the result back.
    assert_eq!(
        perms,
        &[
            Some(vec![0, 1, 3, 2, 4]),
            Some(vec![0, 1, 3, 4, 2]),
            Some(vec![0, 1, 3, 2, 4])
        ]
    );
    assert_eq!(out_perm, &Some(vec![0, 1, 3, 2, 4]));
    assert_eq!(masks.len(), 1);
    let args = || {
        let mut r = Rng(41);
        vec![
            Value::Tensor(r.tensor(&[2, 3, 5, 2, 8])),
            Value::Tensor(r.tensor(&[2, 3, 7, 2, 8])),
            Value::Tensor(r.tensor(&[1, 3, 2, 5, 7])),
            Value::Tensor(r.tensor(&[2, 3, 7, 2, 8])),
        ]
    };
    let (fused, interp) = fused_and_interpreted(ATTN_EINSUM, args());
    close(&fused, &interp, 1e-5);
    // Not the same bits: the fused path really ran (the interpreter's einsum sums in f64).
    assert_ne!(fused, interp);
    // The operands the other way round (`k` first): the same scores, but not the form the
    // kernel takes (S must be the first operand's label); recognised as nothing, interpreted.
    let src = ATTN_EINSUM.replace(
        "R.einsum((q, k), subscripts=\"...qhd,...khd->...hqk\")",
        "R.einsum((k, q), subscripts=\"...khd,...qhd->...hqk\")",
    );
    assert_ne!(src, ATTN_EINSUM);
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    assert!(crate::composite::recognise(m.get("attn").unwrap()).is_none());
    let (fused, interp) = fused_and_interpreted(&src, args());
    assert_eq!(fused, interp);
}

#[test]
fn a_model_that_returns_its_keys_keeps_their_transpose_and_fuses_the_product_alone() {
    // `kh` (the keys' transpose) is also an output: `cpu.attention_heads` would leak it, so
    // its check declines and `cpu.attention` takes the product with the transposes outside.
    let src = r#"@I.ir_module
class Module:
    @R.function
    def main(q: R.Tensor((1, 6, 2, 8), dtype="float32"), k: R.Tensor((1, 6, 2, 8), dtype="float32"), v: R.Tensor((1, 6, 2, 8), dtype="float32")) -> R.Tuple(R.Tensor((1, 6, 2, 8), dtype="float32"), R.Tensor((1, 2, 8, 6), dtype="float32")):
        with R.dataflow():
            qh: R.Tensor((1, 2, 6, 8), dtype="float32") = R.permute_dims(q, axes=[0, 2, 1, 3])
            kh: R.Tensor((1, 2, 8, 6), dtype="float32") = R.permute_dims(k, axes=[0, 2, 3, 1])
            vh: R.Tensor((1, 2, 6, 8), dtype="float32") = R.permute_dims(v, axes=[0, 2, 1, 3])
            s: R.Tensor((1, 2, 6, 6), dtype="float32") = R.matmul(qh, kh, out_dtype=None)
            p: R.Tensor((1, 2, 6, 6), dtype="float32") = R.nn.softmax(s, axis=-1)
            o: R.Tensor((1, 2, 6, 8), dtype="float32") = R.matmul(p, vh, out_dtype=None)
            gv: R.Tensor((1, 6, 2, 8), dtype="float32") = R.permute_dims(o, axes=[0, 2, 1, 3])
            out: R.Tuple(R.Tensor((1, 6, 2, 8), dtype="float32"), R.Tensor((1, 2, 8, 6), dtype="float32")) = (gv, kh)
            R.output(out)
        return out
"#;
    let composites = |src: &str| -> Vec<String> {
        let m = fusebox_core::text::parse_module_str(src).unwrap();
        // In priority order, as every pipeline applies a table.
        let mut table = crate::backend::transformer_patterns().to_vec();
        fusebox_core::transform::sort_by_priority(&mut table);
        let opts = fusebox_core::transform::PartitionOptions::default();
        let out = fusebox_core::transform::fuse_ops_by_pattern(&m, &table, opts)
            .unwrap()
            .module;
        out.functions
            .values()
            .filter_map(|f| f.attrs.composite.clone())
            .collect()
    };
    assert_eq!(composites(src), ["cpu.attention"]);
    // Without the second output the transposes go inside.
    let single = src
        .replace(
            "            out: R.Tuple(R.Tensor((1, 6, 2, 8), dtype=\"float32\"), R.Tensor((1, 2, 8, 6), dtype=\"float32\")) = (gv, kh)\n            R.output(out)\n        return out",
            "            R.output(gv)\n        return gv",
        )
        .replace(
            "-> R.Tuple(R.Tensor((1, 6, 2, 8), dtype=\"float32\"), R.Tensor((1, 2, 8, 6), dtype=\"float32\")):",
            "-> R.Tensor((1, 6, 2, 8), dtype=\"float32\"):",
        );
    assert_eq!(composites(&single), ["cpu.attention_heads"]);
}

#[test]
fn a_body_of_another_form_is_interpreted() {
    // The scale is not a scalar: the recogniser declines, the body still runs.
    let src = ATTN.replace(
        "R.multiply(q, R.const(0.5, \"float32\"))",
        "R.multiply(q, q)",
    );
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    assert!(crate::composite::recognise(m.get("attn").unwrap()).is_none());
    let mut r = Rng(29);
    let args = vec![
        Value::Tensor(r.tensor(&[2, 2, 10, 8])),
        Value::Tensor(r.tensor(&[2, 2, 8, 10])),
        Value::Tensor(r.tensor(&[2, 1, 10, 10])),
        Value::Tensor(r.tensor(&[2, 2, 10, 8])),
    ];
    let (fused, interp) = fused_and_interpreted(&src, args);
    assert_eq!(fused, interp);
    // An extra binding in the body.
    let src = ATTN.replace(
        "            gv: R.Tensor((2, 2, 10, 8), dtype=\"float32\") = R.matmul(lv6, v, out_dtype=None)\n",
        "            lv7: R.Tensor((2, 2, 10, 10), dtype=\"float32\") = R.nn.relu(lv6)\n            gv: R.Tensor((2, 2, 10, 8), dtype=\"float32\") = R.matmul(lv7, v, out_dtype=None)\n",
    );
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    assert!(crate::composite::recognise(m.get("attn").unwrap()).is_none());
}

const RLN: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def rln(a: R.Tensor((6, 16), dtype="float32"), b: R.Tensor((6, 16), dtype="float32"), g: R.Tensor((16,), dtype="float32"), be: R.Tensor((16,), dtype="float32")) -> R.Tuple(R.Tensor((6, 16), dtype="float32"), R.Tensor((6, 16), dtype="float32")):
        R.func_attr({"Composite": "cpu.residual_layer_norm", "Primitive": True})
        with R.dataflow():
            s: R.Tensor((6, 16), dtype="float32") = R.add(a, b)
            y: R.Tensor((6, 16), dtype="float32") = R.nn.layer_norm(s, g, be, axes=[-1], epsilon=1e-05, center=True, scale=True)
            gv: R.Tuple(R.Tensor((6, 16), dtype="float32"), R.Tensor((6, 16), dtype="float32")) = (y, s)
            R.output(gv)
        return gv

    @R.function
    def main(a: R.Tensor((6, 16), dtype="float32"), b: R.Tensor((6, 16), dtype="float32"), g: R.Tensor((16,), dtype="float32"), be: R.Tensor((16,), dtype="float32")) -> R.Tuple(R.Tensor((6, 16), dtype="float32"), R.Tensor((6, 16), dtype="float32")):
        with R.dataflow():
            gv: R.Tuple(R.Tensor((6, 16), dtype="float32"), R.Tensor((6, 16), dtype="float32")) = Module.rln(a, b, g, be)
            R.output(gv)
        return gv
"#;

#[test]
fn the_residual_layer_norm_composite_returns_both_outputs_bit_for_bit() {
    let m = fusebox_core::text::parse_module_str(RLN).unwrap();
    let plan = crate::composite::recognise(m.get("rln").unwrap());
    assert!(
        matches!(&plan, Some(crate::composite::Plan::ResidualLayerNorm { outputs, .. }) if outputs == &[true, false]),
        "{plan:?}"
    );
    let mut r = Rng(23);
    let args = ["a", "b", "g", "be"]
        .iter()
        .zip([&[6usize, 16][..], &[6, 16], &[16], &[16]])
        .map(|(_, s)| Value::Tensor(r.tensor(s)))
        .collect();
    let (fused, interp) = fused_and_interpreted(RLN, args);
    assert_eq!(fused, interp);
}

const SWIGLU: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def mlp(x: R.Tensor((2, 9, 24), dtype="float32")) -> R.Tensor((2, 9, 40), dtype="float32"):
        R.func_attr({"Composite": "cpu.silu_gated", "Primitive": True})
        with R.dataflow():
            g: R.Tensor((2, 9, 40), dtype="float32") = R.matmul(x, metadata["relax.expr.Constant"][0], out_dtype=None)
            s: R.Tensor((2, 9, 40), dtype="float32") = R.sigmoid(g)
            a: R.Tensor((2, 9, 40), dtype="float32") = R.multiply(g, s)
            u: R.Tensor((2, 9, 40), dtype="float32") = R.matmul(x, metadata["relax.expr.Constant"][1], out_dtype=None)
            gv: R.Tensor((2, 9, 40), dtype="float32") = R.multiply(a, u)
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((2, 9, 24), dtype="float32")) -> R.Tensor((2, 9, 40), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((2, 9, 40), dtype="float32") = Module.mlp(x)
            R.output(gv)
        return gv
"#;

/// `t` as a constant of the text format.
fn constant(t: &Tensor) -> fusebox_core::ir::Constant {
    let bytes = t
        .to_f32_vec()
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let shape = t.shape().iter().map(|&d| d as i64).collect();
    fusebox_core::ir::Constant::from_bytes(fusebox_core::ir::DType::F32, shape, bytes).unwrap()
}

/// A constant table holding `consts` as `metadata["relax.expr.Constant"][i]`.
fn table(consts: &[Tensor]) -> fusebox_core::text::ConstTable {
    let mut table = fusebox_core::text::ConstTable::new();
    for (i, c) in consts.iter().enumerate() {
        table.insert("relax.expr.Constant", i, constant(c));
    }
    table
}

/// [`fused_and_interpreted`] with `src`'s constants from `consts`: both results, tuples
/// flattened.
fn fused_and_interpreted_with(
    src: &str,
    consts: &[Tensor],
    args: Vec<Value>,
) -> (Vec<f32>, Vec<f32>) {
    let table = table(consts);
    let parse = |s: &str| fusebox_core::text::parse_module(s, "test.relax", &table).unwrap();
    // Every `"Composite": "...", ` attribute removed.
    let mut plain_src = src.to_string();
    while let Some(at) = plain_src.find("\"Composite\": \"") {
        let end = plain_src[at..].find("\", ").unwrap() + at + 3;
        plain_src.replace_range(at..end, "");
    }
    let flat = |v: Value| match v {
        Value::Tensor(t) => t.to_f32_vec(),
        Value::Tuple(ts) => ts
            .into_iter()
            .flat_map(|t| match t {
                Value::Tensor(t) => t.to_f32_vec(),
                _ => panic!("not a tensor"),
            })
            .collect(),
        _ => panic!("not a tensor"),
    };
    let fused = crate::run(&parse(src), "main", args.clone()).unwrap();
    let interp = crate::run(&parse(&plain_src), "main", args).unwrap();
    (flat(fused), flat(interp))
}

#[test]
fn the_silu_gated_composite_runs_fused_bit_for_bit_with_its_body() {
    let mut r = Rng(31);
    let consts = [r.tensor(&[24, 40]), r.tensor(&[24, 40])];
    let m = fusebox_core::text::parse_module(SWIGLU, "test.relax", &table(&consts)).unwrap();
    let plan = crate::composite::recognise(m.get("mlp").unwrap());
    assert!(
        matches!(plan, Some(crate::composite::Plan::SiluGated { .. })),
        "{plan:?}"
    );
    for threads in [1, 2, 3] {
        let args = vec![Value::Tensor(r.tensor(&[2, 9, 24]))];
        let (fused, interp) = crate::par::with_threads(threads, || {
            fused_and_interpreted_with(SWIGLU, &consts, args.clone())
        });
        assert_eq!(bits(&fused), bits(&interp), "{threads} threads");
    }
    // The other operand orders are recognised too.
    let swapped = SWIGLU
        .replace("R.multiply(g, s)", "R.multiply(s, g)")
        .replace("R.multiply(a, u)", "R.multiply(u, a)");
    let args = vec![Value::Tensor(r.tensor(&[2, 9, 24]))];
    let (fused, interp) = fused_and_interpreted_with(&swapped, &consts, args);
    assert_eq!(bits(&fused), bits(&interp));
    // Two different inputs to the projections: not this form, interpreted.
    let two = SWIGLU
        .replace(
            "def mlp(x: R.Tensor((2, 9, 24), dtype=\"float32\"))",
            "def mlp(x: R.Tensor((2, 9, 24), dtype=\"float32\"), y: R.Tensor((2, 9, 24), dtype=\"float32\"))",
        )
        .replace(
            "R.matmul(x, metadata[\"relax.expr.Constant\"][1]",
            "R.matmul(y, metadata[\"relax.expr.Constant\"][1]",
        );
    let m = fusebox_core::text::parse_module(
        &two.replace("Module.mlp(x)", "Module.mlp(x, x)"),
        "t.relax",
        &table(&consts),
    )
    .unwrap();
    assert!(crate::composite::recognise(m.get("mlp").unwrap()).is_none());
}

#[test]
fn silu_gated_matches_its_definition() {
    let mut r = Rng(37);
    let (m, k, n) = (5usize, 33usize, 70usize);
    let (x, wg, wu) = (r.tensor(&[m, k]), r.tensor(&[k, n]), r.tensor(&[k, n]));
    let order = crate::dense::GateOrder {
        gate_first: true,
        silu_first: true,
    };
    let got = crate::dense::silu_gated(&x, &wg, &wu, order, (None, None))
        .unwrap()
        .unwrap();
    let (xd, gd, ud) = (x.to_f32_vec(), wg.to_f32_vec(), wu.to_f32_vec());
    let mut want = Vec::new();
    for i in 0..m {
        for j in 0..n {
            let dot = |w: &[f32]| -> f64 {
                (0..k)
                    .map(|p| f64::from(xd[i * k + p]) * f64::from(w[p * n + j]))
                    .sum()
            };
            let (g, u) = (dot(&gd), dot(&ud));
            want.push((g / (1.0 + (-g).exp()) * u) as f32);
        }
    }
    assert_eq!(got.shape(), &[m, n]);
    close(&got.to_f32_vec(), &want, 1e-5);
}

const ROPE: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def rope(x: R.Tensor((2, 3, 7, 16), dtype="float32"), cos: R.Tensor((1, 1, 7, 16), dtype="float32"), sin: R.Tensor((1, 1, 7, 16), dtype="float32")) -> R.Tensor((2, 3, 7, 16), dtype="float32"):
        R.func_attr({"Composite": "cpu.rope", "Primitive": True})
        with R.dataflow():
            a: R.Tensor((2, 3, 7, 16), dtype="float32") = R.multiply(x, cos)
            s1: R.Tensor((2, 3, 7, 8), dtype="float32") = R.strided_slice(x, axes=[3], begin=[0], end=[8], strides=[1], assume_inbound=False)
            s2: R.Tensor((2, 3, 7, 8), dtype="float32") = R.strided_slice(x, axes=[3], begin=[8], end=[9223372036854775807], strides=[1], assume_inbound=False)
            n: R.Tensor((2, 3, 7, 8), dtype="float32") = R.negative(s2)
            c: R.Tensor((2, 3, 7, 16), dtype="float32") = R.concat((n, s1), axis=-1)
            b: R.Tensor((2, 3, 7, 16), dtype="float32") = R.multiply(c, sin)
            gv: R.Tensor((2, 3, 7, 16), dtype="float32") = R.add(a, b)
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((2, 3, 7, 16), dtype="float32"), cos: R.Tensor((1, 1, 7, 16), dtype="float32"), sin: R.Tensor((1, 1, 7, 16), dtype="float32")) -> R.Tensor((2, 3, 7, 16), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((2, 3, 7, 16), dtype="float32") = Module.rope(x, cos, sin)
            R.output(gv)
        return gv
"#;

#[test]
fn the_rope_composite_runs_fused_bit_for_bit_with_its_body() {
    let mut r = Rng(41);
    let args = |r: &mut Rng| {
        vec![
            Value::Tensor(r.tensor(&[2, 3, 7, 16])),
            Value::Tensor(r.tensor(&[1, 1, 7, 16])),
            Value::Tensor(r.tensor(&[1, 1, 7, 16])),
        ]
    };
    let variants = [
        ROPE.to_string(),
        // The other operand orders; and the slices' axis written as -1.
        ROPE.replace("R.multiply(x, cos)", "R.multiply(cos, x)")
            .replace("R.multiply(c, sin)", "R.multiply(sin, c)")
            .replace("R.add(a, b)", "R.add(b, a)")
            .replace("axes=[3]", "axes=[-1]"),
    ];
    for src in &variants {
        let m = fusebox_core::text::parse_module_str(src).unwrap();
        let plan = crate::composite::recognise(m.get("rope").unwrap());
        assert!(
            matches!(plan, Some(crate::composite::Plan::Rope { half: 8, .. })),
            "{plan:?}"
        );
        let (fused, interp) = fused_and_interpreted(src, args(&mut r));
        assert_eq!(bits(&fused), bits(&interp));
    }
    // Slices that do not halve the last axis (a rotary part of 8 of 16): the kernel declines
    // at run time, and the caller interprets the body.
    let plan = crate::composite::Plan::Rope {
        x: crate::composite::Leaf::Param(0),
        cos: crate::composite::Leaf::Param(1),
        sin: crate::composite::Leaf::Param(2),
        half: 4,
        end: 8,
        axes: [3, -1],
        order: crate::rope::RopeOrder {
            x_first: true,
            rotated_first: true,
            cos_first: true,
        },
    };
    let vals = args(&mut r);
    let input = |l: crate::composite::Leaf| match l {
        crate::composite::Leaf::Param(i) => Ok(vals[i].clone()),
        crate::composite::Leaf::Const(_) => panic!("no constants"),
    };
    assert!(
        crate::composite::run(&plan, &input, &|_, _| None)
            .unwrap()
            .is_none()
    );
    let crate::composite::Plan::Rope {
        x, cos, sin, order, ..
    } = plan
    else {
        unreachable!()
    };
    let halves = crate::composite::Plan::Rope {
        x,
        cos,
        sin,
        half: 8,
        end: i64::MAX,
        axes: [3, -1],
        order,
    };
    assert!(
        crate::composite::run(&halves, &input, &|_, _| None)
            .unwrap()
            .is_some()
    );
}

const LN_DECOMPOSED: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def ln(x: R.Tensor((3, 5, 24), dtype="float32")) -> R.Tensor((3, 5, 24), dtype="float32"):
        R.func_attr({"Composite": "cpu.layer_norm_decomposed", "Primitive": True})
        with R.dataflow():
            m: R.Tensor((3, 5, 1), dtype="float32") = R.mean(x, axis=[-1], keepdims=True)
            d: R.Tensor((3, 5, 24), dtype="float32") = R.subtract(x, m)
            p: R.Tensor((3, 5, 24), dtype="float32") = R.power(d, R.const(2.0, "float32"))
            v: R.Tensor((3, 5, 1), dtype="float32") = R.mean(p, axis=[-1], keepdims=True)
            a: R.Tensor((3, 5, 1), dtype="float32") = R.add(v, R.const(9.9999997e-06, "float32"))
            s: R.Tensor((3, 5, 1), dtype="float32") = R.sqrt(a)
            n: R.Tensor((3, 5, 24), dtype="float32") = R.divide(d, s)
            g: R.Tensor((3, 5, 24), dtype="float32") = R.multiply(n, metadata["relax.expr.Constant"][0])
            gv: R.Tensor((3, 5, 24), dtype="float32") = R.add(g, metadata["relax.expr.Constant"][1])
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((3, 5, 24), dtype="float32")) -> R.Tensor((3, 5, 24), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((3, 5, 24), dtype="float32") = Module.ln(x)
            R.output(gv)
        return gv
"#;

#[test]
fn the_decomposed_layer_norm_runs_fused_bit_for_bit_with_its_body() {
    let mut r = Rng(43);
    let consts = [r.tensor(&[24]), r.tensor(&[24])];
    let without_affine = LN_DECOMPOSED
        .replace(
            "            g: R.Tensor((3, 5, 24), dtype=\"float32\") = R.multiply(n, metadata[\"relax.expr.Constant\"][0])\n            gv: R.Tensor((3, 5, 24), dtype=\"float32\") = R.add(g, metadata[\"relax.expr.Constant\"][1])\n",
            "            gv: R.Tensor((3, 5, 24), dtype=\"float32\") = R.divide(d, s)\n",
        )
        .replace(
            "            n: R.Tensor((3, 5, 24), dtype=\"float32\") = R.divide(d, s)\n",
            "",
        );
    for (src, affine) in [(LN_DECOMPOSED.to_string(), true), (without_affine, false)] {
        let m = fusebox_core::text::parse_module(&src, "t.relax", &table(&consts)).unwrap();
        let plan = crate::composite::recognise(m.get("ln").unwrap());
        assert!(
            matches!(&plan, Some(crate::composite::Plan::LayerNormDecomposed { gamma, beta, exp, .. })
                if gamma.is_some() == affine && beta.is_some() == affine && *exp == 2.0),
            "{plan:?}"
        );
        // Rows with a large offset (the mean matters) and a NaN row.
        let mut x = r.tensor(&[3, 5, 24]).to_f32_vec();
        x.iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v += (i / 24) as f32 * 100.0);
        x[30] = f32::NAN;
        let x = Tensor::from_f32(vec![3, 5, 24], x).unwrap();
        for threads in [1, 2] {
            let (fused, interp) = crate::par::with_threads(threads, || {
                fused_and_interpreted_with(&src, &consts, vec![Value::Tensor(x.clone())])
            });
            assert_eq!(
                bits(&fused),
                bits(&interp),
                "affine {affine}, {threads} threads"
            );
        }
    }
    // Against the definition (f64): mean, variance, normalise, scale and shift.
    let x = r.tensor(&[4, 24]);
    let (g, b) = (&consts[0], &consts[1]);
    let got = crate::norm::layer_norm_decomposed(&x, 2.0, 1e-5, Some(g), Some(b))
        .unwrap()
        .unwrap()
        .to_f32_vec();
    let (xd, gd, bd) = (x.to_f32_vec(), g.to_f32_vec(), b.to_f32_vec());
    let mut want = Vec::new();
    for row in xd.chunks(24) {
        let m = row.iter().map(|&v| f64::from(v)).sum::<f64>() / 24.0;
        let var = row.iter().map(|&v| (f64::from(v) - m).powi(2)).sum::<f64>() / 24.0;
        for (j, &v) in row.iter().enumerate() {
            let y = (f64::from(v) - m) / (var + 1e-5).sqrt();
            want.push((y * f64::from(gd[j]) + f64::from(bd[j])) as f32);
        }
    }
    close(&got, &want, 1e-5);
}

/// Grouped-query attention with Hugging Face's `repeat_kv` inside (`cpu.attention_grouped`):
/// 6 query heads on 2 key/value heads, each repeated 3 times by expand_dims, broadcast_to and
/// reshape (kᵀ then transposed), with the exporters' targets as shape parameters. `BATCH`
/// is the broadcast target's batch (the q, mask and result batch follow it).
const ATTN_GROUPED: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def attn(q: R.Tensor((BATCH, 6, 5, 8), dtype="float32"), k: R.Tensor((1, 2, 5, 8), dtype="float32"), mask: R.Tensor((1, 1, 5, 5), dtype="float32"), v: R.Tensor((1, 2, 5, 8), dtype="float32"), b: R.Shape([BATCH, 2, 3, 5, 8]), s: R.Shape([BATCH, 6, 5, 8])) -> R.Tensor((BATCH, 6, 5, 8), dtype="float32"):
        R.func_attr({"Composite": "cpu.attention_grouped", "Primitive": True})
        with R.dataflow():
            ke: R.Tensor((1, 2, 1, 5, 8), dtype="float32") = R.expand_dims(k, axis=[2])
            kb: R.Tensor((BATCH, 2, 3, 5, 8), dtype="float32") = R.broadcast_to(ke, b)
            kr: R.Tensor((BATCH, 6, 5, 8), dtype="float32") = R.reshape(kb, s)
            kt: R.Tensor((BATCH, 6, 8, 5), dtype="float32") = R.permute_dims(kr, axes=[0, 1, 3, 2])
            ve: R.Tensor((1, 2, 1, 5, 8), dtype="float32") = R.expand_dims(v, axis=[2])
            vb: R.Tensor((BATCH, 2, 3, 5, 8), dtype="float32") = R.broadcast_to(ve, b)
            vr: R.Tensor((BATCH, 6, 5, 8), dtype="float32") = R.reshape(vb, s)
            lv: R.Tensor((BATCH, 6, 5, 8), dtype="float32") = R.multiply(q, R.const(0.5, "float32"))
            lv1: R.Tensor((BATCH, 6, 8, 5), dtype="float32") = R.multiply(kt, R.const(0.5, "float32"))
            lv2: R.Tensor((BATCH, 6, 5, 5), dtype="float32") = R.matmul(lv, lv1, out_dtype=None)
            lv3: R.Tensor((BATCH, 6, 5, 5), dtype="float32") = R.add(lv2, mask)
            lv4: R.Tensor((BATCH, 6, 5, 5), dtype="float32") = R.nn.softmax(lv3, axis=-1)
            gv: R.Tensor((BATCH, 6, 5, 8), dtype="float32") = R.matmul(lv4, vr, out_dtype=None)
            R.output(gv)
        return gv

    @R.function
    def main(q: R.Tensor((BATCH, 6, 5, 8), dtype="float32"), k: R.Tensor((1, 2, 5, 8), dtype="float32"), mask: R.Tensor((1, 1, 5, 5), dtype="float32"), v: R.Tensor((1, 2, 5, 8), dtype="float32")) -> R.Tensor((BATCH, 6, 5, 8), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((BATCH, 6, 5, 8), dtype="float32") = Module.attn(q, k, mask, v, R.shape([BATCH, 2, 3, 5, 8]), R.shape([BATCH, 6, 5, 8]))
            R.output(gv)
        return gv
"#;

#[test]
fn the_grouped_attention_composite_reads_the_repeated_heads_in_place() {
    let src = ATTN_GROUPED.replace("BATCH", "1");
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    let plan = crate::composite::recognise(m.get("attn").unwrap());
    let Some(crate::composite::Plan::Attention { perms, repeats, .. }) = &plan else {
        panic!("{plan:?}")
    };
    assert!(repeats.iter().all(Option::is_some), "{plan:?}");
    assert_eq!(perms, &[None, Some(vec![0, 1, 3, 2]), None]);
    let mut r = Rng(41);
    let args = |r: &mut Rng, batch: usize| {
        vec![
            Value::Tensor(r.tensor(&[batch, 6, 5, 8])),
            Value::Tensor(r.tensor(&[1, 2, 5, 8])),
            Value::Tensor(r.tensor(&[1, 1, 5, 5])),
            Value::Tensor(r.tensor(&[1, 2, 5, 8])),
        ]
    };
    let (fused, interp) = fused_and_interpreted(&src, args(&mut r, 1));
    close(&fused, &interp, 1e-5);
    // Not the same bits: the kernel ran, on the 2 heads (the op-by-op body copies them to 6).
    assert_ne!(bits(&fused), bits(&interp));
    // A broadcast that also widens the batch (1 → 2) is not the heads' repeat alone: the
    // targets do not fit at run time and the body runs op by op, the same bits.
    let src = ATTN_GROUPED.replace("BATCH", "2");
    let (fused, interp) = fused_and_interpreted(&src, args(&mut r, 2));
    assert_eq!(bits(&fused), bits(&interp));
    // The new axis counted from the end is the same repeat.
    let src = ATTN_GROUPED
        .replace("BATCH", "1")
        .replace("axis=[2]", "axis=[-3]");
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    assert!(crate::composite::recognise(m.get("attn").unwrap()).is_some());
    // A repeat with the new axis before the heads interleaves them (head h reads h % 2, not
    // h / 3): not recognised, and run op by op.
    let odd = ATTN_GROUPED
        .replace("BATCH", "1")
        .replace("R.expand_dims(k, axis=[2])", "R.expand_dims(k, axis=[1])")
        .replace(
            "ke: R.Tensor((1, 2, 1, 5, 8)",
            "ke: R.Tensor((1, 1, 2, 5, 8)",
        )
        .replace(
            "kb: R.Tensor((1, 2, 3, 5, 8)",
            "kb: R.Tensor((1, 3, 2, 5, 8)",
        )
        .replace("R.broadcast_to(ke, b)", "R.broadcast_to(ke, b2)")
        .replace(
            "b: R.Shape([1, 2, 3, 5, 8]),",
            "b: R.Shape([1, 2, 3, 5, 8]), b2: R.Shape([1, 3, 2, 5, 8]),",
        )
        .replace(
            "R.shape([1, 2, 3, 5, 8]), R.shape([1, 6, 5, 8]))",
            "R.shape([1, 2, 3, 5, 8]), R.shape([1, 3, 2, 5, 8]), R.shape([1, 6, 5, 8]))",
        );
    let m = fusebox_core::text::parse_module_str(&odd).unwrap();
    assert!(crate::composite::recognise(m.get("attn").unwrap()).is_none());
    let (fused, interp) = fused_and_interpreted(&odd, args(&mut r, 1));
    assert_eq!(bits(&fused), bits(&interp));
    // The dynamo export's keys: the transpose between the broadcast and the reshape (of the
    // transposed shape), read as the keys transposed by [0, 1, 3, 2].
    let dynamo = ATTN_GROUPED
        .replace("BATCH", "1")
        .replace(
            "kr: R.Tensor((1, 6, 5, 8), dtype=\"float32\") = R.reshape(kb, s)",
            "kp: R.Tensor((1, 2, 3, 8, 5), dtype=\"float32\") = R.permute_dims(kb, axes=[0, 1, 2, 4, 3])",
        )
        .replace(
            "kt: R.Tensor((1, 6, 8, 5), dtype=\"float32\") = R.permute_dims(kr, axes=[0, 1, 3, 2])",
            "kt: R.Tensor((1, 6, 8, 5), dtype=\"float32\") = R.reshape(kp, s2)",
        )
        .replace(
            "s: R.Shape([1, 6, 5, 8])) ->",
            "s: R.Shape([1, 6, 5, 8]), s2: R.Shape([1, 6, 8, 5])) ->",
        )
        .replace(
            "R.shape([1, 6, 5, 8]))",
            "R.shape([1, 6, 5, 8]), R.shape([1, 6, 8, 5]))",
        );
    let m = fusebox_core::text::parse_module_str(&dynamo).unwrap();
    let plan = crate::composite::recognise(m.get("attn").unwrap());
    let Some(crate::composite::Plan::Attention { perms, repeats, .. }) = &plan else {
        panic!("{plan:?}")
    };
    assert!(repeats.iter().all(Option::is_some), "{plan:?}");
    assert_eq!(perms, &[None, Some(vec![0, 1, 3, 2]), None]);
    let (fused, interp) = fused_and_interpreted(&dynamo, args(&mut r, 1));
    close(&fused, &interp, 1e-5);
    assert_ne!(bits(&fused), bits(&interp));
}
