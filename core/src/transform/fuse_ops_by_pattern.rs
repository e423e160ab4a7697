//! FuseOpsByPattern: outline every match of each pattern into a private `Composite` function.
//!
//! Contract (TVM 0.27's observable semantics, with its cycle and partial-composite bugs fixed):
//!
//! - Patterns are applied **in the given order** (sort with [`sort_by_priority`] first), each over
//!   the whole module on the output of the previous one, so an earlier pattern wins everywhere.
//!   With several patterns, a function whose census lacks an op or op-to-op edge that every
//!   match of a pattern needs is skipped for it without visiting a root (`pattern::census`; the
//!   output is the same).
//! - Every function without `Primitive`, `Composite` or `Codegen` is partitioned. Roots are the
//!   op-call bindings of dataflow blocks, visited in program order; the matcher looks back only.
//! - Within one pattern, a later match that contains **all** of an earlier group replaces it
//!   (maximal match); a later match that overlaps an earlier group only partly is dropped (TVM
//!   steals the overlapped node and leaves a partial composite; fusebox never does).
//! - A match whose grouping would create a cycle (a path that leaves the group and comes back,
//!   through any number of outside bindings or other groups) is dropped with a reason (TVM checks
//!   one hop only and can emit ill-formed IR). A match that reaches into another block is dropped.
//! - A check may reject a match; every rejection is recorded with its reason.
//! - A group becomes a private function with `Composite = <pattern name>` and `Primitive = True`,
//!   named `fused_<op>_<op>…` (dots become underscores; numeric suffixes `1`, `2`, … keep names
//!   unique). Parameters are the outside values the group reads, in first-use order, each once;
//!   constants (with or without values) stay inside with `bind_constants`, else they become
//!   parameters `param_<k>` (a valueless one typed as the parser typed it); a shape literal
//!   with symbolic dims is a parameter too (its symbols are then bound by the signature, and a
//!   function shared by groups equal up to their symbols returns each call its own type); shape
//!   and prim literals stay inside. Outputs are the group's non-dataflow vars, then the vars used
//!   by other bindings of the block in order of first use; several outputs return a tuple that
//!   the caller unpacks in binding order. A group with no used output keeps its root as output
//!   (TVM deletes it; fusebox never drops an op). Structurally equal functions are shared.
//! - The caller is re-emitted with groups in order of first appearance, each after the bindings
//!   it depends on; fused calls bind fresh vars `lv…` (dataflow) or `gv…` (visible after the block).
//! - The outlining itself is in `transform/outline.rs`, shared with FuseOps. With `annotate_codegen`,
//!   the pass of that name (`transform/annotate_codegen.rs`) then wraps each composite in a public
//!   function `<name>_<codegen>` with `Codegen` and `global_symbol`, whose body binds the
//!   composite as `local_func` (without `Primitive`) and calls it.
//!
//! ```text
//! ; before, pattern dnnl.conv2d_relu = relax.nn.relu(relax.nn.conv2d(_, _))
//! lv: R.Tensor(...) = R.nn.conv2d(data, weight1, ...)
//! conv1: R.Tensor(...) = R.nn.relu(lv)
//! ; after
//! @R.function(private=True)
//! def fused_relax_nn_conv2d_relax_nn_relu(data: ..., weight1: ...) -> ...:
//!     R.func_attr({"Composite": "dnnl.conv2d_relu", "Primitive": True})
//!     ...
//! gv: R.Tensor(...) = cls.fused_relax_nn_conv2d_relax_nn_relu(data, weight1)
//! ```

use super::annotate_codegen::annotate_codegen;
use super::outline::{DedupIndex, Naming, NewFunctions, rewrite};
use crate::error::{Error, Result};
use crate::ir::copy::VarIndex;
use crate::ir::{AttrValue, Callee, ExprKind, FuncAttrs, Function, Module, VarId};
use crate::pattern::Pattern;
use crate::pattern::census::Census;
use crate::pattern::check::{Check, CheckContext, Verdict};
use crate::pattern::matcher::{FunctionView, Match, ViewTables, match_into, operand_vars};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::borrow::Cow;
use std::sync::Arc;

