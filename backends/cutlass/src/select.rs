//! Instance selection: problem shapes, the alignment a problem allows, the candidate tiles, the
//! heuristic that picks one, and a CPU model of the generated tile loop (loader predication,
//! zero fill, implicit-GEMM indexing) that the property tests run on awkward shapes.
//!
//! Contract: [`alignment`] is the widest vector (in elements, from [`Elem::alignments`]) that
//! divides every contiguous extent the loaders step over (K and, for a K-major B, N; C for
//! conv2d), so a vector is either wholly in bounds or wholly out. [`candidates`] lists the
//! instances for a problem (every tile of its math, at that alignment); [`heuristic`] takes the
//! largest tile that still gives at least one block per SM, else the smallest tile. For the
//! target arch, [`candidates_for`] puts the wgmma tiles first when the target is sm_90a and
//! the problem qualifies ([`wgmma_fallback`] says why not: f32, conv2d, a row stride that is not
//! a multiple of 16 bytes, or an arch without wgmma, plain sm_90 included), and [`choose`] runs
//! the heuristic over the wgmma tiles alone in that case.
//! [`model_gemm`] / [`model_conv2d`] evaluate exactly the loaders' index arithmetic and
//! predicates in f64, tile by tile.
//!
//! ```text
//! f16 gemm M=1000 N=300 K=77 (B N×K): align 1 (77 is odd); 128x128 gives 24 blocks < 132 SMs,
//! so 64x64x32 (80 blocks) is the heuristic's pick
//! f16 gemm M=N=K=4096 on sm_90a: wgmma qualifies (K, N multiples of 8); 128x256x64 gives 512
//! blocks, so cutlass_f16_gemm_tn_128x256x64_wgmma_s4_a8; on sm_90: the mma.sync 128x128x32
//! ```

use crate::generator::{
    Elem, EpOp, Instance, Kind, Math, SIMT_TILES, TENSOR_OP_TILES, TileConfig, WGMMA_TILES,
};
use fusebox_cuda::Arch;

/// A concrete GEMM problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmShape {
    /// Rows of A and D.
    pub m: usize,
    /// Columns of B and D.
    pub n: usize,
    /// The reduction dim.
    pub k: usize,
    /// Batches (grid z).
    pub batch: usize,
    /// Whether A is batched (else every batch reads batch 0).
    pub a_batched: bool,
    /// Whether B is batched.
    pub b_batched: bool,
}

/// A concrete conv2d problem (NHWC / OHWI).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvShape {
    /// Batch, height, width, channels of the input.
    pub nhwc: [usize; 4],
    /// Output channels, kernel height, kernel width.
    pub ors: [usize; 3],
    /// Output height and width.
    pub pq: [usize; 2],
    /// Strides (h, w).
    pub stride: [usize; 2],
    /// Padding (top, left).
    pub pad: [usize; 2],
    /// Dilation (h, w).
    pub dilation: [usize; 2],
}

impl ConvShape {
    /// The implicit GEMM's (M, N, K).
    pub fn mnk(&self) -> (usize, usize, usize) {
        let [nb, _, _, c] = self.nhwc;
        let [o, r, s] = self.ors;
        (nb * self.pq[0] * self.pq[1], o, r * s * c)
    }
}

/// The widest alignment of `elem` dividing every extent in `extents`.
pub fn alignment(elem: Elem, extents: &[usize]) -> u32 {
    elem.alignments()
        .iter()
        .copied()
        .find(|&a| extents.iter().all(|&e| e % a as usize == 0))
        .unwrap_or(1)
}

/// The alignment of a GEMM (`k`, and `n` when B is K-major) or a conv2d (`c`).
pub fn problem_alignment(elem: Elem, kind: Kind, k: usize, n: usize, c: usize) -> u32 {
    match kind {
        Kind::Gemm { b_kmajor: true } => alignment(elem, &[k, n]),
        Kind::Gemm { b_kmajor: false } => alignment(elem, &[k]),
        Kind::Conv2d => alignment(elem, &[c]),
    }
}

/// The tiles of `elem`'s math, largest first.
pub fn tiles(elem: Elem) -> &'static [TileConfig] {
    match elem {
        Elem::F32 => &SIMT_TILES,
        _ => &TENSOR_OP_TILES,
    }
}

