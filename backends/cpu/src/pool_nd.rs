//! Kernels of `relax.stack` and the 1-D / 3-D pools (`relax.nn.{max,avg}_pool{1,3}d`,
//! `relax.nn.adaptive_avg_pool{1,3}d`): one N-d window walk over the canonical (`NCW` /
//! `NCDHW`) layout, accumulating in f64 and rounding each result once.
//!
//! ```text
//! max_pool1d([[[1, 3, 2, 5]]], pool_size=[2], strides=[2])  = [[[3, 5]]]
//! stack(([1, 2], [3, 4]), axis=1)                           = [[1, 3], [2, 4]]
//! ```
//!
//! Padding is never read: a max ignores it (a window wholly in padding gives -inf), an average
//! divides by the window positions inside the padded input (`count_include_pad`) or inside the
//! input. A NaN in a max window makes the result NaN.

use crate::util::{KResult, from_f64, norm_axis, permute};
use fusebox_core::op::{AdaptivePoolAttrs, PoolAttrs};
use fusebox_core::runtime::Tensor;

/// `relax.stack`: tensors of one shape and dtype joined along a new axis.
pub(crate) fn stack(xs: &[&Tensor], axis: i64) -> KResult<Tensor> {
    let first = xs.first().ok_or("expected a non-empty tuple of tensors")?;
    let (shape, dtype) = (first.shape(), first.dtype());
    if let Some(t) = xs.iter().find(|t| t.shape() != shape || t.dtype() != dtype) {
        return Err(format!(
            "expected every tensor to have shape {shape:?} and dtype {dtype}, found {:?} and {}",
            t.shape(),
            t.dtype()
        ));
    }
    let ax = norm_axis(axis, shape.len() + 1)?;
    let mut one = shape.to_vec();
    one.insert(ax, 1);
    let parts = xs
        .iter()
        .map(|t| t.reshaped(one.clone()).map_err(|e| e.to_string()))
        .collect::<KResult<Vec<Tensor>>>()?;
    let refs: Vec<&Tensor> = parts.iter().collect();
    crate::layout::concat(&refs, Some(ax as i64))
}

/// Where each canonical letter sits in `layout`.
fn positions(layout: &str, k: usize) -> KResult<Vec<usize>> {
    let letters = if k == 1 { "NCW" } else { "NCDHW" };
    let l = layout.as_bytes();
    let pos: Option<Vec<usize>> = letters
        .bytes()
        .map(|c| l.iter().position(|&x| x == c))
        .collect();
    match pos {
        Some(p) if l.len() == letters.len() => Ok(p),
        _ => Err(format!(
            "expected a permutation of \"{letters}\", found \"{layout}\""
        )),
    }
}

fn to_canon(x: &Tensor, pos: &[usize]) -> Tensor {
    permute(x, pos)
}

fn from_canon(t: &Tensor, pos: &[usize]) -> Tensor {
    let mut perm = vec![0usize; pos.len()];
    for (k, &p) in pos.iter().enumerate() {
        perm[p] = k;
    }
    permute(t, &perm)
}

fn to_usize(v: i64, what: &str) -> KResult<usize> {
    usize::try_from(v).map_err(|_| format!("{what} must not be negative, found {v}"))
}

/// Advances a row-major odometer over `ext`; false when it wraps around.
fn next(idx: &mut [usize], ext: &[usize]) -> bool {
    for i in (0..idx.len()).rev() {
        idx[i] += 1;
        if idx[i] < ext[i] {
            return true;
        }
        idx[i] = 0;
    }
    false
}

/// A `k`-D max (`max`) or average pool.
/// A `k`-D pool's input checked for rank and brought to `N, C, spatial…` order, with the
/// output layout's axis positions.
fn canon_input(
    x: &Tensor,
    layout: &str,
    out_layout: &str,
    k: usize,
) -> KResult<(Tensor, Vec<usize>)> {
    if x.rank() != k + 2 {
        return Err(format!(
            "expected a {}-D input, found shape {:?}",
            k + 2,
            x.shape()
        ));
    }
    let lp = positions(layout, k)?;
    let op = positions(out_layout, k)?;
    Ok((to_canon(x, &lp), op))
}

