//! Run-time values: dense tensors and the values a function passes around.
//!
//! Contract:
//!
//! - A [`Tensor`] is a row-major, contiguous array with a static shape (`Vec<usize>`) and typed
//!   storage ([`Storage`], one `Vec` per dtype; `float16`/`bfloat16` are stored as such and
//!   kernels compute them through `f32`). Clones are cheap: the storage is shared and copied on
//!   write. A tensor's elements are the first [`Tensor::numel`] of its buffer, which may be
//!   longer ([`Tensor::from_prefix`]: a kernel's output written into a kept, larger buffer);
//!   every reader ([`Tensor::storage`], a [`StorageRef`], the conversions,
//!   [`Tensor::into_storage`]) sees exactly those elements, and only
//!   [`Tensor::try_into_buffer`] gives the whole buffer.
//! - [`Tensor::from_constant`] / [`Tensor::to_constant`] convert from and to the IR's
//!   little-endian [`Constant`]s exactly (bit for bit).
//! - A [`Value`] is what a var holds while a function runs: a tensor, a tuple, a shape
//!   (`R.shape([...])`), a prim value (`R.prim_value(...)`), or a tensor that lives on a device
//!   ([`Value::Device`], behind the [`DeviceTensor`] trait that a GPU backend implements).
//! - Data moves between host and device only where the placement changes: an executor hands
//!   a [`Placement::Host`] artifact or a CPU op host values ([`Value::to_host`] downloads what
//!   is on a device, and copies nothing that is already on the host), a
//!   [`Placement::Device`] artifact gets values as they are (it uploads host values itself and
//!   returns device values), and a caller that wants host results calls [`Value::to_host`].
//! - Nothing here panics on user input: a shape that does not match the data, or an overflowing
//!   element count, is an [`Error::Runtime`].
//!
//! ```text
//! x: R.Tensor((2, 3), dtype="float32")     -> Value::Tensor (shape [2, 3], 6 f32s)
//! t: R.Tuple(R.Tensor((2,)), R.Tensor((1,))) -> Value::Tuple([Tensor, Tensor])
//! s: R.Shape([2, 3]) = R.shape([2, 3])    -> Value::Shape([2, 3])
//! p: R.Prim("int64") = R.prim_value(0)     -> Value::Prim(Prim::Int(0))
//! ```

use crate::error::{Error, Result};
use crate::ir::{Constant, DType};
use half::{bf16, f16};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

pub mod memory;
#[cfg(test)]
mod tests;

pub use memory::{check_alloc, memory_limit, set_memory_limit};

/// The typed elements of a tensor, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum Storage {
    /// `float16`.
    F16(Vec<f16>),
    /// `bfloat16`.
    BF16(Vec<bf16>),
    /// `float32`.
    F32(Vec<f32>),
    /// `float64`.
    F64(Vec<f64>),
    /// `int8`.
    I8(Vec<i8>),
    /// `uint8`.
    U8(Vec<u8>),
    /// `int32`.
    I32(Vec<i32>),
    /// `int64`.
    I64(Vec<i64>),
    /// `bool`.
    Bool(Vec<bool>),
}

/// Applies `$body` to the typed vector of a storage, binding it as `$v`.
#[macro_export]
macro_rules! with_storage {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            $crate::runtime::Storage::F16($v) => $body,
            $crate::runtime::Storage::BF16($v) => $body,
            $crate::runtime::Storage::F32($v) => $body,
            $crate::runtime::Storage::F64($v) => $body,
            $crate::runtime::Storage::I8($v) => $body,
            $crate::runtime::Storage::U8($v) => $body,
            $crate::runtime::Storage::I32($v) => $body,
            $crate::runtime::Storage::I64($v) => $body,
            $crate::runtime::Storage::Bool($v) => $body,
        }
    };
}

