//! Control flow for the passes: run a module pass inside the branches of `if`s, as TVM's passes
//! visit each branch (TVM's FuseOpsByPattern partitions each dataflow block inside a branch on
//! its own).
//!
//! Contract:
//!
//! - [`with_regions`] runs `pass` on the module with every branch of every `if` (at any depth,
//!   in any function) lifted into a region function of its own, then puts the branches back.
//!   A region function's params are the values the branch reads from outside it (in order of
//!   first use), its blocks the branch's blocks, its return the branch's body. It is public
//!   (a `global_symbol`), so no pass drops it or changes its signature, and a pass treats it as
//!   it treats `main`.
//! - While the pass runs, the `if` binding itself is a call of the opaque op `fusebox.if` on
//!   the condition and every value the branches read (`then` / `else` name the regions,
//!   `nthen` counts the then-branch's arguments), typed as the `if` was: every pass keeps it
//!   (an opaque op is fused by no pattern and by no FuseOps group), sees what it reads (so DCE
//!   keeps those values and fusion counts those uses), and may substitute those values
//!   (BindParams puts a constant in).
//! - Afterwards each placeholder becomes an `if` again whose branches are the pass's output for
//!   its regions, with the region's params replaced by the placeholder's arguments; the region
//!   functions are removed. A placeholder the pass removed (an unused `if`) takes its regions
//!   with it. The functions the pass made (composites) stay.
//! - The functions the pass made are named as if it had visited the branches in program order
//!   (TVM's order): among the new functions of one name family (the name without its digits,
//!   and one `Composite`), the names, in the order the pass made them, go to the functions in
//!   the order of their first call in program order (branches before what follows the `if`).
//!   A pass of several steps (FuseOpsByPattern, a step per pattern) names after each step
//!   instead (`with_regions_named_by_pass`), as TVM names each step's functions when it
//!   makes them.
//! - A module without `if` is passed through untouched (no copy).
//!
//! ```text
//! ; before the pass
//! def main(c: R.Tensor((), "bool"), x: ...):
//!     if c:
//!         with R.dataflow():
//!             m = R.matmul(x, x); r = R.nn.relu(m); R.output(r)
//!         y = r
//!     else:
//!         y = x
//!     return y
//! ; what the pass sees
//! def main(c, x):  y = R.fusebox.if(c, x, x, then="__if_main_0_then", else="__if_main_0_else", nthen=1); return y
//! def __if_main_0_then(x):  with R.dataflow(): m = ...; r = ...; R.output(r)   return r
//! def __if_main_0_else(x):  return x
//! ```

use crate::error::{Error, Result};
use crate::ir::copy::copy_expr;
use crate::ir::{
    Binding, Block, Callee, ExprId, ExprKind, Function, IfExpr, Module, Seq, Type, VarId,
    for_each_binding_deep, for_each_use,
};
use crate::op::{AttrLit, Op, OpaqueOp};
use rustc_hash::{FxHashMap, FxHashSet};

/// The opaque op that stands for an `if` while a pass runs.
pub const IF_OP: &str = "fusebox.if";

/// The prefix of region function names.
const REGION_PREFIX: &str = "__if_";

/// Whether `name` is a region function's (lifted while a pass runs).
pub fn is_region(name: &str) -> bool {
    name.starts_with(REGION_PREFIX)
}

/// The enclosing function of a region name (`__if_main_0_then` → `main`), or `name`.
pub fn enclosing(name: &str, m: &Module) -> String {
    let mut n = name;
    while let Some(rest) = n.strip_prefix(REGION_PREFIX) {
        // `<function>_<k>_<then|else>`: the function's name may itself hold underscores.
        let Some(cut) = rest
            .strip_suffix("_then")
            .or_else(|| rest.strip_suffix("_else"))
            .and_then(|r| r.rfind('_').map(|i| &r[..i]))
        else {
            break;
        };
        n = cut;
        if m.get(n).is_some() && !is_region(n) {
            break;
        }
    }
    n.to_string()
}

/// Whether any function of `m` binds an `if`.
pub fn has_if(m: &Module) -> bool {
    m.functions.values().any(|f| {
        f.exprs
            .iter()
            .any(|(_, d)| matches!(d.kind, ExprKind::If(_)))
    })
}

