//! Winograd F(4×4, 3×3) on `NCHW16c` data: the 3×3, stride-1 convolutions of
//! [`super::blocked`] whose transformed weights are small and tiles many enough (ResNet-50's
//! 64×56×56, 128×28×28 and 256×14×14 layers), in a quarter of the direct kernel's
//! multiply-adds.
//!
//! Contract:
//!
//! - Each 4×4 output tile comes from the 6×6 input tile around it (zeros beyond the data, as
//!   the padding is) as `Y = Aᵀ [Σ_c U_c ⊙ (Bᵀ d_c B)] A`, `U = G g Gᵀ` (Lavin & Gray 2016;
//!   the weights transformed in `f64` and rounded once by [`crate::winograd::Weights`]).
//! - The layout does the work of the transposes: a vector is 16 channels of one pixel (8 on
//!   AVX2, each half of a block in turn), so the data transform runs on those channels at
//!   once and writes, per tile position `ξ`, the
//!   tiles as the *pixels* of an `NCHW16c` image `[C/16][tiles][16]`. The 36 products are
//!   then 36 1×1 convolutions of those images, run by [`super::blocked::conv`] as one call
//!   (image `ξ` takes weight set `ξ`). The output transform reads 16 output channels of one
//!   tile per vector and applies the epilogue (bias or `batch_norm`, residual, `relu`/`clip`)
//!   in registers before the one store.
//! - Deterministic: every output element is computed by the same operations in the same
//!   order whatever the thread count (the products' chains are [`super::blocked`]'s). Against
//!   the direct sum the result differs as the `NCHW` Winograd's does (within 128 ε of the
//!   largest sum of the terms' magnitudes).
//!
//! ```text
//! y = R.nn.conv2d(x, w, padding=[1, 1, 1, 1], data_layout="NCHW16c", kernel_layout="OIHW",
//!                 out_layout="NCHW16c")
//! ; x: (1, 4, 56, 56, 16), w: (64, 64, 3, 3) -> 14 × 14 tiles; V: 36 images (4, 196, 16),
//! ; 36 products 64 -> 64 channels on 196 pixels, M: 36 × (4, 196, 16) -> y: (1, 4, 56, 56, 16)
//! ```

use super::blocked::{self, BLOCK, Geom, ld, st};
use super::epilogue::{RegSteps, Step};
use crate::util::KResult;
use crate::winograd::Tile;

/// Positions of a transformed tile (6 × 6).
const XI: usize = 36;

/// The weight of a convolution [`conv`] runs: `U` per position, packed for
/// [`blocked::conv`].
#[derive(Debug)]
pub(crate) struct Weights {
    packed: blocked::Packed,
}

/// Whether [`conv`] runs this convolution: an `NCHW16c` image and output (`NCHW8c` ones
/// take [`blocked::conv`]), 3×3, stride 1, dilation 1, where Winograd pays
/// on the `NCHW` path ([`Tile::choose`]: enough channels and tiles), an image makes at least
/// [`MIN_TILES`] F(4×4) tiles and the transformed weights are at most [`MAX_WEIGHTS`].
pub(crate) fn takes(g: &Geom) -> bool {
    g.input_block() == BLOCK
        && g.block() == BLOCK
        && g.kernel() == [3, 3]
        && g.stride() == [1, 1]
        && g.dilation() == [1, 1]
        && Tile::choose(g.c, g.o, g.oh, g.ow).is_some()
        && Tile::F4.tiles(g.oh, g.ow) >= MIN_TILES
        && g.c
            .checked_mul(g.o)
            .is_some_and(|co| co <= MAX_WEIGHTS / XI)
}

/// The fewest F(4×4) tiles per image [`takes`] runs: a 14×14 output's 16. ResNet-50's
/// 256×14×14 layer took 0.92 ms here against the direct kernel's 1.87 (one thread; 0.70
/// against 1.32 on two); the 512×7×7 one (4 tiles, a third of them past the edge, 38 MB of
/// transformed weights) 1.96 against 2.36, not worth four times the weight's memory
/// (bench/RESULTS.md, session av).
const MIN_TILES: usize = 16;

