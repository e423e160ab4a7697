//! Lowering of the ops that reduce per output element: `relax.matmul` (batched, broadcast
//! batch dims), `relax.nn.conv2d` (any layout permutation, groups, dilation) and the pools
//! (`max_pool2d`, `avg_pool2d` with ceil mode and `count_include_pad`,
//! `adaptive_avg_pool2d`). Each is a template over the output coordinates whose value is a
//! reduction over the contracted axis or the window.
//!
//! ```text
//! y = R.matmul(a: (4, 8), b: (8, 16))
//!   → out[i,j] = Σ_k a[i,k] · b[k,j]
//! p = R.nn.max_pool2d(x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])
//!   → out[n,c,h,w] = max_{kh,kw in range} x[n,c,2h-1+kh,2w-1+kw]
//! ```

use super::*;

impl Lowerer<'_> {
    pub(super) fn matmul(&mut self, a: &Tv, b: &Tv, shape: &[u64], c: &[NodeId]) -> Result<NodeId> {
        let (ra, rb) = (a.shape.len(), b.shape.len());
        if ra == 0 || rb == 0 {
            return Err(self.unsupported("matmul of a scalar".into()));
        }
        let k = a.shape[ra - 1];
        let r = self.g.fresh_rvar();
        let rn = self.g.add(Node::RVar(r));
        let zero = self.g.int(0);
        let or = shape.len();
        // Output layout: batch..., [m if ra > 1], [n if rb > 1].
        let n_axis = (rb > 1).then(|| or - 1);
        let m_axis = (ra > 1).then(|| or - 1 - usize::from(rb > 1));
        let batch_end = m_axis.or(n_axis).unwrap_or(or);
        let bshape: Vec<u64> = shape[..batch_end].to_vec();
        let mut ai = Vec::new();
        if ra > 2 {
            let at = Tv {
                shape: a.shape[..ra - 2].to_vec(),
                ..a.clone()
            };
            ai = self.broadcast_index(&at.shape, &bshape, &c[..batch_end], zero);
        }
        if let Some(m) = m_axis {
            ai.push(c[m]);
        }
        ai.push(rn);
        let mut bi = Vec::new();
        if rb > 2 {
            bi = self.broadcast_index(&b.shape[..rb - 2], &bshape, &c[..batch_end], zero);
        }
        bi.push(rn);
        if let Some(n) = n_axis {
            bi.push(c[n]);
        }
        let av = self.at(a, &ai);
        let bv = self.at(b, &bi);
        let p = self.g.bin(Bin::Mul, av, bv);
        Ok(self.g.add(Node::Reduce {
            op: RedOp::Sum,
            vars: vec![(r, k)],
            body: p,
        }))
    }

    /// Index of a tensor of shape `s` broadcast against `out` at coordinates `c`.
    pub(super) fn broadcast_index(
        &mut self,
        s: &[u64],
        out: &[u64],
        c: &[NodeId],
        zero: NodeId,
    ) -> Vec<NodeId> {
        let off = out.len().saturating_sub(s.len());
        s.iter()
            .enumerate()
            .map(|(i, &d)| {
                let oi = off + i;
                if d == 1 && out.get(oi).copied() != Some(1) {
                    zero
                } else {
                    c.get(oi).copied().unwrap_or(zero)
                }
            })
            .collect()
    }

    pub(super) fn conv2d(
        &mut self,
        x: &Tv,
        w: &Tv,
        a: &fusebox_core::op::Conv2dAttrs,
        shape: &[u64],
        c: &[NodeId],
    ) -> Result<NodeId> {
        let dl = layout4(&a.data_layout, "NCHW")
            .ok_or_else(|| self.unsupported(format!("data layout {}", a.data_layout)))?;
        let kl = layout4(&a.kernel_layout, "OIHW")
            .ok_or_else(|| self.unsupported(format!("kernel layout {}", a.kernel_layout)))?;
        let ol = layout4(&a.out_layout, "NCHW")
            .ok_or_else(|| self.unsupported(format!("out layout {}", a.out_layout)))?;
        if x.shape.len() != 4 || w.shape.len() != 4 || shape.len() != 4 {
            return Err(self.unsupported("conv2d needs 4-D tensors".into()));
        }
        let groups = u64::try_from(a.groups)
            .ok()
            .filter(|&g| g > 0)
            .ok_or_else(|| self.unsupported("groups must be positive".into()))?;
        let (cin_pg, kh, kw) = (w.shape[kl[1]], w.shape[kl[2]], w.shape[kl[3]]);
        let cout = shape[ol[1]];
        let out_pg = (cout / groups).max(1);
        let (h, wd) = (x.shape[dl[2]] as i64, x.shape[dl[3]] as i64);
        let (n, oc, oh, ow) = (c[ol[0]], c[ol[1]], c[ol[2]], c[ol[3]]);
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
        let cpg = self.g.int(cin_pg as i64);
        let cbase = self.g.bin(Bin::Mul, grp, cpg);
        let ic = self.g.bin(Bin::Add, cbase, rcn);
        let pos = |l: &mut Self, o: NodeId, r: NodeId, s: i64, d: i64, p: i64| {
            let sn = l.g.int(s);
            let dn = l.g.int(d);
            let pn = l.g.int(p);
            let a1 = l.g.bin(Bin::Mul, o, sn);
            let a2 = l.g.bin(Bin::Mul, r, dn);
            let a3 = l.g.bin(Bin::Add, a1, a2);
            l.g.bin(Bin::Sub, a3, pn)
        };
        let ih = pos(self, oh, rhn, a.strides[0], a.dilation[0], a.padding[0]);
        let iw = pos(self, ow, rwn, a.strides[1], a.dilation[1], a.padding[1]);
        let (ihc, inh) = self.clamp_in(ih, h);
        let (iwc, inw) = self.clamp_in(iw, wd);
        let zero = self.g.int(0);
        let inb = self.g.select(inh, inw, zero);
        let mut xi = vec![zero; 4];
        xi[dl[0]] = n;
        xi[dl[1]] = ic;
        xi[dl[2]] = ihc;
        xi[dl[3]] = iwc;
        let mut wi = vec![zero; 4];
        wi[kl[0]] = oc;
        wi[kl[1]] = rcn;
        wi[kl[2]] = rhn;
        wi[kl[3]] = rwn;
        let xv = self.at(x, &xi);
        let wv = self.at(w, &wi);
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

    pub(super) fn pool2d(
        &mut self,
        x: &Tv,
        a: &fusebox_core::op::Pool2dAttrs,
        max: bool,
        shape: &[u64],
        c: &[NodeId],
    ) -> Result<NodeId> {
        let dl = layout4(&a.layout, "NCHW")
            .ok_or_else(|| self.unsupported(format!("layout {}", a.layout)))?;
        let ol = layout4(&a.out_layout, "NCHW")
            .ok_or_else(|| self.unsupported(format!("layout {}", a.out_layout)))?;
        if x.shape.len() != 4 || shape.len() != 4 {
            return Err(self.unsupported("pooling needs 4-D tensors".into()));
        }
        let s = Scalar::of(x.dtype);
        let (h, wd) = (x.shape[dl[2]] as i64, x.shape[dl[3]] as i64);
        let (kh, kw) = (a.pool_size[0].max(1) as u64, a.pool_size[1].max(1) as u64);
        let (rh, rw) = (self.g.fresh_rvar(), self.g.fresh_rvar());
        let (rhn, rwn) = (self.g.add(Node::RVar(rh)), self.g.add(Node::RVar(rw)));
        let (oh, ow) = (c[ol[2]], c[ol[3]]);
        let mut pos = |o: NodeId, r: NodeId, st: i64, d: i64, p: i64| {
            let sn = self.g.int(st);
            let dn = self.g.int(d);
            let pn = self.g.int(p);
            let a1 = self.g.bin(Bin::Mul, o, sn);
            let a2 = self.g.bin(Bin::Mul, r, dn);
            let a3 = self.g.bin(Bin::Add, a1, a2);
            self.g.bin(Bin::Sub, a3, pn)
        };
        let ih = pos(oh, rhn, a.strides[0], a.dilation[0], a.padding[0]);
        let iw = pos(ow, rwn, a.strides[1], a.dilation[1], a.padding[1]);
        let (ihc, inh) = self.clamp_in(ih, h);
        let (iwc, inw) = self.clamp_in(iw, wd);
        let zero = self.g.int(0);
        let inb = self.g.select(inh, inw, zero);
        let mut xi = vec![zero; 4];
        xi[dl[0]] = c[ol[0]];
        xi[dl[1]] = c[ol[1]];
        xi[dl[2]] = ihc;
        xi[dl[3]] = iwc;
        let xv = self.at(x, &xi);
        let vars = vec![(rh, kh), (rw, kw)];
        if max {
            let ninf = self.fconst(f64::NEG_INFINITY, s);
            let body = self.g.select(inb, xv, ninf);
            return Ok(self.g.add(Node::Reduce {
                op: RedOp::Max,
                vars,
                body,
            }));
        }
        let z = self.fconst(0.0, s);
        let body = self.g.select(inb, xv, z);
        let sum = self.g.add(Node::Reduce {
            op: RedOp::Sum,
            vars: vars.clone(),
            body,
        });
        // The divisor: positions inside the input (or inside input + trailing pad).
        let (lim_h, lim_w) = if a.count_include_pad {
            (h + a.padding[2], wd + a.padding[3])
        } else {
            (h, wd)
        };
        let count_axis = |l: &mut Self, o: NodeId, st: i64, d: i64, p: i64, k: u64, lim: i64| {
            // Count j in 0..k with lo <= o*st + j*d - p < lim, lo = 0 or -p (count_include_pad).
            let lo = if a.count_include_pad { -p } else { 0 };
            let mut cnt = l.g.int(0);
            for j in 0..k as i64 {
                let jn = l.g.int(j);
                let pp = pos_of(l, o, jn, st, d, p);
                let lon = l.g.int(lo);
                let limn = l.g.int(lim);
                let below = l.g.bin(Bin::Lt, pp, lon);
                let inside = l.g.bin(Bin::Lt, pp, limn);
                let zero = l.g.int(0);
                let ok = l.g.select(below, zero, inside);
                cnt = l.g.bin(Bin::Add, cnt, ok);
            }
            cnt
        };
        fn pos_of(l: &mut Lowerer<'_>, o: NodeId, j: NodeId, st: i64, d: i64, p: i64) -> NodeId {
            let sn = l.g.int(st);
            let dn = l.g.int(d);
            let pn = l.g.int(p);
            let a1 = l.g.bin(Bin::Mul, o, sn);
            let a2 = l.g.bin(Bin::Mul, j, dn);
            let a3 = l.g.bin(Bin::Add, a1, a2);
            l.g.bin(Bin::Sub, a3, pn)
        }
        let ch = count_axis(
            self,
            oh,
            a.strides[0],
            a.dilation[0],
            a.padding[0],
            kh,
            lim_h,
        );
        let cw = count_axis(
            self,
            ow,
            a.strides[1],
            a.dilation[1],
            a.padding[1],
            kw,
            lim_w,
        );
        let cnt = self.g.bin(Bin::Mul, ch, cw);
        let one = self.g.int(1);
        let cnt1 = self.g.bin(Bin::Max, cnt, one);
        let cf = self.g.add(Node::Convert(
            if s == Scalar::F64 {
                DType::F64
            } else {
                DType::F32
            },
            cnt1,
        ));
        Ok(self.g.bin(Bin::Div, sum, cf))
    }

    pub(super) fn adaptive_pool(
        &mut self,
        x: &Tv,
        l: [usize; 4],
        shape: &[u64],
        c: &[NodeId],
    ) -> NodeId {
        let s = Scalar::of(x.dtype);
        let (h, w) = (x.shape[l[2]] as i64, x.shape[l[3]] as i64);
        let (oh, ow) = (shape[l[2]] as i64, shape[l[3]] as i64);
        let win = |len: i64, o: i64| {
            (0..o)
                .map(|i| ((i + 1) * len + o - 1) / o - i * len / o)
                .max()
                .unwrap_or(1)
                .max(1) as u64
        };
        let (kh, kw) = (win(h, oh), win(w, ow));
        let axis = |lw: &mut Self, o: NodeId, len: i64, out: i64, k: u64| {
            let ln = lw.g.int(len);
            let on = lw.g.int(out.max(1));
            let one = lw.g.int(1);
            let t = lw.g.bin(Bin::Mul, o, ln);
            let start = lw.g.bin(Bin::Div, t, on);
            let o1 = lw.g.bin(Bin::Add, o, one);
            let t1 = lw.g.bin(Bin::Mul, o1, ln);
            let om1 = lw.g.int(out.max(1) - 1);
            let t2 = lw.g.bin(Bin::Add, t1, om1);
            let end = lw.g.bin(Bin::Div, t2, on);
            let r = lw.g.fresh_rvar();
            let rn = lw.g.add(Node::RVar(r));
            let p = lw.g.bin(Bin::Add, start, rn);
            let ok = lw.g.bin(Bin::Lt, p, end);
            let (pc, _) = lw.clamp_in(p, len);
            let cnt = lw.g.bin(Bin::Sub, end, start);
            (r, k, pc, ok, cnt)
        };
        let (rh, kh, ph, okh, ch) = axis(self, c[l[2]], h, oh, kh);
        let (rw, kw, pw, okw, cw) = axis(self, c[l[3]], w, ow, kw);
        if oh == 1 && ow == 1 {
            // Global pooling: a reduction over whole planes, like `mean(axis=[2, 3])`.
            self.row_rvars.insert(rh);
            self.row_rvars.insert(rw);
        }
        let zero = self.g.int(0);
        let ok = self.g.select(okh, okw, zero);
        let mut xi = vec![zero; 4];
        xi[l[0]] = c[l[0]];
        xi[l[1]] = c[l[1]];
        xi[l[2]] = ph;
        xi[l[3]] = pw;
        let xv = self.at(x, &xi);
        let z = self.fconst(0.0, s);
        let body = self.g.select(ok, xv, z);
        let sum = self.g.add(Node::Reduce {
            op: RedOp::Sum,
            vars: vec![(rh, kh), (rw, kw)],
            body,
        });
        let cnt = self.g.bin(Bin::Mul, ch, cw);
        let one = self.g.int(1);
        let cnt1 = self.g.bin(Bin::Max, cnt, one);
        let cf = self.g.add(Node::Convert(
            if s == Scalar::F64 {
                DType::F64
            } else {
                DType::F32
            },
            cnt1,
        ));
        self.g.bin(Bin::Div, sum, cf)
    }
}
