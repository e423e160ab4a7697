//! 2-D pools on channel-blocked data (`NCHW16c`: shape `(N, C/16, H, W, 16)`, the layout
//! ConvertLayout gives the values between `NCHW16c` convolutions): `max_pool2d`,
//! `avg_pool2d` and `adaptive_avg_pool2d` with `layout == out_layout == "NCHW{k}c"`, on `f32`.
//!
//! Each output pixel is the `k` channels of its block at once: the window's pixels are `k`
//! contiguous lanes each, so the loops over a window read whole vectors, where going through
//! `NCHW` (the fallback for other layouts and dtypes) moved the tensor twice (ResNet-50's
//! global average pool on `(1, 128, 7, 7, 16)`: 0.32 ms through `NCHW`).
//!
//! The same windows and the same arithmetic as the `NCHW` kernels of `nn`: a max ignores
//! padding (an empty window gives `-inf`) and a NaN in the window wins; an average sums its
//! window in `f64`, row by row and column by column, and divides by the positions inside the
//! padded input (`count_include_pad`) or inside the input, rounding once; an adaptive average
//! pool's cell `i` averages rows `[⌊i·H/OH⌋, ⌈(i+1)·H/OH⌉)` and likewise for columns. The order
//! within a window is fixed, so results are the same for every thread count.
//!
//! ```text
//! ; x: (1, 128, 7, 7, 16), ResNet-50's last feature map held in NCHW16c
//! y = R.nn.adaptive_avg_pool2d(x, output_size=[1, 1], layout="NCHW16c", out_layout="NCHW16c")
//! ; y: (1, 128, 1, 1, 16): y[0, b, 0, 0, l] = mean over (h, w) of x[0, b, h, w, l]
//! ```

use crate::util::KResult;
use fusebox_core::op::{AdaptivePool2dAttrs, Pool2dAttrs};
use fusebox_core::runtime::Tensor;

/// `k` when `layout` is `NCHW{k}c` (the channel axis split by `k`, the sub-axis last), a
/// factor [`fusebox_core::op::Layout::parse`] accepts. Read from the text without building
/// the layout: the convolutions ask this several times a call (MobileNetV2 on one thread:
/// parsing took a tenth of the time between kernels).
pub(crate) fn block_of(layout: &str) -> Option<usize> {
    let digits = layout.strip_prefix("NCHW")?.strip_suffix('c')?;
    if digits.is_empty() || !digits.bytes().all(|d| d.is_ascii_digit()) {
        return None;
    }
    let k: i64 = digits.parse().ok()?;
    if !(1..=fusebox_core::op::layout::MAX_FACTOR).contains(&k) {
        return None;
    }
    usize::try_from(k).ok()
}

/// A blocked pool's input: its data, `(N·C/k, H, W)` and `k`.
type Blocked<'a> = (&'a [f32], [usize; 3], usize);

/// The blocked input of a pool; `None` when the layouts are not both `NCHW{k}c` of one `k` or
/// the data is not `f32`; an error when the shape does not fit the layout.
fn blocked_input<'a>(
    x: &'a Tensor,
    layout: &str,
    out_layout: &str,
) -> Option<KResult<Blocked<'a>>> {
    let k = block_of(layout)?;
    if block_of(out_layout) != Some(k) {
        return None;
    }
    let xs = x.as_f32()?;
    Some(match x.shape() {
        &[n, cb, h, w, kk] if kk == k => Ok((xs, [n * cb, h, w], k)),
        s => Err(format!(
            "expected a 5-D input of layout \"{layout}\" (last axis {k}), found shape {s:?}"
        )),
    })
}