/// The most transformed weights (`36 · c · o` floats) [`takes`] runs: 256 channels in and out
/// (9.4 MB), read from memory once per call.
const MAX_WEIGHTS: usize = XI * 256 * 256;

/// `w` (`OIHW`, `o × c × 3 × 3`) transformed and packed.
pub(crate) fn weights(w: &[f32], o: usize, c: usize) -> KResult<Weights> {
    let wt = crate::winograd::Weights::new(w, o, c, Tile::F4)?;
    let u = wt.u();
    let packed = blocked::pack_sets(o, c, 1, [BLOCK; 2], XI, |xi, oc, ci, _| {
        u[(xi * c + ci) * o + oc]
    })
    .ok_or("blocked Winograd: channel counts that do not split by 16")?;
    Ok(Weights { packed })
}

/// `y = conv2d(x, w)` then `steps`: `x` `[n][c/16][h][w][16]`, `y` `[n][o/16][oh][ow][16]`,
/// on up to `threads` threads.
pub(crate) fn conv(
    wt: &Weights,
    x: &[f32],
    g: &Geom,
    y: &mut [f32],
    threads: usize,
    steps: &[Step],
) -> KResult<()> {
    if !takes(g) {
        return Err(format!(
            "blocked Winograd: not a 3x3 stride-1 convolution: {g:?}"
        ));
    }
    let (n, c, o) = (g.n, g.c, g.o);
    let (th, tw) = (g.oh.div_ceil(4), g.ow.div_ceil(4));
    let tiles = th * tw;
    if x.len() != n * c * g.h * g.w || y.len() != n * o * g.oh * g.ow {
        return Err(format!(
            "blocked Winograd: expected {} inputs and {} outputs, found {} and {}",
            n * c * g.h * g.w,
            n * o * g.oh * g.ow,
            x.len(),
            y.len()
        ));
    }
    let reg = RegSteps::new(steps).ok_or("blocked Winograd: unsupported epilogue")?;
    let what = "the Winograd tiles of relax.nn.conv2d";
    let f32t = fusebox_core::ir::DType::F32;
    let mem = fusebox_core::runtime::memory::check_alloc;
    mem(what, f32t, &[n, XI, c.max(o), tiles]).map_err(|e| e.to_string())?;
    // V: per image and position, the tiles as an `NCHW16c` image.
    let (cb, ob) = (c / BLOCK, o / BLOCK);
    let mut v = crate::par::scratch_f32_aligned(n * XI * c * tiles);
    let vlen = tiles * BLOCK;
    // Tasks per image and block of channels: each writes its block's piece of the 36
    // positions' images.
    let mut pieces: Vec<Option<&mut [f32]>> = v.chunks_mut(vlen).map(Some).collect();
    let mut tasks = Vec::with_capacity(n * cb);
    let in_plane = g.h * g.w * BLOCK;
    for ni in 0..n {
        let Some(img) = x.get(ni * c * g.h * g.w..(ni + 1) * c * g.h * g.w) else {
            return Err("blocked Winograd: the image is shorter than its shape".into());
        };
        for b in 0..cb {
            let v: Vec<&mut [f32]> = (0..XI)
                .filter_map(|xi| pieces.get_mut((ni * XI + xi) * cb + b)?.take())
                .collect();
            let xb = img.get(b * in_plane..(b + 1) * in_plane).unwrap_or(&[]);
            tasks.push((xb, v));
        }
    }
    crate::par::run_tasks(tasks, threads, |(xb, v)| {
        crate::simd::dispatch(InputTransform {
            x: xb,
            g,
            tw,
            tiles,
            v,
        });
        Ok::<(), String>(())
    })?;
    // M = the 36 products, one `blocked::conv` call over `n · 36` images.
    let gg = Geom::new([n * XI, c, tiles, 1], o, [1, 1], [1, 1], [1, 1], [0; 4])
        .ok_or("blocked Winograd: the products' sizes overflow")?;
    let mut m = crate::par::scratch_f32_aligned(n * XI * o * tiles);
    blocked::conv(&wt.packed, &v, &gg, &mut m, threads, &[])?;
    crate::par::keep(v);
    // Y = Aᵀ M A per tile and block of output channels, the epilogue on each vector.
    let plane = g.oh * g.ow * BLOCK;
    let tasks: Vec<(usize, &mut [f32])> = y.chunks_mut(plane).enumerate().collect();
    let mr = &m;
    let out = |(i, dst): (usize, &mut [f32])| {
        let (ni, b) = (i / ob, i % ob);
        crate::simd::dispatch(OutputTransform {
            m: mr,
            g,
            ob,
            tw,
            tiles,
            ni,
            b,
            y: dst,
            reg,
        });
        Ok::<(), String>(())
    };
    let r = crate::par::run_tasks(tasks, threads, out);
    crate::par::keep(m);
    r
}

