//! Lowering of the `nn` family ops added for issue 17: `relax.nn.conv2d_transpose` (a
//! per-element reduction over the input channels of the group and the kernel window),
//! `relax.nn.group_norm` / `relax.nn.instance_norm` (per-element group statistics) and
//! `relax.image.resize2d` (a separable sum of at most 4 × 4 taps whose indices and weights are
//! tables computed at lowering time, shared with the CPU reference through
//! [`fusebox_core::op::Resize2dAttrs::taps`]).
//!
//! Contract: `NCHW` / `IOHW` layouts only (others are [`crate::Error::Unsupported`]); resize
//! of integer data only with `nearest_neighbor` (an exact gather); tap tables become constant
//! inputs of the kernel.
//!
//! ```text
//! y = R.nn.conv2d_transpose(x, w, strides=[2, 2])
//!   → out[n,o,h,w] = Σ_{ci,kh,kw} (h + pt - kh·d) % s == 0 && in range ? x[n,ci,(h+pt-kh·d)/s,…] · w[ci,o,kh,kw] : 0
//! z = R.image.resize2d(x, R.shape([8, 8]), method="linear")
//!   → out[n,c,h,w] = Σ_{i,j<2} wh[h,i] · ww[w,j] · x[n,c,ih[h,i],iw[w,j]]
//! ```

use super::{Lowerer, Tv, Val, layout4, norm_axis};
use crate::error::Result;
use crate::kir::{Bin, Node, NodeId, RedOp, Scalar, Un};
use fusebox_core::ir::{Constant, DType};
use fusebox_core::op::{Conv2dTransposeAttrs, GroupNormAttrs, Resize2dAttrs, Taps};

/// The most terms (taps along H × taps along W) one `resize2d` output element may sum on the
/// GPU: each is unrolled in the generated kernel.
const MAX_RESIZE_TERMS: usize = 64;