/// The typed elements of a tensor, borrowed ([`Tensor::storage`]): one slice per dtype, as
/// long as the tensor (its buffer may be longer; see [`Tensor::from_prefix`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StorageRef<'a> {
    /// `float16`.
    F16(&'a [f16]),
    /// `bfloat16`.
    BF16(&'a [bf16]),
    /// `float32`.
    F32(&'a [f32]),
    /// `float64`.
    F64(&'a [f64]),
    /// `int8`.
    I8(&'a [i8]),
    /// `uint8`.
    U8(&'a [u8]),
    /// `int32`.
    I32(&'a [i32]),
    /// `int64`.
    I64(&'a [i64]),
    /// `bool`.
    Bool(&'a [bool]),
}

/// Applies `$body` to the typed slice of a [`StorageRef`], binding it as `$v`.
#[macro_export]
macro_rules! with_storage_ref {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            $crate::runtime::StorageRef::F16($v) => $body,
            $crate::runtime::StorageRef::BF16($v) => $body,
            $crate::runtime::StorageRef::F32($v) => $body,
            $crate::runtime::StorageRef::F64($v) => $body,
            $crate::runtime::StorageRef::I8($v) => $body,
            $crate::runtime::StorageRef::U8($v) => $body,
            $crate::runtime::StorageRef::I32($v) => $body,
            $crate::runtime::StorageRef::I64($v) => $body,
            $crate::runtime::StorageRef::Bool($v) => $body,
        }
    };
}

impl<'a> StorageRef<'a> {
    /// The element type.
    pub fn dtype(self) -> DType {
        match self {
            StorageRef::F16(_) => DType::F16,
            StorageRef::BF16(_) => DType::BF16,
            StorageRef::F32(_) => DType::F32,
            StorageRef::F64(_) => DType::F64,
            StorageRef::I8(_) => DType::I8,
            StorageRef::U8(_) => DType::U8,
            StorageRef::I32(_) => DType::I32,
            StorageRef::I64(_) => DType::I64,
            StorageRef::Bool(_) => DType::Bool,
        }
    }

    /// The number of elements.
    pub fn len(self) -> usize {
        with_storage_ref!(self, v => v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// The first `n` elements (all of them when there are fewer).
    pub fn prefix(self, n: usize) -> StorageRef<'a> {
        match self {
            StorageRef::F16(v) => StorageRef::F16(&v[..n.min(v.len())]),
            StorageRef::BF16(v) => StorageRef::BF16(&v[..n.min(v.len())]),
            StorageRef::F32(v) => StorageRef::F32(&v[..n.min(v.len())]),
            StorageRef::F64(v) => StorageRef::F64(&v[..n.min(v.len())]),
            StorageRef::I8(v) => StorageRef::I8(&v[..n.min(v.len())]),
            StorageRef::U8(v) => StorageRef::U8(&v[..n.min(v.len())]),
            StorageRef::I32(v) => StorageRef::I32(&v[..n.min(v.len())]),
            StorageRef::I64(v) => StorageRef::I64(&v[..n.min(v.len())]),
            StorageRef::Bool(v) => StorageRef::Bool(&v[..n.min(v.len())]),
        }
    }

    /// The elements, copied into an owned [`Storage`].
    pub fn to_storage(self) -> Storage {
        match self {
            StorageRef::F16(v) => Storage::F16(v.to_vec()),
            StorageRef::BF16(v) => Storage::BF16(v.to_vec()),
            StorageRef::F32(v) => Storage::F32(v.to_vec()),
            StorageRef::F64(v) => Storage::F64(v.to_vec()),
            StorageRef::I8(v) => Storage::I8(v.to_vec()),
            StorageRef::U8(v) => Storage::U8(v.to_vec()),
            StorageRef::I32(v) => Storage::I32(v.to_vec()),
            StorageRef::I64(v) => Storage::I64(v.to_vec()),
            StorageRef::Bool(v) => Storage::Bool(v.to_vec()),
        }
    }

    /// Every element widened to `f32` (`f64` and wide ints round).
    pub fn to_f32_vec(self) -> Vec<f32> {
        match self {
            StorageRef::F32(v) => v.to_vec(),
            StorageRef::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            StorageRef::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            StorageRef::F64(v) => v.iter().map(|&x| x as f32).collect(),
            StorageRef::I8(v) => v.iter().map(|&x| f32::from(x)).collect(),
            StorageRef::U8(v) => v.iter().map(|&x| f32::from(x)).collect(),
            StorageRef::I32(v) => v.iter().map(|&x| x as f32).collect(),
            StorageRef::I64(v) => v.iter().map(|&x| x as f32).collect(),
            StorageRef::Bool(v) => v.iter().map(|&x| f32::from(u8::from(x))).collect(),
        }
    }

    /// Every element widened to `f64` (exact except for ints beyond 2^53).
    pub fn to_f64_vec(self) -> Vec<f64> {
        match self {
            StorageRef::F64(v) => v.to_vec(),
            StorageRef::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            StorageRef::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            StorageRef::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            StorageRef::I8(v) => v.iter().map(|&x| f64::from(x)).collect(),
            StorageRef::U8(v) => v.iter().map(|&x| f64::from(x)).collect(),
            StorageRef::I32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            StorageRef::I64(v) => v.iter().map(|&x| x as f64).collect(),
            StorageRef::Bool(v) => v.iter().map(|&x| f64::from(u8::from(x))).collect(),
        }
    }

    /// Every element as `i64` (floats truncate toward zero and saturate).
    pub fn to_i64_vec(self) -> Vec<i64> {
        match self {
            StorageRef::I64(v) => v.to_vec(),
            StorageRef::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
            StorageRef::I8(v) => v.iter().map(|&x| i64::from(x)).collect(),
            StorageRef::U8(v) => v.iter().map(|&x| i64::from(x)).collect(),
            StorageRef::Bool(v) => v.iter().map(|&x| i64::from(x)).collect(),
            StorageRef::F64(v) => v.iter().map(|&x| x as i64).collect(),
            StorageRef::F32(v) => v.iter().map(|&x| x as i64).collect(),
            StorageRef::F16(v) => v.iter().map(|x| x.to_f32() as i64).collect(),
            StorageRef::BF16(v) => v.iter().map(|x| x.to_f32() as i64).collect(),
        }
    }

    /// The elements converted to `dtype` (see [`Storage::from_f64`] for the rounding rules;
    /// int to int wraps, int64 is exact); a copy even when the dtype already is `dtype`.
    pub fn cast(self, dtype: DType) -> Storage {
        if self.dtype() == dtype {
            return self.to_storage();
        }
        match (self, dtype) {
            (StorageRef::F16(_) | StorageRef::BF16(_) | StorageRef::F32(_), d)
                if d != DType::F64 =>
            {
                Storage::from_f32(d, self.to_f32_vec())
            }
            (
                StorageRef::I8(_)
                | StorageRef::U8(_)
                | StorageRef::I32(_)
                | StorageRef::I64(_)
                | StorageRef::Bool(_),
                d,
            ) if d.is_int() || d == DType::Bool => Storage::from_i64(d, self.to_i64_vec()),
            (_, d) => Storage::from_f64(d, self.to_f64_vec()),
        }
    }
}

impl Storage {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::F16(_) => DType::F16,
            Storage::BF16(_) => DType::BF16,
            Storage::F32(_) => DType::F32,
            Storage::F64(_) => DType::F64,
            Storage::I8(_) => DType::I8,
            Storage::U8(_) => DType::U8,
            Storage::I32(_) => DType::I32,
            Storage::I64(_) => DType::I64,
            Storage::Bool(_) => DType::Bool,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        with_storage!(self, v => v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` zeros (`false` for bool) of `dtype`.
    pub fn zeros(dtype: DType, n: usize) -> Storage {
        match dtype {
            DType::F16 => Storage::F16(vec![f16::ZERO; n]),
            DType::BF16 => Storage::BF16(vec![bf16::ZERO; n]),
            DType::F32 => Storage::F32(vec![0.0; n]),
            DType::F64 => Storage::F64(vec![0.0; n]),
            DType::I8 => Storage::I8(vec![0; n]),
            DType::U8 => Storage::U8(vec![0; n]),
            DType::I32 => Storage::I32(vec![0; n]),
            DType::I64 => Storage::I64(vec![0; n]),
            DType::Bool => Storage::Bool(vec![false; n]),
        }
    }

    /// `f32` values converted to `dtype` (floats round to nearest, ints truncate toward zero and
    /// saturate, bool is `!= 0`).
    pub fn from_f32(dtype: DType, v: Vec<f32>) -> Storage {
        match dtype {
            DType::F32 => Storage::F32(v),
            DType::F16 => Storage::F16(v.into_iter().map(f16::from_f32).collect()),
            DType::BF16 => Storage::BF16(v.into_iter().map(bf16::from_f32).collect()),
            DType::F64 => Storage::F64(v.into_iter().map(f64::from).collect()),
            DType::I8 => Storage::I8(v.into_iter().map(|x| x as i8).collect()),
            DType::U8 => Storage::U8(v.into_iter().map(|x| x as u8).collect()),
            DType::I32 => Storage::I32(v.into_iter().map(|x| x as i32).collect()),
            DType::I64 => Storage::I64(v.into_iter().map(|x| x as i64).collect()),
            DType::Bool => Storage::Bool(v.into_iter().map(|x| x != 0.0).collect()),
        }
    }

    /// `f64` values converted to `dtype` (as [`Storage::from_f32`]).
    pub fn from_f64(dtype: DType, v: Vec<f64>) -> Storage {
        match dtype {
            DType::F64 => Storage::F64(v),
            DType::F32 => Storage::F32(v.into_iter().map(|x| x as f32).collect()),
            DType::F16 => Storage::F16(v.into_iter().map(f16::from_f64).collect()),
            DType::BF16 => Storage::BF16(v.into_iter().map(bf16::from_f64).collect()),
            DType::I8 => Storage::I8(v.into_iter().map(|x| x as i8).collect()),
            DType::U8 => Storage::U8(v.into_iter().map(|x| x as u8).collect()),
            DType::I32 => Storage::I32(v.into_iter().map(|x| x as i32).collect()),
            DType::I64 => Storage::I64(v.into_iter().map(|x| x as i64).collect()),
            DType::Bool => Storage::Bool(v.into_iter().map(|x| x != 0.0).collect()),
        }
    }

    /// `i64` values converted to `dtype` (ints wrap, as a C cast does).
    pub fn from_i64(dtype: DType, v: Vec<i64>) -> Storage {
        match dtype {
            DType::I64 => Storage::I64(v),
            DType::I32 => Storage::I32(v.into_iter().map(|x| x as i32).collect()),
            DType::I8 => Storage::I8(v.into_iter().map(|x| x as i8).collect()),
            DType::U8 => Storage::U8(v.into_iter().map(|x| x as u8).collect()),
            DType::Bool => Storage::Bool(v.into_iter().map(|x| x != 0).collect()),
            DType::F64 => Storage::F64(v.into_iter().map(|x| x as f64).collect()),
            DType::F32 => Storage::F32(v.into_iter().map(|x| x as f32).collect()),
            DType::F16 => Storage::F16(v.into_iter().map(|x| f16::from_f64(x as f64)).collect()),
            DType::BF16 => Storage::BF16(v.into_iter().map(|x| bf16::from_f64(x as f64)).collect()),
        }
    }

    /// The elements, borrowed.
    pub fn view(&self) -> StorageRef<'_> {
        match self {
            Storage::F16(v) => StorageRef::F16(v),
            Storage::BF16(v) => StorageRef::BF16(v),
            Storage::F32(v) => StorageRef::F32(v),
            Storage::F64(v) => StorageRef::F64(v),
            Storage::I8(v) => StorageRef::I8(v),
            Storage::U8(v) => StorageRef::U8(v),
            Storage::I32(v) => StorageRef::I32(v),
            Storage::I64(v) => StorageRef::I64(v),
            Storage::Bool(v) => StorageRef::Bool(v),
        }
    }

    /// Shortens to `n` elements (nothing when there are no more than `n`).
    pub fn truncate(&mut self, n: usize) {
        with_storage!(self, v => v.truncate(n))
    }

    /// Every element widened to `f32` (`f64` and wide ints round).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        self.view().to_f32_vec()
    }

    /// Every element widened to `f64` (exact except for ints beyond 2^53).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        self.view().to_f64_vec()
    }

    /// Every element as `i64` (floats truncate toward zero and saturate).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        self.view().to_i64_vec()
    }

    /// [`Storage::cast`] of an owned buffer: the buffer itself, moved, when it already has
    /// `dtype` (no copy; `cast` clones it), else the converted copy.
    pub fn into_cast(self, dtype: DType) -> Storage {
        if self.dtype() == dtype {
            self
        } else {
            self.cast(dtype)
        }
    }

    /// Converts to `dtype` (identity when it already is; see [`Storage::from_f64`] for the
    /// rounding rules; int to int wraps, int64 is exact).
    pub fn cast(&self, dtype: DType) -> Storage {
        self.view().cast(dtype)
    }
}

/// A dense tensor: dtype, shape and row-major contiguous data (shared, copied on write).
///
/// The data are the first [`Tensor::numel`] elements of a buffer that may be longer (see
/// [`Tensor::from_prefix`]): a kernel can then write its output into a kept buffer of a
/// dropped tensor without first cutting it to length, which in safe Rust would zero the cut
/// part again when the buffer grows back for a larger tensor.
#[derive(Clone)]
pub struct Tensor {
    shape: Vec<usize>,
    /// The element count of `shape`; `data` holds at least this many.
    numel: usize,
    data: Arc<Storage>,
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        self.shape == other.shape && self.storage() == other.storage()
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({}, {:?}, ", self.dtype(), self.shape)?;
        const SHOWN: usize = 16;
        with_storage_ref!(self.storage(), v => {
            if v.len() > SHOWN {
                write!(f, "{:?} …)", &v[..SHOWN])
            } else {
                write!(f, "{v:?})")
            }
        })
    }
}

/// The element count of a shape, `None` on overflow.
pub fn shape_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

impl Tensor {
    /// A tensor of `shape` over `data`; errors when the element count differs.
    pub fn new(shape: Vec<usize>, data: Storage) -> Result<Tensor> {
        let n = shape_numel(&shape)
            .ok_or_else(|| Error::Runtime(format!("the element count of {shape:?} overflows")))?;
        if n != data.len() {
            return Err(Error::Runtime(format!(
                "a tensor of shape {shape:?} needs {n} elements, got {}",
                data.len()
            )));
        }
        Ok(Tensor {
            shape,
            numel: n,
            data: Arc::new(data),
        })
    }

    /// A tensor of `shape` over the first elements of `data`, which may hold more (a kept
    /// buffer the tensor's elements were written into); errors when it holds fewer. The rest
    /// stays with the buffer: [`Tensor::storage`] and the conversions see only the tensor's
    /// elements, and [`Tensor::try_into_buffer`] gives the whole buffer back.
    pub fn from_prefix(shape: Vec<usize>, data: Storage) -> Result<Tensor> {
        let n = shape_numel(&shape)
            .ok_or_else(|| Error::Runtime(format!("the element count of {shape:?} overflows")))?;
        if n > data.len() {
            return Err(Error::Runtime(format!(
                "a tensor of shape {shape:?} needs {n} elements, got a buffer of {}",
                data.len()
            )));
        }
        Ok(Tensor {
            shape,
            numel: n,
            data: Arc::new(data),
        })
    }

    /// An `f32` tensor.
    pub fn from_f32(shape: Vec<usize>, data: Vec<f32>) -> Result<Tensor> {
        Tensor::new(shape, Storage::F32(data))
    }

    /// An `i64` tensor.
    pub fn from_i64(shape: Vec<usize>, data: Vec<i64>) -> Result<Tensor> {
        Tensor::new(shape, Storage::I64(data))
    }

    /// A tensor of zeros, allocated through the memory limit ([`memory::alloc_storage`]).
    pub fn zeros(shape: Vec<usize>, dtype: DType) -> Result<Tensor> {
        Tensor::full(shape, dtype, 0.0)
    }

    /// A tensor of `dtype` filled with `value` (converted as [`Storage::from_f64`]), allocated
    /// through the memory limit ([`memory::alloc_storage`]).
    pub fn full(shape: Vec<usize>, dtype: DType, value: f64) -> Result<Tensor> {
        let data = memory::alloc_storage("a tensor", dtype, &shape, value)?;
        Tensor::new(shape, data)
    }

    /// A scalar (rank-0) `f32` tensor.
    pub fn scalar_f32(v: f32) -> Tensor {
        Tensor {
            shape: Vec::new(),
            numel: 1,
            data: Arc::new(Storage::F32(vec![v])),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// The length of the buffer behind this tensor: [`Tensor::numel`], or more for a tensor
    /// made by [`Tensor::from_prefix`].
    pub fn buffer_len(&self) -> usize {
        self.data.len()
    }

    /// The elements, borrowed (exactly [`Tensor::numel`] of them, whatever the length of the
    /// buffer behind them).
    pub fn storage(&self) -> StorageRef<'_> {
        self.data.view().prefix(self.numel)
    }

    /// A weak handle on the storage, for caches of things made from it (a device copy): it
    /// keeps the allocation's address from being reused, and [`Tensor::shares_storage`] with
    /// it holds only while that very storage lives unchanged (a write through
    /// [`Tensor::storage_mut`] moves the data to a new allocation while a weak handle exists).
    pub fn storage_weak(&self) -> std::sync::Weak<Storage> {
        Arc::downgrade(&self.data)
    }

    /// The address of the storage: its identity while this tensor (or a clone or reshape
    /// of it) lives.
    pub fn storage_ptr(&self) -> *const Storage {
        Arc::as_ptr(&self.data)
    }

    /// Whether this tensor's storage is the one `w` was taken from (see
    /// [`Tensor::storage_weak`]).
    pub fn shares_storage(&self, w: &std::sync::Weak<Storage>) -> bool {
        std::ptr::eq(Arc::as_ptr(&self.data), w.as_ptr())
    }

    /// The storage, mutably, exactly [`Tensor::numel`] elements long (the elements are
    /// copied first when the storage is shared or a weak handle on it exists).
    pub fn storage_mut(&mut self) -> &mut Storage {
        if Arc::get_mut(&mut self.data).is_none() {
            self.data = Arc::new(self.storage().to_storage());
        }
        let data = Arc::make_mut(&mut self.data);
        data.truncate(self.numel);
        data
    }

    /// The storage, taken out, exactly [`Tensor::numel`] elements long (copied when shared).
    pub fn into_storage(self) -> Storage {
        let n = self.numel;
        match Arc::try_unwrap(self.data) {
            Ok(mut data) => {
                data.truncate(n);
                data
            }
            Err(data) => data.view().prefix(n).to_storage(),
        }
    }

    /// The storage, taken out and exactly [`Tensor::numel`] elements long, when this tensor
    /// is its only owner; else the tensor back.
    pub fn try_into_storage(self) -> std::result::Result<Storage, Tensor> {
        let n = self.numel;
        self.try_into_buffer().map(|mut data| {
            data.truncate(n);
            data
        })
    }

    /// The whole buffer behind this tensor, taken out when this tensor is its only owner (its
    /// first [`Tensor::numel`] elements are the tensor's; it may hold more, see
    /// [`Tensor::from_prefix`]); else the tensor back.
    pub fn try_into_buffer(self) -> std::result::Result<Storage, Tensor> {
        Arc::try_unwrap(self.data).map_err(|data| Tensor {
            shape: self.shape,
            numel: self.numel,
            data,
        })
    }

    /// The same data under another shape with the same element count.
    pub fn reshaped(&self, shape: Vec<usize>) -> Result<Tensor> {
        let n = shape_numel(&shape)
            .ok_or_else(|| Error::Runtime(format!("the element count of {shape:?} overflows")))?;
        if n != self.numel() {
            return Err(Error::Runtime(format!(
                "cannot view {:?} ({} elements) as {shape:?} ({n} elements)",
                self.shape,
                self.numel()
            )));
        }
        Ok(Tensor {
            shape,
            numel: n,
            data: Arc::clone(&self.data),
        })
    }

    /// The `f32` elements, when the dtype is `float32`.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self.storage() {
            StorageRef::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The `i64` elements, when the dtype is `int64`.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match self.storage() {
            StorageRef::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Every element widened to `f32`.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        self.storage().to_f32_vec()
    }

    /// Every element widened to `f64`.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        self.storage().to_f64_vec()
    }

    /// Every element as `i64`.
    pub fn to_i64_vec(&self) -> Vec<i64> {
        self.storage().to_i64_vec()
    }

    /// The tensor converted to `dtype` (shares the data when it already is).
    pub fn cast(&self, dtype: DType) -> Tensor {
        if self.dtype() == dtype {
            return self.clone();
        }
        Tensor {
            shape: self.shape.clone(),
            numel: self.numel,
            data: Arc::new(self.storage().cast(dtype)),
        }
    }

    /// The tensor of an IR constant (bit-exact).
    pub fn from_constant(c: &Constant) -> Result<Tensor> {
        let shape: Vec<usize> = c
            .shape
            .iter()
            .map(|&d| {
                usize::try_from(d).map_err(|_| {
                    Error::Runtime(format!("negative dim in constant shape {:?}", c.shape))
                })
            })
            .collect::<Result<_>>()?;
        let n = shape_numel(&shape)
            .ok_or_else(|| Error::Runtime(format!("the element count of {shape:?} overflows")))?;
        let sz = c.dtype.size_bytes();
        if c.data.len() != n.saturating_mul(sz) {
            return Err(Error::Runtime(format!(
                "constant of shape {:?} and dtype {} needs {} bytes, got {}",
                c.shape,
                c.dtype,
                n.saturating_mul(sz),
                c.data.len()
            )));
        }
        memory::check_alloc("a constant", c.dtype, &shape)?;
        let b = &c.data[..];
        fn chunks<const N: usize, T>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
            b.chunks_exact(N)
                .map(|ch| {
                    let mut a = [0u8; N];
                    a.copy_from_slice(ch);
                    f(a)
                })
                .collect()
        }
        let data = match c.dtype {
            DType::F16 => Storage::F16(chunks(b, f16::from_le_bytes)),
            DType::BF16 => Storage::BF16(chunks(b, bf16::from_le_bytes)),
            DType::F32 => Storage::F32(chunks(b, f32::from_le_bytes)),
            DType::F64 => Storage::F64(chunks(b, f64::from_le_bytes)),
            DType::I8 => Storage::I8(chunks(b, i8::from_le_bytes)),
            DType::U8 => Storage::U8(b.to_vec()),
            DType::I32 => Storage::I32(chunks(b, i32::from_le_bytes)),
            DType::I64 => Storage::I64(chunks(b, i64::from_le_bytes)),
            DType::Bool => Storage::Bool(b.iter().map(|&x| x != 0).collect()),
        };
        Tensor::new(shape, data)
    }

    /// The IR constant holding this tensor (bit-exact).
    pub fn to_constant(&self) -> Result<Constant> {
        let shape: Vec<i64> = self
            .shape
            .iter()
            .map(|&d| {
                i64::try_from(d)
                    .map_err(|_| Error::Runtime(format!("dim {d} does not fit in an int64")))
            })
            .collect::<Result<_>>()?;
        let bytes: Vec<u8> = match self.storage() {
            StorageRef::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            StorageRef::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            StorageRef::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            StorageRef::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            StorageRef::I8(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            StorageRef::U8(v) => v.to_vec(),
            StorageRef::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            StorageRef::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            StorageRef::Bool(v) => v.iter().map(|&x| u8::from(x)).collect(),
        };
        Constant::from_bytes(self.dtype(), shape, bytes).map_err(Error::Runtime)
    }
}

/// A scalar that is not a tensor (`R.prim_value(...)`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Prim {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
}

impl Prim {
    /// The value as `f64`.
    pub fn as_f64(self) -> f64 {
        match self {
            Prim::Int(i) => i as f64,
            Prim::Float(f) => f,
        }
    }
}

/// A tensor that lives on a device (a GPU backend's buffer). The executor never reads its
/// memory: it asks for its dtype and shape (type checks) and downloads it with
/// [`DeviceTensor::to_host`] where a host consumer needs it.
pub trait DeviceTensor: Send + Sync + fmt::Debug {
    /// The element type.
    fn dtype(&self) -> DType;
    /// The shape (row-major, contiguous).
    fn shape(&self) -> &[usize];
    /// The device it lives on, for messages (`cuda:0 (NVIDIA H100 80GB HBM3)`).
    fn device(&self) -> String;
    /// Copies it to a host tensor (bit-exact, every dtype).
    fn to_host(&self) -> Result<Tensor>;
    /// The value as `Any`, so the backend that made it can get its own type back.
    fn as_any(&self) -> &dyn Any;
}

/// Where an artifact wants its arguments (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Host tensors: the executor downloads device values before the call.
    #[default]
    Host,
    /// Values as they are: the artifact uploads host values itself and may return device
    /// values.
    Device,
}

/// What a var holds at run time.
#[derive(Clone, Debug)]
pub enum Value {
    /// A tensor.
    Tensor(Tensor),
    /// A tuple of values.
    Tuple(Vec<Value>),
    /// A shape value (`R.shape([...])`).
    Shape(Vec<i64>),
    /// A prim value.
    Prim(Prim),
    /// A tensor on a device (see [`DeviceTensor`]).
    Device(Arc<dyn DeviceTensor>),
}

/// Host values compare by content; device values by identity (the same buffer), since
/// comparing their contents would need a download.
impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Tensor(a), Value::Tensor(b)) => a == b,
            (Value::Tuple(a), Value::Tuple(b)) => a == b,
            (Value::Shape(a), Value::Shape(b)) => a == b,
            (Value::Prim(a), Value::Prim(b)) => a == b,
            (Value::Device(a), Value::Device(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Value {
    /// The tensor, or an error naming `what` and what was found instead (a device tensor is
    /// an error too: download it first with [`Value::to_host`]).
    pub fn as_tensor(&self, what: &str) -> Result<&Tensor> {
        match self {
            Value::Tensor(t) => Ok(t),
            other => Err(Error::Runtime(format!(
                "expected {what} to be a tensor, found {}",
                other.kind()
            ))),
        }
    }

    /// A short description of the value's kind (`tensor`, `tuple of 2`, `shape`, `prim`).
    pub fn kind(&self) -> String {
        match self {
            Value::Tensor(t) => format!("a tensor {:?} of {}", t.shape(), t.dtype()),
            Value::Tuple(v) => format!("a tuple of {}", v.len()),
            Value::Shape(_) => "a shape".to_string(),
            Value::Prim(_) => "a prim value".to_string(),
            Value::Device(d) => format!(
                "a device tensor {:?} of {} on {}",
                d.shape(),
                d.dtype(),
                d.device()
            ),
        }
    }

    /// Whether any part of the value (tuple fields included) is on a device.
    pub fn is_on_device(&self) -> bool {
        match self {
            Value::Device(_) => true,
            Value::Tuple(items) => items.iter().any(Value::is_on_device),
            Value::Tensor(_) | Value::Shape(_) | Value::Prim(_) => false,
        }
    }

    /// The dtype and shape of a tensor value, on the host or on a device.
    pub fn tensor_meta(&self) -> Option<(DType, &[usize])> {
        match self {
            Value::Tensor(t) => Some((t.dtype(), t.shape())),
            Value::Device(d) => Some((d.dtype(), d.shape())),
            _ => None,
        }
    }

    /// The value with every device tensor downloaded (tuples recursively). A value already on
    /// the host is returned as it is: nothing is copied.
    pub fn to_host(self) -> Result<Value> {
        match self {
            Value::Device(d) => d.to_host().map(Value::Tensor),
            Value::Tuple(items) if items.iter().any(Value::is_on_device) => items
                .into_iter()
                .map(Value::to_host)
                .collect::<Result<Vec<_>>>()
                .map(Value::Tuple),
            v => Ok(v),
        }
    }
}

/// `args` with every device value downloaded (see [`Value::to_host`]); borrowed unchanged when
/// none is on a device, so the common all-host case copies nothing.
pub fn host_args(args: &[Value]) -> Result<std::borrow::Cow<'_, [Value]>> {
    if !args.iter().any(Value::is_on_device) {
        return Ok(std::borrow::Cow::Borrowed(args));
    }
    args.iter()
        .map(|a| a.clone().to_host())
        .collect::<Result<Vec<_>>>()
        .map(std::borrow::Cow::Owned)
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Self {
        Value::Tensor(t)
    }
}