/// `Bᵀ d` down six vectors (Lavin & Gray's F(4×4, 3×3) data transform, its integer rows).
#[inline(always)]
fn bt<S: pulp::Simd>(s: S, d: [S::f32s; 6]) -> [S::f32s; 6] {
    let [d0, d1, d2, d3, d4, d5] = d;
    let (four, five, two) = (s.splat_f32s(4.0), s.splat_f32s(5.0), s.splat_f32s(2.0));
    let add = |a, b| s.add_f32s(a, b);
    let sub = |a, b| s.sub_f32s(a, b);
    let mul = |a, b| s.mul_f32s(a, b);
    let (s12, d12) = (add(d1, d2), sub(d1, d2));
    let (s34, d34) = (add(d3, d4), sub(d4, d3));
    let (e42, e31) = (sub(d4, d2), sub(d3, d1));
    [
        add(sub(mul(four, d0), mul(five, d2)), d4),
        sub(s34, mul(four, s12)),
        add(d34, mul(four, d12)),
        add(e42, mul(two, e31)),
        sub(e42, mul(two, e31)),
        add(sub(mul(four, d1), mul(five, d3)), d5),
    ]
}

/// `Aᵀ m` down six vectors into four (F(4×4, 3×3)'s output transform).
#[inline(always)]
fn at<S: pulp::Simd>(s: S, m: [S::f32s; 6]) -> [S::f32s; 4] {
    let [m0, m1, m2, m3, m4, m5] = m;
    let add = |a, b| s.add_f32s(a, b);
    let sub = |a, b| s.sub_f32s(a, b);
    let mul = |a, b| s.mul_f32s(a, b);
    let (s12, d12) = (add(m1, m2), sub(m1, m2));
    let (s34, d34) = (add(m3, m4), sub(m3, m4));
    let (two, four, eight) = (s.splat_f32s(2.0), s.splat_f32s(4.0), s.splat_f32s(8.0));
    [
        add(add(m0, s12), s34),
        add(d12, mul(two, d34)),
        add(s12, mul(four, s34)),
        add(add(d12, mul(eight, d34)), m5),
    ]
}

/// The data transform of one block of channels of one image (`x`: `[h][w][16]`): every tile
/// into `v`, the block's piece (`[tiles][16]`) of each of the 36 positions' images.
struct InputTransform<'a> {
    x: &'a [f32],
    g: &'a Geom,
    tw: usize,
    tiles: usize,
    v: Vec<&'a mut [f32]>,
}

