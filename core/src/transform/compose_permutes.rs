//! ComposePermutes: a chain of `permute_dims` and `reshape` calls that only moves whole dims
//! around (and groups or splits them) becomes at most one `reshape` of its input, one
//! `permute_dims` and one `reshape` of the result, when that is fewer calls than the chain.
//!
//! Exporters spell one transpose of a head split in several steps: the dynamo exporter's keys of
//! GPT-2 are `permute_dims(view, [0, 2, 1, 3])`, a reshape to `[b * h, s, d]`, a
//! `permute_dims(.., [0, 2, 1])` and a reshape back to `[b, h, d, s]` (its `bmm` lowering): four
//! copies of the keys where one transpose, `[0, 2, 3, 1]`, is the same. One `permute_dims` of
//! the head split is also what the attention patterns (`cpu.attention_heads`) read in place.
//!
//! Contract:
//!
//! - **Requires** a module that verifies.
//! - **Rewrites**, in every function without `Primitive`, `Composite` or `Codegen`, each chain
//!   `y = c_n(... c_1(x))` of `R.permute_dims` and `R.reshape` calls whose intermediate results
//!   are dataflow vars of `y`'s block used only by the next call of the chain (and not
//!   returned). Every shape is read from the types (dims known, symbolic dims by expression).
//!   The chain is followed dim by dim: the input's dims are split where a reshape cuts one
//!   (`768` into `12, 64`; a symbolic dim only by an exact factor, `b * 12` into `b, 12`), dims
//!   that a reshape merges are kept as a group, a permutation reorders groups. When every step
//!   is such a regrouping, `y` is `reshape(permute_dims(reshape(x, split), p), y's shape)`,
//!   each call left out where it changes nothing; it replaces the chain if that is fewer calls.
//!   A reshape that is not a regrouping of whole or exactly split dims (or a dim of 0) leaves
//!   the chain as it is. The rewrite moves the same elements to the same places, bit for bit,
//!   for every dtype. `y` keeps its var (name, type, origin); the new intermediate vars are
//!   named after it (`<y>_split`, `<y>_perm`). The chain's old calls are left to dead-code
//!   elimination.
//!
//! ```text
//! ; before (view: [b, s, 12, 64])
//! t  = R.permute_dims(view, axes=[0, 2, 1, 3])     ; [b, 12, s, 64]
//! r  = R.reshape(t, R.shape([b * 12, s, 64]))
//! t2 = R.permute_dims(r, axes=[0, 2, 1])           ; [b * 12, 64, s]
//! y  = R.reshape(t2, R.shape([b, 12, 64, s]))
//! ; after
//! y  = R.permute_dims(view, axes=[0, 2, 3, 1])
//! ```

use super::substitute::{ChainCall, bind_chain, shape_arg};
use crate::error::Result;
use crate::ir::{Dim, DimOp, ExprId, Function, Module, VarId};
use crate::op::Op;
use crate::pattern::matcher::FunctionView;

/// Runs ComposePermutes (see the module doc); inside the branches of `if`s too (see
/// [`super::regions`]).
pub fn compose_permutes(m: &Module) -> Result<Module> {
    super::substitute::rewrite_entries(m, compose_in)
}

/// A product of dims: a positive integer coefficient and the other factors (symbols, or any
/// other dim expression kept whole), sorted by their text, so `b * 12` and `12 * b` are equal.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mono {
    coef: i64,
    factors: Vec<(String, Dim)>,
}

impl Mono {
    fn one() -> Mono {
        Mono {
            coef: 1,
            factors: Vec::new(),
        }
    }

    /// `None` for a dim of 0 or less (no rewrite then).
    fn of(d: &Dim) -> Option<Mono> {
        match d {
            Dim::Static(v) if *v >= 1 => Some(Mono {
                coef: *v,
                factors: Vec::new(),
            }),
            Dim::Static(_) => None,
            Dim::Expr(e) if e.0 == DimOp::Mul => Mono::of(&e.1)?.times(&Mono::of(&e.2)?),
            other => Some(Mono {
                coef: 1,
                factors: vec![(other.to_string(), other.clone())],
            }),
        }
    }

