//! The partition report as one self-contained HTML page (`fusebox partition --emit html`).
//!
//! Contract: [`to_html`] turns a partitioned module and its [`Report`] into one HTML file that
//! needs nothing else: inline CSS, inline SVG, inline script, no external URL. It shows
//!
//! - `main`'s graph laid out top to bottom (`report`'s layout module, the `rust-sugiyama` crate):
//!   one box per parameter and per binding of `main` (the bindings inside an `if`'s branches
//!   included), edges from each value to its users, and a `return` box; a value read far
//!   below its definition is shown there by a dashed *ghost* box (`↑ name`, a click goes to
//!   the definition) instead of an edge down the whole page. A call of a fused
//!   function is a box coloured by the backend that claimed it (by codegen or pattern prefix
//!   when no backend flow ran; a light shade for FuseOps' groups), listing its ops; the SVG pans (drag) and zooms (wheel, buttons);
//! - a legend of the colours with the number of functions of each;
//! - a table of every function of the report (name, backend, pattern, ops, params);
//! - a panel that shows, on a click on a box or a row, the function's ops, params, pattern,
//!   the backend that claimed it and the reasons the others declined (a hover shows the same
//!   as the box's tooltip);
//! - the rejected pattern matches and the report's notes.
//!
//! `report.html#function=<name>` opens the page with that function selected (a link to it);
//! `report.html#var=<name>` with the box of that binding of `main` selected.
//!
//! Every function appears as an element with `data-function="<name>"` (its table row, and
//! every box that calls it). The report itself is embedded as JSON in
//! `<script type="application/json" id="fusebox-report">`, the source the panel reads. The
//! output is deterministic: the same module and report give the same bytes.
//!
//! ```text
//! before: main: lv = cls.fused_conv2d_add_relu(x, w, b); return lv
//!         report: fused_conv2d_add_relu, FuseOps out_elemwise_fusable, backend cpu
//! after:  <svg id="graph" …><g class="node call" data-var="lv" data-function="fused_conv2d_add_relu">
//!           <title>…</title><rect … fill="#b2e0d2"/><text>…lv = fused_conv2d_add_relu…</text></g>…</svg>
//!         <tr data-function="fused_conv2d_add_relu"><td class="name">…</td><td>cpu</td>…</tr>
//! ```

use super::layout::{Placed, layout};
use super::{FunctionReport, Report};
use crate::ir::{Callee, ExprKind, Function, Module, VarId};
use crate::{Error, Result};
use std::collections::HashMap;
use std::fmt::Write as _;

/// Fill colours of the backends, in order of first appearance (ColorBrewer Set2, then four of
/// Set3): mid-tone, so the light shade of FuseOps' groups still shows.
const PALETTE: [&str; 12] = [
    "#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#ffd92f", "#e5c494", "#b3b3b3",
    "#8dd3c7", "#bebada", "#fb8072", "#80b1d3",
];
/// Width of one character of the boxes' monospace labels, in SVG units.
const CHAR_W: f64 = 6.8;
/// Height of one label line.
const LINE_H: f64 = 14.0;
/// Padding inside a box.
const PAD: f64 = 6.0;
/// The most characters of a label line (longer ones end in `…`; the tooltip has them whole).
const MAX_CHARS: usize = 40;
/// The most ops listed inside a call's box.
const MAX_OPS_SHOWN: usize = 5;
/// The most rejected matches listed (the JSON report has them all).
const MAX_REJECTIONS_SHOWN: usize = 2_000;

/// What a box of the graph stands for.
enum Kind {
    Param,
    Call,
    Op,
    Value,
    Return,
}

impl Kind {
    fn class(&self) -> &'static str {
        match self {
            Kind::Param => "param",
            Kind::Call => "call",
            Kind::Op => "op",
            Kind::Value => "value",
            Kind::Return => "ret",
        }
    }
}

/// One box of the graph.
struct Node {
    kind: Kind,
    /// The var it binds (empty for `return`).
    var: String,
    /// The lines drawn inside.
    lines: Vec<String>,
    /// The tooltip.
    tooltip: String,
    /// The function it calls, if it calls one of the report's.
    function: Option<String>,
    size: (f64, f64),
}

/// The colours: one hue per backend (in order of first appearance), a full shade for the
/// functions a pattern made and a light one for FuseOps' groups.
struct Legend {
    /// Function name → index into `keys`.
    of: HashMap<String, usize>,
    /// `(key, colour, number of functions)`, in order of first appearance.
    keys: Vec<(String, String, usize)>,
}

impl Legend {
    fn new(report: &Report) -> Legend {
        let mut of = HashMap::new();
        let mut hues: Vec<String> = Vec::new();
        let mut keys: Vec<(String, String, usize)> = Vec::new();
        for f in &report.functions {
            let (hue_key, kind) = colour_key(f);
            let hue = match hues.iter().position(|h| *h == hue_key) {
                Some(i) => i,
                None => {
                    hues.push(hue_key.clone());
                    hues.len() - 1
                }
            };
            let key = format!("{hue_key} · {kind}");
            let i = match keys.iter().position(|(k, _, _)| *k == key) {
                Some(i) => i,
                None => {
                    let base = PALETTE[hue % PALETTE.len()];
                    let colour = if kind == FUSE_OPS_KIND {
                        lighten(base)
                    } else {
                        base.to_string()
                    };
                    keys.push((key, colour, 0));
                    keys.len() - 1
                }
            };
            keys[i].2 += 1;
            of.insert(f.name.clone(), i);
        }
        Legend { of, keys }
    }

