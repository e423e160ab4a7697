//! The differential test against TVM itself (issue #20, item 6).
//!
//! `tests/tvm/cases/*.case` hold, per case, a module TVM 0.27's BlockBuilder built (as
//! `mod.script()` prints it), the partitioning flow TVM ran on it (FuseOpsByPattern with its
//! patterns and options, ± MergeCompositeFunctions; `partition_for_cublas`;
//! `partition_for_cutlass`; or `ConvertLayout` for conv2d) and the module TVM printed
//! afterwards (or the error TVM raised).
//! `tests/tvm/generate.py` writes them; it needs TVM and is run by hand (see its doc).
//!
//! - `corpus_round_trips`: every module of the corpus, input and TVM's output, parses, verifies,
//!   and `show -o` → `show` (write the module and its constants, read them back, print) is a
//!   fixed point. The one output TVM's own `well_formed` rejects must be rejected by fusebox.
//! - `fusebox_agrees_with_tvm`: fusebox runs the same flow on the printed input (the cuBLAS and
//!   CUTLASS tables of `backends/*/src/patterns.rs`, the cases' patterns through the text syntax)
//!   and its result, printed and read back, is compared with TVM's printed output, both reduced
//!   to a structural summary: every function by name with its attributes (`Composite`,
//!   `Codegen`, `Primitive`, `global_symbol`), params (by name in user functions, by position in
//!   the ones a pass made), bindings (callee with op attributes and arguments, in order, local
//!   functions nested) and return, with types; symbolic dims are renamed per function. `main`'s
//!   bindings give the call order; an `if` is summarised with its condition and each branch's
//!   blocks and yielded value, nested under it. Var names are not compared (TVM names every var a pass emits
//!   `lv`/`gv` and its printer numbers them; fusebox's names are unique); the report counts the
//!   cases that also print identically. Where fusebox differs
//!   on purpose, [`DELIBERATE`] names the case and the reason, and the test checks the evidence
//!   for that reason (TVM's error, TVM's ill-formed output, fusebox's rejection, a deleted op).
//!   It fails below 95% agreement, on any difference not in the table, and on a table entry
//!   that no longer differs or whose evidence is missing.
//! - Cases marked `pending: <gap>` use IR fusebox cannot handle yet (none now). They are
//!   counted and printed, not compared; one that now parses is reported so it can be switched
//!   on.
//! - With `FUSEBOX_TVM_PYTHON` pointing at a python with TVM 0.27, `live_tvm_matches_corpus`
//!   regenerates the corpus into a temporary directory, checks that it is identical to the
//!   committed one, and runs the comparison on it; otherwise it prints that the committed corpus
//!   is used.
//! - `FUSEBOX_TVM_DIFF_DUMP=DIR` writes fusebox's printed result of every compared case to
//!   `DIR/<case>.fusebox.relax` and TVM's output as fusebox prints it to `DIR/<case>.tvm.relax`,
//!   to diff.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::ir::infer::brief;
use fusebox_core::ir::verify::verify;
use fusebox_core::ir::{
    Callee, Dim, ExprId, ExprKind, Function, Module, PrimValue, Sym, TensorType, Type,
};
use fusebox_core::op::Op;
use fusebox_core::pattern::check::NoLeakingIntermediates;
use fusebox_core::text::{self, ConstTable};
use fusebox_core::transform::{
    FusionPattern, PartitionOptions, Rejection, fuse_ops_by_pattern, merge_composite_functions,
    sort_by_priority,
};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The committed corpus has at least this many cases (the generator writes 433).
const MIN_CASES: usize = 400;

/// The agreement rate below which the test fails.
const MIN_AGREEMENT: f64 = 0.95;

/// Why fusebox's result differs from TVM's on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    /// TVM raises "A cyclic dependency detected" (a one-hop detour); fusebox drops the match
    /// with a reason and partitions the rest.
    CycleTvmRaises,
    /// TVM misses a cycle through two or more outside bindings and returns a module its own
    /// `well_formed` rejects (or crashes in a later pass on it); fusebox drops the match.
    CycleTvmMisses,
    /// Within one pattern, a match that overlaps an earlier group only in an interior node:
    /// TVM steals that node and leaves the earlier group partial; fusebox drops the match.
    PartialOverlapSteal,
    /// A match whose result nobody uses: TVM deletes its bindings ("dead codes"); fusebox
    /// never drops an op.
    DeadMatch,
    /// MergeCompositeFunctions on a module with several entry functions: TVM groups only
    /// `main` and then fails an internal check on the other functions' vars; fusebox merges
    /// the composites of every entry function.
    MergeOnlyMain,
    /// MergeCompositeFunctions on a module with an `if`: TVM raises ("Do not have a default
    /// for relax.expr.If"); fusebox merges inside each branch.
    MergeIfTvmRaises,
    /// MergeCompositeFunctions on a module with `R.match_cast` (a value-dependent extent):
    /// TVM 0.27 raises ("Invalid type: relax.expr.MatchCast"); fusebox merges around it.
    MergeMatchCastTvmRaises,
    /// A constant without a value lifted as a parameter (`bind_constants=false`): TVM types the
    /// parameter from the constant's value, which `mod.script()` omits; the printed use does not
    /// tell its shape (a broadcasting operand), so fusebox's parameter is less specific.
    ValuelessShapeUntold,
    /// ConvertLayout: fusebox carries the new layout where TVM 0.27 goes back to the original
    /// (through `clip`, and through a broadcast with a lower-rank operand, which it expands) and
    /// permutes a value once per block (TVM once per use): the same ops on the same values,
    /// only the `permute_dims` / `expand_dims` around them differ.
    LayoutCarried,
}

