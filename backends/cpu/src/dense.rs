//! A dense layer in one GEMM: `act(x @ w + bias)`, the bias add and the activation applied to
//! each output tile of the GEMM while it is in cache (`cpu.dense*` composites of the
//! transformer patterns), and the vectorised row kernel those epilogues and GELU's own pass use.
//!
//! Contract:
//!
//! - [`dense`] takes `x: [..., K]` and a rank-2 weight `w: [K, N]` (`float32`), an optional
//!   bias of `N` elements (shape `[N]` or `[1, ..., 1, N]`, no more dims than the output), and
//!   returns `[..., N]`; `Ok(None)` for anything else (the caller interprets the body).
//! - Each element is what the ops give one by one, bit for bit: the product is the `matmul`
//!   kernel's own tiled GEMM over the flattened rows of `x` (the same tiles, so the same
//!   sums), then `+ bias` rounded to `f32`, then the activation by the same function as its
//!   kernel (`relu` as a select keeping NaN; GELU through [`crate::elementwise::gelu32`],
//!   the tanh form through [`crate::elementwise::gelu_tanh32`]). Bit-identical for every
//!   thread count.
//! - [`bias_act`] runs inside [`crate::simd::dispatch`], so its loop is compiled for the
//!   widest instruction set of the CPU (the result does not depend on it).
//!
//! ```text
//! lv:  R.Tensor((1, 128, 3072), dtype="float32") = R.matmul(x, W, out_dtype="void")
//! lv1: R.Tensor((1, 128, 3072), dtype="float32") = R.add(lv, b)
//! gv:  R.Tensor((1, 128, 3072), dtype="float32") = gelu(lv1)       ; as the erf form's 5 ops
//! ; → dense(x, W, Some(b), Act::Gelu): one GEMM, bias and GELU on each tile as it is written
//! ```

use crate::gemm_packed::PackedB;
use crate::matmul::gemm_f32_weight;
use fusebox_core::runtime::Tensor;

type KResult<T> = Result<T, String>;

/// The activation of a dense layer's epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Act {
    /// None: only the bias.
    None,
    /// `relu` (NaN stays NaN).
    Relu,
    /// GELU, erf form.
    Gelu,
    /// GELU, tanh form.
    GeluTanh,
}

impl Act {
    /// The activation of one element.
    #[inline(always)]
    fn apply(self, v: f32) -> f32 {
        match self {
            Act::None => v,
            Act::Relu => crate::conv::relu(v),
            Act::Gelu => crate::elementwise::gelu32(v),
            Act::GeluTanh => crate::elementwise::gelu_tanh32(v),
        }
    }
}

/// `row[j] = act(row[j] + bias[j])`, or `act(row[j])` without a bias (see the module doc).
pub(crate) fn bias_act(row: &mut [f32], bias: Option<&[f32]>, act: Act) {
    struct Op<'a>(&'a mut [f32], Option<&'a [f32]>, Act);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Op(row, bias, act) = self;
            // One loop per case, so each vectorises without a branch inside.
            match (bias, act) {
                (Some(b), Act::None) => row.iter_mut().zip(b).for_each(|(v, &c)| *v += c),
                (Some(b), Act::Relu) => row
                    .iter_mut()
                    .zip(b)
                    .for_each(|(v, &c)| *v = Act::Relu.apply(*v + c)),
                (Some(b), Act::Gelu) => row
                    .iter_mut()
                    .zip(b)
                    .for_each(|(v, &c)| *v = Act::Gelu.apply(*v + c)),
                (Some(b), Act::GeluTanh) => row
                    .iter_mut()
                    .zip(b)
                    .for_each(|(v, &c)| *v = Act::GeluTanh.apply(*v + c)),
                (None, Act::None) => {}
                (None, Act::Relu) => row.iter_mut().for_each(|v| *v = Act::Relu.apply(*v)),
                (None, Act::Gelu) => row.iter_mut().for_each(|v| *v = Act::Gelu.apply(*v)),
                (None, Act::GeluTanh) => row.iter_mut().for_each(|v| *v = Act::GeluTanh.apply(*v)),
            }
        }
    }
    crate::simd::dispatch(Op(row, bias, act));
}

/// `act(x @ w + bias)` (see the module doc).
pub(crate) fn dense(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    act: Act,
    packed: Option<&PackedB>,
) -> KResult<Option<Tensor>> {
    let (Some(xd), Some(wd)) = (x.as_f32(), w.as_f32()) else {
        return Ok(None);
    };
    let (xs, ws) = (x.shape(), w.shape());
    let ([k, n], Some(&kx)) = (ws, xs.last()) else {
        return Ok(None);
    };
    let (k, n) = (*k, *n);
    if xs.len() < 2 || kx != k {
        return Ok(None);
    }
    let Some(bd) = crate::norm::per_column(bias, n, xs.len()) else {
        return Ok(None);
    };
    let m: usize = xs[..xs.len() - 1].iter().product();
    let len = m.checked_mul(n).ok_or("the output's size overflows")?;
    let threads = crate::par::threads();
    let mut out = crate::par::scratch_f32(len);
    let epilogue = |_row: usize, c0: usize, r: &mut [f32]| {
        bias_act(r, bd.map(|b| &b[c0..c0 + r.len()]), act);
    };
    let ep: crate::matmul::Epilogue<'_> = &epilogue;
    gemm_f32_weight(m, k, n, xd, wd, packed, &mut out, threads, Some(ep))?;
    let mut shape = xs[..xs.len() - 1].to_vec();
    shape.push(n);
    out.into_tensor(shape).map(Some)
}

