//! Outlining: each group of bindings of a function becomes a call of a new private function,
//! for the passes that group (FuseOpsByPattern, FuseOps, MergeCompositeFunctions, and
//! DeadCodeElimination's rewrite of what they left).
//!
//! Contract ([`rewrite`]):
//!
//! - Each group (its member vars, in binding order, and the attributes of the function it
//!   becomes) is outlined into one function named after its calls (`fused_<op>_<op>…`, see
//!   [`Naming`]; numeric suffixes keep names unique). Parameters are the outside values the
//!   group reads, in first-use order, each once; constants stay inside with `bind_constants`,
//!   else they become parameters `param_<k>`, as do shape literals with symbolic dims; shape and
//!   prim literals stay inside. Outputs are the group's non-dataflow vars, then the vars used by
//!   other bindings in order of first use; several outputs return a tuple the caller unpacks
//!   in binding order.
//! - Structurally equal functions are shared ([`DedupIndex`]): one function per shape of group,
//!   each call keeping its own return type.
//! - The caller is re-emitted with groups in order of first appearance, each after the bindings
//!   it depends on; fused calls bind fresh vars `lv…` (dataflow) or `gv…` (visible after the
//!   block), never a name that stays.
//!
//! ```text
//! ; before: the group {lv, conv1}
//! lv: R.Tensor(...) = R.nn.conv2d(data, weight1, ...)
//! conv1: R.Tensor(...) = R.nn.relu(lv)
//! ; after
//! @R.function(private=True)
//! def fused_relax_nn_conv2d_relax_nn_relu(data: ..., weight1: ...) -> ...:
//!     ...
//! gv: R.Tensor(...) = cls.fused_relax_nn_conv2d_relax_nn_relu(data, weight1)
//! ```

use super::fuse_ops_by_pattern::{PartitionOptions, VarSet, is_entry};
use crate::error::{Error, Result};
use crate::ir::copy::{ExprMap, VarIndex, VarLookup, copy_expr};
use crate::ir::structural::{function_eq, function_hash};
use crate::ir::{
    Binding, Block, Callee, ExprId, ExprKind, FuncAttrs, Function, Module, Origin, Sym, Type, VarId,
};
use crate::pattern::matcher::{FunctionView, operand_vars};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Composite functions of the module by structural hash, for sharing equal functions.
#[derive(Default)]
pub(crate) struct DedupIndex {
    built: bool,
    by_hash: HashMap<u64, Vec<String>>,
}

impl DedupIndex {
    pub(crate) fn ensure(&mut self, m: &Module) {
        if self.built {
            return;
        }
        self.built = true;
        for (name, f) in &m.functions {
            if !is_entry(f) {
                self.by_hash
                    .entry(function_hash(f))
                    .or_default()
                    .push(name.clone());
            }
        }
    }

    fn find(
        &self,
        m: &Module,
        pending: &[(String, Function)],
        f: &Function,
        h: u64,
    ) -> Option<String> {
        let names = self.by_hash.get(&h)?;
        let mut equal: Vec<&String> = names
            .iter()
            .filter(|n| {
                m.get(n)
                    .or_else(|| pending.iter().find(|(p, _)| p == *n).map(|(_, f)| f))
                    .is_some_and(|g| function_eq(f, g))
            })
            .collect();
        equal.sort();
        equal.first().map(|s| (*s).clone())
    }
}

/// The bases of fresh names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Base {
    /// `lv`, `lv1`, … (dataflow vars).
    Lv,
    /// `gv`, `gv1`, … (vars visible after their block, outputs).
    Gv,
}

impl Base {
    fn text(self) -> &'static str {
        match self {
            Base::Lv => "lv",
            Base::Gv => "gv",
        }
    }
}

/// Fresh names `lv`, `lv1`, … / `gv`, `gv1`, …: per base, the next suffix (counting up from
/// none) whose name is not reserved. Only reserved names of the form `<base>` or `<base><n>`
/// (`n` without leading zeros) can collide, so they are kept as suffix numbers, and names
/// handed out never repeat because the counters only go up.
#[derive(Default)]
struct FreshNames {
    /// Per base (`Lv`, `Gv`): the next suffix to try, and the reserved suffixes (0: the bare
    /// base).
    next: [u64; 2],
    reserved: [HashSet<u64>; 2],
}

impl FreshNames {
    /// Reserves `name` (a name fresh names must avoid).
    fn reserve(&mut self, name: &str) {
        for (i, base) in [Base::Lv, Base::Gv].into_iter().enumerate() {
            if let Some(rest) = name.strip_prefix(base.text()) {
                let n = if rest.is_empty() {
                    Some(0)
                } else if rest.starts_with('0') || !rest.bytes().all(|c| c.is_ascii_digit()) {
                    None
                } else {
                    rest.parse::<u64>().ok()
                };
                if let Some(n) = n {
                    self.reserved[i].insert(n);
                }
            }
        }
    }