    fn colour(&self, function: &str) -> Option<&str> {
        self.of
            .get(function)
            .and_then(|&i| self.keys.get(i))
            .map(|k| k.1.as_str())
    }
}

/// The kind of a function FuseOps made (a light shade of its backend's colour).
const FUSE_OPS_KIND: &str = "FuseOps group";

/// `#rrggbb` mixed half-way with white.
fn lighten(hex: &str) -> String {
    let channel = |i: usize| {
        hex.get(i..i + 2)
            .and_then(|c| u8::from_str_radix(c, 16).ok())
            .map_or(255, |c| (u16::from(c) + 255) / 2)
    };
    format!("#{:02x}{:02x}{:02x}", channel(1), channel(3), channel(5))
}

/// What a function is coloured by: its backend (else, when no backend flow ran, its codegen
/// or the prefix of its pattern), and whether a pattern or FuseOps made it.
fn colour_key(f: &FunctionReport) -> (String, &'static str) {
    let composite = f.composite.as_ref().or(f.inner_composites.first());
    let kind = if composite.is_some() {
        "pattern"
    } else if f.fusion_kind.is_some() {
        FUSE_OPS_KIND
    } else {
        "function"
    };
    if let Some(b) = &f.backend {
        return (format!("backend {b}"), kind);
    }
    if let Some(c) = &f.codegen {
        return (format!("codegen {c} (no backend flow)"), kind);
    }
    if let Some(c) = composite {
        let prefix = c.split('.').next().unwrap_or(c);
        return (format!("pattern {prefix}.* (no backend flow)"), kind);
    }
    ("no backend flow".into(), kind)
}

/// The pattern column: the composite, the composites inside, or FuseOps' fusion kind.
fn pattern_short(f: &FunctionReport) -> String {
    match (&f.composite, &f.fusion_kind) {
        (None, Some(k)) if f.inner_composites.is_empty() => format!("FuseOps {k}"),
        _ => pattern_of(f),
    }
}

/// The pattern: the composite, the composites inside, or FuseOps' fusion kind and anchor.
fn pattern_of(f: &FunctionReport) -> String {
    if let Some(c) = &f.composite {
        return c.clone();
    }
    if !f.inner_composites.is_empty() {
        return f.inner_composites.join(" + ");
    }
    match (&f.fusion_kind, &f.anchor) {
        (Some(k), Some(a)) => format!("FuseOps {k} (anchor {a})"),
        (Some(k), None) => format!("FuseOps {k}"),
        _ => "—".into(),
    }
}

/// `s` cut to `max` characters, ending in `…` when cut.
fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Text for HTML content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The tooltip of a function: what the panel shows, as text.
fn function_tooltip(f: &FunctionReport, report: &Report) -> String {
    let mut t = format!("{}\n", f.name);
    let claim = report.claims.iter().find(|c| c.function == f.name);
    match (&f.backend, claim) {
        (Some(b), Some(c)) if c.fallback => {
            let _ = writeln!(t, "backend: {b} (fallback)");
        }
        (Some(b), _) => {
            let _ = writeln!(t, "backend: {b}");
        }
        (None, _) => t.push_str("backend: none (no backend flow ran)\n"),
    }
    let _ = writeln!(t, "pattern: {}", pattern_of(f));
    let _ = writeln!(
        t,
        "params: {}, outputs: {}, constants: {}, calls: {}",
        f.params, f.outputs, f.bound_constants, f.calls
    );
    let _ = writeln!(t, "ops ({}): {}", f.ops.len(), f.ops.join(", "));
    if let Some(c) = claim {
        for (b, r) in &c.declines {
            let _ = writeln!(t, "declined by {b}: {r}");
        }
        for (b, r) in &c.compile_failures {
            let _ = writeln!(t, "compile failed in {b}: {r}");
        }
    }
    t.trim_end().to_string()
}

