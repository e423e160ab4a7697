//! Tests of [`super`]: every path (Winograd, the column kernel, the stem, depthwise, `faer` on
//! the data or im2col blocks) against the direct definition, bit-identity across thread counts,
//! caching and fusion.

#![allow(clippy::panic, reason = "test code: a failure is a panic")]

use super::*;

/// `NCHW`/`OIHW` attributes with equal strides, padding and dilation on every side.
fn attrs(s: i64, p: i64, d: i64, groups: i64) -> Conv2dAttrs {
    Conv2dAttrs {
        strides: [s, s],
        padding: [p, p, p, p],
        dilation: [d, d],
        groups,
        data_layout: "NCHW".into(),
        kernel_layout: "OIHW".into(),
        out_layout: "NCHW".into(),
        out_dtype: None,
    }
}

/// Small-integer data (`xs`, shape `xsh`) and weights (`ws`, shape `wsh`) whose products
/// and sums are exact in `f32`, as slices and as tensors; `seed` shifts both patterns.
fn exact_operands(
    xsh: [usize; 4],
    wsh: [usize; 4],
    seed: usize,
) -> (Vec<f32>, Vec<f32>, Tensor, Tensor) {
    let xs: Vec<f32> = (0..xsh.iter().product::<usize>())
        .map(|i| ((i * 37 + seed) % 17) as f32 - 8.0)
        .collect();
    let ws: Vec<f32> = (0..wsh.iter().product::<usize>())
        .map(|i| ((i * 11 + seed) % 7) as f32 - 3.0)
        .collect();
    let x = Tensor::from_f32(xsh.to_vec(), xs.clone()).unwrap_or_else(|e| panic!("{e}"));
    let wt = Tensor::from_f32(wsh.to_vec(), ws.clone()).unwrap_or_else(|e| panic!("{e}"));
    (xs, ws, x, wt)
}

/// The direct definition, for comparison.
fn naive(x: &[f32], wt: &[f32], g: &Geom) -> Vec<f32> {
    let og = g.o / g.g;
    let mut out = vec![0.0f32; g.n * g.o * g.npix()];
    for img in 0..g.n {
        for oc in 0..g.o {
            let grp = oc / og;
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let mut acc = 0.0f64;
                    for ch in 0..g.ci {
                        for ky in 0..g.kh {
                            for kx in 0..g.kw {
                                let y = (oy * g.sh + ky * g.dh) as isize - g.pt as isize;
                                let xx = (ox * g.sw + kx * g.dw) as isize - g.pl as isize;
                                if y < 0 || xx < 0 || y >= g.h as isize || xx >= g.w as isize {
                                    continue;
                                }
                                let xi = ((img * g.c + grp * g.ci + ch) * g.h + y as usize) * g.w
                                    + xx as usize;
                                let wi = ((oc * g.ci + ch) * g.kh + ky) * g.kw + kx;
                                acc += f64::from(x[xi]) * f64::from(wt[wi]);
                            }
                        }
                    }
                    out[((img * g.o + oc) * g.oh + oy) * g.ow + ox] = acc as f32;
                }
            }
        }
    }
    out
}

