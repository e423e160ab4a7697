//! The reference executor: interprets a function of a module binding by binding.
//!
//! Contract:
//!
//! - [`run`] binds the arguments to the parameters, checking each against the parameter's
//!   type (dtype, rank, static dims) and binding symbolic dims (`n`) from the actual shapes;
//!   a symbolic dim used twice must agree.
//! - Bindings run in order: op calls go to [`crate::eval_op`]; calls of module functions
//!   (composites, `Primitive` functions, `Codegen` wrappers, any other) and of local functions
//!   (`local_func(...)` in what `annotate_codegen` prints) are interpreted recursively;
//!   tuples, tuple-get-items, constants, `R.shape([...])` (symbolic dims evaluated) and
//!   `R.prim_value(...)` make the values they spell. Every bound value is checked against its
//!   var's type, so a kernel that returns a wrong shape is caught where it happens.
//! - Each var's value is dropped right after the binding that uses it last (last uses are
//!   computed before running). Tensor data is shared, so passing values around copies no
//!   elements. The `f32` buffer of a dropped tensor nobody else holds is kept for the next
//!   convolution output on this thread, which overwrites it whole (no zeroing of fresh memory).
//! - Device values ([`Value::Device`], made by GPU artifacts through the hook) stay where they
//!   are until a CPU op needs them: an op's device arguments are downloaded then, once per var
//!   and call frame (a second CPU use of the same var reuses the host copy). Calls of module
//!   and local functions, tuples and the hook get values as they are; the result may be on a
//!   device (the caller downloads what it wants on the host, see [`Value::to_host`]).
//! - Constants are decoded once per [`Executor`] (keyed by their shared data buffer, dtype and
//!   shape) and shared by every later use and run, and so is the result of an op call whose
//!   arguments are all constants (ops are pure), and of a call of a `Primitive` function
//!   whose arguments are constants, shapes and prim values (one result per shape; up to
//!   256 MiB of them in all); [`run`] and friends use a fresh executor.
//!   A rank-2 `float32` constant that a `matmul` (or a dense composite) multiplies from the
//!   right, with 8+ rows on the left, is also packed once into the panels of
//!   `gemm_packed.rs` and kept with the executor (memory for speed, as onnxruntime's prepacking).
//! - A `conv2d` followed by an inference `batch_norm`, a per-channel `add` (+ `relu`) or a
//!   `relu`, each reading only the previous result, runs as one fused kernel when the values
//!   allow it (see `fuse.rs`); the result is bit-identical to running the bindings one
//!   by one, which is what happens otherwise.
//! - A call of a FuseOps (`Primitive`) function that the call hook left to the interpreter,
//!   whose bindings are all `float32` elementwise ops (after an optional `conv2d` or `matmul`
//!   head; layout ops and `gather_elements` of its parameters read as views), runs as one
//!   elementwise program (see `elem_program.rs`: one pass over the output
//!   in blocks, the `conv2d`'s epilogue): the same bits as the bindings one by one (a NaN is
//!   NaN there too, its payload aside), which is what runs when the values do not allow it
//!   (another dtype, shapes that do not broadcast into the result). A `conv2d` chain of
//!   `fuse.rs` that covers the whole function keeps running as that chain.
//! - A call of a function whose bindings are one such `conv2d` chain ending in its result (a
//!   FuseOps function of a convolution and its epilogue), with parameter and return types of
//!   numbers and plain symbols, runs the chain straight from the arguments when they are host
//!   tensors of those types (no frame of values, no symbol table); otherwise, or when the values
//!   do not allow the fused kernel, the function is interpreted as above. The result is the
//!   same either way, and so are the errors about arguments and kernels.
//! - What the interpreter derives from a function's IR (fused chains, drop plans, the fused
//!   kernel a composite's body is) is worked out once per executor and function.
//!   [`Executor::run_shared`] pins the first module it runs:
//!   the executor holds a reference to it, so it cannot change, and its functions' facts
//!   (`main`'s too, for runs without a call hook) are used without comparing the function
//!   again; other modules' facts serve only functions equal to the one they came from.
//! - The result is deterministic: the same module and arguments give bit-identical output.
//! - Before a kernel runs, its result's size (inferred from the arguments' actual shapes) is
//!   checked against the memory limit (`fusebox_core::runtime::memory`): a result too large is
//!   a typed error naming the op, dtype and shape, never an allocation attempt.
//! - Errors (never panics) name the function and var where they happened, innermost last.
//!
//! ```text
//! @R.function
//! def main(x: R.Tensor(("n", 16), dtype="float32"), b: R.Tensor((16,), dtype="float32")):
//!     n = T.int64()
//!     with R.dataflow():
//!         lv: R.Tensor((n, 16), dtype="float32") = R.add(x, b)
//!         gv: R.Tensor((n, 16), dtype="float32") = R.nn.relu(lv)
//!         R.output(gv)
//!     return gv
//! ```
//!
//! `run(&m, "main", vec![x, b])` with `x` of shape `(3, 16)` binds `n = 3`, runs both
//! bindings (dropping `lv` after `gv`) and returns `gv`.

use crate::fuse;
use crate::kernels::eval_op;
use crate::{Error, Result};
use fusebox_core::ir::DType;
use fusebox_core::ir::{
    Callee, Dim, ExprId, ExprKind, Function, Module, PrimValue, Sym, Type, VarId,
};
use fusebox_core::op::Op;
use fusebox_core::runtime::{Prim, Tensor, Value};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

mod fused;
mod plan;
mod types;

use plan::{Facts, MAX_FACTS, Ready, Site, Whole, calls_functions, drop_plan};
use types::{eval_dim, match_type};

/// How deep calls may nest before the executor gives up (a call cycle).
const MAX_DEPTH: usize = 256;

/// Runs function `func` of `module` on `args` and returns its result.
pub fn run(module: &Module, func: &str, args: Vec<Value>) -> Result<Value> {
    run_with(module, func, args, None)
}

/// Fails naming every constant of `module` that has no value (text read without its side file).
pub fn check_values(module: &Module) -> Result<()> {
    let missing = module.valueless_constants();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = missing.iter().map(ToString::to_string).collect();
    Err(Error::Exec(format!(
        "cannot run: {} constant{} {} no value: {} (give the side file with their values)",
        missing.len(),
        if missing.len() == 1 { "" } else { "s" },
        if missing.len() == 1 { "has" } else { "have" },
        names.join(", ")
    )))
}

/// The key of a decoded constant: its data buffer's address and length, dtype and shape.
type ConstKey = (usize, usize, DType, Vec<i64>);