/// One entry of a pattern table.
#[derive(Clone)]
pub struct FusionPattern {
    /// `<codegen>.<name>`, e.g. `dnnl.conv2d_relu`; becomes the `Composite` attribute.
    pub name: String,
    /// The pattern.
    pub pattern: Pattern,
    /// An optional check.
    pub check: Option<Arc<dyn Check>>,
    /// Higher wins; equal priorities keep list order.
    pub priority: i32,
}

impl FusionPattern {
    /// An entry with priority 0 and no check.
    pub fn new(name: &str, pattern: Pattern) -> Self {
        FusionPattern {
            name: name.to_string(),
            pattern,
            check: None,
            priority: 0,
        }
    }

    /// With a check.
    pub fn with_check(mut self, check: Arc<dyn Check>) -> Self {
        self.check = Some(check);
        self
    }

    /// With a priority.
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The codegen: the text before the first `.` of the name.
    pub fn codegen(&self) -> Option<&str> {
        codegen_of(&self.name)
    }
}

impl std::fmt::Debug for FusionPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FusionPattern")
            .field("name", &self.name)
            .field("pattern", &self.pattern.to_string())
            .field("check", &self.check.as_ref().map(|c| c.name().to_string()))
            .field("priority", &self.priority)
            .finish()
    }
}

/// The codegen part of a composite name (`dnnl` of `dnnl.conv2d_relu`).
pub fn codegen_of(name: &str) -> Option<&str> {
    name.split_once('.')
        .map(|(c, _)| c)
        .filter(|c| !c.is_empty())
}

/// Stable sort by priority, highest first; equal priorities keep list order.
pub fn sort_by_priority(patterns: &mut [FusionPattern]) {
    patterns.sort_by_key(|p| std::cmp::Reverse(p.priority));
}

/// Options of the pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionOptions {
    /// Keep constants inside composites (else they become parameters).
    pub bind_constants: bool,
    /// Wrap each composite in a public `Codegen` function.
    pub annotate_codegen: bool,
}

impl Default for PartitionOptions {
    fn default() -> Self {
        PartitionOptions {
            bind_constants: true,
            annotate_codegen: false,
        }
    }
}

/// A match that was found and not used, with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The pattern's name.
    pub pattern: String,
    /// Where: `<function>/<root var>`.
    pub at: String,
    /// Why.
    pub reason: String,
}

/// The partitioned module and what was rejected on the way.
#[derive(Clone, Debug)]
pub struct Partitioned {
    /// The module.
    pub module: Module,
    /// Every rejected match, in pattern order then program order.
    pub rejections: Vec<Rejection>,
}

/// Runs FuseOpsByPattern (see the module doc); inside the branches of `if`s too, each dataflow
/// block of a branch partitioned on its own as TVM does (see [`super::regions`]). A rejection
/// inside a branch names the function that holds the `if`.
pub fn fuse_ops_by_pattern(
    module: &Module,
    patterns: &[FusionPattern],
    opts: PartitionOptions,
) -> Result<Partitioned> {
    let (module, rejections) = super::regions::with_regions_named_by_pass(module, |m| {
        let p = fuse_ops_by_pattern_flat(m, patterns, opts)?;
        let rejections = p
            .rejections
            .into_iter()
            .map(|mut r| {
                if let Some((func, rest)) = r.at.split_once('/')
                    && super::regions::is_region(func)
                {
                    r.at = format!("{}/{rest}", super::regions::enclosing(func, m));
                }
                r
            })
            .collect();
        Ok((p.module, rejections))
    })?;
    Ok(Partitioned { module, rejections })
}

fn fuse_ops_by_pattern_flat(
    module: &Module,
    patterns: &[FusionPattern],
    opts: PartitionOptions,
) -> Result<Partitioned> {
    // With one pattern a census could only skip the one pass it costs as much as.
    run_patterns(module, patterns, opts, patterns.len() > 1)
}