    fn fresh(&mut self, base: Base) -> String {
        let i = base as usize;
        loop {
            let n = self.next[i];
            self.next[i] += 1;
            if !self.reserved[i].contains(&n) {
                return numbered(base.text(), n);
            }
        }
    }
}

/// `base` followed by `n` in decimal, or `base` alone when `n` is 0.
fn numbered(base: &str, n: u64) -> String {
    let mut digits = [0u8; 20];
    let mut k = digits.len();
    let mut x = n;
    while x > 0 {
        k -= 1;
        digits[k] = b'0' + (x % 10) as u8;
        x /= 10;
    }
    let mut out = String::with_capacity(base.len() + digits.len() - k);
    out.push_str(base);
    for &d in &digits[k..] {
        out.push(char::from(d));
    }
    out
}

/// How outlined functions are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Naming {
    /// `fused_relax_nn_conv2d_relax_nn_relu` (FuseOpsByPattern, as TVM).
    Full,
    /// `fused_conv2d_relu` (FuseOps: the op's last name segment, as TVM's PrimFunc names).
    Short,
}

/// The name hint of a group: `fused_` + each call's op name (global callees without `fused_`).
fn group_name(f: &Function, members: &[VarId], view: &FunctionView<'_>, naming: Naming) -> String {
    let mut name = String::from("fused");
    for &v in members {
        let Some((_, value)) = view.bound(v) else {
            continue;
        };
        if let ExprKind::Call { callee, .. } = &f.expr(value).kind {
            name.push('_');
            match callee {
                Callee::Op(op) => match naming {
                    Naming::Full => name.push_str(&op.name().replace('.', "_")),
                    Naming::Short => name.push_str(op.name().rsplit('.').next().unwrap_or("op")),
                },
                Callee::Global(g) => name.push_str(g.strip_prefix("fused_").unwrap_or(g)),
                Callee::Local(l) => name.push_str(&f.var(*l).name),
            }
        }
    }
    name
}

/// A unique function name: `base`, else `base1`, `base2`, … (no underscore before the number).
pub(crate) fn unique_name(base: &str, taken: &dyn Fn(&str) -> bool) -> String {
    if !taken(base) {
        return base.to_string();
    }
    (1..)
        .map(|i| format!("{base}{i}"))
        .find(|n| !taken(n))
        .unwrap_or_else(|| base.to_string())
}

/// An outlined group; its outputs (old vars, in tuple order) are in `ShapeCache::outputs`.
struct Outlined {
    callee: Arc<str>,
    args: Vec<ExprId>, // in the new caller
    ret_ty: Type,
}

/// One token of a group's shape: enough to decide, without building the outlined function,
/// that two groups of one function outline to structurally equal functions.
#[derive(Clone, Copy)]
enum Tok<'f> {
    Call(&'f Callee, usize, &'f Type),
    Tuple(usize),
    Tgi(u32),
    Member(usize),
    Param(usize),
    Lit(&'f ExprKind),
    Const(&'f crate::ir::Constant),
    Bind(&'f Type, bool),
    ParamTy(&'f Type),
    Out(usize),
}

/// Type equality with the common case (tensors with shared dims) inline.
#[inline]
fn ty_eq(a: &Type, b: &Type) -> bool {
    match (a, b) {
        (Type::Tensor(x), Type::Tensor(y)) => x == y,
        _ => a == b,
    }
}

// Field-wise equality (what `derive` would give), with types compared through `ty_eq`.
impl PartialEq for Tok<'_> {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Tok::Call(c, n, t), Tok::Call(d, m, u)) => n == m && c == d && ty_eq(t, u),
            (Tok::Tuple(a), Tok::Tuple(b)) => a == b,
            (Tok::Tgi(a), Tok::Tgi(b)) => a == b,
            (Tok::Member(a), Tok::Member(b)) => a == b,
            (Tok::Param(a), Tok::Param(b)) => a == b,
            (Tok::Lit(a), Tok::Lit(b)) => a == b,
            (Tok::Const(a), Tok::Const(b)) => a == b,
            (Tok::Bind(t, df), Tok::Bind(u, dg)) => df == dg && ty_eq(t, u),
            (Tok::ParamTy(t), Tok::ParamTy(u)) => ty_eq(t, u),
            (Tok::Out(a), Tok::Out(b)) => a == b,
            _ => false,
        }
    }
}

impl Tok<'_> {
    /// A cheap hash of the token's kind and indices (equality is checked in full).
    fn hash_into(&self, h: &mut u64) {
        let mix = |h: &mut u64, x: u64| {
            *h = (h.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
        };
        match self {
            Tok::Call(c, n, _) => {
                mix(h, 1);
                mix(h, *n as u64);
                if let Callee::Op(op) = c {
                    op.name().bytes().for_each(|b| mix(h, u64::from(b)));
                }
            }
            Tok::Tuple(n) => mix(h, 2 + ((*n as u64) << 8)),
            Tok::Tgi(i) => mix(h, 3 + (u64::from(*i) << 8)),
            Tok::Member(i) => mix(h, 4 + ((*i as u64) << 8)),
            Tok::Param(i) => mix(h, 5 + ((*i as u64) << 8)),
            Tok::Lit(_) => mix(h, 6),
            Tok::Const(c) => mix(h, 7 + ((c.data.len() as u64) << 8)),
            Tok::Bind(_, df) => mix(h, 8 + u64::from(*df)),
            Tok::ParamTy(_) => mix(h, 9),
            Tok::Out(i) => mix(h, 10 + ((*i as u64) << 8)),
        }
    }
}

