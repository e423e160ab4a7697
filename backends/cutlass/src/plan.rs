//! A [`KernelSpec`] and the concrete argument shapes of one call → a [`Plan`]: the problem
//! (GEMM with batches and strides, or conv2d geometry), the output shape, the kernel kind and
//! alignment, and the checks on the epilogue operands. Pure Rust, unit-tested on the CPU.
//!
//! Contract: [`plan`] fails with [`Error::Args`] on shapes the function cannot take (mismatched
//! K, partial batch broadcasting, an epilogue operand of the wrong size, a conv whose output
//! would be empty).
//!
//! ```text
//! gemm lhs (2, 100, 77) f16, rhs (77, 300) -> M 100, N 300, K 77, batch 2 (B shared),
//!      out (2, 100, 300), kind gemm_nn, align 1
//! ```

use crate::error::{Error, Result};
use crate::generator::{Bcast, EpOp, Instance, Kind};
use crate::select::{
    ConvShape, GemmShape, candidates_for, choose, problem_alignment, wgmma_fallback,
};
use crate::spec::{KernelSpec, Problem};
use fusebox_cuda::Arch;

/// The concrete problem of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// A (batched) GEMM.
    Gemm(GemmShape),
    /// A conv2d.
    Conv(ConvShape),
}

/// One call, planned.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Plan {
    /// The problem.
    pub shape: Shape,
    /// The output shape.
    pub out_shape: Vec<usize>,
    /// The kernel kind.
    pub kind: Kind,
    /// The alignment the shapes allow.
    pub align: u32,
}

impl Plan {
    /// (M, N, batch) of the launch.
    pub fn mnb(&self) -> (usize, usize, usize) {
        match self.shape {
            Shape::Gemm(g) => (g.m, g.n, g.batch),
            Shape::Conv(c) => {
                let (m, n, _) = c.mnk();
                (m, n, 1)
            }
        }
    }

    /// The candidate instances for this plan and epilogue on `arch` (wgmma tiles first where
    /// they apply).
    pub fn candidates(&self, spec: &KernelSpec, arch: Arch) -> Vec<Instance> {
        candidates_for(arch, spec.elem, self.kind, self.align, &spec.epilogue)
    }

    /// The heuristic's instance for `sm_count` SMs on `arch`.
    pub fn choose(&self, spec: &KernelSpec, sm_count: usize, arch: Arch) -> Option<Instance> {
        let c = self.candidates(spec, arch);
        let (m, n, b) = self.mnb();
        choose(&c, m, n, b, sm_count).cloned()
    }

    /// `wgmma` when the plan takes the sm_90a path on `arch`, else `mma.sync` / `simt` and why
    /// not wgmma (for the build report).
    pub fn path(&self, spec: &KernelSpec, arch: Arch) -> String {
        match wgmma_fallback(arch, spec.elem, self.kind, self.align) {
            None => "wgmma + TMA (sm_90a)".into(),
            Some(why) if spec.elem == crate::generator::Elem::F32 => format!("simt ({why})"),
            Some(why) => format!("mma.sync ({why})"),
        }
    }

    /// A key naming the problem (for the profile cache).
    pub fn key(&self, spec: &KernelSpec) -> String {
        format!(
            "{}:{:?}:{}:{:?}",
            spec.elem.tag(),
            self.kind,
            self.align,
            self.shape
        )
    }
}

fn args(msg: String) -> Error {
    Error::Args(msg)
}

