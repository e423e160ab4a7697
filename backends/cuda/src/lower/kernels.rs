//! Kernel formation: the lowered templates of a function's outputs → [`Kernel`]s (see the
//! parent module's contract). A group with a row reduction becomes one *row kernel*: the
//! outputs' reductions over exactly the trailing columns of a row space, depending only on
//! the row coordinates, are replaced by row statistics computed once per row
//! ([`extract_stats`]), and every output of that row space (or of one value per row) is
//! stored there. The other outputs become *map kernels*, one per output shape.
//!
//! ```text
//! y = R.nn.softmax(x, axis=-1)           # x: (4, 10) float32
//! → row kernel over [4 | 10]:
//!   stat0 = max_{r} x[c0, r]
//!   stat1 = sum_{r} exp(x[c0, r] - stat0)
//!   out0[c0, c1] = exp(x[c0, c1] - stat0) / stat1
//! ```

use super::{Lowerer, Tv, sanitize};
use crate::error::Result;
use crate::kir::{Buffer, Graph, Kernel, Node, NodeId, Schedule, Stat, Store};
use std::collections::HashMap;

impl Lowerer<'_> {
    /// Groups the outputs into kernels (see the module doc).
    pub(super) fn kernels(&mut self, outs: &[Tv], buffers: &[Buffer]) -> Result<Vec<Kernel>> {
        let mut done = vec![false; outs.len()];
        let mut kernels = Vec::new();
        // A row kernel, if some output has a row reduction.
        'search: for o in outs {
            for cand in self.row_candidates(o) {
                if let Some((k, used)) = self.try_row_kernel(&cand, outs, buffers, &done) {
                    for u in used {
                        done[u] = true;
                    }
                    kernels.push(k);
                    break 'search;
                }
            }
        }
        // Map kernels, one per remaining output shape (first-output order).
        for i in 0..outs.len() {
            if done[i] {
                continue;
            }
            let space = outs[i].shape.clone();
            let mut stores = Vec::new();
            for j in i..outs.len() {
                if !done[j] && outs[j].shape == space {
                    done[j] = true;
                    stores.push(Store {
                        output: j as u32,
                        per_row: false,
                        value: outs[j].node,
                    });
                }
            }
            let name = format!("{}_k{}", sanitize(self.name), kernels.len());
            kernels.push(self.finish(
                name,
                space.clone(),
                space.len(),
                Vec::new(),
                stores,
                buffers,
            ));
        }
        Ok(kernels)
    }

    fn finish(
        &self,
        name: String,
        space: Vec<u64>,
        row_axes: usize,
        stats: Vec<Stat>,
        stores: Vec<Store>,
        buffers: &[Buffer],
    ) -> Kernel {
        let mut k = Kernel {
            name,
            inputs: self.inputs.clone(),
            outputs: buffers.to_vec(),
            space,
            row_axes,
            stats,
            stores,
            graph: self.g.clone(),
            schedule: Schedule::Map {
                block: 256,
                vector: 1,
            },
        };
        k.schedule = crate::schedule::choose(&k);
        k
    }

    /// Candidate (space, row_axes, output coords map) for a row kernel around output `o`.
    fn row_candidates(&self, o: &Tv) -> Vec<(Vec<u64>, usize)> {
        let mut out = Vec::new();
        for id in self.g.topo(&[o.node]) {
            if let Node::Reduce { vars, .. } = self.g.node(id) {
                if !vars.iter().all(|v| self.row_rvars.contains(&v.0)) {
                    continue;
                }
                let ext: Vec<u64> = vars.iter().map(|v| v.1).collect();
                let k = ext.len();
                let n = o.shape.len();
                if n >= k && o.shape[n - k..] == ext[..] {
                    out.push((o.shape.clone(), n - k));
                }
                if n >= k && o.shape[n - k..].iter().all(|&d| d == 1) {
                    let mut s = o.shape[..n - k].to_vec();
                    s.extend_from_slice(&ext);
                    out.push((s, n - k));
                }
                let mut s = o.shape.clone();
                s.extend_from_slice(&ext);
                out.push((s, n));
            }
        }
        out.dedup();
        out
    }

    /// Builds a row kernel over `cand`, taking every output that fits; `None` when no output
    /// fits or no row statistic comes out.
    fn try_row_kernel(
        &mut self,
        cand: &(Vec<u64>, usize),
        outs: &[Tv],
        buffers: &[Buffer],
        done: &[bool],
    ) -> Option<(Kernel, Vec<usize>)> {
        let (space, ra) = (&cand.0, cand.1);
        let saved = self.g.clone();
        let c = self.coords(space.len());
        let mut stats: Vec<Stat> = Vec::new();
        let mut stores = Vec::new();
        let mut used = Vec::new();
        let mut memo = HashMap::new();
        for (i, o) in outs.iter().enumerate() {
            if done[i] {
                continue;
            }
            // Per element: the same shape; per row: the row extents (with trailing 1s or not).
            let (index, per_row) = if o.shape == *space {
                (c.clone(), false)
            } else if o.shape[..] == space[..ra] {
                (c[..ra].to_vec(), true)
            } else if o.shape.len() == space.len()
                && o.shape[..ra] == space[..ra]
                && o.shape[ra..].iter().all(|&d| d == 1)
            {
                let zero = self.g.int(0);
                let mut idx = c[..ra].to_vec();
                idx.resize(space.len(), zero);
                (idx, true)
            } else {
                continue;
            };
            let v = self.g.substitute(o.node, &index);
            let v = extract_stats(
                &mut self.g,
                v,
                space,
                ra,
                &self.row_rvars,
                &mut stats,
                &mut memo,
            );
            let deps = self.g.deps(&[v]);
            let d = deps.get(&v).cloned().unwrap_or_default();
            let col_mask: u64 = (ra..space.len()).fold(0, |m, a| m | (1u64 << a.min(63)));
            if per_row && d.coords & col_mask != 0 {
                continue;
            }
            stores.push(Store {
                output: i as u32,
                per_row,
                value: v,
            });
            used.push(i);
        }
        if stats.is_empty() || stores.is_empty() {
            self.g = saved;
            return None;
        }
        let name = format!("{}_k0", sanitize(self.name));
        let k = self.finish(name, space.clone(), ra, stats, stores, buffers);
        Some((k, used))
    }
}

