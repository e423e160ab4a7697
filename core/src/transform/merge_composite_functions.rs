//! MergeCompositeFunctions: merge neighbouring composite calls of one codegen into a region
//! function that the codegen compiles as a whole.
//!
//! Requires the output of FuseOpsByPattern without `annotate_codegen`. Guarantees: every
//! composite call of an entry function lands in a region function with `Codegen` and
//! `global_symbol` (named `fused_<composites>_<codegen>`), whose body is a plain block that binds
//! each composite as a local function (without `Primitive`) and calls it; the regions and the
//! calls between them form no cycle; composites no longer called are removed.
//!
//! Grouping is TVM's: bindings are visited in program order; a composite call joins every
//! argument's region of the same codegen that no other argument's region depends on
//! (transitively), else it starts a region; any other binding starts a region of its own with
//! no codegen, which is never outlined. One deliberate difference: "depends on" is judged on the
//! regions as they stand, where TVM consults dependency sets that go stale when a region gains
//! dependencies after others came to depend on it, and can then join a region with its own
//! consumer, a cycle (`tests/golden/partition/merge_stale_dependency_no_cycle.relax`). The
//! results differ only where TVM's would be cyclic. Projections are absorbed as TVM does since
//! apache/tvm#19998: a tuple-get-item of a flat tensor tuple joins the tuple's region when
//! that region has a codegen and the tuple is used only by tuple-get-items (through var
//! aliases, and not returned), and so does a tuple literal whose fields all lie in one such
//! region; a composite call on the projection can then join the region too. Otherwise the
//! projection stays outside and ends the region.
//!
//! ```text
//! ; before
//! lv  = cls.fused_relax_nn_conv2d(x, w)      ; Composite "A.conv2d"
//! lv1 = cls.fused_relax_nn_relu(lv)          ; Composite "A.relu"
//! ; after
//! gv = cls.fused_relax_nn_conv2d_relax_nn_relu_A(x, w)   ; Codegen "A", two local functions
//! ```

use super::fuse_ops_by_pattern::{PartitionOptions, codegen_of, is_entry};
use super::outline::{DedupIndex, Naming, rewrite, unique_name};
use crate::error::{Error, Result};
use crate::ir::copy::copy_expr;
use crate::ir::{
    AttrValue, Binding, Block, Callee, ExprId, ExprKind, FuncAttrs, Function, Module, Type, VarId,
};
use crate::pattern::matcher::{FunctionView, operand_vars};
use std::collections::{BTreeSet, HashMap};

/// Runs MergeCompositeFunctions (see the module doc).
/// Inside the branches of `if`s too (see [`super::regions`]).
pub fn merge_composite_functions(m: &Module) -> Result<Module> {
    super::regions::map_regions(m, merge_composite_functions_flat)
}

fn merge_composite_functions_flat(m: &Module) -> Result<Module> {
    let mut out = m.clone();
    let entries: Vec<String> = m
        .functions
        .iter()
        .filter(|(_, f)| is_entry(f))
        .map(|(n, _)| n.clone())
        .collect();
    let mut regions: Vec<String> = Vec::new();
    for fname in entries {
        let Some(f) = out.functions.get(&fname).cloned() else {
            continue;
        };
        let view = FunctionView::new(&f);
        let groups = group(&out, &f)?;
        if groups.is_empty() {
            continue;
        }
        let mut dedup = DedupIndex::default();
        // Regions lift constants to parameters, as TVM's MergeCompositeFunctions does.
        let opts = PartitionOptions {
            bind_constants: false,
            annotate_codegen: false,
        };
        let (nf, new_funcs) = rewrite(&f, &view, &groups, opts, Naming::Full, &out, &mut dedup)?;
        let mut renames: HashMap<String, String> = HashMap::new();
        for (name, region) in new_funcs {
            let codegen = region.attrs.codegen.clone().unwrap_or_default();
            let base = format!("{name}_{codegen}");
            let final_name = unique_name(&base, &|n| {
                out.get(n).is_some() || renames.values().any(|v| v == n)
            });
            let annotated = annotate_region(&out, region, &final_name)?;
            renames.insert(name, final_name.clone());
            out.insert(final_name.clone(), annotated);
            regions.push(final_name);
        }
        let mut nf = nf;
        let ids: Vec<ExprId> = nf.exprs.keys().collect();
        for id in ids {
            if let ExprKind::Call {
                callee: Callee::Global(g),
                args,
            } = &nf.exprs[id].kind
                && let Some(new) = renames.get(g.as_ref())
            {
                let args = args.clone();
                nf.exprs[id].kind = ExprKind::Call {
                    callee: Callee::Global(new.as_str().into()),
                    args,
                };
            }
        }
        out.insert(fname, nf);
    }
    // Remove composites that nothing calls any more.
    let mut called: BTreeSet<String> = BTreeSet::new();
    for f in out.functions.values() {
        collect_global_calls(f, &mut called);
    }
    let dead: Vec<String> = out
        .functions
        .iter()
        .filter(|(n, f)| f.attrs.composite.is_some() && !called.contains(*n))
        .map(|(n, _)| n.clone())
        .collect();
    for n in dead {
        out.functions.shift_remove(&n);
    }
    Ok(out)
}

