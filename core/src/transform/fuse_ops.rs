//! FuseOps: automatic operator fusion with TVM's post-dominator algorithm, on fusebox's
//! high-level ops directly.
//!
//! Contract:
//!
//! - **Requires** a module that verifies. It may already be partitioned: composites, codegen
//!   functions and primitive functions are never entered, and calls of module functions (or of
//!   local functions) are opaque nodes that fuse with nothing.
//! - **Fuses** the dataflow blocks of every function without `Primitive`, `Composite` or
//!   `Codegen`; plain (non-dataflow) blocks are left as they are.
//! - **Guarantees**: every op binding stays exactly once (inside a fused function or in the
//!   caller); a group of two or more bindings becomes a private function with
//!   `Primitive = True` plus the free-form attributes `fusion_kind` and `anchor` (read by the
//!   JSON report), named `fused_<op>_<op>…` with the last segment of each op name (`add`, `exp`,
//!   `conv2d`) and a numeric suffix when the name is taken; constants are lifted to parameters
//!   (`param_<k>`) that the caller passes; the caller keeps its binding order, each group placed
//!   after what it reads, so no cycle is possible (and the grouping is checked to be acyclic
//!   before rewriting); a group holds at most one out-elementwise-fusable anchor and at most
//!   `max_depth` bindings; a var that leaves its dataflow block (a non-dataflow var) may be the
//!   last binding of a group, never an intermediate. The pass is deterministic.
//! - **Single-binding groups are not outlined.** TVM's reference (§4 of the fuse-ops notes:
//!   "groups of size 1 produce nothing, so the pass is a no-op" at opt level 0) leaves a lone
//!   call unfused, so fusebox does the same at every opt level: a lone op stays a plain call.
//!   [`fuse_ops_lifting`] with `lift_single_ops = true` (the pipeline's choice for
//!   `target = "cuda"`, where TVM would run a lone op as its own TIR kernel) also outlines each
//!   lone op call into a one-binding primitive function, so a device backend can claim it.
//!
//! Options: `opt_level` 0 fuses nothing; 1 fuses only elementwise/broadcast chains (a node of
//! kind ≤ broadcast into a post-dominator reached through ≤ broadcast edges and groups; no
//! anchors, reductions or injective ops) — TVM has no separate level 1, this is fusebox's
//! definition; 2 and above run TVM's three phases. `max_depth` (TVM's
//! `relax.FuseOps.max_depth`, default 256) bounds the bindings of one group.
//!
//! ```text
//! ; before
//! with R.dataflow():
//!     lv  = R.add(x, R.const(1, "float32"))
//!     lv1 = R.exp(lv)
//!     gv  = R.squeeze(lv1)
//!     R.output(gv)
//! ; after (opt_level 2)
//! @R.function(private=True)
//! def fused_add_exp_squeeze(x: ..., param_0: R.Tensor((), dtype="float32")) -> ...:
//!     R.func_attr({"Primitive": True, "anchor": "relax.squeeze", "fusion_kind": "injective"})
//!     ...
//! with R.dataflow():
//!     gv = cls.fused_add_exp_squeeze(x, R.const(1, "float32"))
//!     R.output(gv)
//! ```
//!
//! # Design note
//!
//! **Graph.** One node per binding of a dataflow block, in binding order (TVM's post-DFS order:
//! producers first). A node's kind is [`Op::fusion_kind`](crate::op::Op::fusion_kind) for an op
//! call, refined as TVM's `AnnotateTIROpPattern` would see the legalized op: a broadcast op with
//! an argument of exactly the output's shape is elementwise (`C[i, j] = A[i, j] + B[j]`, TVM's
//! "an elemwise load among broadcast loads is elemwise" rule, which is what lets a conv2d absorb
//! its bias add). A tuple-get-item is injective; a tuple-literal binding is opaque, as TVM Relax's
//! graph creator marks it (tuple *arguments* of calls such as `concat` are plain edges), so the
//! `Tuple` rules of phase 2 never fire here; everything else (aliases, constants, calls of
//! functions, local functions) is opaque. An edge from a producer to a consumer carries the consumer's kind. Non-dataflow vars
//! are `extern_ref`: they have no post-dominator, so they only ever end a group.
//!
//! **Post-dominator tree.** Built in reverse binding order: a node's immediate post-dominator is
//! the least common ancestor of its consumers in the tree, and the dominator edge's kind is the
//! maximum of the edge kinds and tree-edge kinds met while climbing (TVM's `CombinePattern`).
//!
//! **Phases** (TVM's `RunFuse`), over nodes in binding order, each node trying to fuse into its
//! post-dominator; a fusion merges the groups of every node on every path from the node to the
//! post-dominator into the post-dominator's group (union-find), so groups stay convex.
//! - Phase 0: an out-elementwise-fusable anchor (matmul, conv2d, pools) fuses when the dominator
//!   edge is elementwise and every group on the paths (sink included) is ≤ broadcast; a
//!   ≤ broadcast node fuses when the dominator edge is ≤ injective or a reduction, the path
//!   interior is ≤ injective and the sink group is anything but tuple or opaque.
//! - Phase 1: the same ≤ broadcast rule again, plus injective and tuple nodes when every group on
//!   the paths is ≤ injective. Reductions never start a fusion; they are only sinks.
//! - Phase 2: injective nodes fuse into an intermediate tuple whose group already joined an
//!   injective consumer.
//!
//! Deviations, each deliberate: the size check counts the exact size of the merged group (TVM
//! adds possibly stale per-node counts), so a group never exceeds `max_depth`; a fusion that
//! would put two anchors in one group is refused instead of aborting; structurally equal groups
//! of one function share one function (the outliner's sharing).
//!
//! **Report attributes.** `fusion_kind` is the kind of the group's master node and `anchor` its
//! op name: the last op binding of the highest kind (TVM's schedule anchor choice, `>=` in
//! binding order); a group without op calls has no anchor and the highest kind of its nodes.
//!
//! **Cost.** Building the graph and the tree is linear in bindings plus uses, except for the
//! LCA climbs, which are bounded by the tree depth per consumer (constant on chains). Each
//! fusion attempt walks only the nodes between a node and its post-dominator, with
//! generation-stamped visited marks (no clearing). Outlining reuses FuseOpsByPattern's rewrite,
//! which is linear in the function. The benchmark (`fusebox bench fuse-ops`) checks linearity.

