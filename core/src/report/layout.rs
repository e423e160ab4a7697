//! Layered (Sugiyama) layout of a DAG for the HTML report, by the `rust-sugiyama` crate.
//!
//! Contract: [`layout`] takes boxes (width, height) in topological order and edges `u → v`
//! with `u < v`, and returns every box's centre and every edge's route, top to bottom. It is
//! deterministic: the same input gives the same coordinates in every process.
//!
//! The crate ranks, orders and places vertices; it returns no routes for edges that span
//! several ranks. So before calling it, every edge is cut into unit-length pieces by small
//! routing vertices of our own (one per rank crossed), and the route of an edge is the centres
//! of its routing vertices. Ranks are the longest path from the sources, except that a source
//! (a parameter, a constant binding) sits one rank above its first user rather than at the
//! top, so a weight used deep in the graph does not pull a long edge down the page. With
//! every edge one rank long, the crate's rank assignment (network simplex, minimising the
//! total edge length) reproduces these ranks exactly. Weakly connected components come back
//! separately and are placed side by side, in order of their first vertex.
//!
//! An edge longer than [`MAX_SPAN`] ranks (an attention mask read by every layer, a shape
//! value read across the model) is not drawn down the page: its target gets a *ghost* of the
//! source instead, a box of the caller's size placed just above it, and the edge starts
//! there. This keeps the drawing readable and bounds the routing vertices by
//! `MAX_SPAN` × edges, so the layout stays fast on BERT- and ResNet-sized graphs.
//!
//! ```text
//! before: sizes [(80,20), (80,20), (80,20)], edges [(0,1), (0,2), (1,2)]
//! after:  0 at (x0, 10), 1 at (x1, 46), 2 at (x2, 82); the edge 0 → 2 routed through one
//!         routing vertex on the rank of 1, beside it.
//! ```

use crate::{Error, Result};

/// Space between boxes, horizontally and vertically.
const SPACING: f64 = 18.0;
/// The size of a routing vertex.
const ROUTE_SIZE: (f64, f64) = (6.0, 6.0);
/// The longest edge, in ranks, that is routed; a longer one starts at a ghost of its source.
pub(crate) const MAX_SPAN: usize = 20;
/// Horizontal gap between weakly connected components.
const COMPONENT_GAP: f64 = 40.0;
/// The most vertices (boxes and routing vertices) laid out; above this the layout is refused
/// (the report then shows its tables without the graph), so a huge module cannot make the
/// report take minutes.
pub(crate) const MAX_VERTICES: usize = 60_000;
/// Above this many vertices the crate's `transpose` refinement (adjacent swaps to remove
/// crossings) is switched off: it is the slow part on large graphs.
const TRANSPOSE_LIMIT: usize = 8_000;

/// A laid-out graph.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Placed {
    /// The centre of every box, in input order.
    pub centres: Vec<(f64, f64)>,
    /// For every edge, in input order: the points it passes through, from the bottom of its
    /// source box to the top of its target box.
    pub routes: Vec<Vec<(f64, f64)>>,
    /// `(edge, centre)` for every edge that starts at a ghost of its source box (a box of the
    /// source's ghost size, just above the edge's target), in edge order.
    pub ghosts: Vec<(usize, (f64, f64))>,
    /// The width of the drawing.
    pub width: f64,
    /// The height of the drawing.
    pub height: f64,
}