/// Decoded constants by their data buffer's address and length (one buffer may back
/// constants of several dtypes or shapes). Looked up without building a [`ConstKey`]: no
/// shape is copied per lookup.
type ConstMap = HashMap<(usize, usize), Vec<Decoded>>;

/// A decoded constant: its dtype and shape, the buffer that keeps the key's address unique,
/// and the tensor.
struct Decoded {
    dtype: DType,
    shape: Vec<i64>,
    _data: Arc<[u8]>,
    tensor: Tensor,
}

impl Decoded {
    /// Whether this is constant `c`'s tensor (the same buffer is the caller's key).
    fn is(&self, c: &fusebox_core::ir::Constant) -> bool {
        self.dtype == c.dtype && self.shape == c.shape
    }
}

fn const_key(c: &fusebox_core::ir::Constant) -> ConstKey {
    (
        c.data.as_ptr() as usize,
        c.data.len(),
        c.dtype,
        c.shape.clone(),
    )
}

/// Runs functions of modules, keeping what it decoded (the constants) for later runs: create
/// one per model and reuse it, as `fusebox run --repeat` and the `cpu` backend's artifacts do.
#[derive(Default)]
pub struct Executor {
    /// Decoded constants; each entry holds its buffer, so the address stays unique.
    consts: Mutex<ConstMap>,
    /// Results of op calls whose arguments are all constants (ops are pure).
    folded: Mutex<HashMap<(Op, Vec<ConstKey>), Value>>,
    /// The bytes of the results of calls of constants kept with the functions' facts
    /// ([`Interp::call_folded`]).
    folded_bytes: std::sync::atomic::AtomicUsize,
    /// The storage addresses of the tensors in `consts` and `folded` (kept as long as the
    /// executor, so an address names one tensor).
    kept: Mutex<HashSet<usize>>,
    /// Winograd-transformed conv2d weights, by the storage address of a kept weight tensor.
    winograd: Mutex<HashMap<usize, Arc<crate::winograd::Weights>>>,
    /// Packed copies of rank-2 `float32` weights ([`crate::gemm_packed`]), by the storage
    /// address of a kept weight tensor.
    packed: Mutex<HashMap<usize, Arc<crate::gemm_packed::PackedB>>>,
    /// Transposed, packed conv2d weights ([`crate::conv::cols_weights`]), by the storage
    /// address of a kept weight tensor.
    cols: Mutex<HashMap<usize, Arc<crate::gemm_packed::PackedB>>>,
    /// conv2d weights packed for the `NCHW16c` kernel ([`crate::conv::blocked_weights`]),
    /// by the storage address of a kept weight tensor.
    blocked: Mutex<HashMap<usize, Arc<crate::conv::BlockedWeights>>>,
    /// What the interpreter works out from a function's IR on every call ([`Facts`]), by the
    /// function's address; an entry holds a copy of its function and serves only a function
    /// equal to it.
    facts: Mutex<HashMap<usize, Arc<Facts>>>,
    /// The module of the first [`Executor::run_shared`] call, kept by this executor: while it
    /// holds a reference nobody can change the module (`Arc::get_mut` fails, `make_mut`
    /// copies), so its functions' addresses name them for good.
    pinned: OnceLock<Arc<Module>>,
    /// [`Facts`] of the pinned module's functions by address, used without comparing the
    /// function (it cannot have changed); functions that call others included, derived for
    /// runs without a call hook.
    pinned_facts: Mutex<HashMap<usize, Arc<Facts>>>,
    /// Set once the pinned module's constants were found to have values ([`check_values`]).
    pinned_valued: OnceLock<()>,
}

/// Drops a value after its last use, handing the buffers of tensors nobody else holds to
/// [`crate::par::recycle`].
fn release(v: Option<Value>) {
    match v {
        Some(Value::Tensor(t)) => crate::par::recycle(t),
        Some(Value::Tuple(parts)) => parts.into_iter().for_each(|p| release(Some(p))),
        _ => {}
    }
}

/// The most bytes of results [`Interp::call_folded`] keeps per executor.
const FOLDED_BYTES: usize = 256 << 20;

/// The bytes of a value's host tensors.
fn value_bytes(v: &Value) -> usize {
    match v {
        Value::Tensor(t) => t.numel().saturating_mul(t.dtype().size_bytes()),
        Value::Tuple(parts) => parts.iter().map(value_bytes).sum(),
        _ => 0,
    }
}

/// Notes that `ex` keeps the tensors of `v` alive.
fn keep_value(ex: &Executor, v: &Value) {
    match v {
        Value::Tensor(t) => ex.keep(t),
        Value::Tuple(parts) => parts.iter().for_each(|p| keep_value(ex, p)),
        _ => {}
    }
}