use super::fuse_ops_by_pattern::{PartitionOptions, commit, is_entry};
use super::outline::{DedupIndex, Naming, rewrite};
use crate::error::{Error, Result};
use crate::ir::{
    AttrValue, Callee, EntityId, ExprId, ExprKind, FuncAttrs, Function, Module, Type, VarId,
};
use crate::op::FusionKind;
use crate::pattern::matcher::{FunctionView, operand_vars};
use std::borrow::Cow;

/// TVM's `kMaxFusedOps`, the default of `relax.FuseOps.max_depth`.
pub const DEFAULT_MAX_DEPTH: usize = 256;
/// The default fusion level (TVM's default `PassContext` opt level).
pub const DEFAULT_OPT_LEVEL: u32 = 2;

const NONE: u32 = u32::MAX;

/// The name of a fusion kind as the report prints it.
pub fn kind_name(k: FusionKind) -> &'static str {
    match k {
        FusionKind::ElemWise => "elemwise",
        FusionKind::Broadcast => "broadcast",
        FusionKind::Injective => "injective",
        FusionKind::CommReduce => "reduction",
        FusionKind::OutEWiseFusable => "out_elemwise_fusable",
        FusionKind::Tuple => "tuple",
        FusionKind::Opaque => "opaque",
    }
}

