//! ConvertLayout: every `conv2d` is rewritten to a desired data and kernel layout (TVM Relax's
//! `relax.transform.ConvertLayout({"relax.nn.conv2d": [data, kernel]})`), and the new layout
//! travels through the layout-agnostic ops after it, so that layout changes are left only
//! where a value meets an op that needs the original layout.
//!
//! Contract:
//!
//! - **Requires** a module that verifies; `data` is a layout of `NCHW` and `kernel` one of
//!   `OIHW`: a permutation (`NHWC`, `OHWI`), possibly with an axis split by a sub-axis
//!   (`NCHW16c`, `OIHW16i16o`: [`crate::op::layout`]); else an error naming what was given.
//! - **Rewrites**, in every function without `Primitive`, `Composite` or `Codegen`, block by
//!   block in binding order. A value `v` of rank 4 may be *held*: `v'` with `v` the value
//!   moved back from `v'`'s layout, a [`Layout`] over `v`'s own axes labelled `N`, `C`, `H`,
//!   `W` by position (a permutation such as `NHWC`, or a split one such as `NCHW16c`). Then:
//!   - `y = conv2d(x, w)` (rank-4 operands, layouts not already the desired ones) becomes
//!     `y' = conv2d(x', w')` with `data_layout = out_layout = data` and `kernel_layout =
//!     kernel`, `x'` and `w'` the operands moved to those layouts (a held operand is moved
//!     from where it is held, or used as it is); `y` is held as `y'`. When the data is an
//!     `NCHW` value not held, of fewer channels than a block (3 input channels, `NCHW16c`),
//!     it is read as it is: `y' = conv2d(x, w')` with `data_layout = "NCHW"`,
//!     `out_layout = data` (a CNN's first layer writes the layout, as onnxruntime's `NCHWc`
//!     transformer has it). When another operand's extent does not split (24 output
//!     channels), the conv stays as it is.
//!   - A unary elementwise op (`relu`, `clip`, `astype`, `exp`, ... : FuseOps' `ElemWise`
//!     kind, not `tril`/`triu`) of a held operand is computed on the held value.
//!   - A broadcasting op (`add`, `multiply`, `maximum`, `where`, ...: FuseOps' `Broadcast`
//!     kind, not `broadcast_to`) with a rank-4 result and a held operand is computed in the
//!     held layout: rank-4 operands are moved the same way (a constant folds later), a scalar
//!     stays, and a lower-rank operand first gets leading unit axes (`expand_dims`: what
//!     broadcasting does to it) and is then moved, so a `(C, 1, 1)` bias meets its channels.
//!     An operand that cannot be moved (a `(1, 1, 1, 1)` value into `NCHW16c`) leaves the op
//!     reading the originals; so does an op none of whose held operands has the result's
//!     shape while an operand that does is computed, not a constant (an SE block's `x · s`
//!     of an `NCHW` `x` and a held `(1, C, 1, 1)` `s`: `s` moves back, not `x` in and the
//!     product out).
//!   - `max_pool2d`, `avg_pool2d` and `adaptive_avg_pool2d` of a held operand run with their
//!     `layout` (and `out_layout`) moved likewise (`NCHW16c`).
//!   - `concat((a, b, ...), axis)` of rank-4 parts, one of them held, runs in that layout:
//!     every part moved to it (a held one used as it is) and joined along where the axis
//!     went (`axis=1` of `NCHW` is axis 3 of `NHWC`, axis 1 of `NCHW16c`), when the layout
//!     splits that axis only into whole blocks of every part (DenseNet's channel
//!     concatenations of 32-channel layers in `NCHW16c`; a part of 8 channels leaves the
//!     concatenation reading the originals).
//!   - `y = v` of a held `v` (an alias, as `emit_output` makes): `y` is held as `v` is.
//!   - Anything else that reads a held value reads the original: `v = permute_dims(v', ...)`
//!     (a permutation) or `v = layout_transform(v', index_map)` (a split layout) is bound
//!     (once, under `v`'s own name and type) just before the first such binding. A held var
//!     that is not a dataflow var is bound so right after its held value, so the function's
//!     outputs keep their names, types and layouts (as TVM 0.27 places them).
//! - Every value is the same, element for element, as before (each rule moves elements, never
//!   computes differently), so a backend that runs every layout gives the same results.
//!   Moves of constants are left for FoldConstant; dead bindings are removed afterwards.
//!   (TVM 0.27's own pass crashes on split layouts; the rules above are those it applies to
//!   permutations, with `layout_transform` where a permutation does not do.)
//! - [`convert_layout_within`] converts only the convolutions whose input plane has at most
//!   a given number of pixels (the others stay as they are); [`conv_planes`] lists a module's
//!   planes, largest first.
//! - [`layout_cost`] counts what a conversion left (converted convolutions and their output,
//!   layout changes and what they move), which [`LayoutCost::pays`] and
//!   [`LayoutCost::margin`] weigh for `conv2d_layout = "auto"`.
//!
//! ```text
//! ; before (w a constant (64, 3, 7, 7); b a constant (1, 64, 1, 1))
//! c = R.nn.conv2d(x, w, strides=[2, 2], padding=[3, 3, 3, 3], data_layout="NCHW",
//!         kernel_layout="OIHW", out_layout="NCHW")
//! a = R.add(c, b)
//! r = R.nn.relu(a)
//! gv = R.nn.max_pool2d(r, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1],
//!         layout="NCHW", out_layout="NCHW")
//! ; after ConvertLayout(data="NHWC", kernel="OHWI")
//! x_nhwc = R.permute_dims(x, axes=[0, 2, 3, 1])
//! w_ohwi = R.permute_dims(w, axes=[0, 2, 3, 1])          ; folded by FoldConstant
//! c_nhwc = R.nn.conv2d(x_nhwc, w_ohwi, ..., data_layout="NHWC", kernel_layout="OHWI",
//!         out_layout="NHWC")
//! b_nhwc = R.permute_dims(b, axes=[0, 2, 3, 1])          ; folded by FoldConstant
//! a_nhwc = R.add(c_nhwc, b_nhwc)
//! r_nhwc = R.nn.relu(a_nhwc)
//! gv_nhwc = R.nn.max_pool2d(r_nhwc, ..., layout="NHWC", out_layout="NHWC")
//! gv = R.permute_dims(gv_nhwc, axes=[0, 3, 1, 2])
//! ; after ConvertLayout(data="NCHW16c", kernel="OIHW") of the same with 32 input channels
//! x_nchw16c = R.layout_transform(x, index_map=T.index_map(lambda i0, i1, i2, i3:
//!         (i0, i1 // 16, i2, i3, i1 % 16)), pad_value=None)     ; (1, 2, H, W, 16)
//! c_nchw16c = R.nn.conv2d(x_nchw16c, w, ..., data_layout="NCHW16c", kernel_layout="OIHW",
//!         out_layout="NCHW16c")
//! ...                                                    ; b moved likewise, then folded
//! gv_nchw16c = R.nn.max_pool2d(r_nchw16c, ..., layout="NCHW16c", out_layout="NCHW16c")
//! gv = R.layout_transform(gv_nchw16c, index_map=T.index_map(lambda i0, i1, i2, i3, i4:
//!         (i0, i1 * 16 + i4, i2, i3)), pad_value=None)
//! ; with 3 input channels (an image) the conv reads x as it is
//! c_nchw16c = R.nn.conv2d(x, w, ..., data_layout="NCHW", kernel_layout="OIHW",
//!         out_layout="NCHW16c")
//! ```

