//! `if`/`else` in the IR: the builder, the verifier's scoping rules, structural equality and
//! hashing, and passes that run inside branches (dead-code elimination, FuseOpsByPattern with
//! rejections naming the function that holds the `if`).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::ir::builder::FunctionBuilder;
use fusebox_core::ir::structural::{function_hash, module_eq};
use fusebox_core::ir::verify::verify;
use fusebox_core::ir::{
    Binding, Block, Callee, DType, ExprKind, Function, IfExpr, Module, Seq, Type,
};
use fusebox_core::op::Op;
use fusebox_core::pattern::parse_pattern;
use fusebox_core::text::{parse_module_str, print_module};
use fusebox_core::transform::{
    FusionPattern, PartitionOptions, dead_code_elimination, fuse_ops_by_pattern,
};

fn t4() -> Type {
    Type::tensor(&[4], DType::F32)
}

/// `main(c: bool scalar, x)`: `y = if c: exp(x) else: negative(x)`, returns `y`, built with the
/// builder; `flip` swaps the ops of the branches.
fn built(flip: bool) -> Module {
    let m = Module::new();
    let mut b = FunctionBuilder::new(&m);
    let c = b.param("c", Type::tensor(&[], DType::Bool));
    let x = b.param("x", t4());
    let (ce, xe) = (b.var(c), b.var(x));
    let (p, q) = if flip {
        (Op::Negative, Op::Exp)
    } else {
        (Op::Exp, Op::Negative)
    };
    let y = b
        .emit_if(
            "y",
            ce,
            |b| {
                b.begin_dataflow();
                let v = b.emit_output("a", Callee::Op(p), vec![xe])?;
                b.end_dataflow()?;
                Ok(b.var(v))
            },
            |b| {
                let v = b.emit("a", Callee::Op(q), vec![xe])?;
                Ok(b.var(v))
            },
        )
        .unwrap();
    let ye = b.var(y);
    let f = b.finish(ye).unwrap();
    let mut out = Module::new();
    out.insert("main", f);
    out
}

#[test]
fn built_if_verifies_prints_and_reads_back_equal() {
    let m = built(false);
    verify(&m).unwrap();
    let text = print_module(&m).text;
    assert!(text.contains("if c:") && text.contains("else:"), "{text}");
    let back = parse_module_str(&text).unwrap();
    assert!(module_eq(&m, &back), "{text}");
    assert_eq!(
        function_hash(m.get("main").unwrap()),
        function_hash(back.get("main").unwrap())
    );
    // Branches that differ make functions that differ.
    let other = built(true);
    assert!(!module_eq(&m, &other));
    assert_ne!(
        function_hash(m.get("main").unwrap()),
        function_hash(other.get("main").unwrap())
    );
}

/// The function of `built(false)` with its `if` binding edited by `edit`.
fn edited(edit: impl FnOnce(&mut Function)) -> Module {
    let mut m = built(false);
    let f = m.functions.get_mut("main").unwrap();
    edit(f);
    m
}

fn if_of(f: &mut Function) -> &mut IfExpr {
    let e = f.blocks[0].bindings[0].value;
    match &mut f.exprs[e].kind {
        ExprKind::If(i) => i,
        _ => panic!("expected an if"),
    }
}

fn errors(m: &Module) -> String {
    verify(m).unwrap_err().to_string()
}

#[test]
fn a_var_bound_in_a_branch_is_not_visible_after_the_if() {
    let m = edited(|f| {
        let inner = if_of(f).else_branch.blocks[0].bindings[0].var;
        f.ret = Some(f.var_expr(inner));
    });
    let e = errors(&m);
    assert!(e.contains("`a` is used before it is defined"), "{e}");
}

#[test]
fn a_var_bound_in_both_branches_is_defined_twice() {
    let m = edited(|f| {
        let then_var = if_of(f).then_branch.blocks[0].bindings[0].var;
        if_of(f).else_branch.blocks[0].bindings[0].var = then_var;
    });
    let e = errors(&m);
    assert!(e.contains("is defined more than once"), "{e}");
}

#[test]
fn an_if_inside_a_dataflow_block_and_a_non_leaf_body_are_errors() {
    let m = edited(|f| f.blocks[0].dataflow = true);
    let e = errors(&m);
    assert!(
        e.contains("an `if` is bound inside a dataflow block"),
        "{e}"
    );
    let m = edited(|f| {
        let call = if_of(f).else_branch.blocks[0].bindings[0].value;
        if_of(f).else_branch.body = call;
    });
    let e = errors(&m);
    assert!(e.contains("body of a branch must be a var"), "{e}");
}