    fn times(&self, o: &Mono) -> Option<Mono> {
        let mut factors = self.factors.clone();
        factors.extend(o.factors.iter().cloned());
        factors.sort_by(|a, b| a.0.cmp(&b.0));
        Some(Mono {
            coef: self.coef.checked_mul(o.coef)?,
            factors,
        })
    }

    /// `self / o` when it is exact: `o`'s coefficient divides ours and its factors are among ours.
    fn over(&self, o: &Mono) -> Option<Mono> {
        if o.coef == 0 || self.coef % o.coef != 0 {
            return None;
        }
        let mut factors = self.factors.clone();
        for (key, _) in &o.factors {
            let i = factors.iter().position(|(k, _)| k == key)?;
            factors.remove(i);
        }
        Some(Mono {
            coef: self.coef / o.coef,
            factors,
        })
    }

    fn is_one(&self) -> bool {
        self.coef == 1 && self.factors.is_empty()
    }

    fn dim(&self) -> Dim {
        self.factors
            .iter()
            .fold(Dim::Static(self.coef), |acc, (_, f)| acc.mul(f))
    }
}

/// The chain followed dim by dim: the input's dims (split where needed) are atoms; each of the
/// current dims is a group of atoms, in row-major order.
struct Atoms {
    /// Each atom's extent.
    size: Vec<Mono>,
    /// The atoms in the input's order (its dims, split).
    source: Vec<usize>,
    /// The current dims.
    groups: Vec<Vec<usize>>,
}

impl Atoms {
    fn new(dims: &[Dim]) -> Option<Atoms> {
        let size = dims.iter().map(Mono::of).collect::<Option<Vec<Mono>>>()?;
        Some(Atoms {
            source: (0..size.len()).collect(),
            groups: (0..size.len()).map(|i| vec![i]).collect(),
            size,
        })
    }

    fn permute(&mut self, axes: &[usize]) -> Option<()> {
        if axes.len() != self.groups.len() {
            return None;
        }
        let mut seen = vec![false; axes.len()];
        for &a in axes {
            if std::mem::replace(seen.get_mut(a)?, true) {
                return None;
            }
        }
        self.groups = axes.iter().map(|&a| self.groups[a].clone()).collect();
        Some(())
    }

    /// Splits atom `a` into `(outer, size / outer)`, in the source too; the two new atoms.
    fn split(&mut self, a: usize, outer: Mono, inner: Mono) -> (usize, usize) {
        let (a1, a2) = (self.size.len(), self.size.len() + 1);
        self.size.push(outer);
        self.size.push(inner);
        if let Some(i) = self.source.iter().position(|&x| x == a) {
            self.source.splice(i..=i, [a1, a2]);
        }
        (a1, a2)
    }

    /// Regroups the atoms, in their current row-major order, into dims `target`.
    fn reshape(&mut self, target: &[Dim]) -> Option<()> {
        let mut seq: Vec<usize> = self.groups.concat();
        let mut k = 0;
        let mut groups: Vec<Vec<usize>> = Vec::with_capacity(target.len());
        for t in target {
            let want = Mono::of(t)?;
            let mut acc = Mono::one();
            let mut group = Vec::new();
            while group.is_empty() || acc != want {
                let a = *seq.get(k)?;
                let rest = want.over(&acc)?;
                let size = self.size[a].clone();
                if rest.over(&size).is_some() {
                    // The whole atom fits.
                    acc = acc.times(&size)?;
                    group.push(a);
                    k += 1;
                } else {
                    // The atom is larger: its outer part ends this dim.
                    let inner = size.over(&rest)?;
                    let (a1, a2) = self.split(a, rest, inner);
                    seq.splice(k..=k, [a1, a2]);
                    group.push(a1);
                    acc = want.clone();
                    k += 1;
                }
            }
            groups.push(group);
        }
        // Atoms of extent 1 left over join the last dim.
        for &a in &seq[k..] {
            if !self.size[a].is_one() {
                return None;
            }
            groups.last_mut()?.push(a);
        }
        self.groups = groups;
        Some(())
    }
}