/// Where a parameter of an outlined group comes from.
#[derive(Clone, Copy)]
enum ParamSrc {
    Var(VarId),
    Const(ExprId),
}

/// A group shape already outlined: its tokens, callee and the callee's return type.
type Shaped<'f> = (Vec<Tok<'f>>, Arc<str>, Type);

/// Groups already outlined in this rewrite, by shape: equal shapes share a callee (kept with
/// its return type). The shape hit last is tried first, checking the group's tokens as they are
/// produced (a repeated layer costs no hashing and no token buffer). Also the buffers of
/// [`outline`], reused across groups.
#[derive(Default)]
pub(crate) struct ShapeCache<'f> {
    shapes: Vec<Shaped<'f>>,
    by_hash: HashMap<u64, Vec<usize>>,
    last: Option<usize>,
    inside: VarSet,
    outputs: Vec<VarId>,
    firsts: Vec<(usize, usize, VarId, ExprId)>,
    ops: Vec<VarId>,
    psrc: Vec<ParamSrc>,
    toks: Vec<Tok<'f>>,
}

/// Where [`encode`] puts tokens: a buffer, or a check against a known shape's tokens.
trait TokSink<'f> {
    fn push(&mut self, t: Tok<'f>);
}

impl<'f> TokSink<'f> for Vec<Tok<'f>> {
    fn push(&mut self, t: Tok<'f>) {
        Vec::push(self, t);
    }
}

/// Checks tokens, as they come, against `want`.
struct Verify<'a, 'f> {
    want: &'a [Tok<'f>],
    next: usize,
    same: bool,
}

impl<'f> TokSink<'f> for Verify<'_, 'f> {
    fn push(&mut self, t: Tok<'f>) {
        if self.same {
            self.same = self.want.get(self.next) == Some(&t);
            self.next += 1;
        }
    }
}

impl Verify<'_, '_> {
    /// Whether every token matched and none is missing.
    fn matched(&self) -> bool {
        self.same && self.next == self.want.len()
    }
}

/// Encodes a group (see [`Tok`]) into `out`, assigning parameters in first-use order.
fn encode_group<'f, S: TokSink<'f>>(
    f: &'f Function,
    view: &FunctionView<'f>,
    members: &[VarId],
    outputs: &[VarId],
    bind_constants: bool,
    out: &mut (Vec<ParamSrc>, S),
) {
    for &v in members {
        if let Some((_, value)) = view.bound(v) {
            out.1.push(Tok::Bind(&f.var(v).ty, f.var(v).dataflow));
            encode(f, view, value, members, bind_constants, out);
        }
    }
    for o in outputs {
        if let Some(k) = members.iter().position(|m| m == o) {
            out.1.push(Tok::Out(k));
        }
    }
}

/// Encodes value `e` of a group member (see [`Tok`]), assigning parameters in first-use order.
fn encode<'f, S: TokSink<'f>>(
    f: &'f Function,
    view: &FunctionView<'f>,
    e: ExprId,
    members: &[VarId],
    bind_constants: bool,
    out: &mut (Vec<ParamSrc>, S),
) {
    let d = f.expr(e);
    match &d.kind {
        ExprKind::Call { callee, args } => {
            out.1.push(Tok::Call(callee, args.len(), &d.ty));
            for &a in args {
                encode(f, view, a, members, bind_constants, out);
            }
        }
        ExprKind::Tuple(xs) => {
            out.1.push(Tok::Tuple(xs.len()));
            for &x in xs {
                encode(f, view, x, members, bind_constants, out);
            }
        }
        ExprKind::TupleGetItem(x, i) => {
            out.1.push(Tok::Tgi(*i));
            encode(f, view, *x, members, bind_constants, out);
        }
        ExprKind::Var(x) => {
            if let Some(k) = members.iter().position(|m| m == x) {
                out.1.push(Tok::Member(k));
            } else if let Some(lit) = static_literal(f, view, *x) {
                out.1.push(Tok::Lit(&f.expr(lit).kind));
            } else {
                let known = out
                    .0
                    .iter()
                    .position(|p| matches!(p, ParamSrc::Var(v) if v == x));
                let k = match known {
                    Some(k) => k,
                    None => {
                        out.0.push(ParamSrc::Var(*x));
                        out.1.push(Tok::ParamTy(&f.var(*x).ty));
                        out.0.len() - 1
                    }
                };
                out.1.push(Tok::Param(k));
            }
        }
        // A lifted leaf (see [`is_lifted`]): a constant compares by value, a constant without a
        // value by identity, a symbolic shape literal by its type (its symbols are then bound
        // by the function's signature, so two call sites with different symbols can share it).
        kind if is_lifted(kind, bind_constants) => {
            out.0.push(ParamSrc::Const(e));
            out.1.push(match kind {
                ExprKind::Const(c) => Tok::Const(c),
                ExprKind::ShapeLit(_) => Tok::ParamTy(&d.ty),
                k => Tok::Lit(k),
            });
            out.1.push(Tok::Param(out.0.len() - 1));
        }
        ExprKind::Const(c) => out.1.push(Tok::Const(c)),
        other => out.1.push(Tok::Lit(other)),
    }
}