/// Runs FuseOps (see the module doc).
pub fn fuse_ops(module: &Module, opt_level: u32, max_depth: usize) -> Result<Module> {
    fuse_ops_lifting(module, opt_level, max_depth, false)
}

/// [`fuse_ops`], also outlining every lone op call of a fused block into its own primitive
/// function when `lift_single_ops` (see the module doc); inside the branches of `if`s too
/// (see [`super::regions`]).
pub fn fuse_ops_lifting(
    module: &Module,
    opt_level: u32,
    max_depth: usize,
    lift_single_ops: bool,
) -> Result<Module> {
    super::regions::map_regions(module, |m| {
        fuse_ops_lifting_flat(m, opt_level, max_depth, lift_single_ops)
    })
}

fn fuse_ops_lifting_flat(
    module: &Module,
    opt_level: u32,
    max_depth: usize,
    lift_single_ops: bool,
) -> Result<Module> {
    if opt_level == 0 {
        return Ok(module.clone());
    }
    let mut m: Cow<'_, Module> = Cow::Borrowed(module);
    let entries: Vec<String> = module
        .functions
        .iter()
        .filter(|(_, f)| is_entry(f))
        .map(|(n, _)| n.clone())
        .collect();
    for fname in entries {
        let Some(f) = m.functions.get(&fname) else {
            continue;
        };
        if !f.blocks.iter().any(|b| b.dataflow) {
            continue;
        }
        let view = FunctionView::new(f);
        let groups = partition_function(&view, opt_level, max_depth, lift_single_ops)?;
        if groups.is_empty() {
            continue;
        }
        // FuseOps lifts constants to parameters, as TVM's OperatorFusor with lift_constants.
        let opts = PartitionOptions {
            bind_constants: false,
            annotate_codegen: false,
        };
        let mut dedup = DedupIndex::default();
        let (nf, new_funcs) = rewrite(f, &view, &groups, opts, Naming::Short, &m, &mut dedup)?;
        drop(view);
        commit(&mut m, fname, nf, new_funcs);
    }
    Ok(m.into_owned())
}

/// The fusion kind of a binding's value (see the design note).
fn node_kind(f: &Function, value: ExprId) -> FusionKind {
    let d = f.expr(value);
    match &d.kind {
        ExprKind::Call {
            callee: Callee::Op(op),
            args,
        } => {
            let k = op.fusion_kind();
            if k == FusionKind::Broadcast && has_elemwise_arg(f, args, &d.ty) {
                FusionKind::ElemWise
            } else {
                k
            }
        }
        ExprKind::TupleGetItem(..) => FusionKind::Injective,
        // As TVM Relax: a tuple-valued binding is Opaque (tuple *arguments* of calls are edges).
        _ => FusionKind::Opaque,
    }
}

/// Whether some tensor argument has exactly the (known) shape of the result.
fn has_elemwise_arg(f: &Function, args: &[ExprId], out: &Type) -> bool {
    let Type::Tensor(t) = out else { return false };
    let Some(dims) = &t.dims else { return false };
    args.iter().any(|&a| match &f.expr(a).ty {
        Type::Tensor(at) => at.dims.as_ref() == Some(dims),
        _ => false,
    })
}

/// The dataflow graph of one block with its post-dominator tree and the fusion groups.
struct BlockGraph {
    kind: Vec<FusionKind>,
    /// Consumers (CSR) with the edge kind (the consumer's kind).
    out_start: Vec<u32>,
    outs: Vec<u32>,
    /// Post-dominator tree.
    dom: Vec<u32>,
    depth: Vec<u32>,
    dom_kind: Vec<FusionKind>,
    /// Union-find groups, one object per node.
    gparent: Vec<u32>,
    gkind: Vec<FusionKind>,
    gsize: Vec<u32>,
    ganchor: Vec<bool>,
    /// Generation-stamped marks for path walks.
    mark: Vec<u32>,
    root_mark: Vec<u32>,
    stamp: u32,
}