/// One step of a chain.
enum Step {
    Permute(Vec<usize>),
    Reshape(Vec<Dim>),
}

/// A chain ending at a binding, and what replaces it.
struct Site {
    y: VarId,
    x: ExprId,
    /// The input reshaped (split) and permuted, each `None` where it changes nothing; then
    /// reshaped to `y`'s dims when `regroup`.
    split: Option<Vec<Dim>>,
    perm: Option<Vec<usize>>,
    regroup: bool,
}

fn dims_of(f: &Function, e: ExprId) -> Option<Vec<Dim>> {
    Some(f.expr(e).ty.as_tensor()?.dims.as_deref()?.to_vec())
}

/// The permutation of a `permute_dims` of rank `r` (`None` axes: reversed).
fn axes(axes: &Option<Vec<i64>>, r: usize) -> Option<Vec<usize>> {
    match axes {
        None => Some((0..r).rev().collect()),
        Some(a) => a
            .iter()
            .map(|&x| {
                let x = if x < 0 { x + r as i64 } else { x };
                usize::try_from(x).ok().filter(|&x| x < r)
            })
            .collect(),
    }
}

/// The step a var's binding is, with its input.
fn step_of(view: &FunctionView<'_>, f: &Function, v: VarId) -> Option<(Step, ExprId)> {
    let (op, args) = super::substitute::call_of(view, f, f.var(v).expr)?;
    let x = *args.first()?;
    match op {
        Op::PermuteDims { axes: a } => {
            let r = dims_of(f, x)?.len();
            Some((Step::Permute(axes(a, r)?), x))
        }
        Op::Reshape => Some((Step::Reshape(dims_of(f, f.var(v).expr)?), x)),
        _ => None,
    }
}

/// The chain ending at `y`, if `y` ends one (see the module doc), and its replacement when it
/// is shorter.
fn site(view: &FunctionView<'_>, f: &Function, y: VarId) -> Option<Site> {
    let block = view.block_of(y)?;
    let chain_op = |v: VarId| step_of(view, f, v).is_some();
    // `y` ends the chain: it does not feed a further step alone.
    let users = view.users_of(y);
    if let [u] = users
        && chain_op(*u)
        && f.var(y).dataflow
        && !view.returned().contains(&y)
        && view.block_of(*u) == Some(block)
    {
        return None;
    }
    let mut steps = Vec::new();
    let mut v = y;
    let x = loop {
        let (step, x) = step_of(view, f, v)?;
        steps.push(step);
        let Some(prev) = f.as_var(x) else { break x };
        let inner = chain_op(prev)
            && f.var(prev).dataflow
            && view.users_of(prev) == [v]
            && !view.returned().contains(&prev)
            && view.block_of(prev) == Some(block);
        if !inner {
            break x;
        }
        v = prev;
    };
    if steps.len() < 2 {
        return None;
    }
    steps.reverse();
    let x_dims = dims_of(f, x)?;
    // `y`'s dims are known (the replacement's last reshape, if any, is to them).
    dims_of(f, f.var(y).expr)?;
    let mut atoms = Atoms::new(&x_dims)?;
    for s in &steps {
        match s {
            Step::Permute(p) => atoms.permute(p)?,
            Step::Reshape(t) => atoms.reshape(t)?,
        }
    }
    let split = (atoms.source.len() != x_dims.len())
        .then(|| atoms.source.iter().map(|&a| atoms.size[a].dim()).collect());
    let order: Vec<usize> = atoms.groups.concat();
    let perm: Vec<usize> = order
        .iter()
        .map(|a| atoms.source.iter().position(|s| s == a))
        .collect::<Option<_>>()?;
    let identity = perm.iter().enumerate().all(|(i, &p)| i == p);
    let regroup = atoms.groups.iter().any(|g| g.len() != 1);
    let calls = usize::from(split.is_some()) + usize::from(!identity) + usize::from(regroup);
    if calls == 0 || calls >= steps.len() {
        return None;
    }
    Some(Site {
        y,
        x,
        split,
        perm: (!identity).then_some(perm),
        regroup,
    })
}

