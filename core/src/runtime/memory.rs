//! The memory limit: the one fallible path every tensor allocation of a run goes through.
//!
//! Contract:
//!
//! - The limit is a byte count that no single tensor (a model input, a decoded constant, an
//!   op's result, a kernel's large scratch buffer) may exceed. It is process-wide: the default
//!   is [`DEFAULT_FRACTION_PERCENT`]% of the smallest of physical memory (`MemTotal` of
//!   `/proc/meminfo`), the cgroup's `memory.max` and the address-space rlimit (`Max address
//!   space` of `/proc/self/limits`), or [`FALLBACK_LIMIT`] where none can be read; a config's
//!   `[runtime] memory_limit` or `fusebox run --memory-limit` replace it ([`set_memory_limit`]).
//! - [`check_alloc`] computes `numel × element size` with checked arithmetic and compares it
//!   with the limit before anything is allocated; [`alloc_storage`] then reserves with
//!   `try_reserve_exact`, so a refused allocation is an error too, never an abort.
//! - Exceeding the limit is [`Error::Memory`]: `memory limit exceeded: <what> needs <bytes>
//!   for <dtype> [<shape>], limit <bytes>`, where `what` names the op or input.
//! - Sizes in the config and on the command line are [`parse_size`]d: a byte count, or a
//!   number with a unit `B`, `K`/`KB`/`KiB`, `M`/`MB`/`MiB`, `G`/`GB`/`GiB`, `T`/`TB`/`TiB`
//!   (decimal units are powers of 1000, binary ones of 1024; `K`, `M`, … are binary).
//!
//! ```text
//! check_alloc("relax.nn.conv2d", DType::F32, &[1, 1 << 20, 1 << 20])
//!   -> Err("memory limit exceeded: relax.nn.conv2d needs 4 TiB (4398046511104 bytes) for
//!           float32 [1, 1048576, 1048576], limit 6 GiB (6442450944 bytes) ...")
//! ```

use crate::error::{Error, Result};
use crate::ir::{DType, Dim, Type};
use crate::runtime::Storage;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The default limit, in percent of the memory available to the process.
pub const DEFAULT_FRACTION_PERCENT: u64 = 75;

/// The default limit where the available memory cannot be read (8 GiB).
pub const FALLBACK_LIMIT: u64 = 8 << 30;

/// The limit set by [`set_memory_limit`]; 0 means "the default".
static LIMIT: AtomicU64 = AtomicU64::new(0);

/// The payload of [`Error::Memory`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryError {
    /// What needed the memory: an op (`relax.nn.conv2d`), an input (`input x`), a constant.
    pub what: String,
    /// The element type.
    pub dtype: DType,
    /// The shape asked for.
    pub shape: Vec<u64>,
    /// The bytes needed; `None` when the count overflows 64 bits.
    pub bytes: Option<u64>,
    /// The limit in force.
    pub limit: u64,
    /// Whether the limit allowed it but the allocator refused it.
    pub refused: bool,
}

impl std::fmt::Display for MemoryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let need = match self.bytes {
            Some(b) => format!("{} ({b} bytes)", human(b)),
            None => "more than 2^64 bytes".to_string(),
        };
        if self.refused {
            write!(
                f,
                "out of memory: {} needs {need} for {} {:?}, which the allocator refused",
                self.what, self.dtype, self.shape
            )
        } else {
            write!(
                f,
                "memory limit exceeded: {} needs {need} for {} {:?}, limit {} ({} bytes; \
                 set it with `--memory-limit` or `[runtime] memory_limit`)",
                self.what,
                self.dtype,
                self.shape,
                human(self.limit),
                self.limit
            )
        }
    }
}

/// `bytes` with the largest binary unit that keeps it at least 1 (`6 GiB`, `1.5 KiB`).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Sets the process-wide limit in bytes; `None` restores the default.
pub fn set_memory_limit(limit: Option<u64>) {
    LIMIT.store(limit.unwrap_or(0), Ordering::Relaxed);
}

/// The limit in force, in bytes.
pub fn memory_limit() -> u64 {
    match LIMIT.load(Ordering::Relaxed) {
        0 => default_memory_limit(),
        l => l,
    }
}