/// The operand orders of a SiLU-gated MLP's two multiplies (the same value either way; kept so
/// a NaN's payload is the one the ops give).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GateOrder {
    /// `multiply(g, sigmoid(g))` (else `multiply(sigmoid(g), g)`).
    pub(crate) gate_first: bool,
    /// `multiply(silu, up)` (else `multiply(up, silu)`).
    pub(crate) silu_first: bool,
}

/// `(g · sigmoid(g)) · u` with `g = x @ wg` and `u = x @ wu`: a SiLU-gated MLP's gate and up
/// projections (LLaMA, Mistral, Qwen2) before the down projection. Two GEMMs of the matmul
/// kernel (the same tiles as the `matmul` op, so the same sums); the gate's epilogue applies
/// SiLU and the product with `u` to each tile while it is in cache, so neither `g` nor the
/// SiLU is written out. Each element is what the four ops give one by one: `sigmoid` through
/// the op kernel's own function, the multiplies in the graph's operand order. `Ok(None)` for
/// shapes [`dense`] would not take, or weights of different shapes.
pub(crate) fn silu_gated(
    x: &Tensor,
    wg: &Tensor,
    wu: &Tensor,
    order: GateOrder,
    (pg, pu): (Option<&PackedB>, Option<&PackedB>),
) -> KResult<Option<Tensor>> {
    let (Some(xd), Some(gd), Some(ud)) = (x.as_f32(), wg.as_f32(), wu.as_f32()) else {
        return Ok(None);
    };
    let xs = x.shape();
    let ([k, n], Some(&kx)) = (wg.shape(), xs.last()) else {
        return Ok(None);
    };
    let (k, n) = (*k, *n);
    if xs.len() < 2 || kx != k || wu.shape() != wg.shape() {
        return Ok(None);
    }
    let m: usize = xs[..xs.len() - 1].iter().product();
    let len = m.checked_mul(n).ok_or("the output's size overflows")?;
    let threads = crate::par::threads();
    let mut up = crate::par::scratch_f32(len);
    gemm_f32_weight(m, k, n, xd, ud, pu, &mut up, threads, None)?;
    let mut out = crate::par::scratch_f32(len);
    let up = &up;
    let epilogue = |row: usize, c0: usize, r: &mut [f32]| {
        let at = row * n + c0;
        if let Some(u) = up.get(at..at + r.len()) {
            silu_mul(r, u, order);
        }
    };
    let ep: crate::matmul::Epilogue<'_> = &epilogue;
    gemm_f32_weight(m, k, n, xd, gd, pg, &mut out, threads, Some(ep))?;
    let mut shape = xs[..xs.len() - 1].to_vec();
    shape.push(n);
    out.into_tensor(shape).map(Some)
}