/// Every candidate instance of a problem, largest tile first.
pub fn candidates(elem: Elem, kind: Kind, align: u32, epilogue: &[EpOp]) -> Vec<Instance> {
    tiles(elem)
        .iter()
        .map(|t| Instance {
            elem,
            kind,
            tile: *t,
            align,
            epilogue: epilogue.to_vec(),
        })
        .collect()
}

/// Why a problem does not take the wgmma path on `arch` (`None`: it does).
pub fn wgmma_fallback(arch: Arch, elem: Elem, kind: Kind, align: u32) -> Option<String> {
    if arch != Arch::Sm90a {
        return Some(format!("wgmma needs sm_90a, the target is {arch}"));
    }
    crate::wgmma::unsupported(&Instance {
        elem,
        kind,
        tile: WGMMA_TILES[0],
        align,
        epilogue: Vec::new(),
    })
}

/// Every candidate instance of a problem on `arch`: the wgmma tiles (largest first) when the
/// problem qualifies on that arch, then [`candidates`].
pub fn candidates_for(
    arch: Arch,
    elem: Elem,
    kind: Kind,
    align: u32,
    epilogue: &[EpOp],
) -> Vec<Instance> {
    let mut out = Vec::new();
    if wgmma_fallback(arch, elem, kind, align).is_none() {
        out.extend(WGMMA_TILES.iter().map(|t| Instance {
            elem,
            kind,
            tile: *t,
            align,
            epilogue: epilogue.to_vec(),
        }));
    }
    out.extend(candidates(elem, kind, align, epilogue));
    out
}

/// The heuristic over the wgmma candidates when there are any (the target is sm_90a and the
/// problem qualifies), else over all of them.
pub fn choose(
    cands: &[Instance],
    m: usize,
    n: usize,
    batch: usize,
    sm_count: usize,
) -> Option<&Instance> {
    let wg = cands
        .iter()
        .take_while(|i| i.tile.math == Math::Wgmma)
        .count();
    let pool = if wg > 0 { &cands[..wg] } else { cands };
    heuristic(pool, m, n, batch, sm_count)
}

/// The heuristic: the largest candidate with at least `sm_count` blocks, else the smallest.
pub fn heuristic(
    cands: &[Instance],
    m: usize,
    n: usize,
    batch: usize,
    sm_count: usize,
) -> Option<&Instance> {
    let blocks = |i: &Instance| {
        let [bm, bn, _] = i.tile.tb;
        m.div_ceil(bm as usize) * n.div_ceil(bn as usize) * batch.max(1)
    };
    cands
        .iter()
        .find(|i| blocks(i) >= sm_count)
        .or_else(|| cands.last())
}

/// The loader of one operand tile, as generated: calls `f(row, col_in_tile_vector_start)` for
/// every vector `v` every thread copies (`v = tid + it * THREADS`, the generated loop).
fn for_each_vector(rows: u32, cols: u32, align: u32, threads: u32, mut f: impl FnMut(u32, u32)) {
    let total = rows * cols / align;
    let iters = total.div_ceil(threads);
    for tid in 0..threads {
        for it in 0..iters {
            let v = tid + it * threads;
            if !total.is_multiple_of(threads) && v >= total {
                break;
            }
            f(v / (cols / align), (v % (cols / align)) * align);
        }
    }
}