impl Reason {
    fn describe(self) -> &'static str {
        match self {
            Reason::CycleTvmRaises => {
                "cycle (one hop): TVM raises, fusebox drops the match and partitions the rest"
            }
            Reason::CycleTvmMisses => {
                "cycle (two or more hops) TVM misses: TVM's output is ill-formed, fusebox drops the match"
            }
            Reason::PartialOverlapSteal => {
                "partial overlap within one pattern: TVM steals an interior node, fusebox drops the later match"
            }
            Reason::DeadMatch => "dead match: TVM deletes the unused group, fusebox keeps every op",
            Reason::MergeOnlyMain => {
                "MergeCompositeFunctions with several entry functions: TVM fails outside main, fusebox merges in each"
            }
            Reason::MergeIfTvmRaises => {
                "MergeCompositeFunctions on a module with `if`: TVM raises, fusebox merges inside each branch"
            }
            Reason::MergeMatchCastTvmRaises => {
                "MergeCompositeFunctions on a module with R.match_cast: TVM raises, fusebox merges"
            }
            Reason::ValuelessShapeUntold => {
                "constant without a value lifted as a parameter: TVM types it from the value the printed input omits, fusebox from its use"
            }
            Reason::LayoutCarried => {
                "ConvertLayout: fusebox carries the layout further than TVM 0.27 (the same ops; fewer round trips)"
            }
        }
    }
}

/// The deliberate differences: every case where fusebox's result differs from TVM's, with the
/// reason. The test checks each entry's evidence and that the case still differs.
const DELIBERATE: &[(&str, Reason, &str)] = &[
    (
        "cyclic_one_hop",
        Reason::CycleTvmRaises,
        "add(relu(_), _) over relu → gelu → add (TVM's test_cyclic_dependency)",
    ),
    (
        "cyclic_two_hops",
        Reason::CycleTvmMisses,
        "relu → gelu → tanh → add: TVM emits gelu(a) before the call defining `a`",
    ),
    (
        "random_148_plain",
        Reason::CycleTvmRaises,
        "cpu.grow's matches at v3, v5 and v7 each leave the group and come back (v0 → v1 → v2 → v3); TVM misses the first, raises on v5",
    ),
    (
        "random_197_plain",
        Reason::CycleTvmRaises,
        "cpu.grow's match at out4 would enclose a path through v3",
    ),
    (
        "partial_overlap_steal",
        Reason::PartialOverlapSteal,
        "relu(matmul) | add(matmul, _): TVM leaves a relu-only cpu.mm_act composite",
    ),
    (
        "random_023_plain",
        Reason::PartialOverlapSteal,
        "the stolen matmul feeds back, so TVM then raises a cyclic dependency",
    ),
    (
        "random_044_merged",
        Reason::PartialOverlapSteal,
        "TVM leaves an add-only cpu.mm_or composite, which MergeCompositeFunctions then merges",
    ),
    (
        "random_065_merged",
        Reason::PartialOverlapSteal,
        "TVM's MergeCompositeFunctions then fails an internal check (memo_.count) on the result",
    ),
    (
        "random_085_plain",
        Reason::PartialOverlapSteal,
        "the stolen matmul feeds back, so TVM then raises a cyclic dependency",
    ),
    (
        "random_103_plain",
        Reason::PartialOverlapSteal,
        "TVM leaves an add-only cpu.mm_or composite",
    ),
    (
        "random_130_annotated",
        Reason::PartialOverlapSteal,
        "two gelus of one add: TVM leaves a gelu-only cpu.add_gelu composite",
    ),
    (
        "dead_match",
        Reason::DeadMatch,
        "relu(x) bound to an unused var: TVM deletes it",
    ),
    (
        "two_functions_merged",
        Reason::MergeOnlyMain,
        "main and main2: TVM raises `Variable lv2 could not be found in any group`",
    ),
    (
        "branch_if_merged",
        Reason::MergeIfTvmRaises,
        "cpu.mm_relu in the then branch: TVM's MergeCompositeFunctions has no case for `If`",
    ),
    (
        "branch_mlp_merged",
        Reason::MergeIfTvmRaises,
        "composites in both branches: TVM's MergeCompositeFunctions has no case for `If`",
    ),
    (
        "nonzero_rows_merged",
        Reason::MergeMatchCastTvmRaises,
        "rows of x picked by nonzero + R.match_cast, then cpu.mm_relu: TVM's MergeCompositeFunctions has no case for MatchCast",
    ),
    (
        "tensor_const_lifted",
        Reason::ValuelessShapeUntold,
        "R.add(m, metadata[...]) broadcasts, so the (8,) bias may have any shape that broadcasts to (4, 8): fusebox's param_0 is Tensor(dtype=float32)",
    ),
    (
        "branch_nested_merged",
        Reason::MergeIfTvmRaises,
        "composites in two nested branches: TVM's MergeCompositeFunctions has no case for `If`",
    ),
    (
        "convert_layout_relu6",
        Reason::LayoutCarried,
        "TVM 0.27 has no layout rule for clip: it permutes back to NCHW before the ReLU6 and to NHWC again after; fusebox clips in NHWC",
    ),
    (
        "convert_layout_shared_input",
        Reason::LayoutCarried,
        "TVM permutes x once per conv and goes back to NCHW for the multiply by the (8, 1, 1) scale; fusebox permutes x once and expands the scale to (1, 1, 1, 8)",
    ),
];