/// The output of a blocked pool over `planes` planes of `plane_in` input elements each, `oh`
/// rows of `row` elements (`OW · k`) per plane: `f(r, src, dst, acc)` fills output row `r % oh`
/// of plane `r / oh` (`dst`) from that plane's input (`src`), `acc` a scratch of `k` sums. Each
/// plane is cut into two bands of rows per thread and the tasks go to the threads band first
/// (a thread takes the same rows of every plane: those the convolution before it wrote, whose
/// threads share rows, [`crate::conv::blocked`]: ResNet-50's 3×3 max pool after its stem took
/// 0.90–0.97 of its time with the planes shared out instead; session bf). Every output is
/// written, so a kept buffer serves without being zeroed first.
fn pool_rows(
    xs: &[f32],
    [planes, plane_in, oh, row, k]: [usize; 5],
    threads: usize,
    f: impl Fn(usize, &[f32], &mut [f32], &mut [f64]) + Sync,
) -> crate::par::Scratch {
    let threads = threads.max(1);
    let band = oh.div_ceil(2 * threads).max(1);
    let mut out = crate::par::scratch_f32(planes * oh * row);
    // (band, first row over all planes, its rows), band first.
    let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::new();
    for (p, plane) in out.chunks_mut((oh * row).max(1)).enumerate() {
        for (b, piece) in plane.chunks_mut((band * row).max(1)).enumerate() {
            tasks.push((b, p * oh + b * band, piece));
        }
    }
    tasks.sort_by_key(|&(b, r0, _)| (b, r0));
    let done: Result<(), ()> = crate::par::run_tasks(tasks, threads, |(_, r0, dst)| {
        let mut acc = vec![0.0f64; k];
        for (i, dst) in dst.chunks_exact_mut(row.max(1)).enumerate() {
            let r = r0 + i;
            if let Some(src) = xs.get(r / oh * plane_in..).and_then(|s| s.get(..plane_in)) {
                f(r, src, dst, &mut acc);
            }
        }
        Ok(())
    });
    // Every task returns `Ok`.
    done.unwrap_or(());
    out
}

/// What a fixed-width row computes: a max, or an average whose divisor counts the padded
/// window's rows (`count_include_pad`) or only the positions inside the input.
#[derive(Clone, Copy)]
enum RowOp {
    Max,
    Avg { padded_rows: Option<usize> },
}

/// One output row of a blocked pool: its plane `src` (`H × w × k`), its output row `dst`
/// (`OW · k`), the window's `rows`, each output column's window and what the row computes.
struct Row<'a> {
    src: &'a [f32],
    dst: &'a mut [f32],
    rows: &'a [usize],
    wins_w: &'a [(Vec<usize>, usize)],
    w: usize,
    op: RowOp,
}

impl Row<'_> {
    /// Runs the row on blocks of a fixed `k` lanes ([`FixedRow`]) where `k` is 16 or 8;
    /// `false` (nothing done) for another `k`, which the caller's general loop takes.
    fn fixed(self, k: usize) -> bool {
        match k {
            16 => crate::simd::dispatch(FixedRow::<16>(self)),
            8 => crate::simd::dispatch(FixedRow::<8>(self)),
            _ => return false,
        }
        true
    }
}

/// A [`Row`] of `K`-channel blocks ([`max_row`] or [`avg_row`]) compiled for the widest
/// instruction set of the CPU ([`crate::simd::dispatch`]): `K` lanes in one AVX-512 register
/// where the CPU has it. (Outside such a context the `K` lanes compiled to four SSE
/// registers: ResNet-50's 3×3 max pool on `(1, 4, 112, 112, 16)`, two threads, 0.21 ms
/// against onnxruntime's 0.08; session bg.)
struct FixedRow<'a, const K: usize>(Row<'a>);

impl<const K: usize> pulp::WithSimd for FixedRow<'_, K> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let Row {
            src,
            dst,
            rows,
            wins_w,
            w,
            op,
        } = self.0;
        match op {
            RowOp::Max => max_row::<K>(src, dst, rows, wins_w, w),
            RowOp::Avg { padded_rows } => avg_row::<K>(src, dst, rows, wins_w, w, padded_rows),
        }
    }
}

/// Pixel `(y, x)` of a plane `src` of `w` columns of `K`-channel blocks, `None` past its end.
#[inline(always)]
fn pixel<const K: usize>(src: &[f32], w: usize, y: usize, x: usize) -> Option<&[f32; K]> {
    let at = (y * w + x) * K;
    src.get(at..at + K)
        .and_then(|v| <&[f32; K]>::try_from(v).ok())
}