/// The key of a call of `gf` with `args` (values `vals`) in a frame of symbolic dims `syms`
/// whose result [`Interp::call_folded`] keeps: `gf` is a `Primitive` function (pure, calling
/// no other) and every argument a constant, a shape or a prim value, one at least a
/// constant; `None` otherwise. The key holds the arguments and `syms`.
fn folded_key(
    f: &Function,
    args: &[ExprId],
    vals: &[Value],
    gf: &Function,
    syms: &BTreeMap<Sym, i64>,
) -> Option<Vec<plan::ArgKey>> {
    if !gf.attrs.is_primitive() || gf.attrs.composite.is_some() {
        return None;
    }
    let mut consts = 0;
    let mut key = args
        .iter()
        .zip(vals)
        .map(|(&x, v)| match (&f.exprs.get(x)?.kind, v) {
            (ExprKind::Const(c), Value::Tensor(_)) => {
                consts += 1;
                Some(plan::ArgKey::Const(const_key(c)))
            }
            (ExprKind::ShapeLit(_), Value::Shape(dims)) => Some(plan::ArgKey::Shape(dims.clone())),
            (ExprKind::Prim(_), Value::Prim(Prim::Int(i))) => Some(plan::ArgKey::Int(*i)),
            (ExprKind::Prim(_), Value::Prim(Prim::Float(x))) => {
                Some(plan::ArgKey::Float(x.to_bits()))
            }
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    if consts == 0 {
        return None;
    }
    key.push(plan::ArgKey::Syms(
        syms.iter().map(|(s, &v)| (s.clone(), v)).collect(),
    ));
    Some(key)
}

/// The address of a tensor's storage: its identity while the tensor is alive.
fn storage_addr(t: &Tensor) -> usize {
    t.storage_ptr() as usize
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self
            .consts
            .lock()
            .map_or(0, |c| c.values().map(Vec::len).sum());
        let p = self.packed.lock().map_or(0, |c| c.len());
        write!(f, "Executor {{ {n} constants, {p} packed weights }}")
    }
}

impl Executor {
    /// An executor with nothing decoded yet.
    pub fn new() -> Executor {
        Executor::default()
    }

    /// [`run_with`], keeping decoded constants in this executor.
    pub fn run(
        &self,
        module: &Module,
        func: &str,
        args: Vec<Value>,
        hook: Option<CallHook<'_>>,
    ) -> Result<Value> {
        let f = lookup(module, func)?;
        self.check_values(module)?;
        if hook.is_none() {
            // With the kernel pool's helpers awake: the kernels' parallel regions then start
            // on every thread at once (no parked worker woken per region).
            return crate::par::on_pool(|| {
                self.interp(module, None, None, false)
                    .run_main(func, f, args)
            });
        }
        self.interp(module, hook, None, false)
            .run_main(func, f, args)
    }

    /// [`Executor::run`] of a shared module. The first module run this way is pinned: the
    /// executor keeps a reference to it for its own lifetime, so it cannot change, and what
    /// the interpreter derives from its functions (fused chains, drop plans, `main`'s
    /// included) is worked out once and used without comparing the function again (each
    /// call of a function otherwise compares it with the copy its facts were derived from).
    /// Another module runs as with [`Executor::run`].
    pub fn run_shared(
        &self,
        module: &Arc<Module>,
        func: &str,
        args: Vec<Value>,
        hook: Option<CallHook<'_>>,
    ) -> Result<Value> {
        self.pin(module);
        self.run(module, func, args, hook)
    }

    /// [`Executor::run_profiled`] of a shared module, pinned as by [`Executor::run_shared`].
    pub fn run_shared_profiled(
        &self,
        module: &Arc<Module>,
        func: &str,
        args: Vec<Value>,
        hook: Option<CallHook<'_>>,
    ) -> Result<(Value, Vec<CallProfile>)> {
        self.pin(module);
        self.run_profiled(module, func, args, hook)
    }

    /// [`check_values`], once for the pinned module (it cannot change: see
    /// [`Executor::run_shared`]), every run for another (a walk over the whole module:
    /// MobileNetV2's took about 4 µs a run).
    fn check_values(&self, module: &Module) -> Result<()> {
        let pinned = self
            .pinned
            .get()
            .is_some_and(|p| std::ptr::eq(Arc::as_ptr(p), module));
        if pinned && self.pinned_valued.get().is_some() {
            return Ok(());
        }
        check_values(module)?;
        if pinned {
            let _ = self.pinned_valued.set(());
        }
        Ok(())
    }

    /// Pins `module` if no module is pinned yet (see [`Executor::run_shared`]).
    fn pin(&self, module: &Arc<Module>) {
        self.pinned.get_or_init(|| Arc::clone(module));
    }

    /// [`Executor::run`] of a partitioned module whose call hook runs only the functions
    /// `takes` names (it returns `None` for the others, which the interpreter runs): the
    /// executor's fused chains may then take in calls of the others, as without a hook.
    pub fn run_partitioned(
        &self,
        module: &Module,
        func: &str,
        args: Vec<Value>,
        hook: CallHook<'_>,
        takes: Takes<'_>,
    ) -> Result<Value> {
        let f = lookup(module, func)?;
        self.check_values(module)?;
        self.interp(module, Some(hook), Some(takes), false)
            .run_main(func, f, args)
    }

    /// An interpreter of `module` on this executor's decoded constants.
    fn interp<'m>(
        &'m self,
        module: &'m Module,
        hook: Option<CallHook<'m>>,
        takes: Option<Takes<'m>>,
        profiled: bool,
    ) -> Interp<'m> {
        Interp {
            module,
            hook,
            takes,
            profile: profiled.then(|| RefCell::new(BTreeMap::new())),
            shapes: profiled.then(|| RefCell::new(BTreeMap::new())),
            exec: self,
            pinned: self
                .pinned
                .get()
                .is_some_and(|p| std::ptr::eq(Arc::as_ptr(p), module)),
        }
    }

    /// [`run_profiled`], keeping decoded constants in this executor (calls offered to `hook`
    /// first, as in [`Executor::run`]).
    pub fn run_profiled(
        &self,
        module: &Module,
        func: &str,
        args: Vec<Value>,
        hook: Option<CallHook<'_>>,
    ) -> Result<(Value, Vec<CallProfile>)> {
        self.profiled(module, func, args, hook, None)
    }

    /// [`Executor::run_partitioned`] with the profile of [`run_profiled`].
    pub fn run_partitioned_profiled(
        &self,
        module: &Module,
        func: &str,
        args: Vec<Value>,
        hook: CallHook<'_>,
        takes: Takes<'_>,
    ) -> Result<(Value, Vec<CallProfile>)> {
        self.profiled(module, func, args, Some(hook), Some(takes))
    }

    fn profiled(
        &self,
        module: &Module,
        func: &str,
        args: Vec<Value>,
        hook: Option<CallHook<'_>>,
        takes: Option<Takes<'_>>,
    ) -> Result<(Value, Vec<CallProfile>)> {
        let f = lookup(module, func)?;
        self.check_values(module)?;
        // The run and its two tables of times, taken out of the interpreter.
        let finish = |interp: Interp<'_>, out: Result<Value>| {
            let times = interp.profile.map(RefCell::into_inner).unwrap_or_default();
            let shapes = interp.shapes.map(RefCell::into_inner).unwrap_or_default();
            out.map(|v| (v, times, shapes))
        };
        let (out, times, shapes) = if hook.is_none() && takes.is_none() {
            // With the pool's helpers awake, as [`Executor::run`]: a profiled run then
            // times the same execution as a plain one (with parked workers, each parallel
            // region waited for their wake-up: ResNet-50 45 against 42 ms per run on two
            // threads, small ops up to twice their time).
            crate::par::on_pool(|| {
                let interp = self.interp(module, None, None, true);
                let out = interp.run_main(func, f, args);
                finish(interp, out)
            })?
        } else {
            let interp = self.interp(module, hook, takes, true);
            let out = interp.run_main(func, f, args);
            finish(interp, out)?
        };
        let mut by_shape: BTreeMap<String, Vec<ShapeProfile>> = BTreeMap::new();
        for ((name, shapes), (seconds, calls)) in shapes {
            by_shape.entry(name).or_default().push(ShapeProfile {
                shapes,
                calls,
                seconds,
            });
        }
        let mut prof: Vec<CallProfile> = times
            .into_iter()
            .map(|(name, (seconds, calls))| {
                let mut by_shape = by_shape.remove(&name).unwrap_or_default();
                by_shape.sort_by(|a, b| {
                    b.seconds
                        .total_cmp(&a.seconds)
                        .then(a.shapes.cmp(&b.shapes))
                });
                CallProfile {
                    name,
                    calls,
                    seconds,
                    by_shape,
                }
            })
            .collect();
        prof.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then(a.name.cmp(&b.name)));
        Ok((out, prof))
    }

    /// The tensor of constant `c`, decoded once.
    fn constant(&self, c: &fusebox_core::ir::Constant) -> Result<Tensor> {
        let key = (c.data.as_ptr() as usize, c.data.len());
        if let Ok(map) = self.consts.lock()
            && let Some(d) = map.get(&key).and_then(|v| v.iter().find(|d| d.is(c)))
        {
            return Ok(d.tensor.clone());
        }
        let t = Tensor::from_constant(c)?;
        if let Ok(mut map) = self.consts.lock() {
            let entries = map.entry(key).or_default();
            // Another thread may have decoded it meanwhile: one tensor per constant.
            if let Some(d) = entries.iter().find(|d| d.is(c)) {
                return Ok(d.tensor.clone());
            }
            entries.push(Decoded {
                dtype: c.dtype,
                shape: c.shape.clone(),
                _data: Arc::clone(&c.data),
                tensor: t.clone(),
            });
            self.keep(&t);
        }
        Ok(t)
    }

    /// The [`Facts`] of `f`, worked out on the first call of a function and kept; `None` for
    /// a function that calls others (its callers derive what they need each time), except in
    /// the pinned module (`pinned`) on a run without a call hook (`hookless`).
    fn facts(
        &self,
        module: &Module,
        f: &Function,
        pinned: bool,
        hookless: bool,
    ) -> Option<Arc<Facts>> {
        let addr = std::ptr::from_ref(f) as usize;
        if pinned {
            if let Some(found) = self.pinned_facts.lock().ok()?.get(&addr) {
                // A function that calls others was planned for runs without a hook.
                return (hookless || !found.calls).then(|| Arc::clone(found));
            }
            if calls_functions(f) && !hookless {
                return None;
            }
            let facts = Arc::new(Facts::derive(module, f, false));
            let mut map = self.pinned_facts.lock().ok()?;
            return Some(Arc::clone(map.entry(addr).or_insert(facts)));
        }
        if let Some(found) = self.facts.lock().ok()?.get(&addr)
            && found.func.as_ref() == Some(f)
        {
            return Some(Arc::clone(found));
        }
        if calls_functions(f) {
            return None;
        }
        let facts = Arc::new(Facts::derive(module, f, true));
        let mut map = self.facts.lock().ok()?;
        if map.len() >= MAX_FACTS {
            map.clear();
        }
        map.insert(addr, Arc::clone(&facts));
        Some(facts)
    }

    /// Notes that this executor keeps `t` alive (see `kept`).
    fn keep(&self, t: &Tensor) {
        if let Ok(mut k) = self.kept.lock() {
            k.insert(storage_addr(t));
        }
    }

    /// The Winograd transform of conv2d weight `w`, computed once per kept weight tensor;
    /// `None` when the convolution has no Winograd path or `w` is not kept (a weight
    /// computed at run time is transformed by each call instead).
    fn winograd_weights(
        &self,
        x: &Tensor,
        w: &Tensor,
        attrs: &fusebox_core::op::Conv2dAttrs,
    ) -> Option<Arc<crate::winograd::Weights>> {
        self.derived(&self.winograd, w, || {
            crate::conv::winograd_weights(x, w, attrs)
        })
    }

    /// What `make` derives from the kept tensor `w`, made once and kept in `map` by `w`'s
    /// storage address; `None` when `w` is not kept (a tensor computed at run time: each call
    /// derives its own) or `make` gives nothing.
    fn derived<T>(
        &self,
        map: &Mutex<HashMap<usize, Arc<T>>>,
        w: &Tensor,
        make: impl FnOnce() -> Option<T>,
    ) -> Option<Arc<T>> {
        let addr = storage_addr(w);
        if !self.kept.lock().ok()?.contains(&addr) {
            return None;
        }
        if let Some(d) = map.lock().ok()?.get(&addr) {
            return Some(Arc::clone(d));
        }
        let d = Arc::new(make()?);
        map.lock().ok()?.insert(addr, Arc::clone(&d));
        Some(d)
    }

    /// The transposed, packed conv2d weight `w` of [`crate::conv::cols_weights`] for data
    /// `x`, made once per kept weight tensor; `None` when the convolution does not run that
    /// path, `w` is not kept (a weight computed at run time is packed by each call instead), or
    /// the copy would pass the memory limit.
    fn cols_weights(
        &self,
        x: &Tensor,
        w: &Tensor,
        attrs: &fusebox_core::op::Conv2dAttrs,
    ) -> Option<Arc<crate::gemm_packed::PackedB>> {
        self.derived(&self.cols, w, || crate::conv::cols_weights(x, w, attrs))
    }

    /// The conv2d weight `w` packed for the `NCHW16c` kernel
    /// ([`crate::conv::blocked_weights`]), made once per kept weight tensor; `None` when the
    /// convolution does not run that kernel or `w` is not kept.
    fn blocked_weights(
        &self,
        x: &Tensor,
        w: &Tensor,
        attrs: &fusebox_core::op::Conv2dAttrs,
    ) -> Option<Arc<crate::conv::BlockedWeights>> {
        self.derived(&self.blocked, w, || {
            crate::conv::blocked_weights(x, w, attrs)
        })
    }

    /// The packed copy of a rank-2 `float32` GEMM weight `w` ([`crate::gemm_packed`]) for a
    /// product with `x`, made once per kept weight tensor; `None` when `x` has fewer rows than
    /// the packed kernel takes, `w` is not kept, has another rank or dtype, or its copy would
    /// pass the memory limit (the GEMM then reads `w` itself).
    fn packed_weight(&self, x: &Tensor, w: &Tensor) -> Option<Arc<crate::gemm_packed::PackedB>> {
        let (Some(data), &[k, n]) = (w.as_f32(), w.shape()) else {
            return None;
        };
        // The rows of `x`: every dim but the last (a vector is one row).
        let rows: usize = x
            .shape()
            .split_last()
            .map_or(1, |(_, lead)| lead.iter().product());
        if rows < crate::gemm_packed::MIN_ROWS {
            return None;
        }
        self.derived(&self.packed, w, || {
            let len = crate::gemm_packed::PackedB::len_for(k, n);
            fusebox_core::runtime::memory::check_alloc("a packed weight", DType::F32, &[len])
                .ok()?;
            crate::gemm_packed::PackedB::new(data, k, n).ok()
        })
    }
}