use crate::error::{Error, Result};
use crate::ir::{Binding, Block, Callee, ExprId, ExprKind, Function, Module, Type, VarId};
use crate::op::{FusionKind, IndexMap, Layout, MapExpr, Op};
use std::collections::{HashMap, HashSet};

/// The positional labels of a rank-4 value: axis `i` of the value as it was before the pass is
/// labelled `LABELS[i]`, whatever it means. A value is *held* in a [`Layout`] over these labels
/// (`NHWC` for a permuted one, `NCHW16c` with its axis 1 split).
const LABELS: &str = "NCHW";

/// Runs ConvertLayout (see the module doc) for `conv2d` with data layout `data` (a layout of
/// `NCHW`, possibly split: `NCHW16c`) and kernel layout `kernel` (a layout of `OIHW`).
pub fn convert_layout(m: &Module, data: &str, kernel: &str) -> Result<Module> {
    convert_layout_within(m, data, kernel, None)
}

/// [`convert_layout`] of only the `conv2d` bindings whose input plane (the data operand's
/// `H·W`, [`conv_planes`]) has at most `max_plane` pixels when a limit is given; the others
/// stay as they are, as a convolution whose channels do not split does. A convolution whose
/// plane is symbolic stays too under a limit.
pub fn convert_layout_within(
    m: &Module,
    data: &str,
    kernel: &str,
    max_plane: Option<u64>,
) -> Result<Module> {
    let mut parsed = Vec::with_capacity(2);
    for (what, layout, letters) in [("data", data, "NCHW"), ("kernel", kernel, "OIHW")] {
        parsed.push(Layout::parse(layout, letters).ok_or_else(|| {
            Error::Invalid(format!(
                "ConvertLayout: the {what} layout must be a permutation of {letters}, each axis \
                 possibly split by a sub-axis (\"{letters}16{}\"), found `{layout}`",
                letters.as_bytes()[1].to_ascii_lowercase() as char
            ))
        })?);
    }
    let (d, k) = (parsed.remove(0), parsed.remove(0));
    super::substitute::rewrite_entries(m, |f| convert_in(f, &d, &k, max_plane))
}

/// The pixels of the input plane (`H·W`) of a `conv2d` whose data operand `x` is in layout
/// `layout`: `None` when an extent is symbolic or the layout does not describe the operand.
fn input_plane(f: &Function, layout: &str, x: ExprId) -> Option<u64> {
    let dims = f.expr(x).ty.as_tensor()?.dims.as_ref()?;
    let logical = Layout::parse(layout, LABELS)?.logical(dims, LABELS).ok()?;
    let extent = |d: &crate::ir::Dim| d.as_static().and_then(|v| u64::try_from(v).ok());
    extent(&logical[2])?.checked_mul(extent(&logical[3])?)
}

/// The distinct input planes (`H·W` pixels, static ones) of the `conv2d` bindings of `m`,
/// largest first: the limits worth trying with [`convert_layout_within`].
pub fn conv_planes(m: &Module) -> Vec<u64> {
    let mut planes = std::collections::BTreeSet::new();
    for f in m.functions.values() {
        let mut all = Vec::new();
        crate::ir::for_each_binding_deep(f, &f.blocks, &mut |b| all.push(*b));
        for b in all {
            if let ExprKind::Call {
                callee: Callee::Op(Op::Conv2d(a)),
                args,
            } = &f.expr(b.value).kind
                && let Some(p) = args
                    .first()
                    .and_then(|&x| input_plane(f, &a.data_layout, x))
            {
                planes.insert(p);
            }
        }
    }
    planes.into_iter().rev().collect()
}

/// The layout `target` of a value whose axes are, before the pass, in layout `original` (a
/// permutation of `target`'s letters), written over the value's positional [`LABELS`]:
/// `relabel(NHWC, NCHW)` is `NHWC`, `relabel(NCHW16c, NHWC)` is `NWCH16w`.
fn relabel(target: &Layout, original: &str) -> Option<Layout> {
    let orig = original.as_bytes();
    if orig.len() != 4 {
        return None;
    }
    let mut s = String::new();
    for a in target.axes() {
        let pos = orig.iter().position(|&c| c == a.letter)?;
        let label = LABELS.as_bytes()[pos] as char;
        match a.factor {
            None => s.push(label),
            Some(k) => s.push_str(&format!("{k}{}", label.to_ascii_lowercase())),
        }
    }
    Layout::parse(&s, LABELS)
}

/// The layout string of an op attribute that was `original` (a permutation of `NCHW`, over the
/// operand's positions) once the operand is held in `held` (over positional labels): each label
/// replaced by the letter `original` has at its position.
fn unlabel(held: &Layout, original: &str) -> Option<String> {
    let orig = original.as_bytes();
    if orig.len() != 4 {
        return None;
    }
    let mut s = String::new();
    for a in held.axes() {
        let pos = LABELS.bytes().position(|c| c == a.letter)?;
        let letter = *orig.get(pos)? as char;
        match a.factor {
            None => s.push(letter),
            Some(k) => s.push_str(&format!("{k}{}", letter.to_ascii_lowercase())),
        }
    }
    Some(s)
}

/// The plain layout (the value as it was).
fn plain() -> Layout {
    Layout::parse(LABELS, LABELS).unwrap_or_else(|| unreachable!("NCHW is a layout"))
}

/// The permutation `map` is, when it only permutes axes (`permute_dims(x, axes)`).
fn as_axes(map: &IndexMap) -> Option<Vec<i64>> {
    if map.outputs.len() != map.inputs {
        return None;
    }
    map.outputs
        .iter()
        .map(|e| match *e {
            MapExpr::Var(i) => i64::try_from(i).ok(),
            _ => None,
        })
        .collect()
}

/// The op that moves a value by `map`: `permute_dims` when it only permutes axes, else
/// `layout_transform`.
fn move_op(map: IndexMap) -> Op {
    match as_axes(&map) {
        Some(axes) => Op::PermuteDims { axes: Some(axes) },
        None => Op::LayoutTransform(Box::new(map)),
    }
}

fn rank_of(f: &Function, e: ExprId) -> Option<usize> {
    f.expr(e).ty.as_tensor()?.rank()
}

/// The rewrite of one function (see the module doc); says whether anything changed.
struct Converter<'a> {
    data: &'a Layout,
    kernel: &'a Layout,
    /// Only convolutions of input planes up to this many pixels convert (all when `None`).
    max_plane: Option<u64>,
    /// Held values: the var, the var holding it, and the layout it is held in.
    held: HashMap<VarId, (VarId, Layout)>,
    /// Held vars whose original is bound (again).
    bound: HashSet<VarId>,
    /// Operands made in the current block: (operand, layout) → var.
    made: HashMap<(ExprId, Layout), VarId>,
    /// The bindings of the current block, as rewritten so far.
    out: Vec<Binding>,
    /// Every var name of the function (new vars get names not in it).
    names: HashSet<String>,
    dataflow: bool,
    changed: bool,
}