/// One output row of a max pool of `K`-channel blocks (`dst`, `OW · K`) from its plane `src`
/// (`H × w × K`), the window's `rows` and each output column's window: the same selects in
/// the same order as the general loop, on `K` lanes of a fixed size, which the compiler keeps
/// in vector registers (ResNet-50's 3×3 pool on `(1, 4, 112, 112, 16)`, two threads: 0.26
/// ms through the general loop; session bf). Inlined into [`FixedRow`]'s dispatch.
///
/// The window's rows are the outer loop: each input row is read once, front to back, into
/// the running maxima held in `dst` (a few KB, in L1), rather than three rows interleaved
/// per output pixel. Each output still sees its window in row-major order, so ties and NaNs
/// resolve as before. ResNet-50's pool after its stem, in the model on two threads: 0.15–0.17
/// ms before, 0.09 after (its input, fresh from the stem, is read from L3; session bz).
#[inline(always)]
fn max_row<const K: usize>(
    src: &[f32],
    dst: &mut [f32],
    rows: &[usize],
    wins_w: &[(Vec<usize>, usize)],
    w: usize,
) {
    dst.fill(f32::NEG_INFINITY);
    for &y in rows {
        for (o, (cols, _)) in dst.chunks_exact_mut(K).zip(wins_w) {
            let Ok(o) = <&mut [f32; K]>::try_from(o) else {
                continue;
            };
            let mut m = *o;
            for &x in cols {
                let Some(v) = pixel::<K>(src, w, y, x) else {
                    continue;
                };
                for (m, &v) in m.iter_mut().zip(v) {
                    // A select, not a branch (NaN wins, as in `nn`).
                    *m = if v > *m || v.is_nan() { v } else { *m };
                }
            }
            *o = m;
        }
    }
}

/// One output row of an average pool of `K`-channel blocks, as [`max_row`]: per output pixel
/// the window's pixels summed in `f64` in row-major order, divided by the padded window's
/// positions (`padded_rows` times the column window's `pw`) or by the positions inside the
/// input, rounding once (`0` for an empty window): the general loop's arithmetic on `K` lanes
/// of a fixed size. ResNet-50's global average pool on `(1, 128, 7, 7, 16)` and MobileNetV2's
/// on `(1, 80, 7, 7, 16)` take this path.
#[inline(always)]
fn avg_row<const K: usize>(
    src: &[f32],
    dst: &mut [f32],
    rows: &[usize],
    wins_w: &[(Vec<usize>, usize)],
    w: usize,
    padded_rows: Option<usize>,
) {
    for (o, (cols, pw)) in dst.chunks_exact_mut(K).zip(wins_w) {
        let mut acc = [0.0f64; K];
        for &y in rows {
            for &x in cols {
                let Some(v) = pixel::<K>(src, w, y, x) else {
                    continue;
                };
                for (s, &v) in acc.iter_mut().zip(v) {
                    *s += f64::from(v);
                }
            }
        }
        let cnt = padded_rows.map_or(rows.len() * cols.len(), |ph| ph * pw);
        for (o, &s) in o.iter_mut().zip(&acc) {
            *o = if cnt == 0 {
                0.0
            } else {
                (s / cnt as f64) as f32
            };
        }
    }
}

/// `max_pool2d` (`max`) or `avg_pool2d` of blocked data (see the module doc); `None` when `x`
/// and `a` are not a blocked `f32` pool (the caller then goes through `NCHW`).
pub(crate) fn pool2d(x: &Tensor, a: &Pool2dAttrs, max: bool) -> Option<KResult<Tensor>> {
    let (xs, [planes, h, w], k) = match blocked_input(x, &a.layout, &a.out_layout)? {
        Ok(v) => v,
        Err(e) => return Some(Err(e)),
    };
    Some((|| {
        let (ah, aw, oh, ow) = crate::nn::pool_axes(a, h, w)?;
        let wins_h: Vec<(Vec<usize>, usize)> = (0..oh).map(|o| ah.window(o)).collect();
        let wins_w: Vec<(Vec<usize>, usize)> = (0..ow).map(|o| aw.window(o)).collect();
        let row = ow * k;
        let t = crate::par::threads_for(planes * oh * row * ah.k * aw.k, 1 << 18);
        let dims = [planes, h * w * k, oh, row, k];
        let out = pool_rows(xs, dims, t, |r, src, dst, acc| {
            let (rows, ph) = &wins_h[r % oh];
            let op = if max {
                RowOp::Max
            } else {
                RowOp::Avg {
                    padded_rows: a.count_include_pad.then_some(*ph),
                }
            };
            let wins_w = &wins_w[..];
            let row = Row {
                src,
                dst: &mut *dst,
                rows,
                wins_w,
                w,
                op,
            };
            if row.fixed(k) {
                return;
            }
            for (o, (cols, pw)) in dst.chunks_exact_mut(k).zip(wins_w) {
                let at = |y: usize, xx: usize| &src[(y * w + xx) * k..][..k];
                if max {
                    o.fill(f32::NEG_INFINITY);
                    for &y in rows {
                        for &xx in cols {
                            for (m, &v) in o.iter_mut().zip(at(y, xx)) {
                                // A select, not a branch (NaN wins, as in `nn`).
                                *m = if v > *m || v.is_nan() { v } else { *m };
                            }
                        }
                    }
                } else {
                    acc.fill(0.0);
                    for &y in rows {
                        for &xx in cols {
                            for (s, &v) in acc.iter_mut().zip(at(y, xx)) {
                                *s += f64::from(v);
                            }
                        }
                    }
                    let cnt = if a.count_include_pad {
                        ph * pw
                    } else {
                        rows.len() * cols.len()
                    };
                    for (o, &s) in o.iter_mut().zip(acc.iter()) {
                        *o = if cnt == 0 {
                            0.0
                        } else {
                            (s / cnt as f64) as f32
                        };
                    }
                }
            }
        });
        out.into_tensor(vec![x.shape()[0], x.shape()[1], oh, ow, k])
    })())
}

