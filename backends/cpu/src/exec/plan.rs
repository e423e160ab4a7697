//! What the executor works out once from a function's IR: the facts [`Interp::call`] uses
//! on every call (fused chains, the drop plan, the elementwise program, the direct path of a
//! function that is one convolution chain), and the checks of that direct path.
//!
//! Contract: everything here depends on the function alone (and, for a function that calls
//! others, on running without a call hook), never on the values it is called with; the
//! executor keeps it per function ([`Executor::facts`]). The one exception is kept apart and
//! checked on use: a [`Site`] of the pinned module (a call of a module function, resolved on
//! its first run: the callee, its facts, its constant arguments' tensors) keeps the epilogue
//! its callee's chain derives from those constants ([`Ready`]) together with the data shape it
//! was derived for, and serves it only to calls with data of that shape.
//!
//! ```text
//! @R.function(private=True)
//! def fused_conv2d_add_clip(x: R.Tensor(("n", 32, 112, 112), dtype="float32"), ...):
//!     lv = R.nn.conv2d(x, w)           # Whole: one chain ending in the result, so a call
//!     gv = R.clip(R.add(lv, b), 0, 6)  # with host tensors of these types runs it directly
//!     return gv
//! ; drops: lv after gv's binding; params: x → Extent::Sym(0), then 32, 112, 112 fixed
//! ```

use super::*;

/// The most functions [`Executor::facts`] keeps (then it starts over): a model's fused
/// functions number in the hundreds.
pub(super) const MAX_FACTS: usize = 4096;

/// What [`Interp::call`] derives from a function's IR alone, the same on every call: worked
/// out once per function and executor ([`Executor::facts`]), for functions that call no other
/// function (then none of it depends on the module or the call hook), as the fused functions
/// FuseOps and the patterns make are. With MobileNetV2's 53 calls of fused functions per
/// inference, deriving them each time was about 1.5% of a one-thread run (`perf`).
pub(super) struct Facts {
    /// The function they were derived from (a cached entry is used only for an equal one;
    /// `None` for the pinned module's, which cannot change).
    pub(super) func: Option<Function>,
    /// [`crate::elem_program::compile`] of it.
    pub(super) group: Option<crate::elem_program::Group>,
    /// [`fuse::plan`] of it (for a function that calls others, as a run without a call hook
    /// plans it).
    pub(super) chains: Vec<Option<fuse::Chain>>,
    /// [`drop_plan`] of it.
    pub(super) drops: (Vec<Vec<VarId>>, Vec<bool>),
    /// [`Whole::of`] it: its bindings are one chain that [`Interp::call`] runs straight from
    /// the arguments.
    pub(super) whole: Option<Whole>,
    /// Whether it calls other functions ([`calls_functions`]): then `chains` hold only for a
    /// run without a call hook.
    pub(super) calls: bool,
    /// Per binding, what a call of a module function there resolves on its first run in the
    /// pinned module without a call hook ([`Site`]); `None` inside for a binding of another
    /// kind, or whose constants did not decode.
    pub(super) sites: Vec<OnceLock<Option<Site>>>,
    /// For a `Primitive` function: its results on arguments that are all constants, shapes
    /// and prim values ([`Interp::call_folded`]), by those arguments.
    pub(super) folded: Mutex<Vec<(Vec<ArgKey>, Value)>>,
    /// For a composite function: [`crate::composite::recognise`] of it, so that a call at a
    /// resolved [`Site`] does not read the body again (about 1.5 µs a call).
    pub(super) composite: Option<crate::composite::Plan>,
}

/// An argument of a call whose result [`Facts::folded`] keeps: a constant (by its buffer,
/// as the executor keys decoded constants), a shape or a prim value.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum ArgKey {
    Const(ConstKey),
    Shape(Vec<i64>),
    Int(i64),
    /// A float prim value, by its bits.
    Float(u64),
    /// The caller's symbolic dims (a shape literal inside the function may read one its
    /// parameters leave unbound, see [`Interp::call`]).
    Syms(Vec<(Sym, i64)>),
}

/// A call site of the pinned module run without a call hook: `binding = callee(args)` with
/// every argument a var or a constant. What the call looks up on every run is resolved once:
/// the callee (its index in the module), its [`Facts`] (where the executor keeps them), and
/// each constant argument's decoded tensor (the one [`Executor::constant`] hands out). The
/// module cannot change while it is pinned, so these stay what the lookups would give.
pub(super) struct Site {
    pub(super) callee: usize,
    pub(super) facts: Option<Arc<Facts>>,
    pub(super) consts: Vec<Option<Tensor>>,
    /// For a callee that is one convolution chain ([`Whole`]) whose weight and other
    /// operands are constants here: what [`Interp::run_whole`] derives from them on the first
    /// call ([`Ready`]); `None` inside for another callee.
    pub(super) ready: OnceLock<Option<Ready>>,
}