fn collect_global_calls(f: &Function, out: &mut BTreeSet<String>) {
    for (_, d) in f.exprs.iter() {
        match &d.kind {
            ExprKind::Call {
                callee: Callee::Global(g),
                ..
            } => {
                out.insert(g.to_string());
            }
            ExprKind::Function(inner) => collect_global_calls(inner, out),
            _ => {}
        }
    }
}

/// Union-find over group ids, with each group's direct dependencies.
struct Groups {
    parent: Vec<usize>,
    codegen: Vec<Option<String>>,
    /// The groups whose bindings a group's bindings read (ids as recorded; map with `find`).
    deps: Vec<BTreeSet<usize>>,
    /// Per group id, the query that last reached it (see [`Groups::mark_ancestors`]).
    mark: Vec<u32>,
    query: u32,
}

impl Groups {
    fn find(&mut self, mut g: usize) -> usize {
        while self.parent[g] != g {
            self.parent[g] = self.parent[self.parent[g]];
            g = self.parent[g];
        }
        g
    }

    fn new_group(&mut self, codegen: Option<String>, deps: BTreeSet<usize>) -> usize {
        let id = self.parent.len();
        self.parent.push(id);
        self.codegen.push(codegen);
        self.deps.push(deps);
        self.mark.push(0);
        id
    }

    /// Marks every group that a group of `from` depends on, directly or through others, as the
    /// dependencies stand now; [`Groups::marked`] then answers for roots.
    ///
    /// TVM keeps a closed dependency set per group instead, updated only for the group a
    /// binding joins: when a group gains dependencies (a binding with several argument regions
    /// joins it), the sets of the groups that already depend on it go stale, and a later
    /// binding can merge a region with its own transitive consumer, a cycle (a random module
    /// of `tests/partition_numerics.rs` did; the outlined module then cannot be ordered).
    /// Walking the current edges gives TVM's decision wherever TVM's is acyclic, since a stale
    /// set only ever lacks dependencies.
    fn mark_ancestors(&mut self, from: &[usize]) {
        self.query += 1;
        let q = self.query;
        // A group is pushed when first marked (and a start group once more at most), so each
        // is expanded at most twice.
        let mut stack: Vec<usize> = from.to_vec();
        while let Some(g) = stack.pop() {
            let g = self.find(g);
            let direct: Vec<usize> = self.deps[g].iter().copied().collect();
            for d in direct {
                let d = self.find(d);
                if self.mark[d] != q {
                    self.mark[d] = q;
                    stack.push(d);
                }
            }
        }
    }

    /// Whether the last [`Groups::mark_ancestors`] reached root `g`.
    fn marked(&self, g: usize) -> bool {
        self.mark[g] == self.query
    }
}