/// The default limit (see the module docs), computed once.
pub fn default_memory_limit() -> u64 {
    static DEFAULT: OnceLock<u64> = OnceLock::new();
    *DEFAULT.get_or_init(|| {
        let avail = [
            physical_memory(),
            cgroup_memory_max(),
            address_space_limit(),
        ]
        .into_iter()
        .flatten()
        .min();
        match avail {
            Some(m) => (m / 100).saturating_mul(DEFAULT_FRACTION_PERCENT).max(1),
            None => FALLBACK_LIMIT,
        }
    })
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn physical_memory() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// The cgroup v2 `memory.max` of this process's cgroup, when it is a number.
fn cgroup_memory_max() -> Option<u64> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cg.lines().find_map(|l| l.strip_prefix("0::"))?;
    let file = format!("/sys/fs/cgroup{}/memory.max", path.trim_end_matches('/'));
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// The soft `Max address space` limit of `/proc/self/limits`, when set.
fn address_space_limit() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = s.lines().find(|l| l.starts_with("Max address space"))?;
    line.trim_start_matches("Max address space")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The bytes of a `dtype` tensor of `shape`; `None` on overflow.
pub fn tensor_bytes(dtype: DType, shape: &[u64]) -> Option<u64> {
    shape
        .iter()
        .try_fold(dtype.size_bytes() as u64, |a, &d| a.checked_mul(d))
}

/// Checks that a `dtype` tensor of `shape` fits the limit; `what` names the op or input.
pub fn check_alloc(what: &str, dtype: DType, shape: &[usize]) -> Result<()> {
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    check_alloc_u64(what, dtype, &shape)
}

/// [`check_alloc`] for extents given as `u64` (a shape read from a file or a type).
pub fn check_alloc_u64(what: &str, dtype: DType, shape: &[u64]) -> Result<()> {
    check_within(what, dtype, shape, memory_limit())
}

/// [`check_alloc_u64`] against an explicit `limit` (the process-wide one aside).
pub fn check_within(what: &str, dtype: DType, shape: &[u64], limit: u64) -> Result<()> {
    let bytes = tensor_bytes(dtype, shape);
    match bytes {
        Some(b) if b <= limit && usize::try_from(b).is_ok() => Ok(()),
        _ => Err(Error::Memory(Box::new(MemoryError {
            what: what.to_string(),
            dtype,
            shape: shape.to_vec(),
            bytes,
            limit,
            refused: false,
        }))),
    }
}

/// An empty vector with room for `n` elements, or the typed error (never an abort).
pub fn try_vec<T>(what: &str, dtype: DType, shape: &[usize], n: usize) -> Result<Vec<T>> {
    check_alloc(what, dtype, shape)?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        Error::Memory(Box::new(MemoryError {
            what: what.to_string(),
            dtype,
            shape: shape.iter().map(|&d| d as u64).collect(),
            bytes: tensor_bytes(dtype, &shape.iter().map(|&d| d as u64).collect::<Vec<_>>()),
            limit: memory_limit(),
            refused: true,
        }))
    })?;
    Ok(v)
}

/// The storage of a `dtype` tensor of `shape` filled with `value` (converted as
/// [`Storage::from_f64`]), through the checked path.
pub fn alloc_storage(what: &str, dtype: DType, shape: &[usize], value: f64) -> Result<Storage> {
    let n = crate::runtime::shape_numel(shape).ok_or_else(|| {
        Error::Memory(Box::new(MemoryError {
            what: what.to_string(),
            dtype,
            shape: shape.iter().map(|&d| d as u64).collect(),
            bytes: None,
            limit: memory_limit(),
            refused: false,
        }))
    })?;
    fn fill<T: Clone>(mut v: Vec<T>, n: usize, x: T) -> Vec<T> {
        v.resize(n, x);
        v
    }
    let one = Storage::from_f64(dtype, vec![value]);
    Ok(match one {
        Storage::F16(x) => Storage::F16(fill(try_vec(what, dtype, shape, n)?, n, x[0])),
        Storage::BF16(x) => Storage::BF16(fill(try_vec(what, dtype, shape, n)?, n, x[0])),
        Storage::F32(x) => Storage::F32(fill(try_vec(what, dtype, shape, n)?, n, x[0])),
        Storage::F64(x) => Storage::F64(fill(try_vec(what, dtype, shape, n)?, n, x[0])),
        Storage::I8(x) => Storage::I8(fill(try_vec(what, dtype, shape, n)?, n, x[0])),
        Storage::U8(x) => Storage::U8(fill(try_vec(what, dtype, shape, n)?, n, x[0])),
        Storage::I32(x) => Storage::I32(fill(try_vec(what, dtype, shape, n)?, n, x[0])),
        Storage::I64(x) => Storage::I64(fill(try_vec(what, dtype, shape, n)?, n, x[0])),
        Storage::Bool(x) => Storage::Bool(fill(try_vec(what, dtype, shape, n)?, n, x[0])),
    })
}