#[test]
fn matches_the_definition_for_strides_padding_dilation_groups() {
    type Case = (usize, usize, usize, usize, usize, usize, i64, i64, i64, i64);
    let cases: [Case; 31] = [
        // n, c, h, w, o, k, stride, pad, dilation, groups
        (1, 3, 9, 7, 4, 3, 1, 1, 1, 1),
        (2, 4, 8, 8, 6, 3, 2, 1, 1, 2),
        (1, 4, 7, 9, 4, 3, 1, 2, 2, 4),
        (1, 8, 5, 5, 16, 1, 1, 0, 1, 1),
        (1, 8, 6, 6, 16, 1, 2, 0, 1, 1),
        (1, 3, 11, 13, 5, 5, 3, 2, 1, 1),
        // Stride 2 on odd widths: a 7×7 stem, dilation 2, a 2-wide kernel.
        (1, 3, 15, 13, 4, 7, 2, 3, 1, 1),
        (1, 4, 9, 11, 4, 3, 2, 1, 2, 1),
        (1, 2, 6, 5, 3, 2, 2, 0, 1, 1),
        // Depthwise (MobileNet): stride 2 over two images, and a 3x3 on a 4x4 plane.
        (2, 6, 9, 8, 6, 3, 2, 1, 1, 6),
        (1, 5, 4, 4, 5, 3, 1, 1, 1, 5),
        // Depthwise: stride 2 with dilation 2, stride 3 on an odd plane, a 5x5 with pad 2,
        // no padding, and a 1-wide output.
        (1, 3, 11, 12, 3, 3, 2, 2, 2, 3),
        (1, 2, 13, 10, 2, 3, 3, 1, 1, 2),
        (1, 4, 7, 9, 4, 5, 1, 2, 1, 4),
        (1, 3, 6, 7, 3, 3, 1, 0, 1, 3),
        (1, 2, 3, 3, 2, 3, 2, 0, 1, 2),
        // Depthwise on wider planes (blocks of 4, 2 and 1 vectors, rows left over): a
        // 41-wide output, stride 2 with the left padding 1, 2 and 0 (the deinterleave
        // starting in either phase), and 12 wide over 13 rows.
        (1, 3, 37, 41, 3, 3, 1, 1, 1, 3),
        (1, 2, 40, 35, 2, 3, 2, 1, 1, 2),
        (1, 2, 30, 33, 2, 3, 2, 2, 1, 2),
        (1, 2, 20, 19, 2, 3, 2, 0, 1, 2),
        (1, 3, 13, 12, 3, 3, 1, 1, 1, 3),
        // Depthwise with output rows under 16 pixels (the flat kernel): dilation 2 with
        // padding 2, two 15-wide images, a 1x1 kernel, a 1x1 image.
        (1, 3, 7, 7, 3, 3, 1, 2, 2, 3),
        (2, 4, 5, 15, 4, 3, 1, 1, 1, 4),
        (1, 2, 6, 6, 2, 1, 1, 0, 1, 2),
        (1, 2, 1, 1, 2, 3, 1, 1, 1, 2),
        // Two images on the unrolled 3x3 flat kernel (rows of 16 pixels or more), stride
        // 1 and 2.
        (2, 3, 20, 24, 3, 3, 1, 1, 1, 3),
        (2, 2, 34, 36, 2, 3, 2, 1, 1, 2),
        // An empty input plane: every output reads only the padding.
        (1, 2, 3, 0, 2, 1, 1, 1, 1, 2),
        (1, 2, 3, 0, 2, 1, 2, 1, 1, 2),
        // Stride-2 first layers with rows of 16 pixels or more (`conv_stem` with AVX-512):
        // a 3x3 stem, and two images through a 7x7 with a partial group of channels.
        (1, 3, 40, 36, 8, 3, 2, 1, 1, 1),
        (2, 3, 35, 40, 20, 7, 2, 3, 1, 1),
    ];
    for (n, c, h, w, o, k, s, p, d, gr) in cases {
        let ci = c / gr as usize;
        let (xs, ws, x, wt) = exact_operands([n, c, h, w], [o, ci, k, k], 0);
        let a = attrs(s, p, d, gr);
        let g = geometry(x.shape(), wt.shape(), &a).unwrap_or_else(|e| panic!("{e}"));
        let want = naive(&xs, &ws, &g);
        // The depthwise kernel's paths: the CPU's widest vectors, then 16, 8 and 1 lanes
        // where the CPU has them (one thread: the kernel reads the choice on this one).
        // Then the widest vectors again with `conv_stem` kept off (the GEMM path).
        for (lanes, stem_off) in [(0, false), (16, false), (8, false), (1, false), (0, true)] {
            FORCE_LANES.with(|f| f.set(lanes));
            NO_STEM.with(|f| f.set(stem_off));
            let got = crate::par::with_threads(1, || conv2d(&x, &wt, &a));
            FORCE_LANES.with(|f| f.set(0));
            NO_STEM.with(|f| f.set(false));
            let got = got.unwrap_or_else(|e| panic!("{e}"));
            // Small integers: every sum is exact, whatever the order.
            assert_eq!(
                got.as_f32(),
                Some(&want[..]),
                "case {n} {c} {h} {w} {o} {k} {s} {p} {d} {gr}, {lanes} lanes, stem off {stem_off}"
            );
        }
    }
}

/// `conv2d` with [`Geom::packs`]'s path forced on (any vector width) or off.
fn conv_cols(x: &Tensor, w: &Tensor, a: &Conv2dAttrs, on: bool, threads: usize) -> Tensor {
    FORCE_COLS.with(|f| f.set(on));
    let y = crate::par::with_threads(threads, || conv2d(x, w, a));
    FORCE_COLS.with(|f| f.set(false));
    y.unwrap_or_else(|e| panic!("{e}"))
}

/// Whether [`Geom::packs`] takes `g` with the vector width forced (any CPU).
fn packs_forced(g: &Geom) -> bool {
    FORCE_COLS.with(|f| f.set(true));
    let takes = g.packs();
    FORCE_COLS.with(|f| f.set(false));
    takes
}

/// The column kernel's result on 1 and 2 threads is `want` bit for bit (`label` names the
/// case).
fn assert_cols_exact(x: &Tensor, wt: &Tensor, a: &Conv2dAttrs, want: &[f32], label: &str) {
    for threads in [1, 2] {
        let got = conv_cols(x, wt, a, true, threads);
        assert_eq!(got.as_f32(), Some(want), "{label}, {threads} threads");
    }
}

