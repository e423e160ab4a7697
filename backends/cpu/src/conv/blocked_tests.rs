//! [`super`]'s kernel against the convolution's definition (a direct loop over its sum, the
//! same chain of fused multiply-adds), for strides, padding, dilation, `NCHW` images, every
//! epilogue and thread count; and the task cut, the groups, the tiles' tails and the
//! prefetched successors.

use super::*;
use fusebox_core::runtime::Tensor;

fn rand(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((((i + seed * 7919) * 104_729) % 2001) as f32 / 1000.0 - 1.0) * 0.25)
        .collect()
}

/// What an epilogue makes of output element `i` with sum `v`.
type Expect = Box<dyn Fn(usize, f32) -> f32>;

/// `[c][p]` to `[c/b][p][b]`.
fn block(v: &[f32], c: usize, p: usize, b: usize) -> Vec<f32> {
    let mut out = vec![0.0; c * p];
    for ch in 0..c {
        for px in 0..p {
            out[((ch / b) * p + px) * b + ch % b] = v[ch * p + px];
        }
    }
    out
}

/// `n` `NCHW` images of `c × p` as the kernel reads them in blocks of `ib` channels:
/// as they are for 1, each [`block`]ed for 16 or 8.
fn image(x: &[f32], [n, c, p]: [usize; 3], ib: usize) -> Vec<f32> {
    if ib == 1 {
        return x.to_vec();
    }
    (0..n)
        .flat_map(|ni| block(&x[ni * c * p..(ni + 1) * c * p], c, p, ib))
        .collect()
}

/// The blocks the kernel runs on this CPU ([`blocks_for`]): 16 on AVX-512, 16 and 8 on
/// AVX2, none elsewhere.
fn blocks() -> Vec<usize> {
    blocks_for(crate::simd::f32_lanes())
}

/// The `NCHW` convolution by its definition, each output one chain of fused
/// multiply-adds over (channel, tap row, tap column) from zero, padding read as zero.
fn direct(x: &[f32], w: &[f32], g: &Geom) -> Vec<f32> {
    let mut y = vec![0.0f32; g.n * g.o * g.oh * g.ow];
    for ni in 0..g.n {
        for oc in 0..g.o {
            for r in 0..g.oh {
                for q in 0..g.ow {
                    let mut s = 0.0f32;
                    // Blocks of 16 input channels (of one for an `NCHW` image); per
                    // block the taps; per tap the block's channels.
                    for cb in 0..g.c / g.ib {
                        for i in 0..g.kh {
                            for j in 0..g.kw {
                                for ci in cb * g.ib..(cb + 1) * g.ib {
                                    let yy = (r * g.sh + i * g.dh) as isize - g.pt as isize;
                                    let xx = (q * g.sw + j * g.dw) as isize - g.pl as isize;
                                    let inside = (0..g.h as isize).contains(&yy)
                                        && (0..g.w as isize).contains(&xx);
                                    let v = if inside {
                                        let (yy, xx) = (yy as usize, xx as usize);
                                        x[((ni * g.c + ci) * g.h + yy) * g.w + xx]
                                    } else {
                                        0.0
                                    };
                                    let wv = w[((oc * g.c + ci) * g.kh + i) * g.kw + j];
                                    s = wv.mul_add(v, s);
                                }
                            }
                        }
                    }
                    y[((ni * g.o + oc) * g.oh + r) * g.ow + q] = s;
                }
            }
        }
    }
    y
}

/// Whether the kernel runs on this CPU (AVX-512 or AVX2 vectors).
fn runs() -> bool {
    !blocks_for(crate::simd::f32_lanes()).is_empty()
}