/// `func` of `module`, or the error naming it.
fn lookup<'m>(module: &'m Module, func: &str) -> Result<&'m Function> {
    module
        .get(func)
        .ok_or_else(|| Error::Exec(format!("the module has no function `{func}`")))
}

/// Runs a call of a module function instead of the interpreter: returns `None` to let the
/// interpreter run it (the executor's hook for compiled artifacts).
pub type CallHook<'h> = &'h dyn Fn(&str, &[Value]) -> Option<fusebox_core::Result<Value>>;

/// [`run`], with calls of module functions offered to `hook` first (used to run a partitioned
/// module with each function's compiled artifact).
pub fn run_with(
    module: &Module,
    func: &str,
    args: Vec<Value>,
    hook: Option<CallHook<'_>>,
) -> Result<Value> {
    Executor::new().run(module, func, args, hook)
}

/// The time spent in calls of one module function, or of one op, during [`run_profiled`].
#[derive(Clone, Debug, PartialEq)]
pub struct CallProfile {
    /// The callee's name: a function (`fused_add_relu`), an op (`relax.nn.conv2d`), or a fused
    /// convolution chain (`relax.nn.conv2d+relax.nn.batch_norm`).
    pub name: String,
    /// How many times it was called.
    pub calls: usize,
    /// Total wall time in its calls, in seconds (inclusive of what it calls).
    pub seconds: f64,
    /// For ops, fused convolution chains and fused kernels: the same calls split by the
    /// shapes of their operands, largest time first (empty for module functions).
    pub by_shape: Vec<ShapeProfile>,
}

