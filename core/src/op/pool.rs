//! The ops TVM's ONNX and PyTorch importers emit beyond the 2-D pools: `relax.stack` and the
//! 1-D and 3-D pooling family (`relax.nn.{max,avg}_pool{1,3}d`,
//! `relax.nn.adaptive_avg_pool{1,3}d`), with TVM 0.27's attribute names, defaults and printing
//! order.
//!
//! ```text
//! lv: R.Tensor((1, 2, 4, 8), dtype="float32") = R.stack((x, y), axis=1)
//! lv1: R.Tensor((1, 4, 4), dtype="float32") = R.nn.max_pool1d(x, pool_size=[2], strides=[2],
//!     dilation=[1], padding=[0, 0], ceil_mode=False, count_include_pad=False, layout="NCW",
//!     out_layout="NCW")
//! lv2: R.Tensor((1, 4, 2, 2, 2), dtype="float32") = R.nn.adaptive_avg_pool3d(v,
//!     output_size=[2, 2, 2], layout="NCDHW", out_layout="NCDHW")
//! ```
//!
//! Padding holds every spatial axis's leading pad, then every trailing pad (TVM's order:
//! `[front, top, left, back, bottom, right]` for 3-D).

use super::AttrLit;
use super::attrs::{Kwargs, at_least, ints_lit, opt_ints_lit, str_lit};

/// Attributes of the 1-D and 3-D pools (`relax.nn.max_pool1d`, `avg_pool1d`, `max_pool3d`,
/// `avg_pool3d`); one value per spatial axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolAttrs {
    /// Window size per spatial axis.
    pub pool_size: Vec<i64>,
    /// Strides per spatial axis.
    pub strides: Vec<i64>,
    /// Dilation per spatial axis.
    pub dilation: Vec<i64>,
    /// Leading pads of every spatial axis, then trailing pads.
    pub padding: Vec<i64>,
    /// Round the output extent up instead of down.
    pub ceil_mode: bool,
    /// Whether padding counts in the average.
    pub count_include_pad: bool,
    /// Data layout: a permutation of `NCW` / `NCDHW`.
    pub layout: String,
    /// Output layout: a permutation of `NCW` / `NCDHW`.
    pub out_layout: String,
}

/// Attributes of `relax.nn.adaptive_avg_pool1d` and `adaptive_avg_pool3d`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AdaptivePoolAttrs {
    /// Output extent per spatial axis (`None`: same as the input).
    pub output_size: Option<Vec<i64>>,
    /// Data layout: a permutation of `NCW` / `NCDHW`.
    pub layout: String,
    /// Output layout: a permutation of `NCW` / `NCDHW`.
    pub out_layout: String,
}

/// Python-API (positional) order of the pool attributes.
pub(super) const POOL_ATTRS: &[&str] = &[
    "pool_size",
    "strides",
    "padding",
    "dilation",
    "ceil_mode",
    "count_include_pad",
    "layout",
    "out_layout",
];

/// The canonical layout of a pool over `k` spatial axes.
pub(crate) fn canonical_layout(k: usize) -> &'static str {
    if k == 1 { "NCW" } else { "NCDHW" }
}

/// Where each letter of `letters` sits in `layout`, when `layout` is a permutation of it.
pub(crate) fn layout_perm(layout: &str, letters: &str) -> Option<Vec<usize>> {
    let l = layout.as_bytes();
    if l.len() != letters.len() {
        return None;
    }
    letters
        .bytes()
        .map(|c| {
            let mut found = l.iter().enumerate().filter(|(_, x)| **x == c);
            let (i, _) = found.next()?;
            found.next().is_none().then_some(i)
        })
        .collect()
}

fn check_layout(kw: &Kwargs<'_>, k: &str, layout: &str, letters: &str) -> Result<(), String> {
    match layout_perm(layout, letters) {
        Some(_) => Ok(()),
        None => Err(kw.invalid(
            k,
            &format!("expected a permutation of \"{letters}\", found \"{layout}\""),
        )),
    }
}