#[allow(
    clippy::too_many_arguments,
    reason = "the pieces of one rewrite, kept explicit"
)]
fn outline<'f>(
    f: &'f Function,
    view: &FunctionView<'f>,
    members: &[VarId],
    attrs: &FuncAttrs,
    opts: PartitionOptions,
    naming: Naming,
    caller: &mut Function,
    cmap: &ExprMap,
    m: &Module,
    dedup: &mut DedupIndex,
    pending: &mut Vec<(String, Function)>,
    cache: &mut ShapeCache<'f>,
) -> Result<Outlined> {
    let ShapeCache {
        inside,
        outputs,
        firsts,
        ops,
        psrc,
        toks,
        ..
    } = cache;
    inside.fill(members);
    // Outputs: non-dataflow members, then members used by other bindings in first-use order.
    outputs.clear();
    outputs.extend(members.iter().copied().filter(|v| !f.var(*v).dataflow));
    // First outside use of each member (position of the using binding, then operand order in
    // it): the order in which a scan of the block would first see the uses. Found through the
    // use index, so the cost is the group's uses, not the block's size.
    firsts.clear();
    for &mv in members {
        if outputs.contains(&mv) {
            continue;
        }
        let first = view
            .users_of(mv)
            .iter()
            .filter(|u| !inside.contains(u) && view.block_of(**u) == view.block_of(mv))
            .filter_map(|&u| view.bound(u))
            .min_by_key(|&(p, _)| p);
        if let Some((p, e)) = first {
            firsts.push((p, 0, mv, e));
        }
    }
    // Members first used by the same binding are ordered by operand position there (the
    // position is only looked up when there are several).
    if firsts.len() > 1 {
        for (_, k, mv, e) in firsts.iter_mut() {
            ops.clear();
            operand_vars(f, *e, ops);
            *k = ops.iter().position(|o| o == mv).unwrap_or(0);
        }
    }
    firsts.sort_unstable();
    outputs.extend(firsts.iter().map(|&(_, _, v, _)| v));
    if outputs.is_empty() {
        // Unused group: keep its last binding as the output so no op is dropped.
        outputs.extend(members.last());
    }
    // Fast path: a group of the same shape was outlined before; share its callee. The shape hit
    // last is checked first, token by token; else the group's tokens are hashed and looked up.
    let mut hit = None;
    let mut key = 0u64;
    if let Some((want, name, ty)) = cache.last.and_then(|i| cache.shapes.get(i)) {
        let verify = Verify {
            want,
            next: 0,
            same: true,
        };
        let mut enc = (std::mem::take(psrc), verify);
        enc.0.clear();
        encode_group(f, view, members, outputs, opts.bind_constants, &mut enc);
        *psrc = enc.0;
        if enc.1.matched() {
            hit = Some((name.clone(), ty.clone()));
        }
    }
    if hit.is_none() {
        let mut enc = (std::mem::take(psrc), std::mem::take(toks));
        enc.0.clear();
        enc.1.clear();
        encode_group(f, view, members, outputs, opts.bind_constants, &mut enc);
        (*psrc, *toks) = enc;
        toks.iter().for_each(|t| t.hash_into(&mut key));
        let found = cache.by_hash.get(&key).and_then(|list| {
            list.iter()
                .copied()
                .find(|&i| cache.shapes.get(i).is_some_and(|s| s.0 == cache.toks))
        });
        if let Some((i, (_, name, ty))) = found.and_then(|i| Some((i, cache.shapes.get(i)?))) {
            cache.last = Some(i);
            hit = Some((name.clone(), ty.clone()));
        }
    }
    if let Some((callee, ret_ty)) = hit {
        let mut args = Vec::with_capacity(cache.psrc.len());
        for &p in &cache.psrc {
            args.push(match p {
                ParamSrc::Var(x) => cmap.get(x).ok_or_else(|| {
                    Error::Invalid(format!(
                        "internal: `{}` is not defined before its group",
                        f.var(x).name
                    ))
                })?,
                ParamSrc::Const(leaf) => {
                    let d = f.expr(leaf);
                    caller.add_expr(d.kind.clone(), d.ty.clone())
                }
            });
        }
        return Ok(Outlined {
            callee,
            args,
            ret_ty,
        });
    }
    let outputs = &cache.outputs;
    let inside = &cache.inside;
    let mut cf = Function::new();
    let mut fmap: HashMap<VarId, ExprId> = HashMap::default();
    let mut args: Vec<ExprId> = Vec::new();
    let mut lifted = 0usize;
    // Parameters in first-use order; leaves are rewritten in place.
    let mut leaf_map: HashMap<ExprId, ExprId> = HashMap::default();
    for &v in members {
        let Some((_, value)) = view.bound(v) else {
            continue;
        };
        let mut leaves = Vec::new();
        collect_leaves(f, value, &mut leaves);
        for leaf in leaves {
            match &f.expr(leaf).kind {
                ExprKind::Var(x) if !inside.contains(x) && !fmap.contains_key(x) => {
                    // A var bound to a static shape or prim literal is inlined.
                    if let Some(lit) = static_literal(f, view, *x) {
                        let d = f.expr(lit);
                        let ne = cf.add_expr(d.kind.clone(), d.ty.clone());
                        fmap.insert(*x, ne);
                        continue;
                    }
                    let vd = f.var(*x);
                    let p =
                        cf.add_var_from(vd.name.clone(), vd.ty.clone(), false, vd.origin.clone());
                    cf.params.push(p);
                    fmap.insert(*x, cf.var_expr(p));
                    let outer = cmap.get(*x).ok_or_else(|| {
                        Error::Invalid(format!(
                            "internal: `{}` is not defined before its group",
                            vd.name
                        ))
                    })?;
                    args.push(outer);
                }
                // A lifted leaf (see [`is_lifted`]): a parameter `param_<k>` of the leaf's type
                // (a valueless constant's as the parser typed it), the leaf itself the argument.
                kind if is_lifted(kind, opts.bind_constants) => {
                    let ty = f.expr(leaf).ty.clone();
                    let p = cf.add_var(format!("param_{lifted}"), ty.clone(), false);
                    lifted += 1;
                    cf.params.push(p);
                    leaf_map.insert(leaf, cf.var_expr(p));
                    let outer = caller.add_expr(kind.clone(), ty);
                    args.push(outer);
                }
                _ => {}
            }
        }
    }
    // Body: one dataflow block; outputs renamed gv, gv1, … (avoiding members' and params'
    // names).
    let mut names = FreshNames::default();
    for &v in members {
        names.reserve(&f.var(v).name);
    }
    for (_, d) in cf.vars.iter() {
        names.reserve(&d.name);
    }
    let mut body = Block {
        dataflow: true,
        bindings: Vec::new(),
    };
    for &v in members {
        let Some((_, value)) = view.bound(v) else {
            continue;
        };
        let ne = copy_with_leaves(f, value, &mut cf, &fmap, &leaf_map)?;
        let vd = f.var(v);
        let is_out = outputs.contains(&v);
        let name = if is_out {
            names.fresh(Base::Gv)
        } else {
            vd.name.clone()
        };
        let nv = cf.add_var_from(name, vd.ty.clone(), !is_out, vd.origin.clone());
        body.bindings.push(Binding { var: nv, value: ne });
        fmap.insert(v, cf.var_expr(nv));
    }
    cf.blocks.push(body);
    let ret = if outputs.len() == 1 {
        fmap.get(&outputs[0]).copied()
    } else {
        let fields: Option<Vec<ExprId>> = outputs.iter().map(|o| fmap.get(o).copied()).collect();
        fields.map(|fs| {
            let ty = Type::Tuple(fs.iter().map(|&e| cf.expr(e).ty.clone()).collect());
            cf.add_expr(ExprKind::Tuple(fs), ty)
        })
    };
    let ret = ret.ok_or_else(|| Error::Invalid("internal: group output has no value".into()))?;
    cf.ret_ty = cf.expr(ret).ty.clone();
    cf.ret = Some(ret);
    cf.attrs = attrs.clone();
    let mut used: BTreeSet<Sym> = BTreeSet::new();
    for (_, vd) in cf.vars.iter() {
        vd.ty.collect_syms(&mut used);
    }
    cf.ret_ty.collect_syms(&mut used);
    cf.sym_vars = f
        .sym_vars
        .iter()
        .filter(|s| used.contains(*s))
        .cloned()
        .collect();
    // Share a structurally equal function, else add under a unique name.
    let h = function_hash(&cf);
    // The call's type is this group's own (in the caller's symbols): a shared function equal
    // up to renaming its symbols returns it instantiated with this call's arguments.
    let ret_ty = cf.ret_ty.clone();
    let callee = match dedup.find(m, pending, &cf, h) {
        Some(existing) => existing,
        None => {
            let base = group_name(f, members, view, naming);
            let name = unique_name(&base, &|n| {
                m.get(n).is_some() || pending.iter().any(|(p, _)| p == n)
            });
            dedup.by_hash.entry(h).or_default().push(name.clone());
            pending.push((name.clone(), cf));
            name
        }
    };
    let callee: Arc<str> = callee.into();
    let toks = cache.toks.clone();
    let i = cache.shapes.len();
    cache.shapes.push((toks, callee.clone(), ret_ty.clone()));
    cache.by_hash.entry(key).or_default().push(i);
    cache.last = Some(i);
    Ok(Outlined {
        callee,
        args,
        ret_ty,
    })
}