/// The generated GEMM's tile loop in f64: `a` is M×K row-major, `b` N×K (`b_kmajor = false`)
/// or K×N, the result M×N. Shared-memory tiles are filled only through the loaders' vectors
/// and predicates (untouched entries are NaN, so a missed element poisons the result).
pub fn model_gemm(inst: &Instance, s: &GemmShape, a: &[f64], b: &[f64]) -> Vec<f64> {
    let [bm, bn, bk] = inst.tile.tb;
    let threads = inst.tile.threads();
    let al = inst.align;
    let kmajor = matches!(inst.kind, Kind::Gemm { b_kmajor: true });
    let (m, n, k) = (s.m, s.n, s.k);
    let mut d = vec![0.0; m * n];
    for by in 0..m.div_ceil(bm as usize) {
        for bx in 0..n.div_ceil(bn as usize) {
            let (m0, n0) = (by * bm as usize, bx * bn as usize);
            let mut acc = vec![0.0; (bm * bn) as usize];
            for kt in 0..k.div_ceil(bk as usize) {
                let k0 = kt * bk as usize;
                let mut at = vec![f64::NAN; (bm * bk) as usize];
                let mut bt = vec![f64::NAN; (bn * bk) as usize];
                for_each_vector(bm, bk, al, threads, |row, kv| {
                    let (gm, gk) = (m0 + row as usize, k0 + kv as usize);
                    let pred = gm < m && gk < k;
                    for e in 0..al as usize {
                        at[(row * bk + kv) as usize + e] =
                            if pred { a[gm * k + gk + e] } else { 0.0 };
                    }
                });
                if kmajor {
                    for_each_vector(bk, bn, al, threads, |krow, nv| {
                        let (gk, gn) = (k0 + krow as usize, n0 + nv as usize);
                        let pred = gk < k && gn < n;
                        for e in 0..al as usize {
                            // stored transposed in the model: [n][k]
                            bt[((nv as usize + e) * bk as usize) + krow as usize] =
                                if pred { b[gk * n + gn + e] } else { 0.0 };
                        }
                    });
                } else {
                    for_each_vector(bn, bk, al, threads, |row, kv| {
                        let (gn, gk) = (n0 + row as usize, k0 + kv as usize);
                        let pred = gn < n && gk < k;
                        for e in 0..al as usize {
                            bt[(row * bk + kv) as usize + e] =
                                if pred { b[gn * k + gk + e] } else { 0.0 };
                        }
                    });
                }
                for i in 0..bm as usize {
                    for j in 0..bn as usize {
                        for kk in 0..bk as usize {
                            acc[i * bn as usize + j] +=
                                at[i * bk as usize + kk] * bt[j * bk as usize + kk];
                        }
                    }
                }
            }
            for i in 0..bm as usize {
                for j in 0..bn as usize {
                    let (row, col) = (m0 + i, n0 + j);
                    if row < m && col < n {
                        d[row * n + col] = acc[i * bn as usize + j];
                    }
                }
            }
        }
    }
    d
}

/// The implicit-GEMM A operand of the generated conv2d loader: element `(gm, gk)` of the
/// virtual M×K matrix, or `None` where the loader zero-fills (padding or out of range).
pub fn conv_a_index(s: &ConvShape, gm: usize, gk: usize) -> Option<usize> {
    let [nb, h, w, c] = s.nhwc;
    let [_, _, sx] = s.ors;
    let (p, q) = (s.pq[0], s.pq[1]);
    let (mm, _, kk) = s.mnk();
    if gm >= mm || gk >= kk {
        return None;
    }
    let (ni, pq) = (gm / (p * q), gm % (p * q));
    let (pi, qi) = (pq / q, pq % q);
    let (rs, ci) = (gk / c, gk % c);
    let (ri, si) = (rs / sx, rs % sx);
    let hh = (pi * s.stride[0] + ri * s.dilation[0]).checked_sub(s.pad[0])?;
    let ww = (qi * s.stride[1] + si * s.dilation[1]).checked_sub(s.pad[1])?;
    if hh >= h || ww >= w || ni >= nb {
        return None;
    }
    Some(((ni * h + hh) * w + ww) * c + ci)
}

/// The generated conv2d's tile loop in f64 (`x` NHWC, `wt` OHWI; result NPQO), built from
/// [`conv_a_index`] and the GEMM model's B loader and tiling.
pub fn model_conv2d(inst: &Instance, s: &ConvShape, x: &[f64], wt: &[f64]) -> Vec<f64> {
    let (m, n, k) = s.mnk();
    // The virtual A, as the loader reads it (vectors of `align` along C never straddle a pixel
    // because C % align == 0).
    let mut a = vec![0.0; m * k];
    for gm in 0..m {
        for gk in 0..k {
            a[gm * k + gk] = conv_a_index(s, gm, gk).map_or(0.0, |i| x[i]);
        }
    }
    let g = Instance {
        kind: Kind::Gemm { b_kmajor: false },
        ..inst.clone()
    };
    model_gemm(
        &g,
        &GemmShape {
            m,
            n,
            k,
            batch: 1,
            a_batched: false,
            b_batched: false,
        },
        &a,
        wt,
    )
}

