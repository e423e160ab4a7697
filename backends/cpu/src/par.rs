//! How many threads the CPU kernels use, and the scoped-thread helper that spreads a kernel's
//! independent pieces of work over them.
//!
//! Contract:
//!
//! - [`threads`] is the thread count a kernel may use: a scoped override ([`with_threads`],
//!   this thread only), else the process-wide setting ([`set_threads`]; the `cpu` backend's
//!   `threads` option sets it), else `FUSEBOX_THREADS` (read once; a value that is not an
//!   integer in `1..=`[`MAX_THREADS`] is ignored here and reported by [`env_threads`]), else
//!   `std::thread::available_parallelism()` capped at [`DEFAULT_MAX_THREADS`].
//! - Kernels split work across independent outputs (output rows, columns, channels,
//!   element ranges), or across a reduction only in chunks fixed by the shape whose partial
//!   results are added in chunk order (the vector-matrix product), and every output is
//!   computed by the same arithmetic whichever thread computes it: results are bit-identical
//!   for every thread count (asserted by `backends/cpu/tests/threads.rs`).
//! - `run_tasks` runs a list of tasks on `n` threads, the calling thread and `n − 1` helpers
//!   of a kept rayon pool: each thread a run of consecutive tasks in order, then what is
//!   left of the others', one task at a time. It returns the error of the first failing task
//!   in task order. With one thread or one task it runs them in order on the calling thread.
//! - The calling thread is worker 0 of a pool of its own (`own_pool`, made on its first
//!   region), so a helper's share that no helper has started by the time the calling thread
//!   is done is run by the calling thread rather than waited for, and the executor keeps the
//!   helpers awake while it runs without ever waiting for them (`on_pool`): a helper the OS
//!   has descheduled (a busy neighbour process) delays a region only by a task it started.
//!   A thread that cannot have one (already a worker of another pool, or its pool has
//!   another size) shares a pool of `n − 1` helpers per thread count instead.
//!
//! ```
//! // The thread count of this thread's kernels, for the duration of the closure:
//! let n = fusebox_cpu::par::with_threads(3, fusebox_cpu::par::threads);
//! assert_eq!(n, 3);
//! ```

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::LocalKey;

/// Runs `f` with the calling thread's scratch value in `key` (a kernel's buffer kept between
/// calls): taken out for the call and put back after, so the buffer keeps its capacity and
/// a nested use on the same thread starts from `T::default()` instead of a borrow error.
pub(crate) fn with_scratch<T: Default + 'static, R>(
    key: &'static LocalKey<RefCell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    let mut v = key.with(|c| std::mem::take(&mut *c.borrow_mut()));
    let r = f(&mut v);
    key.with(|c| *c.borrow_mut() = v);
    r
}

/// The most threads a setting may ask for.
pub const MAX_THREADS: usize = 256;

/// The cap on the default thread count (`available_parallelism`): memory-bound kernels stop
/// scaling well before this, and each kernel call spawns its threads afresh.
pub const DEFAULT_MAX_THREADS: usize = 8;

/// The environment variable that sets the default thread count.
pub const ENV_VAR: &str = "FUSEBOX_THREADS";

/// The process-wide setting (0: none).
static GLOBAL: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's override (0: none).
    static LOCAL: Cell<usize> = const { Cell::new(0) };
}

/// Parses a thread count: an integer in `1..=MAX_THREADS`.
pub fn parse_threads(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a thread count from 1 to {MAX_THREADS}, found `{s}`"
        )),
    }
}

/// `FUSEBOX_THREADS`: `Ok(None)` when unset, an error naming the variable when it is not a
/// valid thread count.
pub fn env_threads() -> Result<Option<usize>, String> {
    match std::env::var(ENV_VAR) {
        Ok(s) => parse_threads(&s)
            .map(Some)
            .map_err(|e| format!("{ENV_VAR}: {e}")),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!(
            "{ENV_VAR}: expected a thread count, found non-UTF-8 text"
        )),
    }
}

/// The default: `FUSEBOX_THREADS`, else the available parallelism capped at
/// [`DEFAULT_MAX_THREADS`].
fn default_threads() -> usize {
    static DEFAULT: OnceLock<usize> = OnceLock::new();
    *DEFAULT.get_or_init(|| match env_threads() {
        Ok(Some(n)) => n,
        _ => std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(DEFAULT_MAX_THREADS),
    })
}

/// The thread count the kernels called from this thread use (see the module doc).
pub fn threads() -> usize {
    let local = LOCAL.with(Cell::get);
    if local > 0 {
        return local;
    }
    match GLOBAL.load(Ordering::Relaxed) {
        0 => default_threads(),
        n => n,
    }
}

/// Sets (or with `None` clears) the process-wide thread count; clamped to `1..=MAX_THREADS`.
pub fn set_threads(n: Option<usize>) {
    GLOBAL.store(n.map_or(0, |n| n.clamp(1, MAX_THREADS)), Ordering::Relaxed);
}