/// A partitioning flow.
#[derive(Clone, Debug, PartialEq)]
enum Flow {
    /// FuseOpsByPattern with the case's patterns, then MergeCompositeFunctions when `merge`.
    Fobp {
        patterns: Vec<(String, String, bool)>,
        opts: PartitionOptions,
        merge: bool,
    },
    /// `partition_for_cublas(mod)`: the cuBLAS table, bind_constants=false, annotate_codegen.
    Cublas,
    /// `partition_for_cutlass(mod)`: the CUTLASS table, bind_constants=false, annotate_codegen.
    Cutlass,
    /// `ConvertLayout({"relax.nn.conv2d": [data, kernel]})`.
    ConvertLayout { data: String, kernel: String },
}

/// One case of the corpus.
#[derive(Debug)]
struct Case {
    name: String,
    file: PathBuf,
    flow: Flow,
    pending: Option<String>,
    tvm_error: Option<String>,
    tvm_ill_formed: Option<String>,
    input: String,
    tvm: Option<String>,
}

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tvm/cases")
}

fn parse_case(path: &Path) -> Result<Case, String> {
    let src = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    let (head, rest) = src
        .split_once("# ==== input ====\n")
        .ok_or("no `# ==== input ====` line")?;
    let (input, tvm) = match rest.split_once("# ==== tvm ====\n") {
        Some((i, t)) => (i.to_string(), Some(t.to_string())),
        None => (rest.to_string(), None),
    };
    let mut name = None;
    let mut flow = None;
    let mut patterns = Vec::new();
    let mut opts = PartitionOptions::default();
    let mut merge = false;
    let mut pending = None;
    let mut tvm_error = None;
    let mut tvm_ill_formed = None;
    for line in head.lines() {
        let Some((key, value)) = line
            .strip_prefix("# ")
            .and_then(|l| l.split_once(": "))
            .map(|(k, v)| (k, v.trim()))
        else {
            return Err(format!("bad header line `{line}`"));
        };
        match key {
            "case" => name = Some(value.to_string()),
            "group" => {}
            "flow" => flow = Some(value.to_string()),
            "pattern" | "pattern+leakcheck" => {
                let (n, p) = value
                    .split_once(" = ")
                    .ok_or_else(|| format!("bad pattern line `{line}`"))?;
                patterns.push((n.to_string(), p.to_string(), key == "pattern+leakcheck"));
            }
            "options" => {
                for kv in value.split_whitespace() {
                    let (k, v) = kv
                        .split_once('=')
                        .ok_or_else(|| format!("bad option `{kv}`"))?;
                    let v = match v {
                        "true" => true,
                        "false" => false,
                        _ => return Err(format!("bad option value `{kv}`")),
                    };
                    match k {
                        "bind_constants" => opts.bind_constants = v,
                        "annotate_codegen" => opts.annotate_codegen = v,
                        "merge" => merge = v,
                        _ => return Err(format!("unknown option `{kv}`")),
                    }
                }
            }
            "pending" => pending = Some(value.to_string()),
            "tvm_error" => tvm_error = Some(value.to_string()),
            "tvm_well_formed" => tvm_ill_formed = Some(value.to_string()),
            _ => return Err(format!("unknown header `{key}`")),
        }
    }
    let flow = match flow.as_deref() {
        Some("fuse_ops_by_pattern") => Flow::Fobp {
            patterns,
            opts,
            merge,
        },
        Some("cublas") => Flow::Cublas,
        // `cutlass_table`: partition_for_cutlass's FuseOpsByPattern step alone (TVM 0.27's
        // partition_for_cutlass raises after partitioning on modules with R.nn.attention).
        Some("cutlass" | "cutlass_table") => Flow::Cutlass,
        Some(f) if f.starts_with("convert_layout ") => {
            match f.split_whitespace().collect::<Vec<_>>()[..] {
                [_, data, kernel] => Flow::ConvertLayout {
                    data: data.to_string(),
                    kernel: kernel.to_string(),
                },
                _ => return Err(format!("flow `{f}`: expected `convert_layout DATA KERNEL`")),
            }
        }
        other => return Err(format!("unknown flow {other:?}")),
    };
    if tvm.is_none() && tvm_error.is_none() {
        return Err("neither TVM's output nor TVM's error".into());
    }
    Ok(Case {
        name: name.ok_or("no `# case:` line")?,
        file: path.to_path_buf(),
        flow,
        pending,
        tvm_error,
        tvm_ill_formed,
        input,
        tvm,
    })
}

