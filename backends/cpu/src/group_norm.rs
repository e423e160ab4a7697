//! `relax.nn.group_norm` and `relax.nn.instance_norm`: the channels along `channel_axis` split
//! into groups (one per channel for instance norm); each group is normalised over its channels
//! and `axes`, then scaled and shifted per channel.
//!
//! Contract: float dtypes; computes in `f64` (two passes: mean, then variance of the centred
//! values) and rounds once to the input dtype. Bad axes, a channel count not divisible by the
//! groups, or per-channel parameters of the wrong length are errors.
//!
//! ```text
//! y: R.Tensor((2, 6, 4, 4), dtype="float32") = R.nn.group_norm(x, gamma, beta, num_groups=3,
//!     channel_axis=1, axes=[2, 3], epsilon=1e-05, center=True, scale=True)
//! ```

use crate::util::{KResult, floats, from_f64, norm_axes, norm_axis, strides};
use fusebox_core::op::GroupNormAttrs;
use fusebox_core::runtime::Tensor;

fn per_channel(t: &Tensor, c: usize, what: &str) -> KResult<Vec<f64>> {
    if t.shape() != [c] {
        return Err(format!(
            "expected {what} to have shape [{c}] (one value per channel), found {:?}",
            t.shape()
        ));
    }
    floats(t, what)
}