/// The boxes and edges of `main` (the bindings inside `if` branches included).
fn main_graph(main: &Function, report: &Report) -> (Vec<Node>, Vec<(usize, usize)>) {
    let functions: HashMap<&str, &FunctionReport> = report
        .functions
        .iter()
        .map(|f| (f.name.as_str(), f))
        .collect();
    let mut nodes = Vec::new();
    let mut index: HashMap<VarId, usize> = HashMap::new();
    for &p in &main.params {
        let vd = main.var(p);
        let ty = crate::text::type_text(&vd.ty);
        index.insert(p, nodes.len());
        nodes.push(Node {
            kind: Kind::Param,
            var: vd.name.clone(),
            lines: vec![clip(&vd.name, MAX_CHARS)],
            tooltip: format!("parameter {}: {ty}", vd.name),
            function: None,
            size: (0.0, 0.0),
        });
    }
    let mut edges = Vec::new();
    let mut seen = rustc_hash::FxHashSet::default();
    let mut add_edges = |edges: &mut Vec<(usize, usize)>, to: usize, from: &[usize]| {
        for &u in from {
            if u < to && seen.insert((u, to)) {
                edges.push((u, to));
            }
        }
    };
    let mut bindings = Vec::new();
    crate::ir::for_each_binding_deep(main, &main.blocks, &mut |b| bindings.push(*b));
    for b in &bindings {
        let vd = main.var(b.var);
        let ty = crate::text::type_text(&vd.ty);
        let origin = match vd.origin.names() {
            [] => String::new(),
            names => format!(
                "\nfrom: {}",
                names.iter().map(|n| &**n).collect::<Vec<_>>().join(", ")
            ),
        };
        let expr = &main.expr(b.value).kind;
        let node = match expr {
            ExprKind::Call {
                callee: Callee::Global(g),
                ..
            } => {
                let g = g.to_string();
                match functions.get(g.as_str()) {
                    Some(f) => {
                        let mut lines = vec![clip(&format!("{} = {g}", vd.name), MAX_CHARS)];
                        for op in f.ops.iter().take(MAX_OPS_SHOWN) {
                            lines.push(clip(&format!("  {op}"), MAX_CHARS));
                        }
                        if f.ops.len() > MAX_OPS_SHOWN {
                            lines.push(format!("  … {} more", f.ops.len() - MAX_OPS_SHOWN));
                        }
                        Node {
                            kind: Kind::Call,
                            var: vd.name.clone(),
                            lines,
                            tooltip: format!(
                                "{} = {}\n{}{origin}",
                                vd.name,
                                function_tooltip(f, report),
                                ty
                            ),
                            function: Some(g),
                            size: (0.0, 0.0),
                        }
                    }
                    None => Node {
                        kind: Kind::Op,
                        var: vd.name.clone(),
                        lines: vec![clip(&format!("{} = {g}", vd.name), MAX_CHARS)],
                        tooltip: format!("{} = call {g}\n{ty}{origin}", vd.name),
                        function: None,
                        size: (0.0, 0.0),
                    },
                }
            }
            ExprKind::Call {
                callee: Callee::Op(op),
                ..
            } => Node {
                kind: Kind::Op,
                var: vd.name.clone(),
                lines: vec![clip(&format!("{} = {}", vd.name, op.name()), MAX_CHARS)],
                tooltip: format!(
                    "{} = {} (not fused: runs as a single op)\n{ty}{origin}",
                    vd.name,
                    op.name()
                ),
                function: None,
                size: (0.0, 0.0),
            },
            other => {
                let what = match other {
                    ExprKind::TupleGetItem(_, i) => format!("[{i}]"),
                    ExprKind::Tuple(_) => "tuple".into(),
                    ExprKind::If(_) => "if".into(),
                    ExprKind::Call {
                        callee: Callee::Local(_),
                        ..
                    } => "local call".into(),
                    ExprKind::Const(_) | ExprKind::ConstRef(_) => "constant".into(),
                    _ => "value".into(),
                };
                Node {
                    kind: Kind::Value,
                    var: vd.name.clone(),
                    lines: vec![clip(&format!("{} = {what}", vd.name), MAX_CHARS)],
                    tooltip: format!("{} = {what}\n{ty}{origin}", vd.name),
                    function: None,
                    size: (0.0, 0.0),
                }
            }
        };
        let to = nodes.len();
        let mut from = Vec::new();
        let mut used = |v: VarId| {
            if let Some(&u) = index.get(&v) {
                from.push(u);
            }
        };
        match expr {
            // An `if` reads its condition and yields its branches' results.
            ExprKind::If(i) => {
                crate::ir::for_each_use(main, i.cond, &mut used);
                for s in i.branches() {
                    crate::ir::for_each_use(main, s.body, &mut used);
                }
            }
            _ => crate::ir::for_each_use(main, b.value, &mut used),
        }
        add_edges(&mut edges, to, &from);
        index.insert(b.var, to);
        nodes.push(node);
    }
    if let Some(ret) = main.ret {
        let to = nodes.len();
        let mut from = Vec::new();
        crate::ir::for_each_use(main, ret, &mut |v| {
            if let Some(&u) = index.get(&v) {
                from.push(u);
            }
        });
        add_edges(&mut edges, to, &from);
        nodes.push(Node {
            kind: Kind::Return,
            var: String::new(),
            lines: vec!["return".into()],
            tooltip: format!("main returns {}", crate::text::type_text(&main.ret_ty)),
            function: None,
            size: (0.0, 0.0),
        });
    }
    for n in &mut nodes {
        let chars = n.lines.iter().map(|l| l.chars().count()).max().unwrap_or(0);
        let min_w = if matches!(n.kind, Kind::Call) {
            140.0
        } else {
            60.0
        };
        let w = (chars as f64 * CHAR_W + 2.0 * PAD).max(min_w);
        let h = n.lines.len() as f64 * LINE_H + 2.0 * PAD;
        n.size = (w.round(), h.round());
    }
    (nodes, edges)
}