/// [`fuse_ops_by_pattern`], skipping patterns by census (see `pattern::census`) or not; the
/// output is the same either way.
fn run_patterns(
    module: &Module,
    patterns: &[FusionPattern],
    opts: PartitionOptions,
    census: bool,
) -> Result<Partitioned> {
    // The module is cloned only when a pattern first changes it, and then without the function
    // being replaced.
    let mut m: Cow<'_, Module> = Cow::Borrowed(module);
    let mut rejections = Vec::new();
    if opts.annotate_codegen
        && let Some(p) = patterns.iter().find(|p| p.codegen().is_none())
    {
        return Err(Error::Invalid(format!(
            "pattern `{}` has no codegen prefix: annotate_codegen needs names like `dnnl.{}`",
            p.name, p.name
        )));
    }
    // Use/def indexes and censuses of functions that no pattern has changed yet, shared across
    // patterns.
    let mut cache = PassCache {
        views: HashMap::default(),
        census,
        scratch: FindScratch::default(),
    };
    // In a lifted module (`if` branches as region functions, see `super::regions`), what a
    // step makes is named in program order right after the step, as TVM, visiting the
    // branches where they stand, names it when it makes it.
    let lifted = super::regions::has_regions(module);
    for fp in patterns {
        let before: Option<HashSet<String>> = lifted.then(|| m.functions.keys().cloned().collect());
        apply_pattern(&mut m, fp, opts, &mut rejections, &mut cache)?;
        if let Some(b) = before
            && matches!(m, Cow::Owned(_))
        {
            let named = super::regions::program_order_names(&|n| b.contains(n), m.into_owned());
            m = Cow::Owned(named);
        }
    }
    let mut m = m.into_owned();
    if opts.annotate_codegen {
        // A wrapper is named after its composite (`<composite>_<codegen>`), already in order.
        m = annotate_codegen(&m)?;
    }
    Ok(Partitioned {
        module: m,
        rejections,
    })
}

pub(crate) fn is_entry(f: &Function) -> bool {
    !f.attrs.is_primitive() && f.attrs.composite.is_none() && f.attrs.codegen.is_none()
}

/// Replaces function `name` and adds `new_funcs`, cloning a borrowed module (all but `name`)
/// the first time.
pub(crate) fn commit(m: &mut Cow<'_, Module>, name: String, f: Function, new_funcs: NewFunctions) {
    if let Cow::Borrowed(orig) = m {
        let mut out = Module::new();
        for (n, g) in &orig.functions {
            if *n == name {
                out.insert(n.clone(), Function::new());
            } else {
                out.insert(n.clone(), g.clone());
            }
        }
        *m = Cow::Owned(out);
    }
    let owned = m.to_mut();
    for (n, func) in new_funcs {
        owned.insert(n, func);
    }
    owned.insert(name, f);
}

/// What [`apply_pattern`] keeps across patterns.
struct PassCache {
    /// Per function not changed since: its use/def index and census, when built.
    views: HashMap<String, FnCache>,
    /// Whether to build censuses (several patterns).
    census: bool,
    /// Buffers reused by every root of every pass.
    scratch: FindScratch,
}

#[derive(Default)]
struct FnCache {
    tables: Option<std::sync::Arc<ViewTables>>,
    census: Option<Census>,
}

fn apply_pattern(
    m: &mut Cow<'_, Module>,
    fp: &FusionPattern,
    opts: PartitionOptions,
    rejections: &mut Vec<Rejection>,
    cache: &mut PassCache,
) -> Result<()> {
    let root_ops = fp.pattern.root_ops();
    let needs = cache.census.then(|| fp.pattern.needs());
    let entries: Vec<String> = m
        .functions
        .iter()
        .filter(|(_, f)| is_entry(f))
        .map(|(n, _)| n.clone())
        .collect();
    let mut dedup = DedupIndex::default();
    for fname in entries {
        let Some(f) = m.functions.get(&fname) else {
            continue;
        };
        let entry = cache.views.entry(fname.clone()).or_default();
        // Cheap prefilters: a needed op is not called (census), or no binding calls a root op.
        if let Some(needs) = &needs {
            let census = entry.census.get_or_insert_with(|| Census::new(f));
            if !census.has_ops(needs) {
                continue;
            }
        } else if let Some(ops) = &root_ops {
            let any = f.bindings().any(|b| {
                matches!(&f.expr(b.value).kind,
                    ExprKind::Call { callee: Callee::Op(op), .. } if ops.contains(&op.name()))
            });
            if !any {
                continue;
            }
        }
        let view = match &entry.tables {
            Some(t) => FunctionView::with_tables(f, t.clone()),
            None => {
                let v = FunctionView::new(f);
                entry.tables = Some(v.tables());
                v
            }
        };
        if let (Some(needs), Some(census)) = (&needs, &mut entry.census) {
            if !needs.edges.is_empty() && !census.has_edge_index() {
                census.build_edges(&view);
            }
            if !census.may_match(needs) {
                continue;
            }
        }
        let groups = find_groups(
            &fname,
            &view,
            fp,
            root_ops.as_deref(),
            rejections,
            &mut cache.scratch,
        );
        if groups.groups.is_empty() {
            continue;
        }
        cache.views.remove(&fname);
        dedup.ensure(m);
        let attrs = FuncAttrs {
            composite: Some(fp.name.clone()),
            primitive: Some(AttrValue::Bool(true)),
            ..FuncAttrs::default()
        };
        let groups: Vec<(&[VarId], &FuncAttrs)> = groups
            .groups
            .iter()
            .map(|&g| (groups.members(g), &attrs))
            .collect();
        let (new_f, new_funcs) = rewrite(f, &view, &groups, opts, Naming::Full, m, &mut dedup)?;
        drop(view);
        commit(m, fname, new_f, new_funcs);
    }
    Ok(())
}