fn group(m: &Module, f: &Function) -> Result<Vec<(Vec<VarId>, FuncAttrs)>> {
    let mut gs = Groups {
        parent: Vec::new(),
        codegen: Vec::new(),
        deps: Vec::new(),
        mark: Vec::new(),
        query: 0,
    };
    let mut group_of: HashMap<VarId, usize> = HashMap::new();
    let mut block_of: HashMap<usize, usize> = HashMap::new();
    let uses = Uses::new(f);
    for (bi, block) in f.blocks.iter().enumerate() {
        for b in &block.bindings {
            // A projection of a region's tuple joins that region.
            if let Some(r) = projected_region(f, b, &uses, &group_of, &mut gs)
                && gs.codegen[r].is_some()
                && block_of.get(&r) == Some(&bi)
            {
                group_of.insert(b.var, r);
                continue;
            }
            let mut ops = Vec::new();
            operand_vars(f, b.value, &mut ops);
            // Argument groups in argument order, only from this dataflow block.
            let mut arg_groups: Vec<usize> = Vec::new();
            for o in &ops {
                if let Some(&g) = group_of.get(o) {
                    let r = gs.find(g);
                    if block_of.get(&r) == Some(&bi) && !arg_groups.contains(&r) {
                        arg_groups.push(r);
                    }
                }
            }
            let codegen = match &f.expr(b.value).kind {
                ExprKind::Call {
                    callee: Callee::Global(g),
                    ..
                } if block.dataflow => m
                    .get(g)
                    .and_then(|cf| cf.attrs.composite.as_deref())
                    .map(|c| {
                        codegen_of(c).map(str::to_string).ok_or_else(|| {
                            Error::Invalid(format!("composite `{c}` has no codegen prefix"))
                        })
                    })
                    .transpose()?,
                _ => None,
            };
            // An argument region of the same codegen qualifies when no argument region depends
            // on it (transitively): joining it then closes no cycle. With one argument region
            // there is nothing to walk.
            let same_codegen = |gs: &Groups, a: usize| {
                codegen.is_some() && gs.codegen[a].as_deref() == codegen.as_deref()
            };
            let mut qualifying: Vec<usize> = arg_groups
                .iter()
                .copied()
                .filter(|&a| same_codegen(&gs, a))
                .collect();
            if !qualifying.is_empty() && arg_groups.len() > 1 {
                gs.mark_ancestors(&arg_groups);
                qualifying.retain(|&a| !gs.marked(a));
            }
            let g = if let Some((&first, rest)) = qualifying.split_first() {
                for &other in rest {
                    gs.parent[other] = first;
                    let d = std::mem::take(&mut gs.deps[other]);
                    gs.deps[first].extend(d);
                }
                gs.deps[first].extend(
                    arg_groups
                        .iter()
                        .copied()
                        .filter(|a| !qualifying.contains(a)),
                );
                first
            } else {
                let id = gs.new_group(codegen, arg_groups.iter().copied().collect());
                block_of.insert(id, bi);
                id
            };
            group_of.insert(b.var, g);
        }
    }
    // Collect groups with a codegen, members in binding order.
    let mut members: HashMap<usize, Vec<VarId>> = HashMap::new();
    let mut order: Vec<usize> = Vec::new();
    for b in f.bindings() {
        if let Some(&g) = group_of.get(&b.var) {
            let r = gs.find(g);
            if gs.codegen[r].is_some() {
                if !members.contains_key(&r) {
                    order.push(r);
                }
                members.entry(r).or_default().push(b.var);
            }
        }
    }
    Ok(order
        .into_iter()
        .filter_map(|r| {
            let cg = gs.codegen[r].clone()?;
            let vars = members.remove(&r)?;
            let attrs = FuncAttrs {
                codegen: Some(cg),
                primitive: Some(AttrValue::Bool(true)),
                ..FuncAttrs::default()
            };
            Some((vars, attrs))
        })
        .collect())
}

/// Who uses each var: the vars of the bindings whose values read it, and whether the function
/// returns it.
struct Uses {
    users: HashMap<VarId, Vec<VarId>>,
    bound: HashMap<VarId, ExprId>,
    returned: BTreeSet<VarId>,
}

impl Uses {
    fn new(f: &Function) -> Self {
        let mut users: HashMap<VarId, Vec<VarId>> = HashMap::new();
        for b in f.bindings() {
            let mut ops = Vec::new();
            operand_vars(f, b.value, &mut ops);
            for o in ops {
                users.entry(o).or_default().push(b.var);
            }
        }
        let mut ret = Vec::new();
        if let Some(r) = f.ret {
            operand_vars(f, r, &mut ret);
        }
        Uses {
            users,
            bound: f.bindings().map(|b| (b.var, b.value)).collect(),
            returned: ret.into_iter().collect(),
        }
    }

    /// TVM's `HasOnlyTupleGetItemUsers`: `t` (and every var alias of it, either way) is not
    /// returned, and is used only by tuple-get-items of it and by aliases; at least one
    /// tuple-get-item.
    fn only_projected(&self, f: &Function, t: VarId) -> bool {
        let bound = &self.bound;
        let mut pending = vec![t];
        let mut seen: BTreeSet<VarId> = BTreeSet::new();
        let mut projected = false;
        while let Some(v) = pending.pop() {
            if !seen.insert(v) {
                continue;
            }
            if self.returned.contains(&v) {
                return false;
            }
            if let Some(ExprKind::Var(src)) = bound.get(&v).map(|&e| &f.expr(e).kind) {
                pending.push(*src);
            }
            for &u in self.users.get(&v).map(Vec::as_slice).unwrap_or(&[]) {
                let Some(&value) = bound.get(&u) else {
                    return false;
                };
                match &f.expr(value).kind {
                    ExprKind::TupleGetItem(x, _) if f.as_var(*x) == Some(v) => projected = true,
                    ExprKind::Var(x) if *x == v => pending.push(u),
                    _ => return false,
                }
            }
        }
        projected
    }
}

