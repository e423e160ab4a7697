//! Mixture-of-experts SiLU-gated MLPs (Mixtral's experts, as both torch exporters write them)
//! without gathering a weight matrix per token.
//!
//! Contract: [`moe_silu_gated`] computes, for tokens `x: [M, H]` (each token already repeated
//! once per expert the router chose for it), the experts' indices `idx: [M]` or `[M, 1]`, the
//! experts' gate-and-up weights `wgu: [E, 2I, H]` and down weights `wd: [E, H, I]`,
//!
//! ```text
//! y[m]   = wgu[idx[m]] @ x[m]                     [2I]   ; take / gather_nd, matmul, squeeze
//! h[m]   = silu(y[m][gate]) · y[m][up]            [I]    ; gate, up: the halves [0, I), [I, 2I)
//! out[m] = wd[idx[m]] @ h[m]                      [H]
//! ```
//!
//! as the graph does with a gathered `[M, 2I, H]` and `[M, H, I]` copy of the weights and
//! batched matrix-vector products, but grouped by expert: the rows routed to one expert are
//! two GEMMs against that expert's weights where they lie (Mixtral-8x7B's experts are
//! 14336 × 4096: the graph copies 705 MB of weights per token and expert). A negative index
//! counts from the end, as `take` and `gather_nd` do; `Ok(None)` for an index out of range or
//! shapes that do not chain (the caller interprets the body then, which reports them). The
//! rows of each expert are cut into blocks of [`ROWS`] in index order, one task each with its
//! two GEMMs sequential, so the result is the same for every thread count (the sums run in
//! another order than the graph's matrix-vector products: equal up to rounding).
//!
//! ```text
//! ; cpu.moe_silu_gated (dynamo form; TorchScript takes with `take` and two strided slices)
//! g1: R.Tensor((m, 128, 32), dtype="float32") = R.gather_nd(wgu, idx, batch_dims=0)
//! e1: R.Tensor((m, 32, 1), dtype="float32") = R.expand_dims(x, axis=[2])
//! y:  R.Tensor((m, 128), dtype="float32") = R.squeeze(R.matmul(g1, e1), axis=[2])  ; two bindings
//! ; split(y, 2, axis=1) → gate, up; h = multiply(multiply(gate, sigmoid(gate)), up)
//! ; out = squeeze(matmul(gather_nd(wd, idx), expand_dims(h, axis=[2])), axis=[2])
//! ; → moe::moe_silu_gated(x, idx, wgu, wd): per expert, x_e @ wgu[e]ᵀ, SiLU · up, @ wd[e]ᵀ
//! ```

use crate::dense::GateOrder;
use crate::util::KResult;
use faer::{Accum, MatMut, MatRef, Par};
use fusebox_core::runtime::Tensor;

/// Rows of one expert per task.
const ROWS: usize = 64;

/// Which half of the gate-and-up product is the gate, and the operand orders of the SiLU's
/// and the product's multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MoeSpec {
    /// 0: the gate is `y[..I]` and the up projection `y[I..]`; 1: the other way round.
    pub gate_half: usize,
    /// The multiplies' operand orders.
    pub order: GateOrder,
}