/// Rewrites every chain of `f`; says whether anything changed.
fn compose_in(f: &mut Function) -> bool {
    let sites: Vec<Site> = {
        let view = FunctionView::new(f);
        f.bindings().filter_map(|b| site(&view, f, b.var)).collect()
    };
    let changed = !sites.is_empty();
    for s in sites {
        let (Some(dtype), Some(y_dims)) = (
            f.var(s.y).ty.as_tensor().and_then(|t| t.dtype),
            dims_of(f, f.var(s.y).expr),
        ) else {
            continue;
        };
        let x_dims = dims_of(f, s.x).unwrap_or_default();
        // Each call but the last binds a new var; the last is `y`'s value.
        let mut calls: Vec<ChainCall> = Vec::new();
        let split_dims = s.split.clone().unwrap_or(x_dims);
        if let Some(d) = s.split {
            calls.push((Op::Reshape, vec![shape_arg(f, &d)], d, "split"));
        }
        if let Some(p) = s.perm {
            let dims: Vec<Dim> = p.iter().map(|&i| split_dims[i].clone()).collect();
            let axes = Some(p.iter().map(|&i| i as i64).collect());
            calls.push((Op::PermuteDims { axes }, vec![], dims, "perm"));
        }
        if s.regroup {
            calls.push((Op::Reshape, vec![shape_arg(f, &y_dims)], y_dims, "last"));
        }
        bind_chain(f, s.y, s.x, calls, dtype);
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Callee, ExprKind};
    use crate::text::{parse_module_str, print_module};

    fn run(src: &str) -> String {
        let m = parse_module_str(src).unwrap_or_else(|e| panic!("{e}"));
        let out = compose_permutes(&m).unwrap_or_else(|e| panic!("{e}"));
        crate::ir::verify::verify(&out).unwrap_or_else(|e| panic!("{e:?}"));
        print_module(&out).text
    }

    /// GPT-2's keys as the dynamo exporter writes them (`bmm` on `[b * h, ..]` views).
    const KEYS: &str = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((b, s, 768), dtype="float32")) -> R.Tensor((b, 12, 64, s), dtype="float32"):
        with R.dataflow():
            view: R.Tensor((b, s, 12, 64), dtype="float32") = R.reshape(x, R.shape([b, s, 12, 64]))
            t: R.Tensor((b, 12, s, 64), dtype="float32") = R.permute_dims(view, axes=[0, 2, 1, 3])
            r: R.Tensor((b * 12, s, 64), dtype="float32") = R.reshape(t, R.shape([b * 12, s, 64]))
            t2: R.Tensor((b * 12, 64, s), dtype="float32") = R.permute_dims(r, axes=[0, 2, 1])
            gv: R.Tensor((b, 12, 64, s), dtype="float32") = R.reshape(t2, R.shape([b, 12, 64, s]))
            R.output(gv)
        return gv