/// Parses a size: bytes, or a number with a unit (see the module docs).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        u => {
            return Err(format!(
                "invalid size `{s}`: unknown unit `{u}` (expected B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
            ));
        }
    };
    let bad = || format!("invalid size `{s}`: expected a number of bytes such as `8GiB`");
    let bytes = if let Some((int, frac)) = num.split_once('.') {
        let whole: u64 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| bad())?
        };
        if frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let scale = 10u64.pow(frac.len() as u32);
        let f: u64 = frac.parse().map_err(|_| bad())?;
        let part = u128::from(f) * u128::from(mult) / u128::from(scale);
        whole
            .checked_mul(mult)
            .and_then(|w| w.checked_add(u64::try_from(part).ok()?))
    } else {
        num.parse::<u64>().map_err(|_| bad())?.checked_mul(mult)
    };
    match bytes {
        Some(0) => Err(format!("invalid size `{s}`: the limit must be above 0")),
        Some(b) => Ok(b),
        None => Err(format!("invalid size `{s}`: larger than 2^64 bytes")),
    }
}

/// The type of a run-time value: static shapes; a prim value is `int64` or `float64`.
pub fn value_type(v: &crate::runtime::Value) -> Type {
    use crate::runtime::{Prim, Value};
    match v {
        Value::Tuple(vs) => Type::Tuple(vs.iter().map(value_type).collect()),
        Value::Shape(s) => Type::shape(s.iter().map(|&d| Dim::Static(d)).collect()),
        Value::Prim(Prim::Int(_)) => Type::Prim(DType::I64),
        Value::Prim(Prim::Float(_)) => Type::Prim(DType::F64),
        Value::Tensor(_) | Value::Device(_) => match v.tensor_meta() {
            Some((dtype, shape)) => Type::tensor_dims(
                shape
                    .iter()
                    .map(|&d| Dim::Static(i64::try_from(d).unwrap_or(i64::MAX)))
                    .collect(),
                dtype,
            ),
            None => Type::Object,
        },
    }
}

/// Checks, before a kernel runs, that each tensor of `op`'s result fits the limit: the result
/// type is inferred from the argument values' types (static shapes). Where inference fails or
/// leaves a shape unknown (a shape that depends on values), nothing is checked here and the
/// kernel's own checked allocations apply.
pub fn check_op_result(op: &crate::op::Op, args: &[crate::runtime::Value]) -> Result<()> {
    let tys: Vec<Type> = args.iter().map(value_type).collect();
    let refs: Vec<&Type> = tys.iter().collect();
    match op.infer(&refs) {
        Ok(t) => check_type(op.name(), &t),
        Err(_) => Ok(()),
    }
}

/// Checks each tensor of a (possibly tuple) type whose shape is static; `what` names it.
pub fn check_type(what: &str, t: &Type) -> Result<()> {
    match t {
        Type::Tensor(tt) => {
            let Some(dims) = &tt.dims else {
                return Ok(());
            };
            let shape: Option<Vec<u64>> = dims
                .iter()
                .map(|d| d.as_static().and_then(|v| u64::try_from(v).ok()))
                .collect();
            match shape {
                Some(s) => check_alloc_u64(what, tt.dtype.unwrap_or(DType::F32), &s),
                None => Ok(()),
            }
        }
        Type::Tuple(ts) => ts.iter().try_for_each(|t| check_type(what, t)),
        _ => Ok(()),
    }
}