/// Runs `pass` with the branches of every `if` lifted into region functions (see the module
/// doc); `T` is whatever else the pass returns.
pub fn with_regions<T>(
    m: &Module,
    pass: impl FnOnce(&Module) -> Result<(Module, T)>,
) -> Result<(Module, T)> {
    if !has_if(m) {
        return pass(m);
    }
    let (lowered, extra) = with_regions_named_by_pass(m, pass)?;
    Ok((program_order_names(&|n| m.get(n).is_some(), lowered), extra))
}

/// [`with_regions`] for a pass of several steps that names what each step makes itself, with
/// [`program_order_names`] after the step (FuseOpsByPattern: one step per pattern). Naming
/// once at the end would be wrong there: TVM names what a step makes in the order of first
/// call right after that step, and a later step can move those calls (a group of a later
/// pattern is emitted after everything it reads, which can hoist a call of an earlier
/// pattern's function above another's).
pub(crate) fn with_regions_named_by_pass<T>(
    m: &Module,
    pass: impl FnOnce(&Module) -> Result<(Module, T)>,
) -> Result<(Module, T)> {
    if !has_if(m) {
        return pass(m);
    }
    let lifted = lift(m)?;
    let (out, extra) = pass(&lifted)?;
    Ok((lower(&out)?, extra))
}

/// Whether `m` holds region functions (it is lifted).
pub(crate) fn has_regions(m: &Module) -> bool {
    m.functions.keys().any(|n| is_region(n))
}

/// [`with_regions`] for a pass that returns only a module.
pub fn map_regions(m: &Module, pass: impl FnOnce(&Module) -> Result<Module>) -> Result<Module> {
    with_regions(m, |m| pass(m).map(|x| (x, ()))).map(|(x, ())| x)
}

/// A function with `f`'s attributes, symbolic vars, return type and params (copied), no
/// blocks yet; and the map from `f`'s params to the copies.
fn signature_copy(f: &Function) -> (Function, FxHashMap<VarId, ExprId>) {
    let mut g = Function::new();
    g.attrs = f.attrs.clone();
    g.sym_vars = f.sym_vars.clone();
    g.ret_ty = f.ret_ty.clone();
    let mut map: FxHashMap<VarId, ExprId> = FxHashMap::default();
    for &p in &f.params {
        let vd = f.var(p);
        let v = g.add_var_from(
            vd.name.clone(),
            vd.ty.clone(),
            vd.dataflow,
            vd.origin.clone(),
        );
        g.params.push(v);
        map.insert(p, g.var_expr(v));
    }
    (g, map)
}

// ----- lifting -----

/// The module with every `if` replaced by a placeholder call and its branches lifted.
pub(crate) fn lift(m: &Module) -> Result<Module> {
    let mut out = Module::new();
    let mut regions: Vec<(String, Function)> = Vec::new();
    let taken: FxHashSet<String> = m.functions.keys().cloned().collect();
    let mut counter = 0usize;
    for (name, f) in &m.functions {
        let nf = lift_function(f, name, &taken, &mut counter, &mut regions)?;
        out.insert(name.clone(), nf);
    }
    for (n, f) in regions {
        out.insert(n, f);
    }
    Ok(out)
}

/// A fresh region name for `if` number `k` of `owner`.
fn region_name(owner: &str, k: usize, side: &str, taken: &FxHashSet<String>) -> String {
    let base = format!("{REGION_PREFIX}{owner}_{k}_{side}");
    let mut name = base.clone();
    let mut n = 0u32;
    while taken.contains(&name) {
        n += 1;
        name = format!("{base}{n}");
    }
    name
}

