//! Kernels of the elementwise comparison / logic / bitwise / `where` / math family
//! ([`ElemOp`], issue 17).
//!
//! Contract:
//!
//! - Binary ops and `where` broadcast with numpy rules; operands (the two values of `where`)
//!   must share one dtype; a mismatch or a shape that does not broadcast is an error.
//! - Float data computes in `f64` and rounds once to the operand dtype (`f16`/`bf16`/`f32`
//!   results are exact or correctly rounded from the `f64` value); integer data computes in
//!   `i64` and wraps to its width; `bool` is 0/1.
//! - Comparisons, logical ops and `isnan`/`isinf`/`isfinite` give `bool`. Logical ops take
//!   `bool`; bitwise ops integers or `bool`; shifts integers (the amount reads as unsigned, as
//!   ONNX's `BitShift` does: a negative amount or one past the width shifts everything out,
//!   leaving 0, or the sign for an arithmetic right shift). `floor_mod`/`mod` by an integer zero is
//!   an error; `floor_mod`'s remainder has the divisor's sign, `mod`'s the dividend's (C `%`,
//!   `fmod`). `round` is half to even; `floor`/`ceil`/`round` leave integers unchanged, `sign`
//!   gives -1/0/1 (NaN stays NaN).
//!
//! ```text
//! m: R.Tensor((2, 3), dtype="bool") = R.less(x, y)         # x: (2, 1), y: (3,)
//! z: R.Tensor((2, 3), dtype="float32") = R.where(m, x, y)   # x where m else y
//! ```

use crate::util::{
    KResult, broadcast_shapes, broadcast_strides, gather, numel, tensor, zip_broadcast,
};
use fusebox_core::ir::DType;
use fusebox_core::op::{ElemClass, ElemOp};
use fusebox_core::runtime::{Storage, StorageRef, Tensor};

/// Runs `op` on its tensor arguments (already checked to be `op.arity()` of them).
pub(crate) fn eval(op: ElemOp, args: &[&Tensor]) -> KResult<Tensor> {
    let arg = |i: usize| {
        args.get(i)
            .copied()
            .ok_or_else(|| format!("missing argument {i}"))
    };
    match op.class() {
        ElemClass::Compare => compare(op, arg(0)?, arg(1)?),
        ElemClass::Logical if op == ElemOp::LogicalNot => logical_not(arg(0)?),
        ElemClass::Logical => logical(op, arg(0)?, arg(1)?),
        ElemClass::Bitwise if op == ElemOp::BitwiseNot => bitwise_not(arg(0)?),
        ElemClass::Bitwise => bitwise(op, arg(0)?, arg(1)?),
        ElemClass::Select => select(arg(0)?, arg(1)?, arg(2)?),
        ElemClass::Classify => classify(op, arg(0)?),
        ElemClass::Modulo => modulo(op, arg(0)?, arg(1)?),
        ElemClass::Rounding | ElemClass::FloatMath => unary(op, arg(0)?),
    }
}

/// The broadcast shape of `a` and `b`, with a checked element count.
fn bshape(a: &[usize], b: &[usize]) -> KResult<Vec<usize>> {
    let shape = broadcast_shapes(a, b)?;
    numel(&shape)?;
    Ok(shape)
}

fn same_dtype(a: &Tensor, b: &Tensor) -> KResult<DType> {
    if a.dtype() == b.dtype() {
        Ok(a.dtype())
    } else {
        Err(format!(
            "expected operands of the same dtype, found {} and {}",
            a.dtype(),
            b.dtype()
        ))
    }
}