#[allow(
    clippy::needless_range_loop,
    reason = "the spatial axis indexes several per-axis arrays at once"
)]
pub(crate) fn pool(x: &Tensor, a: &PoolAttrs, max: bool) -> KResult<Tensor> {
    let k = a.pool_size.len();
    let (xc, op) = canon_input(x, &a.layout, &a.out_layout, k)?;
    let sh = xc.shape().to_vec();
    let (n, c, sp) = (sh[0], sh[1], &sh[2..]);
    let mut kern = Vec::with_capacity(k);
    let mut out_sp = Vec::with_capacity(k);
    for i in 0..k {
        let (ks, s, d) = (
            to_usize(a.pool_size[i], "pool_size")?,
            to_usize(a.strides[i], "strides")?,
            to_usize(a.dilation[i], "dilation")?,
        );
        let (p0, p1) = (
            to_usize(a.padding[i], "padding")?,
            to_usize(a.padding[i + k], "padding")?,
        );
        if ks == 0 || s == 0 || d == 0 {
            return Err("pool_size, strides and dilation must be at least 1".to_string());
        }
        let span = (ks - 1)
            .checked_mul(d)
            .and_then(|v| v.checked_add(1))
            .ok_or("the pooling window is too large")?;
        let padded = sp[i] + p0 + p1;
        if padded < span {
            return Err(format!(
                "the pooling window does not fit: input {:?}",
                x.shape()
            ));
        }
        let mut num = padded - span;
        if a.ceil_mode {
            num += s - 1;
        }
        let mut o = num / s + 1;
        // As TVM and PyTorch: the last window must start inside the input or its left padding.
        if a.ceil_mode && (o - 1) * s >= sp[i] + p0 {
            o -= 1;
        }
        kern.push((ks, s, d, p0, p1));
        out_sp.push(o);
    }
    let xs = xc.to_f64_vec();
    let in_strides = crate::util::strides(sp);
    let plane_in: usize = sp.iter().product();
    let plane_out: usize = out_sp.iter().product();
    let mut out = Vec::with_capacity(n * c * plane_out);
    let win_ext: Vec<usize> = kern.iter().map(|t| t.0).collect();
    for plane in 0..n * c {
        let base = plane * plane_in;
        let mut o = vec![0usize; k];
        for _ in 0..plane_out {
            let mut acc = if max { f64::NEG_INFINITY } else { 0.0 };
            let mut nan = false;
            let mut inside = 0usize;
            let mut padded = 0usize;
            let mut w = vec![0usize; k];
            loop {
                let mut off = 0usize;
                let mut in_input = true;
                let mut in_padded = true;
                for i in 0..k {
                    let (_, s, d, p0, p1) = kern[i];
                    let pos = (o[i] * s + w[i] * d) as isize - p0 as isize;
                    if pos < 0 || pos as usize >= sp[i] {
                        in_input = false;
                    }
                    if pos >= (sp[i] + p1) as isize {
                        in_padded = false;
                    }
                    off += (pos.max(0) as usize) * in_strides[i];
                }
                if in_padded {
                    padded += 1;
                }
                if in_input {
                    inside += 1;
                    let v = xs[base + off];
                    if max {
                        if v.is_nan() {
                            nan = true;
                        } else if v > acc {
                            acc = v;
                        }
                    } else {
                        acc += v;
                    }
                }
                if !next(&mut w, &win_ext) {
                    break;
                }
            }
            out.push(if max {
                if nan { f64::NAN } else { acc }
            } else {
                let cnt = if a.count_include_pad { padded } else { inside };
                if cnt == 0 { 0.0 } else { acc / cnt as f64 }
            });
            next(&mut o, &out_sp);
        }
    }
    let mut shape = vec![n, c];
    shape.extend(&out_sp);
    let t = from_f64(shape, x.dtype(), out)?;
    Ok(from_canon(&t, &op))
}

/// A `k`-D adaptive average pool: output cell `i` of an axis of extent `len` averages input
/// `floor(i * len / out) .. ceil((i + 1) * len / out)`.
pub(crate) fn adaptive(x: &Tensor, a: &AdaptivePoolAttrs, k: usize) -> KResult<Tensor> {
    let (xc, op) = canon_input(x, &a.layout, &a.out_layout, k)?;
    let sh = xc.shape().to_vec();
    let (n, c, sp) = (sh[0], sh[1], &sh[2..]);
    let out_sp: Vec<usize> = match &a.output_size {
        Some(s) => s
            .iter()
            .map(|&v| to_usize(v, "output_size"))
            .collect::<KResult<_>>()?,
        None => sp.to_vec(),
    };
    if out_sp.len() != k {
        return Err(format!("expected {k} output sizes, found {}", out_sp.len()));
    }
    let xs = xc.to_f64_vec();
    let in_strides = crate::util::strides(sp);
    let plane_in: usize = sp.iter().product();
    let plane_out: usize = out_sp.iter().product();
    let mut out = Vec::with_capacity(n * c * plane_out);
    for plane in 0..n * c {
        let base = plane * plane_in;
        let mut o = vec![0usize; k];
        for _ in 0..plane_out {
            let ranges: Vec<(usize, usize)> = (0..k)
                .map(|i| {
                    let (len, on) = (sp[i], out_sp[i]);
                    (o[i] * len / on, ((o[i] + 1) * len).div_ceil(on))
                })
                .collect();
            let ext: Vec<usize> = ranges.iter().map(|r| r.1 - r.0).collect();
            let cnt: usize = ext.iter().product();
            let mut s = 0.0;
            if cnt > 0 {
                let mut w = vec![0usize; k];
                loop {
                    let off: usize = (0..k).map(|i| (ranges[i].0 + w[i]) * in_strides[i]).sum();
                    s += xs[base + off];
                    if !next(&mut w, &ext) {
                        break;
                    }
                }
            }
            out.push(if cnt == 0 { 0.0 } else { s / cnt as f64 });
            next(&mut o, &out_sp);
        }
    }
    let mut shape = vec![n, c];
    shape.extend(&out_sp);
    let t = from_f64(shape, x.dtype(), out)?;
    Ok(from_canon(&t, &op))
}
