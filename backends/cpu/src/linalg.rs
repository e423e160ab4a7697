//! The `relax.det` kernel: the determinant of each matrix of the last two axes.
//!
//! Contract: each `M × M` matrix is factored by `faer`'s LU with partial pivoting (the method
//! numpy's and onnxruntime's `det` use: the product of `U`'s diagonal, negated for an odd
//! number of row swaps) in `f64`, and the result rounded once to the input's dtype; a `0 × 0`
//! matrix has determinant 1 (the empty product, as numpy gives). Each matrix is factored on its
//! own, sequentially, so the result does not depend on the thread count.
//!
//! ```text
//! d: R.Tensor((3,), dtype="float32") = R.det(x)   # x: (3, 2, 2)
//! ```

use crate::util::{KResult, from_f64};
use fusebox_core::runtime::Tensor;

/// `det(x)`: `x` is `(*, M, M)` of a float dtype; the result is `(*)`.
pub(crate) fn det(x: &Tensor) -> KResult<Tensor> {
    let s = x.shape();
    if s.len() < 2 || s[s.len() - 1] != s[s.len() - 2] {
        return Err(format!(
            "expected square matrices (*, M, M), found shape {s:?}"
        ));
    }
    if !x.dtype().is_float() {
        return Err(format!("expected a float input, found {}", x.dtype()));
    }
    let m = s[s.len() - 1];
    let out_shape = s[..s.len() - 2].to_vec();
    let v = x.to_f64_vec();
    let count: usize = out_shape.iter().product();
    let dets = (0..count)
        .map(|i| {
            if m == 0 {
                return 1.0;
            }
            let a = &v[i * m * m..(i + 1) * m * m];
            faer::MatRef::from_row_major_slice(a, m, m).determinant()
        })
        .collect();
    from_f64(out_shape, x.dtype(), dets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::runtime::Storage;

    /// Leibniz's formula: the signed sum over every permutation of the products it picks.
    fn leibniz(a: &[f64], m: usize) -> f64 {
        fn perms(k: usize, p: &mut Vec<usize>, used: &mut Vec<bool>, a: &[f64], m: usize) -> f64 {
            if k == m {
                let inversions = (0..m)
                    .flat_map(|i| (i + 1..m).map(move |j| (i, j)))
                    .filter(|&(i, j)| p[i] > p[j])
                    .count();
                let sign = if inversions % 2 == 0 { 1.0 } else { -1.0 };
                return sign * (0..m).map(|i| a[i * m + p[i]]).product::<f64>();
            }
            let mut s = 0.0;
            for c in 0..m {
                if !used[c] {
                    used[c] = true;
                    p.push(c);
                    s += perms(k + 1, p, used, a, m);
                    p.pop();
                    used[c] = false;
                }
            }
            s
        }
        perms(0, &mut Vec::new(), &mut vec![false; m], a, m)
    }

    /// Deterministic test values in [-2, 2) as `f64`.
    fn seq(n: usize, seed: u64) -> Vec<f64> {
        crate::util::test_values(n, seed)
            .into_iter()
            .map(|v| 2.0 * f64::from(v))
            .collect()
    }

    fn t64(shape: &[usize], v: Vec<f64>) -> Tensor {
        Tensor::new(shape.to_vec(), Storage::F64(v)).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn batched_determinants_are_leibniz_s_sums() {
        for m in 1..=6 {
            let v = seq(3 * 2 * m * m, m as u64);
            let d = det(&t64(&[3, 2, m, m], v.clone())).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(d.shape(), &[3, 2]);
            for (i, got) in d.to_f64_vec().iter().enumerate() {
                let want = leibniz(&v[i * m * m..(i + 1) * m * m], m);
                assert!(
                    (got - want).abs() <= 1e-9 * want.abs().max(1.0),
                    "m={m} #{i}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn singular_identity_swapped_and_empty_matrices() {
        let d = |shape: &[usize], v: Vec<f64>| {
            det(&t64(shape, v))
                .unwrap_or_else(|e| panic!("{e}"))
                .to_f64_vec()
        };
        assert_eq!(
            d(&[3, 3], vec![1.0, 2.0, 3.0, 2.0, 4.0, 6.0, 0.0, 1.0, 5.0]),
            [0.0]
        );
        assert_eq!(d(&[2, 2], vec![0.0, 1.0, 1.0, 0.0]), [-1.0]);
        assert_eq!(
            d(&[3, 3], vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]),
            [1.0]
        );
        assert_eq!(d(&[2, 0, 0], vec![]), [1.0, 1.0]);
        assert_eq!(d(&[0, 3, 3], vec![]), Vec::<f64>::new());
        let rect = det(&t64(&[2, 3], vec![0.0; 6])).err().unwrap_or_default();
        assert!(rect.contains("square"), "{rect}");
        let ints = Tensor::from_i64(vec![1, 1], vec![3]).unwrap_or_else(|e| panic!("{e}"));
        assert!(det(&ints).is_err_and(|e| e.contains("float")));
    }
}