impl Lowerer<'_> {
    /// `conv2d_transpose` at output coordinates `c` of `shape`.
    pub(super) fn conv2d_transpose(
        &mut self,
        x: &Tv,
        w: &Tv,
        a: &Conv2dTransposeAttrs,
        shape: &[u64],
        c: &[NodeId],
    ) -> Result<NodeId> {
        let plain = |l: &str, want: &str| layout4(l, want) == Some([0, 1, 2, 3]);
        if !plain(&a.data_layout, "NCHW")
            || !plain(&a.kernel_layout, "IOHW")
            || !plain(&a.out_layout, "NCHW")
        {
            return Err(self.unsupported("conv2d_transpose outside NCHW/IOHW layouts".into()));
        }
        if x.shape.len() != 4 || w.shape.len() != 4 || shape.len() != 4 {
            return Err(self.unsupported("conv2d_transpose needs 4-D tensors".into()));
        }
        let groups = u64::try_from(a.groups)
            .ok()
            .filter(|&g| g > 0 && x.shape[1].is_multiple_of(g))
            .ok_or_else(|| self.unsupported("groups must divide the input channels".into()))?;
        let cin_pg = x.shape[1] / groups;
        let out_pg = w.shape[1].max(1);
        let (kh, kw) = (w.shape[2], w.shape[3]);
        let (h, wd) = (x.shape[2] as i64, x.shape[3] as i64);
        let (n, oc, oh, ow) = (c[0], c[1], c[2], c[3]);
        let (rc, rh, rw) = (
            self.g.fresh_rvar(),
            self.g.fresh_rvar(),
            self.g.fresh_rvar(),
        );
        let (rcn, rhn, rwn) = (
            self.g.add(Node::RVar(rc)),
            self.g.add(Node::RVar(rh)),
            self.g.add(Node::RVar(rw)),
        );
        let opg = self.g.int(out_pg as i64);
        let grp = self.g.bin(Bin::Div, oc, opg);
        let o_in_g = self.g.bin(Bin::Rem, oc, opg);
        let cpg = self.g.int(cin_pg as i64);
        let cbase = self.g.bin(Bin::Mul, grp, cpg);
        let ic = self.g.bin(Bin::Add, cbase, rcn);
        // The input position of output `o` and tap `r`: (o + p - r·d) / s when divisible.
        // An offset of s·(k·d + 1) keeps the dividend non-negative for `%` and `/`.
        let pos = |l: &mut Self, o: NodeId, r: NodeId, s: i64, d: i64, p: i64, k: u64| {
            let off = s.saturating_mul((k as i64).saturating_mul(d).saturating_add(1));
            let dn = l.g.int(d);
            let rd = l.g.bin(Bin::Mul, r, dn);
            let base = l.g.int(p.saturating_add(off));
            let t = l.g.bin(Bin::Add, o, base);
            let t = l.g.bin(Bin::Sub, t, rd);
            let sn = l.g.int(s);
            let rem = l.g.bin(Bin::Rem, t, sn);
            let q = l.g.bin(Bin::Div, t, sn);
            let offq = l.g.int(off / s.max(1));
            let i = l.g.bin(Bin::Sub, q, offq);
            let one = l.g.int(1);
            // divisible = rem < 1
            let div_ok = l.g.bin(Bin::Lt, rem, one);
            (i, div_ok)
        };
        let (ih, dh) = pos(self, oh, rhn, a.strides[0], a.dilation[0], a.padding[0], kh);
        let (iw, dw) = pos(self, ow, rwn, a.strides[1], a.dilation[1], a.padding[1], kw);
        let (ihc, inh) = self.clamp_in(ih, h);
        let (iwc, inw) = self.clamp_in(iw, wd);
        let zero = self.g.int(0);
        let c1 = self.g.select(inh, inw, zero);
        let c2 = self.g.select(dh, dw, zero);
        let inb = self.g.select(c1, c2, zero);
        let xv = self.at(x, &[n, ic, ihc, iwc]);
        let wv = self.at(w, &[ic, o_in_g, rhn, rwn]);
        let s = Scalar::of(x.dtype);
        let z = self.fconst(0.0, s);
        let xg = self.g.select(inb, xv, z);
        let p = self.g.bin(Bin::Mul, xg, wv);
        Ok(self.g.add(Node::Reduce {
            op: RedOp::Sum,
            vars: vec![(rc, cin_pg), (rh, kh), (rw, kw)],
            body: p,
        }))
    }

    /// One axis's tap tables as constant inputs: indices `[n_out, t]` (i64), weights
    /// `[n_out, t]` (float), and whether each output index lies inside the input.
    fn tap_tables(&mut self, taps: &[Taps], t: usize, wdt: DType) -> Result<(Tv, Tv, Tv)> {
        let mut idx = Vec::with_capacity(taps.len() * t);
        let mut wts = Vec::with_capacity(taps.len() * t);
        let mut valid = Vec::with_capacity(taps.len());
        for tp in taps {
            valid.push(i64::from(tp.is_some()));
            let list = tp.as_deref().unwrap_or(&[]);
            for k in 0..t {
                let (i, w) = list.get(k).copied().unwrap_or((0, 0.0));
                idx.push(i as i64);
                wts.push(w);
            }
        }
        let n = taps.len() as i64;
        let bytes_i = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let wbytes: Vec<u8> = if wdt == DType::F64 {
            wts.iter().flat_map(|x| x.to_le_bytes()).collect()
        } else {
            wts.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect()
        };
        let mk = |l: &mut Self, c: std::result::Result<Constant, String>| -> Result<Tv> {
            let c = c.map_err(|e| l.unsupported(format!("resize tables: {e}")))?;
            match l.constant(&c)? {
                Val::T(t) => Ok(t),
                _ => Err(l.unsupported("resize tables: not a tensor".into())),
            }
        };
        let it = mk(
            self,
            Constant::from_bytes(DType::I64, vec![n, t as i64], bytes_i(&idx)),
        )?;
        let wt = mk(self, Constant::from_bytes(wdt, vec![n, t as i64], wbytes))?;
        let vt = mk(
            self,
            Constant::from_bytes(DType::I64, vec![n], bytes_i(&valid)),
        )?;
        Ok((it, wt, vt))
    }

    /// `resize2d` at output coordinates `c` of `shape`.
    pub(super) fn resize2d(
        &mut self,
        x: &Tv,
        a: &Resize2dAttrs,
        shape: &[u64],
        dtype: DType,
        c: &[NodeId],
    ) -> Result<NodeId> {
        if layout4(&a.layout, "NCHW") != Some([0, 1, 2, 3]) {
            return Err(self.unsupported("resize2d outside the NCHW layout".into()));
        }
        if x.shape.len() != 4 || shape.len() != 4 {
            return Err(self.unsupported("resize2d needs 4-D tensors".into()));
        }
        let nearest = a.method == "nearest_neighbor";
        if !nearest && (!x.dtype.is_float() || !dtype.is_float()) {
            return Err(self.unsupported(format!(
                "{} resize of {} data: integer arithmetic stays on the CPU",
                a.method, x.dtype
            )));
        }
        let (ih, iw) = (x.shape[2] as usize, x.shape[3] as usize);
        let (oh, ow) = (shape[2] as usize, shape[3] as usize);
        if ih == 0 || iw == 0 {
            return Err(self.unsupported("resize2d of an empty image".into()));
        }
        for (axis, (i, o)) in [(ih, oh), (iw, ow)].into_iter().enumerate() {
            a.check_extent(axis, i, o)
                .map_err(|e| self.unsupported(e))?;
        }
        let th = a.taps(0, ih, oh);
        let tw = a.taps(1, iw, ow);
        let width = |t: &[Taps]| t.iter().flatten().map(Vec::len).max().unwrap_or(1).max(1);
        let (nh, nw) = (width(&th), width(&tw));
        // Each output element sums nh × nw terms, unrolled: a strongly antialiased
        // downsampling stays on the CPU.
        if nh * nw > MAX_RESIZE_TERMS {
            return Err(self.unsupported(format!(
                "resize2d with {nh} × {nw} taps per output (antialiased downsampling): more than \
                 {MAX_RESIZE_TERMS} unrolled terms"
            )));
        }
        let s = Scalar::of(dtype);
        let wdt = if s == Scalar::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let (hi, hw, hv) = self.tap_tables(&th, nh, wdt)?;
        let (wi, ww, wv) = self.tap_tables(&tw, nw, wdt)?;
        let single = nh == 1 && nw == 1 && nearest;
        let mut acc: Option<NodeId> = None;
        for i in 0..nh {
            let ki = self.g.int(i as i64);
            let yi = self.at(&hi, &[c[2], ki]);
            for j in 0..nw {
                let kj = self.g.int(j as i64);
                let xj = self.at(&wi, &[c[3], kj]);
                let xv = self.at(x, &[c[0], c[1], yi, xj]);
                let xv = if x.dtype == dtype {
                    xv
                } else {
                    self.g.add(Node::Convert(dtype, xv))
                };
                let term = if single {
                    xv
                } else {
                    let a1 = self.at(&hw, &[c[2], ki]);
                    let a2 = self.at(&ww, &[c[3], kj]);
                    let wgt = self.g.bin(Bin::Mul, a1, a2);
                    self.g.bin(Bin::Mul, wgt, xv)
                };
                acc = Some(match acc {
                    None => term,
                    Some(p) => self.g.bin(Bin::Add, p, term),
                });
            }
        }
        let sum = acc.ok_or_else(|| self.unsupported("resize2d without taps".into()))?;
        if a.coordinate_transformation_mode != "tf_crop_and_resize" {
            return Ok(sum);
        }
        let ext = if s == Scalar::I64 {
            self.g.int(a.extrapolation_value.0 as i64)
        } else {
            self.fconst(a.extrapolation_value.0, s)
        };
        let vh = self.at(&hv, &[c[2]]);
        let vw = self.at(&wv, &[c[3]]);
        let inner = self.g.select(vw, sum, ext);
        Ok(self.g.select(vh, inner, ext))
    }
}