/// Runs `f` with this thread's kernels using `n` threads (clamped to `1..=MAX_THREADS`), then
/// restores the previous override.
pub fn with_threads<R>(n: usize, f: impl FnOnce() -> R) -> R {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            LOCAL.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(LOCAL.with(|c| c.replace(n.clamp(1, MAX_THREADS))));
    f()
}

/// The shared pool of `n − 1` workers that help a thread with no pool of its own
/// ([`own_pool`]) in a region of `n` threads (made on first use, one per thread count), or
/// `None` for one thread or when no pool can be made.
fn helpers(n: usize) -> Option<Arc<rayon::ThreadPool>> {
    static POOLS: Mutex<BTreeMap<usize, Arc<rayon::ThreadPool>>> = Mutex::new(BTreeMap::new());
    if n < 2 {
        return None;
    }
    let mut pools = POOLS.lock().ok()?;
    if let Some(p) = pools.get(&n) {
        return Some(Arc::clone(p));
    }
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(n - 1)
        .thread_name(|i| format!("fusebox-cpu-{}", i + 1))
        .build()
        .ok()?;
    let p = Arc::new(p);
    pools.insert(n, Arc::clone(&p));
    Some(p)
}

thread_local! {
    /// The pool this thread is worker 0 of ([`own_pool`]), once made.
    static OWN: RefCell<Option<Arc<rayon::ThreadPool>>> = const { RefCell::new(None) };
}

/// Makes the calling thread worker 0 of a pool of its own of `n` threads (rayon's
/// `use_current_thread`: `n − 1` helpers are started, the calling thread is the first) on its
/// first call with `n ≥ 2`; returns whether this thread is now worker 0 of its own pool of at
/// least `n` threads. A thread that is already a worker of some pool (a helper, or a thread
/// of the caller's own rayon pool) gets none; a thread's pool keeps the size it was made
/// with (rayon cannot take a thread back out of a pool), so a later, larger `n` gets `false`.
///
/// Why: a region's jobs then go to this thread's own queue ([`run_tasks`]), so a job no
/// helper has started when this thread's own tasks are done is run here, where it finds no
/// task left, instead of waited for; and the helpers are kept awake by jobs that own
/// nothing of the caller's ([`on_pool`]), so no run waits for them at its end. Waited for,
/// a helper that had given its core to another process held the region up until the OS ran
/// it again, a time slice of milliseconds: beside one busy process on a 2-core VM, a small
/// GPT-2 took 4–12 ms a run instead of 0.3–0.4 in 1 of 20 to 4 of 8 processes
/// (bench/RESULTS.md, session by).
fn own_pool(n: usize) -> bool {
    if n < 2 {
        return false;
    }
    OWN.with(|own| {
        let mut own = own.borrow_mut();
        if own.is_none() && rayon::current_thread_index().is_none() {
            *own = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .use_current_thread()
                .thread_name(|i| format!("fusebox-cpu-{i}"))
                .build()
                .ok()
                .map(Arc::new);
        }
        // (Built on this thread with `use_current_thread`: this thread is its worker 0.)
        own.as_ref().is_some_and(|p| p.current_num_threads() >= n)
    })
}

/// Runs `f` here with this thread's kernel thread count set to [`threads`], while the
/// helpers of this thread's own pool ([`own_pool`]) stay awake: a parallel region `f` opens
/// then starts on every thread at once instead of waiting for parked workers to be woken
/// (tens of microseconds each on a VM, for each of a ResNet-50's ~150 regions), as
/// onnxruntime's spinning intra-op threads do. Each helper spins in a job of its own that
/// holds only a flag ([`wait_awake`] until `f` has returned), so the run does not wait for
/// them at its end. `f` runs on the calling thread itself (rather than handed to a pool
/// worker, the calling thread asleep until it ends): on two threads, a one-op model's
/// `fusebox.Session.run` took 14 µs that way against 2 on one thread, and 81 µs after 2 ms
/// idle against 19 (bench/RESULTS.md, session ba). With one thread, or where this thread can
/// have no pool of its own of at least that size, `f` runs here with the helpers parked.
pub(crate) fn on_pool<R>(f: impl FnOnce() -> R) -> R {
    let n = threads();
    if !own_pool(n) {
        return with_threads(n, f);
    }
    let done = Arc::new(AtomicBool::new(false));
    // Set on the way out, a panic included, so the spinning helpers always stop.
    struct Done(Arc<AtomicBool>);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let stop = Done(Arc::clone(&done));
    rayon::spawn_broadcast(move |ctx| {
        // Worker 0 is this thread: its part runs when it next yields (and returns at once).
        if ctx.index() != 0 {
            wait_awake(|| done.load(Ordering::Acquire));
        }
    });
    let out = with_threads(n, f);
    drop(stop);
    // This thread's own part of the broadcast, if `f` never yielded: run (a no-op) now, so
    // that such parts do not pile up in its queue run after run.
    while rayon::yield_local() == Some(rayon::Yield::Executed) {}
    out
}