/// Leaves of a value in argument order (tuple fields flattened).
fn collect_leaves(f: &Function, e: ExprId, out: &mut Vec<ExprId>) {
    match &f.expr(e).kind {
        ExprKind::Call { args, .. } => args.iter().for_each(|&a| collect_leaves(f, a, out)),
        ExprKind::Tuple(xs) => xs.iter().for_each(|&x| collect_leaves(f, x, out)),
        ExprKind::TupleGetItem(x, _) => collect_leaves(f, *x, out),
        _ => out.push(e),
    }
}

/// Whether every dim is a known extent.
fn all_static(dims: &[crate::ir::Dim]) -> bool {
    dims.iter().all(|d| d.as_static().is_some())
}

/// Whether a leaf of a group becomes a parameter of the outlined function: constants (with or
/// without values) unless `bind_constants`, and shape literals with symbolic dims always.
fn is_lifted(kind: &ExprKind, bind_constants: bool) -> bool {
    match kind {
        ExprKind::Const(_) | ExprKind::ConstRef(_) => !bind_constants,
        ExprKind::ShapeLit(dims) => !all_static(dims),
        _ => false,
    }
}

/// The literal a var is bound to (through aliases) when it is a shape without symbols or a prim
/// value.
fn static_literal(f: &Function, view: &FunctionView<'_>, v: VarId) -> Option<ExprId> {
    let (_, value) = view.bound(v)?;
    let e = view.unwrap(value, usize::MAX);
    match &f.expr(e).kind {
        ExprKind::ShapeLit(dims) if dims.iter().all(|d| d.as_static().is_some()) => Some(e),
        ExprKind::Prim(_) => Some(e),
        _ => None,
    }
}