/// A group of [`find_groups`]: its members are `buf[start..end]` of the pass's member buffer.
struct Group {
    start: u32,
    end: u32,
    alive: bool,
}

/// The groups found for one pattern in one function: members of all groups in one buffer.
struct Found {
    buf: Vec<VarId>,
    groups: Vec<(u32, u32)>,
}

impl Found {
    fn members(&self, (start, end): (u32, u32)) -> &[VarId] {
        self.buf.get(start as usize..end as usize).unwrap_or(&[])
    }
}

fn members_of<'b>(buf: &'b [VarId], g: &Group) -> &'b [VarId] {
    buf.get(g.start as usize..g.end as usize).unwrap_or(&[])
}

/// Buffers of [`find_groups`], reused across roots, patterns and functions.
#[derive(Default)]
struct FindScratch {
    m: Match,
    order: Vec<(usize, VarId)>,
    matched: Vec<VarId>,
    merge: Vec<usize>,
    inside: VarSet,
    stack: Vec<VarId>,
}

/// A set of vars for membership tests: a sorted vector (groups are small; no hashing).
#[derive(Default)]
pub(crate) struct VarSet(Vec<VarId>);

impl VarSet {
    /// Sets the contents to `vars`.
    pub(crate) fn fill(&mut self, vars: &[VarId]) {
        self.0.clear();
        self.0.extend_from_slice(vars);
        if self.0.len() > 8 {
            self.0.sort_unstable();
        }
    }

    pub(crate) fn contains(&self, v: &VarId) -> bool {
        match self.0.len() {
            0..=8 => self.0.contains(v),
            _ => self.0.binary_search(v).is_ok(),
        }
    }
}