/// Every case under `dir`, sorted by file name. Panics when the corpus is missing or short: a
/// test that cannot find its data fails.
fn load_cases(dir: &Path) -> Vec<Case> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read the corpus {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "case"))
        .collect();
    paths.sort();
    assert!(
        paths.len() >= MIN_CASES,
        "expected at least {MIN_CASES} cases in {}, found {}",
        dir.display(),
        paths.len()
    );
    let cases: Vec<Case> = paths
        .iter()
        .map(|p| parse_case(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    for c in &cases {
        let stem = c.file.file_stem().map(|s| s.to_string_lossy().into_owned());
        assert_eq!(
            stem.as_deref(),
            Some(c.name.as_str()),
            "{}: the case name differs from the file name",
            c.file.display()
        );
    }
    cases
}

fn parse(src: &str, what: &str) -> Result<Module, String> {
    let m = text::parse_module(src, what, &ConstTable::new())
        .map_err(|e| format!("does not parse:\n{e}"))?;
    verify(&m).map_err(|e| format!("does not verify:\n{e}"))?;
    Ok(m)
}

/// `fusebox show -o F` then `fusebox show F`, through the functions the CLI calls: the text
/// read back prints the same.
fn show_fixed_point(m: &Module, tmp: &Path, what: &str) -> Result<(), String> {
    let first = text::print_module(m).text;
    let path = tmp.join("module.relax");
    text::write_module(&path, m).map_err(|e| format!("show -o fails: {e}"))?;
    let back = text::read_module(&path).map_err(|e| format!("show of `show -o` fails: {e}"))?;
    verify(&back).map_err(|e| format!("`show -o`'s output does not verify: {e}"))?;
    let second = text::print_module(&back).text;
    if first != second {
        return Err(format!(
            "{what}: show -o → show is not a fixed point:\n{}",
            similar::TextDiff::from_lines(&first, &second).unified_diff()
        ));
    }
    Ok(())
}

fn backend_table(name: &str) -> Vec<FusionPattern> {
    fusebox::link_backends();
    let b = fusebox_core::backend::make_backend(name, &Default::default())
        .unwrap_or_else(|e| panic!("backend {name}: {e}"));
    let mut table = b.patterns();
    sort_by_priority(&mut table);
    table
}

/// Runs the case's flow with fusebox on the parsed input.
fn run_fusebox(flow: &Flow, m: &Module) -> Result<(Module, Vec<Rejection>), String> {
    let (patterns, opts, merge) = match flow {
        Flow::ConvertLayout { data, kernel } => {
            let out = fusebox_core::transform::convert_layout(m, data, kernel)
                .map_err(|e| format!("convert_layout: {e}"))?;
            return Ok((out, Vec::new()));
        }
        Flow::Cublas | Flow::Cutlass => (
            backend_table(if *flow == Flow::Cublas {
                "cublas"
            } else {
                "cutlass"
            }),
            PartitionOptions {
                bind_constants: false,
                annotate_codegen: true,
            },
            false,
        ),
        Flow::Fobp {
            patterns,
            opts,
            merge,
        } => {
            let mut table = Vec::new();
            for (name, src, leak) in patterns {
                let pat = fusebox_core::pattern::parse_pattern(src)
                    .map_err(|e| format!("pattern `{src}`: {e}"))?;
                let mut fp = FusionPattern::new(name, pat);
                if *leak {
                    fp = fp.with_check(Arc::new(NoLeakingIntermediates));
                }
                table.push(fp);
            }
            (table, *opts, *merge)
        }
    };
    let out = fuse_ops_by_pattern(m, &patterns, opts).map_err(|e| format!("partition: {e}"))?;
    let mut module = out.module;
    if merge {
        module = merge_composite_functions(&module).map_err(|e| format!("merge: {e}"))?;
    }
    verify(&module).map_err(|e| format!("fusebox's result does not verify: {e}"))?;
    Ok((module, out.rejections))
}

// ------------------------------------------------------------------------------------------------
// The structural summary.

/// A leaf or a value, named independently of var names: params by name, bindings by their index
/// in the function (`%3`), constants by dtype and shape.
fn describe(f: &Function, e: ExprId, index: &BTreeMap<u32, usize>) -> String {
    match &f.expr(e).kind {
        ExprKind::Var(v) => {
            if let Some(p) = f.params.iter().position(|p| p == v) {
                if is_entry(f) {
                    format!("${}", f.var(f.params[p]).name)
                } else {
                    format!("${p}")
                }
            } else if let Some(i) = index.get(&v.as_u32()) {
                format!("%{i}")
            } else {
                format!("?{}", f.var(*v).name)
            }
        }
        ExprKind::Const(c) => format!("const({})", brief(&c.ty())),
        ExprKind::ConstRef(c) => format!("const({c}: {})", brief(&f.expr(e).ty)),
        ExprKind::Call { callee, args } => {
            let callee = match callee {
                Callee::Op(op) => format!("{}{}", op.name(), op_attrs(op)),
                Callee::Global(g) => format!("@{g}"),
                Callee::Local(v) => match index.get(&v.as_u32()) {
                    Some(i) => format!("%{i}"),
                    None => format!("?{}", f.var(*v).name),
                },
            };
            let args: Vec<String> = args.iter().map(|a| describe(f, *a, index)).collect();
            format!("{callee}({})", args.join(", "))
        }
        ExprKind::Tuple(fs) => {
            let fs: Vec<String> = fs.iter().map(|a| describe(f, *a, index)).collect();
            format!("({})", fs.join(", "))
        }
        ExprKind::TupleGetItem(t, i) => format!("{}[{i}]", describe(f, *t, index)),
        ExprKind::ShapeLit(dims) => format!("shape{dims:?}"),
        ExprKind::Prim(p) => match p {
            PrimValue::Int(v) => format!("prim({v})"),
            PrimValue::Float(v, d) => format!("prim({v}, {d:?})"),
            PrimValue::Str(s) => format!("str({s:?})"),
            PrimValue::Bool(b) => format!("prim({b})"),
        },
        ExprKind::Function(_) => "<function>".into(),
        ExprKind::If(_) => "<if>".into(),
    }
}

/// An op's attributes as printed (so `padding` or `axis` differences show).
fn op_attrs(op: &fusebox_core::op::Op) -> String {
    let attrs: Vec<String> = op
        .kwargs()
        .iter()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect();
    if attrs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", attrs.join(", "))
    }
}