#[test]
fn small_planes_with_the_channels_on_the_lanes_match_the_definition() {
    type Case = (usize, usize, usize, usize, usize, usize, i64, i64, i64);
    let cases: [Case; 9] = [
        // n, c, h, w, o, k, stride, pad, dilation
        // The padded plane read in place: blocks of 7 on a 7×7 plane over two panels of
        // channels, blocks of 8 on two 8×8 images, dilation 2, padding past the image.
        (1, 5, 7, 7, 60, 3, 1, 1, 1),
        (2, 4, 8, 8, 50, 3, 1, 1, 1),
        (1, 6, 7, 7, 20, 3, 1, 2, 2),
        (1, 3, 3, 3, 5, 3, 1, 3, 1),
        // The data itself (1×1, stride 1).
        (1, 16, 7, 7, 100, 1, 1, 0, 1),
        // The im2col matrix: stride 2 (ResNet-50's 14×14 → 7×7), rows that do not divide
        // into blocks (a partial last block), a 1×1 of stride 2, a 5×5 without padding.
        (1, 8, 14, 14, 30, 3, 2, 1, 1),
        (1, 3, 9, 5, 7, 3, 1, 1, 1),
        (1, 4, 6, 6, 10, 1, 2, 0, 1),
        (1, 2, 7, 7, 3, 5, 1, 0, 1),
    ];
    for (n, c, h, w, o, k, s, p, d) in cases {
        let (xs, ws, x, wt) = exact_operands([n, c, h, w], [o, c, k, k], 0);
        let a = attrs(s, p, d, 1);
        let g = geometry(x.shape(), wt.shape(), &a).unwrap_or_else(|e| panic!("{e}"));
        let label = format!("case {n} {c} {h} {w} {o} {k} {s} {p} {d}");
        assert!(packs_forced(&g), "{label} runs the column kernel");
        // Small integers: every sum is exact, whatever the order.
        assert_cols_exact(&x, &wt, &a, &naive(&xs, &ws, &g), &label);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Any geometry the column kernel takes (output planes of up to 64 pixels; any kernel
    /// size, stride, padding and dilation; channel counts across panel edges; one or two
    /// images and threads): small integers give the direct definition exactly.
    #[test]
    fn any_small_plane_matches_the_definition(
        n in 1usize..3, c in 1usize..9, oh in 1usize..9, ow in 1usize..10,
        o in 1usize..100, k in 1usize..4, s in 1i64..3, p in 0i64..3, d in 1i64..3,
        threads in 1usize..3, seed in 0usize..1000,
    ) {
        // The input that gives an `oh × ow` output (drawn by its output, so that the padded
        // path's rows of 7 and 8 come up often).
        let span = |o: usize| ((o - 1) * s as usize + d as usize * (k - 1) + 1) as i64 - 2 * p;
        let (h, w) = (span(oh), span(ow));
        proptest::prop_assume!(h >= 1 && w >= 1);
        let (h, w) = (h as usize, w as usize);
        let a = attrs(s, p, d, 1);
        let (xs, ws, x, wt) = exact_operands([n, c, h, w], [o, c, k, k], seed);
        // Geometries with no output (the kernel past the padded image) are not this test's.
        let Ok(g) = geometry(x.shape(), wt.shape(), &a) else {
            return Ok(());
        };
        proptest::prop_assume!(packs_forced(&g));
        let want = naive(&xs, &ws, &g);
        let got = conv_cols(&x, &wt, &a, true, threads);
        proptest::prop_assert_eq!(got.as_f32(), Some(&want[..]));
    }
}

#[test]
fn strided_kernels_read_their_phases_in_place() {
    // Stride 2 with 3×3 (ResNet-50's), 2×2 and dilated 2×2 kernels, rows of 7 and 8 (the
    // phase-dealt source), and a 1×1 stride-2 kernel (one phase read: the im2col matrix),
    // against the direct definition on small integers (exact).
    for (c, k, d, p, oh, ow, o) in [
        (5usize, 3usize, 1i64, 1i64, 7usize, 7usize, 50usize),
        (3, 3, 1, 1, 8, 8, 17),
        (4, 2, 1, 0, 7, 7, 9),
        (2, 2, 2, 1, 8, 8, 49),
        (6, 1, 1, 0, 7, 7, 20),
    ] {
        let span = |o: usize| ((o - 1) * 2 + d as usize * (k - 1) + 1) as i64 - 2 * p;
        let (h, w) = (span(oh) as usize, span(ow) as usize);
        let a = attrs(2, p, d, 1);
        let (xs, ws, x, wt) = exact_operands([1, c, h, w], [o, c, k, k], 0);
        let g = geometry(x.shape(), wt.shape(), &a).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((g.oh, g.ow), (oh, ow));
        let want = naive(&xs, &ws, &g);
        assert_cols_exact(
            &x,
            &wt,
            &a,
            &want,
            &format!("c{c} k{k} d{d} p{p} {oh}x{ow}"),
        );
    }
}

#[test]
fn long_kernels_on_larger_planes_take_the_column_kernel() {
    // Stride-2 3×3 layers with at least COLS_MIN_STEPS steps of `k` on planes of more
    // than COLS_PIXELS pixels (ResNet-50's 28×28 and 14×14 ones, scaled down: 114
    // channels, K = 1026, 14×14 and 10×8 outputs, rows of 7 and 8) take the column kernel,
    // read in place from the phases, and give the definition exactly; 113 channels
    // (K = 1017), a 1×1 stride-2 kernel and rows that are not whole blocks do not. At
    // stride 1 the bound is COLS_MIN_STEPS_S1; 1×1 stride-1 kernels have their own.
    let cases = [
        (
            114usize, 28usize, 28usize, 3usize, 2i64, 1i64, 20usize, true,
        ),
        (114, 20, 16, 3, 2, 1, 49, true),
        // A 48×48 image: its phases (2,500 values per channel) dealt by several tasks of whole
        // channels, on two threads.
        (114, 48, 48, 3, 2, 1, 20, true),
        (113, 28, 28, 3, 2, 1, 20, false),
        (1100, 28, 28, 1, 2, 0, 20, false),
        (114, 18, 18, 3, 2, 1, 20, false),
        // Stride 1 (COLS_MIN_STEPS_S1): a 5×5 with K = 300 on 16×16 takes it, K = 275 not.
        (12, 16, 16, 5, 1, 2, 20, true),
        (11, 16, 16, 5, 1, 2, 20, false),
        // 1×1, stride 1 (COLS_MIN_STEPS_1X1 on up to COLS_PIXELS_1X1 pixels): 384 input
        // channels on 14×14 and on 10×10 (blocks of 8 and a last one of 4) take it; 383
        // channels, or a 15×15 plane, do not.
        (384, 14, 14, 1, 1, 0, 20, true),
        (384, 10, 10, 1, 1, 0, 52, true),
        (383, 14, 14, 1, 1, 0, 20, false),
        (384, 15, 15, 1, 1, 0, 20, false),
    ];
    for (c, h, w, k, s, p, o, takes) in cases {
        let a = attrs(s, p, 1, 1);
        let (xs, ws, x, wt) = exact_operands([1, c, h, w], [o, c, k, k], 3);
        let g = geometry(x.shape(), wt.shape(), &a).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            g.npix() > COLS_PIXELS,
            "c{c} {h}x{w}: a plane past COLS_PIXELS"
        );
        let label = format!("c{c} {h}x{w} k{k} s{s}");
        assert_eq!(packs_forced(&g), takes, "{label}: the column kernel or not");
        if takes {
            assert_cols_exact(&x, &wt, &a, &naive(&xs, &ws, &g), &label);
        }
    }
}

/// The bits of a `float32` tensor's elements (NaN payloads and signed zeros compare too).
fn bits(t: &Tensor) -> Vec<u32> {
    t.as_f32()
        .unwrap_or_else(|| panic!("f32"))
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

#[test]
fn winograd_variants_do_not_depend_on_threads_or_the_kept_transform() {
    // F(4×4) with its GEMMs on the column kernel (16 → 16 on 28×28: 49 tiles) and on
    // plain `faer` (30×30: 64 tiles); F(2×2) on a 7×7 output of 256 channels (16 tiles)
    // and, with weights past F(4×4)'s bound, on 16×16 (64 tiles, plain `faer`).
    let cases = [
        (16, 28, 16, Some(winograd::Tile::F4)),
        (24, 30, 20, Some(winograd::Tile::F4)),
        (256, 7, 256, Some(winograd::Tile::F2)),
        (136, 16, 136, Some(winograd::Tile::F2)),
    ];
    for (c, hw, o, tile) in cases {
        let xs: Vec<f32> = (0..c * hw * hw)
            .map(|i| ((i * 7919) % 1000) as f32 / 997.0 - 0.5)
            .collect();
        let ws: Vec<f32> = (0..o * c * 9)
            .map(|i| ((i * 104_729) % 1000) as f32 / 991.0 - 0.5)
            .collect();
        let x = Tensor::from_f32(vec![1, c, hw, hw], xs.clone()).unwrap_or_else(|e| panic!("{e}"));
        let wt = Tensor::from_f32(vec![o, c, 3, 3], ws.clone()).unwrap_or_else(|e| panic!("{e}"));
        let a = attrs(1, 1, 1, 1);
        let g = geometry(&[1, c, hw, hw], &[o, c, 3, 3], &a).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g.winograd_tile(), tile, "{c} → {o} on {hw}×{hw}");
        let kept = winograd_weights(&x, &wt, &a).unwrap_or_else(|| panic!("no transform"));
        let run = |prep: Prepared<'_>, threads: usize| {
            crate::par::with_threads(threads, || conv2d_fused(&x, &wt, &a, &[], prep))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let with_kept = Prepared {
            wino: Some(&kept),
            cols: None,
            blocked: None,
        };
        let one = bits(&run(Prepared::default(), 1));
        for threads in [1, 2, 3] {
            assert_eq!(
                bits(&run(with_kept, threads)),
                one,
                "{c} → {o}, {threads} threads"
            );
            assert_eq!(bits(&run(Prepared::default(), threads)), one);
        }
        // A transform kept for another image size (its GEMMs run the other way) is not
        // taken: the call makes its own, with the same bits.
        let big = Tensor::from_f32(vec![1, c, 2 * hw, 2 * hw], vec![0.25; c * 4 * hw * hw])
            .unwrap_or_else(|e| panic!("{e}"));
        if let Some(other) = winograd_weights(&big, &wt, &a) {
            let foreign = Prepared {
                wino: Some(&other),
                cols: None,
                blocked: None,
            };
            assert_eq!(
                bits(&run(foreign, 2)),
                one,
                "{c} → {o}: a foreign transform"
            );
        }
        // Against the direct sum: within the variant's rounding.
        let want = naive(&xs, &ws, &g);
        let got = run(Prepared::default(), 2);
        let got = got.as_f32().unwrap_or_else(|| panic!("f32"));
        let scale = (c * 9) as f32 * 0.25;
        for (i, (&v, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (v - w).abs() <= scale * 1e-5,
                "{c} → {o}, element {i}: {v} vs {w}"
            );
        }
    }
}

#[test]
fn small_plane_bits_do_not_depend_on_threads_caching_or_fusion() {
    // Rounding sums, a NaN and an infinity: one chain per element whatever the tiling.
    let (c, hw, o) = (64, 7, 100);
    let mut xs: Vec<f32> = (0..c * hw * hw)
        .map(|i| ((i * 7919) % 1000) as f32 / 997.0 - 0.5)
        .collect();
    xs[100] = f32::NAN;
    let mut ws: Vec<f32> = (0..o * c * 9)
        .map(|i| ((i * 104_729) % 1000) as f32 / 991.0 - 0.5)
        .collect();
    ws[7] = f32::INFINITY;
    let x = Tensor::from_f32(vec![1, c, hw, hw], xs).unwrap_or_else(|e| panic!("{e}"));
    let wt = Tensor::from_f32(vec![o, c, 3, 3], ws).unwrap_or_else(|e| panic!("{e}"));
    let a = attrs(1, 1, 1, 1);
    let one = conv_cols(&x, &wt, &a, true, 1);
    for threads in [2, 3] {
        assert_eq!(bits(&conv_cols(&x, &wt, &a, true, threads)), bits(&one));
    }
    // Fused with a bias and a relu, the packed weight cached by the executor or made by
    // the call: the convolution's bits, then the ops one by one.
    let b: Vec<f32> = (0..o).map(|i| i as f32 / 10.0 - 5.0).collect();
    let steps = [
        Step::Bias {
            b: b.clone(),
            bias_first: false,
        },
        Step::Relu,
    ];
    let want: Vec<u32> = one
        .as_f32()
        .unwrap_or_else(|| panic!("f32"))
        .iter()
        .enumerate()
        .map(|(i, &v)| relu(v + b[i / (hw * hw)]).to_bits())
        .collect();
    FORCE_COLS.with(|f| f.set(true));
    let packed = cols_weights(&x, &wt, &a);
    let cached = Prepared {
        wino: None,
        cols: packed.as_ref(),
        blocked: None,
    };
    let fused = [cached, Prepared::default()].map(|p| conv2d_fused(&x, &wt, &a, &steps, p));
    FORCE_COLS.with(|f| f.set(false));
    assert!(packed.is_some());
    for y in fused {
        assert_eq!(bits(&y.unwrap_or_else(|e| panic!("{e}"))), want);
    }
}

#[test]
fn stride_two_planes_read_in_place_give_the_row_kernels_bits() {
    // MobileNetV2's 112x112 stride-2 layer, odd planes, a plane of two rows of one vector:
    // depthwise() takes `depthwise_s2` where the CPU has AVX-512 or AVX2 (the flat kernel
    // elsewhere), on 1-3 threads; the row kernel is the reference.
    for (h, w) in [(112, 112), (29, 33), (4, 28)] {
        let c = 5;
        let a = attrs(2, 1, 1, c);
        let c = c as usize;
        let g = geometry(&[1, c, h, w], &[c, 1, 3, 3], &a).unwrap_or_else(|e| panic!("{e}"));
        let mut xs: Vec<f32> = (0..c * h * w)
            .map(|i| ((i * 7919) % 1013) as f32 / 97.0 - 5.0)
            .collect();
        let mut ws: Vec<f32> = (0..c * 9)
            .map(|i| ((i * 104_729) % 997) as f32 / 331.0 - 1.5)
            .collect();
        ws[9] = f32::INFINITY;
        ws[19] = f32::NAN;
        xs[3 * h * w + w + 1] = f32::NEG_INFINITY;
        assert_eq!(
            depthwise_s2::Plan::new(g.plane_shape()).is_some(),
            depthwise_s2::has_kernel() && g.ow >= depthwise_s2::MIN_WIDTH,
            "{h}x{w}"
        );
        let mut rows = vec![0.0f32; c * g.npix()];
        let mut pad = Padded::default();
        depthwise_planes(&xs, &ws, &g, &[], 0, &mut rows, &mut pad);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for threads in 1..=3 {
            let mut out = vec![1.0f32; c * g.npix()];
            depthwise(&xs, &ws, &g, &[], &mut out, threads);
            assert_eq!(bits(&out), bits(&rows), "{h}x{w}, {threads} threads");
        }
    }
}

#[test]
fn the_flat_depthwise_kernel_gives_the_row_kernels_bits() {
    // Non-integer values (the sums round), infinite and NaN weights and inputs: the flat
    // kernel adds the same taps in the same order, 0 * w over the padding included.
    // (h, w, k, stride, pad, dilation): stride 1 "same", stride 2 on even and odd planes
    // (MobileNetV2's 14x14 and 28x28 stride-2 layers), stride 3; 3x3 kernels on rows of
    // 16 pixels or more (the unrolled kernel: MobileNetV2's 56x56 stride 1 and 112x112
    // stride 2, rows not a multiple of 16, odd planes, the largest plane it takes; by
    // strips on stride 1: 112x112, fewer rows than the kernel, one row, rows just under
    // a multiple of the strip).
    for (h, w, k, st, p, d) in [
        (7, 7, 3, 1, 1, 1),
        (14, 14, 3, 1, 1, 1),
        (56, 56, 3, 1, 1, 1),
        (20, 33, 3, 1, 1, 1),
        (64, 64, 3, 1, 1, 1),
        (112, 112, 3, 1, 1, 1),
        (65, 65, 3, 1, 1, 1),
        (30, 40, 3, 1, 1, 1),
        (3, 25, 3, 1, 1, 1),
        (1, 24, 3, 1, 1, 1),
        (9, 127, 3, 1, 1, 1),
        (112, 112, 3, 2, 1, 1),
        (57, 41, 3, 2, 1, 1),
        (40, 36, 3, 1, 2, 2),
        (5, 9, 5, 1, 2, 1),
        (8, 6, 3, 1, 2, 2),
        (14, 14, 3, 2, 1, 1),
        (28, 28, 3, 2, 1, 1),
        (60, 20, 3, 1, 1, 1),
        (9, 11, 3, 2, 1, 1),
        (12, 13, 5, 2, 2, 1),
        (13, 10, 3, 3, 1, 1),
        // Other kernels in blocks of whole planes' vectors: EfficientNet's 5x5 on 14x14 (13
        // vectors of 16 lanes, 25 of 8: blocks of 9 and a last one moved back) and 7x7,
        // 15x15 (15 vectors), a plane of more vectors than one block holds (30x15), and a
        // stride-2 5x5 on 14x14.
        (14, 14, 5, 1, 2, 1),
        (7, 7, 5, 1, 2, 1),
        (15, 15, 5, 1, 2, 1),
        (30, 15, 5, 1, 2, 1),
        (14, 14, 5, 2, 2, 1),
        // And on rows of 16 or more (EfficientNet's 5x5 on 28x28, stride 2 on 56x56), in
        // the pitched layout as the 14x14 5x5 above: rows not a multiple of the lanes (29: a
        // last vector of 13 lanes; 33: three vectors a row, the last of one lane), an odd
        // stride-2 plane, and a plane of one row.
        (28, 28, 5, 1, 2, 1),
        (56, 56, 5, 2, 2, 1),
        (29, 29, 5, 1, 2, 1),
        (20, 33, 5, 1, 2, 1),
        (31, 31, 5, 2, 2, 1),
        (1, 40, 5, 1, 2, 1),
    ] {
        let c = 5;
        let a = attrs(st, p, d, c);
        let c = c as usize;
        let g = geometry(&[1, c, h, w], &[c, 1, k, k], &a).unwrap_or_else(|e| panic!("{e}"));
        let mut xs: Vec<f32> = (0..c * h * w)
            .map(|i| ((i * 7919) % 1013) as f32 / 97.0 - 5.0)
            .collect();
        let mut ws: Vec<f32> = (0..c * k * k)
            .map(|i| ((i * 104_729) % 997) as f32 / 331.0 - 1.5)
            .collect();
        ws[k * k] = f32::INFINITY;
        ws[2 * k * k + 1] = f32::NAN;
        xs[3 * h * w + w + 1] = f32::NEG_INFINITY;
        let case = format!("{h}x{w} k{k} s{st} p{p} d{d}");
        let plan = flat_plan(&g).unwrap_or_else(|| panic!("{case}: no flat plan"));
        let mut rows = vec![0.0f32; c * g.npix()];
        let mut pad = Padded::default();
        depthwise_planes(&xs, &ws, &g, &[], 0, &mut rows, &mut pad);
        for lanes in [0, 8, 1] {
            let mut flat = vec![1.0f32; c * g.npix()];
            FORCE_LANES.with(|f| f.set(lanes));
            crate::par::with_scratch(&depthwise_flat::BUFFER, |buf| {
                depthwise_flat_planes(&xs, &ws, &g, &[], &plan, 0, &mut flat, buf);
            });
            FORCE_LANES.with(|f| f.set(0));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&flat), bits(&rows), "{case}, {lanes} lanes");
        }
    }
    // Unequal strides, a tap past the output's last column that reads the image (stride
    // 1, no padding), and rows of 16 pixels or more but for a kernel up to 5x5 of stride 1
    // or 2 on planes of up to 64x64 (128x128 for a 3x3 of stride 1 with one pixel of
    // padding and rows of 14 or more) keep the row kernel.
    for s in [
        [7, 7, 3, 3, 2, 1, 1, 1, 1, 1, 4, 7],
        [7, 7, 3, 3, 1, 1, 1, 1, 0, 0, 5, 5],
        [131, 131, 3, 3, 2, 2, 1, 1, 1, 1, 66, 66],
        [129, 129, 3, 3, 1, 1, 1, 1, 1, 1, 129, 129],
        [70, 70, 3, 3, 1, 1, 1, 1, 0, 0, 68, 68],
        [300, 60, 3, 3, 1, 1, 1, 1, 1, 1, 300, 60],
        [70, 70, 5, 5, 1, 1, 1, 1, 2, 2, 70, 70],
        [56, 56, 7, 7, 1, 1, 1, 1, 3, 3, 56, 56],
        [48, 48, 3, 3, 3, 3, 1, 1, 1, 1, 16, 16],
    ] {
        assert_eq!(depthwise_flat::Plan::new(s), None, "{s:?}");
    }
}