/// Whether `ty` is a non-empty tuple of tensors (TVM's `IsFlatTensorTuple`).
fn is_flat_tensor_tuple(ty: &Type) -> bool {
    matches!(ty, Type::Tuple(fs) if !fs.is_empty() && fs.iter().all(|t| matches!(t, Type::Tensor(_))))
}

/// The region (a group root) a projection binding may join: for `t[i]`, the region of `t`; for
/// a tuple literal, the one region all its fields lie in. Only for flat tensor tuples used only
/// by tuple-get-items.
fn projected_region(
    f: &Function,
    b: &Binding,
    uses: &Uses,
    group_of: &HashMap<VarId, usize>,
    gs: &mut Groups,
) -> Option<usize> {
    match &f.expr(b.value).kind {
        ExprKind::TupleGetItem(t, _) => {
            let tv = f.as_var(*t)?;
            if !is_flat_tensor_tuple(&f.var(tv).ty) || !uses.only_projected(f, tv) {
                return None;
            }
            let g = *group_of.get(&tv)?;
            Some(gs.find(g))
        }
        ExprKind::Tuple(fields) => {
            if !is_flat_tensor_tuple(&f.var(b.var).ty) || !uses.only_projected(f, b.var) {
                return None;
            }
            let mut region = None;
            for &x in fields {
                let g = gs.find(*group_of.get(&f.as_var(x)?)?);
                if *region.get_or_insert(g) != g {
                    return None;
                }
            }
            region
        }
        _ => None,
    }
}

/// Makes a region public, plain (non-dataflow) and self-contained: each composite it calls
/// becomes a local function, shared within the region.
fn annotate_region(m: &Module, region: Function, name: &str) -> Result<Function> {
    let mut nf = Function::new();
    nf.attrs = region.attrs.clone();
    nf.attrs.primitive = None;
    nf.attrs.global_symbol = Some(name.to_string());
    nf.sym_vars = region.sym_vars.clone();
    nf.ret_ty = region.ret_ty.clone();
    let mut map: HashMap<VarId, ExprId> = HashMap::new();
    for &p in &region.params {
        let vd = region.var(p);
        let np = nf.add_var_from(vd.name.clone(), vd.ty.clone(), false, vd.origin.clone());
        nf.params.push(np);
        map.insert(p, nf.var_expr(np));
    }
    let mut locals: HashMap<String, VarId> = HashMap::new();
    let mut body = Block {
        dataflow: false,
        bindings: Vec::new(),
    };
    for b in region.bindings() {
        let d = region.expr(b.value);
        let value = match &d.kind {
            ExprKind::Call {
                callee: Callee::Global(g),
                args,
            } if m.get(g).is_some_and(|c| c.attrs.composite.is_some()) => {
                let lv = match locals.get(g.as_ref()) {
                    Some(&v) => v,
                    None => {
                        let mut local = m
                            .get(g)
                            .cloned()
                            .ok_or_else(|| Error::Invalid(format!("missing `{g}`")))?;
                        local.attrs.primitive = None;
                        local.attrs.global_symbol = None;
                        let fty = Type::Func(local.func_type());
                        let fe = nf.add_expr(ExprKind::Function(Box::new(local)), fty.clone());
                        let v = nf.add_var(g.to_string(), fty, false);
                        body.bindings.push(Binding { var: v, value: fe });
                        locals.insert(g.to_string(), v);
                        v
                    }
                };
                let args = args
                    .iter()
                    .map(|&a| copy_expr(&region, a, &mut nf, &map))
                    .collect::<Result<Vec<_>>>()?;
                nf.add_expr(
                    ExprKind::Call {
                        callee: Callee::Local(lv),
                        args,
                    },
                    d.ty.clone(),
                )
            }
            _ => copy_expr(&region, b.value, &mut nf, &map)?,
        };
        let vd = region.var(b.var);
        let nv = nf.add_var_from(vd.name.clone(), vd.ty.clone(), false, vd.origin.clone());
        body.bindings.push(Binding { var: nv, value });
        map.insert(b.var, nf.var_expr(nv));
    }
    nf.blocks.push(body);
    let ret = region
        .ret
        .ok_or_else(|| Error::Invalid("region without return".into()))?;
    nf.ret = Some(copy_expr(&region, ret, &mut nf, &map)?);
    Ok(nf)
}