fn find_groups(
    fname: &str,
    view: &FunctionView<'_>,
    fp: &FusionPattern,
    root_ops: Option<&[&str]>,
    rejections: &mut Vec<Rejection>,
    scratch: &mut FindScratch,
) -> Found {
    let f = view.func;
    let mut buf: Vec<VarId> = Vec::new();
    let mut group_of = VarIndex::new(f.vars.len());
    let mut groups: Vec<Group> = Vec::new();
    let FindScratch {
        m,
        order,
        matched,
        merge,
        inside,
        stack,
    } = scratch;
    for (bi, block) in f.blocks.iter().enumerate() {
        if !block.dataflow {
            continue;
        }
        for b in &block.bindings {
            let ExprKind::Call { callee, .. } = &f.expr(b.value).kind else {
                continue;
            };
            if let (Some(ops), Callee::Op(op)) = (root_ops, callee)
                && !ops.contains(&op.name())
            {
                continue;
            }
            if !match_into(&fp.pattern, view, b.var, m) {
                continue;
            }
            m.bindings_into(&fp.pattern, view, order, matched);
            let matched: &[VarId] = matched;
            let mut reject = |reason: String| {
                rejections.push(Rejection {
                    pattern: fp.name.clone(),
                    at: format!("{fname}/{}", f.var(b.var).name),
                    reason,
                });
            };
            if let Some(v) = matched.iter().find(|v| view.block_of(**v) != Some(bi)) {
                reject(format!(
                    "the match reaches `{}`, which is bound outside this dataflow block",
                    f.var(*v).name
                ));
                continue;
            }
            if let Some(check) = &fp.check {
                let cx = CheckContext {
                    pattern: &fp.pattern,
                    m,
                    view,
                    matched,
                };
                if let Verdict::Reject { reason } = check.check(&cx) {
                    reject(format!("check `{}` rejected it: {reason}", check.name()));
                    continue;
                }
            }
            // Overlap with earlier groups of this pattern: take them whole or not at all.
            merge.clear();
            let mut partial = None;
            for v in matched {
                if let Some(g) = group_of.get(*v).map(|g| g as usize) {
                    if members_of(&buf, &groups[g])
                        .iter()
                        .all(|x| matched.contains(x))
                    {
                        if !merge.contains(&g) {
                            merge.push(g);
                        }
                    } else {
                        partial = Some(g);
                        break;
                    }
                }
            }
            if let Some(g) = partial {
                let last = members_of(&buf, &groups[g])
                    .last()
                    .copied()
                    .unwrap_or(b.var);
                reject(format!(
                    "it overlaps the match at `{}` without containing all of it",
                    f.var(last).name
                ));
                continue;
            }
            inside.fill(matched);
            if let Some(x) = cycle_through(
                view,
                matched,
                inside,
                stack,
                &group_of,
                (&groups, &buf),
                merge,
            ) {
                reject(format!(
                    "fusing it would create a cycle through `{}`, which uses a value of the match and feeds it",
                    f.var(x).name
                ));
                continue;
            }
            for &g in merge.iter() {
                groups[g].alive = false;
            }
            let id = groups.len();
            for &v in matched {
                group_of.insert(v, id as u32);
            }
            let start = buf.len() as u32;
            buf.extend_from_slice(matched);
            groups.push(Group {
                start,
                end: buf.len() as u32,
                alive: true,
            });
        }
    }
    let groups = groups
        .into_iter()
        .filter(|g| g.alive)
        .map(|g| (g.start, g.end))
        .collect();
    Found { buf, groups }
}