impl BlockGraph {
    fn outputs(&self, i: usize) -> &[u32] {
        let (a, b) = (self.out_start[i] as usize, self.out_start[i + 1] as usize);
        &self.outs[a..b]
    }

    fn find(&mut self, mut x: u32) -> u32 {
        let mut root = x;
        while self.gparent[root as usize] != root {
            root = self.gparent[root as usize];
        }
        while self.gparent[x as usize] != root {
            let next = self.gparent[x as usize];
            self.gparent[x as usize] = root;
            x = next;
        }
        root
    }

    fn lca(&self, mut a: u32, mut b: u32, kind: &mut FusionKind) -> u32 {
        while a != b {
            if a == NONE || b == NONE {
                return NONE;
            }
            let (da, db) = (self.depth[a as usize], self.depth[b as usize]);
            if da < db {
                *kind = (*kind).max(self.dom_kind[b as usize]);
                b = self.dom[b as usize];
            } else if db < da {
                *kind = (*kind).max(self.dom_kind[a as usize]);
                a = self.dom[a as usize];
            } else {
                *kind = (*kind).max(self.dom_kind[a as usize]);
                *kind = (*kind).max(self.dom_kind[b as usize]);
                a = self.dom[a as usize];
                b = self.dom[b as usize];
            }
        }
        a
    }

    fn build_post_dom(&mut self, extern_ref: &[bool]) {
        let n = self.kind.len();
        for i in (0..n).rev() {
            let (parent, k) = if extern_ref[i] {
                (NONE, FusionKind::Opaque)
            } else {
                let outs = self.outputs(i);
                match outs.split_first() {
                    None => (NONE, FusionKind::ElemWise),
                    Some((&first, rest)) => {
                        let mut k = self.kind[first as usize];
                        let mut p = first;
                        for &o in rest {
                            p = self.lca(p, o, &mut k);
                            k = k.max(self.kind[o as usize]);
                        }
                        (p, k)
                    }
                }
            };
            self.dom[i] = parent;
            self.dom_kind[i] = k;
            self.depth[i] = if parent == NONE {
                1
            } else {
                self.depth[parent as usize] + 1
            };
        }
    }