#[test]
fn a_task_prefetches_its_run_successor_s_first_chunk_and_a_run_s_last_nothing() {
    // 3x3 over 160 channels: chunks of 112 channels (7 blocks: 1008 of `CCH`'s steps);
    // 10 output blocks in groups of 4, 3 and 3 (AVX2: five groups of 2); two images.
    let (o, c, taps) = (160, 160, 9);
    let w = pack(&vec![0.0; o * c * taps], o, c, taps, [BLOCK; 2]).unwrap();
    let keys: Vec<(usize, usize, usize)> = (0..2)
        .flat_map(|n| groups(o / BLOCK, w.obg).map(move |(g0, nb)| (n, g0, nb)))
        .collect();
    let avx2 = w.obg == 2;
    assert_eq!(keys.len(), if avx2 { 10 } else { 6 });
    let chunk = 112 * taps * BLOCK;
    // One weight for both images (a `pack`, not a Winograd `pack_sets`).
    let at = |_n: usize, g0: usize| w.off + g0 * BLOCK * c * taps;
    for threads in [1, 2, 3] {
        let next = successors(&w, &keys, threads);
        let ends = crate::par::run_bounds(keys.len(), threads);
        for (i, r) in next.iter().enumerate() {
            if ends.contains(&(i + 1)) {
                assert!(r.is_empty(), "threads {threads}, task {i}: {r:?}");
                continue;
            }
            let (n, g0, nb) = keys[i + 1];
            assert_eq!(
                *r,
                at(n, g0)..at(n, g0) + chunk * nb,
                "threads {threads}, task {i}"
            );
            assert!(r.end <= w.data.len());
        }
    }
    // One thread: every task but the last prefetches; three: tasks 1, 3 and 5 end runs
    // (AVX2: 2, 5 and 9).
    assert_eq!(
        successors(&w, &keys, 1)
            .iter()
            .filter(|r| r.is_empty())
            .count(),
        1
    );
    let three = successors(&w, &keys, 3);
    let empty: Vec<usize> = (0..keys.len()).filter(|&i| three[i].is_empty()).collect();
    assert_eq!(empty, if avx2 { [2, 5, 9] } else { [1, 3, 5] });
}

/// `(n, c, h, w)`, `o`, kernel, strides, dilation, padding.
type Case = ([usize; 4], usize, [usize; 2], [i64; 2], [i64; 2], [i64; 4]);

/// [`check_images`] in every block the CPU runs, the images blocked likewise.
fn check(cases: &[Case]) {
    for b in blocks() {
        check_images(cases, [b, b]);
    }
}

/// [`check`] of images in blocks of `ib` channels (`NCHW` for 1) into outputs in blocks
/// of `b`.
fn check_images(cases: &[Case], [ib, b]: [usize; 2]) {
    for &(nchw, o, k, s, d, pad) in cases {
        let g = Geom::new(nchw, o, k, s, d, pad).unwrap().with_block(b);
        let g = if ib == 1 { g.nchw_input() } else { g };
        let (n, c, p_in, p) = (g.n, g.c, g.h * g.w, g.oh * g.ow);
        let taps = k[0] * k[1];
        let (x, w) = (rand(n * c * p_in, c + p_in), rand(o * c * taps, o + taps));
        let bias = rand(o, 7);
        let resid = rand(n * o * p, 9);
        let want = direct(&x, &w, &g);
        let blocked_want: Vec<f32> = (0..n)
            .flat_map(|ni| block(&want[ni * o * p..(ni + 1) * o * p], o, p, b))
            .collect();
        let xb = image(&x, [n, c, p_in], ib);
        let packed = pack(&w, o, c, taps, [ib, b]).unwrap();
        let r = Tensor::from_f32(vec![blocked_want.len()], resid.clone()).unwrap();
        let cases: Vec<(Vec<Step>, Expect)> = vec![
            (vec![], Box::new(|_, v| v)),
            (
                vec![
                    Step::Bias {
                        b: bias.clone(),
                        bias_first: false,
                    },
                    Step::Residual {
                        r: r.clone(),
                        prev_first: true,
                    },
                    Step::Relu,
                ],
                Box::new({
                    let (bias, resid) = (bias.clone(), resid.clone());
                    move |i, v| {
                        let ch = (i / (b * p)) % (o / b) * b + i % b;
                        (v + bias[ch] + resid[i]).max(0.0)
                    }
                }),
            ),
            (
                vec![Step::Clip { lo: 0.0, hi: 0.05 }],
                Box::new(|_, v| v.clamp(0.0, 0.05)),
            ),
            (
                vec![
                    Step::Bias {
                        b: bias.clone(),
                        bias_first: true,
                    },
                    Step::Silu,
                ],
                Box::new({
                    let bias = bias.clone();
                    move |i, v| {
                        let ch = (i / (b * p)) % (o / b) * b + i % b;
                        crate::elementwise::silu32(bias[ch] + v)
                    }
                }),
            ),
        ];
        for (steps, f) in &cases {
            let expect: Vec<f32> = blocked_want
                .iter()
                .enumerate()
                .map(|(i, &v)| f(i, v))
                .collect();
            for threads in [1, 2, 3] {
                let mut y = vec![f32::NAN; n * o * p];
                conv(&packed, &xb, &g, &mut y, threads, steps).unwrap();
                assert_eq!(y, expect, "{g:?} threads {threads} steps {steps:?}");
            }
        }
    }
}