/// Whether an instance uses tensor cores.
pub fn is_tensor_op(inst: &Instance) -> bool {
    matches!(inst.tile.math, Math::TensorOp { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn small(elem: Elem, kind: Kind, align: u32) -> Instance {
        // The smallest tile of the math keeps the model quick; the index arithmetic is the
        // same for every tile.
        let t = *tiles(elem).last().unwrap_or(&TENSOR_OP_TILES[2]);
        Instance {
            elem,
            kind,
            tile: t,
            align,
            epilogue: vec![],
        }
    }

    #[test]
    fn alignment_from_divisibility() {
        assert_eq!(alignment(Elem::F16, &[64, 128]), 8);
        assert_eq!(alignment(Elem::F16, &[68]), 4);
        assert_eq!(alignment(Elem::F16, &[66]), 2);
        assert_eq!(alignment(Elem::F16, &[77]), 1);
        assert_eq!(alignment(Elem::F32, &[64, 6]), 2);
        assert_eq!(
            problem_alignment(Elem::F16, Kind::Gemm { b_kmajor: true }, 64, 12, 0),
            4
        );
        assert_eq!(
            problem_alignment(Elem::F16, Kind::Gemm { b_kmajor: false }, 64, 12, 0),
            8
        );
        assert_eq!(problem_alignment(Elem::F16, Kind::Conv2d, 27, 64, 3), 1);
    }

    #[test]
    fn sm90a_picks_wgmma_when_the_problem_qualifies() {
        let pick = |arch, elem, kind, k: usize, n: usize| {
            let al = problem_alignment(elem, kind, k, n, 0);
            let c = candidates_for(arch, elem, kind, al, &[]);
            choose(&c, 4096, n, 1, 132).map(Instance::kernel_name)
        };
        let tn = Kind::Gemm { b_kmajor: false };
        let nn = Kind::Gemm { b_kmajor: true };
        assert_eq!(
            pick(Arch::Sm90a, Elem::F16, tn, 4096, 4096).as_deref(),
            Some("cutlass_f16_gemm_tn_128x256x64_wgmma_s4_a8")
        );
        assert_eq!(
            pick(Arch::Sm90a, Elem::Bf16, nn, 4096, 4096).as_deref(),
            Some("cutlass_bf16_gemm_nn_128x256x64_wgmma_s4_a8")
        );
        // Few blocks: the smaller wgmma tile, not an mma.sync one.
        let al = problem_alignment(Elem::F16, tn, 64, 256, 0);
        let c = candidates_for(Arch::Sm90a, Elem::F16, tn, al, &[]);
        assert_eq!(
            choose(&c, 256, 256, 1, 132).map(|i| i.tile.tb),
            Some([128, 128, 64])
        );
        // Plain sm_90 keeps mma.sync.
        assert_eq!(
            pick(Arch::Sm90, Elem::F16, tn, 4096, 4096).as_deref(),
            Some("cutlass_f16_gemm_tn_128x128x32_64x64x32_s3_a8")
        );
        // K * 2 bytes not a multiple of 16: mma.sync, with the reason.
        assert!(
            pick(Arch::Sm90a, Elem::F16, tn, 4092, 4096)
                .is_some_and(|n| n.contains("64x64x32_s3_a4"))
        );
        assert!(
            wgmma_fallback(Arch::Sm90a, Elem::F16, tn, 4)
                .is_some_and(|r| r.contains("16-byte row strides"))
        );
        // N * 2 bytes for a row-major rhs.
        assert!(wgmma_fallback(Arch::Sm90a, Elem::F16, nn, 4).is_some());
        assert!(wgmma_fallback(Arch::Sm90, Elem::F16, tn, 8).is_some_and(|r| r.contains("sm_90a")));
        assert!(wgmma_fallback(Arch::Sm90a, Elem::F32, tn, 4).is_some());
        assert!(wgmma_fallback(Arch::Sm90a, Elem::F16, Kind::Conv2d, 8).is_some());
    }

    #[test]
    fn heuristic_picks_by_block_count() {
        let c = candidates(Elem::F16, Kind::Gemm { b_kmajor: false }, 8, &[]);
        let big = heuristic(&c, 4096, 4096, 1, 132).map(|i| i.tile.tb);
        assert_eq!(big, Some([128, 128, 32]));
        let mid = heuristic(&c, 2048, 1024, 1, 132).map(|i| i.tile.tb);
        assert_eq!(mid, Some([128, 64, 32]));
        let tiny = heuristic(&c, 64, 64, 1, 132).map(|i| i.tile.tb);
        assert_eq!(tiny, Some([64, 64, 32]));
    }

    fn ints(len: usize, seed: u64) -> Vec<f64> {
        (0..len)
            .map(|i| ((i as u64 * 2654435761 + seed) % 7) as f64 - 3.0)
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn gemm_model_matches_reference(
            m in 1usize..150, n in 1usize..150, kq in 1usize..20,
            kmajor in any::<bool>(), f32_ in any::<bool>(), ai in 0usize..4, seed in 0u64..1000,
        ) {
            let elem = if f32_ { Elem::F32 } else { Elem::F16 };
            let kind = Kind::Gemm { b_kmajor: kmajor };
            let want = elem.alignments()[ai.min(elem.alignments().len() - 1)];
            // Shapes that allow the wanted alignment, often not multiples of the tile.
            let k = kq * want as usize;
            let n = if kmajor { n.div_ceil(want as usize) * want as usize } else { n };
            let align = problem_alignment(elem, kind, k, n, 0);
            prop_assert!(align >= want);
            let inst = small(elem, kind, align);
            let s = GemmShape { m, n, k, batch: 1, a_batched: false, b_batched: false };
            let a = ints(m * k, seed);
            let b = ints(n * k, seed + 1);
            let got = model_gemm(&inst, &s, &a, &b);
            for i in 0..m {
                for j in 0..n {
                    let mut r = 0.0;
                    for kk in 0..k {
                        let bv = if kmajor { b[kk * n + j] } else { b[j * k + kk] };
                        r += a[i * k + kk] * bv;
                    }
                    prop_assert_eq!(got[i * n + j], r, "({}, {})", i, j);
                }
            }
        }

        #[test]
        fn conv_model_matches_direct_conv(
            nb in 1usize..3, h in 1usize..9, w in 1usize..9, cq in 1usize..4, o in 1usize..70,
            r in 1usize..4, s_ in 1usize..4, stride in 1usize..3, pad in 0usize..2, dil in 1usize..3,
            c_align in 0usize..3, seed in 0u64..1000,
        ) {
            let c = cq * [1usize, 2, 8][c_align];
            let (eh, ew) = ((r - 1) * dil + 1, (s_ - 1) * dil + 1);
            prop_assume!(h + 2 * pad >= eh && w + 2 * pad >= ew);
            let p = (h + 2 * pad - eh) / stride + 1;
            let q = (w + 2 * pad - ew) / stride + 1;
            let shape = ConvShape {
                nhwc: [nb, h, w, c], ors: [o, r, s_], pq: [p, q],
                stride: [stride; 2], pad: [pad; 2], dilation: [dil; 2],
            };
            let align = problem_alignment(Elem::F16, Kind::Conv2d, 0, 0, c);
            let inst = small(Elem::F16, Kind::Conv2d, align);
            let x = ints(nb * h * w * c, seed);
            let wt = ints(o * r * s_ * c, seed + 7);
            let got = model_conv2d(&inst, &shape, &x, &wt);
            for ni in 0..nb { for pi in 0..p { for qi in 0..q { for oi in 0..o {
                let mut acc = 0.0;
                for ri in 0..r { for si in 0..s_ { for ci in 0..c {
                    let hh = (pi * stride + ri * dil) as i64 - pad as i64;
                    let ww = (qi * stride + si * dil) as i64 - pad as i64;
                    if hh >= 0 && ww >= 0 && (hh as usize) < h && (ww as usize) < w {
                        acc += x[((ni * h + hh as usize) * w + ww as usize) * c + ci]
                            * wt[((oi * r + ri) * s_ + si) * c + ci];
                    }
                }}}
                prop_assert_eq!(got[((ni * p + pi) * q + qi) * o + oi], acc);
            }}}}
        }
    }
}