/// The calls of one op (or fused kernel) on operands of one set of shapes (see
/// [`CallProfile::by_shape`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ShapeProfile {
    /// The operands' shapes in order, as `(128, 768) (768, 3072)`; `_` for an operand that is
    /// not a tensor.
    pub shapes: String,
    /// How many times it was called on them.
    pub calls: usize,
    /// Total wall time in those calls, in seconds.
    pub seconds: f64,
}

/// The shapes of `vals` as [`ShapeProfile::shapes`] writes them.
fn shapes_of(vals: &[Value]) -> String {
    let parts: Vec<String> = vals
        .iter()
        .map(|v| match v {
            Value::Tensor(t) => {
                let dims: Vec<String> = t.shape().iter().map(usize::to_string).collect();
                match dims.len() {
                    1 => format!("({},)", dims[0]),
                    _ => format!("({})", dims.join(", ")),
                }
            }
            _ => "_".to_string(),
        })
        .collect();
    parts.join(" ")
}

/// [`run`], also timing every call of a module function (composites, fused functions,
/// codegen wrappers) and every op call (wherever it is: an op inside a fused function counts
/// for both) made while running; a fused chain counts under its joined name, the function
/// call it takes in included. Profiles are sorted by total time, largest first.
pub fn run_profiled(
    module: &Module,
    func: &str,
    args: Vec<Value>,
) -> Result<(Value, Vec<CallProfile>)> {
    Executor::new().run_profiled(module, func, args, None)
}

/// Per (callee, operand shapes): (seconds, calls).
type ShapeTimes = BTreeMap<(String, String), (f64, usize)>;

/// Whether the call hook takes calls of a function (see [`Executor::run_partitioned`]).
pub type Takes<'t> = &'t dyn Fn(&str) -> bool;

struct Interp<'m> {
    module: &'m Module,
    hook: Option<CallHook<'m>>,
    /// Which functions `hook` takes; `None` with a hook: any of them.
    takes: Option<Takes<'m>>,
    /// Per-callee (seconds, calls) when profiling.
    profile: Option<RefCell<BTreeMap<String, (f64, usize)>>>,
    /// Per (callee, operand shapes) (seconds, calls) when profiling, for the callees that
    /// [`Interp::record_shapes`] records.
    shapes: Option<RefCell<ShapeTimes>>,
    /// Where decoded constants live.
    exec: &'m Executor,
    /// Whether `module` is the executor's pinned one (see [`Executor::run_shared`]).
    pinned: bool,
}

/// The state of one call.
struct Frame<'f> {
    values: Vec<Option<Value>>,
    /// Host copies of device values that CPU ops have read, by var (dropped with the value).
    host: Vec<Option<Value>>,
    locals: Vec<Option<&'f Function>>,
    syms: BTreeMap<Sym, i64>,
}

/// Stores `v` as the value of `var` of `f` in `fr` once it matches the var's type (binding the
/// type's symbols); the error names the binding.
fn store<'f>(name: &str, f: &'f Function, fr: &mut Frame<'f>, var: VarId, v: Value) -> Result<()> {
    let data = f.var(var);
    for bind in [true, false] {
        match_type(&data.ty, &v, &mut fr.syms, bind).map_err(|m| {
            at(
                &binding_ctx(name, data),
                Error::Exec(format!("the value does not match the type: {m}")),
            )
        })?;
    }
    fr.values[var.as_u32() as usize] = Some(v);
    Ok(())
}

/// `function/var` of a binding, and where it came from when that is another name (the user's
/// binding a pass renamed, or the ONNX node it was lowered from).
fn binding_ctx(func: &str, var: &fusebox_core::ir::VarData) -> String {
    let here = format!("{func}/{}", var.name);
    match var.origin.first() {
        Some(o) if o != here => format!("{here} (from {o})"),
        _ => here,
    }
}

fn at(ctx: &str, e: Error) -> Error {
    Error::At {
        at: ctx.to_string(),
        source: Box::new(e),
    }
}

impl<'m> Interp<'m> {
    /// Runs `f` as the entry function: [`Interp::call`] at depth 0, its result's tensors
    /// then cut down to their own elements where they sit in a much longer kept buffer
    /// ([`crate::par::compact`]): what a caller keeps holds no one else's memory.
    fn run_main(&self, name: &str, f: &Function, args: Vec<Value>) -> Result<Value> {
        self.call(name, f, args, 0, &BTreeMap::new(), None)
            .map(crate::par::compact)
    }