/// What a call at a [`Site`] derives from its constant arguments for data of shape
/// `x_shape`: the weight, the epilogue steps ([`fuse::steps`]: the bias and `batch_norm`
/// values) and the weight forms the executor keeps (Winograd, packed columns). Every call
/// there with data of that shape would derive the same from the same tensors.
pub(super) struct Ready {
    pub(super) x_shape: Vec<usize>,
    pub(super) w: Tensor,
    pub(super) steps: Vec<crate::conv::Step>,
    pub(super) wino: Option<Arc<crate::winograd::Weights>>,
    pub(super) cols: Option<Arc<crate::gemm_packed::PackedB>>,
    pub(super) blocked: Option<Arc<crate::conv::BlockedWeights>>,
}

impl Facts {
    /// The facts of `f` (`keep`: with a copy of it to compare later calls against).
    pub(super) fn derive(module: &Module, f: &Function, keep: bool) -> Facts {
        let chains = fuse::plan(module, f, &|_| true);
        let sites = (0..f.bindings().count()).map(|_| OnceLock::new()).collect();
        Facts {
            sites,
            folded: Mutex::new(Vec::new()),
            func: keep.then(|| f.clone()),
            group: crate::elem_program::compile(f),
            whole: Whole::of(f, &chains),
            chains,
            drops: drop_plan(f),
            calls: calls_functions(f),
            composite: f
                .attrs
                .composite
                .as_ref()
                .and_then(|_| crate::composite::recognise(f)),
        }
    }
}

/// A tensor type of known dtype whose dims are numbers or plain symbols (`n`): what a value
/// must be to match it, checked without [`match_type`]'s symbol table.
#[derive(Debug, PartialEq)]
pub(super) struct TensorCheck {
    pub(super) dtype: DType,
    pub(super) dims: Vec<Extent>,
}

/// A dim of a [`TensorCheck`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Extent {
    Fixed(usize),
    /// The `i`-th symbol of the function, in order of first appearance.
    Sym(usize),
}