fn copy_with_leaves(
    src: &Function,
    e: ExprId,
    dst: &mut Function,
    map: &impl VarLookup,
    leaf_map: &HashMap<ExprId, ExprId>,
) -> Result<ExprId> {
    if let Some(&ne) = leaf_map.get(&e) {
        return Ok(ne);
    }
    let d = src.expr(e);
    match &d.kind {
        ExprKind::Call { callee, args } if !matches!(callee, Callee::Local(_)) => {
            let args = args
                .iter()
                .map(|&a| copy_with_leaves(src, a, dst, map, leaf_map))
                .collect::<Result<_>>()?;
            Ok(dst.add_expr(
                ExprKind::Call {
                    callee: callee.clone(),
                    args,
                },
                d.ty.clone(),
            ))
        }
        ExprKind::Tuple(xs) => {
            let xs = xs
                .iter()
                .map(|&x| copy_with_leaves(src, x, dst, map, leaf_map))
                .collect::<Result<_>>()?;
            Ok(dst.add_expr(ExprKind::Tuple(xs), d.ty.clone()))
        }
        ExprKind::TupleGetItem(x, i) => {
            let x = copy_with_leaves(src, *x, dst, map, leaf_map)?;
            Ok(dst.add_expr(ExprKind::TupleGetItem(x, *i), d.ty.clone()))
        }
        _ => copy_expr(src, e, dst, map),
    }
}

pub(crate) type NewFunctions = Vec<(String, Function)>;

/// A group to outline: its members (bound vars, in binding order) and its function's attributes.
pub(crate) trait GroupSpec {
    /// The members.
    fn members(&self) -> &[VarId];
    /// The attributes of the outlined function.
    fn attrs(&self) -> &FuncAttrs;
}

impl GroupSpec for (Vec<VarId>, FuncAttrs) {
    fn members(&self) -> &[VarId] {
        &self.0
    }
    fn attrs(&self) -> &FuncAttrs {
        &self.1
    }
}

impl GroupSpec for (&[VarId], &FuncAttrs) {
    fn members(&self) -> &[VarId] {
        self.0
    }
    fn attrs(&self) -> &FuncAttrs {
        self.1
    }
}