    /// Tries to fuse `src` into its post-dominator `sink`: every node on a path between them
    /// must satisfy `cond(group kind, is sink)`, the merged group must stay within `max_depth`
    /// and hold at most one anchor. Returns whether it fused.
    fn try_fuse(
        &mut self,
        src: u32,
        sink: u32,
        max_depth: usize,
        cond: impl Fn(FusionKind, bool) -> bool,
    ) -> bool {
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.mark.fill(0);
            self.root_mark.fill(0);
            self.stamp = 1;
        }
        let stamp = self.stamp;
        // The nodes from `src` up to (not including) `sink`.
        let mut path: Vec<u32> = vec![src];
        self.mark[src as usize] = stamp;
        let mut stack: Vec<u32> = vec![src];
        let mut sink_seen = false;
        while let Some(x) = stack.pop() {
            let (a, b) = (
                self.out_start[x as usize] as usize,
                self.out_start[x as usize + 1] as usize,
            );
            for k in a..b {
                let y = self.outs[k];
                if y == sink {
                    sink_seen = true;
                    continue;
                }
                if self.mark[y as usize] != stamp {
                    self.mark[y as usize] = stamp;
                    path.push(y);
                    stack.push(y);
                }
            }
        }
        if !sink_seen {
            return false;
        }
        let target = self.find(sink);
        if !cond(self.gkind[target as usize], true) {
            return false;
        }
        let mut roots: Vec<u32> = Vec::new();
        for (i, &x) in path.iter().enumerate() {
            let r = self.find(x);
            if i > 0 && !cond(self.gkind[r as usize], false) {
                return false;
            }
            if r != target && self.root_mark[r as usize] != stamp {
                self.root_mark[r as usize] = stamp;
                roots.push(r);
            }
        }
        let size: usize = self.gsize[target as usize] as usize
            + roots
                .iter()
                .map(|&r| self.gsize[r as usize] as usize)
                .sum::<usize>();
        if size > max_depth {
            return false;
        }
        let anchors = usize::from(self.ganchor[target as usize])
            + roots.iter().filter(|&&r| self.ganchor[r as usize]).count();
        if anchors > 1 {
            return false;
        }
        for r in roots {
            self.gparent[r as usize] = target;
            self.gsize[target as usize] += self.gsize[r as usize];
            if self.ganchor[r as usize] {
                self.ganchor[target as usize] = true;
                let k = self.gkind[target as usize].max(self.gkind[r as usize]);
                self.gkind[target as usize] = k;
            }
        }
        true
    }

    fn run_fuse(&mut self, phase: u8, opt_level: u32, max_depth: usize) {
        use FusionKind::*;
        let n = self.kind.len() as u32;
        for nid in 0..n {
            let own = self.gkind[nid as usize];
            if own == Opaque {
                continue;
            }
            let dom = self.dom[nid as usize];
            if dom == NONE {
                continue;
            }
            let edge = self.dom_kind[nid as usize];
            if phase == 2 {
                if own > Injective {
                    continue;
                }
                let droot = self.find(dom);
                if self.gkind[droot as usize] == Tuple {
                    continue;
                }
                if self.gkind[dom as usize] == Tuple && self.gkind[droot as usize] <= Injective {
                    self.try_fuse(nid, dom, max_depth, |k, _| k <= Injective);
                }
                continue;
            }
            if self.find(nid) == self.find(dom) {
                continue;
            }
            if self.gkind[dom as usize] == Tuple {
                continue;
            }
            if opt_level == 1 {
                if own <= Broadcast && edge <= Broadcast {
                    self.try_fuse(nid, dom, max_depth, |k, _| k <= Broadcast);
                }
                continue;
            }
            match own {
                OutEWiseFusable if phase == 0 && edge == ElemWise => {
                    self.try_fuse(nid, dom, max_depth, |k, _| k <= Broadcast);
                }
                k if k <= Broadcast && (edge <= Injective || edge == CommReduce) => {
                    self.try_fuse(nid, dom, max_depth, |k, sink| {
                        if sink {
                            k <= Broadcast
                                || k == CommReduce
                                || k == Injective
                                || k == OutEWiseFusable
                        } else {
                            k <= Injective
                        }
                    });
                }
                Injective | Tuple if phase == 1 => {
                    self.try_fuse(nid, dom, max_depth, |k, _| k <= Injective);
                }
                _ => {}
            }
        }
    }
}