"#;

    #[test]
    fn the_dynamo_keys_become_one_transpose_of_the_head_split() {
        let out = run(KEYS);
        // From `x`: its 768 split into 12 × 64, then one permutation.
        assert!(
            out.contains(
                "gv_split: R.Tensor((b, s, 12, 64), dtype=\"float32\") = R.reshape(x, R.shape([b, s, 12, 64]))"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "gv: R.Tensor((b, 12, 64, s), dtype=\"float32\") = R.permute_dims(gv_split, axes=[0, 2, 3, 1])"
            ),
            "{out}"
        );
        assert_eq!(out.matches("R.permute_dims").count(), 1, "{out}");
        assert_eq!(out.matches("R.reshape").count(), 1, "{out}");
    }

    #[test]
    fn a_chain_read_elsewhere_or_already_short_is_kept() {
        // `t` is also returned: the chain from `t` on (three calls) composes; `t` stays.
        let src = KEYS
            .replace(
                "            R.output(gv)\n        return gv",
                "            out: R.Tuple(R.Tensor((b, 12, 64, s), dtype=\"float32\"), R.Tensor((b, 12, s, 64), dtype=\"float32\")) = (gv, t)\n            R.output(out)\n        return out",
            )
            .replace(
                "-> R.Tensor((b, 12, 64, s), dtype=\"float32\"):",
                "-> R.Tuple(R.Tensor((b, 12, 64, s), dtype=\"float32\"), R.Tensor((b, 12, s, 64), dtype=\"float32\")):",
            );
        let out = run(&src);
        assert!(
            out.contains("= R.permute_dims(view, axes=[0, 2, 1, 3])"),
            "{out}"
        );
        assert!(out.contains("gv: R.Tensor((b, 12, 64, s), dtype=\"float32\") = R.permute_dims(t, axes=[0, 1, 3, 2])"), "{out}");
        // A head split and its transpose (two calls) are already as short as they get.
        let two = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((b, s, 768), dtype="float32")) -> R.Tensor((b, 12, s, 64), dtype="float32"):
        with R.dataflow():
            view: R.Tensor((b, s, 12, 64), dtype="float32") = R.reshape(x, R.shape([b, s, 12, 64]))
            gv: R.Tensor((b, 12, s, 64), dtype="float32") = R.permute_dims(view, axes=[0, 2, 1, 3])
            R.output(gv)
        return gv
"#;
        let m = parse_module_str(two).unwrap();
        assert_eq!(
            print_module(&compose_permutes(&m).unwrap()).text,
            print_module(&m).text
        );
    }

    #[test]
    fn a_reshape_that_is_no_regrouping_keeps_the_chain() {
        // [4, 6] transposed is [6, 4]; as [8, 3] its rows mix the columns: no single transpose.
        let src = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4, 6), dtype="float32")) -> R.Tensor((3, 8), dtype="float32"):
        with R.dataflow():
            t: R.Tensor((6, 4), dtype="float32") = R.permute_dims(x, axes=[1, 0])
            r: R.Tensor((8, 3), dtype="float32") = R.reshape(t, R.shape([8, 3]))
            gv: R.Tensor((3, 8), dtype="float32") = R.permute_dims(r, axes=[1, 0])
            R.output(gv)
        return gv