impl pulp::WithSimd for InputTransform<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, s: S) {
        let lanes = S::F32_LANES;
        if !BLOCK.is_multiple_of(lanes) {
            return;
        }
        let g = self.g;
        let (pt, pl) = (g.pad()[0] as isize, g.pad()[1] as isize);
        let zero = s.splat_f32s(0.0);
        let mut v = self.v;
        // Each run of `lanes` channels of the block on its own (one run on AVX-512, two on
        // AVX2), tile by tile.
        for (t, h) in (0..self.tiles).flat_map(|t| (0..BLOCK).step_by(lanes).map(move |h| (t, h))) {
            let xp = self.x.get(h..).unwrap_or_default();
            let (ty, tx) = (t / self.tw, t % self.tw);
            let (y0, x0) = ((4 * ty) as isize - pt, (4 * tx) as isize - pl);
            // Rows of the tile transformed along x, then columns along y.
            let mut rows = [[s.splat_f32s(0.0); 6]; 6];
            // A tile inside the image reads each row as one slice of six vectors.
            let whole = y0 >= 0 && x0 >= 0 && y0 as usize + 6 <= g.h && x0 as usize + 6 <= g.w;
            for (r, row) in rows.iter_mut().enumerate() {
                let yy = y0 + r as isize;
                if whole {
                    let at = ((yy as usize) * g.w + x0 as usize) * BLOCK;
                    if let Some(d) = xp.get(at..at + 5 * BLOCK + lanes) {
                        *row = bt(
                            s,
                            std::array::from_fn(|k| ld::<S>(&d[k * BLOCK..]).unwrap_or(zero)),
                        );
                        continue;
                    }
                }
                let inside = (0..g.h as isize).contains(&yy);
                let d: [S::f32s; 6] = std::array::from_fn(|k| {
                    let xx = x0 + k as isize;
                    let ok = inside && (0..g.w as isize).contains(&xx);
                    let at = (yy.max(0) as usize * g.w + xx.max(0) as usize) * BLOCK;
                    ok.then(|| xp.get(at..).and_then(ld::<S>))
                        .flatten()
                        .unwrap_or(zero)
                });
                *row = bt(s, d);
            }
            // Indexed, not `rows.map(..)`: a map per column copied all 36 vectors.
            #[expect(clippy::needless_range_loop, reason = "k indexes the inner arrays")]
            for k in 0..6 {
                let col = bt(s, std::array::from_fn(|r| rows[r][k]));
                for (r, &val) in col.iter().enumerate() {
                    let piece = v
                        .get_mut(r * 6 + k)
                        .and_then(|p| p.get_mut(t * BLOCK + h..));
                    st::<S>(val, piece);
                }
            }
        }
    }
}

/// One image's block of output channels: `Aᵀ M A` per tile, the epilogue, the stores.
struct OutputTransform<'a> {
    m: &'a [f32],
    g: &'a Geom,
    ob: usize,
    tw: usize,
    tiles: usize,
    ni: usize,
    b: usize,
    /// The block's plane of `y` (`[oh][ow][16]`).
    y: &'a mut [f32],
    reg: RegSteps<'a>,
}