/// `a op b` for comparisons: floats compare as `f64` (NaN compares unequal to everything),
/// integers and bool as `i64`.
fn compare(op: ElemOp, a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    let d = same_dtype(a, b)?;
    let shape = bshape(a.shape(), b.shape())?;
    let (sa, sb) = (a.shape(), b.shape());
    let out = if d.is_float() {
        let f: fn(f64, f64) -> bool = match op {
            ElemOp::Equal => |x, y| x == y,
            ElemOp::NotEqual => |x, y| x != y,
            ElemOp::Less => |x, y| x < y,
            ElemOp::LessEqual => |x, y| x <= y,
            ElemOp::Greater => |x, y| x > y,
            _ => |x, y| x >= y,
        };
        zip_broadcast(&a.to_f64_vec(), sa, &b.to_f64_vec(), sb, &shape, f)
    } else {
        let f: fn(i64, i64) -> bool = match op {
            ElemOp::Equal => |x, y| x == y,
            ElemOp::NotEqual => |x, y| x != y,
            ElemOp::Less => |x, y| x < y,
            ElemOp::LessEqual => |x, y| x <= y,
            ElemOp::Greater => |x, y| x > y,
            _ => |x, y| x >= y,
        };
        zip_broadcast(&a.to_i64_vec(), sa, &b.to_i64_vec(), sb, &shape, f)
    };
    tensor(shape, Storage::Bool(out))
}

fn bools<'t>(t: &'t Tensor, what: &str) -> KResult<&'t [bool]> {
    match t.storage() {
        StorageRef::Bool(v) => Ok(v),
        s => Err(format!(
            "expected {what} to have dtype bool, found {}",
            s.dtype()
        )),
    }
}

fn logical(op: ElemOp, a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    let (x, y) = (bools(a, "lhs")?, bools(b, "rhs")?);
    let shape = bshape(a.shape(), b.shape())?;
    let f: fn(bool, bool) -> bool = match op {
        ElemOp::LogicalAnd => |p, q| p & q,
        ElemOp::LogicalOr => |p, q| p | q,
        _ => |p, q| p ^ q,
    };
    let out = zip_broadcast(x, a.shape(), y, b.shape(), &shape, f);
    tensor(shape, Storage::Bool(out))
}

fn logical_not(a: &Tensor) -> KResult<Tensor> {
    let x = bools(a, "the input")?;
    tensor(
        a.shape().to_vec(),
        Storage::Bool(x.iter().map(|p| !p).collect()),
    )
}

fn int_like(d: DType, what: &str, bool_ok: bool) -> KResult<()> {
    if d.is_int() || (bool_ok && d == DType::Bool) {
        Ok(())
    } else {
        let want = if bool_ok {
            "an integer or bool dtype"
        } else {
            "an integer dtype"
        };
        Err(format!("expected {what} to have {want}, found {d}"))
    }
}

/// Bitwise and/or/xor and shifts in `i64`, wrapped back to the operand dtype.
fn bitwise(op: ElemOp, a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    let d = same_dtype(a, b)?;
    let shift = matches!(op, ElemOp::LeftShift | ElemOp::RightShift);
    int_like(d, "the operands", !shift)?;
    let shape = bshape(a.shape(), b.shape())?;
    let out = zip_broadcast(
        &a.to_i64_vec(),
        a.shape(),
        &b.to_i64_vec(),
        b.shape(),
        &shape,
        |x, y| match op {
            ElemOp::BitwiseAnd => x & y,
            ElemOp::BitwiseOr => x | y,
            ElemOp::BitwiseXor => x ^ y,
            // A negative amount reads as unsigned: at least the width (ONNX BitShift).
            ElemOp::LeftShift => match u32::try_from(y) {
                Ok(s) if s < 64 => x.wrapping_shl(s),
                _ => 0,
            },
            // Arithmetic: amounts past the width leave the sign.
            _ => x >> u32::try_from(y).map_or(63, |s| s.min(63)),
        },
    );
    tensor(shape, Storage::from_i64(d, out))
}

fn bitwise_not(a: &Tensor) -> KResult<Tensor> {
    let d = a.dtype();
    int_like(d, "the input", true)?;
    let data = match a.storage() {
        StorageRef::Bool(v) => Storage::Bool(v.iter().map(|p| !p).collect()),
        s => Storage::from_i64(d, s.to_i64_vec().into_iter().map(|x| !x).collect()),
    };
    tensor(a.shape().to_vec(), data)
}