/// Lays out boxes of `sizes` joined by `edges` (each `u → v` with `u < v < sizes.len()`);
/// `ghost_sizes[u]` is the size of a ghost of box `u` (see the module doc).
pub(crate) fn layout(
    sizes: &[(f64, f64)],
    ghost_sizes: &[(f64, f64)],
    edges: &[(usize, usize)],
) -> Result<Placed> {
    let n = sizes.len();
    if ghost_sizes.len() != n {
        return Err(Error::Invalid(format!(
            "graph layout: {} ghost sizes for {n} boxes",
            ghost_sizes.len()
        )));
    }
    if let Some(&(u, v)) = edges.iter().find(|&&(u, v)| u >= v || v >= n) {
        return Err(Error::Invalid(format!(
            "graph layout: edge {u} -> {v} is not forward between the {n} boxes"
        )));
    }
    // Ranks: longest path from the sources; then each source just above its first user.
    let mut rank = vec![0usize; n];
    let mut has_pred = vec![false; n];
    for &(_, v) in edges {
        has_pred[v] = true;
    }
    // Edges sorted by target: a target's rank is final once all its in-edges are seen, and
    // its sources come before it.
    let mut by_target: Vec<(usize, usize)> = edges.to_vec();
    by_target.sort_by_key(|&(u, v)| (v, u));
    for &(u, v) in &by_target {
        rank[v] = rank[v].max(rank[u] + 1);
    }
    let mut first_user_rank: Vec<Option<usize>> = vec![None; n];
    for &(u, v) in edges {
        if !has_pred[u] {
            let r = first_user_rank[u].map_or(rank[v], |r| r.min(rank[v]));
            first_user_rank[u] = Some(r);
        }
    }
    for (u, r) in first_user_rank.iter().enumerate() {
        if let Some(r) = r {
            rank[u] = r.saturating_sub(1);
        }
    }
    // Routing vertices: edge e crossing ranks rank[u]+1 .. rank[v]-1 gets one per rank, unless
    // it is longer than MAX_SPAN: then it starts at a ghost.
    let span = |&(u, v): &(usize, usize)| rank[v].saturating_sub(rank[u]);
    let routing: usize = edges
        .iter()
        .map(|e| match span(e) {
            s if s > MAX_SPAN => 1,
            s => s.saturating_sub(1),
        })
        .sum();
    let total = n.saturating_add(routing);
    if total > MAX_VERTICES {
        return Err(Error::Invalid(format!(
            "graph layout: {n} boxes and {routing} routing vertices exceed the {MAX_VERTICES} the report lays out"
        )));
    }
    let mut vertices: Vec<(u32, (f64, f64))> = Vec::with_capacity(total);
    for (i, &s) in sizes.iter().enumerate() {
        vertices.push((to_u32(i)?, s));
    }
    let mut pieces: Vec<(u32, u32)> = Vec::with_capacity(edges.len() + routing);
    let mut chains: Vec<Vec<usize>> = Vec::with_capacity(edges.len());
    let mut ghost_ids: Vec<(usize, usize)> = Vec::new();
    for (e, &(u, v)) in edges.iter().enumerate() {
        let span = span(&(u, v));
        if span > MAX_SPAN {
            let id = vertices.len();
            vertices.push((to_u32(id)?, ghost_sizes[u]));
            pieces.push((to_u32(id)?, to_u32(v)?));
            ghost_ids.push((e, id));
            chains.push(Vec::new());
            continue;
        }
        let mut chain = Vec::with_capacity(span.saturating_sub(1));
        let mut prev = u;
        for _ in 1..span {
            let id = vertices.len();
            vertices.push((to_u32(id)?, ROUTE_SIZE));
            pieces.push((to_u32(prev)?, to_u32(id)?));
            chain.push(id);
            prev = id;
        }
        pieces.push((to_u32(prev)?, to_u32(v)?));
        chains.push(chain);
    }
    let config = rust_sugiyama::configure::Config {
        vertex_spacing: SPACING,
        transpose: total <= TRANSPOSE_LIMIT,
        ..rust_sugiyama::configure::Config::default()
    };
    let components = std::panic::catch_unwind(|| {
        rust_sugiyama::from_vertices_and_edges(&vertices, &pieces, &config)
    })
    .map_err(|_| {
        Error::Invalid(format!(
            "graph layout: the layout crate failed on {n} boxes and {} edges",
            edges.len()
        ))
    })?;
    // Every vertex's centre; components side by side, each with its top at 0.
    let mut centre: Vec<Option<(f64, f64)>> = vec![None; vertices.len()];
    let size_of = |id: usize| vertices.get(id).map_or(ROUTE_SIZE, |v| v.1);
    let mut comps: Vec<&Vec<(usize, (f64, f64))>> = components.iter().map(|c| &c.0).collect();
    comps.sort_by_key(|c| c.iter().map(|&(id, _)| id).min().unwrap_or(usize::MAX));
    let (mut cursor, mut height) = (0.0f64, 0.0f64);
    for comp in comps {
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(id, (x, y)) in comp {
            let (w, h) = size_of(id);
            x0 = x0.min(x - w / 2.0);
            x1 = x1.max(x + w / 2.0);
            y0 = y0.min(y - h / 2.0);
            y1 = y1.max(y + h / 2.0);
        }
        if comp.is_empty() {
            continue;
        }
        for &(id, (x, y)) in comp {
            if let Some(c) = centre.get_mut(id) {
                *c = Some((x - x0 + cursor, y - y0));
            }
        }
        cursor += x1 - x0 + COMPONENT_GAP;
        height = height.max(y1 - y0);
    }
    let mut centres = Vec::with_capacity(n);
    for (i, c) in centre.iter().take(n).enumerate() {
        centres.push(
            c.ok_or_else(|| Error::Invalid(format!("graph layout: box {i} was not placed")))?,
        );
    }
    let mut ghosts = Vec::with_capacity(ghost_ids.len());
    for &(e, id) in &ghost_ids {
        let c = centre.get(id).copied().flatten().ok_or_else(|| {
            Error::Invalid(format!(
                "graph layout: the ghost of edge {e} was not placed"
            ))
        })?;
        ghosts.push((e, c));
    }
    let mut routes = Vec::with_capacity(edges.len());
    let mut next_ghost = ghosts.iter().peekable();
    for (e, (&(u, v), chain)) in edges.iter().zip(&chains).enumerate() {
        let (mut cu, mut hu) = (centres[u], sizes[u].1);
        if let Some(&(_, c)) = next_ghost.next_if(|g| g.0 == e) {
            (cu, hu) = (c, ghost_sizes[u].1);
        }
        let cv = centres[v];
        let mut route = vec![(cu.0, cu.1 + hu / 2.0)];
        for &r in chain {
            if let Some(Some(p)) = centre.get(r) {
                route.push(*p);
            }
        }
        route.push((cv.0, cv.1 - sizes[v].1 / 2.0));
        routes.push(route);
    }
    Ok(Placed {
        centres,
        routes,
        ghosts,
        width: (cursor - COMPONENT_GAP).max(0.0),
        height,
    })
}