impl Lowerer<'_> {
    /// `group_norm` / `instance_norm` at output coordinates `c` of `shape`: the group's mean
    /// and variance are reductions over the group's channels and `axes`, evaluated per element
    /// (they are not whole trailing axes, so not row statistics).
    pub(super) fn group_norm(
        &mut self,
        args: &[Val],
        a: &GroupNormAttrs,
        shape: &[u64],
        dtype: DType,
        c: &[NodeId],
    ) -> Result<NodeId> {
        let x = self.tensor_arg(args, 0)?.clone();
        let gm = self.tensor_arg(args, 1)?.clone();
        let bt = self.tensor_arg(args, 2)?.clone();
        let r = shape.len();
        let ch = norm_axis(a.channel_axis, r)
            .ok_or_else(|| self.unsupported("channel axis out of range".into()))?;
        let axes = self.axes(&a.axes, r)?;
        let cext = shape[ch];
        let groups = if a.num_groups == 0 {
            cext.max(1)
        } else {
            u64::try_from(a.num_groups)
                .ok()
                .filter(|&g| g > 0 && cext.is_multiple_of(g))
                .ok_or_else(|| self.unsupported("num_groups must divide the channels".into()))?
        };
        let cpg = (cext / groups).max(1);
        let s = Scalar::of(dtype);
        let mut vars = Vec::new();
        let mut ri = c.to_vec();
        let rc = self.g.fresh_rvar();
        vars.push((rc, cpg));
        let rcn = self.g.add(Node::RVar(rc));
        let cpgn = self.g.int(cpg as i64);
        let grp = self.g.bin(Bin::Div, c[ch], cpgn);
        let base = self.g.bin(Bin::Mul, grp, cpgn);
        ri[ch] = self.g.bin(Bin::Add, base, rcn);
        for &ax in &axes {
            let rv = self.g.fresh_rvar();
            vars.push((rv, shape[ax]));
            ri[ax] = self.g.add(Node::RVar(rv));
        }
        let n: u64 = vars.iter().map(|v| v.1).product();
        let inv = self.fconst(1.0 / n.max(1) as f64, s);
        let xr = self.at(&x, &ri);
        let sum = self.g.add(Node::Reduce {
            op: RedOp::Sum,
            vars: vars.clone(),
            body: xr,
        });
        let mean = self.g.bin(Bin::Mul, sum, inv);
        let dr = self.g.bin(Bin::Sub, xr, mean);
        let sq = self.g.bin(Bin::Mul, dr, dr);
        let ss = self.g.add(Node::Reduce {
            op: RedOp::Sum,
            vars,
            body: sq,
        });
        let var = self.g.bin(Bin::Mul, ss, inv);
        let eps = self.fconst(a.epsilon.0, s);
        let ve = self.g.bin(Bin::Add, var, eps);
        let rs = self.g.un(Un::Rsqrt, ve);
        let xc = self.at(&x, c);
        let dc = self.g.bin(Bin::Sub, xc, mean);
        let mut y = self.g.bin(Bin::Mul, dc, rs);
        if a.scale {
            let gv = self.at(&gm, &[c[ch]]);
            y = self.g.bin(Bin::Mul, y, gv);
        }
        if a.center {
            let bv = self.at(&bt, &[c[ch]]);
            y = self.g.bin(Bin::Add, y, bv);
        }
        Ok(y)
    }
}