/// A type with its symbolic dims renamed `s0`, `s1`, … in order of first appearance in the
/// function (`names`): symbolic vars are the function's own, and TVM's printer names the fresh
/// ones of a nested function `n_1` where fusebox keeps `n`.
fn canon(t: &Type, names: &mut Vec<Sym>) -> String {
    brief(&rename_type(t, names))
}

fn rename_dim(d: &Dim, names: &mut Vec<Sym>) -> Dim {
    match d {
        Dim::Static(_) => d.clone(),
        Dim::Sym(s) => {
            let i = names.iter().position(|n| n == s).unwrap_or_else(|| {
                names.push(s.clone());
                names.len() - 1
            });
            Dim::sym(&format!("s{i}"))
        }
        Dim::Expr(e) => Dim::binary(e.0, rename_dim(&e.1, names), rename_dim(&e.2, names)),
    }
}

fn rename_type(t: &Type, names: &mut Vec<Sym>) -> Type {
    match t {
        Type::Tensor(tt) => Type::Tensor(TensorType {
            dims: tt
                .dims
                .as_ref()
                .map(|ds| ds.iter().map(|d| rename_dim(d, names)).collect()),
            ndim: tt.ndim,
            dtype: tt.dtype,
        }),
        Type::Shape { dims, ndim } => Type::Shape {
            dims: dims
                .as_ref()
                .map(|ds| ds.iter().map(|d| rename_dim(d, names)).collect()),
            ndim: *ndim,
        },
        Type::Tuple(ts) => Type::Tuple(ts.iter().map(|t| rename_type(t, names)).collect()),
        other => other.clone(),
    }
}

fn summarize_function(out: &mut String, indent: &str, name: &str, f: &Function) {
    let mut syms: Vec<Sym> = Vec::new();
    let a = &f.attrs;
    let mut attrs = Vec::new();
    if let Some(c) = &a.composite {
        attrs.push(format!("Composite={c}"));
    }
    if let Some(c) = &a.codegen {
        attrs.push(format!("Codegen={c}"));
    }
    if a.is_primitive() {
        attrs.push("Primitive".into());
    }
    if let Some(g) = &a.global_symbol {
        attrs.push(format!("global_symbol={g}"));
    }
    for (k, v) in &a.extra {
        attrs.push(format!("{k}={v:?}"));
    }
    let _ = writeln!(
        out,
        "{indent}fn {name}{} [{}]",
        if f.is_private() { " private" } else { "" },
        attrs.join(", ")
    );
    for (i, p) in f.params.iter().enumerate() {
        let v = f.var(*p);
        if is_entry(f) {
            let _ = writeln!(
                out,
                "{indent}  param {}: {}",
                v.name,
                canon(&v.ty, &mut syms)
            );
        } else {
            let _ = writeln!(out, "{indent}  param ${i}: {}", canon(&v.ty, &mut syms));
        }
    }
    let mut index = BTreeMap::new();
    let mut i = 0;
    summarize_blocks(out, indent, f, &f.blocks, &mut index, &mut i, &mut syms);
    if let Some(r) = f.ret {
        let _ = writeln!(
            out,
            "{indent}  return {} : {}",
            describe(f, r, &index),
            canon(&f.ret_ty, &mut syms)
        );
    }
}

/// The blocks of a function or of a branch of an `if` (bindings numbered across the function,
/// branches indented under their `if`).
fn summarize_blocks(
    out: &mut String,
    indent: &str,
    f: &Function,
    blocks: &[fusebox_core::ir::Block],
    index: &mut BTreeMap<u32, usize>,
    i: &mut usize,
    syms: &mut Vec<Sym>,
) {
    for (bi, block) in blocks.iter().enumerate() {
        let _ = writeln!(
            out,
            "{indent}  block {bi}{}",
            if block.dataflow { " dataflow" } else { "" }
        );
        for b in &block.bindings {
            let var = f.var(b.var);
            match &f.expr(b.value).kind {
                ExprKind::Function(inner) => {
                    // The local function's var name is not compared: TVM 0.27 names the ones
                    // MergeCompositeFunctions inlines `gv`, `gv1`, … (the exact-text count shows it).
                    let _ = writeln!(out, "{indent}    %{i} = local function:");
                    summarize_function(out, &format!("{indent}      "), "local", inner);
                }
                ExprKind::If(e) => {
                    let _ = writeln!(out, "{indent}    if {}:", describe(f, e.cond, index));
                    for (side, s) in [("then", &e.then_branch), ("else", &e.else_branch)] {
                        let _ = writeln!(out, "{indent}    {side}:");
                        let inner = format!("{indent}    ");
                        summarize_blocks(out, &inner, f, &s.blocks, index, i, syms);
                        let _ = writeln!(out, "{inner}  yield {}", describe(f, s.body, index));
                    }
                    let _ = writeln!(
                        out,
                        "{indent}    %{i} (out) = if : {}",
                        canon(&var.ty, syms)
                    );
                }
                _ => {
                    let _ = writeln!(
                        out,
                        "{indent}    %{i}{} = {} : {}",
                        if var.dataflow { "" } else { " (out)" },
                        describe(f, b.value, index),
                        canon(&var.ty, syms)
                    );
                }
            }
            index.insert(b.var.as_u32(), *i);
            *i += 1;
        }
    }
}

/// Whether `f` is a function the user wrote (not one a pass made): its params keep their
/// names in the summary. The params of the functions a pass made are named after the caller's
/// arguments, and TVM's names there are its internal ones (every var a pass emits is `lv`, the
/// printer numbers them) while fusebox's are the printed ones, so they are compared by
/// position and type; the caller's arguments say what each one is.
fn is_entry(f: &Function) -> bool {
    f.attrs.composite.is_none() && f.attrs.codegen.is_none() && !f.attrs.is_primitive()
}