/// The label of a ghost of `n` (see [`super::layout`]): where the value comes from.
fn ghost_label(n: &Node) -> String {
    let name = match (&n.function, n.var.is_empty()) {
        (_, true) => "return".to_string(),
        (Some(f), false) => format!("{} = {f}", n.var),
        (None, false) => n.var.clone(),
    };
    clip(&format!("↑ {name}"), MAX_CHARS)
}

fn ghost_size(n: &Node) -> (f64, f64) {
    let chars = ghost_label(n).chars().count() as f64;
    (
        (chars * CHAR_W + 2.0 * PAD).round(),
        (LINE_H + 2.0 * PAD).round(),
    )
}

/// A route through `points` as an SVG path: vertical-tangent cubic curves between points.
fn route_path(points: &[(f64, f64)]) -> String {
    let mut d = String::new();
    let Some(&(x0, y0)) = points.first() else {
        return d;
    };
    let _ = write!(d, "M{x0:.1},{y0:.1}");
    for w in points.windows(2) {
        let ((xa, ya), (xb, yb)) = (w[0], w[1]);
        let ym = (ya + yb) / 2.0;
        let _ = write!(d, "C{xa:.1},{ym:.1} {xb:.1},{ym:.1} {xb:.1},{yb:.1}");
    }
    d
}

/// The SVG of the graph (or a paragraph saying why there is none).
fn render_graph(
    out: &mut String,
    nodes: &[Node],
    edges: &[(usize, usize)],
    placed: &Placed,
    legend: &Legend,
) {
    let margin = 20.0;
    let (w, h) = (placed.width + 2.0 * margin, placed.height + 2.0 * margin);
    let _ = write!(
        out,
        "<svg id=\"graph\" data-width=\"{w:.1}\" data-height=\"{h:.1}\">\n\
         <defs><marker id=\"arrow\" viewBox=\"0 0 8 8\" refX=\"8\" refY=\"4\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\"><path d=\"M0,0L8,4L0,8z\" fill=\"#888\"/></marker></defs>\n\
         <g id=\"viewport\"><g transform=\"translate({margin:.1},{margin:.1})\">\n<g class=\"edges\">\n"
    );
    for r in &placed.routes {
        let _ = writeln!(out, "<path class=\"edge\" d=\"{}\"/>", route_path(r));
    }
    out.push_str("</g>\n<g class=\"nodes\">\n");
    for (n, &(cx, cy)) in nodes.iter().zip(&placed.centres) {
        let (bw, bh) = n.size;
        let (x, y) = (cx - bw / 2.0, cy - bh / 2.0);
        let mut attrs = format!("class=\"node {}\"", n.kind.class());
        if !n.var.is_empty() {
            let _ = write!(attrs, " data-var=\"{}\"", esc(&n.var));
        }
        if let Some(f) = &n.function {
            let _ = write!(attrs, " data-function=\"{}\"", esc(f));
        }
        let _ = writeln!(out, "<g {attrs}><title>{}</title>", esc(&n.tooltip));
        let fill = n
            .function
            .as_deref()
            .and_then(|f| legend.colour(f))
            .unwrap_or(match n.kind {
                Kind::Param => "#eeeeee",
                Kind::Return => "#dddddd",
                _ => "#ffffff",
            });
        match n.kind {
            Kind::Param | Kind::Return => {
                let _ = writeln!(
                    out,
                    "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" rx=\"{:.1}\" fill=\"{fill}\"/>",
                    bh / 2.0
                );
            }
            _ => {
                let _ = writeln!(
                    out,
                    "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" rx=\"4\" fill=\"{fill}\"/>"
                );
            }
        }
        let tx = x + PAD;
        let _ = write!(out, "<text x=\"{tx:.1}\" y=\"{:.1}\">", y + PAD + 11.0);
        for (i, l) in n.lines.iter().enumerate() {
            let class = if i == 0 { "" } else { " class=\"opline\"" };
            let dy = if i == 0 { 0.0 } else { LINE_H };
            let _ = write!(
                out,
                "<tspan x=\"{tx:.1}\" dy=\"{dy:.1}\"{class}>{}</tspan>",
                esc(l)
            );
        }
        out.push_str("</text></g>\n");
    }
    for &(e, (cx, cy)) in &placed.ghosts {
        let Some(n) = edges.get(e).and_then(|&(u, _)| nodes.get(u)) else {
            continue;
        };
        let (bw, bh) = ghost_size(n);
        let (x, y) = (cx - bw / 2.0, cy - bh / 2.0);
        let _ = writeln!(
            out,
            "<g class=\"node ghost\" data-ghost-of=\"{}\"><title>{} (defined further up: click to go there)</title>\n\
             <rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" rx=\"4\" fill=\"#ffffff\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\"><tspan>{}</tspan></text></g>",
            esc(&n.var),
            esc(&n.tooltip),
            x + PAD,
            y + PAD + 11.0,
            esc(&ghost_label(n)),
        );
    }
    out.push_str("</g></g></g></svg>\n");
}