    /// Runs `f` on `args`. Symbolic dims are bound from the parameters; a symbol the parameters
    /// leave unbound (a shape literal inside an outlined group, e.g. `R.shape([batch, 4])` in a
    /// FuseOps function whose params do not mention `batch`) takes the caller's value (`outer`).
    /// A call at `site` (a resolved [`Site`] of the caller) takes the callee's facts, and the
    /// epilogue prepared for its chain, from there.
    fn call(
        &self,
        name: &str,
        f: &Function,
        args: Vec<Value>,
        depth: usize,
        outer: &BTreeMap<Sym, i64>,
        site: Option<&Site>,
    ) -> Result<Value> {
        if depth > MAX_DEPTH {
            return Err(Error::Exec(format!(
                "calls nest deeper than {MAX_DEPTH} at `{name}`: is there a call cycle?"
            )));
        }
        if args.len() != f.params.len() {
            return Err(Error::Exec(format!(
                "`{name}` takes {} arguments, found {}",
                f.params.len(),
                args.len()
            )));
        }
        if f.attrs.composite.is_some() {
            // At a resolved call site the callee's plan comes with its facts.
            let known = site
                .and_then(|s| s.facts.as_deref())
                .and_then(|d| d.composite.as_ref());
            if let Some(v) = self.run_composite(name, f, &args, known)? {
                return Ok(v);
            }
        }
        // At a resolved call site the callee's facts come with it.
        let facts = match site {
            Some(s) => s.facts.clone(),
            None => self
                .exec
                .facts(self.module, f, self.pinned, self.hook.is_none()),
        };
        if f.attrs.is_primitive()
            && let Some(v) = self.run_elem_group(name, f, &args, facts.as_deref())?
        {
            return Ok(v);
        }
        if let Some(whole) = facts.as_ref().and_then(|d| d.whole.as_ref())
            && let Some(v) = self.run_whole(name, f, whole, &args, site)?
        {
            args.into_iter().for_each(|a| release(Some(a)));
            return Ok(v);
        }
        let mut fr = Frame {
            values: vec![None; f.vars.len()],
            host: vec![None; f.vars.len()],
            locals: vec![None; f.vars.len()],
            syms: BTreeMap::new(),
        };
        // Bind plain symbolic dims first, then check every dim (expressions included).
        for bind in [true, false] {
            for (&p, a) in f.params.iter().zip(&args) {
                let var = f.var(p);
                match_type(&var.ty, a, &mut fr.syms, bind)
                    .map_err(|m| Error::Exec(format!("`{name}`: argument `{}`: {m}", var.name)))?;
            }
        }
        for (s, &v) in outer {
            fr.syms.entry(s.clone()).or_insert(v);
        }
        let derived;
        let (plan, unused, chains) = match facts.as_deref() {
            Some(d) => (&d.drops.0, &d.drops.1, &d.chains),
            None => {
                // A chain may take in a call only of a function the hook leaves to the
                // interpreter.
                let hooked = |g: &str| self.hook.is_some() && self.takes.is_none_or(|t| t(g));
                let (plan, unused) = drop_plan(f);
                derived = (
                    plan,
                    unused,
                    fuse::plan(self.module, f, &|g: &str| !hooked(g)),
                );
                (&derived.0, &derived.1, &derived.2)
            }
        };
        for ((&p, a), &unused) in f.params.iter().zip(args).zip(unused) {
            if !unused {
                fr.values[p.as_u32() as usize] = Some(a);
            }
        }
        let bindings: Vec<_> = f.bindings().copied().collect();
        let mut skip = 0;
        for (i, b) in bindings.iter().enumerate() {
            if skip > 0 {
                skip -= 1;
                continue;
            }
            if let Some(Some(chain)) = chains.get(i) {
                let fused = self
                    .run_chain(name, f, &mut fr, chain, depth)
                    .map_err(|e| at(&binding_ctx(name, f.var(b.var)), e))?;
                if let Some(v) = fused {
                    let n = chain.links.len();
                    store(name, f, &mut fr, bindings[i + n].var, v)?;
                    for j in i..=i + n {
                        for d in plan.get(j).into_iter().flatten() {
                            release(fr.values[d.as_u32() as usize].take());
                        }
                    }
                    skip = n;
                    continue;
                }
            }
            // A call site of the pinned module without a hook: its lookups resolved once.
            let site = match facts.as_deref() {
                Some(d) if self.pinned && self.hook.is_none() => d
                    .sites
                    .get(i)
                    .and_then(|s| s.get_or_init(|| self.site(f, b)).as_ref()),
                _ => None,
            };
            match site {
                Some(site) => self.run_site(name, f, &mut fr, b, site, depth)?,
                None => self.run_binding(name, f, &mut fr, b, depth)?,
            }
            for d in plan.get(i).into_iter().flatten() {
                release(fr.values[d.as_u32() as usize].take());
                fr.host[d.as_u32() as usize] = None;
            }
        }
        let ret = f
            .ret
            .ok_or_else(|| Error::Exec(format!("`{name}` has no return value")))?;
        let out = self
            .eval(name, f, &mut fr, ret, depth)
            .map_err(|e| at(&format!("{name}/return"), e))?;
        match_type(&f.ret_ty, &out, &mut fr.syms, false).map_err(|m| {
            Error::Exec(format!(
                "`{name}`: the result does not match the return type: {m}"
            ))
        })?;
        Ok(out)
    }