impl Converter<'_> {
    /// A new var named after `base` with `suffix`, typed `ty`, bound to `value` in the block.
    fn bind_new(
        &mut self,
        f: &mut Function,
        base: VarId,
        suffix: &str,
        value: ExprId,
        ty: Type,
    ) -> VarId {
        let name = self.fresh(&format!("{}_{suffix}", f.var(base).name));
        let origin = f.var(base).origin.clone();
        let v = f.add_var_from(name, ty, self.dataflow, origin);
        self.out.push(Binding { var: v, value });
        v
    }

    /// `base`, or `base` with a number, not yet a var name of the function (then taken).
    fn fresh(&mut self, base: &str) -> String {
        let name = super::outline::unique_name(base, &|n| self.names.contains(n));
        self.names.insert(name.clone());
        name
    }

    /// `e` moved by `map`: `permute_dims(e, axes)` when it only permutes axes, else
    /// `layout_transform(e, index_map)`, typed by inference (`None` where that fails, e.g. an
    /// extent that does not split).
    fn transform(f: &mut Function, e: ExprId, map: IndexMap) -> Option<ExprId> {
        let op = move_op(map);
        let ty = op.infer(&[&f.expr(e).ty]).ok()?;
        Some(f.add_expr(
            ExprKind::Call {
                callee: Callee::Op(op),
                args: vec![e],
            },
            ty,
        ))
    }

    /// Operand `e` (rank 4) in layout `want` (over its positional labels): the held var as it
    /// is, or one transform of it or of `e` (made once per block).
    fn operand(
        &mut self,
        f: &mut Function,
        e: ExprId,
        want: &Layout,
        suffix: &str,
    ) -> Option<ExprId> {
        let (src, from) = match f.as_var(e).and_then(|v| self.held.get(&v).cloned()) {
            Some((h, l)) => (f.var(h).expr, l),
            None => (e, plain()),
        };
        if from == *want {
            return Some(src);
        }
        if let Some(&v) = self.made.get(&(src, want.clone())) {
            return Some(f.var(v).expr);
        }
        let map = IndexMap::between(&from, want).ok()?;
        let value = Self::transform(f, src, map)?;
        let ty = f.expr(value).ty.clone();
        let base = f.as_var(e).or_else(|| f.as_var(src));
        let v = match base {
            Some(b) => self.bind_new(f, b, suffix, value, ty),
            None => {
                // A constant operand: named after nothing in particular.
                let name = self.fresh(&format!("const_{suffix}"));
                let v = f.add_var(name, ty, self.dataflow);
                self.out.push(Binding { var: v, value });
                v
            }
        };
        self.made.insert((src, want.clone()), v);
        Some(f.var(v).expr)
    }

    /// Binds the original of held var `v` (`v = permute_dims(v', ...)` or
    /// `layout_transform(v', ...)`) unless it is.
    fn restore(&mut self, f: &mut Function, v: VarId) {
        let Some((h, l)) = self.held.get(&v).cloned() else {
            return;
        };
        if !self.bound.insert(v) {
            return;
        }
        let Ok(map) = IndexMap::between(&l, &plain()) else {
            return;
        };
        let op = move_op(map);
        let value = f.add_expr(
            ExprKind::Call {
                callee: Callee::Op(op),
                args: vec![f.var(h).expr],
            },
            f.var(v).ty.clone(),
        );
        self.out.push(Binding { var: v, value });
    }

    /// The layout a held var operand of `args` has (the first one).
    fn held_layout(&self, f: &Function, args: &[ExprId]) -> Option<Layout> {
        args.iter().find_map(|&a| {
            f.as_var(a)
                .and_then(|v| self.held.get(&v))
                .map(|(_, l)| l.clone())
        })
    }

    /// Whether a broadcasting op writing `y` holds none of its result-sized operands (those of
    /// `y`'s own shape) but reads one that is not a constant: an SE block's `x * s` of an
    /// `NCHW` `x` and a `(1, C, 1, 1)` `s` held in the layout. Moving `x` into the layout (and
    /// the product back) would move as many elements as the op writes, twice; reading the
    /// originals moves only `s`.
    fn only_small_held(&self, f: &Function, y: VarId, args: &[ExprId]) -> bool {
        let Some(out) = f.var(y).ty.as_tensor().and_then(|t| t.dims.clone()) else {
            return false;
        };
        let full = |a: ExprId| {
            f.expr(a)
                .ty
                .as_tensor()
                .and_then(|t| t.dims.as_ref())
                .is_some_and(|d| *d == out)
        };
        let held = |a: ExprId| f.as_var(a).is_some_and(|v| self.held.contains_key(&v));
        let computed =
            |a: ExprId| !matches!(f.expr(a).kind, ExprKind::Const(_) | ExprKind::ConstRef(_));
        !args.iter().any(|&a| full(a) && held(a)) && args.iter().any(|&a| full(a) && computed(a))
    }

    /// Rewrites binding `b` if a rule applies: the new value's var held for `b.var`.
    fn rewrite(&mut self, f: &mut Function, b: Binding) -> Option<()> {
        // `y = v` of a held `v`: `y` is held as `v` is (no binding; restored where needed).
        if let ExprKind::Var(v) = f.expr(b.value).kind
            && let Some(h) = self.held.get(&v).cloned()
        {
            self.held.insert(b.var, h);
            self.changed = true;
            return Some(());
        }
        let ExprKind::Call {
            callee: Callee::Op(op),
            args,
        } = f.expr(b.value).kind.clone()
        else {
            return None;
        };
        let data = self.data.to_string();
        let suffix = data.to_lowercase();
        let (new_op, new_args, layout) = match &op {
            Op::Conv2d(a) => {
                let (&x, &w) = (args.first()?, args.get(1)?);
                if rank_of(f, x)? != 4 || rank_of(f, w)? != 4 {
                    return None;
                }
                let kernel = self.kernel.to_string();
                if a.data_layout == data && a.kernel_layout == kernel && a.out_layout == data {
                    return None;
                }
                if let Some(limit) = self.max_plane
                    && input_plane(f, &a.data_layout, x).is_none_or(|p| p > limit)
                {
                    return None;
                }
                let lx = relabel(self.data, &a.data_layout)?;
                let lw = relabel(self.kernel, &a.kernel_layout)?;
                let lo = relabel(self.data, &a.out_layout)?;
                // An `NCHW` image of fewer channels than a block of the layout (a first
                // layer's 3) is read as it is, the output still written in the layout.
                let held_x = f.as_var(x).is_some_and(|v| self.held.contains_key(&v));
                let few = |f: &Function| -> Option<bool> {
                    let c = f
                        .expr(x)
                        .ty
                        .as_tensor()?
                        .dims
                        .as_ref()?
                        .get(1)?
                        .as_static()?;
                    let (_, factor) = lx.sub(b'C')?;
                    Some(c < factor)
                };
                if a.data_layout == LABELS
                    && a.kernel_layout == kernel
                    && a.out_layout == data
                    && few(f) == Some(true)
                {
                    // Such a conv already in the layout (converted before).
                    return None;
                }
                let (x2, data_layout) = match self.operand(f, x, &lx, &suffix) {
                    Some(x2) => (x2, data.clone()),
                    None if a.data_layout == LABELS && !held_x && few(f) == Some(true) => {
                        (x, a.data_layout.clone())
                    }
                    None => return None,
                };
                let w2 = self.operand(f, w, &lw, &kernel.to_lowercase())?;
                let mut a2 = (**a).clone();
                a2.data_layout = data_layout;
                a2.kernel_layout = kernel;
                a2.out_layout = data;
                let mut rest = vec![x2, w2];
                rest.extend_from_slice(&args[2..]);
                (Op::Conv2d(Box::new(a2)), rest, lo)
            }
            Op::MaxPool2d(_) | Op::AvgPool2d(_) | Op::AdaptiveAvgPool2d(_) => {
                let x = *args.first()?;
                let (h, l) = self.held.get(&f.as_var(x)?)?.clone();
                let mut new_op = op.clone();
                let (layout, out_layout) = match &mut new_op {
                    Op::MaxPool2d(a) | Op::AvgPool2d(a) => (&mut a.layout, &mut a.out_layout),
                    Op::AdaptiveAvgPool2d(a) => (&mut a.layout, &mut a.out_layout),
                    _ => return None,
                };
                *layout = unlabel(&l, layout)?;
                *out_layout = unlabel(&l, out_layout)?;
                let mut rest = vec![f.var(h).expr];
                rest.extend_from_slice(&args[1..]);
                (new_op, rest, l)
            }
            Op::Concat { axis: Some(axis) } => {
                // Rank-4 parts, one of them held: all moved into its layout and joined along
                // where the axis went, when a split of that axis keeps every part's blocks
                // whole (DenseNet's channel concatenations in `NCHW16c`).
                if f.var(b.var).ty.as_tensor()?.rank()? != 4 {
                    return None;
                }
                let ExprKind::Tuple(fields) = f.expr(*args.first()?).kind.clone() else {
                    return None;
                };
                let l = self.held_layout(f, &fields)?;
                let ax = usize::try_from(if *axis < 0 { axis + 4 } else { *axis })
                    .ok()
                    .filter(|&a| a < 4)?;
                let label = LABELS.as_bytes()[ax];
                let pos = l.primal(label)?;
                let factor = l.sub(label).map(|(_, k)| k);
                for &e in &fields {
                    if rank_of(f, e)? != 4 {
                        return None;
                    }
                    if let Some(k) = factor {
                        let d = f
                            .expr(e)
                            .ty
                            .as_tensor()?
                            .dims
                            .as_ref()?
                            .get(ax)?
                            .as_static()?;
                        if k <= 0 || d % k != 0 {
                            return None;
                        }
                    }
                }
                let mut moved = Vec::with_capacity(fields.len());
                for &e in &fields {
                    moved.push(self.operand(f, e, &l, &suffix)?);
                }
                let tys = moved.iter().map(|&e| f.expr(e).ty.clone()).collect();
                let tuple = f.add_expr(ExprKind::Tuple(moved), Type::Tuple(tys));
                let axis = Some(i64::try_from(pos).ok()?);
                (Op::Concat { axis }, vec![tuple], l)
            }
            _ if op.fusion_kind() == FusionKind::ElemWise
                && !matches!(op, Op::Tril { .. } | Op::Triu { .. }) =>
            {
                let x = *args.first()?;
                let (h, l) = self.held.get(&f.as_var(x)?)?.clone();
                let mut rest = vec![f.var(h).expr];
                rest.extend_from_slice(&args[1..]);
                (op.clone(), rest, l)
            }
            _ if op.fusion_kind() == FusionKind::Broadcast && !matches!(op, Op::BroadcastTo) => {
                if f.var(b.var).ty.as_tensor()?.rank()? != 4 {
                    return None;
                }
                let l = self.held_layout(f, &args)?;
                if self.only_small_held(f, b.var, &args) {
                    return None;
                }
                let mut rest = Vec::with_capacity(args.len());
                for &a in &args {
                    let r = rank_of(f, a)?;
                    let e = match r {
                        0 => a,
                        4 => self.operand(f, a, &l, &suffix)?,
                        1..=3 => {
                            // Leading unit axes first (what broadcasting gives it), then the
                            // held layout.
                            let op = Op::ExpandDims {
                                axis: (0..(4 - r) as i64).collect(),
                            };
                            let ty = op.infer(&[&f.expr(a).ty]).ok()?;
                            let value = f.add_expr(
                                ExprKind::Call {
                                    callee: Callee::Op(op),
                                    args: vec![a],
                                },
                                ty.clone(),
                            );
                            let base = f.as_var(a).unwrap_or(b.var);
                            let v = self.bind_new(f, base, "4d", value, ty);
                            let e4 = f.var(v).expr;
                            self.operand(f, e4, &l, &suffix)?
                        }
                        _ => return None,
                    };
                    rest.push(e);
                }
                (op.clone(), rest, l)
            }
            _ => return None,
        };
        let arg_tys: Vec<Type> = new_args.iter().map(|&a| f.expr(a).ty.clone()).collect();
        let tys: Vec<&Type> = arg_tys.iter().collect();
        let ty = new_op.infer(&tys).ok()?;
        let value = f.add_expr(
            ExprKind::Call {
                callee: Callee::Op(new_op),
                args: new_args,
            },
            ty.clone(),
        );
        let v = self.bind_new(f, b.var, &suffix, value, ty);
        self.held.insert(b.var, (v, layout));
        self.changed = true;
        Some(())
    }
}