/// `row[j] = silu(row[j]) · up[j]` in the operand orders of `order` (see [`silu_gated`]).
pub(crate) fn silu_mul(row: &mut [f32], up: &[f32], order: GateOrder) {
    struct Op<'a>(&'a mut [f32], &'a [f32], GateOrder);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        #[allow(
            clippy::if_same_then_else,
            reason = "the operand order matters for NaN"
        )]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Op(row, up, o) = self;
            for (v, &u) in row.iter_mut().zip(up) {
                let g = *v;
                let s = crate::elementwise::sigmoid32(g);
                let silu = if o.gate_first { g * s } else { s * g };
                *v = if o.silu_first { silu * u } else { u * silu };
            }
        }
    }
    crate::simd::dispatch(Op(row, up, order));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `act(x @ w + b)` written out: f64 dot products, then the activation's definition in f64.
    fn reference(
        x: &[f32],
        w: &[f32],
        b: &[f32],
        m: usize,
        k: usize,
        n: usize,
        act: Act,
    ) -> Vec<f64> {
        let mut out = Vec::with_capacity(m * n);
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for p in 0..k {
                    s += f64::from(x[i * k + p]) * f64::from(w[p * n + j]);
                }
                let v = s + f64::from(b[j]);
                out.push(match act {
                    Act::None => v,
                    Act::Relu => v.max(0.0),
                    Act::Gelu => 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2)),
                    Act::GeluTanh => {
                        let c = (2.0 / std::f64::consts::PI).sqrt();
                        0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh())
                    }
                });
            }
        }
        out
    }

    fn data(len: usize, seed: usize, scale: f32) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.5 - 1.0) * scale)
            .collect()
    }

    #[test]
    fn a_dense_layer_matches_its_definition_for_every_activation() {
        // Small (one tile), and large enough for several tiles and both thread counts.
        for (m, k, n) in [(3usize, 5usize, 7usize), (130, 96, 300), (2, 1, 1)] {
            let x = data(m * k, 1, 1.0);
            let w = data(k * n, 2, 0.5);
            let b = data(n, 3, 1.0);
            let xt = Tensor::from_f32(vec![1, m, k], x.clone()).unwrap_or_else(|e| panic!("{e}"));
            let wt = Tensor::from_f32(vec![k, n], w.clone()).unwrap_or_else(|e| panic!("{e}"));
            let bt = Tensor::from_f32(vec![n], b.clone()).unwrap_or_else(|e| panic!("{e}"));
            for act in [Act::None, Act::Relu, Act::Gelu, Act::GeluTanh] {
                let want = reference(&x, &w, &b, m, k, n, act);
                let got = dense(&xt, &wt, Some(&bt), act, None)
                    .unwrap_or_else(|e| panic!("{e}"))
                    .unwrap_or_else(|| panic!("{m}x{k}x{n}: not handled"));
                assert_eq!(got.shape(), &[1, m, n]);
                let g = got.as_f32().unwrap_or(&[]);
                for (i, (g, w)) in g.iter().zip(&want).enumerate() {
                    let tol = 1e-5 * (1.0 + w.abs()) * (k as f64).sqrt();
                    assert!(
                        (f64::from(*g) - w).abs() <= tol,
                        "{act:?} {m}x{k}x{n} element {i}: {g} vs {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_fused_epilogue_gives_the_bits_of_the_ops_one_by_one() {
        // Several tiles; and one row (a classifier's: the matrix-vector product).
        for (m, k, n) in [(130usize, 96usize, 300usize), (1, 1280, 200)] {
            epilogue_bits(m, k, n);
        }
    }

    fn epilogue_bits(m: usize, k: usize, n: usize) {
        let xt =
            Tensor::from_f32(vec![m, k], data(m * k, 4, 2.0)).unwrap_or_else(|e| panic!("{e}"));
        let wt =
            Tensor::from_f32(vec![k, n], data(k * n, 5, 1.0)).unwrap_or_else(|e| panic!("{e}"));
        let b = data(n, 6, 1.0);
        let bt = Tensor::from_f32(vec![1, n], b.clone()).unwrap_or_else(|e| panic!("{e}"));
        let plain = crate::matmul::matmul(&xt, &wt, None, None).unwrap_or_else(|e| panic!("{e}"));
        let p = plain.as_f32().unwrap_or(&[]);
        for act in [Act::None, Act::Relu, Act::Gelu, Act::GeluTanh] {
            let one_by_one: Vec<u32> = p
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let s = v + b[i % n];
                    match act {
                        Act::None => s,
                        Act::Relu => {
                            if s > 0.0 || s.is_nan() {
                                s
                            } else {
                                0.0
                            }
                        }
                        Act::Gelu => crate::elementwise::gelu32(s),
                        Act::GeluTanh => crate::elementwise::gelu_tanh32(s),
                    }
                    .to_bits()
                })
                .collect();
            for threads in [1, 2, 3] {
                let got =
                    crate::par::with_threads(threads, || dense(&xt, &wt, Some(&bt), act, None))
                        .unwrap_or_else(|e| panic!("{e}"))
                        .unwrap_or_else(|| panic!("not handled"));
                let bits: Vec<u32> = got
                    .as_f32()
                    .unwrap_or(&[])
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                assert!(
                    bits == one_by_one,
                    "{m}x{k}x{n} {act:?} with {threads} threads"
                );
            }
        }
    }

    #[test]
    fn shapes_the_kernel_does_not_take_are_left_to_the_interpreter() {
        let x = Tensor::from_f32(vec![2, 4], vec![0.0; 8]).unwrap_or_else(|e| panic!("{e}"));
        let w = Tensor::from_f32(vec![4, 3], vec![0.0; 12]).unwrap_or_else(|e| panic!("{e}"));
        let w3 = Tensor::from_f32(vec![1, 4, 3], vec![0.0; 12]).unwrap_or_else(|e| panic!("{e}"));
        let b2 = Tensor::from_f32(vec![2, 3], vec![0.0; 6]).unwrap_or_else(|e| panic!("{e}"));
        let x1 = Tensor::from_f32(vec![4], vec![0.0; 4]).unwrap_or_else(|e| panic!("{e}"));
        let none = |r: KResult<Option<Tensor>>| r.unwrap_or_else(|e| panic!("{e}")).is_none();
        assert!(
            none(dense(&x, &w3, None, Act::None, None)),
            "a batched weight"
        );
        assert!(
            none(dense(&x, &w, Some(&b2), Act::None, None)),
            "a bias per row"
        );
        assert!(
            none(dense(&x1, &w, None, Act::None, None)),
            "a vector input"
        );
        assert!(!none(dense(&x, &w, None, Act::Relu, None)));
    }
}
