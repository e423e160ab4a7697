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
//! - `run_tasks` runs a list of tasks on a kept pool of `n` worker threads (rayon; one pool
//!   per thread count, made on first use) and returns the error of the first failing task in
//!   task order. With one thread or one task it runs them in order on the calling thread.
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

/// The worker pool of `n` threads (made on first use and kept: a kernel's parallel region
/// then costs a wake-up, not a thread spawn).
fn pool(n: usize) -> Option<Arc<rayon::ThreadPool>> {
    static POOLS: Mutex<BTreeMap<usize, Arc<rayon::ThreadPool>>> = Mutex::new(BTreeMap::new());
    let mut pools = POOLS.lock().ok()?;
    if let Some(p) = pools.get(&n) {
        return Some(Arc::clone(p));
    }
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("fusebox-cpu-{i}"))
        .build()
        .ok()?;
    let p = Arc::new(p);
    pools.insert(n, Arc::clone(&p));
    Some(p)
}

/// Runs `f` on a worker of the kept pool of [`threads`] threads (with this thread's count
/// carried over), so that the parallel regions `f` opens are forked from inside the pool
/// rather than handed over from an outside thread each time. While `f` runs, the pool's other
/// workers stay awake ([`spin_for_work`]): a parallel region then starts on every thread at
/// once instead of waiting for parked workers to be woken (tens of microseconds each on a VM,
/// for each of a ResNet-50's ~150 regions), as onnxruntime's spinning intra-op threads do.
/// With one thread, or when no pool can be made, `f` runs here.
pub(crate) fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let n = threads();
    let Some(p) = (n > 1).then(|| pool(n)).flatten() else {
        return f();
    };
    p.install(|| {
        let done = AtomicBool::new(false);
        let me = rayon::current_thread_index();
        rayon::scope(|s| {
            for _ in 1..n {
                s.spawn(|_| spin_for_work(&done, me));
            }
            // Set on the way out, a panic included, so the spinning workers always stop.
            struct Done<'a>(&'a AtomicBool);
            impl Drop for Done<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Release);
                }
            }
            let _done = Done(&done);
            with_threads(n, f)
        })
    })
}

/// Keeps a pool worker awake until `done`: it runs the pool's pending tasks as they appear
/// (`rayon::yield_now` steals one) and in between offers its core to other runnable threads
/// (`std::thread::yield_now`, so more threads than cores do not starve the one running `f`).
/// Returns at once on the worker `f` itself runs on (`owner`), which may pick this job up
/// while it waits inside `f`.
fn spin_for_work(done: &AtomicBool, owner: Option<usize>) {
    if rayon::current_thread_index() == owner {
        return;
    }
    while !done.load(Ordering::Acquire) {
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            std::thread::yield_now();
        }
    }
}

/// Runs `f` on every task, on up to `n` threads of a kept worker pool (rayon's work stealing
/// spreads them; which thread runs a task never changes what it computes). Returns the error
/// of the first failing task in task order. With one thread or one task, or when no pool can
/// be made, the tasks run in order on the calling thread.
pub(crate) fn run_tasks<T, E, F>(tasks: Vec<T>, n: usize, f: F) -> Result<(), E>
where
    T: Send,
    E: Send,
    F: Fn(T) -> Result<(), E> + Sync,
{
    use rayon::prelude::*;
    let n = n.clamp(1, tasks.len().max(1));
    let Some(pool) = (n > 1).then(|| pool(n)).flatten() else {
        return tasks.into_iter().try_for_each(f);
    };
    let results: Vec<Result<(), E>> =
        pool.install(|| tasks.into_par_iter().with_max_len(1).map(&f).collect());
    results.into_iter().collect()
}

/// `n` zeros, written by up to `threads` threads when `n` is large (an output buffer the
/// kernel then overwrites: zeroing it alone would be a serial pass over memory).
pub(crate) fn zeros_f32(n: usize, threads: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let t = threads.min(n / (1 << 16)).max(1);
    match (t > 1).then(|| pool(t)).flatten() {
        Some(p) => p.install(|| {
            let mut v = Vec::with_capacity(n);
            v.par_extend(rayon::iter::repeat_n(0.0f32, n));
            v
        }),
        None => vec![0.0; n],
    }
}