/// The legend, the details panel and the functions' table.
fn render_side(out: &mut String, report: &Report, legend: &Legend) {
    out.push_str("<div id=\"side-top\">\n<section id=\"legend\"><h2>Legend</h2><ul>\n");
    for (key, colour, count) in &legend.keys {
        let _ = writeln!(
            out,
            "<li><span class=\"swatch\" style=\"background:{colour}\"></span>{} <span class=\"count\">({count})</span></li>",
            esc(key)
        );
    }
    out.push_str(
        "<li><span class=\"swatch\" style=\"background:#ffffff\"></span>op left in main (not fused)</li>\n\
         <li><span class=\"swatch round\" style=\"background:#eeeeee\"></span>parameter of main</li>\n</ul></section>\n",
    );
    out.push_str(
        "<section id=\"details\"><h2>Details</h2><div id=\"panel\"><p class=\"hint\">Click a box or a row to see a function's ops, params, pattern, the backend that claimed it and why the others declined.</p></div></section>\n</div>\n<div id=\"side-bottom\">\n",
    );
    let _ = write!(
        out,
        "<section id=\"functions\"><h2>Functions ({})</h2>\n<input id=\"filter\" type=\"search\" placeholder=\"filter by name, backend or pattern\">\n\
         <table id=\"table\"><thead><tr><th>function</th><th>backend</th><th>pattern</th><th>ops</th><th>params</th></tr></thead><tbody>\n",
        report.functions.len()
    );
    for f in &report.functions {
        let colour = legend.colour(&f.name).unwrap_or("#ffffff");
        let fallback = report
            .claims
            .iter()
            .any(|c| c.function == f.name && c.fallback);
        let backend = match &f.backend {
            Some(b) if fallback => format!("{b} (fallback)"),
            Some(b) => b.clone(),
            None => "—".into(),
        };
        let _ = writeln!(
            out,
            "<tr data-function=\"{n}\"><td class=\"name\"><span class=\"swatch\" style=\"background:{colour}\"></span>{n}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&backend),
            esc(&pattern_short(f)),
            f.ops.len(),
            f.params,
            n = esc(&f.name),
        );
    }
    out.push_str("</tbody></table></section>\n");
    if !report.rejections.is_empty() {
        let _ = writeln!(
            out,
            "<section id=\"rejections\"><details><summary>Rejected pattern matches ({})</summary><table><thead><tr><th>pattern</th><th>at</th><th>reason</th></tr></thead><tbody>",
            report.rejections.len()
        );
        for r in report.rejections.iter().take(MAX_REJECTIONS_SHOWN) {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&r.pattern),
                esc(&r.at),
                esc(&r.reason)
            );
        }
        out.push_str("</tbody></table>");
        if report.rejections.len() > MAX_REJECTIONS_SHOWN {
            let _ = write!(
                out,
                "<p>… and {} more (all of them are in <code>--emit json</code>).</p>",
                report.rejections.len() - MAX_REJECTIONS_SHOWN
            );
        }
        out.push_str("</details></section>\n");
    }
    if !report.notes.is_empty() {
        out.push_str("<section id=\"notes\"><h2>Notes</h2><ul>\n");
        for n in &report.notes {
            let _ = writeln!(out, "<li>{}</li>", esc(n));
        }
        out.push_str("</ul></section>\n");
    }
    out.push_str("</div>\n");
}