#[test]
fn im2col_blocks_match_the_definition() {
    // Blocks of rows that start and end inside a (ch, ky) group of kx rows, and column
    // blocks that start and end inside an output row (as the GEMM's column strips and
    // the threads' row ranges cut them), for strides 2 and 1, dilation and odd widths.
    for (c, h, w, k, s, p, d) in [
        (3usize, 15usize, 13usize, 7usize, 2i64, 3i64, 1i64),
        (4, 9, 11, 3, 2, 1, 2),
        (2, 8, 10, 3, 2, 1, 1),
        (2, 7, 9, 3, 1, 1, 1),
    ] {
        let xs: Vec<f32> = (0..c * h * w).map(|i| i as f32 + 1.0).collect();
        let a = attrs(s, p, d, 1);
        let g = geometry(&[1, c, h, w], &[1, c, k, k], &a).unwrap_or_else(|e| panic!("{e}"));
        let (kdim, npix) = (g.kdim(), g.npix());
        let want = |r: usize, col: usize| -> f32 {
            let (ch, ky, kx) = (r / (k * k), (r / k) % k, r % k);
            let (oy, ox) = (col / g.ow, col % g.ow);
            let y = (oy * g.sh + ky * g.dh) as isize - g.pt as isize;
            let xx = (ox * g.sw + kx * g.dw) as isize - g.pl as isize;
            if y < 0 || xx < 0 || y >= h as isize || xx >= w as isize {
                0.0
            } else {
                xs[(ch * h + y as usize) * w + xx as usize]
            }
        };
        for (first, rows, c0, cols) in [
            (0, kdim, 0, npix),
            (1, kdim - 2, 3, npix - 5),
            (k + 2, 2 * k - 1, g.ow - 1, g.ow + 2),
        ] {
            let mut block = vec![f32::NAN; rows * cols];
            im2col(&xs, &g, first, c0, cols, &mut block);
            for (i, row) in block.chunks(cols).enumerate() {
                for (j, v) in row.iter().enumerate() {
                    assert_eq!(
                        *v,
                        want(first + i, c0 + j),
                        "k {k} s {s} d {d}: row {} column {}",
                        first + i,
                        c0 + j
                    );
                }
            }
        }
    }
}