/// `where(cond, x, y)` with three-way broadcasting; a non-bool condition counts as `!= 0`.
fn select(c: &Tensor, x: &Tensor, y: &Tensor) -> KResult<Tensor> {
    let d = same_dtype(x, y)?;
    let shape = bshape(&bshape(c.shape(), x.shape())?, y.shape())?;
    let cond: Vec<bool> = match c.storage() {
        StorageRef::Bool(v) => v.to_vec(),
        s => s.to_f64_vec().iter().map(|v| *v != 0.0).collect(),
    };
    let cond = gather(&cond, 0, &broadcast_strides(c.shape(), &shape), &shape);
    let xs = broadcast_strides(x.shape(), &shape);
    let ys = broadcast_strides(y.shape(), &shape);
    macro_rules! pick {
        ($p:expr, $q:expr, $var:ident) => {{
            let p = gather($p, 0, &xs, &shape);
            let q = gather($q, 0, &ys, &shape);
            Storage::$var(
                cond.iter()
                    .zip(p.into_iter().zip(q))
                    .map(|(k, (u, v))| if *k { u } else { v })
                    .collect(),
            )
        }};
    }
    let data = match (x.storage(), y.storage()) {
        (StorageRef::F16(p), StorageRef::F16(q)) => pick!(p, q, F16),
        (StorageRef::BF16(p), StorageRef::BF16(q)) => pick!(p, q, BF16),
        (StorageRef::F32(p), StorageRef::F32(q)) => pick!(p, q, F32),
        (StorageRef::F64(p), StorageRef::F64(q)) => pick!(p, q, F64),
        (StorageRef::I8(p), StorageRef::I8(q)) => pick!(p, q, I8),
        (StorageRef::U8(p), StorageRef::U8(q)) => pick!(p, q, U8),
        (StorageRef::I32(p), StorageRef::I32(q)) => pick!(p, q, I32),
        (StorageRef::I64(p), StorageRef::I64(q)) => pick!(p, q, I64),
        (StorageRef::Bool(p), StorageRef::Bool(q)) => pick!(p, q, Bool),
        _ => return Err(format!("operand dtypes differ ({d})")),
    };
    tensor(shape, data)
}

fn classify(op: ElemOp, a: &Tensor) -> KResult<Tensor> {
    let out: Vec<bool> = if a.dtype().is_float() {
        let f: fn(f64) -> bool = match op {
            ElemOp::IsNan => f64::is_nan,
            ElemOp::IsInf => f64::is_infinite,
            _ => f64::is_finite,
        };
        a.to_f64_vec().into_iter().map(f).collect()
    } else {
        // Integers and bool are never NaN or infinite.
        vec![op == ElemOp::IsFinite; a.numel()]
    };
    tensor(a.shape().to_vec(), Storage::Bool(out))
}

fn modulo(op: ElemOp, a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    let d = same_dtype(a, b)?;
    let shape = bshape(a.shape(), b.shape())?;
    let floor = op == ElemOp::FloorMod;
    if d.is_float() {
        let out = zip_broadcast(
            &a.to_f64_vec(),
            a.shape(),
            &b.to_f64_vec(),
            b.shape(),
            &shape,
            |x, y| float_mod(x, y, floor),
        );
        return tensor(shape, Storage::from_f64(d, out));
    }
    int_like(d, "the operands", false)?;
    let mut by_zero = false;
    let out = zip_broadcast(
        &a.to_i64_vec(),
        a.shape(),
        &b.to_i64_vec(),
        b.shape(),
        &shape,
        |x, y| {
            if y == 0 {
                by_zero = true;
                return 0;
            }
            let r = x.wrapping_rem(y);
            if floor && r != 0 && (r < 0) != (y < 0) {
                r.wrapping_add(y)
            } else {
                r
            }
        },
    );
    if by_zero {
        return Err("integer modulo by zero".to_string());
    }
    tensor(shape, Storage::from_i64(d, out))
}