/// The normalised structural summary of a module: its functions in name order.
fn summary(m: &Module) -> String {
    let mut out = String::new();
    for name in m.sorted_names() {
        if let Some(f) = m.get(name) {
            summarize_function(&mut out, "", name, f);
        }
    }
    out
}

/// How many op calls a module holds, nested functions included (a deleted op shows here).
fn op_calls(m: &Module) -> usize {
    fn count(f: &Function) -> usize {
        let mut all = Vec::new();
        fusebox_core::ir::for_each_binding_deep(f, &f.blocks, &mut |b| all.push(*b));
        all.iter()
            .map(|b| match &f.expr(b.value).kind {
                ExprKind::Call {
                    callee: Callee::Op(_),
                    ..
                } => 1,
                ExprKind::Function(inner) => count(inner),
                _ => 0,
            })
            .sum()
    }
    m.functions.values().map(count).sum()
}

// ------------------------------------------------------------------------------------------------
// The comparison.

/// What comparing one case gave.
enum Outcome {
    /// Same summary (and `exact` when the printed text is identical too).
    Agree { exact: bool },
    /// Different summaries; the reasons the evidence supports, and a diff for the report.
    Differ {
        evidence: Vec<Reason>,
        detail: String,
    },
    /// Something failed that must not (a parse error, a fusebox error).
    Broken(String),
}

fn evidence(case: &Case, input: &Module, mine: &Module, rejections: &[Rejection]) -> Vec<Reason> {
    let mut r = Vec::new();
    let fusebox_cycle = rejections
        .iter()
        .any(|x| x.reason.contains("would create a cycle"));
    if fusebox_cycle
        && case
            .tvm_error
            .as_deref()
            .is_some_and(|e| e.contains("cyclic dependency"))
    {
        r.push(Reason::CycleTvmRaises);
    }
    if fusebox_cycle
        && (case.tvm_ill_formed.is_some()
            || case
                .tvm_error
                .as_deref()
                .is_some_and(|e| !e.contains("cyclic dependency")))
    {
        r.push(Reason::CycleTvmMisses);
    }
    if rejections
        .iter()
        .any(|x| x.reason.contains("without containing all of it"))
    {
        r.push(Reason::PartialOverlapSteal);
    }
    let merge = matches!(case.flow, Flow::Fobp { merge: true, .. });
    let entries = input.functions.values().filter(|f| is_entry(f)).count();
    if merge && entries > 1 && case.tvm_error.is_some() {
        r.push(Reason::MergeOnlyMain);
    }
    let has_if = input.functions.values().any(|f| {
        f.exprs
            .iter()
            .any(|(_, d)| matches!(d.kind, ExprKind::If(_)))
    });
    if merge
        && has_if
        && case
            .tvm_error
            .as_deref()
            .is_some_and(|e| e.contains("relax.expr.If"))
    {
        r.push(Reason::MergeIfTvmRaises);
    }
    if merge
        && case
            .tvm_error
            .as_deref()
            .is_some_and(|e| e.contains("relax.expr.MatchCast"))
    {
        r.push(Reason::MergeMatchCastTvmRaises);
    }
    if !input.valueless_constants().is_empty()
        && let Some(tvm) = case.tvm.as_deref().and_then(|t| parse(t, "tvm").ok())
        && less_specific_params(mine, &tvm)
    {
        r.push(Reason::ValuelessShapeUntold);
    }
    if let Some(tvm) = case.tvm.as_deref().and_then(|t| parse(t, "tvm").ok())
        && op_calls(&tvm) < op_calls(input)
        && op_calls(mine) == op_calls(input)
    {
        r.push(Reason::DeadMatch);
    }
    if matches!(case.flow, Flow::ConvertLayout { .. })
        && let Some(tvm) = case.tvm.as_deref().and_then(|t| parse(t, "tvm").ok())
        && compute_ops(mine) == compute_ops(&tvm)
        && layout_ops(mine) != layout_ops(&tvm)
    {
        r.push(Reason::LayoutCarried);
    }
    r
}

/// The op calls of `m` other than `permute_dims` and `expand_dims`, by op and attributes (as
/// printed), counted.
fn compute_ops(m: &Module) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for (_, f) in &m.functions {
        for b in f.bindings() {
            if let ExprKind::Call {
                callee: Callee::Op(op),
                ..
            } = &f.expr(b.value).kind
                && !matches!(op, Op::PermuteDims { .. } | Op::ExpandDims { .. })
            {
                *out.entry(format!("{op:?}")).or_insert(0) += 1;
            }
        }
    }
    out
}

/// The `permute_dims` and `expand_dims` calls of `m`.
fn layout_ops(m: &Module) -> usize {
    m.functions
        .values()
        .flat_map(|f| {
            f.bindings().filter(|b| {
                matches!(
                    &f.expr(b.value).kind,
                    ExprKind::Call {
                        callee: Callee::Op(Op::PermuteDims { .. } | Op::ExpandDims { .. }),
                        ..
                    }
                )
            })
        })
        .count()
}