/// The groups of one function: per dataflow block, the post-dominator partition; groups of two
/// or more bindings, each with its attributes, in order of first binding.
fn partition_function(
    view: &FunctionView<'_>,
    opt_level: u32,
    max_depth: usize,
    lift: bool,
) -> Result<Vec<(Vec<VarId>, FuncAttrs)>> {
    let f = view.func;
    let mut local: Vec<u32> = vec![NONE; f.vars.len()];
    let mut groups = Vec::new();
    for (bi, block) in f.blocks.iter().enumerate() {
        if !block.dataflow || block.bindings.len() < if lift { 1 } else { 2 } {
            continue;
        }
        let n = block.bindings.len();
        if n >= NONE as usize {
            return Err(Error::Invalid(
                "a dataflow block is too large to fuse".into(),
            ));
        }
        for (i, b) in block.bindings.iter().enumerate() {
            if let Some(slot) = local.get_mut(b.var.index()) {
                *slot = i as u32;
            }
        }
        let kind: Vec<FusionKind> = block
            .bindings
            .iter()
            .map(|b| node_kind(f, b.value))
            .collect();
        let extern_ref: Vec<bool> = block
            .bindings
            .iter()
            .map(|b| !f.var(b.var).dataflow)
            .collect();
        let mut out_start = Vec::with_capacity(n + 1);
        let mut outs = Vec::new();
        out_start.push(0u32);
        for b in &block.bindings {
            for &u in view.users_of(b.var) {
                if view.block_of(u) == Some(bi)
                    && let Some(&l) = local.get(u.index())
                    && l != NONE
                {
                    outs.push(l);
                }
            }
            out_start.push(outs.len() as u32);
        }
        let mut g = BlockGraph {
            gkind: kind.clone(),
            ganchor: kind
                .iter()
                .map(|&k| k == FusionKind::OutEWiseFusable)
                .collect(),
            kind,
            out_start,
            outs,
            dom: vec![NONE; n],
            depth: vec![1; n],
            dom_kind: vec![FusionKind::Opaque; n],
            gparent: (0..n as u32).collect(),
            gsize: vec![1; n],
            mark: vec![0; n],
            root_mark: vec![0; n],
            stamp: 0,
        };
        g.build_post_dom(&extern_ref);
        let phases: &[u8] = if opt_level == 1 { &[0] } else { &[0, 1, 2] };
        for &phase in phases {
            g.run_fuse(phase, opt_level, max_depth);
        }
        // Collect the members of each group of two or more, in binding order.
        let mut slot_of_root: Vec<u32> = vec![NONE; n];
        let mut members: Vec<Vec<u32>> = Vec::new();
        for i in 0..n as u32 {
            let r = g.find(i);
            let lone_op = lift
                && matches!(
                    f.expr(block.bindings[i as usize].value).kind,
                    ExprKind::Call {
                        callee: Callee::Op(_),
                        ..
                    }
                );
            if g.gsize[r as usize] < 2 && !lone_op {
                continue;
            }
            let s = &mut slot_of_root[r as usize];
            if *s == NONE {
                *s = members.len() as u32;
                members.push(Vec::new());
            }
            members[*s as usize].push(i);
        }
        check_acyclic(f, block, &local, &members)?;
        for ms in members {
            let vars: Vec<VarId> = ms.iter().map(|&i| block.bindings[i as usize].var).collect();
            let attrs = group_attrs(f, block, &g.kind, &ms);
            groups.push((vars, attrs));
        }
        for b in &block.bindings {
            if let Some(slot) = local.get_mut(b.var.index()) {
                *slot = NONE;
            }
        }
    }
    Ok(groups)
}

/// `Primitive`, plus `fusion_kind` and `anchor` of the group's master node.
fn group_attrs(
    f: &Function,
    block: &crate::ir::Block,
    kind: &[FusionKind],
    ms: &[u32],
) -> FuncAttrs {
    let mut anchor: Option<(FusionKind, &str)> = None;
    let mut max_kind = FusionKind::ElemWise;
    for &i in ms {
        let k = kind[i as usize];
        max_kind = max_kind.max(k);
        let b = block.bindings[i as usize];
        if let ExprKind::Call {
            callee: Callee::Op(op),
            ..
        } = &f.expr(b.value).kind
            && anchor.is_none_or(|(ak, _)| k >= ak)
        {
            anchor = Some((k, op.name()));
        }
    }
    let mut attrs = FuncAttrs {
        primitive: Some(AttrValue::Bool(true)),
        ..FuncAttrs::default()
    };
    let k = anchor.map_or(max_kind, |(k, _)| k);
    attrs
        .extra
        .insert("fusion_kind".into(), AttrValue::Str(kind_name(k).into()));
    if let Some((_, name)) = anchor {
        attrs
            .extra
            .insert("anchor".into(), AttrValue::Str(name.into()));
    }
    attrs
}