/// The most buffers [`recycle`] keeps per thread, and their most elements in all.
const KEPT_BUFFERS: usize = 16;
const KEPT_ELEMS: usize = 1 << 26;

thread_local! {
    /// `f32` buffers of dropped tensors, for [`scratch_f32`] (per thread: the executor's).
    static KEPT: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keeps the `f32` buffer of a tensor nobody else holds for a later [`scratch_f32`] on this
/// thread (the executor drops each value after its last use); other tensors are just
/// dropped. At most [`KEPT_BUFFERS`] buffers and [`KEPT_ELEMS`] elements are kept, the
/// most recently dropped.
pub(crate) fn recycle(t: fusebox_core::runtime::Tensor) {
    let Ok(fusebox_core::runtime::Storage::F32(v)) = t.try_into_storage() else {
        return;
    };
    if v.capacity() < 1 << 14 || v.capacity() > KEPT_ELEMS {
        return;
    }
    KEPT.with(|k| {
        let mut k = k.borrow_mut();
        k.push(v);
        // Past the limits the oldest go: the buffers dropped last are the likeliest to fit
        // what comes next. (Keeping the old ones instead filled GPT-2's pool with fifteen
        // 128 × 768 buffers, and its 128 × 3072 and 128 × 50257 outputs were zeroed afresh
        // every inference, 44 MB of them.)
        while k.len() > KEPT_BUFFERS || k.iter().map(Vec::capacity).sum::<usize>() > KEPT_ELEMS {
            k.remove(0);
        }
    });
}

/// A buffer of `n` `f32`s with unspecified (initialised) contents, for an output the caller
/// overwrites whole: a kept buffer of a dropped tensor when one fits, which saves zeroing a
/// fresh one; else zeros, written by up to `threads` threads.
///
/// Only a kept buffer's length (not its capacity) is initialised memory that can be handed
/// out without writing it, and a buffer truncated to `n` keeps length `n` for good: growing
/// it again for a larger tensor zeroes the difference. So each choice is charged the elements
/// it zeroes now (`n` less a shorter length) or gives up (a longer length less `n`), and the
/// kept buffer charged least is taken if that is less than the `n` a fresh buffer zeroes
/// (on a tie, the one that zeroes nothing now). Taking the shortest buffer long enough, as
/// before, let one inference's small tensors cut its large buffers down, and the next
/// inference zeroed them back up: 2.9 M elements per MobileNetV2 run (`memset` 8.9% of the
/// executor thread's time in `perf`), 0.31 M now.
pub(crate) fn scratch_f32(n: usize, threads: usize) -> Vec<f32> {
    let kept = KEPT.with(|k| {
        let mut k = k.borrow_mut();
        // The elements this choice writes now (past the length) or gives up for later (past
        // `n`): the fewest, and fewer than a fresh buffer's `n`.
        let (best, cost) = k
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= n)
            .map(|(i, v)| (i, v.len().abs_diff(n), v.len() < n))
            .min_by_key(|&(_, cost, short)| (cost, short))
            .map(|(i, cost, _)| (i, cost))?;
        (cost < n).then(|| k.remove(best))
    });
    match kept {
        Some(mut v) => {
            v.truncate(n);
            v.resize(n, 0.0);
            v
        }
        None => zeros_f32(n, threads),
    }
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
    }

    #[test]
    fn scratch_reuses_the_buffers_of_dropped_unshared_tensors() {
        use fusebox_core::runtime::Tensor;
        let n = 1 << 15;
        let t = Tensor::from_f32(vec![n], vec![7.0; n]).unwrap_or_else(|e| panic!("{e}"));
        let shared = t.clone();
        // Shared: not kept (the clone still reads it).
        recycle(t);
        let fresh = scratch_f32(n, 1);
        assert!(fresh.iter().all(|&v| v == 0.0));
        assert_eq!(shared.as_f32().map(|v| v[0]), Some(7.0));
        // Unshared: kept, and handed out again (its old contents included) for a smaller size.
        recycle(shared);
        let again = scratch_f32(n - 5, 1);
        assert_eq!(again.len(), n - 5);
        assert!(again.iter().all(|&v| v == 7.0));
        // Nothing kept any more: zeros again.
        assert!(scratch_f32(n, 1).iter().all(|&v| v == 0.0));
    }

    #[test]
    fn scratch_prefers_a_buffer_long_enough_to_a_roomy_truncated_one() {
        use fusebox_core::runtime::Tensor;
        let big = 1 << 16;
        let n = 1 << 15;
        // A buffer truncated by an earlier, smaller tensor (capacity a little over n, length
        // n/2), and one whose length is n in a larger allocation: choosing by the smallest
        // capacity would take the first and zero half of it.
        let mut roomy = vec![1.0f32; n + 1024];
        roomy.truncate(n / 2);
        let roomy = Tensor::from_f32(vec![n / 2], roomy).unwrap_or_else(|e| panic!("{e}"));
        let mut exact = Vec::with_capacity(big);
        exact.resize(n, 2.0f32);
        let exact = Tensor::from_f32(vec![n], exact).unwrap_or_else(|e| panic!("{e}"));
        recycle(roomy);
        recycle(exact);
        // The one whose length covers n: nothing to zero (its old contents come back).
        let got = scratch_f32(n, 1);
        assert!(got.iter().all(|&v| v == 2.0));
        // Then the roomy one: its length n/2 kept, only the rest zeroed.
        let got = scratch_f32(n, 1);
        assert_eq!(got.len(), n);
        assert!(got[..n / 2].iter().all(|&v| v == 1.0));
        assert!(got[n / 2..].iter().all(|&v| v == 0.0));
        assert!(scratch_f32(n, 1).iter().all(|&v| v == 0.0));
    }

    #[test]
    fn a_small_tensor_does_not_cut_a_large_kept_buffer_down() {
        use fusebox_core::runtime::Tensor;
        let n = 1 << 15;
        let big = Tensor::from_f32(vec![4 * n], vec![3.0; 4 * n]).unwrap_or_else(|e| panic!("{e}"));
        recycle(big);
        // A quarter of its length: truncating would give up 3n elements, a fresh buffer
        // zeroes n. Fresh it is, and the large buffer stays whole.
        let small = scratch_f32(n, 1);
        assert!(small.iter().all(|&v| v == 0.0));
        // The large request then gets it back with nothing zeroed (its old contents).
        let again = scratch_f32(4 * n, 1);
        assert!(again.iter().all(|&v| v == 3.0));
        // Half its length or more: reused (giving up fewer elements than a fresh one zeroes).
        let t = Tensor::from_f32(vec![4 * n], again).unwrap_or_else(|e| panic!("{e}"));
        recycle(t);
        let half = scratch_f32(2 * n + 1, 1);
        assert!(half.iter().all(|&v| v == 3.0));
        // On a tie, the buffer that needs no zeroing now.
        let kept = |len: usize, v: f32| {
            let mut data = Vec::with_capacity(2 * n);
            data.resize(len, v);
            Tensor::from_f32(vec![len], data).unwrap_or_else(|e| panic!("{e}"))
        };
        recycle(kept(n - 8, 4.0));
        recycle(kept(n + 8, 5.0));
        assert!(scratch_f32(n, 1).iter().all(|&v| v == 5.0));
        let rest = scratch_f32(n, 1);
        assert!(rest[..n - 8].iter().all(|&v| v == 4.0));
        assert!(rest[n - 8..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn a_full_pool_keeps_the_buffers_dropped_last() {
        use fusebox_core::runtime::Tensor;
        let n = 1 << 14;
        let t = |len: usize, v: f32| {
            Tensor::from_f32(vec![len], vec![v; len]).unwrap_or_else(|e| panic!("{e}"))
        };
        for _ in 0..KEPT_BUFFERS {
            recycle(t(n, 1.0));
        }
        // The pool is full of small buffers; a large one dropped now is kept (the oldest
        // small one goes), and the next large tensor reuses it.
        recycle(t(4 * n, 2.0));
        assert!(scratch_f32(4 * n, 1).iter().all(|&v| v == 2.0));
        let kept = KEPT.with(|k| k.borrow().len());
        assert_eq!(kept, KEPT_BUFFERS - 1);
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