/// Whether every function of `mine` has TVM's namesake's parameters, some less specific
/// (accepting TVM's type without equalling it) and none other than TVM's.
fn less_specific_params(mine: &Module, tvm: &Module) -> bool {
    let mut some = false;
    for (name, f) in &mine.functions {
        let Some(g) = tvm.functions.get(name) else {
            return false;
        };
        if f.params.len() != g.params.len() {
            return false;
        }
        for (&p, &q) in f.params.iter().zip(&g.params) {
            let (a, b) = (&f.var(p).ty, &g.var(q).ty);
            if !a.accepts(b) {
                return false;
            }
            some |= a != b;
        }
    }
    some
}

fn compare(case: &Case) -> Outcome {
    let input = match parse(&case.input, &format!("{}: input", case.name)) {
        Ok(m) => m,
        Err(e) => return Outcome::Broken(format!("input {e}")),
    };
    let (mine, rejections) = match run_fusebox(&case.flow, &input) {
        Ok(x) => x,
        Err(e) => return Outcome::Broken(e),
    };
    let evidence = evidence(case, &input, &mine, &rejections);
    let mut rejected = String::new();
    for r in &rejections {
        let _ = writeln!(
            rejected,
            "  fusebox rejected {} at {}: {}",
            r.pattern, r.at, r.reason
        );
    }
    let Some(tvm_text) = &case.tvm else {
        return Outcome::Differ {
            evidence,
            detail: format!(
                "TVM raised: {}\n{rejected}",
                case.tvm_error.as_deref().unwrap_or("?")
            ),
        };
    };
    if let Some(why) = &case.tvm_ill_formed {
        // Not read: fusebox rejects ill-formed IR (`corpus_round_trips` checks that it does).
        return Outcome::Differ {
            evidence,
            detail: format!("TVM's output is ill-formed: {why}\n{rejected}"),
        };
    }
    let tvm = match parse(tvm_text, &format!("{}: tvm", case.name)) {
        Ok(m) => m,
        Err(e) => return Outcome::Broken(format!("TVM's output {e}")),
    };
    // fusebox's result is compared as printed and read back, as TVM's is: the printer's
    // renaming of shadowed names (`x` → `x_1` in a local function) then applies to both.
    let mine_printed = text::print_module(&mine).text;
    if let Some(dir) = std::env::var_os("FUSEBOX_TVM_DIFF_DUMP") {
        // For a reader: fusebox's printed result beside TVM's, per case.
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(
            Path::new(&dir).join(format!("{}.fusebox.relax", case.name)),
            &mine_printed,
        );
    }
    let mine = match parse(&mine_printed, &format!("{}: fusebox", case.name)) {
        Ok(m) => m,
        Err(e) => return Outcome::Broken(format!("fusebox's printed result {e}")),
    };
    if let Some(dir) = std::env::var_os("FUSEBOX_TVM_DIFF_DUMP") {
        let _ = std::fs::write(
            Path::new(&dir).join(format!("{}.tvm.relax", case.name)),
            text::print_module(&tvm).text,
        );
    }
    let (a, b) = (summary(&tvm), summary(&mine));
    if a == b {
        let exact = text::print_module(&tvm).text == mine_printed;
        return Outcome::Agree { exact };
    }
    let mut detail = similar::TextDiff::from_lines(&a, &b)
        .unified_diff()
        .header("tvm", "fusebox")
        .to_string();
    detail.push_str(&rejected);
    Outcome::Differ { evidence, detail }
}

/// Compares every non-pending case of `dir`; returns the report and the failures.
fn check_corpus(dir: &Path) -> (String, Vec<String>) {
    let cases = load_cases(dir);
    let mut report = String::new();
    let mut failures = Vec::new();
    let (mut agree, mut exact, mut compared) = (0usize, 0usize, 0usize);
    let mut deliberate = Vec::new();
    let mut pending: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for case in &cases {
        if let Some(gap) = &case.pending {
            // Not counted; reported when fusebox already agrees, so it can be switched on.
            let state = match compare(case) {
                Outcome::Agree { .. } => "agrees now",
                Outcome::Differ { .. } => "differs",
                Outcome::Broken(_) => "unreadable",
            };
            pending
                .entry(gap.clone())
                .or_default()
                .push(format!("{} ({state})", case.name));
            continue;
        }
        compared += 1;
        let listed = DELIBERATE
            .iter()
            .find(|(n, _, _)| *n == case.name)
            .map(|(_, r, _)| *r);
        match (compare(case), listed) {
            (Outcome::Agree { exact: e }, None) => {
                agree += 1;
                exact += usize::from(e);
            }
            (Outcome::Agree { .. }, Some(r)) => failures.push(format!(
                "{}: listed as a deliberate difference ({}) but fusebox now agrees with TVM: remove it from DELIBERATE",
                case.name,
                r.describe()
            )),
            (Outcome::Differ { evidence, .. }, Some(r)) if evidence.contains(&r) => {
                deliberate.push((case.name.clone(), r));
            }
            (Outcome::Differ { evidence, detail }, Some(r)) => failures.push(format!(
                "{}: listed as `{}` but the evidence for it is missing (found {evidence:?}):\n{detail}",
                case.name,
                r.describe()
            )),
            (Outcome::Differ { evidence, detail }, None) => failures.push(format!(
                "{}: fusebox differs from TVM and the case is not in DELIBERATE (evidence: {evidence:?}):\n{detail}",
                case.name
            )),
            (Outcome::Broken(e), _) => failures.push(format!("{}: {e}", case.name)),
        }
    }
    for (name, _, _) in DELIBERATE {
        if !cases.iter().any(|c| c.name == *name) {
            failures.push(format!(
                "DELIBERATE names `{name}`, which is not in the corpus"
            ));
        }
    }
    let rate = agree as f64 / compared.max(1) as f64;
    let _ = writeln!(
        report,
        "tvm_diff: {} cases in {}; {compared} compared, {agree} agree with TVM ({:.1}%; {exact} print identically), {} deliberate differences, {} pending",
        cases.len(),
        dir.display(),
        rate * 100.0,
        deliberate.len(),
        pending.values().map(Vec::len).sum::<usize>()
    );
    for (name, r) in &deliberate {
        let note = DELIBERATE
            .iter()
            .find(|(n, _, _)| n == name)
            .map_or("", |(_, _, note)| *note);
        let _ = writeln!(report, "  deliberate: {name}: {} ({note})", r.describe());
    }
    for (gap, names) in &pending {
        let _ = writeln!(
            report,
            "  pending: {gap}: {} case(s): {}",
            names.len(),
            names.join(", ")
        );
    }
    if rate < MIN_AGREEMENT {
        failures.push(format!(
            "agreement {:.1}% is below {:.0}%",
            rate * 100.0,
            MIN_AGREEMENT * 100.0
        ));
    }
    (report, failures)
}