pub(crate) fn rewrite<G: GroupSpec>(
    f: &Function,
    view: &FunctionView<'_>,
    groups: &[G],
    opts: PartitionOptions,
    naming: Naming,
    m: &Module,
    dedup: &mut DedupIndex,
) -> Result<(Function, NewFunctions)> {
    let mut group_of = VarIndex::new(f.vars.len());
    for (gi, g) in groups.iter().enumerate() {
        for &v in g.members() {
            group_of.insert(v, gi as u32);
        }
    }
    let mut nf = Function::new();
    // The new function is at most about as large as the old one: size its arenas once.
    nf.vars.reserve(f.vars.len());
    nf.exprs.reserve(f.exprs.len());
    nf.attrs = f.attrs.clone();
    nf.sym_vars = f.sym_vars.clone();
    nf.ret_ty = f.ret_ty.clone();
    let mut map = ExprMap::new(f.vars.len());
    let mut names = FreshNames::default();
    nf.params.reserve(f.params.len());
    // Fresh names avoid every name that stays: the params and the vars outside groups.
    for &p in &f.params {
        let vd = f.var(p);
        names.reserve(&vd.name);
        let np = nf.add_var_from(vd.name.clone(), vd.ty.clone(), false, vd.origin.clone());
        nf.params.push(np);
        map.insert(p, nf.var_expr(np));
    }
    for (v, d) in f.vars.iter() {
        // `map` holds exactly the params here; their names are reserved above.
        if !group_of.contains_key(v) && !map.contains_key(v) {
            names.reserve(&d.name);
        }
    }
    let mut pending: NewFunctions = Vec::new();
    let mut cache = ShapeCache::default();
    // Units: a group (by index) or a single binding; emitted in order of first appearance,
    // each after the units it depends on.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Unit {
        Group(usize),
        Single(usize),
    }
    let ngroups = groups.len();
    // Per var of the current block: its binding's index (cleared after the block).
    let mut index = VarIndex::new(f.vars.len());
    let mut done: Vec<bool> = Vec::new();
    // Expanded and not yet done: on the path from the DFS root to the unit being expanded.
    let mut open: Vec<bool> = Vec::new();
    let mut order: Vec<Unit> = Vec::new();
    let mut stack: Vec<(Unit, bool)> = Vec::new();
    let mut deps: Vec<Unit> = Vec::new();
    let mut ops: Vec<VarId> = Vec::new();
    for block in &f.blocks {
        let mut out = Block {
            dataflow: block.dataflow,
            bindings: Vec::new(),
        };
        let has_group = block.bindings.iter().any(|b| group_of.contains_key(b.var));
        if !has_group {
            out.bindings.reserve(block.bindings.len());
            for b in &block.bindings {
                emit_copy(f, b, &mut nf, &mut map, &mut out)?;
            }
            nf.blocks.push(out);
            continue;
        }
        for (i, b) in block.bindings.iter().enumerate() {
            index.insert(b.var, i as u32);
        }
        let unit_of = |i: usize| -> Unit {
            match group_of.get(block.bindings[i].var) {
                Some(g) => Unit::Group(g as usize),
                None => Unit::Single(i),
            }
        };
        // The units `u` depends on, in order of first use, into `deps`.
        let deps_of = |u: Unit, deps: &mut Vec<Unit>, ops: &mut Vec<VarId>| {
            deps.clear();
            let mut add = |i: usize, deps: &mut Vec<Unit>| {
                ops.clear();
                operand_vars(f, block.bindings[i].value, ops);
                for o in ops.iter() {
                    if let Some(j) = index.get(*o).map(|j| j as usize) {
                        let du = unit_of(j);
                        if du != u && !deps.contains(&du) {
                            deps.push(du);
                        }
                    }
                }
            };
            match u {
                Unit::Single(i) => add(i, deps),
                Unit::Group(g) => {
                    for v in groups[g].members() {
                        if let Some(i) = index.get(*v).map(|i| i as usize) {
                            add(i, deps);
                        }
                    }
                }
            }
        };
        let uid = |u: Unit| match u {
            Unit::Group(g) => g,
            Unit::Single(i) => ngroups + i,
        };
        done.clear();
        done.resize(ngroups + block.bindings.len(), false);
        open.clear();
        open.resize(ngroups + block.bindings.len(), false);
        order.clear();
        order.reserve(block.bindings.len());
        for i in 0..block.bindings.len() {
            let u = unit_of(i);
            if done[uid(u)] {
                continue;
            }
            // Iterative DFS: emit dependencies first.
            stack.clear();
            stack.push((u, false));
            while let Some((x, expanded)) = stack.pop() {
                if done[uid(x)] {
                    continue;
                }
                if expanded {
                    done[uid(x)] = true;
                    open[uid(x)] = false;
                    order.push(x);
                    continue;
                }
                if open[uid(x)] {
                    // `x` depends on itself through other units: the groups are not convex.
                    let name = |u: Unit| match u {
                        Unit::Group(g) => groups[g].members().first().map_or_else(
                            || format!("group {g}"),
                            |v| format!("the group of `{}`", f.var(*v).name),
                        ),
                        Unit::Single(i) => format!("`{}`", f.var(block.bindings[i].var).name),
                    };
                    return Err(Error::Invalid(format!(
                        "internal: {} depends on itself through {}: the groups form a cycle",
                        name(x),
                        stack
                            .iter()
                            .rev()
                            .find(|(_, e)| *e)
                            .map_or_else(|| "another unit".to_string(), |&(u, _)| name(u)),
                    )));
                }
                open[uid(x)] = true;
                stack.push((x, true));
                deps_of(x, &mut deps, &mut ops);
                for &d in deps.iter().rev() {
                    if !done[uid(d)] {
                        stack.push((d, false));
                    }
                }
            }
        }
        out.bindings.reserve(order.len());
        for &u in &order {
            match u {
                Unit::Single(i) => emit_copy(f, &block.bindings[i], &mut nf, &mut map, &mut out)?,
                Unit::Group(g) => {
                    let o = outline(
                        f,
                        view,
                        groups[g].members(),
                        groups[g].attrs(),
                        opts,
                        naming,
                        &mut nf,
                        &map,
                        m,
                        dedup,
                        &mut pending,
                        &mut cache,
                    )?;
                    let call = nf.add_expr(
                        ExprKind::Call {
                            callee: Callee::Global(o.callee),
                            args: o.args,
                        },
                        o.ret_ty,
                    );
                    let outputs = &cache.outputs;
                    let base = |dataflow: bool| if dataflow { Base::Lv } else { Base::Gv };
                    // The call in the caller stands for every binding of the group: its
                    // var carries all their origins (the output's first), which the shared
                    // function of a deduplicated group cannot.
                    let group_origin = || {
                        Origin::merge(
                            outputs
                                .iter()
                                .chain(groups[g].members())
                                .map(|&v| &f.var(v).origin),
                        )
                    };
                    if let [old] = outputs[..] {
                        let vd = f.var(old);
                        let name = names.fresh(base(vd.dataflow));
                        let nv = nf.add_var_from(
                            name,
                            vd.ty.clone(),
                            vd.dataflow && block.dataflow,
                            group_origin(),
                        );
                        out.bindings.push(Binding {
                            var: nv,
                            value: call,
                        });
                        map.insert(old, nf.var_expr(nv));
                    } else {
                        let tname = names.fresh(Base::Lv);
                        let ty = nf.expr(call).ty.clone();
                        let tv = nf.add_var_from(tname, ty, block.dataflow, group_origin());
                        out.bindings.push(Binding {
                            var: tv,
                            value: call,
                        });
                        let mut by_pos: Vec<(usize, u32, VarId)> = outputs
                            .iter()
                            .enumerate()
                            .map(|(k, &v)| (index.get(v).map_or(0, |i| i as usize), k as u32, v))
                            .collect();
                        by_pos.sort_unstable();
                        for (_, k, old) in by_pos {
                            let vd = f.var(old);
                            let te = nf.var_expr(tv);
                            let get = nf.add_expr(ExprKind::TupleGetItem(te, k), vd.ty.clone());
                            let name = names.fresh(base(vd.dataflow));
                            let nv = nf.add_var_from(
                                name,
                                vd.ty.clone(),
                                vd.dataflow && block.dataflow,
                                vd.origin.clone(),
                            );
                            out.bindings.push(Binding {
                                var: nv,
                                value: get,
                            });
                            map.insert(old, nf.var_expr(nv));
                        }
                    }
                }
            }
        }
        nf.blocks.push(out);
        for b in &block.bindings {
            index.remove(b.var);
        }
    }
    let ret = f
        .ret
        .ok_or_else(|| Error::Invalid("function has no return".into()))?;
    nf.ret = Some(copy_expr(f, ret, &mut nf, &map)?);
    Ok((nf, pending))
}