    /// The [`Site`] of binding `b` of `f`: `None` unless it calls a module function with vars
    /// and constants only (not a `Primitive` function with constants only), and every
    /// constant decodes.
    fn site(&self, f: &Function, b: &fusebox_core::ir::Binding) -> Option<Site> {
        let ExprKind::Call {
            callee: Callee::Global(g),
            args,
        } = &f.exprs.get(b.value)?.kind
        else {
            return None;
        };
        let (callee, _, gf) = self.module.functions.get_full(&g[..])?;
        let consts = args
            .iter()
            .map(|&x| match &f.exprs.get(x)?.kind {
                ExprKind::Var(_) => Some(None),
                ExprKind::Const(c) => self.exec.constant(c).ok().map(Some),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        // A `Primitive` call of constants only runs once (`call_folded`, reached through
        // `eval`): no site.
        if gf.attrs.is_primitive()
            && gf.attrs.composite.is_none()
            && consts.iter().all(Option::is_some)
        {
            return None;
        }
        Some(Site {
            callee,
            facts: self.exec.facts(self.module, gf, self.pinned, true),
            consts,
            ready: OnceLock::new(),
        })
    }

    /// [`Interp::run_binding`] of a call at a resolved [`Site`]: the same call (the hook is
    /// absent) with the callee, its facts and the constant arguments taken from the site.
    fn run_site<'f>(
        &self,
        name: &str,
        f: &'f Function,
        fr: &mut Frame<'f>,
        b: &fusebox_core::ir::Binding,
        site: &Site,
        depth: usize,
    ) -> Result<()> {
        let var = f.var(b.var);
        let ctx = || binding_ctx(name, var);
        let (ExprKind::Call { args, .. }, Some((g, gf))) = (
            &f.expr(b.value).kind,
            self.module.functions.get_index(site.callee),
        ) else {
            return self.run_binding(name, f, fr, b, depth);
        };
        let mut vals = Vec::with_capacity(args.len());
        for (&x, c) in args.iter().zip(&site.consts) {
            vals.push(match c {
                Some(t) => Value::Tensor(t.clone()),
                None => self
                    .eval(name, f, fr, x, depth)
                    .map_err(|e| at(&ctx(), e))?,
            });
        }
        let t = self.profile.as_ref().map(|_| std::time::Instant::now());
        let v = self
            .call(g, gf, vals, depth + 1, &fr.syms, Some(site))
            .map_err(|e| at(&ctx(), e))?;
        self.record(g, t);
        store(name, f, fr, b.var, v)
    }

    /// Runs one binding: its value is stored in the frame (a local function is kept to call).
    fn run_binding<'f>(
        &self,
        name: &str,
        f: &'f Function,
        fr: &mut Frame<'f>,
        b: &fusebox_core::ir::Binding,
        depth: usize,
    ) -> Result<()> {
        let var = f.var(b.var);
        let ctx = || binding_ctx(name, var);
        match &f.expr(b.value).kind {
            ExprKind::Function(inner) => {
                fr.locals[b.var.as_u32() as usize] = Some(inner);
            }
            _ => {
                let v = self
                    .eval(name, f, fr, b.value, depth)
                    .map_err(|e| at(&ctx(), e))?;
                store(name, f, fr, b.var, v)?;
            }
        }
        Ok(())
    }