#[test]
fn a_dataflow_var_of_a_branch_block_is_not_its_body() {
    let m = edited(|f| {
        let v = if_of(f).then_branch.blocks[0].bindings[0].var;
        f.vars[v].dataflow = true;
    });
    let e = errors(&m);
    assert!(
        e.contains("dataflow var `a` is used outside its dataflow block"),
        "{e}"
    );
}

#[test]
fn a_condition_must_be_a_bool_scalar() {
    let m = edited(|f| {
        let x = f.params[1];
        if_of(f).cond = f.var_expr(x);
    });
    let e = errors(&m);
    assert!(e.contains("condition of `if` must be a bool scalar"), "{e}");
}

const BRANCHY: &str = r#"
@I.ir_module
class Module:
    @R.function
    def main(c: R.Prim("bool"), x: R.Tensor((4,), dtype="float32"), w: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
        with R.dataflow():
            only_in_branch = R.multiply(w, w)
            unused = R.exp(x)
            R.output(only_in_branch, unused)
        if c:
            with R.dataflow():
                a = R.add(x, only_in_branch)
                dead = R.exp(a)
                r = R.nn.relu(a)
                R.output(r)
            y = r
        else:
            y = x
        if c:
            z = R.exp(x)
        else:
            z = x
        return y
"#;

#[test]
fn dead_code_elimination_works_inside_branches() {
    let m = parse_module_str(BRANCHY).unwrap();
    let out = dead_code_elimination(&m).unwrap();
    verify(&out).unwrap();
    let text = print_module(&out).text;
    // Read only inside a branch: kept. Unused, inside a branch or as a whole `if`: removed.
    assert!(text.contains("only_in_branch"), "{text}");
    assert!(!text.contains("unused"), "{text}");
    assert!(!text.contains("dead"), "{text}");
    assert!(!text.contains("z:"), "{text}");
    assert_eq!(text.matches("if c:").count(), 1, "{text}");
    // A second run changes nothing.
    assert!(module_eq(&out, &dead_code_elimination(&out).unwrap()));
}

#[test]
fn rejections_inside_branches_name_the_enclosing_function() {
    let m = parse_module_str(BRANCHY).unwrap();
    let pat = FusionPattern::new(
        "cpu.add_relu",
        parse_pattern("relax.nn.relu(relax.add(_, _))").unwrap(),
    )
    .with_check(std::sync::Arc::new(
        fusebox_core::pattern::check::NoLeakingIntermediates,
    ));
    let out = fuse_ops_by_pattern(&m, &[pat], PartitionOptions::default()).unwrap();
    verify(&out.module).unwrap();
    assert_eq!(out.rejections.len(), 1, "{:?}", out.rejections);
    assert_eq!(out.rejections[0].at, "main/r");
    // Without the check the group is outlined inside the branch.
    let pat = FusionPattern::new(
        "cpu.add_relu",
        parse_pattern("relax.nn.relu(relax.add(_, _))").unwrap(),
    );
    let out = fuse_ops_by_pattern(&m, &[pat], PartitionOptions::default()).unwrap();
    verify(&out.module).unwrap();
    let text = print_module(&out.module).text;
    assert!(
        text.contains("cls.fused_relax_add_relax_nn_relu(x, only_in_branch)"),
        "{text}"
    );
    assert!(!text.contains("__if_"), "{text}");
}

#[test]
fn an_if_built_by_hand_from_blocks_verifies() {
    // The IR types are public: a branch is a `Seq` of blocks and a body.
    let mut f = Function::new();
    let c = f.add_var("c", Type::Prim(DType::Bool), false);
    let x = f.add_var("x", t4(), false);
    f.params = vec![c, x];
    let xe = f.var_expr(x);
    let call = f.add_expr(
        ExprKind::Call {
            callee: Callee::Op(Op::Exp),
            args: vec![xe],
        },
        t4(),
    );
    let a = f.add_var("a", t4(), false);
    let ae = f.var_expr(a);
    let ce = f.var_expr(c);
    let e = f.add_expr(
        ExprKind::If(Box::new(IfExpr {
            cond: ce,
            then_branch: Seq {
                blocks: vec![Block {
                    dataflow: false,
                    bindings: vec![Binding {
                        var: a,
                        value: call,
                    }],
                }],
                body: ae,
            },
            else_branch: Seq {
                blocks: Vec::new(),
                body: xe,
            },
        })),
        t4(),
    );
    let y = f.add_var("y", t4(), false);
    f.blocks.push(Block {
        dataflow: false,
        bindings: vec![Binding { var: y, value: e }],
    });
    f.ret = Some(f.var_expr(y));
    f.ret_ty = t4();
    let mut m = Module::new();
    m.insert("main", f);
    verify(&m).unwrap();
    let text = print_module(&m).text;
    let back = parse_module_str(&text).unwrap();
    assert!(module_eq(&m, &back), "{text}");
}