/// Rebuilds `f` with its (top-level) `if`s replaced by placeholders; their branches become
/// region functions (lifted recursively).
fn lift_function(
    f: &Function,
    name: &str,
    taken: &FxHashSet<String>,
    counter: &mut usize,
    regions: &mut Vec<(String, Function)>,
) -> Result<Function> {
    let has = f
        .bindings()
        .any(|b| matches!(f.expr(b.value).kind, ExprKind::If(_)));
    if !has {
        return Ok(f.clone());
    }
    let (mut g, mut map) = signature_copy(f);
    for block in &f.blocks {
        let mut out = Block {
            dataflow: block.dataflow,
            bindings: Vec::with_capacity(block.bindings.len()),
        };
        for b in &block.bindings {
            let d = f.expr(b.value);
            let value = match &d.kind {
                ExprKind::If(i) => {
                    let k = *counter;
                    *counter += 1;
                    let mut args = vec![copy_expr(f, i.cond, &mut g, &map)?];
                    let mut names = Vec::new();
                    let mut nthen = 0;
                    for (side, s) in [("then", &i.then_branch), ("else", &i.else_branch)] {
                        let rname = region_name(name, k, side, taken);
                        let (rf, free) = region(f, s, &rname)?;
                        if side == "then" {
                            nthen = free.len();
                        }
                        for v in free {
                            args.push(copy_expr(f, f.var_expr(v), &mut g, &map)?);
                        }
                        let rf = lift_function(&rf, &rname, taken, counter, regions)?;
                        regions.push((rname.clone(), rf));
                        names.push(rname);
                    }
                    let op = Op::Opaque(Box::new(OpaqueOp {
                        name: IF_OP.into(),
                        attrs: vec![
                            ("then".into(), AttrLit::Str(names[0].clone())),
                            ("else".into(), AttrLit::Str(names[1].clone())),
                            ("nthen".into(), AttrLit::Int(nthen as i64)),
                        ],
                        ty: d.ty.clone(),
                    }));
                    g.add_expr(
                        ExprKind::Call {
                            callee: Callee::Op(op),
                            args,
                        },
                        d.ty.clone(),
                    )
                }
                _ => copy_expr(f, b.value, &mut g, &map)?,
            };
            let vd = f.var(b.var);
            let v = g.add_var_from(
                vd.name.clone(),
                vd.ty.clone(),
                vd.dataflow,
                vd.origin.clone(),
            );
            map.insert(b.var, g.var_expr(v));
            out.bindings.push(Binding { var: v, value });
        }
        g.blocks.push(out);
    }
    if let Some(r) = f.ret {
        g.ret = Some(copy_expr(f, r, &mut g, &map)?);
    }
    Ok(g)
}

/// The region function of branch `s` of `f` and the outside vars it reads (its params).
fn region(f: &Function, s: &Seq, name: &str) -> Result<(Function, Vec<VarId>)> {
    let mut bound: FxHashSet<VarId> = FxHashSet::default();
    for_each_binding_deep(f, &s.blocks, &mut |b| {
        bound.insert(b.var);
    });
    let mut free: Vec<VarId> = Vec::new();
    let mut seen: FxHashSet<VarId> = FxHashSet::default();
    let mut note = |v: VarId| {
        if !bound.contains(&v) && seen.insert(v) {
            free.push(v);
        }
    };
    for b in s.bindings() {
        for_each_use(f, b.value, &mut note);
    }
    for_each_use(f, s.body, &mut note);
    if let Some(&v) = free.iter().find(|&&v| matches!(f.var(v).ty, Type::Func(_))) {
        return Err(Error::Invalid(format!(
            "an `if` branch calls the local function `{}` bound outside it: passes cannot run inside such a branch",
            f.var(v).name
        )));
    }
    let mut r = Function::new();
    r.sym_vars = f.sym_vars.clone();
    r.attrs.global_symbol = Some(name.to_string());
    let mut map: FxHashMap<VarId, ExprId> = FxHashMap::default();
    for &v in &free {
        let vd = f.var(v);
        let p = r.add_var_from(vd.name.clone(), vd.ty.clone(), false, vd.origin.clone());
        r.params.push(p);
        map.insert(v, r.var_expr(p));
    }
    let seq = crate::ir::copy::copy_seq(f, s, &mut r, &map)?;
    r.blocks = seq.blocks;
    r.ret_ty = r.expr(seq.body).ty.clone();
    r.ret = Some(seq.body);
    Ok((r, free))
}

// ----- lowering -----

/// The placeholder's region names and then-argument count, if `op` is one.
fn placeholder(op: &Op) -> Option<(&str, &str, usize)> {
    let Op::Opaque(o) = op else { return None };
    if &*o.name != IF_OP {
        return None;
    }
    let get = |k: &str| o.attrs.iter().find(|(n, _)| &**n == k).map(|(_, v)| v);
    match (get("then"), get("else"), get("nthen")) {
        (Some(AttrLit::Str(t)), Some(AttrLit::Str(e)), Some(AttrLit::Int(n))) => {
            Some((t.as_str(), e.as_str(), usize::try_from(*n).ok()?))
        }
        _ => None,
    }
}

/// The module with every placeholder made an `if` again and the regions removed.
fn lower(m: &Module) -> Result<Module> {
    let mut out = Module::new();
    for (name, f) in &m.functions {
        if is_region(name) {
            continue;
        }
        out.insert(name.clone(), lower_function(f, m, 0)?);
    }
    Ok(out)
}