/// Returns an outside var through which the candidate group would depend on itself, treating
/// existing groups (other than those being merged) as single nodes. `inside` holds `members`.
fn cycle_through(
    view: &FunctionView<'_>,
    members: &[VarId],
    inside: &VarSet,
    stack: &mut Vec<VarId>,
    group_of: &VarIndex,
    (groups, buf): (&[Group], &[VarId]),
    merging: &[usize],
) -> Option<VarId> {
    let pos = |v: VarId| view.bound(v).map_or(0, |(p, _)| p);
    let maxpos = members.iter().map(|&v| pos(v)).max()?;
    stack.clear();
    for &m in members {
        stack.extend(
            view.users_of(m)
                .iter()
                .filter(|u| !inside.contains(u) && pos(**u) <= maxpos),
        );
    }
    if stack.is_empty() {
        return None;
    }
    let mut tainted: HashSet<VarId> = HashSet::default();
    while let Some(x) = stack.pop() {
        if !tainted.insert(x) {
            continue;
        }
        if let Some(h) = group_of.get(x).map(|h| h as usize)
            && groups[h].alive
            && !merging.contains(&h)
        {
            for &y in members_of(buf, &groups[h]) {
                if !inside.contains(&y) && pos(y) <= maxpos && !tainted.contains(&y) {
                    stack.push(y);
                }
            }
        }
        for &u in view.users_of(x) {
            if !inside.contains(&u) && pos(u) <= maxpos && !tainted.contains(&u) {
                stack.push(u);
            }
        }
    }
    if tainted.is_empty() {
        return None;
    }
    let mut ops = Vec::new();
    for &m in members {
        let Some((_, value)) = view.bound(m) else {
            continue;
        };
        ops.clear();
        operand_vars(view.func, value, &mut ops);
        if let Some(&x) = ops.iter().find(|o| tainted.contains(o)) {
            return Some(x);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::generate::{mlp_chain, random_fusion_module, random_module};
    use crate::pattern::check::NoLeakingIntermediates;
    use crate::pattern::parse_pattern;
    use crate::text::print_module;

    const PATTERNS: &[&str] = &[
        "relax.nn.relu(_)",
        "relax.add(relax.matmul(_, _), _)",
        "relax.nn.relu(relax.add(relax.matmul(_, _), _))",
        "relax.nn.relu(relax.matmul(_, _)) | relax.add(relax.matmul(_, _), _)",
        "relax.add(relax.add(_, _), relax.add(_, _))",
        "relax.nn.relu(relax.add(relax.add(relax.matmul(_, relax.permute_dims(_)), _), _))",
        "relax.add(relax.add(relax.matmul(_, _), _), _)",
        "relax.multiply(relax.exp(_), _)",
        "relax.add(!relax.nn.relu(_), _)",
        "(relax.nn.relu(_) | relax.exp(_)) & relax.nn.relu(relax.add(_, _))",
        "relax.reshape(relax.add(_, _), _)",
        "relax.nn.gelu(_)",
        "relax.add(_[?], _)",
    ];

    /// Two composites whose bound constants differ in one byte are two functions, also where
    /// the byte lies outside the constants' hashed sample; equal ones are one function.
    #[test]
    fn composites_with_constants_differing_outside_their_hash_sample_stay_apart() {
        let src = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((10000,), dtype="float32")) -> R.Tensor((10000,), dtype="float32"):
        with R.dataflow():
            a: R.Tensor((10000,), dtype="float32") = R.add(x, R.const(0.0, "float32"))
            r: R.Tensor((10000,), dtype="float32") = R.nn.relu(a)
            b: R.Tensor((10000,), dtype="float32") = R.add(r, R.const(0.0, "float32"))
            gv: R.Tensor((10000,), dtype="float32") = R.nn.relu(b)
            R.output(gv)
        return gv
"#;
        let pat = FusionPattern::new(
            "t.add_relu",
            parse_pattern("relax.nn.relu(relax.add(_, const))").unwrap(),
        );
        let composites = |second_differs: bool| {
            let mut m = crate::text::parse_module_str(src).unwrap();
            let f = m.functions.get_mut("main").unwrap();
            let consts: Vec<crate::ir::ExprId> = f
                .exprs
                .iter()
                .filter(|(_, e)| matches!(e.kind, ExprKind::Const(_)))
                .map(|(id, _)| id)
                .collect();
            assert_eq!(consts.len(), 2);
            for (k, id) in consts.into_iter().enumerate() {
                let mut data: Vec<u8> = (0..40_000).map(|i| (i % 251) as u8).collect();
                if k == 1 && second_differs {
                    // Byte 100: outside the sampled runs (see `Constant`'s hash).
                    data[100] ^= 1;
                }
                let c = crate::ir::Constant::from_bytes(crate::ir::DType::F32, vec![10_000], data)
                    .unwrap();
                let e = &mut f.exprs[id];
                e.ty = crate::ir::Type::tensor(&[10_000], crate::ir::DType::F32);
                e.kind = ExprKind::Const(c);
            }
            let opts = PartitionOptions::default();
            let out = fuse_ops_by_pattern(&m, std::slice::from_ref(&pat), opts)
                .unwrap()
                .module;
            out.functions
                .values()
                .filter(|f| f.attrs.composite.is_some())
                .count()
        };
        assert_eq!(composites(false), 1);
        assert_eq!(composites(true), 2);
    }

    /// Skipping patterns by census never changes the output or the rejections.
    #[test]
    fn census_does_not_change_the_output() {
        let mut state = 7u64;
        let mut next = |n: usize| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 33) as usize) % n
        };
        for seed in 0..60u64 {
            let m = match seed % 3 {
                0 => random_module(seed, 20 + next(150)),
                1 => random_fusion_module(seed, 20 + next(150)),
                _ => mlp_chain(1 + next(20)),
            };
            let table: Vec<FusionPattern> = (0..2 + next(6))
                .map(|i| {
                    let text = PATTERNS[next(PATTERNS.len())];
                    let p = parse_pattern(text).unwrap_or_else(|e| panic!("{text}: {e}"));
                    let fp = FusionPattern::new(&format!("a.p{i}"), p);
                    if next(2) == 0 {
                        fp.with_check(Arc::new(NoLeakingIntermediates))
                    } else {
                        fp
                    }
                })
                .collect();
            let opts = PartitionOptions::default();
            let run = |census| {
                let out = run_patterns(&m, &table, opts, census)
                    .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                (print_module(&out.module).text, out.rejections)
            };
            assert_eq!(run(true), run(false), "seed {seed}");
        }
    }
}