/// A depthwise layer held in `NCHW16c` (or `NCHW8c`) gets its weight packed once
/// ([`blocked_weights`]: [`BlockedWeights::Depthwise`]), and the fused convolution gives the
/// same bits with it as when it packs the weight itself; a dense blocked layer still gets its
/// own form.
#[test]
fn a_blocked_depthwise_weight_is_packed_once_with_the_same_bits() {
    let blocks = crate::conv::blocked_blocks(crate::simd::f32_lanes());
    // The blocked kernels run on AVX-512 and AVX2 only: no geometry, nothing prepared.
    assert_eq!(blocks.is_empty(), crate::simd::f32_lanes() < 8);
    for b in blocks {
        let layout = crate::conv::blocked_layout(b);
        let a = Conv2dAttrs {
            data_layout: layout.clone(),
            out_layout: layout,
            ..attrs(2, 1, 1, 32)
        };
        let xs: Vec<f32> = (0..2 * 9 * 9 * 16)
            .map(|i| ((i * 37) % 17) as f32 - 8.0)
            .collect();
        let ws: Vec<f32> = (0..32 * 9).map(|i| ((i * 11) % 7) as f32 - 3.0).collect();
        let x = Tensor::from_f32(vec![1, 32 / b, 9, 9, b], xs).unwrap_or_else(|e| panic!("{e}"));
        let w = Tensor::from_f32(vec![32, 1, 3, 3], ws.clone()).unwrap_or_else(|e| panic!("{e}"));
        let kept = blocked_weights(&x, &w, &a).unwrap_or_else(|| panic!("not prepared"));
        let BlockedWeights::Depthwise { b: kb, w: p } = &kept else {
            panic!("expected a depthwise packing, found {kept:?}")
        };
        assert_eq!(*kb, b);
        assert_eq!(Some(p), blocked_depthwise::pack(&ws, 32, 9, b).as_ref());
        let steps = [Step::Clip { lo: -4.0, hi: 30.0 }];
        let with = Prepared {
            blocked: Some(&kept),
            ..Prepared::default()
        };
        let prepared = conv2d_fused(&x, &w, &a, &steps, with).unwrap_or_else(|e| panic!("{e}"));
        let own =
            conv2d_fused(&x, &w, &a, &steps, Prepared::default()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(prepared.shape(), &[1, 32 / b, 5, 5, b]);
        assert_eq!(bits(&prepared), bits(&own));
        // The same layer by its definition in `NCHW` (the plain kernel), moved to the block.
        let plain_a = Conv2dAttrs {
            data_layout: "NCHW".into(),
            out_layout: "NCHW".into(),
            ..a.clone()
        };
        let xn = to_nchw(&x);
        let plain = conv2d_fused(&xn, &w, &plain_a, &steps, Prepared::default())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bits(&to_nchw(&prepared)), bits(&plain), "blocks of {b}");
        // A dense layer in the same layout: the direct kernel's packing.
        let dense = Conv2dAttrs {
            groups: 1,
            ..a.clone()
        };
        let wd = Tensor::from_f32(vec![16, 32, 3, 3], vec![0.5; 16 * 32 * 9])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            blocked_weights(&x, &wd, &dense),
            Some(BlockedWeights::Direct(_))
        ));
    }
}