#[test]
fn groups_cover_the_blocks_in_order_as_evenly_as_they_divide() {
    let all = |b: usize| groups(b, OBG).collect::<Vec<_>>();
    assert_eq!(all(0), vec![]);
    assert_eq!(all(1), vec![(0, 1)]);
    assert_eq!(all(4), vec![(0, 4)]);
    assert_eq!(all(5), vec![(0, 3), (3, 2)]);
    assert_eq!(all(6), vec![(0, 3), (3, 3)]);
    assert_eq!(all(10), vec![(0, 4), (4, 3), (7, 3)]);
    // AVX2's groups of at most 2 blocks.
    assert_eq!(
        groups(5, 2).collect::<Vec<_>>(),
        vec![(0, 2), (2, 2), (4, 1)]
    );
    assert_eq!(group_blocks(16, BLOCK), 4);
    assert_eq!(group_blocks(8, BLOCK), 2);
    assert_eq!(group_blocks(8, NARROW), 4);
    assert_eq!(blocks_for(16), [BLOCK]);
    assert_eq!(blocks_for(8), [BLOCK, NARROW]);
    assert!(blocks_for(4).is_empty());
    assert_eq!(block_of("NCHW16c"), Some(16));
    assert_eq!(block_of("NCHW8c"), Some(8));
    assert_eq!(layout(NARROW), "NCHW8c");
    for l in ["NCHW", "NCHW4c", "NHWC8c", "NCHW16", "NCHW32c"] {
        assert_eq!(block_of(l), None, "{l}");
    }
    for per in [1, 2, 4] {
        for b in 0..200 {
            let g: Vec<_> = groups(b, per).collect();
            assert_eq!(g.len(), b.div_ceil(per));
            let mut next = 0;
            for &(g0, nb) in &g {
                assert!(g0 == next && (1..=per).contains(&nb), "{b}: {g:?}");
                next += nb;
            }
            assert_eq!(next, b);
            let sizes = g.iter().map(|&(_, nb)| nb);
            assert!(sizes.clone().max().unwrap_or(0) - sizes.min().unwrap_or(0) <= 1);
        }
    }
}

#[test]
fn a_segment_ends_in_tiles_of_two_or_more_pixels_when_it_is_longer_than_one() {
    assert_eq!(tail(0, 6), 0);
    assert_eq!(tail(1, 6), 1);
    assert_eq!(tail(5, 6), 5);
    assert_eq!(tail(6, 6), 0);
    assert_eq!(tail(7, 6), 7);
    assert_eq!(tail(13, 6), 7);
    assert_eq!(tail(14, 6), 2);
    assert_eq!(tail(49, 6), 7);
    // AVX2's tiles of 3 pixels for four vectors: 7 = 3 + 2 + 2.
    assert_eq!(tail(7, 3), 4);
    assert_eq!(tail(8, 3), 2);
    assert_eq!(tiles_in(7, 3), 3);
    assert_eq!(pixels(8, 4), 3);
    assert_eq!(pixels(8, 2), 6);
    assert_eq!(pixels(16, 4), 6);
    for pt in [3, 6] {
        for len in 0..400 {
            let rest = tail(len, pt);
            assert!(
                rest <= len && (len - rest).is_multiple_of(pt),
                "{len}: {rest}"
            );
            assert!(len < 2 || rest != 1, "{len}: {rest}");
            assert_eq!(tiles_in(len, pt), len.div_ceil(pt), "{len}");
        }
    }
}