    /// Runs the branch of an `if` its condition selects (only that one) and returns its body.
    fn run_if<'f>(
        &self,
        name: &str,
        f: &'f Function,
        fr: &mut Frame<'f>,
        i: &'f fusebox_core::ir::IfExpr,
        depth: usize,
    ) -> Result<Value> {
        let taken = match self.eval_host(name, f, fr, i.cond, depth)? {
            Value::Tensor(t) if t.numel() == 1 => t.to_f64_vec().first().is_some_and(|&x| x != 0.0),
            Value::Tensor(t) => {
                return Err(Error::Exec(format!(
                    "the condition of `if` must be a scalar, found a tensor of shape {:?}",
                    t.shape()
                )));
            }
            Value::Prim(p) => p.as_f64() != 0.0,
            v => {
                return Err(Error::Exec(format!(
                    "the condition of `if` must be a bool scalar, found {}",
                    v.kind()
                )));
            }
        };
        let s = if taken {
            &i.then_branch
        } else {
            &i.else_branch
        };
        for b in s.bindings() {
            self.run_binding(name, f, fr, b, depth)?;
        }
        self.eval(name, f, fr, s.body, depth)
    }

    /// [`Interp::record`], and the same time to the entry of `name` on operands of the shapes
    /// of `vals`.
    fn record_shapes(&self, name: &str, vals: &[Value], t: Option<std::time::Instant>) {
        let Some(t) = t else { return };
        let dt = t.elapsed().as_secs_f64();
        if let Some(p) = &self.shapes {
            let mut p = p.borrow_mut();
            let e = p
                .entry((name.to_string(), shapes_of(vals)))
                .or_insert((0.0, 0));
            e.0 += dt;
            e.1 += 1;
        }
        self.record_seconds(name, dt);
    }

    /// Adds the time since `t` to `name`'s profile entry (when profiling).
    fn record(&self, name: &str, t: Option<std::time::Instant>) {
        if let Some(t) = t {
            self.record_seconds(name, t.elapsed().as_secs_f64());
        }
    }

    /// Adds `dt` seconds and a call to `name`'s profile entry (when profiling).
    fn record_seconds(&self, name: &str, dt: f64) {
        if let Some(p) = &self.profile {
            let mut p = p.borrow_mut();
            let e = p.entry(name.to_string()).or_insert((0.0, 0));
            e.0 += dt;
            e.1 += 1;
        }
    }

    /// An op's kernel on its values: a `matmul` of a kept constant weight through the weight's
    /// packed copy ([`crate::gemm_packed`]), every other op through [`eval_op`].
    fn run_op(&self, op: &Op, vals: &[Value]) -> Result<Value> {
        if let (Op::Matmul { .. }, [Value::Tensor(a), Value::Tensor(b)]) = (op, vals)
            && let Some(p) = self.exec.packed_weight(a, b)
        {
            return crate::kernels::eval_op_packed(op, vals, Some(&p));
        }
        eval_op(op, vals)
    }

    /// An op call on its evaluated arguments; an op of constants only (a transposed weight,
    /// say) runs once per executor.
    fn eval_op_call(
        &self,
        f: &Function,
        op: &Op,
        args: &[ExprId],
        vals: &[Value],
    ) -> Result<Value> {
        let consts: Option<Vec<ConstKey>> = args
            .iter()
            .map(|&x| match f.exprs.get(x).map(|d| &d.kind) {
                Some(ExprKind::Const(c)) => Some(const_key(c)),
                _ => None,
            })
            .collect();
        let Some(keys) = consts.filter(|k| !k.is_empty()) else {
            return self.run_op(op, vals);
        };
        let key = (op.clone(), keys);
        if let Some(v) = self
            .exec
            .folded
            .lock()
            .ok()
            .and_then(|m| m.get(&key).cloned())
        {
            return Ok(v);
        }
        let v = self.run_op(op, vals)?;
        if let Ok(mut m) = self.exec.folded.lock() {
            m.insert(key, v.clone());
            if let Value::Tensor(t) = &v {
                self.exec.keep(t);
            }
        }
        Ok(v)
    }

    /// A call of `Primitive` function `gf` whose arguments are all constants, shapes and
    /// prim values (`key`, see [`folded_key`]): the function is pure, so its result is
    /// computed once per executor and kept with the function's facts (the position
    /// embeddings DeBERTa transposes per layer, for a batch size known only at run time).
    /// Results are kept up to [`FOLDED_BYTES`] in all; past that, such calls run each time.
    fn call_folded(
        &self,
        g: &str,
        gf: &Function,
        key: Vec<plan::ArgKey>,
        vals: Vec<Value>,
        depth: usize,
        syms: &BTreeMap<Sym, i64>,
    ) -> Result<Value> {
        let facts = self
            .exec
            .facts(self.module, gf, self.pinned, self.hook.is_none());
        let Some(facts) = facts else {
            return self.call(g, gf, vals, depth + 1, syms, None);
        };
        if let Some(v) = facts
            .folded
            .lock()
            .ok()
            .and_then(|m| m.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone()))
        {
            return Ok(v);
        }
        let v = self.call(g, gf, vals, depth + 1, syms, None)?;
        let bytes = value_bytes(&v);
        let fits = self
            .exec
            .folded_bytes
            .fetch_update(
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
                |used| used.checked_add(bytes).filter(|&u| u <= FOLDED_BYTES),
            )
            .is_ok();
        if fits && let Ok(mut m) = facts.folded.lock() {
            keep_value(self.exec, &v);
            m.push((key, v.clone()));
        }
        Ok(v)
    }

    fn eval<'f>(
        &self,
        name: &str,
        f: &'f Function,
        fr: &mut Frame<'f>,
        e: ExprId,
        depth: usize,
    ) -> Result<Value> {
        let d = f
            .exprs
            .get(e)
            .ok_or_else(|| Error::Exec(format!("`{name}`: dangling expression {e}")))?;
        Ok(match &d.kind {
            ExprKind::Var(v) => fr
                .values
                .get(v.as_u32() as usize)
                .cloned()
                .flatten()
                .ok_or_else(|| {
                    Error::Exec(format!(
                        "`{name}`: var `{}` has no value here",
                        f.vars.get(*v).map_or("?", |x| x.name.as_str())
                    ))
                })?,
            ExprKind::Const(c) => Value::Tensor(self.exec.constant(c)?),
            ExprKind::ConstRef(c) => {
                return Err(Error::Exec(format!(
                    "`{name}`: constant {c} has no value (the text was read without its side file)"
                )));
            }
            ExprKind::Tuple(fields) => Value::Tuple(
                fields
                    .iter()
                    .map(|&x| self.eval(name, f, fr, x, depth))
                    .collect::<Result<_>>()?,
            ),
            ExprKind::TupleGetItem(t, i) => match self.eval(name, f, fr, *t, depth)? {
                Value::Tuple(mut items) => {
                    let i = *i as usize;
                    if i >= items.len() {
                        return Err(Error::Exec(format!(
                            "tuple index {i} is out of range for a tuple of {}",
                            items.len()
                        )));
                    }
                    items.swap_remove(i)
                }
                v => {
                    return Err(Error::Exec(format!(
                        "expected a tuple to index, found {}",
                        v.kind()
                    )));
                }
            },
            ExprKind::ShapeLit(dims) => Value::Shape(
                dims.iter()
                    .map(|d| eval_dim(d, &fr.syms))
                    .collect::<Result<_>>()?,
            ),
            ExprKind::Prim(p) => match p {
                PrimValue::Int(i) => Value::Prim(Prim::Int(*i)),
                PrimValue::Float(x, _) => Value::Prim(Prim::Float(*x)),
                PrimValue::Str(s) => {
                    return Err(Error::Exec(format!(
                        "string values (R.str({s:?})) have no run-time form"
                    )));
                }
                PrimValue::Bool(b) => Value::Prim(Prim::Int(i64::from(*b))),
            },
            ExprKind::If(i) => self.run_if(name, f, fr, i, depth)?,
            ExprKind::Call { callee, args } => {
                // An op reads host values (device values are downloaded once per var); a
                // function call passes values as they are (the hook decides).
                let vals: Vec<Value> = args
                    .iter()
                    .map(|&x| match callee {
                        Callee::Op(_) => self.eval_host(name, f, fr, x, depth),
                        _ => self.eval(name, f, fr, x, depth),
                    })
                    .collect::<Result<_>>()?;
                match callee {
                    Callee::Op(op) => {
                        let t = self.profile.as_ref().map(|_| std::time::Instant::now());
                        let v = self.eval_op_call(f, op, args, &vals)?;
                        self.record_shapes(op.name(), &vals, t);
                        v
                    }
                    Callee::Global(g) => {
                        let t = self.profile.as_ref().map(|_| std::time::Instant::now());
                        let v = match self.hook.and_then(|h| h(g, &vals)) {
                            Some(r) => r?,
                            None => {
                                let gf = self.module.get(g).ok_or_else(|| {
                                    Error::Exec(format!("the module has no function `{g}`"))
                                })?;
                                match folded_key(f, args, &vals, gf, &fr.syms) {
                                    Some(key) => {
                                        self.call_folded(g, gf, key, vals, depth, &fr.syms)?
                                    }
                                    None => self.call(g, gf, vals, depth + 1, &fr.syms, None)?,
                                }
                            }
                        };
                        self.record(g, t);
                        v
                    }
                    Callee::Local(v) => {
                        let lf = fr.locals.get(v.as_u32() as usize).copied().flatten();
                        let vname = f.vars.get(*v).map_or("?", |x| x.name.as_str());
                        let lf = lf.ok_or_else(|| {
                            Error::Exec(format!("`{vname}` is not a local function here"))
                        })?;
                        self.call(vname, lf, vals, depth + 1, &fr.syms, None)?
                    }
                }
            }
            ExprKind::Function(_) => {
                return Err(Error::Exec(
                    "a function is used as a value; only calls of it can run".to_string(),
                ));
            }
        })
    }
}

impl Interp<'_> {
    /// [`Interp::eval`] for a CPU op's argument: the value on the host. A var's device value is
    /// downloaded once per frame and the host copy kept with it.
    fn eval_host<'f>(
        &self,
        name: &str,
        f: &'f Function,
        fr: &mut Frame<'f>,
        e: ExprId,
        depth: usize,
    ) -> Result<Value> {
        if let Some(ExprKind::Var(v)) = f.exprs.get(e).map(|d| &d.kind) {
            let i = v.as_u32() as usize;
            if let Some(h) = fr.host.get(i).cloned().flatten() {
                return Ok(h);
            }
            let val = self.eval(name, f, fr, e, depth)?;
            if !val.is_on_device() {
                return Ok(val);
            }
            let h = val.to_host()?;
            if let Some(slot) = fr.host.get_mut(i) {
                *slot = Some(h.clone());
            }
            return Ok(h);
        }
        Ok(self.eval(name, f, fr, e, depth)?.to_host()?)
    }
}

#[cfg(test)]
mod tests;