/// Expands 1 or `k` integers to `k`.
fn per_axis(kw: &Kwargs<'_>, name: &str, v: &[i64], k: usize) -> Result<Vec<i64>, String> {
    match v.len() {
        1 => Ok(vec![v[0]; k]),
        n if n == k => Ok(v.to_vec()),
        n => Err(kw.invalid(name, &format!("expected 1 or {k} integers, found {n}"))),
    }
}

/// Expands 1, `k` or `2k` integers to `2k` (leading pads, then trailing pads).
fn pads(kw: &Kwargs<'_>, v: &[i64], k: usize) -> Result<Vec<i64>, String> {
    match v.len() {
        1 => Ok(vec![v[0]; 2 * k]),
        n if n == k => Ok(v.iter().chain(v).copied().collect()),
        n if n == 2 * k => Ok(v.to_vec()),
        n => Err(kw.invalid(
            "padding",
            &format!("expected 1, {k} or {} integers, found {n}", 2 * k),
        )),
    }
}

/// The attributes of a `k`-D pool; `avg` gives `count_include_pad` TVM's average default.
pub(super) fn pool_attrs(kw: &Kwargs<'_>, k: usize, avg: bool) -> Result<Box<PoolAttrs>, String> {
    let ones = vec![1; k];
    let pool_size = per_axis(kw, "pool_size", &kw.ints("pool_size", Some(&ones))?, k)?;
    let strides = per_axis(kw, "strides", &kw.ints("strides", Some(&ones))?, k)?;
    let dilation = per_axis(kw, "dilation", &kw.ints("dilation", Some(&ones))?, k)?;
    let padding = pads(kw, &kw.ints("padding", Some(&[0]))?, k)?;
    at_least(kw, "pool_size", &pool_size, 1)?;
    at_least(kw, "strides", &strides, 1)?;
    at_least(kw, "dilation", &dilation, 1)?;
    at_least(kw, "padding", &padding, 0)?;
    let letters = canonical_layout(k);
    let layout = kw.string("layout", Some(letters))?;
    check_layout(kw, "layout", &layout, letters)?;
    let out_layout = kw.string("out_layout", Some(&layout))?;
    check_layout(kw, "out_layout", &out_layout, letters)?;
    Ok(Box::new(PoolAttrs {
        pool_size,
        strides,
        dilation,
        padding,
        ceil_mode: kw.bool("ceil_mode", false)?,
        count_include_pad: kw.bool("count_include_pad", avg)?,
        layout,
        out_layout,
    }))
}

/// The attributes of a `k`-D adaptive pool.
pub(super) fn adaptive_attrs(kw: &Kwargs<'_>, k: usize) -> Result<Box<AdaptivePoolAttrs>, String> {
    let output_size = match kw.opt_ints("output_size")? {
        None => None,
        Some(v) => {
            let p = per_axis(kw, "output_size", &v, k)?;
            at_least(kw, "output_size", &p, 1)?;
            Some(p)
        }
    };
    let letters = canonical_layout(k);
    let layout = kw.string("layout", Some(letters))?;
    check_layout(kw, "layout", &layout, letters)?;
    let out_layout = kw.string("out_layout", Some(&layout))?;
    check_layout(kw, "out_layout", &out_layout, letters)?;
    Ok(Box::new(AdaptivePoolAttrs {
        output_size,
        layout,
        out_layout,
    }))
}

/// TVM 0.27's printing order (`dilation` before `padding`).
pub(super) fn pool_kwargs(a: &PoolAttrs) -> Vec<(&'static str, AttrLit)> {
    vec![
        ("pool_size", ints_lit(&a.pool_size)),
        ("strides", ints_lit(&a.strides)),
        ("dilation", ints_lit(&a.dilation)),
        ("padding", ints_lit(&a.padding)),
        ("ceil_mode", AttrLit::Bool(a.ceil_mode)),
        ("count_include_pad", AttrLit::Bool(a.count_include_pad)),
        ("layout", str_lit(&a.layout)),
        ("out_layout", str_lit(&a.out_layout)),
    ]
}

pub(super) fn adaptive_kwargs(a: &AdaptivePoolAttrs) -> Vec<(&'static str, AttrLit)> {
    vec![
        ("output_size", opt_ints_lit(a.output_size.as_deref())),
        ("layout", str_lit(&a.layout)),
        ("out_layout", str_lit(&a.out_layout)),
    ]
}