/// Replaces, under `root`, every reduce over exactly the columns of the row space that depends
/// only on row coordinates by a row statistic (inner ones first).
fn extract_stats(
    g: &mut Graph,
    root: NodeId,
    space: &[u64],
    ra: usize,
    row_rvars: &std::collections::HashSet<u32>,
    stats: &mut Vec<Stat>,
    found: &mut HashMap<NodeId, NodeId>,
) -> NodeId {
    let deps = g.deps(&[root]);
    let row_mask: u64 = (0..ra).fold(0, |m, a| m | (1u64 << a.min(63)));
    let cols = &space[ra..];
    let mut f = |g: &mut Graph, id: NodeId| -> Option<NodeId> {
        if let Some(&s) = found.get(&id) {
            return Some(s);
        }
        let Node::Reduce { op, vars, body } = g.node(id).clone() else {
            return None;
        };
        let d = deps.get(&id)?;
        let fits = vars.len() == cols.len()
            && vars.iter().all(|v| row_rvars.contains(&v.0))
            && vars.iter().zip(cols).all(|(v, &e)| v.1 == e)
            && d.coords & !row_mask == 0
            && d.rvars.is_empty();
        if !fits {
            return None;
        }
        // Inner statistics first, then the column variables become coordinates.
        let b = extract_stats(g, body, space, ra, row_rvars, stats, found);
        let mut coords: Vec<NodeId> = (0..space.len() as u32)
            .map(|i| g.add(Node::Coord(i)))
            .collect();
        coords.truncate(space.len());
        let mut rmap = HashMap::new();
        for (i, (v, _)) in vars.iter().enumerate() {
            rmap.insert(*v, coords[ra + i]);
        }
        let mut m2 = HashMap::new();
        let mut sub = |g: &mut Graph, n: NodeId| match g.node(n) {
            Node::RVar(v) => rmap.get(v).copied(),
            _ => None,
        };
        let b = g.rewrite(b, &mut sub, &mut m2);
        let scalar = g.scalar(b);
        g.stat_scalars.push(scalar);
        let idx = stats.len() as u32;
        stats.push(Stat { op, body: b });
        let s = g.add(Node::Stat(idx));
        found.insert(id, s);
        Some(s)
    };
    g.rewrite(root, &mut f, &mut HashMap::new())
}