/// Waits until `ready()` without parking this thread: it runs the pool's pending tasks as
/// they appear (`rayon::yield_now` steals one); between them it spins for its first
/// [`SPINS`] idle rounds, then offers its core to other runnable threads
/// (`std::thread::yield_now`) on each round.
fn wait_awake(ready: impl Fn() -> bool) {
    let mut idle = 0;
    while !ready() {
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            if idle < SPINS {
                idle += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Idle rounds [`wait_awake`] spins before it yields its core. Yielding at once handed the
/// core away for a whole time slice whenever another process was runnable on it: the
/// calling thread lost it just as the helper's last task ended, and a helper lost it just
/// before the next region. Beside one busy process on the 2-vCPU Zen 5 VM (5 processes each,
/// 2 threads), BERT-base took 91–101 ms a run against 111–169 when yielding at once, GPT-2
/// 128–131 against 144–199, MobileNetV2 3.5–4.9 against 4.0–4.7, ResNet-50 the same (32–41);
/// on a quiet machine the same within noise (bench/RESULTS.md, session by). Past them the
/// thread yields on each round, so that more threads than cores still make progress.
const SPINS: u32 = 2000;

/// Runs `f` on every task, on up to `n` threads of a kept worker pool. Returns the error of
/// the first failing task in task order (every task runs). With one thread or one task, or
/// when no pool can be made, the tasks run in order on the calling thread.
///
/// The tasks are cut into `n` runs of consecutive tasks, one per thread, each run in order
/// from its front (so a kernel's neighbouring tasks, which share data or prefetch for the
/// next, stay on one core); a thread whose run is done takes the rest of the others' runs,
/// one task at a time from their fronts. Which thread runs a task never changes what it
/// computes. The calling thread waits for the others' last tasks awake ([`wait_awake`]):
/// rayon's own wait (a `par_iter`, used here before) parks a thread after a
/// few dozen idle rounds, and waking it again cost tens of microseconds on the VM measured.
/// MobileNetV2 on two threads (bench/RESULTS.md, session az): of its ~51 parallel regions
/// per inference, the time from a region's last task to its end summed to 0.19 ms (mean 3.7
/// µs a region, median 0.6: the parked waits).
pub(crate) fn run_tasks<T, E, F>(tasks: Vec<T>, n: usize, f: F) -> Result<(), E>
where
    T: Send,
    E: Send,
    F: Fn(T) -> Result<(), E> + Sync,
{
    let n = n.clamp(1, tasks.len().max(1));
    if n < 2 {
        return tasks.into_iter().try_for_each(f);
    }
    own_pool(threads().max(n));
    // A worker of a pool with the threads (this thread's own, or a helper in a nested
    // region): the jobs go to this thread's own queue. Else the shared helpers, injected.
    let local = rayon::current_thread_index().is_some() && rayon::current_num_threads() >= n;
    let shared = if local {
        None
    } else {
        let Some(pool) = helpers(n) else {
            return tasks.into_iter().try_for_each(f);
        };
        Some(pool)
    };
    let total = tasks.len();
    let slots: Vec<Mutex<Option<T>>> = tasks.into_iter().map(|t| Mutex::new(Some(t))).collect();
    // Run `r` is tasks `bounds[r]..bounds[r + 1]`; `next[r]` its first task not yet taken.
    let bounds = run_bounds(total, n);
    let next: Vec<AtomicUsize> = bounds[..n].iter().map(|&b| AtomicUsize::new(b)).collect();
    // Helpers' jobs that have returned: once all have, after this thread's own `work`, every
    // task has ended (a task is taken by one `work`, which returns after it, or unwinds
    // from its panic; what a helper left untaken this thread's `work` takes). Waited for
    // awake: the scope's end would wait for them asleep.
    let returned = AtomicUsize::new(0);
    let failed: Mutex<Option<(usize, E)>> = Mutex::new(None);
    let work = |own: usize| {
        for r in (0..n).map(|k| (own + k) % n) {
            loop {
                let i = next[r].fetch_add(1, Ordering::Relaxed);
                if i >= bounds[r + 1] {
                    break;
                }
                let task = slots[i]
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
                if let Some(Err(e)) = task.map(&f) {
                    let mut first = failed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if first.as_ref().is_none_or(|(j, _)| i < *j) {
                        *first = Some((i, e));
                    }
                }
            }
        }
    };
    // Run 0 on this thread, the others on the helpers (awake inside [`on_pool`]). From a
    // worker, a job no helper has taken by the end of this thread's `work` is popped from its
    // own queue by `wait_awake` and run here (it finds no task left): only jobs a helper has
    // started are waited for.
    match shared {
        Some(pool) => pool.in_place_scope(|s| spread(s, n, &work, &returned)),
        None => rayon::in_place_scope(|s| spread(s, n, &work, &returned)),
    }
    let failed = failed
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    failed.map_or(Ok(()), |(_, e)| Err(e))
}

/// [`run_tasks`]' region in scope `s`: `work(r)` of runs `1..n` spawned, run 0 here, then
/// the helpers' jobs waited for awake (`returned` counts those that have returned).
fn spread<'s>(
    s: &rayon::Scope<'s>,
    n: usize,
    work: &'s (dyn Fn(usize) + Sync),
    returned: &'s AtomicUsize,
) {
    for r in 1..n {
        s.spawn(move |_| {
            let _back = Finish(returned);
            work(r);
        });
    }
    work(0);
    wait_awake(|| returned.load(Ordering::Acquire) == n - 1);
}

/// Where [`run_tasks`] cuts `total` tasks into runs for `n` threads (clamped to 1..=`total`):
/// run `r` is tasks `bounds[r]..bounds[r + 1]`, one run per thread.
pub(crate) fn run_bounds(total: usize, n: usize) -> Vec<usize> {
    let n = n.clamp(1, total.max(1));
    (0..=n).map(|r| total * r / n).collect()
}

/// Adds one to its counter when dropped: a helper's job of [`run_tasks`] or [`on_pool`] that
/// ended, by returning or by a panic.
struct Finish<'a>(&'a AtomicUsize);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// The most buffers [`recycle`] keeps per thread, and their most elements in all.
const KEPT_BUFFERS: usize = 16;
const KEPT_ELEMS: usize = 1 << 26;

/// Buffers shorter than this are not kept (a fresh one costs little).
const KEPT_MIN: usize = 1 << 14;

thread_local! {
    /// Whole `f32` buffers of dropped tensors, oldest first, for [`scratch_f32`] (per thread:
    /// the executor's). Every element of each is initialised (a buffer's length is all of it,
    /// whatever the tensor that last used it needed).
    static KEPT: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keeps the whole `f32` buffer of a tensor nobody else holds ([`Tensor::try_into_buffer`],
/// which may be longer than the tensor) for a later [`scratch_f32`] on this thread (the
/// executor drops each value after its last use); other tensors are just dropped. At most
/// [`KEPT_BUFFERS`] buffers and [`KEPT_ELEMS`] elements are kept, the most recently dropped.
///
/// [`Tensor::try_into_buffer`]: fusebox_core::runtime::Tensor::try_into_buffer
pub(crate) fn recycle(t: fusebox_core::runtime::Tensor) {
    let Ok(fusebox_core::runtime::Storage::F32(v)) = t.try_into_buffer() else {
        return;
    };
    keep_vec(v);
}

/// [`recycle`]'s and [`keep`]'s pool: buffers of [`KEPT_MIN`] to [`KEPT_ELEMS`] elements, the
/// most recent within the limits.
fn keep_vec(v: Vec<f32>) {
    if v.len() < KEPT_MIN || v.len() > KEPT_ELEMS {
        return;
    }
    KEPT.with(|k| {
        let mut k = k.borrow_mut();
        k.push(v);
        // Past the limits the oldest go: the buffers dropped last are the likeliest to fit
        // what comes next. (Keeping the old ones instead filled GPT-2's pool with fifteen
        // 128 × 768 buffers, and its 128 × 3072 and 128 × 50257 outputs were zeroed afresh
        // every inference, 44 MB of them.)
        while k.len() > KEPT_BUFFERS || k.iter().map(Vec::len).sum::<usize>() > KEPT_ELEMS {
            k.remove(0);
        }
    });
}

/// A run's result as its caller gets it: each tensor that sits in a kept buffer more than
/// twice its size (a small output written into the most recent buffer that fit, say a
/// 112 × 112 plane's) is copied out, and the buffer goes back to this thread's pool instead
/// of leaving with the result; other values are returned as they are.
pub(crate) fn compact(v: fusebox_core::runtime::Value) -> fusebox_core::runtime::Value {
    use fusebox_core::runtime::{Tensor, Value};
    match v {
        Value::Tensor(t) if t.buffer_len() / 2 > t.numel() => {
            match Tensor::new(t.shape().to_vec(), t.storage().to_storage()) {
                Ok(exact) => {
                    recycle(t);
                    Value::Tensor(exact)
                }
                Err(_) => Value::Tensor(t),
            }
        }
        Value::Tuple(parts) => Value::Tuple(parts.into_iter().map(compact).collect()),
        other => other,
    }
}

/// An output buffer from [`scratch_f32`]: its first `len` elements are what a kernel
/// writes (what it dereferences to); a kept buffer may hold more behind them, which travel
/// with it into the result tensor ([`Scratch::into_tensor`], a
/// [`Tensor::from_prefix`](fusebox_core::runtime::Tensor::from_prefix)) and come back to the
/// pool whole when that tensor is dropped.
///
/// A buffer from [`scratch_f32_aligned`] starts its elements at `start`, the buffer's first
/// 64-byte boundary.
#[derive(Debug)]
pub(crate) struct Scratch {
    buf: Vec<f32>,
    start: usize,
    len: usize,
}

impl Scratch {
    /// `v` as an output buffer of its whole length.
    pub(crate) fn from_vec(v: Vec<f32>) -> Scratch {
        Scratch {
            len: v.len(),
            start: 0,
            buf: v,
        }
    }

    /// The tensor of `shape` over this buffer (a kernel's result); an error when `shape` does
    /// not have exactly the buffer's `len` elements.
    pub(crate) fn into_tensor(
        mut self,
        shape: Vec<usize>,
    ) -> crate::util::KResult<fusebox_core::runtime::Tensor> {
        if fusebox_core::runtime::shape_numel(&shape) != Some(self.len) {
            return Err(format!(
                "an output of shape {shape:?} does not have the {} elements computed",
                self.len
            ));
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.start + self.len, 0);
        }
        fusebox_core::runtime::Tensor::from_prefix(
            shape,
            fusebox_core::runtime::Storage::F32(self.buf),
        )
        .map_err(|e| e.to_string())
    }
}

impl std::ops::Deref for Scratch {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// A buffer of `n` `f32`s with unspecified (initialised) contents, for an output the caller
/// overwrites whole: the most recently kept buffer of a dropped tensor that holds `n`
/// elements, whatever its length (the rest rides along unused, see [`Scratch`]), else the
/// allocator's zeroed memory (fresh pages are not written here; the kernel's threads touch
/// them first. A parallel fill on a pool of its own cost the executor's thread a sleep and a
/// wake per buffer: bench/RESULTS.md, session ba).
///
/// The most recent buffer is the likeliest to be in cache: a model's activations are written
/// into memory that was read a moment ago rather than into a buffer last touched an
/// inference ago. With safe `Vec`s alone a buffer cut to a small tensor's length had to be
/// zeroed again to grow back, so the pool used to hand out the buffer whose length was
/// nearest `n` instead. Taking the most recent fit, unzeroed, MobileNetV2's two-thread run went
/// from 5.29 to 5.07 ms (zeroing the difference instead gained nothing); bounding the slack
/// at 2 to 16 times `n`, or taking the best fit, ran even with this (bench/RESULTS.md,
/// sessions ae and af).
///
/// A buffer shorter than [`KEPT_MIN`] is always fresh: the pool never takes one back, and a
/// small tensor that took a kept buffer held it until its own drop. EfficientNet-B0's
/// squeeze-and-excitation values (28 to 1152 elements) took the pool's buffers one after the
/// other, so that the large outputs after them found it empty and were zeroed afresh: 6% of a
/// one-thread run in `memset`; 0.4% since, and the model 0.90–0.93 of its time on two
/// threads, MobileNetV3-Large 0.89–1.06 (bench/RESULTS.md, session ca).
pub(crate) fn scratch_f32(n: usize) -> Scratch {
    if n < KEPT_MIN {
        return Scratch::from_vec(vec![0.0; n]);
    }
    let kept = KEPT.with(|k| {
        let mut k = k.borrow_mut();
        let i = k.iter().rposition(|v| v.len() >= n)?;
        Some(k.remove(i))
    });
    match kept {
        Some(buf) => Scratch {
            buf,
            start: 0,
            len: n,
        },
        None => Scratch::from_vec(vec![0.0; n]),
    }
}

/// [`scratch_f32`] whose elements start on a 64-byte boundary (an AVX-512 vector never
/// straddles two cache lines), for a kernel's own buffers: its `NCHW16c` phases, its Winograd
/// tiles. Give it back with [`keep`] when done.
pub(crate) fn scratch_f32_aligned(n: usize) -> Scratch {
    let mut s = scratch_f32(n.saturating_add(LINE_SLACK));
    s.start = to_line(&s.buf);
    s.len = n;
    s
}

/// The extra `f32`s a buffer needs so that `n` of them can start on a 64-byte boundary.
pub(crate) const LINE_SLACK: usize = 15;

/// Where in `v` its first 64-byte boundary is (`0..=`[`LINE_SLACK`] elements in).
pub(crate) fn to_line(v: &[f32]) -> usize {
    v.as_ptr().align_offset(64).min(LINE_SLACK)
}

/// Gives a kernel's own buffer back to this thread's pool (as [`recycle`] does a dropped
/// tensor's), so that the next call's [`scratch_f32`] reuses it instead of zeroing a fresh
/// one. Call it on the executor's thread.
pub(crate) fn keep(s: Scratch) {
    keep_vec(s.buf);
}

/// Splits `out` into chunks of `chunk` elements (the last may be shorter) and runs
/// `f(offset, chunk)` on each, on up to `n` threads.
pub(crate) fn for_each_chunk_mut<T, F>(out: &mut [T], chunk: usize, n: usize, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    let chunk = chunk.max(1);
    let tasks: Vec<(usize, &mut [T])> = out
        .chunks_mut(chunk)
        .enumerate()
        .map(|(i, c)| (i * chunk, c))
        .collect();
    let r: Result<(), ()> = run_tasks(tasks, n, |(off, c)| {
        f(off, c);
        Ok(())
    });
    debug_assert!(r.is_ok());
}

/// Cuts each `plane`-long plane of `out` into runs of `run` elements (a plane's last run
/// shorter) and gathers the `i`-th run of every plane as task `i`'s slices: a task's band of
/// output rows in every channel of an `NCHW` result. Empty when `plane` or `run` is 0.
pub(crate) fn plane_runs<T>(out: &mut [T], plane: usize, run: usize) -> Vec<Vec<&mut [T]>> {
    if plane == 0 || run == 0 {
        return Vec::new();
    }
    let planes = out.len() / plane;
    let mut tasks: Vec<Vec<&mut [T]>> = (0..plane.div_ceil(run))
        .map(|_| Vec::with_capacity(planes))
        .collect();
    for p in out.chunks_exact_mut(plane) {
        for (task, r) in tasks.iter_mut().zip(p.chunks_mut(run)) {
            task.push(r);
        }
    }
    tasks
}

/// The number of threads worth using for `work` units of cheap work (elements, MACs / 16):
/// one per `grain` units, at most [`threads`].
pub(crate) fn threads_for(work: usize, grain: usize) -> usize {
    threads().min(work / grain.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plane_runs_gather_each_band_of_every_plane() {
        let mut v: Vec<u32> = (0..30).collect();
        let runs = plane_runs(&mut v, 10, 4);
        let got: Vec<Vec<Vec<u32>>> = runs
            .into_iter()
            .map(|t| t.into_iter().map(|r| r.to_vec()).collect())
            .collect();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[0],
            vec![vec![0, 1, 2, 3], vec![10, 11, 12, 13], vec![20, 21, 22, 23]]
        );
        assert_eq!(got[2], vec![vec![8, 9], vec![18, 19], vec![28, 29]]);
        assert!(plane_runs(&mut v, 0, 4).is_empty());
        assert!(plane_runs(&mut v, 10, 0).is_empty());
    }

    #[test]
    fn every_task_runs_once_and_the_first_error_wins() {
        let seen = std::sync::Mutex::new(Vec::new());
        let r: Result<(), usize> = run_tasks((0..100).collect(), 3, |i: usize| {
            if let Ok(mut v) = seen.lock() {
                v.push(i);
            }
            Ok(())
        });
        assert_eq!(r, Ok(()));
        let mut v = seen.into_inner().unwrap_or_default();
        v.sort_unstable();
        assert_eq!(v, (0..100).collect::<Vec<_>>());
        // One thread runs in order and stops at the first error.
        let r: Result<(), usize> =
            run_tasks(
                (0..10).collect(),
                1,
                |i| if i >= 4 { Err(i) } else { Ok(()) },
            );
        assert_eq!(r, Err(4));
        let r: Result<(), usize> =
            run_tasks(
                (0..10).collect(),
                4,
                |i| if i == 7 { Err(i) } else { Ok(()) },
            );
        assert_eq!(r, Err(7));
        // Several failures on several threads: the first in task order, whichever ran first.
        for _ in 0..20 {
            let r: Result<(), usize> = run_tasks((0..40).collect(), 3, |i| {
                if i % 13 == 5 { Err(i) } else { Ok(()) }
            });
            assert_eq!(r, Err(5));
        }
    }

    #[test]
    fn each_thread_takes_the_tasks_of_a_run_in_order() {
        // Runs of 10: tasks 0..10, 10..20, 20..30. Whoever takes tasks of a run takes them
        // front to back, so the tasks one thread ran from one run increase.
        for _ in 0..20 {
            let seen = std::sync::Mutex::new(Vec::new());
            let r: Result<(), ()> = run_tasks((0..30).collect(), 3, |i: usize| {
                seen.lock()
                    .unwrap()
                    .push((rayon::current_thread_index(), i));
                std::hint::black_box((0..200).sum::<usize>());
                Ok(())
            });
            assert_eq!(r, Ok(()));
            let seen = seen.into_inner().unwrap();
            assert_eq!(seen.len(), 30);
            let mut last: BTreeMap<(Option<usize>, usize), usize> = BTreeMap::new();
            for (thread, i) in seen {
                if let Some(&prev) = last.get(&(thread, i / 10)) {
                    assert!(prev < i, "thread {thread:?} ran task {prev} before {i}");
                }
                last.insert((thread, i / 10), i);
            }
        }
    }

    #[test]
    fn on_pool_runs_here_its_regions_use_the_helpers_and_it_nests() {
        let here = std::thread::current().id();
        with_threads(2, || {
            let ids = Mutex::new(Vec::new());
            let ran_on = on_pool(|| {
                let r: Result<(), ()> = run_tasks((0..16).collect(), 2, |_: usize| {
                    let me = std::thread::current().id();
                    ids.lock().unwrap().push(me);
                    // A task on the calling thread holds it until the helper has taken one
                    // of its run (up to 10 s: a loaded test machine may start it late), so
                    // the caller cannot run every task before the helper is scheduled.
                    let start = std::time::Instant::now();
                    while me == here
                        && !ids.lock().unwrap().iter().any(|&t| t != here)
                        && start.elapsed() < std::time::Duration::from_secs(10)
                    {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Ok(())
                });
                assert_eq!(r, Ok(()));
                std::thread::current().id()
            });
            assert_eq!(ran_on, here);
            let ids = ids.into_inner().unwrap();
            assert_eq!(ids.len(), 16);
            // The awake helper took its run of 8 tasks (at least its first one).
            assert!(
                ids.iter().any(|&t| t != here),
                "every task ran on the calling thread"
            );
            // on_pool inside a task, on the calling thread and on a helper: no wait forever.
            let r: Result<(), ()> = run_tasks((0..4).collect(), 2, |i: usize| {
                assert_eq!(with_threads(2, || on_pool(|| i * 2)), i * 2);
                Ok(())
            });
            assert_eq!(r, Ok(()));
        });
    }

    #[test]
    fn a_region_and_a_run_do_not_wait_for_a_helper_that_is_busy_elsewhere() {
        // The helper is held by a job outside any region (as a helper the OS has descheduled
        // would be) until the test releases it, after `on_pool` has returned. A region that
        // waited for its helper's share, or a run that waited for its helpers, would then
        // hold until the job gives up on its own (after 10 s), which the test detects.
        let here = std::thread::current().id();
        let patience = std::time::Duration::from_secs(10);
        let (started, release, gave_up) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let ids = with_threads(2, || {
            on_pool(|| {
                assert_eq!(rayon::current_thread_index(), Some(0));
                let (s, r, g) = (started.clone(), release.clone(), gave_up.clone());
                rayon::spawn(move || {
                    s.store(true, Ordering::Release);
                    let t = std::time::Instant::now();
                    while !r.load(Ordering::Acquire) {
                        if t.elapsed() > patience {
                            g.store(true, Ordering::Release);
                            return;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                });
                // The job is in this thread's queue: only the helper can take it.
                let t = std::time::Instant::now();
                while !started.load(Ordering::Acquire) && t.elapsed() < patience {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                assert!(
                    started.load(Ordering::Acquire),
                    "the helper never took the job"
                );
                let ids = Mutex::new(Vec::new());
                let r: Result<(), ()> = run_tasks((0..8).collect(), 2, |_: usize| {
                    ids.lock().unwrap().push(std::thread::current().id());
                    Ok(())
                });
                assert_eq!(r, Ok(()));
                ids.into_inner().unwrap()
            })
        });
        let waited = gave_up.load(Ordering::Acquire);
        release.store(true, Ordering::Release);
        assert!(!waited, "the region or the run waited for the busy helper");
        // Every task ran here: the helper's share was taken back, not waited for.
        assert_eq!(ids, vec![here; 8]);
    }

    #[test]
    fn a_panicking_task_ends_the_call_with_its_panic_and_the_rest_still_run() {
        let ran = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_tasks((0..50).collect(), 2, |i: usize| -> Result<(), ()> {
                if i == 3 {
                    panic!("task 3");
                }
                ran.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
        }));
        assert!(r.is_err());
        assert_eq!(ran.load(Ordering::Relaxed), 49);
    }

    fn kept_len() -> usize {
        KEPT.with(|k| k.borrow().len())
    }

    #[test]
    fn scratch_reuses_the_buffers_of_dropped_unshared_tensors() {
        use fusebox_core::runtime::Tensor;
        KEPT.with(|k| k.borrow_mut().clear());
        let n = 1 << 15;
        let t = Tensor::from_f32(vec![n], vec![7.0; n]).unwrap_or_else(|e| panic!("{e}"));
        let shared = t.clone();
        // Shared: not kept (the clone still reads it).
        recycle(t);
        let fresh = scratch_f32(n);
        assert!(fresh.iter().all(|&v| v == 0.0));
        assert_eq!(shared.as_f32().map(|v| v[0]), Some(7.0));
        // Unshared: kept, and handed out again (its old contents included) for a smaller size.
        recycle(shared);
        let again = scratch_f32(n - 5);
        assert_eq!(again.len(), n - 5);
        assert!(again.iter().all(|&v| v == 7.0));
        // Nothing kept any more: zeros again.
        assert!(scratch_f32(n).iter().all(|&v| v == 0.0));
    }

    #[test]
    fn a_small_tensor_keeps_the_whole_buffer_and_gives_it_back() {
        use fusebox_core::runtime::Tensor;
        KEPT.with(|k| k.borrow_mut().clear());
        let n = 1 << 15;
        let big = Tensor::from_f32(vec![4 * n], vec![3.0; 4 * n]).unwrap_or_else(|e| panic!("{e}"));
        let at = big.as_f32().map(<[f32]>::as_ptr);
        recycle(big);
        // A quarter of it: the tensor sees its n elements, the rest rides along.
        let mut small = scratch_f32(n);
        assert_eq!(small.len(), n);
        small.iter_mut().for_each(|v| *v = 1.0);
        let t = small
            .into_tensor(vec![n / 4, 4])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.numel(), n);
        assert_eq!(t.as_f32().map(<[f32]>::len), Some(n));
        assert_eq!(t.as_f32().map(<[f32]>::as_ptr), at);
        assert!(t.to_f32_vec().iter().all(|&v| v == 1.0));
        // Dropped, the whole buffer comes back: the large request gets it with nothing
        // zeroed, the small tensor's writes in front, the old contents behind.
        recycle(t);
        let again = scratch_f32(4 * n);
        assert_eq!(again.as_ptr(), at.unwrap_or(std::ptr::null()));
        assert!(again[..n].iter().all(|&v| v == 1.0));
        assert!(again[n..].iter().all(|&v| v == 3.0));
        // A shape of another element count is an error, not a view past the output.
        assert!(again.into_tensor(vec![4 * n + 1]).is_err());
    }

    #[test]
    fn a_result_in_a_much_longer_buffer_is_copied_out_and_the_buffer_kept() {
        use fusebox_core::runtime::{Tensor, Value};
        KEPT.with(|k| k.borrow_mut().clear());
        let n = 1 << 15;
        let over = |len: usize, used: usize| {
            let mut buf = vec![9.0f32; len];
            buf[..used].iter_mut().for_each(|v| *v = 1.0);
            let t = Tensor::from_prefix(vec![used], fusebox_core::runtime::Storage::F32(buf))
                .unwrap_or_else(|e| panic!("{e}"));
            Value::Tensor(t)
        };
        let out = compact(Value::Tuple(vec![over(4 * n, n), over(2 * n, n)]));
        let Value::Tuple(parts) = out else {
            panic!("a tuple in, a tuple out")
        };
        let tensors: Vec<&Tensor> = parts.iter().filter_map(|p| p.as_tensor("").ok()).collect();
        assert_eq!(tensors.len(), 2);
        // Four times its size: copied out, the buffer kept for the next scratch.
        assert_eq!(tensors[0].buffer_len(), n);
        assert_eq!(tensors[0].to_f32_vec(), vec![1.0; n]);
        assert_eq!(kept_len(), 1);
        assert_eq!(scratch_f32(4 * n).len(), 4 * n);
        // Twice: left as it is.
        assert_eq!(tensors[1].buffer_len(), 2 * n);
        assert_eq!(tensors[1].to_f32_vec(), vec![1.0; n]);
        KEPT.with(|k| k.borrow_mut().clear());
    }

    #[test]
    fn scratch_takes_the_most_recently_dropped_buffer_that_fits() {
        use fusebox_core::runtime::Tensor;
        KEPT.with(|k| k.borrow_mut().clear());
        let n = 1 << 15;
        let t = |len: usize, v: f32| {
            Tensor::from_f32(vec![len], vec![v; len]).unwrap_or_else(|e| panic!("{e}"))
        };
        recycle(t(2 * n, 1.0));
        recycle(t(n, 2.0));
        recycle(t(n / 2, 3.0));
        // The newest, n/2, is too short; the next newest fits exactly.
        assert!(scratch_f32(n).iter().all(|&v| v == 2.0));
        // Then the oldest, the only one left that holds n.
        assert!(scratch_f32(n).iter().all(|&v| v == 1.0));
        assert_eq!(kept_len(), 1);
        // None fits: zeros, and the short one stays.
        assert!(scratch_f32(n).iter().all(|&v| v == 0.0));
        assert_eq!(kept_len(), 1);
        KEPT.with(|k| k.borrow_mut().clear());
    }

    #[test]
    fn a_full_pool_keeps_the_buffers_dropped_last() {
        use fusebox_core::runtime::Tensor;
        KEPT.with(|k| k.borrow_mut().clear());
        let n = KEPT_MIN;
        let t = |len: usize, v: f32| {
            Tensor::from_f32(vec![len], vec![v; len]).unwrap_or_else(|e| panic!("{e}"))
        };
        for _ in 0..KEPT_BUFFERS {
            recycle(t(n, 1.0));
        }
        // The pool is full of small buffers; a large one dropped now is kept (the oldest
        // small one goes), and the next large tensor reuses it.
        recycle(t(4 * n, 2.0));
        assert!(scratch_f32(4 * n).iter().all(|&v| v == 2.0));
        assert_eq!(kept_len(), KEPT_BUFFERS - 1);
        // Buffers below the floor are not kept.
        recycle(t(n - 1, 4.0));
        assert_eq!(kept_len(), KEPT_BUFFERS - 1);
        KEPT.with(|k| k.borrow_mut().clear());
    }

    #[test]
    fn chunks_cover_the_output() {
        let mut v = vec![0usize; 1000];
        for_each_chunk_mut(&mut v, 64, 4, |off, c| {
            for (i, x) in c.iter_mut().enumerate() {
                *x = off + i;
            }
        });
        assert!(v.iter().enumerate().all(|(i, &x)| i == x));
    }

    #[test]
    fn overrides_nest_and_restore() {
        assert_eq!(parse_threads("4"), Ok(4));
        assert!(parse_threads("0").is_err());
        assert!(parse_threads("many").is_err());
        with_threads(2, || {
            assert_eq!(threads(), 2);
            with_threads(5, || assert_eq!(threads(), 5));
            assert_eq!(threads(), 2);
        });
    }
}