fn has_placeholder(f: &Function) -> bool {
    f.exprs.iter().any(|(_, d)| {
        matches!(&d.kind, ExprKind::Call { callee: Callee::Op(op), .. } if placeholder(op).is_some())
    })
}

fn lower_function(f: &Function, m: &Module, depth: usize) -> Result<Function> {
    if !has_placeholder(f) {
        return Ok(f.clone());
    }
    if depth > crate::text::MAX_DEPTH as usize {
        return Err(Error::Invalid("`if`s nest too deeply".into()));
    }
    let (mut g, mut map) = signature_copy(f);
    for block in &f.blocks {
        let mut out = Block {
            dataflow: block.dataflow,
            bindings: Vec::with_capacity(block.bindings.len()),
        };
        for b in &block.bindings {
            let d = f.expr(b.value);
            let ph = match &d.kind {
                ExprKind::Call {
                    callee: Callee::Op(op),
                    args,
                } => placeholder(op).map(|p| (p, args)),
                _ => None,
            };
            let value = match ph {
                Some(((t, e, nthen), args)) => {
                    let args: Vec<ExprId> = args
                        .iter()
                        .map(|&a| copy_expr(f, a, &mut g, &map))
                        .collect::<Result<_>>()?;
                    let Some((&cond, rest)) = args.split_first() else {
                        return Err(Error::Invalid(
                            "internal: an `if` placeholder lost its condition".into(),
                        ));
                    };
                    if nthen > rest.len() {
                        return Err(Error::Invalid(
                            "internal: an `if` placeholder lost arguments".into(),
                        ));
                    }
                    let (targs, eargs) = rest.split_at(nthen);
                    let then_branch = splice(m, t, targs, &mut g, depth)?;
                    let else_branch = splice(m, e, eargs, &mut g, depth)?;
                    let kind = ExprKind::If(Box::new(IfExpr {
                        cond,
                        then_branch,
                        else_branch,
                    }));
                    let ty = crate::ir::infer::infer_kind(&g, m, &kind).map_err(|e| {
                        Error::Invalid(format!("internal: an `if` after a pass: {e}"))
                    })?;
                    g.add_expr(kind, ty)
                }
                None => copy_expr(f, b.value, &mut g, &map)?,
            };
            let vd = f.var(b.var);
            let v = g.add_var_from(
                vd.name.clone(),
                vd.ty.clone(),
                vd.dataflow,
                vd.origin.clone(),
            );
            map.insert(b.var, g.var_expr(v));
            out.bindings.push(Binding { var: v, value });
        }
        g.blocks.push(out);
    }
    if let Some(r) = f.ret {
        g.ret = Some(copy_expr(f, r, &mut g, &map)?);
    }
    Ok(g)
}

/// Copies region `name` (lowered first: it may hold placeholders of its own) into `g` as a
/// branch, its params replaced by `args`.
fn splice(m: &Module, name: &str, args: &[ExprId], g: &mut Function, depth: usize) -> Result<Seq> {
    let r = m.get(name).ok_or_else(|| {
        Error::Invalid(format!("internal: region `{name}` is missing after a pass"))
    })?;
    let r = lower_function(r, m, depth + 1)?;
    if r.params.len() != args.len() {
        return Err(Error::Invalid(format!(
            "internal: region `{name}` takes {} values, its `if` gives {}",
            r.params.len(),
            args.len()
        )));
    }
    let map: FxHashMap<VarId, ExprId> =
        r.params.iter().copied().zip(args.iter().copied()).collect();
    let ret = r
        .ret
        .ok_or_else(|| Error::Invalid(format!("internal: region `{name}` has no body")))?;
    let all = Seq {
        blocks: r.blocks.clone(),
        body: ret,
    };
    crate::ir::copy::copy_seq(&r, &all, g, &map)
}

// ----- names in program order -----

/// A name family: a name without its digits, and a composite.
type Family = (String, Option<String>);

/// The name family of a function the pass made: its name without digits, and its composite
/// (its own, or the one of the local function a `Codegen` wrapper holds).
fn family(name: &str, f: &Function) -> Family {
    let base: String = name.chars().filter(|c| !c.is_ascii_digit()).collect();
    let composite = f.attrs.composite.clone().or_else(|| {
        f.exprs.iter().find_map(|(_, d)| match &d.kind {
            ExprKind::Function(inner) => inner.attrs.composite.clone(),
            _ => None,
        })
    });
    (base, composite)
}

/// A call in program order: of a module function, or of an `if` placeholder's regions.
enum Step {
    Call(String),
    Regions(String, String),
}