/// Plans a call of `spec` whose arguments have the shapes `shapes` (see the module doc).
pub fn plan(spec: &KernelSpec, shapes: &[Vec<usize>]) -> Result<Plan> {
    if shapes.len() != spec.num_params {
        return Err(args(format!(
            "expected {} arguments, found {}",
            spec.num_params,
            shapes.len()
        )));
    }
    let get = |i: usize| -> Result<&Vec<usize>> {
        shapes
            .get(i)
            .ok_or_else(|| args(format!("argument {i} is missing")))
    };
    let (shape, out_shape, kind, align) = match &spec.problem {
        Problem::Gemm {
            lhs,
            rhs,
            rhs_transposed,
        } => {
            let (l, r) = (get(*lhs)?, get(*rhs)?);
            if l.len() < 2 || r.len() < 2 {
                return Err(args("matmul operands must have rank >= 2".into()));
            }
            let (m, k) = (l[l.len() - 2], l[l.len() - 1]);
            let (rk, n) = if *rhs_transposed {
                (r[r.len() - 1], r[r.len() - 2])
            } else {
                (r[r.len() - 2], r[r.len() - 1])
            };
            if rk != k {
                return Err(args(format!("reduction dims differ: lhs {l:?}, rhs {r:?}")));
            }
            let (lb, rb) = (&l[..l.len() - 2], &r[..r.len() - 2]);
            let (pl, pr) = (lb.iter().product::<usize>(), rb.iter().product::<usize>());
            let nd = lb.len().max(rb.len());
            let pad = |b: &[usize]| {
                let mut v = vec![1; nd - b.len()];
                v.extend_from_slice(b);
                v
            };
            let (ql, qr) = (pad(lb), pad(rb));
            let out_batch: Vec<usize> = if pl == 1 {
                qr.clone()
            } else if pr == 1 || ql == qr {
                ql.clone()
            } else {
                return Err(args(format!(
                    "batch dims {lb:?} and {rb:?} are neither equal nor 1 on one side"
                )));
            };
            let batch = out_batch.iter().product::<usize>();
            let mut out = out_batch;
            out.extend([m, n]);
            let kind = Kind::Gemm {
                b_kmajor: !rhs_transposed,
            };
            let g = GemmShape {
                m,
                n,
                k,
                batch,
                a_batched: pl != 1,
                b_batched: pr != 1,
            };
            (
                Shape::Gemm(g),
                out,
                kind,
                problem_alignment(spec.elem, kind, k, n, 0),
            )
        }
        Problem::Conv2d {
            data,
            weight,
            attrs,
        } => {
            let (x, w) = (get(*data)?, get(*weight)?);
            let ([nb, h, wd, c], [o, r, s, wc]) = (
                <[usize; 4]>::try_from(x.as_slice())
                    .map_err(|_| args(format!("conv2d data {x:?} is not 4-D")))?,
                <[usize; 4]>::try_from(w.as_slice())
                    .map_err(|_| args(format!("conv2d weight {w:?} is not 4-D")))?,
            );
            if wc != c {
                return Err(args(format!(
                    "conv2d channels differ: data {x:?}, weight {w:?}"
                )));
            }
            let u = |v: i64| {
                usize::try_from(v).map_err(|_| args(format!("negative conv2d attribute {v}")))
            };
            let [sh, sw] = [u(attrs.strides[0])?, u(attrs.strides[1])?];
            let [pt, pl, pb, pr] = [
                u(attrs.padding[0])?,
                u(attrs.padding[1])?,
                u(attrs.padding[2])?,
                u(attrs.padding[3])?,
            ];
            let [dh, dw] = [u(attrs.dilation[0])?, u(attrs.dilation[1])?];
            if sh == 0 || sw == 0 || dh == 0 || dw == 0 {
                return Err(args("conv2d strides and dilations must be positive".into()));
            }
            let (eh, ew) = ((r.max(1) - 1) * dh + 1, (s.max(1) - 1) * dw + 1);
            if h + pt + pb < eh || wd + pl + pr < ew {
                return Err(args(format!(
                    "conv2d kernel {r}x{s} is larger than the padded input {x:?}"
                )));
            }
            let p = (h + pt + pb - eh) / sh + 1;
            let q = (wd + pl + pr - ew) / sw + 1;
            let cs = ConvShape {
                nhwc: [nb, h, wd, c],
                ors: [o, r, s],
                pq: [p, q],
                stride: [sh, sw],
                pad: [pt, pl],
                dilation: [dh, dw],
            };
            (
                Shape::Conv(cs),
                vec![nb, p, q, o],
                Kind::Conv2d,
                problem_alignment(spec.elem, Kind::Conv2d, 0, 0, c),
            )
        }
    };
    // The epilogue operands.
    let n = out_shape.last().copied().unwrap_or(1);
    let out_numel: usize = out_shape.iter().product();
    let binaries = spec.epilogue.iter().filter_map(|o| match o {
        EpOp::Binary(_, b) => Some(*b),
        _ => None,
    });
    for (&i, bc) in spec.extras.iter().zip(binaries) {
        let s = get(i)?;
        let numel: usize = s.iter().product();
        let ok = match bc {
            Bcast::Vector => numel == n && s.last() == Some(&n),
            Bcast::Full => *s == out_shape,
        };
        if !ok {
            return Err(args(format!(
                "epilogue operand {i} has shape {s:?}; expected {}",
                match bc {
                    Bcast::Vector => format!("a vector of {n}"),
                    Bcast::Full => format!("{out_shape:?} ({out_numel} elements)"),
                }
            )));
        }
    }
    // The kernels index rows, columns and K with 32-bit ints (offsets are 64-bit).
    let (m, n, k) = match shape {
        Shape::Gemm(g) => (g.m, g.n, g.k),
        Shape::Conv(c) => c.mnk(),
    };
    if [m, n, k].iter().any(|&v| i32::try_from(v).is_err()) {
        return Err(args(format!(
            "problem {m}x{n}x{k} exceeds the kernels' 32-bit row/column indexing"
        )));
    }
    Ok(Plan {
        shape,
        out_shape,
        kind,
        align,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::{BinOp, Elem};
    use fusebox_core::op::Conv2dAttrs;

    fn gemm_spec(tr: bool, epilogue: Vec<EpOp>, extras: Vec<usize>) -> KernelSpec {
        KernelSpec {
            composite: "cutlass.matmul".into(),
            num_params: 2 + extras.len(),
            problem: Problem::Gemm {
                lhs: 0,
                rhs: 1,
                rhs_transposed: tr,
            },
            epilogue,
            extras,
            elem: Elem::F16,
        }
    }

    #[test]
    fn artifact_doc_example() {
        let s = gemm_spec(
            false,
            vec![EpOp::Binary(BinOp::Add, Bcast::Vector)],
            vec![2],
        );
        let p = plan(&s, &[vec![512, 256], vec![256, 1024], vec![1024]]).unwrap();
        let i = p.choose(&s, 132, Arch::Sm90).unwrap();
        assert_eq!(
            i.kernel_name(),
            "cutlass_f16_gemm_nn_64x64x32_32x32x32_s4_a8_bias"
        );
        let l = i.launch(512, 1024, 1).unwrap();
        assert_eq!((l.grid, l.smem), ([16, 8, 1], 38912));
    }

    #[test]
    fn crate_doc_wgmma_example() {
        let s = gemm_spec(
            false,
            vec![
                EpOp::Binary(BinOp::Add, Bcast::Vector),
                EpOp::Act(crate::generator::Act::Gelu),
            ],
            vec![2],
        );
        let p = plan(&s, &[vec![4096, 4096], vec![4096, 4096], vec![4096]]).unwrap();
        let i = p.choose(&s, 132, Arch::Sm90a).unwrap();
        assert_eq!(
            i.kernel_name(),
            "cutlass_f16_gemm_nn_128x256x64_wgmma_s4_a8_bias_gelu"
        );
        let l = i.launch(4096, 4096, 1).unwrap();
        assert_eq!((l.grid, l.block[0], l.smem), ([16, 32, 1], 384, 197696));
        let (a, b) = crate::wgmma::operands(&i);
        assert_eq!((a.box_inner, a.box_outer, a.boxes), (64, 128, 1));
        assert_eq!((b.box_inner, b.box_outer, b.boxes), (64, 64, 4));
        assert_eq!(p.path(&s, Arch::Sm90a), "wgmma + TMA (sm_90a)");
        // Plain sm_90 keeps mma.sync.
        let j = p.choose(&s, 132, Arch::Sm90).unwrap();
        assert!(j.kernel_name().contains("_64x64x32_s3_a8"));
        assert!(
            p.path(&s, Arch::Sm90)
                .starts_with("mma.sync (wgmma needs sm_90a")
        );
    }

    #[test]
    fn gemm_plans() {
        let s = gemm_spec(false, vec![], vec![]);
        let p = plan(&s, &[vec![2, 100, 77], vec![77, 300]]).ok();
        let p = p.as_ref();
        assert_eq!(p.map(|p| p.out_shape.clone()), Some(vec![2, 100, 300]));
        assert_eq!(p.map(|p| p.align), Some(1));
        assert_eq!(p.map(Plan::mnb), Some((100, 300, 2)));
        let t = gemm_spec(true, vec![], vec![]);
        let p = plan(&t, &[vec![64, 128], vec![256, 128]]).ok();
        assert_eq!(
            p.as_ref().map(|p| (p.align, p.out_shape.clone())),
            Some((8, vec![64, 256]))
        );
        assert!(plan(&s, &[vec![3, 4, 8], vec![2, 8, 4]]).is_err());
        assert!(plan(&s, &[vec![4, 8], vec![7, 4]]).is_err());
        let b = gemm_spec(
            false,
            vec![
                EpOp::Binary(BinOp::Add, Bcast::Vector),
                EpOp::Binary(BinOp::Add, Bcast::Full),
            ],
            vec![2, 3],
        );
        assert!(plan(&b, &[vec![4, 8], vec![8, 16], vec![16], vec![4, 16]]).is_ok());
        assert!(plan(&b, &[vec![4, 8], vec![8, 16], vec![8], vec![4, 16]]).is_err());
        assert!(plan(&b, &[vec![4, 8], vec![8, 16], vec![16], vec![1, 16]]).is_err());
    }

    #[test]
    fn conv_plans() {
        let spec = KernelSpec {
            composite: "cutlass.conv2d".into(),
            num_params: 2,
            problem: Problem::Conv2d {
                data: 0,
                weight: 1,
                attrs: Box::new(Conv2dAttrs {
                    strides: [2, 2],
                    padding: [1, 1, 1, 1],
                    dilation: [1, 1],
                    groups: 1,
                    data_layout: "NHWC".into(),
                    kernel_layout: "OHWI".into(),
                    out_layout: "NHWC".into(),
                    out_dtype: None,
                }),
            },
            epilogue: vec![],
            extras: vec![],
            elem: Elem::F16,
        };
        let p = plan(&spec, &[vec![1, 56, 56, 64], vec![128, 3, 3, 64]]).ok();
        assert_eq!(
            p.as_ref().map(|p| p.out_shape.clone()),
            Some(vec![1, 28, 28, 128])
        );
        assert_eq!(p.as_ref().map(Plan::mnb), Some((784, 128, 1)));
        assert_eq!(p.map(|p| p.align), Some(8));
        assert!(plan(&spec, &[vec![1, 56, 56, 64], vec![128, 3, 3, 32]]).is_err());
        // The crate doc's example: ResNet-50's first 3x3 conv with bias + relu.
        let mut s2 = spec.clone();
        if let Problem::Conv2d { attrs, .. } = &mut s2.problem {
            attrs.strides = [1, 1];
        }
        s2.epilogue = vec![
            EpOp::Binary(BinOp::Add, Bcast::Vector),
            EpOp::Act(crate::generator::Act::Relu),
        ];
        s2.extras = vec![2];
        s2.num_params = 3;
        let p = plan(
            &s2,
            &[vec![1, 56, 56, 64], vec![64, 3, 3, 64], vec![1, 1, 1, 64]],
        )
        .unwrap();
        let i = p.choose(&s2, 132, Arch::Sm90a).unwrap();
        assert_eq!(
            i.kernel_name(),
            "cutlass_f16_conv2d_fprop_64x64x32_32x32x32_s4_a8_bias_relu"
        );
        let l = i.launch(3136, 64, 1).unwrap();
        assert_eq!((l.grid, l.block[0], l.smem), ([1, 49, 1], 128, 40960));
    }
}