fn to_u32(i: usize) -> Result<u32> {
    u32::try_from(i).map_err(|_| Error::Invalid(format!("graph layout: vertex {i} out of range")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code panics on failure")]
    use super::*;

    #[test]
    fn ranks_go_down_and_long_edges_are_routed() {
        let sizes = [(80.0, 20.0); 3];
        let p = layout(&sizes, &sizes, &[(0, 1), (0, 2), (1, 2)]).unwrap();
        let y: Vec<f64> = p.centres.iter().map(|c| c.1).collect();
        assert!(y[0] < y[1] && y[1] < y[2], "{y:?}");
        // 0 -> 2 crosses the rank of 1: one routing point between the endpoints.
        assert_eq!(p.routes[1].len(), 3, "{:?}", p.routes[1]);
        assert_eq!(p.routes[0].len(), 2);
        let mid = p.routes[1][1];
        assert!(
            (mid.1 - y[1]).abs() < 1e-9,
            "routing point on the rank of 1"
        );
        // Boxes of one rank do not overlap the routing vertex.
        assert!(
            (mid.0 - p.centres[1].0).abs() >= 40.0,
            "{mid:?} {:?}",
            p.centres[1]
        );
    }

    #[test]
    fn a_source_sits_above_its_first_user() {
        // 0 -> 1 -> 2 -> 3, and a source 4... must be forward, so: source 0 used only by 3.
        let sizes = [(40.0, 20.0); 4];
        let p = layout(&sizes, &sizes, &[(0, 3), (1, 2), (2, 3)]).unwrap();
        let y: Vec<f64> = p.centres.iter().map(|c| c.1).collect();
        assert!((y[0] - y[2]).abs() < 1e-9, "{y:?}");
        assert_eq!(p.routes[0].len(), 2, "no routing vertices for it");
    }

    #[test]
    fn components_are_side_by_side_and_boxes_do_not_overlap() {
        let sizes = [
            (50.0, 20.0),
            (50.0, 20.0),
            (70.0, 30.0),
            (70.0, 30.0),
            (30.0, 10.0),
        ];
        let p = layout(&sizes, &sizes, &[(0, 1), (2, 3)]).unwrap();
        for i in 0..sizes.len() {
            for j in i + 1..sizes.len() {
                let (a, b) = (p.centres[i], p.centres[j]);
                let dx = (a.0 - b.0).abs() * 2.0;
                let dy = (a.1 - b.1).abs() * 2.0;
                assert!(
                    dx >= sizes[i].0 + sizes[j].0 || dy >= sizes[i].1 + sizes[j].1,
                    "{i} and {j} overlap: {a:?} {b:?}"
                );
            }
        }
        assert!(p.width > 0.0 && p.height > 0.0);
        for (c, s) in p.centres.iter().zip(&sizes) {
            assert!(c.0 - s.0 / 2.0 >= -1e-9 && c.0 + s.0 / 2.0 <= p.width + 1e-9);
        }
    }

    #[test]
    fn a_long_edge_starts_at_a_ghost_above_its_target() {
        // 0 -> 1 -> … -> 40 (a chain), and 0 -> 40: far longer than MAX_SPAN.
        let n = 41;
        let sizes = vec![(60.0, 20.0); n];
        let ghosts = vec![(30.0, 12.0); n];
        let mut edges: Vec<(usize, usize)> = (0..n - 1).map(|i| (i, i + 1)).collect();
        edges.push((0, n - 1));
        let p = layout(&sizes, &ghosts, &edges).unwrap();
        assert_eq!(p.ghosts.len(), 1);
        let (e, (gx, gy)) = p.ghosts[0];
        assert_eq!(e, n - 1, "the long edge");
        let (tx, ty) = p.centres[n - 1];
        assert!(
            gy < ty && gy > p.centres[n - 3].1,
            "ghost {gy} just above {ty}"
        );
        // Its route: from the ghost's bottom straight to the target's top.
        assert_eq!(p.routes[e], vec![(gx, gy + 6.0), (tx, ty - 10.0)]);
        // The short edges have no ghost.
        assert!(p.routes[..n - 1].iter().all(|r| r.len() == 2));
    }

    /// Box sizes and forward edges.
    type Dag = (Vec<(f64, f64)>, Vec<(usize, usize)>);

    /// A random DAG: box sizes and forward edges.
    fn dag() -> impl proptest::strategy::Strategy<Value = Dag> {
        use proptest::prelude::*;
        (2usize..70).prop_flat_map(|n| {
            let sizes = proptest::collection::vec((20u32..200, 10u32..80), n);
            let edges = proptest::collection::vec((0..n, 0..n), 0..n * 2);
            (sizes, edges).prop_map(|(sizes, edges)| {
                let sizes = sizes
                    .into_iter()
                    .map(|(w, h)| (f64::from(w), f64::from(h)))
                    .collect();
                let mut es: Vec<(usize, usize)> = edges
                    .into_iter()
                    .filter(|(u, v)| u != v)
                    .map(|(u, v)| (u.min(v), u.max(v)))
                    .collect();
                es.sort_unstable();
                es.dedup();
                (sizes, es)
            })
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        /// Boxes do not overlap each other or the ghosts; every edge goes down from its
        /// source (or its ghost) to its target; the drawing holds every box; the same input
        /// gives the same layout.
        #[test]
        fn layouts_are_sound((sizes, edges) in dag()) {
            let ghosts: Vec<(f64, f64)> = sizes.iter().map(|&(w, _)| (w / 2.0, 12.0)).collect();
            let p = layout(&sizes, &ghosts, &edges).unwrap();
            let q = layout(&sizes, &ghosts, &edges).unwrap();
            proptest::prop_assert_eq!(&p, &q);
            let mut rects: Vec<((f64, f64), (f64, f64))> =
                p.centres.iter().copied().zip(sizes.iter().copied()).collect();
            for &(e, c) in &p.ghosts {
                rects.push((c, ghosts[edges[e].0]));
            }
            for (i, &(a, sa)) in rects.iter().enumerate() {
                proptest::prop_assert!(a.0 - sa.0 / 2.0 >= -1e-6 && a.0 + sa.0 / 2.0 <= p.width + 1e-6);
                proptest::prop_assert!(a.1 - sa.1 / 2.0 >= -1e-6 && a.1 + sa.1 / 2.0 <= p.height + 1e-6);
                for &(b, sb) in &rects[i + 1..] {
                    let apart = (a.0 - b.0).abs() * 2.0 >= sa.0 + sb.0 - 1e-6
                        || (a.1 - b.1).abs() * 2.0 >= sa.1 + sb.1 - 1e-6;
                    proptest::prop_assert!(apart, "{:?} {:?} overlap {:?} {:?}", a, sa, b, sb);
                }
            }
            for (e, (&(u, v), r)) in edges.iter().zip(&p.routes).enumerate() {
                let ghost = p.ghosts.iter().find(|g| g.0 == e);
                let start = match ghost {
                    Some(&(_, c)) => (c.0, c.1 + ghosts[u].1 / 2.0),
                    None => (p.centres[u].0, p.centres[u].1 + sizes[u].1 / 2.0),
                };
                let end = (p.centres[v].0, p.centres[v].1 - sizes[v].1 / 2.0);
                proptest::prop_assert_eq!(r.first().copied(), Some(start));
                proptest::prop_assert_eq!(r.last().copied(), Some(end));
                for w in r.windows(2) {
                    proptest::prop_assert!(w[1].1 > w[0].1, "edge {} goes up: {:?}", e, r);
                }
            }
        }
    }

    #[test]
    fn backward_edges_are_an_error() {
        let e = layout(&[(1.0, 1.0); 2], &[(1.0, 1.0); 2], &[(1, 0)]).unwrap_err();
        assert!(e.to_string().contains("1 -> 0"), "{e}");
    }

    #[test]
    fn empty_and_isolated() {
        let p = layout(&[], &[], &[]).unwrap();
        assert!(p.centres.is_empty());
        let p = layout(&[(10.0, 10.0)], &[(5.0, 5.0)], &[]).unwrap();
        assert_eq!(p.centres.len(), 1);
    }
}