/// Calls `cb` with the callee of every call of a module function in `f`, in program order:
/// branches of an `if` (then, else) before what follows it, and the regions of an `if`
/// placeholder (a lifted module) where the placeholder stands.
fn calls_in_program_order(m: &Module, f: &Function, depth: usize, cb: &mut dyn FnMut(&str)) {
    let mut steps: Vec<Step> = Vec::new();
    for_each_binding_deep(
        f,
        &f.blocks,
        &mut |b| match f.exprs.get(b.value).map(|d| &d.kind) {
            Some(ExprKind::Call {
                callee: Callee::Global(g),
                ..
            }) => steps.push(Step::Call(g.to_string())),
            Some(ExprKind::Call {
                callee: Callee::Op(op),
                ..
            }) => {
                if let Some((t, e, _)) = placeholder(op) {
                    steps.push(Step::Regions(t.to_string(), e.to_string()));
                }
            }
            _ => {}
        },
    );
    for s in steps {
        match s {
            Step::Call(g) => cb(&g),
            Step::Regions(t, e) => {
                // Lifting bounds the nesting (`lower_function` checks the same depth).
                if depth <= crate::text::MAX_DEPTH as usize {
                    for r in [t, e] {
                        if let Some(rf) = m.get(&r) {
                            calls_in_program_order(m, rf, depth + 1, cb);
                        }
                    }
                }
            }
        }
    }
}

/// `after` with the names of the functions that did not exist before (`existed` says which
/// did) permuted within each family so that they follow the order of first call in program
/// order (see the module doc). `after` may be lifted: a region is walked where its `if`
/// placeholder stands, not in module order.
pub(crate) fn program_order_names(existed: &dyn Fn(&str) -> bool, after: Module) -> Module {
    let created: FxHashMap<&str, usize> = after
        .functions
        .keys()
        .filter(|n| !existed(n))
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    if created.len() < 2 {
        return after;
    }
    // First call of each created function, walking the functions that existed in module order
    // (regions where they are called) and their bindings in program order.
    let mut first: Vec<usize> = vec![usize::MAX; created.len()];
    let mut pos = 0usize;
    for (name, f) in &after.functions {
        if !existed(name) || is_region(name) {
            continue;
        }
        calls_in_program_order(&after, f, 0, &mut |g| {
            if let Some(&k) = created.get(g)
                && first[k] == usize::MAX
            {
                first[k] = pos;
                pos += 1;
            }
        });
    }
    let mut families: Vec<(Family, Vec<&str>)> = Vec::new();
    for n in after.functions.keys().filter(|n| !existed(n)) {
        let Some(f) = after.get(n) else { continue };
        let key = family(n, f);
        match families.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(n.as_str()),
            None => families.push((key, vec![n.as_str()])),
        }
    }
    let mut rename: FxHashMap<String, String> = FxHashMap::default();
    for (_, slots) in &families {
        if slots.len() < 2 {
            continue;
        }
        let mut by_use = slots.clone();
        by_use.sort_by_key(|n| created.get(n).map_or(usize::MAX, |&k| first[k]));
        for (func, slot) in by_use.iter().zip(slots.iter()) {
            if func != slot {
                rename.insert((*func).to_string(), (*slot).to_string());
            }
        }
    }
    if rename.is_empty() {
        return after;
    }
    let mut out = Module::new();
    for (name, f) in &after.functions {
        let mut f = f.clone();
        rename_calls(&mut f, &rename);
        match rename.get(name) {
            Some(new) => {
                if f.attrs.global_symbol.as_deref() == Some(name.as_str()) {
                    f.attrs.global_symbol = Some(new.clone());
                }
                out.insert(new.clone(), f);
            }
            None => out.insert(name.clone(), f),
        }
    }
    // Keep the order in which the pass made them (the slots' order).
    let mut ordered = Module::new();
    for name in after.functions.keys() {
        let key = name.clone();
        if let Some(f) = out.functions.shift_remove(&key) {
            ordered.insert(key, f);
        }
    }
    ordered
}

fn rename_calls(f: &mut Function, rename: &FxHashMap<String, String>) {
    for (_, d) in f.exprs.iter_mut() {
        match &mut d.kind {
            ExprKind::Call {
                callee: Callee::Global(g),
                ..
            } => {
                if let Some(new) = rename.get(g.as_ref()) {
                    *g = new.as_str().into();
                }
            }
            ExprKind::Function(inner) => rename_calls(inner, rename),
            _ => {}
        }
    }
}