/// `x mod y` of float data in `f64`: the dividend's sign (`fmod`), or with `floor` the
/// divisor's (Python's `%`).
#[inline(always)]
pub(crate) fn float_mod(x: f64, y: f64, floor: bool) -> f64 {
    let r = x % y;
    if floor && r != 0.0 && (r < 0.0) != (y < 0.0) {
        r + y
    } else {
        r
    }
}

/// The `f64` function of a rounding or float-math op.
pub(crate) fn float_fn(op: ElemOp) -> fn(f64) -> f64 {
    match op {
        ElemOp::Floor => f64::floor,
        ElemOp::Ceil => f64::ceil,
        ElemOp::Round => f64::round_ties_even,
        ElemOp::Sign => |x| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        },
        ElemOp::Sin => f64::sin,
        ElemOp::Cos => f64::cos,
        ElemOp::Tan => f64::tan,
        ElemOp::Asin => f64::asin,
        ElemOp::Acos => f64::acos,
        ElemOp::Atan => f64::atan,
        ElemOp::Sinh => f64::sinh,
        ElemOp::Cosh => f64::cosh,
        ElemOp::Asinh => f64::asinh,
        ElemOp::Acosh => f64::acosh,
        _ => f64::atanh,
    }
}

fn unary(op: ElemOp, a: &Tensor) -> KResult<Tensor> {
    let d = a.dtype();
    if d.is_float() {
        let f = float_fn(op);
        let out = a.to_f64_vec().into_iter().map(f).collect();
        return tensor(a.shape().to_vec(), Storage::from_f64(d, out));
    }
    if op.class() == ElemClass::FloatMath || !d.is_int() {
        let want = if op.class() == ElemClass::FloatMath {
            "a float dtype"
        } else {
            "a float or integer dtype"
        };
        return Err(format!("expected the input to have {want}, found {d}"));
    }
    if op == ElemOp::Sign {
        let out = a.to_i64_vec().into_iter().map(i64::signum).collect();
        return tensor(a.shape().to_vec(), Storage::from_i64(d, out));
    }
    // floor, ceil and round of an integer are the integer.
    Ok(a.clone())
}

#[cfg(test)]
mod tests {
    //! Each kernel against values computed by hand or by naive loops written here.
    #![allow(clippy::unwrap_used, reason = "test code: a failure is a panic")]

    use super::*;
    use half::f16;

    type Cmp = fn(f32, f32) -> bool;
    type Math = fn(f64) -> f64;