/// `(N, C/b, H, W, b)` to `(N, C, H, W)`.
fn to_nchw(x: &Tensor) -> Tensor {
    let &[n, cb, h, w, b] = x.shape() else {
        panic!("expected a blocked tensor, found {:?}", x.shape())
    };
    let d = x.as_f32().unwrap_or_else(|| panic!("f32"));
    let mut out = vec![0.0f32; d.len()];
    for ni in 0..n {
        for c in 0..cb * b {
            for p in 0..h * w {
                out[((ni * cb * b + c) * h * w) + p] =
                    d[((ni * cb + c / b) * h * w + p) * b + c % b];
            }
        }
    }
    Tensor::from_f32(vec![n, cb * b, h, w], out).unwrap_or_else(|e| panic!("{e}"))
}

/// Long kernels of several taps on AVX2 and narrower ([`Geom::rows`]): the pixels as the
/// packed GEMM's rows read through [`cols_source`] (the phases of a stride-2 kernel in
/// place, or the im2col matrix), the result written transposed into `NCHW`. Small integers
/// make every sum exact, so each case must be the definition bit for bit, on 1 to 3 threads,
/// and fused (bias, residual, relu) with the packed weight cached or made by the call, the
/// ops' own bits.
#[test]
fn long_kernels_on_the_packed_gemm_match_the_definition() {
    // n, c, h, w, o, k, stride, pad, dilation: a stride-2 3×3 read from its phases; an odd
    // plane (a block of 6 pixels crosses output rows); a dilated stride-1 kernel (im2col).
    type Case = (usize, usize, usize, usize, usize, usize, i64, i64, i64);
    let cases: [Case; 3] = [
        (1, 256, 14, 14, 40, 3, 2, 1, 1),
        (2, 232, 9, 11, 21, 3, 2, 1, 1),
        (1, 240, 10, 10, 17, 3, 1, 2, 2),
    ];
    for (n, c, h, w, o, k, s, p, d) in cases {
        let (xs, ws, x, wt) = exact_operands([n, c, h, w], [o, c, k, k], c + o);
        let a = attrs(s, p, d, 1);
        let g = geometry(x.shape(), wt.shape(), &a).unwrap_or_else(|e| panic!("{e}"));
        let label = format!("{n}x{c}x{h}x{w} -> {o}, {k}x{k}/{s} p{p} d{d}");
        assert!(g.kdim() >= ROWS_MIN_STEPS, "{label}");
        assert_eq!(g.rows(), crate::gemm_packed::takes_src(), "{label}");
        let want = naive(&xs, &ws, &g);
        for threads in [1, 2, 3] {
            let got = crate::par::with_threads(threads, || conv2d(&x, &wt, &a))
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(got.as_f32(), Some(&want[..]), "{label}, {threads} threads");
        }
        let b: Vec<f32> = (0..o).map(|i| i as f32 - 9.0).collect();
        let r: Vec<f32> = (0..want.len()).map(|i| (i % 13) as f32 - 6.0).collect();
        let rt =
            Tensor::from_f32(vec![n, o, g.oh, g.ow], r.clone()).unwrap_or_else(|e| panic!("{e}"));
        let steps = [
            Step::Bias {
                b: b.clone(),
                bias_first: false,
            },
            Step::Residual {
                r: rt,
                prev_first: true,
            },
            Step::Relu,
        ];
        let fused_want: Vec<u32> = want
            .iter()
            .enumerate()
            .map(|(i, &v)| relu(v + b[i / g.npix() % o] + r[i]).to_bits())
            .collect();
        // (With AVX-512 the rows path is not taken; some of these shapes take the column
        // kernel, whose weight is packed too.)
        let packed = cols_weights(&x, &wt, &a);
        assert_eq!(packed.is_some(), g.rows() || g.packs(), "{label}");
        let cached = Prepared {
            wino: None,
            cols: packed.as_ref(),
            blocked: None,
        };
        for p in [cached, Prepared::default()] {
            for threads in [1, 2] {
                let y = crate::par::with_threads(threads, || conv2d_fused(&x, &wt, &a, &steps, p))
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(bits(&y), fused_want, "{label} fused, {threads} threads");
            }
        }
    }
}