/// `group_norm(x, gamma, beta)` (`num_groups == 0`: instance norm).
pub(crate) fn group_norm(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    a: &GroupNormAttrs,
) -> KResult<Tensor> {
    let shape = x.shape();
    let r = shape.len();
    let ch = norm_axis(a.channel_axis, r)?;
    let axes = norm_axes(&a.axes, r)?;
    if axes.contains(&ch) {
        return Err(format!(
            "the channel axis {} is also in axes {:?}",
            a.channel_axis, a.axes
        ));
    }
    let c = shape[ch];
    let groups = if a.num_groups == 0 {
        c.max(1)
    } else {
        usize::try_from(a.num_groups)
            .ok()
            .filter(|&g| g >= 1)
            .ok_or_else(|| format!("invalid num_groups {}", a.num_groups))?
    };
    if !c.is_multiple_of(groups) {
        return Err(format!(
            "the {c} channels are not divisible by num_groups={groups}"
        ));
    }
    let cpg = (c / groups).max(1);
    let g = per_channel(gamma, c, "gamma")?;
    let b = per_channel(beta, c, "beta")?;
    let xs = floats(x, "data")?;
    let st = strides(shape);
    let kept: Vec<usize> = (0..r).filter(|i| *i != ch && !axes.contains(i)).collect();
    // The row (kept coordinates, group) and the channel of every element.
    let mut rows = Vec::with_capacity(xs.len());
    let mut chans = Vec::with_capacity(xs.len());
    for i in 0..xs.len() {
        let coord = |ax: usize| (i / st[ax]) % shape[ax];
        let mut row = 0usize;
        for &k in &kept {
            row = row * shape[k] + coord(k);
        }
        let cc = coord(ch);
        rows.push(row * groups + cc / cpg);
        chans.push(cc);
    }
    let n_rows = kept.iter().map(|&k| shape[k]).product::<usize>() * groups;
    let count = (cpg * axes.iter().map(|&k| shape[k]).product::<usize>()) as f64;
    let mut mean = vec![0.0; n_rows];
    for (v, &row) in xs.iter().zip(&rows) {
        mean[row] += v;
    }
    mean.iter_mut().for_each(|m| *m /= count);
    let mut var = vec![0.0; n_rows];
    for (v, &row) in xs.iter().zip(&rows) {
        let d = v - mean[row];
        var[row] += d * d;
    }
    let eps = a.epsilon.0;
    let inv: Vec<f64> = var.iter().map(|v| 1.0 / (v / count + eps).sqrt()).collect();
    let out: Vec<f64> = xs
        .iter()
        .zip(rows.iter().zip(&chans))
        .map(|(v, (&row, &cc))| {
            let mut y = (v - mean[row]) * inv[row];
            if a.scale {
                y *= g[cc];
            }
            if a.center {
                y += b[cc];
            }
            y
        })
        .collect();
    from_f64(shape.to_vec(), x.dtype(), out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::ir::DType;
    use fusebox_core::op::F64;
    use fusebox_core::runtime::Storage;

    fn t64(shape: &[usize], v: Vec<f64>) -> Tensor {
        Tensor::new(shape.to_vec(), Storage::F64(v)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn attrs(groups: i64, ch: i64, axes: &[i64]) -> GroupNormAttrs {
        GroupNormAttrs {
            num_groups: groups,
            channel_axis: ch,
            axes: axes.to_vec(),
            epsilon: F64(0.0),
            center: true,
            scale: true,
        }
    }

    #[test]
    fn two_groups_by_hand() {
        // N = 1, C = 4 (groups {0, 1} and {2, 3}), 2 positions each: group 0 holds
        // 1, 3, 5, 7 (mean 4, variance 5), group 1 holds 2, 2, 2, 6 (mean 3, variance 3).
        let x = t64(&[1, 4, 2], vec![1.0, 3.0, 5.0, 7.0, 2.0, 2.0, 2.0, 6.0]);
        let gamma = t64(&[4], vec![1.0, 2.0, 1.0, 1.0]);
        let beta = t64(&[4], vec![0.0, 0.0, 10.0, 0.0]);
        let y = group_norm(&x, &gamma, &beta, &attrs(2, 1, &[2])).unwrap_or_else(|e| panic!("{e}"));
        let s5 = 5f64.sqrt();
        let s3 = 3f64.sqrt();
        let want = [
            -3.0 / s5,
            -1.0 / s5,
            2.0 / s5,
            6.0 / s5,
            10.0 - 1.0 / s3,
            10.0 - 1.0 / s3,
            -1.0 / s3,
            3.0 / s3,
        ];
        for (g, w) in y.to_f64_vec().iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{g} vs {w}");
        }
    }

    #[test]
    fn instance_norm_is_per_channel_and_channel_last_works() {
        // Channel last: x[n, h, c]; instance norm normalises each channel over h.
        let x = t64(&[1, 2, 2], vec![1.0, 10.0, 3.0, 30.0]);
        let ones = t64(&[2], vec![1.0, 1.0]);
        let zeros = t64(&[2], vec![0.0, 0.0]);
        let y =
            group_norm(&x, &ones, &zeros, &attrs(0, -1, &[1])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(y.to_f64_vec(), vec![-1.0, -1.0, 1.0, 1.0]);
        let y16 = group_norm(
            &x.cast(DType::F16),
            &ones.cast(DType::F16),
            &zeros.cast(DType::F16),
            &attrs(0, 2, &[1]),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(y16.dtype(), DType::F16);
        assert_eq!(y16.to_f64_vec(), vec![-1.0, -1.0, 1.0, 1.0]);
    }

    #[test]
    fn bad_attributes_and_parameters_are_errors() {
        let x = t64(&[1, 4, 2], vec![0.0; 8]);
        let p4 = t64(&[4], vec![1.0; 4]);
        let p3 = t64(&[3], vec![1.0; 3]);
        assert!(
            group_norm(&x, &p4, &p4, &attrs(3, 1, &[2])).is_err_and(|e| e.contains("divisible"))
        );
        assert!(group_norm(&x, &p3, &p4, &attrs(2, 1, &[2])).is_err_and(|e| e.contains("gamma")));
        assert!(
            group_norm(&x, &p4, &p4, &attrs(2, 1, &[1])).is_err_and(|e| e.contains("channel axis"))
        );
        assert!(group_norm(&x, &p4, &p4, &attrs(2, 5, &[2])).is_err());
        let xi = x.cast(DType::I32);
        assert!(group_norm(&xi, &p4, &p4, &attrs(2, 1, &[2])).is_err_and(|e| e.contains("float")));
    }
}