#[test]
fn one_by_one_matches_a_direct_sum_with_every_epilogue_and_thread_count() {
    if !runs() {
        // Neither AVX-512 nor AVX2: `takes` says no and the convolution runs elsewhere.
        assert!(!takes(16, 16, [BLOCK; 2], &[]));
        return;
    }
    // Channel counts in groups of 1–4 blocks (5 blocks: 3 and 2; 6: 3 and 3; 7: 4 and
    // 3), planes with every tile remainder, more than one chunk of input channels.
    let one = ([1, 1], [1, 1], [0; 4]);
    check(&[
        ([1, 16, 1, 1], 16, one.0, one.1, one.1, one.2),
        ([2, 32, 7, 1], 48, one.0, one.1, one.1, one.2),
        ([1, 144, 13, 1], 80, one.0, one.1, one.1, one.2),
        ([1, 256, 7, 7], 64, one.0, one.1, one.1, one.2),
        ([1, 48, 10, 10], 112, one.0, one.1, one.1, one.2),
        ([1, 32, 14, 14], 96, one.0, one.1, one.1, one.2),
        ([1, 16, 7, 7], 160, one.0, one.1, one.1, one.2),
        // Images larger than the weight: the threads share runs of rows ([`rows_first`]),
        // one image and two.
        ([2, 32, 12, 12], 48, one.0, one.1, one.1, one.2),
        // 65 blocks of input channels: two chunks ([`CCH`]), the second adding to the
        // first's partial sums.
        ([1, 1040, 3, 1], 32, one.0, one.1, one.1, one.2),
    ]);
}