"#;
        let m = parse_module_str(src).unwrap();
        assert_eq!(
            print_module(&compose_permutes(&m).unwrap()).text,
            print_module(&m).text
        );
    }

    /// `x` (its row-major elements numbered) through main's reshapes and transposes.
    fn eval(f: &Function, x_shape: &[usize]) -> (Vec<usize>, Vec<usize>) {
        let n: usize = x_shape.iter().product();
        let mut vals: std::collections::HashMap<VarId, (Vec<usize>, Vec<usize>)> =
            std::collections::HashMap::new();
        vals.insert(f.params[0], (x_shape.to_vec(), (0..n).collect()));
        let mut last = None;
        for b in f.bindings() {
            let ExprKind::Call {
                callee: Callee::Op(op),
                args,
            } = &f.expr(b.value).kind
            else {
                continue;
            };
            let (shape, data) = vals[&f.as_var(args[0]).unwrap()].clone();
            let out_shape: Vec<usize> = dims_of(f, f.var(b.var).expr)
                .unwrap()
                .iter()
                .map(|d| d.as_static().unwrap() as usize)
                .collect();
            let v = match op {
                Op::Reshape => (out_shape, data),
                Op::PermuteDims { axes: a } => {
                    let p = axes(a, shape.len()).unwrap();
                    let mut st = vec![1usize; shape.len()];
                    for k in (0..shape.len().saturating_sub(1)).rev() {
                        st[k] = st[k + 1] * shape[k + 1];
                    }
                    let mut out = Vec::with_capacity(data.len());
                    let mut idx = vec![0usize; p.len()];
                    for _ in 0..data.len() {
                        let off: usize = idx.iter().zip(&p).map(|(&i, &k)| i * st[k]).sum();
                        out.push(data[off]);
                        for k in (0..idx.len()).rev() {
                            idx[k] += 1;
                            if idx[k] < out_shape[k] {
                                break;
                            }
                            idx[k] = 0;
                        }
                    }
                    (out_shape, out)
                }
                _ => unreachable!(),
            };
            vals.insert(b.var, v.clone());
            last = Some(v);
        }
        last.unwrap()
    }

    proptest::proptest! {
        /// Any chain of transposes and reshapes (static shapes) gives the same elements in the
        /// same places after the pass, in no more calls.
        #[test]
        fn composed_chains_move_the_same_elements(
            dims in proptest::collection::vec(1usize..5, 2..5),
            steps in proptest::collection::vec((proptest::bool::ANY, 0u64..1000), 2..6),
        ) {
            let mut shape = dims.clone();
            let mut lines = Vec::new();
            let ty = |s: &[usize]| format!(
                "R.Tensor(({}{}), dtype=\"float32\")",
                s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "),
                if s.len() == 1 { "," } else { "" }
            );
            let mut prev = "x".to_string();
            for (i, (transpose, seed)) in steps.iter().enumerate() {
                let name = if i + 1 == steps.len() { "gv".to_string() } else { format!("v{i}") };
                if *transpose {
                    // A permutation from the seed (Lehmer code).
                    let mut pool: Vec<usize> = (0..shape.len()).collect();
                    let mut s = *seed as usize;
                    let mut p = Vec::new();
                    while !pool.is_empty() {
                        p.push(pool.remove(s % pool.len()));
                        s /= pool.len() + 1;
                    }
                    let out: Vec<usize> = p.iter().map(|&k| shape[k]).collect();
                    lines.push(format!("{name}: {} = R.permute_dims({prev}, axes={p:?})", ty(&out)));
                    shape = out;
                } else {
                    // Merge two neighbours, or split a dim into a factor pair, by the seed.
                    let k = (*seed as usize) % shape.len();
                    let mut out = shape.clone();
                    let split = (2..=out[k]).find(|f| out[k] % f == 0 && *f < out[k]);
                    if seed % 2 == 0 && k + 1 < out.len() {
                        let m = out.remove(k + 1);
                        out[k] *= m;
                    } else if let Some(f) = split {
                        let d = out[k];
                        out.splice(k..=k, [f, d / f]);
                    } else {
                        out.reverse();
                    }
                    let shape_lit = out.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
                    lines.push(format!("{name}: {} = R.reshape({prev}, R.shape([{shape_lit}]))", ty(&out)));
                    shape = out;
                }
                prev = name;
            }
            let src = format!(
                "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: {}) -> {}:\n        with R.dataflow():\n{}\n            R.output(gv)\n        return gv\n",
                ty(&dims),
                ty(&shape),
                lines.iter().map(|l| format!("            {l}")).collect::<Vec<_>>().join("\n")
            );
            let m = parse_module_str(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
            let out = compose_permutes(&m).unwrap();
            crate::ir::verify::verify(&out).unwrap_or_else(|e| panic!("{e:?}"));
            let (f0, f1) = (m.get("main").unwrap(), out.get("main").unwrap());
            proptest::prop_assert_eq!(eval(f0, &dims), eval(f1, &dims), "{}", src);
            proptest::prop_assert!(f1.bindings().count() <= f0.bindings().count());
        }
    }
}