/// See the module docs.
pub(crate) fn moe_silu_gated(
    x: &Tensor,
    idx: &Tensor,
    wgu: &Tensor,
    wd: &Tensor,
    spec: &MoeSpec,
) -> KResult<Option<Tensor>> {
    let (Some(xd), Some(gd), Some(dd)) = (x.as_f32(), wgu.as_f32(), wd.as_f32()) else {
        return Ok(None);
    };
    let (&[m, h], &[e, i2, h2], &[e2, h3, i]) = (x.shape(), wgu.shape(), wd.shape()) else {
        return Ok(None);
    };
    if h2 != h
        || h3 != h
        || e2 != e
        || Some(i2) != i.checked_mul(2)
        || spec.gate_half > 1
        || h == 0
        || i == 0
    {
        return Ok(None);
    }
    let idx_fits = matches!(idx.shape(), [n] | [n, 1] if *n == m);
    if !idx_fits || !idx.dtype().is_int() {
        return Ok(None);
    }
    // The rows of each expert, in index order.
    let mut rows: Vec<Vec<usize>> = vec![Vec::new(); e];
    let ei = i64::try_from(e).map_err(|_| "too many experts")?;
    for (r, j) in idx.to_i64_vec().into_iter().enumerate() {
        let j = if j < 0 { j.saturating_add(ei) } else { j };
        match usize::try_from(j).ok().and_then(|j| rows.get_mut(j)) {
            Some(v) => v.push(r),
            None => return Ok(None),
        }
    }
    let len = m.checked_mul(h).ok_or("the output's size overflows")?;
    // The output in the tasks' row order (expert by expert), scattered to `out` at the end.
    let mut grouped = crate::par::scratch_f32(len);
    let mut tasks = Vec::new();
    let mut rest: &mut [f32] = &mut grouped;
    for (ex, rs) in rows.iter().enumerate() {
        for chunk in rs.chunks(ROWS) {
            let (here, tail) = rest.split_at_mut(chunk.len() * h);
            rest = tail;
            tasks.push((ex, chunk, here));
        }
    }
    let work = m.saturating_mul(h).saturating_mul(i).saturating_mul(3);
    let threads = crate::par::threads_for(work, 1 << 16);
    let res: Result<(), ()> = crate::par::run_tasks(tasks, threads, |(ex, chunk, dst)| {
        let n = chunk.len();
        // The task's tokens, gathered.
        let mut xs = Vec::with_capacity(n * h);
        for &r in chunk {
            xs.extend_from_slice(&xd[r * h..(r + 1) * h]);
        }
        // y = x_e @ wgu[e]ᵀ: [n, 2I].
        let mut y = vec![0.0f32; n * i2];
        faer::linalg::matmul::matmul(
            MatMut::from_row_major_slice_mut(&mut y, n, i2),
            Accum::Replace,
            MatRef::from_row_major_slice(&xs, n, h),
            MatRef::from_row_major_slice(&gd[ex * i2 * h..(ex + 1) * i2 * h], i2, h).transpose(),
            1.0f32,
            Par::Seq,
        );
        // h = silu(gate) · up, written over the gate's half of each row.
        for row in y.chunks_exact_mut(i2) {
            let (a, b) = row.split_at_mut(i);
            if spec.gate_half == 0 {
                crate::dense::silu_mul(a, b, spec.order);
            } else {
                crate::dense::silu_mul(b, a, spec.order);
            }
        }
        let off = spec.gate_half * i;
        // out = h @ wd[e]ᵀ: [n, H].
        faer::linalg::matmul::matmul(
            MatMut::from_row_major_slice_mut(dst, n, h),
            Accum::Replace,
            MatRef::from_row_major_slice_with_stride(&y[off..], n, i, i2),
            MatRef::from_row_major_slice(&dd[ex * h * i..(ex + 1) * h * i], h, i).transpose(),
            1.0f32,
            Par::Seq,
        );
        Ok(())
    });
    debug_assert!(res.is_ok());
    let mut out = crate::par::scratch_f32(len);
    let mut src = grouped.chunks_exact(h);
    for rs in &rows {
        for &r in rs {
            if let Some(s) = src.next() {
                out[r * h..(r + 1) * h].copy_from_slice(s);
            }
        }
    }
    out.into_tensor(vec![m, h]).map(Some)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code panics on failure")]

    use super::{MoeSpec, moe_silu_gated};
    use crate::dense::GateOrder;
    use fusebox_core::runtime::{Storage, Tensor};

    fn floats(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The definition, row by row in `f64`: the expert's weights indexed (a negative index
    /// from the end), `y = W·x`, `silu(gate) · up`, `Wd·h`.
    #[allow(clippy::too_many_arguments, reason = "the definition's inputs")]
    fn naive(
        x: &[f32],
        idx: &[i64],
        wgu: &[f32],
        wd: &[f32],
        (e, h, i): (usize, usize, usize),
        gate_half: usize,
    ) -> Vec<f32> {
        let mut out = Vec::new();
        for (m, &j) in idx.iter().enumerate() {
            let ex = if j < 0 { j + e as i64 } else { j } as usize;
            let y: Vec<f64> = (0..2 * i)
                .map(|r| {
                    (0..h)
                        .map(|k| f64::from(wgu[(ex * 2 * i + r) * h + k]) * f64::from(x[m * h + k]))
                        .sum()
                })
                .collect();
            let (g, u) = if gate_half == 0 {
                (&y[..i], &y[i..])
            } else {
                (&y[i..], &y[..i])
            };
            let hh: Vec<f64> = g
                .iter()
                .zip(u)
                .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            for r in 0..h {
                let z: f64 = (0..i)
                    .map(|k| f64::from(wd[(ex * h + r) * i + k]) * hh[k])
                    .sum();
                out.push(z as f32);
            }
        }
        out
    }

    #[test]
    fn experts_match_the_definition_for_every_thread_count() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let (e, h, i) = (5, 24, 20);
        // 150 rows: expert 1 gets more than one block of rows, expert 4 none; negative indices
        // count from the end.
        let m = 150;
        let idx: Vec<i64> = (0..m as i64)
            .map(|r| match r % 7 {
                0..=2 => 1,
                3 => 0,
                4 => -2,
                5 => 2,
                _ => -4,
            })
            .collect();
        let x = floats(m * h, &mut seed);
        let wgu = floats(e * 2 * i * h, &mut seed);
        let wd = floats(e * h * i, &mut seed);
        let xt = Tensor::from_f32(vec![m, h], x.clone()).unwrap();
        let gt = Tensor::from_f32(vec![e, 2 * i, h], wgu.clone()).unwrap();
        let dt = Tensor::from_f32(vec![e, h, i], wd.clone()).unwrap();
        for (gate_half, idx_shape) in [(0, vec![m]), (1, vec![m, 1])] {
            let it = Tensor::new(idx_shape, Storage::I64(idx.clone())).unwrap();
            let spec = MoeSpec {
                gate_half,
                order: GateOrder {
                    gate_first: true,
                    silu_first: gate_half == 0,
                },
            };
            let want = naive(&x, &idx, &wgu, &wd, (e, h, i), gate_half);
            let run = || moe_silu_gated(&xt, &it, &gt, &dt, &spec).unwrap().unwrap();
            let got = crate::par::with_threads(1, run);
            assert_eq!(got.shape(), &[m, h][..]);
            for (k, (a, b)) in got.as_f32().unwrap().iter().zip(&want).enumerate() {
                assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{k}: {a} vs {b}");
            }
            for n in [2, 3] {
                let other = crate::par::with_threads(n, run);
                assert!(
                    other.as_f32().unwrap().iter().map(|v| v.to_bits()).eq(got
                        .as_f32()
                        .unwrap()
                        .iter()
                        .map(|v| v.to_bits())),
                    "{n} threads differ from 1"
                );
            }
        }
        // The other half as the gate gives another result (the test sees a swapped half).
        let it = Tensor::new(vec![m], Storage::I64(idx.clone())).unwrap();
        let spec = |gate_half| MoeSpec {
            gate_half,
            order: GateOrder {
                gate_first: true,
                silu_first: true,
            },
        };
        let a = moe_silu_gated(&xt, &it, &gt, &dt, &spec(0))
            .unwrap()
            .unwrap();
        let b = moe_silu_gated(&xt, &it, &gt, &dt, &spec(1))
            .unwrap()
            .unwrap();
        assert!(
            a.as_f32()
                .unwrap()
                .iter()
                .zip(b.as_f32().unwrap())
                .any(|(p, q)| (p - q).abs() > 1e-3)
        );
        // An index out of range either way, and shapes that do not chain, are declined.
        for bad in [5i64, -6] {
            let mut v = idx.clone();
            v[7] = bad;
            let it = Tensor::new(vec![m], Storage::I64(v)).unwrap();
            assert!(
                moe_silu_gated(&xt, &it, &gt, &dt, &spec(0))
                    .unwrap()
                    .is_none()
            );
        }
        let short = Tensor::new(vec![m - 1], Storage::I64(idx[1..].to_vec())).unwrap();
        assert!(
            moe_silu_gated(&xt, &short, &gt, &dt, &spec(0))
                .unwrap()
                .is_none()
        );
        assert!(
            moe_silu_gated(&xt, &it, &dt, &gt, &spec(0))
                .unwrap()
                .is_none()
        );
    }
}