#[test]
fn fusebox_agrees_with_tvm() {
    let (report, failures) = check_corpus(&cases_dir());
    println!("{report}");
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn corpus_round_trips() {
    let cases = load_cases(&cases_dir());
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tvm_diff_round_trip");
    std::fs::create_dir_all(&tmp).unwrap();
    let mut failures = Vec::new();
    let mut modules = 0;
    let mut pending_now_parse = Vec::new();
    let mut pending_fail = 0;
    let mut ill_formed_rejected = 0;
    for case in &cases {
        let mut texts = vec![("input", case.input.as_str())];
        if let Some(t) = &case.tvm {
            if case.tvm_ill_formed.is_some() {
                // TVM's own well_formed rejects it: fusebox must not accept it either.
                match parse(t, &format!("{} (tvm)", case.name)) {
                    Ok(_) => failures.push(format!(
                        "{}: TVM's ill-formed output parses and verifies in fusebox",
                        case.name
                    )),
                    Err(_) => ill_formed_rejected += 1,
                }
            } else {
                texts.push(("tvm", t.as_str()));
            }
        }
        let mut ok = true;
        for (what, src) in texts {
            let label = format!("{} ({what})", case.name);
            let result =
                parse(src, &label).and_then(|m| show_fixed_point(&m, &tmp, &label).map(|()| m));
            match (result, &case.pending) {
                (Ok(_), None) => modules += 1,
                (Err(e), None) => failures.push(format!("{label}: {e}")),
                (Ok(_), Some(_)) => {}
                (Err(_), Some(_)) => ok = false,
            }
        }
        if let Some(gap) = &case.pending {
            if ok {
                pending_now_parse.push(format!("{} ({gap})", case.name));
            } else {
                // It must fail for its gap and nothing else.
                let err = parse(&case.input, &case.name).err().unwrap_or_default();
                let expected = match gap.as_str() {
                    "if/else control flow" => "found `if`",
                    "opaque unknown op R.stack" => "unknown op `relax.stack`",
                    "constants without values" => "no value for metadata",
                    other => panic!("{}: unknown gap `{other}`", case.name),
                };
                if err.is_empty() || err.contains(expected) {
                    pending_fail += 1;
                } else {
                    failures.push(format!(
                        "{}: pending on `{gap}` but fails otherwise:\n{err}",
                        case.name
                    ));
                }
            }
        }
    }
    println!(
        "tvm_diff round trip: {modules} modules parse, verify and are a fixed point of show -o → show; {ill_formed_rejected} ill-formed TVM output(s) rejected; {pending_fail} pending case(s) still fail"
    );
    if !pending_now_parse.is_empty() {
        println!(
            "pending cases that now parse and round-trip (switch them on by removing `pending:` from the generator): {}",
            pending_now_parse.join(", ")
        );
    }
    assert!(
        modules >= 2 * (MIN_CASES - 20) - 20,
        "too few modules checked: {modules}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// With `FUSEBOX_TVM_PYTHON` set: regenerate the corpus with TVM, check it is the committed one,
/// and compare fusebox against the live output.
#[test]
fn live_tvm_matches_corpus() {
    let Some(python) = std::env::var_os("FUSEBOX_TVM_PYTHON") else {
        println!(
            "tvm_diff: FUSEBOX_TVM_PYTHON is not set; the comparison uses the committed corpus tests/tvm/cases (set it to a python with apache-tvm==0.27.0.post1 to regenerate and compare live)"
        );
        return;
    };
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tvm_diff_live");
    let _ = std::fs::remove_dir_all(&out);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tvm/generate.py");
    let status = std::process::Command::new(&python)
        .arg(&script)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", Path::new(&python).display()));
    assert!(
        status.status.success(),
        "generate.py failed:\n{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let committed = load_cases(&cases_dir());
    let live = load_cases(&out);
    assert_eq!(
        committed.len(),
        live.len(),
        "the live corpus has a different number of cases"
    );
    let mut stale = Vec::new();
    for (c, l) in committed.iter().zip(&live) {
        let a = std::fs::read_to_string(&c.file).unwrap_or_default();
        let b = std::fs::read_to_string(&l.file).unwrap_or_default();
        if c.name != l.name || a != b {
            stale.push(c.name.clone());
        }
    }
    let (report, failures) = check_corpus(&out);
    println!("live: {report}");
    assert!(
        stale.is_empty(),
        "the committed corpus differs from TVM's live output (rerun tests/tvm/generate.py): {}",
        stale.join(", ")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