fn emit_copy(
    f: &Function,
    b: &Binding,
    nf: &mut Function,
    map: &mut ExprMap,
    out: &mut Block,
) -> Result<()> {
    let value = copy_expr(f, b.value, nf, map)?;
    let vd = f.var(b.var);
    let nv = nf.add_var_from(
        vd.name.clone(),
        vd.ty.clone(),
        vd.dataflow,
        vd.origin.clone(),
    );
    out.bindings.push(Binding { var: nv, value });
    map.insert(b.var, nf.var_expr(nv));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse_module_str;

    /// Groups that are not convex (a member reads a binding outside that reads another member)
    /// cannot be ordered: `rewrite` says so instead of looping.
    #[test]
    fn a_group_that_is_not_convex_is_an_error() {
        let m = parse_module_str(
            r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4,), dtype="float32")):
        with R.dataflow():
            a = R.nn.relu(x)
            r = R.exp(a)
            c = R.add(r, a)
            R.output(c)
        return c
"#,
        )
        .unwrap();
        let f = m.get("main").unwrap();
        let var = |n: &str| f.vars.iter().find(|(_, d)| d.name == n).unwrap().0;
        let view = FunctionView::new(f);
        let outline = |members: Vec<VarId>| {
            let groups = vec![(members, FuncAttrs::default())];
            let opts = PartitionOptions::default();
            rewrite(
                f,
                &view,
                &groups,
                opts,
                Naming::Full,
                &m,
                &mut DedupIndex::default(),
            )
        };
        let err = outline(vec![var("a"), var("c")]).unwrap_err().to_string();
        assert!(err.contains("the groups form a cycle"), "{err}");
        assert!(err.contains("`r`"), "{err}");
        // The same group without `c` is convex and outlines.
        let (nf, new) = outline(vec![var("a")]).unwrap();
        assert_eq!(new.len(), 1);
        assert_eq!(nf.bindings().count(), 3);
    }
}