/// What ConvertLayout into data layout `data` left in a module (after FoldConstant), counted
/// over every function's bindings: what [`LayoutCost::pays`] weighs when the backends choose
/// the layout (`conv2d_layout = "auto"`). Elements are counted with symbolic extents as 1
/// (the same on both sides of the comparison: per image for a symbolic batch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayoutCost {
    /// Every `conv2d` binding.
    pub convs: usize,
    /// The one-group `conv2d` bindings that write `data` (from `data`, or from an `NCHW`
    /// image whose channels do not split).
    pub converted: usize,
    /// Their output elements.
    pub conv_elems: u64,
    /// The output elements of the depthwise convolutions in `data`: the layout's backend runs
    /// them in place, as `cpu` does, and they gain from it too (`cpu`'s `NCHW16c` depthwise
    /// kernel took 0.73–0.87 of the `NCHW` one's time on three of MobileNetV2's four shapes of
    /// 28 × 28 to 7 × 7 planes, 1.01 on the fourth, bench/RESULTS.md session be), so they count
    /// with `conv_elems` in [`LayoutCost::margin`], though not as converted. A kernel of more
    /// than 3×3 taps counts each element `KH·KW / 9` times: its work per element grows with
    /// the taps, a move's does not (MobileNetV3-Large's 7×7 stage of 5×5 layers, counted so,
    /// converts: 0.956 of the model's time, bench/RESULTS.md session cc).
    pub depthwise_elems: u64,
    /// The `layout_transform` and `permute_dims` bindings of rank-4-or-5 values (the layout
    /// changes left at run time), plus the grouped convolutions in `data` other than
    /// depthwise ones, which a backend without a blocked grouped kernel runs by moving their
    /// input and output.
    pub moves: usize,
    /// The elements those move.
    pub moved_elems: u64,
}

impl LayoutCost {
    /// Whether the conversion pays, `self` counted after it and `before` on the module it
    /// converted: some convolution converted, and the layout changes it added move at most
    /// an eighth of the elements the convolutions in the layout write ([`LayoutCost::margin`]
    /// at least zero: a move costs a pass over memory; a convolution's output element takes
    /// 2·C·k·k operations, so a kernel a tenth faster in the new layout wins by far more).
    pub fn pays(&self, before: &LayoutCost) -> bool {
        self.converted > before.converted && self.margin(before) >= 0
    }

    /// What the conversion gains by [`LayoutCost::pays`]'s measure: the elements the
    /// convolutions in the layout write (`conv_elems` and `depthwise_elems`) less eight
    /// times those the layout changes it added move. Of the conversions that pay,
    /// `conv2d_layout = "auto"` keeps the one of the largest margin.
    pub fn margin(&self, before: &LayoutCost) -> i128 {
        let added = self.moved_elems.saturating_sub(before.moved_elems);
        i128::from(self.conv_elems) + i128::from(self.depthwise_elems) - 8 * i128::from(added)
    }
}