/// `adaptive_avg_pool2d` of blocked data (see the module doc); `None` as for [`pool2d`].
pub(crate) fn adaptive_avg_pool2d(x: &Tensor, a: &AdaptivePool2dAttrs) -> Option<KResult<Tensor>> {
    let (xs, [planes, h, w], k) = match blocked_input(x, &a.layout, &a.out_layout)? {
        Ok(v) => v,
        Err(e) => return Some(Err(e)),
    };
    Some((|| {
        let (oh, ow) = match a.output_size {
            Some([p, q]) => (
                usize::try_from(p).map_err(|_| format!("invalid output size {p}"))?,
                usize::try_from(q).map_err(|_| format!("invalid output size {q}"))?,
            ),
            None => (h, w),
        };
        let range = |i: usize, len: usize, o: usize| (i * len / o, ((i + 1) * len).div_ceil(o));
        let rows: Vec<(usize, usize)> = (0..oh).map(|i| range(i, h, oh)).collect();
        let cols: Vec<(usize, usize)> = (0..ow).map(|j| range(j, w, ow)).collect();
        let row = ow * k;
        let t = crate::par::threads_for(planes * h * w * k, 1 << 16);
        let dims = [planes, h * w * k, oh, row, k];
        // The same windows as lists, for the fixed-width path (`Row::fixed`).
        let row_lists: Vec<Vec<usize>> = rows.iter().map(|&(y0, y1)| (y0..y1).collect()).collect();
        let col_lists: Vec<(Vec<usize>, usize)> = cols
            .iter()
            .map(|&(x0, x1)| ((x0..x1).collect(), x1 - x0))
            .collect();
        let out = pool_rows(xs, dims, t, |r, src, dst, acc| {
            let row = Row {
                src,
                dst: &mut *dst,
                rows: &row_lists[r % oh],
                wins_w: &col_lists,
                w,
                op: RowOp::Avg { padded_rows: None },
            };
            if row.fixed(k) {
                return;
            }
            let (y0, y1) = rows[r % oh];
            for (o, &(x0, x1)) in dst.chunks_exact_mut(k).zip(&cols) {
                acc.fill(0.0);
                for y in y0..y1 {
                    for px in src[(y * w + x0) * k..(y * w + x1) * k].chunks_exact(k) {
                        for (s, &v) in acc.iter_mut().zip(px) {
                            *s += f64::from(v);
                        }
                    }
                }
                let cnt = (y1 - y0) * (x1 - x0);
                for (o, &s) in o.iter_mut().zip(acc.iter()) {
                    *o = if cnt == 0 {
                        0.0
                    } else {
                        (s / cnt as f64) as f32
                    };
                }
            }
        });
        out.into_tensor(vec![x.shape()[0], x.shape()[1], oh, ow, k])
    })())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;
    use fusebox_core::ir::DType;

    /// `x` (`NCHW`) in `NCHW{k}c`, by index arithmetic (independent of `layout_transform`).
    fn block(x: &[f32], [n, c, h, w]: [usize; 4], k: usize) -> Vec<f32> {
        let mut y = vec![0.0; x.len()];
        for ni in 0..n {
            for ci in 0..c {
                for p in 0..h * w {
                    let (b, l) = (ci / k, ci % k);
                    y[(((ni * (c / k) + b) * h * w) + p) * k + l] = x[((ni * c + ci) * h * w) + p];
                }
            }
        }
        y
    }

    /// [`block_of`] by way of the layout parser: the axes `N`, `C`, `H`, `W` and a sub-axis
    /// of `C` last.
    fn block_by_parse(layout: &str) -> Option<usize> {
        let l = fusebox_core::op::Layout::parse(layout, "NCHW")?;
        match l.axes() {
            [n, c, h, w, sub]
                if [n.letter, c.letter, h.letter, w.letter, sub.letter] == *b"NCHWC"
                    && [n, c, h, w].iter().all(|a| a.factor.is_none()) =>
            {
                usize::try_from(sub.factor?).ok()
            }
            _ => None,
        }
    }

    #[test]
    fn block_of_reads_what_the_parser_reads() {
        for s in [
            "NCHW16c",
            "NCHW8c",
            "NCHW1c",
            "NCHW016c",
            "NCHW",
            "NCHWc",
            "NCHW0c",
            "NCHW16C",
            "NCHW16",
            "NHWC",
            "NCHW16c4h",
            "NC16cHW",
            "NCHW+16c",
            "NCHW 16c",
            "NCHW1048576c",
            "NCHW1048577c",
            "NCHW99999999999999999999c",
            "",
        ] {
            assert_eq!(block_of(s), block_by_parse(s), "{s:?}");
        }
        proptest::proptest!(|(s in "(NCHW)?[0-9]{0,8}[cC]?[hw]?")| {
            proptest::prop_assert_eq!(block_of(&s), block_by_parse(&s), "{:?}", s);
        });
    }

    fn data(len: usize, nan_at: Option<usize>) -> Vec<f32> {
        (0..len)
            .map(|i| {
                if Some(i) == nan_at {
                    f32::NAN
                } else {
                    ((i * 37) % 29) as f32 * 0.31 - 4.0
                }
            })
            .collect()
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    }

    /// Each pool on blocked data equals the `NCHW` kernel's result, blocked: max bit for bit
    /// (NaN included), averages to the last bit (both sum in `f64`, rounding once); at one
    /// and two threads.
    #[test]
    fn blocked_pools_equal_the_nchw_kernels() {
        // (shape, pool, stride, padding, ceil, include_pad): ResNet's 3×3/2 max pool, a 7×7
        // global one, a padded 3×3/1 average with and without the padding counted, ceil mode.
        // The last is large enough to be shared between threads (bands of rows, band first).
        // Blocks of 16 and 8 take the fixed-width rows, 4 the general loop.
        let cases: [([usize; 4], usize, usize, usize, bool, bool); 6] = [
            ([1, 32, 12, 12], 3, 2, 1, false, false),
            ([2, 16, 7, 7], 7, 1, 0, false, false),
            ([1, 32, 9, 11], 3, 1, 1, false, true),
            ([1, 16, 9, 11], 3, 1, 1, false, false),
            ([1, 16, 8, 8], 3, 2, 0, true, false),
            ([1, 48, 61, 64], 3, 2, 1, false, false),
        ];
        for (shape, p, s, pad, ceil, incl) in cases {
            let [n, c, h, w] = shape;
            for k in [16usize, 8, 4] {
                let v = data(n * c * h * w, Some(5));
                let x =
                    Tensor::from_f32(shape.to_vec(), v.clone()).unwrap_or_else(|e| panic!("{e}"));
                let xb = Tensor::from_f32(vec![n, c / k, h, w, k], block(&v, shape, k))
                    .unwrap_or_else(|e| panic!("{e}"));
                for max in [true, false] {
                    let attrs = |layout: String| Pool2dAttrs {
                        pool_size: [p as i64; 2],
                        strides: [s as i64; 2],
                        dilation: [1, 1],
                        padding: [pad as i64; 4],
                        ceil_mode: ceil,
                        count_include_pad: incl,
                        layout: layout.clone(),
                        out_layout: layout,
                    };
                    let want = crate::nn::pool2d(&x, &attrs("NCHW".into()), max)
                        .unwrap_or_else(|e| panic!("{e}"));
                    let ws = want.shape().to_vec();
                    let want = block(
                        want.as_f32().unwrap_or_else(|| panic!("f32")),
                        [ws[0], ws[1], ws[2], ws[3]],
                        k,
                    );
                    for threads in [1, 2] {
                        let got = crate::par::with_threads(threads, || {
                            pool2d(&xb, &attrs(format!("NCHW{k}c")), max)
                        })
                        .unwrap_or_else(|| panic!("not taken"))
                        .unwrap_or_else(|e| panic!("{e}"));
                        assert_eq!(got.shape(), &[ws[0], ws[1] / k, ws[2], ws[3], k]);
                        let got = got.as_f32().unwrap_or_else(|| panic!("f32"));
                        assert!(
                            same_bits(got, &want),
                            "{shape:?} pool {p}/{s} pad {pad} max {max} k {k} threads {threads}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn blocked_adaptive_pool_equals_the_nchw_kernel() {
        for (shape, out) in [
            ([1usize, 32, 7, 7], [1usize, 1]),
            ([2, 16, 9, 11], [2, 5]),
            ([1, 16, 3, 2], [5, 4]),
        ] {
            let [n, c, h, w] = shape;
            let v = data(n * c * h * w, None);
            let x = Tensor::from_f32(shape.to_vec(), v.clone()).unwrap_or_else(|e| panic!("{e}"));
            let attrs = |layout: &str| AdaptivePool2dAttrs {
                output_size: Some([out[0] as i64, out[1] as i64]),
                layout: layout.into(),
                out_layout: layout.into(),
            };
            let want = crate::nn::adaptive_avg_pool2d(&x, &attrs("NCHW"))
                .unwrap_or_else(|e| panic!("{e}"));
            // Blocks of 16 and 8 take the fixed-width rows, 4 the general loop.
            for k in [16usize, 8, 4] {
                let xb = Tensor::from_f32(vec![n, c / k, h, w, k], block(&v, shape, k))
                    .unwrap_or_else(|e| panic!("{e}"));
                let want = block(
                    want.as_f32().unwrap_or_else(|| panic!("f32")),
                    [n, c, out[0], out[1]],
                    k,
                );
                for threads in [1, 2] {
                    let got = crate::par::with_threads(threads, || {
                        adaptive_avg_pool2d(&xb, &attrs(&format!("NCHW{k}c")))
                    })
                    .unwrap_or_else(|| panic!("not taken"))
                    .unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(got.shape(), &[n, c / k, out[0], out[1], k]);
                    // The NCHW kernel's striped sums and these row-major ones round alike
                    // here; a last-bit difference would still be within the f64 sum's error.
                    let got = got.as_f32().unwrap_or_else(|| panic!("f32"));
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                            "{shape:?} → {out:?}, k {k}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn other_layouts_and_dtypes_are_left_to_the_nchw_path() {
        assert_eq!(block_of("NCHW16c"), Some(16));
        assert_eq!(block_of("NCHW8c"), Some(8));
        for l in ["NCHW", "NHWC", "NCHW16h", "NHWC16c", "NCH16cW"] {
            assert_eq!(block_of(l), None, "{l}");
        }
        let x =
            Tensor::from_f32(vec![1, 1, 2, 2, 16], vec![1.0; 64]).unwrap_or_else(|e| panic!("{e}"));
        let a = AdaptivePool2dAttrs {
            output_size: Some([1, 1]),
            layout: "NCHW16c".into(),
            out_layout: "NCHW".into(),
        };
        assert!(adaptive_avg_pool2d(&x, &a).is_none());
        let a = AdaptivePool2dAttrs {
            out_layout: "NCHW16c".into(),
            ..a
        };
        assert!(adaptive_avg_pool2d(&x.cast(DType::F64), &a).is_none());
        // A shape that does not fit the layout is an error, not a panic.
        let bad =
            Tensor::from_f32(vec![1, 1, 2, 2, 8], vec![1.0; 32]).unwrap_or_else(|e| panic!("{e}"));
        let e = adaptive_avg_pool2d(&bad, &a)
            .unwrap_or_else(|| panic!("taken"))
            .err();
        assert!(e.is_some_and(|e| e.contains("last axis 16")));
    }
}