#[test]
fn kernels_strides_padding_and_dilation_match_a_direct_sum() {
    if !runs() {
        return;
    }
    check(&[
        // ResNet's 3×3 (stride 1 and 2) and its stride-2 1×1, small.
        ([1, 32, 9, 11], 48, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        ([2, 16, 12, 13], 64, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
        ([1, 48, 14, 14], 32, [1, 1], [2, 2], [1, 1], [0; 4]),
        // More than one chunk of steps (144 channels × 9 taps), uneven padding, a 7×7
        // plane with 4 output blocks.
        ([1, 144, 7, 7], 80, [3, 3], [1, 1], [1, 1], [0, 1, 2, 1]),
        // ResNet-50's last stage, narrower: rows of 7 output pixels (tiles of 4 and 3).
        ([1, 32, 7, 7], 64, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        // Rectangular kernel and strides, dilation, padding wider than the kernel.
        ([1, 16, 10, 9], 16, [2, 3], [3, 1], [2, 2], [3, 0, 1, 4]),
        ([1, 32, 5, 6], 32, [5, 5], [1, 2], [1, 1], [2, 2, 2, 2]),
        // A 1×1 kernel padded on the bottom and right only (not read in place).
        ([1, 16, 5, 6], 16, [1, 1], [1, 1], [1, 1], [0, 0, 1, 2]),
    ]);
}

#[test]
fn an_nchw_image_into_nchw16c_matches_the_direct_sum() {
    if !runs() {
        assert!(!takes(16, 3, [1, BLOCK], &[]));
        return;
    }
    assert!(!takes(16, 3, [BLOCK; 2], &[]) && !takes(24, 3, [1, BLOCK], &[]));
    assert!(!takes(16, 3, [4, BLOCK], &[]) && !takes(16, 16, [NARROW, BLOCK], &[]));
    assert_eq!(takes(24, 3, [1, NARROW], &[]), blocks().contains(&NARROW));
    let cases: &[Case] = &[
        // ResNet-50's and MobileNetV2's first layers, on small planes.
        ([1, 3, 23, 20], 64, [7, 7], [2, 2], [1, 1], [3, 3, 3, 3]),
        ([1, 3, 17, 16], 32, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
        // Two images, 5 channels, stride 1; a 1×1 of 24 channels read in place;
        // 17 channels into 5 output blocks (groups of 3 and 2), uneven padding.
        ([2, 5, 9, 8], 16, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
        ([1, 24, 7, 9], 48, [1, 1], [1, 1], [1, 1], [0; 4]),
        ([1, 17, 11, 6], 80, [2, 3], [1, 2], [2, 1], [0, 2, 1, 1]),
    ];
    for b in blocks() {
        check_images(cases, [1, b]);
    }
    // MobileNetV2's 24 channels in blocks of 8.
    if blocks().contains(&NARROW) {
        let one = ([1, 1], [1, 1], [0; 4]);
        check_images(
            &[
                ([1, 3, 9, 9], 24, [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
                ([1, 24, 6, 5], 40, one.0, one.1, one.1, one.2),
            ],
            [1, NARROW],
        );
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Any geometry (kernel up to 4 × 4, strides and dilations up to 3, padding up to 3
    /// on each side, planes up to 12 × 12, 1–3 blocks of channels in, 1–5 out, one or two
    /// images, 1–3 threads): every output is the direct definition's chain of fused
    /// multiply-adds, bit for bit.
    #[test]
    fn any_geometry_is_the_direct_sum_bit_for_bit(
        n in 1usize..3, cb in 1usize..4, ob in 1usize..6, h in 1usize..13, w in 1usize..13,
        kh in 1usize..5, kw in 1usize..5, sh in 1i64..4, sw in 1i64..4, dh in 1i64..4,
        dw in 1i64..4, pad in proptest::array::uniform4(0i64..4), threads in 1usize..4,
        nchw in proptest::bool::ANY, few in 1usize..20, narrow in proptest::bool::ANY,
    ) {
        if !runs() {
            return Ok(());
        }
        // Blocks of 8 where the CPU runs them, else of 16.
        let b = if narrow { *blocks().last().unwrap_or(&BLOCK) } else { BLOCK };
        // An `NCHW` image of 1–19 channels, or 1–3 blocks.
        let (c, ib) = if nchw { (few, 1) } else { (cb * b, b) };
        let o = ob * b;
        let g = Geom::new([n, c, h, w], o, [kh, kw], [sh, sw], [dh, dw], pad);
        // No output (the kernel past the padded image): not this test's.
        proptest::prop_assume!(g.is_some());
        let g = g.unwrap().with_block(b);
        let g = if nchw { g.nchw_input() } else { g };
        let (p_in, p) = (h * w, g.oh * g.ow);
        let (x, wt) = (rand(n * c * p_in, h + w), rand(o * c * kh * kw, kh + kw));
        let want = direct(&x, &wt, &g);
        let want: Vec<f32> = (0..n)
            .flat_map(|ni| block(&want[ni * o * p..(ni + 1) * o * p], o, p, b))
            .collect();
        let xb = image(&x, [n, c, p_in], ib);
        let packed = pack(&wt, o, c, kh * kw, [ib, b]).unwrap();
        let mut y = vec![f32::NAN; n * o * p];
        conv(&packed, &xb, &g, &mut y, threads, &[]).unwrap();
        proptest::prop_assert_eq!(y, want);
    }
}

#[test]
fn geometry_packing_and_sizes_are_checked() {
    assert!(pack(&[0.0; 12], 12, 1, 1, [1, BLOCK]).is_none());
    assert!(pack(&[0.0; 32], 16, 2, 1, [BLOCK; 2]).is_none());
    assert!(pack(&[0.0; 32], 16, 2, 1, [2, BLOCK]).is_none());
    assert!(pack(&[0.0; 32], 16, 2, 1, [1, BLOCK]).is_some());
    assert!(pack(&[0.0; 24], 24, 1, 1, [1, NARROW]).is_some());
    assert!(pack(&[0.0; 24], 12, 2, 1, [1, NARROW]).is_none());
    assert!(pack(&[0.0; 64], 8, 8, 1, [NARROW, BLOCK]).is_none());
    assert!(pack(&[0.0; 16], 4, 4, 1, [4, 4]).is_none());
    assert!(pack(&[0.0; 255], 16, 16, 1, [BLOCK; 2]).is_none());
    assert!(pack(&[0.0; 256], 16, 16, 0, [BLOCK; 2]).is_none());
    let g = |k, s, pad| Geom::new([1, 16, 4, 4], 16, k, s, [1, 1], pad);
    assert!(
        g([5, 5], [1, 1], [0; 4]).is_none(),
        "kernel larger than the plane"
    );
    assert!(g([3, 3], [0, 1], [0; 4]).is_none(), "zero stride");
    assert!(
        g([3, 3], [1, 1], [-1, 0, 0, 0]).is_none(),
        "negative padding"
    );
    assert!(g([1, 1], [1, 1], [i64::MAX, 0, 0, 0]).is_none(), "overflow");
    let geom = g([3, 3], [2, 2], [1, 1, 1, 1]).unwrap();
    assert_eq!((geom.oh, geom.ow), (2, 2));
    // Phases (0, 0), (0, 1), (1, 0), (1, 1) of 3 × 3 (HV = 2 + 1, WV = 2 + 1): tap
    // (2, 1) reads phase (0, 1) one row down.
    assert_eq!(geom.phases(), [(0, 0), (0, 1), (1, 0), (1, 1)]);
    assert_eq!(geom.offsets()[7], (9 + 3) * BLOCK);
    let w = pack(&[1.0; 512], 16, 32, 1, [BLOCK; 2]).unwrap();
    let g1 = Geom::new([1, 32, 1, 1], 16, [1, 1], [1, 1], [1, 1], [0; 4]).unwrap();
    let mut y = vec![0.0; 16];
    let e = conv(&w, &[0.0; 16], &g1, &mut y, 1, &[]).unwrap_err();
    assert!(e.contains("expected 32 inputs"), "{e}");
    let g3 = Geom::new([1, 32, 3, 3], 16, [3, 3], [1, 1], [1, 1], [0; 4]).unwrap();
    let e = conv(&w, &[0.0; 288], &g3, &mut y, 1, &[]).unwrap_err();
    assert!(e.contains("1 taps"), "{e}");
    // A weight packed for an `NCHW16c` image on an `NCHW` one.
    let e = conv(&w, &[0.0; 32], &g1.nchw_input(), &mut y, 1, &[]).unwrap_err();
    assert!(e.contains("blocks of 16 input"), "{e}");
    // And one packed in blocks of 16 on a convolution in blocks of 8.
    let e = conv(&w, &[0.0; 32], &g1.with_block(NARROW), &mut y, 1, &[]).unwrap_err();
    assert!(e.contains("16 output channels"), "{e}");
}

#[test]
fn phase_count_counts_the_listed_phases() {
    for (kh, kw) in [(1, 1), (3, 3), (2, 5), (7, 1), (6, 4)] {
        for (sh, sw) in [(1, 1), (2, 2), (3, 2), (4, 6)] {
            for (dh, dw) in [(1, 1), (2, 3), (4, 2)] {
                let g =
                    Geom::new([1, 16, 64, 64], 16, [kh, kw], [sh, sw], [dh, dw], [0; 4]).unwrap();
                assert_eq!(
                    g.phase_count(),
                    g.phases().len(),
                    "kernel {kh}×{kw}, strides {sh}×{sw}, dilations {dh}×{dw}"
                );
            }
        }
    }
}