/// Checks that the block's bindings, with each group contracted to one node, form a DAG (the
/// post-dominator construction guarantees it; this keeps a bug from emitting ill-formed IR).
fn check_acyclic(
    f: &Function,
    block: &crate::ir::Block,
    local: &[u32],
    members: &[Vec<u32>],
) -> Result<()> {
    if members.is_empty() {
        return Ok(());
    }
    let n = block.bindings.len();
    // Unit of each binding: its group's index, or n + its own index.
    let mut unit: Vec<u32> = (0..n as u32).map(|i| members.len() as u32 + i).collect();
    for (gi, ms) in members.iter().enumerate() {
        for &i in ms {
            unit[i as usize] = gi as u32;
        }
    }
    let units = members.len() + n;
    let mut indeg = vec![0u32; units];
    let mut edges: Vec<Vec<u32>> = vec![Vec::new(); units];
    let mut ops = Vec::new();
    for (i, b) in block.bindings.iter().enumerate() {
        ops.clear();
        operand_vars(f, b.value, &mut ops);
        for o in &ops {
            let Some(&j) = local.get(o.index()) else {
                continue;
            };
            if j == NONE {
                continue;
            }
            let (from, to) = (unit[j as usize], unit[i]);
            if from != to {
                edges[from as usize].push(to);
                indeg[to as usize] += 1;
            }
        }
    }
    let mut ready: Vec<u32> = (0..units as u32)
        .filter(|&u| indeg[u as usize] == 0)
        .collect();
    let mut seen = 0usize;
    while let Some(u) = ready.pop() {
        seen += 1;
        for &v in &edges[u as usize] {
            indeg[v as usize] -= 1;
            if indeg[v as usize] == 0 {
                ready.push(v);
            }
        }
    }
    if seen != units {
        return Err(Error::Invalid(
            "internal: FuseOps grouping would create a cycle".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::verify::verify;
    use crate::text::{parse_module_str, print_module};

    fn fused(src: &str, opt: u32, depth: usize) -> String {
        let m = match parse_module_str(src) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        };
        let out = match fuse_ops(&m, opt, depth) {
            Ok(o) => o,
            Err(e) => panic!("{e}"),
        };
        if let Err(e) = verify(&out) {
            panic!("{e}");
        }
        print_module(&out).text
    }

    const CHAIN: &str = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4, 8), dtype="float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.nn.relu(a)
            c = R.sum(b, axis=[1], keepdims=False)
            R.output(c)
        return c
"#;

    #[test]
    fn chain_into_reduction() {
        let s = fused(CHAIN, 2, 256);
        assert!(s.contains("def fused_exp_relu_sum("), "{s}");
        assert!(s.contains(r#""fusion_kind": "reduction""#), "{s}");
    }

    #[test]
    fn opt_level_zero_and_depth_one_are_no_ops() {
        let before = fused(CHAIN, 0, 256);
        assert!(!before.contains("fused_"), "{before}");
        let s = fused(CHAIN, 2, 1);
        assert!(!s.contains("fused_"), "{s}");
    }

    #[test]
    fn report_carries_kind_and_anchor() {
        let m = match parse_module_str(CHAIN) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        };
        let out = match fuse_ops(&m, 2, 256) {
            Ok(o) => o,
            Err(e) => panic!("{e}"),
        };
        let r = crate::report::build(&out, &[]);
        assert_eq!(r.functions.len(), 1);
        assert_eq!(r.functions[0].fusion_kind.as_deref(), Some("reduction"));
        assert_eq!(r.functions[0].anchor.as_deref(), Some("relax.sum"));
        assert_eq!(r.main, vec!["primitive:fused_exp_relu_sum".to_string()]);
    }

    #[test]
    fn opt_level_one_stops_at_the_reduction() {
        let s = fused(CHAIN, 1, 256);
        assert!(s.contains("def fused_exp_relu("), "{s}");
        assert!(!s.contains("fused_exp_relu_sum"), "{s}");
    }
}