impl TensorCheck {
    /// `ty` when it is a tensor type of known dtype whose dims are numbers or plain symbols;
    /// each symbol is looked up in `syms`, and added there when `new` allows (else the type
    /// has no check).
    pub(super) fn of(ty: &Type, syms: &mut Vec<Sym>, new: bool) -> Option<TensorCheck> {
        let Type::Tensor(tt) = ty else {
            return None;
        };
        let dims = tt
            .dims
            .as_ref()?
            .iter()
            .map(|d| match d {
                Dim::Static(n) => usize::try_from(*n).ok().map(Extent::Fixed),
                Dim::Sym(s) => match syms.iter().position(|x| x == s) {
                    Some(i) => Some(Extent::Sym(i)),
                    None if new => {
                        syms.push(s.clone());
                        Some(Extent::Sym(syms.len() - 1))
                    }
                    None => None,
                },
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        Some(TensorCheck {
            dtype: tt.dtype?,
            dims,
        })
    }

    /// Whether `v` is a host tensor of this type (what [`match_type`] accepts for it, a
    /// device value aside), each symbol taking the extent it first meets (`bound`).
    pub(super) fn holds(&self, v: &Value, bound: &mut [Option<usize>]) -> bool {
        let Value::Tensor(t) = v else {
            return false;
        };
        t.dtype() == self.dtype
            && t.shape().len() == self.dims.len()
            && self.dims.iter().zip(t.shape()).all(|(d, &n)| match *d {
                Extent::Fixed(e) => e == n,
                Extent::Sym(i) => match bound.get_mut(i) {
                    Some(Some(e)) => *e == n,
                    Some(slot) => {
                        *slot = Some(n);
                        true
                    }
                    None => false,
                },
            })
    }
}

/// A function whose bindings are one [`fuse::Chain`] of a `conv2d` (as FuseOps outlines a
/// convolution with its epilogue), whose result is the value returned, with parameters and
/// result of tensor types of numbers and plain symbols (the result's bound by the
/// parameters): [`Interp::call`] runs the chain straight from the arguments, with no frame
/// of values, when they are host tensors of those types; the result is checked against the
/// return type.
/// What the chain reads is a parameter or a constant, so nothing else needs evaluating.
#[derive(Debug)]
pub(super) struct Whole {
    /// The chain (`chains[0]` of the function's [`Facts`]).
    pub(super) chain: fuse::Chain,
    /// The var of its first binding (where a kernel error is reported, as the interpreter
    /// reports it).
    pub(super) first: VarId,
    /// Per parameter, its type.
    pub(super) params: Vec<TensorCheck>,
    /// The return type (the last binding's var has the same); its symbols are the
    /// parameters'.
    pub(super) ret: TensorCheck,
    /// The symbols of the parameters' types.
    pub(super) syms: usize,
}

impl Whole {
    pub(super) fn of(f: &Function, chains: &[Option<fuse::Chain>]) -> Option<Whole> {
        let chain = chains.first()?.as_ref()?;
        if !matches!(chain.head, fuse::Head::Conv { .. }) {
            return None;
        }
        let bindings: Vec<_> = f.bindings().copied().collect();
        let last = bindings.last()?;
        if chain.links.len() + 1 != bindings.len()
            || !matches!(f.ret.map(|r| &f.expr(r).kind), Some(ExprKind::Var(v)) if *v == last.var)
        {
            return None;
        }
        let mut syms = Vec::new();
        let params = f
            .params
            .iter()
            .map(|&p| TensorCheck::of(&f.var(p).ty, &mut syms, true))
            .collect::<Option<Vec<_>>>()?;
        let ret = TensorCheck::of(&f.ret_ty, &mut syms, false)?;
        if TensorCheck::of(&f.var(last.var).ty, &mut syms, false).as_ref() != Some(&ret) {
            return None;
        }
        // Everything the chain reads is a parameter or a constant.
        let (fuse::Head::Conv { data, weight, .. }
        | fuse::Head::Add {
            lhs: data,
            rhs: weight,
        }) = chain.head;
        let reads = [data, weight].into_iter().chain(fuse::operand_exprs(chain));
        for e in reads {
            match &f.exprs.get(e)?.kind {
                ExprKind::Var(v) if f.params.contains(v) => {}
                ExprKind::Const(_) => {}
                _ => return None,
            }
        }
        Some(Whole {
            chain: chain.clone(),
            first: bindings.first()?.var,
            params,
            ret,
            syms: syms.len(),
        })
    }
}

/// Whether `f` calls a function (a module's or a local one), so that what [`fuse::plan`]
/// finds in it can depend on more than `f`.
pub(super) fn calls_functions(f: &Function) -> bool {
    f.exprs.iter().any(|(_, e)| {
        matches!(
            &e.kind,
            ExprKind::Call {
                callee: Callee::Global(_) | Callee::Local(_),
                ..
            }
        )
    })
}

/// Adds the vars `e` reads to `out` (for an `if`, everything its branches read, the vars
/// they bind included: those are dropped with the rest after the `if`).
pub(super) fn uses(f: &Function, e: ExprId, out: &mut Vec<VarId>) {
    fusebox_core::ir::for_each_use(f, e, &mut |v| out.push(v));
}

/// For each binding index, the vars to drop after it (their last use, or the binding's own
/// var when nothing reads it); and the parameters nothing reads (never stored).
pub(super) fn drop_plan(f: &Function) -> (Vec<Vec<VarId>>, Vec<bool>) {
    let bindings: Vec<_> = f.bindings().copied().collect();
    let mut last: Vec<Option<usize>> = vec![None; f.vars.len()];
    let mut buf = Vec::new();
    for (i, b) in bindings.iter().enumerate() {
        buf.clear();
        uses(f, b.value, &mut buf);
        for v in &buf {
            if let Some(slot) = last.get_mut(v.as_u32() as usize) {
                *slot = Some(i);
            }
        }
    }
    // The returned expression keeps what it reads alive to the end.
    if let Some(r) = f.ret {
        buf.clear();
        uses(f, r, &mut buf);
        for v in &buf {
            if let Some(slot) = last.get_mut(v.as_u32() as usize) {
                *slot = Some(usize::MAX);
            }
        }
    }
    let mut plan = vec![Vec::new(); bindings.len()];
    for (i, b) in bindings.iter().enumerate() {
        if last
            .get(b.var.as_u32() as usize)
            .copied()
            .flatten()
            .is_none()
        {
            plan[i].push(b.var);
        }
    }
    for (v, l) in last.iter().enumerate() {
        if let Some(i) = *l
            && let Some(slot) = plan.get_mut(i)
        {
            slot.push(fusebox_core::ir::EntityId::new(v));
        }
    }
    let unused = f
        .params
        .iter()
        .map(|p| last.get(p.as_u32() as usize).copied().flatten().is_none())
        .collect();
    (plan, unused)
}
