//! Comparing results: the one element rule `fusebox run --check` and the tests share.
//!
//! Contract: [`close`] says whether two elements agree within an absolute tolerance. NaN
//! equals only NaN, +inf only +inf and −inf only −inf; any other pair agrees when
//! `|a − b| ≤ tol`. (The naive `(a - b).abs() > tol` test lets a NaN on either side pass,
//! since every comparison with NaN is false.) [`first_mismatch`] applies it to two tensors
//! with a per-dtype tolerance relative to the expected output's largest finite magnitude.
//!
//! ```
//! use fusebox::compare::close;
//! assert!(close(f64::NAN, f64::NAN, 0.0));
//! assert!(!close(f64::NAN, 0.0, 1e9));
//! assert!(!close(f64::INFINITY, f64::MAX, 1e300));
//! assert!(close(1.0, 1.0 + 1e-9, 1e-6));
//! ```

use fusebox_core::ir::DType;
use fusebox_cpu::Tensor;

/// Whether `a` and `b` agree: NaN only with NaN, an infinity only with itself, and finite
/// values within `tol`.
pub fn close(a: f64, b: f64, tol: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    if a.is_infinite() || b.is_infinite() {
        return a == b;
    }
    (a - b).abs() <= tol
}

/// The tolerance of `--check` for a dtype, relative to the output's range: f32 1e-4,
/// f16/bf16 1e-2, f64 1e-8, integers and bool exact.
pub fn relative_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-4,
        DType::F16 | DType::BF16 => 1e-2,
        DType::F64 => 1e-8,
        _ => 0.0,
    }
}

/// Why `got` differs from `want` (shape, dtype, or the first element that is not [`close`]
/// within [`relative_tolerance`] times the largest finite magnitude of `want`, at least 1), or
/// `None` when they agree. Reductions of many terms legitimately differ by a few ulps of their
/// largest partial sums, hence the scale.
pub fn first_mismatch(got: &Tensor, want: &Tensor) -> Option<String> {
    if got.shape() != want.shape() || got.dtype() != want.dtype() {
        return Some(format!(
            "{:?} {} vs {:?} {}",
            got.shape(),
            got.dtype(),
            want.shape(),
            want.dtype()
        ));
    }
    let w = want.to_f64_vec();
    let scale = w
        .iter()
        .filter(|x| x.is_finite())
        .fold(1.0f64, |m, x| m.max(x.abs()));
    let tol = relative_tolerance(got.dtype()) * scale;
    got.to_f64_vec()
        .iter()
        .zip(&w)
        .enumerate()
        .find(|&(_, (&a, &b))| !close(a, b, tol))
        .map(|(i, (a, b))| format!("element {i}: {a} vs {b}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_and_infinities_equal_only_themselves() {
        let (nan, inf) = (f64::NAN, f64::INFINITY);
        assert!(close(nan, nan, 0.0));
        assert!(!close(nan, 0.0, f64::MAX));
        assert!(!close(0.0, nan, f64::MAX));
        assert!(!close(nan, inf, f64::MAX));
        assert!(close(inf, inf, 0.0));
        assert!(close(-inf, -inf, 0.0));
        assert!(!close(inf, -inf, f64::MAX));
        assert!(!close(inf, 1e308, f64::MAX));
        assert!(close(1.0, 1.5, 0.5));
        assert!(!close(1.0, 1.5, 0.49));
    }

    #[test]
    fn a_nan_output_is_not_hidden_by_a_zero() {
        // The defect of issue 18: a backend that turns NaN into 0 passed `--check`.
        let want = Tensor::from_f32(vec![3], vec![1.0, f32::NAN, 2.0]).unwrap();
        let got = Tensor::from_f32(vec![3], vec![1.0, 0.0, 2.0]).unwrap();
        let why = first_mismatch(&got, &want).expect("NaN against 0 must differ");
        assert_eq!(why, "element 1: 0 vs NaN");
        assert_eq!(
            first_mismatch(&want, &got).as_deref(),
            Some("element 1: NaN vs 0")
        );
        assert_eq!(first_mismatch(&want, &want.clone()), None);
        let inf = Tensor::from_f32(vec![1], vec![f32::INFINITY]).unwrap();
        let big = Tensor::from_f32(vec![1], vec![f32::MAX]).unwrap();
        assert!(first_mismatch(&big, &inf).is_some());
    }
}