/// Counts [`LayoutCost`] of `m` for data layout `data` (`NCHW16c`).
pub fn layout_cost(m: &Module, data: &str) -> LayoutCost {
    layout_cost_of(m, &[data])
}

/// [`layout_cost`] for convolutions in any of the data layouts `data` (`NCHW16c` where the
/// channels split by 16, `NCHW8c` for the rest: two ConvertLayout passes).
pub fn layout_cost_of(m: &Module, data: &[&str]) -> LayoutCost {
    let elems = |ty: &Type| -> u64 {
        ty.as_tensor()
            .and_then(|t| t.dims.as_ref())
            .map_or(1, |dims| {
                dims.iter()
                    .filter_map(crate::ir::Dim::as_static)
                    .fold(1u64, |acc, v| acc.saturating_mul(v.max(0) as u64))
            })
    };
    let mut c = LayoutCost::default();
    for f in m.functions.values() {
        let mut all = Vec::new();
        crate::ir::for_each_binding_deep(f, &f.blocks, &mut |b| all.push(*b));
        for b in all {
            let ExprKind::Call {
                callee: Callee::Op(op),
                args,
            } = &f.expr(b.value).kind
            else {
                continue;
            };
            let out = elems(&f.var(b.var).ty);
            match op {
                Op::Conv2d(a) => {
                    c.convs += 1;
                    if !data.contains(&a.out_layout.as_str()) {
                        continue;
                    }
                    if a.groups == 1 {
                        c.converted += 1;
                        c.conv_elems = c.conv_elems.saturating_add(out);
                    } else if is_depthwise(f, args, &a.kernel_layout, a.groups) {
                        let taps = kernel_taps(f, args, &a.kernel_layout).unwrap_or(9);
                        let w = out.saturating_mul(taps.max(9)) / 9;
                        c.depthwise_elems = c.depthwise_elems.saturating_add(w);
                    } else {
                        let input = args.first().map_or(0, |&x| elems(&f.expr(x).ty));
                        c.moves += 1;
                        c.moved_elems = c.moved_elems.saturating_add(out).saturating_add(input);
                    }
                }
                Op::LayoutTransform(_) | Op::PermuteDims { .. }
                    if matches!(rank_of(f, b.value), Some(4 | 5)) =>
                {
                    c.moves += 1;
                    c.moved_elems = c.moved_elems.saturating_add(out);
                }
                _ => {}
            }
        }
    }
    c
}

/// The static extent of axis `letter` (`O`, `I`, `H` or `W`) of a `conv2d`'s weight (its
/// second argument) in `kernel_layout`, a permutation of `OIHW`.
fn kernel_dim(f: &Function, args: &[ExprId], kernel_layout: &str, letter: char) -> Option<i64> {
    if kernel_layout.len() != 4 {
        return None;
    }
    let dims = args
        .get(1)
        .and_then(|&w| f.expr(w).ty.as_tensor())?
        .dims
        .as_ref()?;
    dims.get(kernel_layout.chars().position(|c| c == letter)?)?
        .as_static()
}

/// The taps (`KH·KW`) of a `conv2d`'s static weight in `kernel_layout`.
fn kernel_taps(f: &Function, args: &[ExprId], kernel_layout: &str) -> Option<u64> {
    let at = |letter| u64::try_from(kernel_dim(f, args, kernel_layout, letter)?).ok();
    at('H')?.checked_mul(at('W')?)
}

/// Whether a `conv2d` of `groups` groups with arguments `args` is depthwise: its weight
/// (in `kernel_layout`, a permutation of `OIHW`) has one input channel per group and `groups`
/// output channels.
fn is_depthwise(f: &Function, args: &[ExprId], kernel_layout: &str, groups: i64) -> bool {
    let at = |letter| kernel_dim(f, args, kernel_layout, letter);
    at('I') == Some(1) && at('O') == Some(groups)
}