    fn f32t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32(shape.to_vec(), v.to_vec()).unwrap()
    }
    fn i64t(shape: &[usize], v: &[i64]) -> Tensor {
        Tensor::from_i64(shape.to_vec(), v.to_vec()).unwrap()
    }
    fn typed(shape: &[usize], d: DType, v: &[i64]) -> Tensor {
        Tensor::new(shape.to_vec(), Storage::from_i64(d, v.to_vec())).unwrap()
    }
    fn boolt(shape: &[usize], v: &[bool]) -> Tensor {
        Tensor::new(shape.to_vec(), Storage::Bool(v.to_vec())).unwrap()
    }
    fn bools_of(t: &Tensor) -> Vec<bool> {
        match t.storage() {
            StorageRef::Bool(v) => v.to_vec(),
            s => panic!("not bool: {}", s.dtype()),
        }
    }

    #[test]
    fn comparisons_broadcast_against_naive_loops() {
        let x = f32t(&[2, 1], &[1.0, f32::NAN]);
        let y = f32t(&[3], &[0.0, 1.0, 2.0]);
        let xs = [1.0f32, f32::NAN];
        let ys = [0.0f32, 1.0, 2.0];
        let cases: [(ElemOp, Cmp); 6] = [
            (ElemOp::Equal, |a, b| a == b),
            (ElemOp::NotEqual, |a, b| a != b),
            (ElemOp::Less, |a, b| a < b),
            (ElemOp::LessEqual, |a, b| a <= b),
            (ElemOp::Greater, |a, b| a > b),
            (ElemOp::GreaterEqual, |a, b| a >= b),
        ];
        for (op, f) in cases {
            let r = eval(op, &[&x, &y]).unwrap();
            assert_eq!(r.shape(), &[2, 3]);
            let mut want = Vec::new();
            for a in xs {
                for b in ys {
                    want.push(f(a, b));
                }
            }
            assert_eq!(bools_of(&r), want, "{op:?}");
        }
        // Integers compare exactly, beyond f64's 2^53.
        let big = i64t(&[2], &[(1 << 60) + 1, -3]);
        let big2 = i64t(&[2], &[1 << 60, -3]);
        let r = eval(ElemOp::Greater, &[&big, &big2]).unwrap();
        assert_eq!(bools_of(&r), [true, false]);
        let r = eval(ElemOp::Equal, &[&big, &big2]).unwrap();
        assert_eq!(bools_of(&r), [false, true]);
        // Mixed dtypes and bad shapes are errors.
        assert!(eval(ElemOp::Less, &[&x, &big]).is_err());
        let z = f32t(&[2], &[0.0, 0.0]);
        assert!(eval(ElemOp::Less, &[&y, &z]).is_err());
    }

    #[test]
    fn logical_ops_truth_tables() {
        let a = boolt(&[4], &[false, false, true, true]);
        let b = boolt(&[4], &[false, true, false, true]);
        let and = eval(ElemOp::LogicalAnd, &[&a, &b]).unwrap();
        let or = eval(ElemOp::LogicalOr, &[&a, &b]).unwrap();
        let xor = eval(ElemOp::LogicalXor, &[&a, &b]).unwrap();
        let not = eval(ElemOp::LogicalNot, &[&a]).unwrap();
        assert_eq!(bools_of(&and), [false, false, false, true]);
        assert_eq!(bools_of(&or), [false, true, true, true]);
        assert_eq!(bools_of(&xor), [false, true, true, false]);
        assert_eq!(bools_of(&not), [true, true, false, false]);
        // A scalar broadcasts.
        let t = boolt(&[], &[true]);
        let r = eval(ElemOp::LogicalAnd, &[&a, &t]).unwrap();
        assert_eq!(bools_of(&r), [false, false, true, true]);
        let f = f32t(&[4], &[0.0; 4]);
        assert!(
            eval(ElemOp::LogicalOr, &[&f, &f])
                .unwrap_err()
                .contains("bool")
        );
    }

    #[test]
    fn bitwise_ops_wrap_to_the_dtype() {
        let a = typed(&[3], DType::U8, &[0b1100, 255, 1]);
        let b = typed(&[3], DType::U8, &[0b1010, 1, 7]);
        let r = |op, x: &Tensor, y: &Tensor| eval(op, &[x, y]).unwrap().to_i64_vec();
        assert_eq!(r(ElemOp::BitwiseAnd, &a, &b), [0b1000, 1, 1]);
        assert_eq!(r(ElemOp::BitwiseOr, &a, &b), [0b1110, 255, 7]);
        assert_eq!(r(ElemOp::BitwiseXor, &a, &b), [0b0110, 254, 6]);
        // u8 shifts: bits past the width fall off.
        assert_eq!(r(ElemOp::LeftShift, &a, &b), [0, 254, 128]);
        assert_eq!(r(ElemOp::RightShift, &a, &b), [0, 127, 0]);
        let n = eval(ElemOp::BitwiseNot, &[&a]).unwrap();
        assert_eq!(n.dtype(), DType::U8);
        assert_eq!(n.to_i64_vec(), [255 - 12, 0, 254]);
        // Signed: not is -x-1, right shift is arithmetic.
        let s = typed(&[2], DType::I32, &[-8, 5]);
        let one = typed(&[], DType::I32, &[1]);
        assert_eq!(
            eval(ElemOp::BitwiseNot, &[&s]).unwrap().to_i64_vec(),
            [7, -6]
        );
        assert_eq!(r(ElemOp::RightShift, &s, &one), [-4, 2]);
        assert_eq!(r(ElemOp::LeftShift, &s, &one), [-16, 10]);
        let big = typed(&[], DType::I32, &[70]);
        assert_eq!(r(ElemOp::LeftShift, &s, &big), [0, 0]);
        assert_eq!(r(ElemOp::RightShift, &s, &big), [-1, 0]);
        let neg = typed(&[], DType::I32, &[-1]);
        assert_eq!(r(ElemOp::LeftShift, &s, &neg), [0, 0]);
        assert_eq!(r(ElemOp::RightShift, &s, &neg), [-1, 0]);
        // Bool bitwise ops.
        let t = boolt(&[2], &[true, false]);
        assert_eq!(
            bools_of(&eval(ElemOp::BitwiseNot, &[&t]).unwrap()),
            [false, true]
        );
        assert_eq!(
            bools_of(&eval(ElemOp::BitwiseXor, &[&t, &t]).unwrap()),
            [false, false]
        );
        let f = f32t(&[2], &[1.0, 2.0]);
        assert!(eval(ElemOp::BitwiseAnd, &[&f, &f]).is_err());
        assert!(eval(ElemOp::LeftShift, &[&t, &t]).is_err());
    }

    #[test]
    fn where_broadcasts_three_ways_for_every_dtype() {
        let c = boolt(&[2, 1], &[true, false]);
        for d in DType::ALL {
            let x = Tensor::new(vec![3], Storage::from_f64(d, vec![1.0, 0.0, 1.0])).unwrap();
            let y = Tensor::new(vec![], Storage::from_f64(d, vec![0.0])).unwrap();
            let r = eval(ElemOp::Where, &[&c, &x, &y]).unwrap();
            assert_eq!(r.dtype(), d);
            assert_eq!(r.shape(), &[2, 3]);
            // Naive loop: row 0 takes x, row 1 takes y.
            let mut want = Vec::new();
            for i in 0..2 {
                for j in 0..3 {
                    want.push(if i == 0 { [1.0, 0.0, 1.0][j] } else { 0.0 });
                }
            }
            assert_eq!(r.to_f64_vec(), want, "{d}");
        }
        let x = f32t(&[2], &[1.0, 2.0]);
        let y = i64t(&[2], &[1, 2]);
        assert!(eval(ElemOp::Where, &[&c, &x, &y]).is_err());
        let z = f32t(&[5], &[0.0; 5]);
        assert!(eval(ElemOp::Where, &[&c, &z, &x]).is_err());
    }

    #[test]
    fn isnan_isinf_isfinite() {
        let x = f32t(&[4], &[1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        assert_eq!(
            bools_of(&eval(ElemOp::IsNan, &[&x]).unwrap()),
            [false, true, false, false]
        );
        assert_eq!(
            bools_of(&eval(ElemOp::IsInf, &[&x]).unwrap()),
            [false, false, true, true]
        );
        assert_eq!(
            bools_of(&eval(ElemOp::IsFinite, &[&x]).unwrap()),
            [true, false, false, false]
        );
        let h = Tensor::new(vec![2], Storage::F16(vec![f16::NAN, f16::ONE])).unwrap();
        assert_eq!(
            bools_of(&eval(ElemOp::IsNan, &[&h]).unwrap()),
            [true, false]
        );
        let i = i64t(&[2], &[1, 2]);
        assert_eq!(
            bools_of(&eval(ElemOp::IsInf, &[&i]).unwrap()),
            [false, false]
        );
    }

    #[test]
    fn floor_mod_and_mod_signs() {
        let a = i64t(&[4], &[7, -7, 7, -7]);
        let b = i64t(&[4], &[3, 3, -3, -3]);
        // Python's % (floor) and C's % (truncating).
        assert_eq!(
            eval(ElemOp::FloorMod, &[&a, &b]).unwrap().to_i64_vec(),
            [1, 2, -2, -1]
        );
        assert_eq!(
            eval(ElemOp::Mod, &[&a, &b]).unwrap().to_i64_vec(),
            [1, -1, 1, -1]
        );
        let af = f32t(&[4], &[5.5, -5.5, 5.5, -5.5]);
        let bf = f32t(&[4], &[2.0, 2.0, -2.0, -2.0]);
        assert_eq!(
            eval(ElemOp::Mod, &[&af, &bf]).unwrap().to_f32_vec(),
            [1.5, -1.5, 1.5, -1.5]
        );
        assert_eq!(
            eval(ElemOp::FloorMod, &[&af, &bf]).unwrap().to_f32_vec(),
            [1.5, 0.5, -0.5, -1.5]
        );
        let z = i64t(&[], &[0]);
        assert!(eval(ElemOp::Mod, &[&a, &z]).unwrap_err().contains("zero"));
        let u = typed(&[2], DType::U8, &[200, 7]);
        let v = typed(&[2], DType::U8, &[7, 200]);
        assert_eq!(
            eval(ElemOp::FloorMod, &[&u, &v]).unwrap().to_i64_vec(),
            [4, 7]
        );
    }

    #[test]
    fn rounding_sign_and_trig() {
        let x = f32t(&[6], &[0.5, 1.5, 2.5, -0.5, -1.7, 0.0]);
        let get = |op| eval(op, &[&x]).unwrap().to_f32_vec();
        assert_eq!(get(ElemOp::Round), [0.0, 2.0, 2.0, -0.0, -2.0, 0.0]);
        assert_eq!(get(ElemOp::Floor), [0.0, 1.0, 2.0, -1.0, -2.0, 0.0]);
        assert_eq!(get(ElemOp::Ceil), [1.0, 2.0, 3.0, -0.0, -1.0, 0.0]);
        assert_eq!(get(ElemOp::Sign), [1.0, 1.0, 1.0, -1.0, -1.0, 0.0]);
        let i = typed(&[3], DType::I8, &[-5, 0, 9]);
        assert_eq!(eval(ElemOp::Sign, &[&i]).unwrap().to_i64_vec(), [-1, 0, 1]);
        assert_eq!(eval(ElemOp::Round, &[&i]).unwrap().to_i64_vec(), [-5, 0, 9]);
        assert!(eval(ElemOp::Sin, &[&i]).unwrap_err().contains("float"));
        let v = f32t(&[2], &[0.25, -0.5]);
        let trig: [(ElemOp, Math); 11] = [
            (ElemOp::Sin, |t| t.sin()),
            (ElemOp::Cos, |t| t.cos()),
            (ElemOp::Tan, |t| t.sin() / t.cos()),
            (ElemOp::Asin, |t| t.asin()),
            (ElemOp::Acos, |t| t.acos()),
            (ElemOp::Atan, |t| t.atan()),
            (ElemOp::Sinh, |t| (t.exp() - (-t).exp()) / 2.0),
            (ElemOp::Cosh, |t| (t.exp() + (-t).exp()) / 2.0),
            (ElemOp::Asinh, |t| (t + (t * t + 1.0).sqrt()).ln()),
            (ElemOp::Acosh, |t| {
                (t.abs() + 1.0 + ((t.abs() + 1.0).powi(2) - 1.0).sqrt()).ln()
            }),
            (ElemOp::Atanh, |t| 0.5 * ((1.0 + t) / (1.0 - t)).ln()),
        ];
        for (op, f) in trig {
            // acosh needs x >= 1: feed |x| + 1.
            let input = if op == ElemOp::Acosh {
                f32t(&[2], &[1.25, 1.5])
            } else {
                v.clone()
            };
            let got = eval(op, &[&input]).unwrap().to_f64_vec();
            for (k, g) in got.iter().enumerate() {
                let t = [0.25f64, -0.5][k];
                let want = f(t) as f32;
                assert!(
                    (g - f64::from(want)).abs() <= 1e-6,
                    "{op:?}({t}) = {g}, want {want}"
                );
            }
        }
    }
}