/// The report as JSON that is safe inside a `<script>` element.
fn embedded_json(report: &Report) -> Result<String> {
    let json = serde_json::to_string(report)
        .map_err(|e| Error::Invalid(format!("the report does not serialise: {e}")))?;
    // `<`, `>` and `&` only occur inside JSON strings, where their escapes mean the same.
    Ok(json
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026"))
}

/// The report as one self-contained HTML page; `title` names the model (e.g. its file).
pub fn to_html(m: &Module, report: &Report, title: &str) -> Result<String> {
    let legend = Legend::new(report);
    let mut graph = String::new();
    let (mut boxes, mut edge_count) = (0, 0);
    match m.get("main") {
        Some(main) => {
            let (nodes, edges) = main_graph(main, report);
            boxes = nodes.len();
            edge_count = edges.len();
            let sizes: Vec<(f64, f64)> = nodes.iter().map(|n| n.size).collect();
            let ghost_sizes: Vec<(f64, f64)> = nodes.iter().map(ghost_size).collect();
            match layout(&sizes, &ghost_sizes, &edges) {
                Ok(placed) => render_graph(&mut graph, &nodes, &edges, &placed, &legend),
                Err(e) => {
                    let _ = write!(
                        graph,
                        "<p id=\"no-graph\">The graph is not drawn: {}. The tables list every function.</p>",
                        esc(&e.to_string())
                    );
                }
            }
        }
        None => graph.push_str("<p id=\"no-graph\">The module has no <code>main</code>.</p>"),
    }
    let mut backends: Vec<(String, usize)> = Vec::new();
    for f in &report.functions {
        let b = f.backend.clone().unwrap_or_else(|| "no backend".into());
        match backends.iter_mut().find(|(k, _)| *k == b) {
            Some(e) => e.1 += 1,
            None => backends.push((b, 1)),
        }
    }
    let summary = if backends.is_empty() {
        String::new()
    } else {
        let parts: Vec<String> = backends.iter().map(|(b, n)| format!("{b}: {n}")).collect();
        format!(" ({})", parts.join(", "))
    };
    let mut out = String::with_capacity(graph.len() + 64 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>fusebox partition report: {t}</title>\n\
         <script>window.onerror = function (msg, src, line) {{ document.documentElement.setAttribute('data-js-' + 'error', String(msg) + ' at line ' + line); }};</script>\n\
         <style>{CSS}</style>\n</head>\n<body>\n\
         <header><h1>fusebox partition report: <span id=\"model\">{t}</span></h1>\
         <p id=\"summary\">{nf} function(s){s}; main: {nb} binding(s), {boxes} box(es) and {edge_count} edge(s) drawn</p></header>\n\
         <main>\n<div id=\"graph-pane\"><div id=\"controls\"><button id=\"zoom-in\" title=\"zoom in\">+</button><button id=\"zoom-out\" title=\"zoom out\">−</button><button id=\"fit\" title=\"show the whole graph\">fit</button><button id=\"top\" title=\"fit the width, from the top\">top</button><span class=\"hint\">drag to pan, wheel to zoom</span></div>\n",
        t = esc(title),
        nf = report.functions.len(),
        s = esc(&summary),
        nb = report.main.len(),
    );
    out.push_str(&graph);
    out.push_str("</div>\n<aside id=\"side\">\n");
    render_side(&mut out, report, &legend);
    out.push_str("</aside>\n</main>\n");
    let _ = write!(
        out,
        "<script type=\"application/json\" id=\"fusebox-report\">{}</script>\n<script>{JS}</script>\n</body>\n</html>\n",
        embedded_json(report)?
    );
    Ok(out)
}

const CSS: &str = r#"
html, body { margin: 0; height: 100%; font: 13px/1.35 "DejaVu Sans", "Liberation Sans", Arial, sans-serif; color: #222; }
body { display: flex; flex-direction: column; }
header { padding: 6px 12px; border-bottom: 1px solid #ccc; background: #f4f4f4; }
header h1 { font-size: 16px; margin: 0; }
header p { margin: 2px 0 0; color: #555; }
main { flex: 1; display: flex; min-height: 0; }
#graph-pane { flex: 1; position: relative; min-width: 0; background: #fbfbfb; }
#graph { width: 100%; height: 100%; display: block; cursor: grab; user-select: none; }
#graph.dragging { cursor: grabbing; }
#no-graph { padding: 40px 16px; }
#controls { position: absolute; top: 8px; left: 8px; z-index: 2; display: flex; gap: 4px; align-items: center; }
#controls button { min-width: 30px; height: 26px; border: 1px solid #aaa; background: #fff; border-radius: 4px; cursor: pointer; }
.hint { color: #777; font-size: 12px; margin-left: 6px; }
.edge { fill: none; stroke: #999; stroke-width: 1.2; marker-end: url(#arrow); }
.node rect { stroke: #666; stroke-width: 1; }
.node text { font: 11px "DejaVu Sans Mono", "Liberation Mono", monospace; fill: #111; pointer-events: none; }
.node .opline { fill: #444; }
.node.call { cursor: pointer; }
.node.call rect { stroke: #444; stroke-width: 1.5; }
.node:hover rect { stroke: #000; stroke-width: 2; }
.node.selected rect { stroke: #d00; stroke-width: 3; }
.node.ghost { cursor: pointer; }
.node.ghost rect { stroke: #888; stroke-dasharray: 4 3; }
.node.ghost text { fill: #555; }
#side { width: 600px; max-width: 45%; display: flex; flex-direction: column; border-left: 1px solid #ccc; box-sizing: border-box; }
#side-top { flex: 0 0 auto; max-height: 58%; overflow: auto; padding: 0 10px 6px; border-bottom: 1px solid #ddd; }
#side-bottom { flex: 1; min-height: 0; overflow: auto; padding: 0 10px 10px; }
#side h2 { font-size: 14px; margin: 10px 0 4px; }
#legend ul { list-style: none; padding: 0; margin: 0; }
#legend li { margin: 1px 0; }
.swatch { display: inline-block; width: 12px; height: 12px; border: 1px solid #666; margin-right: 5px; vertical-align: -2px; }
.swatch.round { border-radius: 6px; }
.count { color: #666; }
#panel { border: 1px solid #ddd; background: #fffef6; padding: 6px 8px; min-height: 60px; }
#panel h4 { margin: 6px 0 2px; font-size: 12px; }
#panel ul { margin: 0; padding-left: 18px; }
#panel h3 { margin: 0 0 4px; font-size: 13px; font-family: monospace; word-break: break-all; }
#panel dl { display: grid; grid-template-columns: max-content 1fr; gap: 1px 8px; margin: 0; }
#panel dt { color: #555; }
#panel dd { margin: 0; word-break: break-word; }
#panel ol { margin: 0; padding-left: 22px; font-family: monospace; font-size: 12px; }
#panel pre { margin: 0; white-space: pre-wrap; font-size: 12px; }
#filter { width: 100%; box-sizing: border-box; margin-bottom: 4px; padding: 3px; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 2px 4px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; position: sticky; top: 0; }
td.name { font-family: monospace; font-size: 12px; word-break: break-all; width: 44%; }
td.num { text-align: right; }
#table tbody tr { cursor: pointer; }
#table tbody tr:hover { background: #f3f7ff; }
#table tbody tr.selected { background: #ffe08a; }
#rejections td { font-size: 12px; }
"#;

const JS: &str = r#"
(function () {
  'use strict';
  var report = JSON.parse(document.getElementById('fusebox-report').textContent);
  var fns = {}, claims = {};
  report.functions.forEach(function (f) { fns[f.name] = f; });
  (report.claims || []).forEach(function (c) { claims[c.function] = c; });
  var byName = {};
  Array.prototype.forEach.call(document.querySelectorAll('[data-function]'), function (el) {
    var n = el.getAttribute('data-function');
    (byName[n] = byName[n] || []).push(el);
  });
  var byVar = {};
  Array.prototype.forEach.call(document.querySelectorAll('g.node[data-var]'), function (el) {
    byVar[el.getAttribute('data-var')] = el;
  });
  var panel = document.getElementById('panel');
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) { e.textContent = text; }
    if (cls) { e.className = cls; }
    return e;
  }
  function row(dl, k, v) { dl.appendChild(el('dt', k)); dl.appendChild(el('dd', v)); }
  function pattern(f) {
    if (f.composite) { return f.composite; }
    if (f.inner_composites.length) { return f.inner_composites.join(' + '); }
    if (f.fusion_kind) { return 'FuseOps ' + f.fusion_kind + (f.anchor ? ' (anchor ' + f.anchor + ')' : ''); }
    return '—';
  }
  function showFunction(name) {
    var f = fns[name];
    panel.textContent = '';
    if (!f) { panel.appendChild(el('p', name + ': not in the report')); return; }
    var c = claims[name];
    panel.appendChild(el('h3', f.name));
    var dl = el('dl');
    row(dl, 'backend', f.backend ? f.backend + (c && c.fallback ? ' (fallback: no backend compiled it)' : '') : 'none (no backend flow ran: use --config)');
    row(dl, 'pattern', pattern(f));
    if (f.codegen) { row(dl, 'codegen', f.codegen); }
    row(dl, 'params', String(f.params));
    row(dl, 'outputs', String(f.outputs));
    row(dl, 'constants', String(f.bound_constants));
    row(dl, 'call sites', String(f.calls));
    var vars = (byName[name] || []).map(function (e) { return e.getAttribute('data-var'); }).filter(Boolean);
    if (vars.length) { row(dl, 'bound in main to', vars.join(', ')); }
    panel.appendChild(dl);
    if (c) {
      panel.appendChild(el('h4', 'other backends'));
      var ul = el('ul');
      c.declines.forEach(function (d) { ul.appendChild(el('li', d[0] + ' declined: ' + d[1])); });
      c.compile_failures.forEach(function (d) { ul.appendChild(el('li', d[0] + ' claimed it but could not compile it: ' + d[1])); });
      if (!ul.childNodes.length) { ul.appendChild(el('li', 'none declined: the first backend in config order claimed it')); }
      panel.appendChild(ul);
    }
    panel.appendChild(el('h4', 'ops (' + f.ops.length + ')'));
    var ol = el('ol');
    f.ops.forEach(function (o) { ol.appendChild(el('li', o)); });
    panel.appendChild(ol);
  }
  function showNode(node) {
    panel.textContent = '';
    var t = node.querySelector('title');
    panel.appendChild(el('pre', t ? t.textContent : ''));
  }
  var selected = [];
  function clearSelection() {
    selected.forEach(function (e) { e.classList.remove('selected'); });
    selected = [];
  }
  function select(name, centre) {
    clearSelection();
    (byName[name] || []).forEach(function (e) { e.classList.add('selected'); selected.push(e); });
    showFunction(name);
    var els = byName[name] || [];
    for (var i = 0; i < els.length; i++) {
      if (centre && els[i].tagName.toLowerCase() === 'g') { centreOn(els[i]); break; }
    }
    for (var j = 0; j < els.length; j++) {
      if (els[j].tagName.toLowerCase() === 'tr') { els[j].scrollIntoView({block: 'nearest'}); break; }
    }
  }
  // Pan and zoom.
  var svg = document.getElementById('graph');
  var view = document.getElementById('viewport');
  var W = svg ? +svg.getAttribute('data-width') : 0, H = svg ? +svg.getAttribute('data-height') : 0;
  var tx = 0, ty = 0, k = 1;
  function apply() { if (view) { view.setAttribute('transform', 'translate(' + tx.toFixed(1) + ',' + ty.toFixed(1) + ') scale(' + k.toFixed(4) + ')'); } }
  function box() { return svg.getBoundingClientRect(); }
  function fit(all) {
    if (!svg || !W || !H) { return; }
    var r = box();
    k = all ? Math.min(r.width / W, r.height / H) : Math.min(1, r.width / W);
    k = Math.max(k * 0.97, 0.005);
    tx = (r.width - W * k) / 2;
    ty = all ? (r.height - H * k) / 2 : 36;
    apply();
  }
  function zoomAt(f, mx, my) {
    var nk = Math.min(8, Math.max(0.005, k * f));
    tx = mx - (mx - tx) * nk / k; ty = my - (my - ty) * nk / k; k = nk; apply();
  }
  function centreOn(g) {
    var b = g.getBBox(), r = box();
    k = Math.max(k, 0.8);
    tx = r.width / 2 - (b.x + 20 + b.width / 2) * k;
    ty = r.height / 2 - (b.y + 20 + b.height / 2) * k;
    apply();
  }
  if (svg) {
    svg.addEventListener('wheel', function (e) {
      e.preventDefault();
      var r = box();
      zoomAt(Math.exp(-e.deltaY * 0.0015), e.clientX - r.left, e.clientY - r.top);
    }, {passive: false});
    var drag = null, moved = false;
    svg.addEventListener('pointerdown', function (e) { drag = {x: e.clientX, y: e.clientY, tx: tx, ty: ty}; moved = false; });
    window.addEventListener('pointermove', function (e) {
      if (!drag) { return; }
      var dx = e.clientX - drag.x, dy = e.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 3) { moved = true; svg.classList.add('dragging'); }
      tx = drag.tx + dx; ty = drag.ty + dy; apply();
    });
    window.addEventListener('pointerup', function () { drag = null; svg.classList.remove('dragging'); });
    svg.addEventListener('click', function (e) {
      if (moved) { return; }
      var g = e.target.closest ? e.target.closest('g.node') : null;
      if (!g) { return; }
      var of = g.getAttribute('data-ghost-of');
      if (of !== null && byVar[of]) { g = byVar[of]; centreOn(g); }
      var name = g.getAttribute('data-function');
      if (name) { select(name, false); } else { clearSelection(); g.classList.add('selected'); selected.push(g); showNode(g); }
    });
    var r0 = function () { var r = box(); return [r.width / 2, r.height / 2]; };
    document.getElementById('zoom-in').addEventListener('click', function () { var c = r0(); zoomAt(1.25, c[0], c[1]); });
    document.getElementById('zoom-out').addEventListener('click', function () { var c = r0(); zoomAt(0.8, c[0], c[1]); });
    document.getElementById('fit').addEventListener('click', function () { fit(true); });
    document.getElementById('top').addEventListener('click', function () { fit(false); });
    fit(false);
  }
  // `report.html#function=<name>` opens with that function selected.
  var m = /^#function=(.+)$/.exec(window.location.hash);
  if (m) { select(decodeURIComponent(m[1]), true); }
  // `report.html#var=<name>` opens with the box of that binding of main selected.
  var v = /^#var=(.+)$/.exec(window.location.hash);
  var vg = v ? byVar[decodeURIComponent(v[1])] : null;
  if (vg) { centreOn(vg); vg.dispatchEvent(new MouseEvent('click', {bubbles: true})); }
  // The table: click selects, the filter hides rows.
  var rows = Array.prototype.slice.call(document.querySelectorAll('#table tbody tr'));
  rows.forEach(function (tr) {
    tr.addEventListener('click', function () { select(tr.getAttribute('data-function'), true); });
  });
  var filter = document.getElementById('filter');
  filter.addEventListener('input', function () {
    var q = filter.value.toLowerCase();
    rows.forEach(function (tr) { tr.style.display = tr.textContent.toLowerCase().indexOf(q) >= 0 ? '' : 'none'; });
  });
  document.documentElement.setAttribute('data-ready', 'yes');
})();
"#;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code panics on failure")]
    use super::*;

    #[test]
    fn escapes_markup_everywhere() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        let mut r = Report {
            functions: Vec::new(),
            main: Vec::new(),
            rejections: vec![super::super::RejectionReport {
                pattern: "p".into(),
                at: "main/x".into(),
                reason: "</script><script>alert(1)</script>".into(),
            }],
            claims: Vec::new(),
            notes: Vec::new(),
        };
        let j = embedded_json(&r).unwrap();
        assert!(!j.contains("</script>"), "{j}");
        let back: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(
            back["rejections"][0]["reason"],
            "</script><script>alert(1)</script>"
        );
        r.notes.push("a <b> note".into());
        let html = to_html(&Module::default(), &r, "m<1>.onnx").unwrap();
        assert!(html.contains("m&lt;1&gt;.onnx"));
        assert!(html.contains("a &lt;b&gt; note"));
        assert_eq!(
            html.matches("</script>").count(),
            3,
            "only the page's own scripts end"
        );
    }

    #[test]
    fn clip_cuts_long_labels() {
        assert_eq!(clip("abc", 3), "abc");
        assert_eq!(clip("abcdef", 4), "abc…");
    }
}