impl pulp::WithSimd for OutputTransform<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, s: S) {
        let lanes = S::F32_LANES;
        if !BLOCK.is_multiple_of(lanes) {
            return;
        }
        let g = self.g;
        let mlen = self.tiles * BLOCK;
        // Position ξ's products for this image and block: image `ni · 36 + ξ` of the call.
        let base = |xi: usize| ((self.ni * XI + xi) * self.ob + self.b) * mlen;
        let img = (self.ni * self.ob + self.b) * g.oh * g.ow * BLOCK;
        let zero = s.splat_f32s(0.0);
        // Each run of `lanes` channels on its own, as in the data transform.
        for (t, h) in (0..self.tiles).flat_map(|t| (0..BLOCK).step_by(lanes).map(move |h| (t, h))) {
            let (ty, tx) = (t / self.tw, t % self.tw);
            let mut cols = [[s.splat_f32s(0.0); 4]; 6];
            for (k, col) in cols.iter_mut().enumerate() {
                let m: [S::f32s; 6] = std::array::from_fn(|r| {
                    self.m
                        .get(base(r * 6 + k) + t * BLOCK + h..)
                        .and_then(ld::<S>)
                        .unwrap_or(zero)
                });
                *col = at(s, m);
            }
            #[expect(clippy::needless_range_loop, reason = "r indexes the inner arrays")]
            for r in 0..4 {
                let oy = 4 * ty + r;
                if oy >= g.oh {
                    break;
                }
                let row = at(s, std::array::from_fn(|k| cols[k][r]));
                for (cc, &val) in row.iter().enumerate() {
                    let ox = 4 * tx + cc;
                    if ox >= g.ow {
                        break;
                    }
                    let mut val = val;
                    let local = (oy * g.ow + ox) * BLOCK + h;
                    self.reg
                        .apply_block(s, self.b * BLOCK + h, img + local, &mut val);
                    st::<S>(val, self.y.get_mut(local..));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::runtime::Tensor;

    fn rand(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((((i + seed * 7919) * 104_729) % 2001) as f32 / 1000.0 - 1.0) * 0.5)
            .collect()
    }

    /// The direct sum in `f64` and the sum of its terms' magnitudes, `NCHW`.
    fn direct(x: &[f32], w: &[f32], g: &Geom, pad: [usize; 2]) -> (Vec<f64>, Vec<f64>) {
        let mut y = vec![0.0; g.n * g.o * g.oh * g.ow];
        let mut mag = y.clone();
        for ni in 0..g.n {
            for oc in 0..g.o {
                for r in 0..g.oh {
                    for q in 0..g.ow {
                        let (mut s, mut a) = (0.0f64, 0.0f64);
                        for ci in 0..g.c {
                            for i in 0..3 {
                                for j in 0..3 {
                                    let yy = (r + i) as isize - pad[0] as isize;
                                    let xx = (q + j) as isize - pad[1] as isize;
                                    if !(0..g.h as isize).contains(&yy)
                                        || !(0..g.w as isize).contains(&xx)
                                    {
                                        continue;
                                    }
                                    let v = x
                                        [((ni * g.c + ci) * g.h + yy as usize) * g.w + xx as usize];
                                    let t = f64::from(w[((oc * g.c + ci) * 3 + i) * 3 + j])
                                        * f64::from(v);
                                    s += t;
                                    a += t.abs();
                                }
                            }
                        }
                        let at = ((ni * g.o + oc) * g.oh + r) * g.ow + q;
                        (y[at], mag[at]) = (s, a);
                    }
                }
            }
        }
        (y, mag)
    }

    fn block(v: &[f32], n: usize, c: usize, p: usize) -> Vec<f32> {
        let mut out = vec![0.0; v.len()];
        for ni in 0..n {
            for ch in 0..c {
                for px in 0..p {
                    out[((ni * c / 16 + ch / 16) * p + px) * 16 + ch % 16] =
                        v[(ni * c + ch) * p + px];
                }
            }
        }
        out
    }

    #[test]
    fn matches_the_direct_sum_within_the_winograd_bound_for_every_thread_count() {
        if blocked::blocks_for(crate::simd::f32_lanes()).is_empty() {
            return;
        }
        // A 28×28 output (49 tiles: `takes`), a 14×14 one (16 tiles, the last row and column
        // half past the edge), an odd one with partial tiles and uneven padding, two images.
        for &(n, c, h, w, o, pad) in &[
            (1, 32, 28, 28, 48, [1, 1, 1, 1]),
            (1, 32, 14, 14, 32, [1, 1, 1, 1]),
            (2, 16, 30, 29, 16, [0, 2, 1, 0]),
        ] {
            let g = Geom::new([n, c, h, w], o, [3, 3], [1, 1], [1, 1], pad).unwrap();
            assert!(takes(&g), "{g:?}");
            let x = rand(n * c * h * w, 3);
            let wv = rand(o * c * 9, 5);
            let bias = rand(o, 7);
            let (p, pin) = (g.oh * g.ow, h * w);
            let resid = rand(n * o * p, 9);
            let (want, mag) = direct(&x, &wv, &g, [pad[0] as usize, pad[1] as usize]);
            let want_b: Vec<f64> = {
                let f: Vec<f32> = want.iter().map(|&v| v as f32).collect();
                block(&f, n, o, p).iter().map(|&v| f64::from(v)).collect()
            };
            let largest = mag.iter().fold(0.0f64, |a, &b| a.max(b));
            let xb = block(&x, n, c, pin);
            let wt = weights(&wv, o, c).unwrap();
            let rb = block(&resid, n, o, p);
            let r = Tensor::from_f32(vec![rb.len()], rb.clone()).unwrap();
            let steps = [
                Step::Bias {
                    b: bias.clone(),
                    bias_first: false,
                },
                Step::Residual {
                    r,
                    prev_first: true,
                },
                Step::Relu,
            ];
            let mut first: Option<Vec<f32>> = None;
            for threads in [1, 2, 3] {
                let mut y = vec![f32::NAN; n * o * p];
                conv(&wt, &xb, &g, &mut y, threads, &[]).unwrap();
                let tol = 128.0 * f64::from(f32::EPSILON) * largest;
                for (i, (&got, &w0)) in y.iter().zip(&want_b).enumerate() {
                    assert!(
                        (f64::from(got) - w0).abs() <= tol,
                        "{g:?} element {i}: {got} against {w0} (tolerance {tol})"
                    );
                }
                // The epilogue on the same sums, bit for bit.
                let mut z = vec![f32::NAN; n * o * p];
                conv(&wt, &xb, &g, &mut z, threads, &steps).unwrap();
                for (i, (&zi, &yi)) in z.iter().zip(&y).enumerate() {
                    let ch = (i / (16 * p)) % (o / 16) * 16 + i % 16;
                    assert_eq!(zi, (yi + bias[ch] + rb[i]).max(0.0), "element {i}");
                }
                match &first {
                    None => first = Some(y),
                    Some(f) => assert_eq!(&y, f, "threads {threads} changed a bit"),
                }
            }
        }
    }

    #[test]
    fn other_convolutions_are_refused() {
        // ResNet-50's 3×3 stride-1 layers: all but the 512×7×7 one (4 tiles, 38 MB of
        // transformed weights).
        for (c, hw) in [(64, 56), (128, 28), (256, 14)] {
            let g = Geom::new([1, c, hw, hw], c, [3, 3], [1, 1], [1, 1], [1; 4]).unwrap();
            assert!(takes(&g), "{c}x{hw}x{hw}");
        }
        let g = Geom::new([1, 512, 7, 7], 512, [3, 3], [1, 1], [1, 1], [1; 4]).unwrap();
        assert!(!takes(&g));
        let g = Geom::new([1, 512, 14, 14], 512, [3, 3], [1, 1], [1, 1], [1; 4]).unwrap();
        assert!(!takes(&g), "the transformed weights past the cap");
        let g = Geom::new([1, 64, 56, 56], 64, [3, 3], [2, 2], [1, 1], [1; 4]).unwrap();
        assert!(!takes(&g));
        let g = Geom::new([1, 64, 56, 56], 64, [1, 1], [1, 1], [1, 1], [0; 4]).unwrap();
        assert!(!takes(&g));
        let wt = weights(&[0.0; 64 * 64 * 9], 64, 64).unwrap();
        let mut y = vec![0.0; 64 * 28 * 28];
        let e = conv(&wt, &[0.0; 64 * 56 * 56], &g, &mut y, 1, &[]).unwrap_err();
        assert!(e.contains("not a 3x3"), "{e}");
    }
}