/// Rewrites `f` (see the module doc); says whether anything changed.
fn convert_in(f: &mut Function, data: &Layout, kernel: &Layout, max_plane: Option<u64>) -> bool {
    let blocks = std::mem::take(&mut f.blocks);
    let mut c = Converter {
        data,
        kernel,
        max_plane,
        held: HashMap::new(),
        bound: HashSet::new(),
        made: HashMap::new(),
        out: Vec::new(),
        names: f.vars.iter().map(|(_, v)| v.name.clone()).collect(),
        dataflow: false,
        changed: false,
    };
    for block in blocks {
        c.dataflow = block.dataflow;
        c.made.clear();
        for b in &block.bindings {
            // A rule that fails half way leaves only unused bindings behind (removed as dead
            // code) and falls back to the binding as it is.
            if c.rewrite(f, *b).is_some() {
                // A var visible after the block is bound in its original layout right away.
                if !f.var(b.var).dataflow {
                    c.restore(f, b.var);
                }
                continue;
            }
            let mut reads = Vec::new();
            crate::ir::for_each_use(f, b.value, &mut |v| reads.push(v));
            for v in reads {
                c.restore(f, v);
            }
            c.out.push(*b);
        }
        for b in &block.bindings {
            if !f.var(b.var).dataflow {
                c.restore(f, b.var);
            }
        }
        f.blocks.push(Block {
            dataflow: block.dataflow,
            bindings: std::mem::take(&mut c.out),
        });
        // A dataflow var does not outlive its block: later blocks read the originals (bound
        // again above for every var that outlives it).
        c.held.retain(|_, (h, _)| !f.var(*h).dataflow);
    }
    c.changed
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::text::{parse_module_str, print_module};

    #[test]
    fn a_conversion_pays_when_its_moves_are_an_eighth_of_the_converted_output_or_less() {
        let before = LayoutCost {
            convs: 3,
            moves: 1,
            moved_elems: 100,
            ..LayoutCost::default()
        };
        let after = |converted, conv_elems, moved_elems| LayoutCost {
            convs: 3,
            converted,
            conv_elems,
            moves: 3,
            moved_elems,
            ..LayoutCost::default()
        };
        // 800 elements written, 100 moved beyond the original's: pays; 101: does not.
        assert!(after(2, 800, 200).pays(&before));
        assert_eq!(after(2, 800, 200).margin(&before), 0);
        assert!(!after(2, 800, 201).pays(&before));
        assert_eq!(after(2, 800, 201).margin(&before), -8);
        // A depthwise convolution's output counts with the others'.
        let with_depthwise = LayoutCost {
            depthwise_elems: 8,
            ..after(2, 800, 201)
        };
        assert!(with_depthwise.pays(&before));
        assert_eq!(with_depthwise.margin(&before), 0);
        // Nothing converted: never pays, however cheap.
        assert!(!after(0, 0, 100).pays(&before));
        assert!(
            !LayoutCost {
                depthwise_elems: 800,
                ..after(0, 0, 100)
            }
            .pays(&before)
        );
        assert!(!before.pays(&before));
    }

    #[test]
    fn depthwise_convolutions_in_the_layout_count_as_gains_but_not_as_converted() {
        // In NCHW16c: a one-group conv (converted), a depthwise one (its output a gain) and
        // one of two groups (a move of its input and output).
        let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
        let conv = |x: &str, w: &str, g: usize| {
            format!(
                "R.nn.conv2d({x}, {w}, padding=[1, 1, 1, 1], groups={g}, data_layout=\"NCHW16c\", out_layout=\"NCHW16c\")"
            )
        };
        let src = format!(
            "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: {x}, w1: {w1}, w2: {w2}, w3: {w3}) -> {x}:\n        with R.dataflow():\n            a: {x} = {c1}\n            b: {x} = {c2}\n            gv: {x} = {c3}\n            R.output(gv)\n        return gv\n",
            x = t("1, 2, 8, 8, 16"),
            w1 = t("32, 32, 3, 3"),
            w2 = t("32, 1, 3, 3"),
            w3 = t("32, 16, 3, 3"),
            c1 = conv("x", "w1", 1),
            c2 = conv("a", "w2", 32),
            c3 = conv("b", "w3", 2),
        );
        let m = parse_module_str(&src).unwrap_or_else(|e| panic!("{e}"));
        let c = layout_cost(&m, "NCHW16c");
        let plane = 2 * 8 * 8 * 16;
        assert_eq!(
            c,
            LayoutCost {
                convs: 3,
                converted: 1,
                conv_elems: plane,
                depthwise_elems: plane,
                moves: 1,
                moved_elems: 2 * plane,
            }
        );
        assert_eq!(
            c.margin(&LayoutCost::default()),
            2 * i128::from(plane) - 16 * i128::from(plane)
        );
        // A 5×5 depthwise layer counts its output 25/9 times (its 25 taps against a 3×3's 9);
        // a 1×1 one no less than a 3×3's.
        let five = src
            .replace("w2: R.Tensor((32, 1, 3, 3)", "w2: R.Tensor((32, 1, 5, 5)")
            .replace(
                "(a, w2, padding=[1, 1, 1, 1]",
                "(a, w2, padding=[2, 2, 2, 2]",
            );
        let m = parse_module_str(&five).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(layout_cost(&m, "NCHW16c").depthwise_elems, plane * 25 / 9);
        let one = src
            .replace("w2: R.Tensor((32, 1, 3, 3)", "w2: R.Tensor((32, 1, 1, 1)")
            .replace(
                "(a, w2, padding=[1, 1, 1, 1]",
                "(a, w2, padding=[0, 0, 0, 0]",
            );
        let m = parse_module_str(&one).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(layout_cost(&m, "NCHW16c").depthwise_elems, plane);
    }

    #[test]
    fn a_plane_limit_leaves_larger_and_symbolic_planes_as_they_are() {
        let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
        let src = format!(
            "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: {x}, y: {y}, w: {w}):\n        with R.dataflow():\n            a = R.nn.conv2d(x, w, strides=[2, 2])\n            b = R.nn.conv2d(a, w)\n            c = R.nn.conv2d(y, w)\n            gv = (b, c)\n            R.output(gv)\n        return gv\n",
            x = t("1, 16, 8, 8"),
            y = t("1, 16, \"h\", 4"),
            w = t("16, 16, 1, 1"),
        );
        let m = parse_module_str(&src).unwrap_or_else(|e| panic!("{e}"));
        // `a` reads 8 × 8, `b` 4 × 4; `c`'s plane is symbolic.
        assert_eq!(conv_planes(&m), vec![64, 16]);
        let converted = |limit| {
            let out = convert_layout_within(&m, "NCHW16c", "OIHW", limit)
                .unwrap_or_else(|e| panic!("{e}"));
            crate::ir::verify::verify(&out)
                .unwrap_or_else(|e| panic!("{e:?}\n{}", print_module(&out).text));
            print_module(&out)
                .text
                .matches("data_layout=\"NCHW16c\"")
                .count()
        };
        assert_eq!(converted(None), 3);
        assert_eq!(converted(Some(64)), 2);
        assert_eq!(converted(Some(16)), 1);
        assert_eq!(converted(Some(15)), 0);
    }

    fn run(src: &str, data: &str, kernel: &str) -> String {
        let m = parse_module_str(src).unwrap_or_else(|e| panic!("{e}"));
        let out = convert_layout(&m, data, kernel).unwrap_or_else(|e| panic!("{e}"));
        crate::ir::verify::verify(&out)
            .unwrap_or_else(|e| panic!("{e:?}\n{}", print_module(&out).text));
        print_module(&out).text
    }

    #[test]
    fn layouts_relabel_to_positions_and_back() {
        let l = |s: &str, a: &str| Layout::parse(s, a).unwrap();
        let nchw16c = l("NCHW16c", "NCHW");
        assert_eq!(relabel(&nchw16c, "NCHW").unwrap().to_string(), "NCHW16c");
        // An NHWC original: its channel axis is position 3 (label W).
        assert_eq!(relabel(&nchw16c, "NHWC").unwrap().to_string(), "NWCH16w");
        assert_eq!(
            relabel(&l("OHWI", "OIHW"), "OIHW").unwrap().to_string(),
            "NHWC"
        );
        assert_eq!(unlabel(&l("NHWC", "NCHW"), "NCHW").unwrap(), "NHWC");
        assert_eq!(unlabel(&l("NWCH16w", "NCHW"), "NHWC").unwrap(), "NCHW16c");
        assert_eq!(
            as_axes(&IndexMap::between(&plain(), &l("NHWC", "NCHW")).unwrap()),
            Some(vec![0, 2, 3, 1])
        );
        assert_eq!(
            as_axes(&IndexMap::between(&plain(), &nchw16c).unwrap()),
            None
        );
    }

    #[test]
    fn a_layout_that_is_not_a_permutation_is_an_error() {
        let m = parse_module_str(CHAIN).unwrap_or_else(|e| panic!("{e}"));
        let e = convert_layout(&m, "NHWX", "OHWI").unwrap_err().to_string();
        assert!(
            e.contains("permutation of NCHW") && e.contains("NHWX"),
            "{e}"
        );
        let e = convert_layout(&m, "NCHW16", "OIHW")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sub-axis"), "{e}");
        let e = convert_layout(&m, "NHWC", "OIH").unwrap_err().to_string();
        assert!(e.contains("permutation of OIHW"), "{e}");
    }

    const CHAIN: &str = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), dtype="float32"), w: R.Tensor((4, 3, 3, 3), dtype="float32"), b: R.Tensor((1, 4, 1, 1), dtype="float32"), c: R.Tensor((4, 1, 1), dtype="float32")) -> R.Tensor((1, 4, 1, 1), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((1, 4, 8, 8), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            lv1: R.Tensor((1, 4, 8, 8), dtype="float32") = R.add(lv, b)
            lv2: R.Tensor((1, 4, 8, 8), dtype="float32") = R.multiply(c, lv1)
            lv3: R.Tensor((1, 4, 8, 8), dtype="float32") = R.clip(lv2, R.prim_value(0), R.prim_value(6))
            lv4: R.Tensor((1, 4, 8, 8), dtype="float32") = R.add(lv3, lv)
            gv: R.Tensor((1, 4, 1, 1), dtype="float32") = R.nn.adaptive_avg_pool2d(lv4, output_size=[1, 1], layout="NCHW", out_layout="NCHW")
            R.output(gv)
        return gv
"#;

    #[test]
    fn the_layout_travels_through_elementwise_ops_and_pools_to_one_permute_back() {
        let out = run(CHAIN, "NHWC", "OHWI");
        let expect = [
            "x_nhwc: R.Tensor((1, 8, 8, 3), dtype=\"float32\") = R.permute_dims(x, axes=[0, 2, 3, 1])",
            "w_ohwi: R.Tensor((4, 3, 3, 3), dtype=\"float32\") = R.permute_dims(w, axes=[0, 2, 3, 1])",
            "data_layout=\"NHWC\", kernel_layout=\"OHWI\", out_layout=\"NHWC\"",
            "b_nhwc: R.Tensor((1, 1, 1, 4), dtype=\"float32\") = R.permute_dims(b, axes=[0, 2, 3, 1])",
            "c_4d: R.Tensor((1, 4, 1, 1), dtype=\"float32\") = R.expand_dims(c, axis=[0])",
            "lv4_nhwc: R.Tensor((1, 8, 8, 4), dtype=\"float32\") = R.add(lv3_nhwc, lv_nhwc)",
            "layout=\"NHWC\", out_layout=\"NHWC\"",
            "gv: R.Tensor((1, 4, 1, 1), dtype=\"float32\") = R.permute_dims(gv_nhwc, axes=[0, 3, 1, 2])",
        ];
        for e in expect {
            assert!(out.contains(e), "missing `{e}` in\n{out}");
        }
        // One permute back (the output), none in the middle.
        assert_eq!(out.matches("axes=[0, 3, 1, 2]").count(), 1, "{out}");
    }

    #[test]
    fn an_op_that_needs_the_original_layout_gets_it_back_once() {
        // Two reshapes read `lv1`; the output (a reshape back) is in the original layout.
        let src = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), dtype="float32"), w: R.Tensor((4, 3, 3, 3), dtype="float32")) -> R.Tensor((1, 4, 8, 8), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((1, 4, 8, 8), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            lv1: R.Tensor((1, 4, 8, 8), dtype="float32") = R.nn.relu(lv)
            lv2: R.Tensor((1, 256), dtype="float32") = R.reshape(lv1, R.shape([1, 256]))
            lv3: R.Tensor((1, 256), dtype="float32") = R.reshape(lv1, R.shape([1, 256]))
            lv4: R.Tensor((1, 256), dtype="float32") = R.add(lv2, lv3)
            gv: R.Tensor((1, 4, 8, 8), dtype="float32") = R.reshape(lv4, R.shape([1, 4, 8, 8]))
            R.output(gv)
        return gv
"#;
        let out = run(src, "NHWC", "OHWI");
        assert!(
            out.contains("lv1: R.Tensor((1, 4, 8, 8), dtype=\"float32\") = R.permute_dims(lv1_nhwc, axes=[0, 3, 1, 2])"),
            "{out}"
        );
        assert_eq!(out.matches("R.permute_dims(lv1_nhwc").count(), 1, "{out}");
        assert!(out.contains("R.reshape(lv1, R.shape([1, 256]))"), "{out}");
        assert!(
            out.contains("lv4: R.Tensor((1, 256), dtype=\"float32\") = R.add(lv2, lv3)"),
            "{out}"
        );
    }

    #[test]
    fn a_later_block_reads_the_original_of_a_value_held_in_a_dataflow_var() {
        let src = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), dtype="float32"), w: R.Tensor((3, 3, 3, 3), dtype="float32")) -> R.Tensor((1, 3, 8, 8), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((1, 3, 8, 8), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            gv: R.Tensor((1, 3, 8, 8), dtype="float32") = R.nn.relu(lv)
            R.output(gv)
        with R.dataflow():
            lv1: R.Tensor((1, 3, 8, 8), dtype="float32") = R.nn.conv2d(gv, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            gv1: R.Tensor((1, 3, 8, 8), dtype="float32") = R.add(lv1, gv)
            R.output(gv1)
        return gv1
"#;
        // `run` verifies: no dataflow var of the first block is read in the second.
        let out = run(src, "NHWC", "OHWI");
        assert!(
            out.contains("gv_nhwc1: R.Tensor((1, 8, 8, 3), dtype=\"float32\") = R.permute_dims(gv, axes=[0, 2, 3, 1])"),
            "{out}"
        );
        assert!(
            out.contains("gv1: R.Tensor((1, 3, 8, 8), dtype=\"float32\") = R.permute_dims("),
            "{out}"
        );
    }

    #[test]
    fn a_split_layout_travels_like_a_permutation_and_leaves_through_layout_transform() {
        let src = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 32, 8, 8), dtype="float32"), w: R.Tensor((48, 32, 1, 1), dtype="float32"), b: R.Tensor((1, 48, 1, 1), dtype="float32"), s: R.Tensor((1, 1, 1, 1), dtype="float32")) -> R.Tensor((1, 48, 4, 4), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((1, 48, 8, 8), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[0, 0, 0, 0], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            lv1: R.Tensor((1, 48, 8, 8), dtype="float32") = R.add(lv, b)
            lv2: R.Tensor((1, 48, 8, 8), dtype="float32") = R.nn.relu(lv1)
            lv3: R.Tensor((1, 48, 4, 4), dtype="float32") = R.nn.max_pool2d(lv2, pool_size=[2, 2], strides=[2, 2], dilation=[1, 1], padding=[0, 0, 0, 0], ceil_mode=False, count_include_pad=False, layout="NCHW", out_layout="NCHW")
            gv: R.Tensor((1, 48, 4, 4), dtype="float32") = R.multiply(lv3, s)
            R.output(gv)
        return gv
"#;
        let out = run(src, "NCHW16c", "OIHW");
        let expect = [
            "x_nchw16c: R.Tensor((1, 2, 8, 8, 16), dtype=\"float32\") = R.layout_transform(x, index_map=T.index_map(lambda i0, i1, i2, i3: (i0, i1 // 16, i2, i3, i1 % 16)), pad_value=None)",
            "data_layout=\"NCHW16c\", kernel_layout=\"OIHW\", out_layout=\"NCHW16c\"",
            "b_nchw16c: R.Tensor((1, 3, 1, 1, 16), dtype=\"float32\") = R.layout_transform(b,",
            "lv2_nchw16c: R.Tensor((1, 3, 8, 8, 16), dtype=\"float32\") = R.nn.relu(lv1_nchw16c)",
            "layout=\"NCHW16c\", out_layout=\"NCHW16c\")",
            // The (1, 1, 1, 1) scale does not split: the multiply reads the pool's original.
            "lv3: R.Tensor((1, 48, 4, 4), dtype=\"float32\") = R.layout_transform(lv3_nchw16c, index_map=T.index_map(lambda i0, i1, i2, i3, i4: (i0, i1 * 16 + i4, i2, i3)), pad_value=None)",
            "gv: R.Tensor((1, 48, 4, 4), dtype=\"float32\") = R.multiply(lv3, s)",
        ];
        for e in expect {
            assert!(out.contains(e), "missing `{e}` in\n{out}");
        }
        assert_eq!(out.matches("R.layout_transform(").count(), 3, "{out}");
        // A conv whose channels do not split by 16 stays as it is.
        let odd = src.replace("48", "40");
        let m = parse_module_str(&odd).unwrap_or_else(|e| panic!("{e}"));
        let out = convert_layout(&m, "NCHW16c", "OIHW").unwrap_or_else(|e| panic!("{e}"));
        assert!(!print_module(&out).text.contains("NCHW16c"));
    }

    #[test]
    fn a_broadcast_of_a_small_held_value_over_a_large_original_reads_the_originals() {
        // An SE block: the scale `s` comes from a 1 × 1 plane the layout converts, `x` from
        // a stage it does not. Moving `x` in and the product back would move its 2,048
        // elements twice; `s` goes back instead (32 elements).
        let src = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 32, 8, 8), dtype="float32"), w: R.Tensor((32, 32, 1, 1), dtype="float32")) -> R.Tensor((1, 32, 8, 8), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((1, 32, 1, 1), dtype="float32") = R.nn.adaptive_avg_pool2d(x, output_size=[1, 1], layout="NCHW", out_layout="NCHW")
            lv1: R.Tensor((1, 32, 1, 1), dtype="float32") = R.nn.conv2d(lv, w, strides=[1, 1], padding=[0, 0, 0, 0], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            lv2: R.Tensor((1, 32, 1, 1), dtype="float32") = R.sigmoid(lv1)
            gv: R.Tensor((1, 32, 8, 8), dtype="float32") = R.multiply(x, lv2)
            R.output(gv)
        return gv
"#;
        let out = run(src, "NCHW16c", "OIHW");
        for e in [
            "lv2_nchw16c: R.Tensor((1, 2, 1, 1, 16), dtype=\"float32\") = R.sigmoid(lv1_nchw16c)",
            "lv2: R.Tensor((1, 32, 1, 1), dtype=\"float32\") = R.layout_transform(lv2_nchw16c,",
            "gv: R.Tensor((1, 32, 8, 8), dtype=\"float32\") = R.multiply(x, lv2)",
        ] {
            assert!(out.contains(e), "missing `{e}` in\n{out}");
        }
        assert!(!out.contains("x_nchw16c"), "{out}");
        // Where the large operand is held too, the op runs in the layout (both moved once:
        // `x` into it for the second conv, the product out as the result).
        let held = src
            .replace(
                "gv: R.Tensor((1, 32, 8, 8), dtype=\"float32\") = R.multiply(x, lv2)",
                "lv3: R.Tensor((1, 32, 8, 8), dtype=\"float32\") = R.nn.conv2d(x, w, strides=[1, 1], padding=[0, 0, 0, 0], dilation=[1, 1], groups=1, data_layout=\"NCHW\", kernel_layout=\"OIHW\", out_layout=\"NCHW\", out_dtype=\"void\")\n            gv: R.Tensor((1, 32, 8, 8), dtype=\"float32\") = R.multiply(lv3, lv2)",
            );
        let out = run(&held, "NCHW16c", "OIHW");
        assert!(
            out.contains("gv_nchw16c: R.Tensor((1, 2, 8, 8, 16), dtype=\"float32\") = R.multiply(lv3_nchw16c, lv2_nchw16c)"),
            "{out}"
        );
    }

    #[test]
    fn a_channel_concatenation_of_whole_blocks_stays_in_the_layout() {
        let src = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 32, 8, 8), dtype="float32"), w: R.Tensor((32, 32, 1, 1), dtype="float32"), w2: R.Tensor((16, 32, 3, 3), dtype="float32")) -> R.Tensor((1, 48, 8, 8), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((1, 32, 8, 8), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[0, 0, 0, 0], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            lv1: R.Tensor((1, 16, 8, 8), dtype="float32") = R.nn.conv2d(lv, w2, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            lv2: R.Tensor((1, 48, 8, 8), dtype="float32") = R.concat((lv, lv1), axis=1)
            gv: R.Tensor((1, 48, 8, 8), dtype="float32") = R.nn.relu(lv2)
            R.output(gv)
        return gv
"#;
        // Split: the parts' blocks joined along the blocks' axis; one move in, one out.
        let out = run(src, "NCHW16c", "OIHW");
        for e in [
            "lv2_nchw16c: R.Tensor((1, 3, 8, 8, 16), dtype=\"float32\") = R.concat((lv_nchw16c, lv1_nchw16c), axis=1)",
            "gv_nchw16c: R.Tensor((1, 3, 8, 8, 16), dtype=\"float32\") = R.nn.relu(lv2_nchw16c)",
        ] {
            assert!(out.contains(e), "missing `{e}` in\n{out}");
        }
        assert_eq!(out.matches("R.layout_transform(").count(), 2, "{out}");
        // A permutation: the axis follows the channels (`axis=-3` read as 1).
        let out = run(&src.replace("axis=1", "axis=-3"), "NHWC", "OHWI");
        assert!(
            out.contains("lv2_nhwc: R.Tensor((1, 8, 8, 48), dtype=\"float32\") = R.concat((lv_nhwc, lv1_nhwc), axis=3)"),
            "{out}"
        );
        // x in, gv out, and the two weights (which fold when they are constants).
        assert_eq!(out.matches("R.permute_dims(").count(), 4, "{out}");
        // A part of 8 channels (its conv stays `NCHW`) would split a block: the concatenation
        // reads the originals.
        let odd = src
            .replace("(16, 32, 3, 3)", "(8, 32, 3, 3)")
            .replace("(1, 16, 8, 8)", "(1, 8, 8, 8)")
            .replace("48", "40");
        let out = run(&odd, "NCHW16c", "OIHW");
        assert!(
            out.contains(
                "lv2: R.Tensor((1, 40, 8, 8), dtype=\"float32\") = R.concat((lv, lv1), axis=1)"
            ),
            "{out}"
        );
    }

    #[test]
    fn an_image_of_fewer_channels_than_a_block_is_read_as_it_is() {
        let src = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), dtype="float32"), w: R.Tensor((32, 3, 3, 3), dtype="float32"), w2: R.Tensor((32, 32, 1, 1), dtype="float32")) -> R.Tensor((1, 32, 8, 8), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((1, 32, 8, 8), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            lv1: R.Tensor((1, 32, 8, 8), dtype="float32") = R.nn.relu(lv)
            gv: R.Tensor((1, 32, 8, 8), dtype="float32") = R.nn.conv2d(lv1, w2, strides=[1, 1], padding=[0, 0, 0, 0], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            R.output(gv)
        return gv
"#;
        let out = run(src, "NCHW16c", "OIHW");
        for e in [
            "lv_nchw16c: R.Tensor((1, 2, 8, 8, 16), dtype=\"float32\") = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout=\"NCHW\", kernel_layout=\"OIHW\", out_layout=\"NCHW16c\"",
            "R.nn.relu(lv_nchw16c)",
            "R.nn.conv2d(lv1_nchw16c, w2,",
        ] {
            assert!(out.contains(e), "missing `{e}` in\n{out}");
        }
        // One layout change: the result's, back to `NCHW`; the image is not moved.
        assert_eq!(out.matches("R.layout_transform(").count(), 1, "{out}");
        // Converting the converted module again changes nothing.
        let m = parse_module_str(&out).unwrap_or_else(|e| panic!("{e}"));
        let again = convert_layout(&m, "NCHW16c", "OIHW").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(print_module(&again).text, out);
        // An image of 16 channels or more that does not split (24) stays as it is.
        let wide = src
            .replace("(1, 3, 8, 8)", "(1, 24, 8, 8)")
            .replace("(32, 3, 3, 3)", "(32, 24, 3, 3)");
        let m = parse_module_str(&wide).unwrap_or_else(|e| panic!("{e}"));
        let out =
            print_module(&convert_layout(&m, "NCHW16c", "OIHW").unwrap_or_else(|e| panic!("{e}")))
                .text;
        assert!(out.contains("R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout=\"NCHW\", kernel_layout=\"OIHW\", out_layout=\"NCHW\""), "{out}");
    }

    #[test]
    fn a_conv_already_in_the_desired_layouts_is_left_alone() {
        let src = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 8, 8, 3), dtype="float32"), w: R.Tensor((4, 3, 3, 3), dtype="float32")) -> R.Tensor((1, 8, 8, 4), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((1, 8, 8, 4), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NHWC", kernel_layout="OHWI", out_layout="NHWC", out_dtype="void")
            R.output(gv)
        return gv
"#;
        let m = parse_module_str(src).unwrap_or_else(|e| panic!("{e}"));
        let out = convert_layout(&m, "NHWC", "OHWI").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(print_module(&out).text, print_module(&m).text);
    }
}
