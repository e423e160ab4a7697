//! Attributes of the `nn` family ops added for issue 17: `relax.nn.conv2d_transpose` and
//! `relax.image.resize2d`, read from and written back to keyword literals.
//!
//! Contract: names, defaults and printing order are TVM 0.27's (`Conv2DTransposeAttrs`,
//! `Resize2DAttrs`); string attributes with a closed set of values are checked when read, so a
//! kernel never meets an unknown mode. `resize2d` has three extensions for ONNX's `Resize`,
//! printed only where they are used, so every module TVM can print reads back the same:
//! `scale=[sh, sw]` (ONNX's scales, used by the coordinate transformation in place of the
//! size ratio when the output extent `floor(scale · input)` is not exact), `antialias=True`
//! (a linear or cubic filter widened by `1 / scale` when downsampling), and the coordinate
//! mode `half_pixel_symmetric`.
//!
//! ```text
//! y = R.nn.conv2d_transpose(x, w, strides=[2, 2], padding=[0, 0, 0, 0], output_padding=[1, 1],
//!     dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="IOHW", out_layout="NCHW",
//!     out_dtype=None)
//! z = R.image.resize2d(x, R.shape([8, 8]), roi=[0.0, 0.0, 0.0, 0.0], layout="NCHW",
//!     method="linear", coordinate_transformation_mode="half_pixel", rounding_method="round",
//!     cubic_alpha=-0.75, cubic_exclude=0, extrapolation_value=0.0, out_dtype=None)
//! ```

use super::attrs::{Kwargs, at_least, check_layout, dtype_lit, ints_lit, pair, quad, str_lit};
use super::{AttrLit, F64};
use crate::ir::DType;

/// Attributes of `relax.nn.conv2d_transpose`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dTransposeAttrs {
    /// Strides (h, w).
    pub strides: [i64; 2],
    /// Padding removed from the full output (top, left, bottom, right).
    pub padding: [i64; 4],
    /// Extra rows/columns added at the bottom/right of the output (h, w).
    pub output_padding: [i64; 2],
    /// Dilation (h, w).
    pub dilation: [i64; 2],
    /// Groups.
    pub groups: i64,
    /// Data layout: a permutation of `NCHW`.
    pub data_layout: String,
    /// Kernel layout: a permutation of `IOHW` (input channels first).
    pub kernel_layout: String,
    /// Output layout: a permutation of `NCHW`.
    pub out_layout: String,
    /// Output dtype (`None`: same as the input).
    pub out_dtype: Option<DType>,
}

/// Attribute names of `relax.nn.conv2d_transpose` in Python-API order.
pub(super) const CONV2D_TRANSPOSE_ATTRS: &[&str] = &[
    "strides",
    "padding",
    "output_padding",
    "dilation",
    "groups",
    "data_layout",
    "kernel_layout",
    "out_layout",
    "out_dtype",
];

/// Reads `relax.nn.conv2d_transpose`'s attributes.
pub(super) fn conv2d_transpose_attrs(kw: &Kwargs<'_>) -> Result<Box<Conv2dTransposeAttrs>, String> {
    let strides = pair(kw, "strides", &kw.ints("strides", Some(&[1, 1]))?)?;
    let padding = quad(kw, "padding", &kw.ints("padding", Some(&[0, 0]))?)?;
    let output_padding = pair(
        kw,
        "output_padding",
        &kw.ints("output_padding", Some(&[0, 0]))?,
    )?;
    let dilation = pair(kw, "dilation", &kw.ints("dilation", Some(&[1, 1]))?)?;
    let groups = kw.int("groups", Some(1))?;
    at_least(kw, "strides", &strides, 1)?;
    at_least(kw, "padding", &padding, 0)?;
    at_least(kw, "output_padding", &output_padding, 0)?;
    at_least(kw, "dilation", &dilation, 1)?;
    at_least(kw, "groups", &[groups], 1)?;
    let data_layout = kw.string("data_layout", Some("NCHW"))?;
    check_layout(kw, "data_layout", &data_layout, "NCHW")?;
    let kernel_layout = kw.string("kernel_layout", Some("IOHW"))?;
    check_layout(kw, "kernel_layout", &kernel_layout, "IOHW")?;
    let out_layout = kw.string("out_layout", Some(&data_layout))?;
    check_layout(kw, "out_layout", &out_layout, "NCHW")?;
    Ok(Box::new(Conv2dTransposeAttrs {
        strides,
        padding,
        output_padding,
        dilation,
        groups,
        data_layout,
        kernel_layout,
        out_layout,
        out_dtype: kw.opt_dtype("out_dtype")?,
    }))
}

/// `relax.nn.conv2d_transpose`'s attributes in TVM's printing order.
pub(super) fn conv2d_transpose_kwargs(a: &Conv2dTransposeAttrs) -> Vec<(&'static str, AttrLit)> {
    vec![
        ("strides", ints_lit(&a.strides)),
        ("padding", ints_lit(&a.padding)),
        ("output_padding", ints_lit(&a.output_padding)),
        ("dilation", ints_lit(&a.dilation)),
        ("groups", AttrLit::Int(a.groups)),
        ("data_layout", str_lit(&a.data_layout)),
        ("kernel_layout", str_lit(&a.kernel_layout)),
        ("out_layout", str_lit(&a.out_layout)),
        ("out_dtype", dtype_lit(a.out_dtype)),
    ]
}

/// Attributes of `relax.image.resize2d` (the output size is the second argument, a shape).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Resize2dAttrs {
    /// Region of interest `[start_h, start_w, end_h, end_w]` in normalised input coordinates
    /// (used by `tf_crop_and_resize` only).
    pub roi: [F64; 4],
    /// Data layout: a permutation of `NCHW`.
    pub layout: String,
    /// `"nearest_neighbor"`, `"linear"` or `"cubic"`.
    pub method: String,
    /// `"half_pixel"`, `"align_corners"`, `"asymmetric"`, `"pytorch_half_pixel"`,
    /// `"tf_half_pixel_for_nn"` or `"tf_crop_and_resize"`.
    pub coordinate_transformation_mode: String,
    /// Nearest rounding: `"round"`, `"round_prefer_floor"`, `"round_prefer_ceil"`, `"floor"`,
    /// `"ceil"` (empty: `"round"`).
    pub rounding_method: String,
    /// The cubic spline coefficient.
    pub cubic_alpha: F64,
    /// 1: cubic weights outside the input are dropped and the rest renormalised.
    pub cubic_exclude: i64,
    /// The value of output points outside the input (`tf_crop_and_resize`).
    pub extrapolation_value: F64,
    /// Output dtype (`None`: same as the input).
    pub out_dtype: Option<DType>,
    /// ONNX's scales `(h, w)` (output / input), used by the coordinate transformation in place
    /// of the size ratio (`None`: the size ratio). A fusebox extension: set by the ONNX
    /// importer only when the output extent is not exactly `scale · input`.
    pub scale: Option<[F64; 2]>,
    /// ONNX's `antialias`: when an axis is downsampled, linear and cubic filters are widened
    /// by `1 / scale` and their weights normalised. A fusebox extension.
    pub antialias: bool,
}

/// Attribute names of `relax.image.resize2d` in Python-API order (then fusebox's extensions).
pub(super) const RESIZE2D_ATTRS: &[&str] = &[
    "roi",
    "layout",
    "method",
    "coordinate_transformation_mode",
    "rounding_method",
    "cubic_alpha",
    "cubic_exclude",
    "extrapolation_value",
    "out_dtype",
    "scale",
    "antialias",
];

/// fusebox's extensions among [`RESIZE2D_ATTRS`]: printed only when set.
#[cfg(test)]
pub(super) const RESIZE2D_EXTENSIONS: &[&str] = &["scale", "antialias"];

const METHODS: &[&str] = &["nearest_neighbor", "linear", "cubic"];
const COORD_MODES: &[&str] = &[
    "half_pixel",
    "align_corners",
    "asymmetric",
    "pytorch_half_pixel",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
    "half_pixel_symmetric",
];
const ROUNDING: &[&str] = &[
    "",
    "round",
    "round_prefer_floor",
    "round_prefer_ceil",
    "floor",
    "ceil",
];

/// String attribute `k` (default `default`), which must be one of `set`.
pub(super) fn one_of(
    kw: &Kwargs<'_>,
    k: &str,
    default: &str,
    set: &[&str],
) -> Result<String, String> {
    let v = kw.string(k, Some(default))?;
    if set.contains(&v.as_str()) {
        Ok(v)
    } else {
        Err(kw.invalid(k, &format!("expected one of {set:?}, found \"{v}\"")))
    }
}

/// The values of a list of numbers (ints widened), else `None`.
fn numbers(v: &AttrLit) -> Option<Vec<f64>> {
    match v {
        AttrLit::List(items) => items
            .iter()
            .map(|x| match x {
                AttrLit::Float(f) => Some(*f),
                AttrLit::Int(i) => Some(*i as f64),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// Reads `relax.image.resize2d`'s attributes.
pub(super) fn resize2d_attrs(kw: &Kwargs<'_>) -> Result<Box<Resize2dAttrs>, String> {
    let roi = match kw.raw("roi") {
        None | Some(AttrLit::None) => [F64(0.0); 4],
        Some(v) => {
            let nums: Option<Vec<f64>> = match v {
                AttrLit::Float(f) => Some(vec![*f; 4]),
                AttrLit::Int(i) => Some(vec![*i as f64; 4]),
                _ => numbers(v),
            };
            match nums.as_deref() {
                Some(&[a, b, c, d]) => [F64(a), F64(b), F64(c), F64(d)],
                _ => return Err(kw.error("roi", "a list of 4 floats", v)),
            }
        }
    };
    let layout = kw.string("layout", Some("NCHW"))?;
    check_layout(kw, "layout", &layout, "NCHW")?;
    let cubic_exclude = kw.int("cubic_exclude", Some(0))?;
    if !(0..=1).contains(&cubic_exclude) {
        return Err(kw.invalid("cubic_exclude", "expected 0 or 1"));
    }
    let scale = match kw.raw("scale") {
        None | Some(AttrLit::None) => None,
        Some(v) => match numbers(v).as_deref() {
            Some(&[h, w]) if h.is_finite() && w.is_finite() && h > 0.0 && w > 0.0 => {
                Some([F64(h), F64(w)])
            }
            _ => return Err(kw.error("scale", "a list of 2 positive finite floats", v)),
        },
    };
    Ok(Box::new(Resize2dAttrs {
        roi,
        layout,
        method: one_of(kw, "method", "linear", METHODS)?,
        coordinate_transformation_mode: one_of(
            kw,
            "coordinate_transformation_mode",
            "half_pixel",
            COORD_MODES,
        )?,
        rounding_method: one_of(kw, "rounding_method", "round", ROUNDING)?,
        cubic_alpha: kw.float("cubic_alpha", -0.75)?,
        cubic_exclude,
        extrapolation_value: kw.float("extrapolation_value", 0.0)?,
        out_dtype: kw.opt_dtype("out_dtype")?,
        scale,
        antialias: kw.bool("antialias", false)?,
    }))
}

/// `relax.image.resize2d`'s attributes in TVM's printing order.
pub(super) fn resize2d_kwargs(a: &Resize2dAttrs) -> Vec<(&'static str, AttrLit)> {
    let mut kw = vec![
        (
            "roi",
            AttrLit::List(a.roi.iter().map(|f| AttrLit::Float(f.0)).collect()),
        ),
        ("layout", str_lit(&a.layout)),
        ("method", str_lit(&a.method)),
        (
            "coordinate_transformation_mode",
            str_lit(&a.coordinate_transformation_mode),
        ),
        ("rounding_method", str_lit(&a.rounding_method)),
        ("cubic_alpha", AttrLit::Float(a.cubic_alpha.0)),
        ("cubic_exclude", AttrLit::Int(a.cubic_exclude)),
        (
            "extrapolation_value",
            AttrLit::Float(a.extrapolation_value.0),
        ),
        ("out_dtype", dtype_lit(a.out_dtype)),
    ];
    if let Some([h, w]) = a.scale {
        kw.push((
            "scale",
            AttrLit::List(vec![AttrLit::Float(h.0), AttrLit::Float(w.0)]),
        ));
    }
    if a.antialias {
        kw.push(("antialias", AttrLit::Bool(true)));
    }
    kw
}

/// The taps of one output position along one axis; `None` when the position lies outside the
/// input (`tf_crop_and_resize`).
pub type Taps = Option<Vec<(usize, f64)>>;

/// The input coordinate of output index `o` (TVM topi's `get_inx`). With ONNX's `scale`
/// (output / input) the transformation uses it, and the fractional output extent
/// `scale · n_in`, where TVM uses the size ratio (ONNX `Resize`'s formulas).
fn source_coord(
    mode: &str,
    o: usize,
    n_in: usize,
    n_out: usize,
    roi: (f64, f64),
    scale: Option<f64>,
) -> f64 {
    let (o, i) = (o as f64, n_in as f64);
    // The output extent and input pixels per output pixel.
    let (out, step) = match scale {
        Some(s) => (s * i, 1.0 / s),
        None => (n_out as f64, i / n_out as f64),
    };
    let many = match scale {
        Some(_) => out != 1.0,
        None => n_out > 1,
    };
    match mode {
        "align_corners" if many => o * (i - 1.0) / (out - 1.0),
        "align_corners" => 0.0,
        "asymmetric" => o * step,
        "pytorch_half_pixel" if many => (o + 0.5) * step - 0.5,
        "pytorch_half_pixel" => 0.0,
        "tf_half_pixel_for_nn" => (o + 0.5) * step,
        "tf_crop_and_resize" if many => {
            roi.0 * (i - 1.0) + o * (roi.1 - roi.0) * (i - 1.0) / (out - 1.0)
        }
        "tf_crop_and_resize" => 0.5 * (roi.0 + roi.1) * (i - 1.0),
        // The centre of the (fractional) output maps to the centre of the input.
        "half_pixel_symmetric" => {
            let offset = i / 2.0 * (1.0 - n_out as f64 / out);
            offset + (o + 0.5) * step - 0.5
        }
        // half_pixel
        _ => (o + 0.5) * step - 0.5,
    }
}

/// TVM topi's `get_closest_index`.
fn nearest(x: f64, rounding: &str) -> f64 {
    match rounding {
        "round_prefer_floor" => (x - 0.5).ceil(),
        "round_prefer_ceil" => (x + 0.5).floor(),
        "floor" => (x + 1e-5).floor(),
        "ceil" => (x - 1e-5).ceil(),
        // "round" and "": half to even.
        _ => x.round_ties_even(),
    }
}

/// The cubic convolution weights of the four taps `floor(x) - 1 ..= floor(x) + 2` at
/// fraction `t`.
fn cubic_weights(t: f64, a: f64) -> [f64; 4] {
    let (t2, t3) = (t * t, t * t * t);
    [
        a * (t3 - 2.0 * t2 + t),
        (a + 2.0) * t3 - (3.0 + a) * t2 + 1.0,
        -(a + 2.0) * t3 + (3.0 + 2.0 * a) * t2 - a * t,
        -a * t3 + a * t2,
    ]
}

/// ONNX's antialiased taps at input coordinate `x` of an axis downsampled by `scale` < 1: the
/// linear (triangle) or cubic kernel stretched by `1 / scale` over the pixels it covers,
/// weights normalised to sum to 1; outside the input the edge pixel repeats, or with
/// `exclude` its weight is dropped before normalising (the ONNX reference's
/// `_linear_coeffs_antialias` / `_cubic_coeffs_antialias`).
fn antialias_taps(
    x: f64,
    scale: f64,
    n_in: usize,
    cubic: bool,
    alpha: f64,
    exclude: bool,
) -> Vec<(usize, f64)> {
    // The pixel at or left of `x` (`x` itself counts as right of its left neighbour), and
    // `x`'s distance from it in (0, 1].
    let base = x.ceil() - 1.0;
    let ratio = x - base;
    let reach = if cubic { 2.0 } else { 1.0 };
    let start = (-reach / scale).floor() as i64 + 1;
    let end = 2 - start;
    let kernel = |t: f64| -> f64 {
        let t = t.abs();
        if cubic {
            let (t2, t3) = (t * t, t * t * t);
            if t <= 1.0 {
                (alpha + 2.0) * t3 - (alpha + 3.0) * t2 + 1.0
            } else if t < 2.0 {
                alpha * t3 - 5.0 * alpha * t2 + 8.0 * alpha * t - 4.0 * alpha
            } else {
                0.0
            }
        } else {
            (1.0 - t).clamp(0.0, 1.0)
        }
    };
    let b = base as i64;
    let mut taps: Vec<(usize, f64)> = Vec::with_capacity((end - start).max(0) as usize);
    let mut sum = 0.0;
    for j in start..end {
        let w = kernel(scale * (j as f64 - ratio));
        sum += w;
        taps.push((clamp_index(b + j, n_in), w));
    }
    if sum != 0.0 {
        taps.iter_mut().for_each(|t| t.1 /= sum);
    }
    if exclude {
        let mut kept = 0.0;
        for (k, j) in (start..end).enumerate() {
            if !(0..n_in as i64).contains(&(b + j)) {
                taps[k].1 = 0.0;
            }
            kept += taps[k].1;
        }
        if kept != 0.0 {
            taps.iter_mut().for_each(|t| t.1 /= kept);
        }
    }
    taps
}

fn clamp_index(i: i64, n: usize) -> usize {
    i.clamp(0, n as i64 - 1) as usize
}

impl Resize2dAttrs {
    /// Checks that an output extent fits the attributes: with `scale`, `n_out` along `axis`
    /// must be `scale · n_in` rounded down or up (ONNX's `floor` for `scales`, `round` for
    /// `sizes` with a `keep_aspect_ratio_policy`), so a filter's width and the number of
    /// outputs stay tied to the input (an antialiased axis then has about `4 · n_in` taps in
    /// all).
    pub fn check_extent(&self, axis: usize, n_in: usize, n_out: usize) -> Result<(), String> {
        let Some(s) = self.scale.map(|s| s[axis.min(1)].0) else {
            return Ok(());
        };
        let exact = s * n_in as f64;
        if (n_out as f64 - exact).abs() < 1.0 + 1e-5 * exact.max(1.0) {
            Ok(())
        } else {
            Err(format!(
                "resize2d with scale {s} on an input extent of {n_in} gives {exact} outputs, \
                 the size asks for {n_out}"
            ))
        }
    }

    /// The (input index, weight) taps of every output index along `axis` (0: height, 1:
    /// width) of `n_in` input and `n_out` output positions (`n_in` ≥ 1): TVM topi's rules,
    /// with ONNX's scale and antialiasing where the attributes ask for them (callers check
    /// the extents with [`Resize2dAttrs::check_extent`] first).
    pub fn taps(&self, axis: usize, n_in: usize, n_out: usize) -> Vec<Taps> {
        let a = self;
        let axis = axis.min(1);
        let roi = (a.roi[axis].0, a.roi[axis + 2].0);
        let scale = a.scale.map(|s| s[axis].0);
        let mode = a.coordinate_transformation_mode.as_str();
        let crop = mode == "tf_crop_and_resize";
        // Antialiasing widens linear and cubic filters on a downsampled axis.
        let ratio = scale.unwrap_or(n_out as f64 / n_in as f64);
        let wide = a.antialias && ratio < 1.0 && a.method != "nearest_neighbor";
        (0..n_out)
            .map(|o| {
                let x = source_coord(mode, o, n_in, n_out, roi, scale);
                if crop && (x < 0.0 || x > n_in as f64 - 1.0) {
                    return None;
                }
                if wide {
                    return Some(antialias_taps(
                        x,
                        ratio,
                        n_in,
                        a.method == "cubic",
                        a.cubic_alpha.0,
                        a.cubic_exclude == 1,
                    ));
                }
                Some(match a.method.as_str() {
                    "nearest_neighbor" => {
                        vec![(
                            clamp_index(nearest(x, &a.rounding_method) as i64, n_in),
                            1.0,
                        )]
                    }
                    "cubic" => {
                        let base = x.floor();
                        let w = cubic_weights(x - base, a.cubic_alpha.0);
                        let base = base as i64;
                        let mut taps: Vec<(usize, f64)> = Vec::with_capacity(4);
                        for (k, wk) in w.iter().enumerate() {
                            let i = base - 1 + k as i64;
                            let inside = (0..n_in as i64).contains(&i);
                            if a.cubic_exclude == 1 && !inside {
                                continue;
                            }
                            taps.push((clamp_index(i, n_in), *wk));
                        }
                        if a.cubic_exclude == 1 {
                            let s: f64 = taps.iter().map(|t| t.1).sum();
                            if s != 0.0 {
                                taps.iter_mut().for_each(|t| t.1 /= s);
                            }
                        }
                        taps
                    }
                    // linear
                    _ => {
                        let base = x.floor();
                        let f = x - base;
                        let b = base as i64;
                        vec![
                            (clamp_index(b, n_in), 1.0 - f),
                            (clamp_index(b + 1, n_in), f),
                        ]
                    }
                })
            })
            .collect()
    }
}

/// Attributes of `relax.nn.group_norm` and `relax.nn.instance_norm` (instance norm is group
/// norm with one group per channel; TVM prints it without `num_groups`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GroupNormAttrs {
    /// Number of channel groups (`relax.nn.instance_norm`: 0, meaning one per channel).
    pub num_groups: i64,
    /// The channel axis.
    pub channel_axis: i64,
    /// The other normalised axes (besides the channels of a group).
    pub axes: Vec<i64>,
    /// Added to the variance.
    pub epsilon: F64,
    /// Whether `beta` is added.
    pub center: bool,
    /// Whether `gamma` multiplies.
    pub scale: bool,
}

/// Attribute names of `relax.nn.group_norm` in Python-API order.
pub(super) const GROUP_NORM_ATTRS: &[&str] = &[
    "num_groups",
    "channel_axis",
    "axes",
    "epsilon",
    "center",
    "scale",
];

/// Attribute names of `relax.nn.instance_norm` in Python-API order.
pub(super) const INSTANCE_NORM_ATTRS: &[&str] =
    &["channel_axis", "axes", "epsilon", "center", "scale"];

/// Reads `relax.nn.group_norm`'s (`instance = false`) or `relax.nn.instance_norm`'s attributes.
pub(super) fn group_norm_attrs(
    kw: &Kwargs<'_>,
    instance: bool,
) -> Result<Box<GroupNormAttrs>, String> {
    let num_groups = if instance {
        0
    } else {
        let g = kw.int("num_groups", None)?;
        at_least(kw, "num_groups", &[g], 1)?;
        g
    };
    Ok(Box::new(GroupNormAttrs {
        num_groups,
        channel_axis: kw.int("channel_axis", None)?,
        axes: kw.ints("axes", None)?,
        epsilon: kw.float("epsilon", 1e-5)?,
        center: kw.bool("center", true)?,
        scale: kw.bool("scale", true)?,
    }))
}

/// `relax.nn.group_norm`'s / `relax.nn.instance_norm`'s attributes in TVM's printing order.
pub(super) fn group_norm_kwargs(
    a: &GroupNormAttrs,
    instance: bool,
) -> Vec<(&'static str, AttrLit)> {
    let mut v = Vec::with_capacity(6);
    if !instance {
        v.push(("num_groups", AttrLit::Int(a.num_groups)));
    }
    v.extend([
        ("channel_axis", AttrLit::Int(a.channel_axis)),
        ("axes", ints_lit(&a.axes)),
        ("epsilon", AttrLit::Float(a.epsilon.0)),
        ("center", AttrLit::Bool(a.center)),
        ("scale", AttrLit::Bool(a.scale)),
    ]);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Dim, Type};
    use crate::op::Op;
    use crate::text::{parse_module_str, print_module};

    fn op(name: &str, kw: &[(&str, AttrLit)]) -> Result<Op, String> {
        let kw: Vec<(String, AttrLit)> =
            kw.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        Op::from_call(name, &kw)
    }

    fn ints(v: &[i64]) -> AttrLit {
        ints_lit(v)
    }

    fn round_trip(o: &Op) {
        let kw: Vec<(String, AttrLit)> = o
            .kwargs()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(Op::from_call(o.name(), &kw).as_ref(), Ok(o));
    }

    #[test]
    fn conv2d_transpose_defaults_kwargs_and_round_trip() {
        let o = op("relax.nn.conv2d_transpose", &[]).unwrap_or_else(|e| unreachable!("{e}"));
        let Op::Conv2dTranspose(a) = &o else {
            unreachable!("{o:?}")
        };
        assert_eq!(a.strides, [1, 1]);
        assert_eq!(a.padding, [0, 0, 0, 0]);
        assert_eq!(a.kernel_layout, "IOHW");
        let names: Vec<&str> = o.kwargs().iter().map(|(k, _)| *k).collect();
        assert_eq!(names, CONV2D_TRANSPOSE_ATTRS);
        round_trip(&o);
        let o2 = op(
            "relax.nn.conv2d_transpose",
            &[
                ("strides", ints(&[2])),
                ("padding", ints(&[1, 2])),
                ("output_padding", ints(&[1, 0])),
                ("groups", AttrLit::Int(2)),
            ],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let Op::Conv2dTranspose(a) = &o2 else {
            unreachable!("{o2:?}")
        };
        assert_eq!(a.strides, [2, 2]);
        assert_eq!(a.padding, [1, 2, 1, 2]);
        assert_eq!(a.output_padding, [1, 0]);
        round_trip(&o2);
        assert_eq!(o2.fusion_kind(), crate::op::FusionKind::OutEWiseFusable);
        let e = op(
            "relax.nn.conv2d_transpose",
            &[("output_padding", ints(&[-1]))],
        );
        assert!(e.is_err_and(|e| e.contains("output_padding")));
        let e = op(
            "relax.nn.conv2d_transpose",
            &[("kernel_layout", AttrLit::Str("OIHX".into()))],
        );
        assert!(e.is_err_and(|e| e.contains("IOHW")));
    }

    #[test]
    fn resize2d_defaults_kwargs_checks_and_round_trip() {
        let o = op("relax.image.resize2d", &[]).unwrap_or_else(|e| unreachable!("{e}"));
        let Op::Resize2d(a) = &o else {
            unreachable!("{o:?}")
        };
        assert_eq!(a.method, "linear");
        assert_eq!(a.coordinate_transformation_mode, "half_pixel");
        assert_eq!(a.cubic_alpha, F64(-0.75));
        let names: Vec<&str> = o.kwargs().iter().map(|(k, _)| *k).collect();
        assert_eq!(names, RESIZE2D_ATTRS[..RESIZE2D_ATTRS.len() - 2]);
        round_trip(&o);
        // The extensions print when set, and read back.
        let ext = op(
            "relax.image.resize2d",
            &[
                (
                    "scale",
                    AttrLit::List(vec![AttrLit::Float(0.6), AttrLit::Float(0.8)]),
                ),
                ("antialias", AttrLit::Bool(true)),
                (
                    "coordinate_transformation_mode",
                    AttrLit::Str("half_pixel_symmetric".into()),
                ),
            ],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let names: Vec<&str> = ext.kwargs().iter().map(|(k, _)| *k).collect();
        assert_eq!(names, RESIZE2D_ATTRS);
        round_trip(&ext);
        let bad = op(
            "relax.image.resize2d",
            &[(
                "scale",
                AttrLit::List(vec![AttrLit::Float(0.0), AttrLit::Float(1.0)]),
            )],
        );
        assert!(bad.is_err_and(|e| e.contains("2 positive finite floats")));
        assert_eq!(o.fusion_kind(), crate::op::FusionKind::Injective);
        let o2 = op(
            "relax.image.resize2d",
            &[
                (
                    "roi",
                    AttrLit::List(vec![
                        AttrLit::Float(0.1),
                        AttrLit::Int(0),
                        AttrLit::Float(0.9),
                        AttrLit::Float(1.0),
                    ]),
                ),
                ("method", AttrLit::Str("nearest_neighbor".into())),
                ("rounding_method", AttrLit::Str("floor".into())),
                ("out_dtype", AttrLit::Str("float16".into())),
            ],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        round_trip(&o2);
        let bad = op(
            "relax.image.resize2d",
            &[("method", AttrLit::Str("bilinear".into()))],
        );
        assert!(bad.is_err_and(|e| e.contains("nearest_neighbor") && e.contains("bilinear")));
        let bad = op("relax.image.resize2d", &[("roi", ints(&[1, 2]))]);
        assert!(bad.is_err_and(|e| e.contains("4 floats")));
        let bad = op(
            "relax.image.resize2d",
            &[("coordinate_transformation_mode", AttrLit::Str("x".into()))],
        );
        assert!(bad.is_err());
    }

    #[test]
    fn inference_of_conv2d_transpose_and_resize2d() {
        let n = Dim::sym("n");
        let x = Type::tensor_dims(
            vec![n.clone(), Dim::Static(4), Dim::Static(5), Dim::Static(5)],
            DType::F32,
        );
        let w = Type::tensor(&[4, 2, 3, 3], DType::F32);
        let o = op(
            "relax.nn.conv2d_transpose",
            &[
                ("strides", ints(&[2, 2])),
                ("output_padding", ints(&[1, 0])),
            ],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        // (5 - 1) * 2 + 3 + output_padding
        let want = Type::tensor_dims(
            vec![n.clone(), Dim::Static(2), Dim::Static(12), Dim::Static(11)],
            DType::F32,
        );
        assert_eq!(o.infer(&[&x, &w]), Ok(want));
        let g2 = op("relax.nn.conv2d_transpose", &[("groups", AttrLit::Int(2))])
            .unwrap_or_else(|e| unreachable!("{e}"));
        let t = g2.infer(&[&x, &w]).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(
            t,
            Type::tensor_dims(
                vec![n.clone(), Dim::Static(4), Dim::Static(7), Dim::Static(7)],
                DType::F32
            )
        );
        let w3 = Type::tensor(&[3, 2, 3, 3], DType::F32);
        assert!(
            o.infer(&[&x, &w3])
                .is_err_and(|e| e.contains("4 input channels") && e.contains("3"))
        );
        let big_pad = op("relax.nn.conv2d_transpose", &[("padding", ints(&[9, 9]))])
            .unwrap_or_else(|e| unreachable!("{e}"));
        let w1 = Type::tensor(&[4, 2, 3, 3], DType::F32);
        assert!(
            big_pad
                .infer(&[&x, &w1])
                .is_err_and(|e| e.contains("negative"))
        );

        let r = op("relax.image.resize2d", &[]).unwrap_or_else(|e| unreachable!("{e}"));
        let size = Type::Shape {
            dims: Some(vec![Dim::Static(8), Dim::sym("m")]),
            ndim: Some(2),
        };
        assert_eq!(
            r.infer(&[&x, &size]),
            Ok(Type::tensor_dims(
                vec![n, Dim::Static(4), Dim::Static(8), Dim::sym("m")],
                DType::F32
            ))
        );
        let size3 = Type::Shape {
            dims: Some(vec![Dim::Static(8); 3]),
            ndim: Some(3),
        };
        assert!(
            r.infer(&[&x, &size3])
                .is_err_and(|e| e.contains("2 values"))
        );
        assert!(r.infer(&[&w, &x]).is_err_and(|e| e.contains("shape")));
    }

    #[test]
    fn text_round_trip_of_the_new_ops() {
        let src = r#"# from tvm.script import ir as I
# from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 4, 5, 5), dtype="float32"), w: R.Tensor((4, 2, 3, 3), dtype="float32"), g: R.Tensor((2,), dtype="float32")) -> R.Tensor((1, 2, 8, 9), dtype="float32"):
        with R.dataflow():
            y: R.Tensor((1, 2, 11, 11), dtype="float32") = R.nn.conv2d_transpose(x, w, strides=[2, 2], padding=[0, 0, 0, 0], output_padding=[0, 0], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="IOHW", out_layout="NCHW", out_dtype=None)
            z: R.Tensor((1, 2, 11, 11), dtype="float32") = R.nn.instance_norm(y, g, g, channel_axis=1, axes=[2, 3], epsilon=1.0000000000000001e-05, center=True, scale=True)
            gv: R.Tensor((1, 2, 8, 9), dtype="float32") = R.image.resize2d(z, R.shape([8, 9]), roi=[0.0, 0.0, 0.0, 0.0], layout="NCHW", method="cubic", coordinate_transformation_mode="align_corners", rounding_method="round", cubic_alpha=-0.5, cubic_exclude=1, extrapolation_value=0.0, out_dtype=None)
            R.output(gv)
        return gv
"#;
        let m = parse_module_str(src).unwrap_or_else(|e| unreachable!("{e}"));
        let printed = print_module(&m).text;
        assert_eq!(printed, src);
        let m2 = parse_module_str(&printed).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(print_module(&m2).text, printed);
        // TVM's spelling of the roi (`T.float32(...)`) parses too and prints back as ours.
        let tvm = src.replace(
            "roi=[0.0, 0.0, 0.0, 0.0]",
            "roi=[T.float32(0.0), T.float32(0.0), T.float32(0.0), T.float32(0.0)]",
        );
        let m3 = parse_module_str(&tvm).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(print_module(&m3).text, src);
    }

    #[test]
    fn group_and_instance_norm_attrs_inference_and_round_trip() {
        let g = op(
            "relax.nn.group_norm",
            &[
                ("num_groups", AttrLit::Int(2)),
                ("channel_axis", AttrLit::Int(1)),
                ("axes", ints(&[2, 3])),
            ],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let names: Vec<&str> = g.kwargs().iter().map(|(k, _)| *k).collect();
        assert_eq!(names, GROUP_NORM_ATTRS);
        round_trip(&g);
        assert_eq!(g.fusion_kind(), crate::op::FusionKind::CommReduce);
        let i = op(
            "relax.nn.instance_norm",
            &[("channel_axis", AttrLit::Int(1)), ("axes", ints(&[2]))],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let names: Vec<&str> = i.kwargs().iter().map(|(k, _)| *k).collect();
        assert_eq!(names, INSTANCE_NORM_ATTRS);
        round_trip(&i);
        assert!(
            op("relax.nn.group_norm", &[("channel_axis", AttrLit::Int(1))])
                .is_err_and(|e| e.contains("num_groups"))
        );
        assert!(op("relax.nn.instance_norm", &[("num_groups", AttrLit::Int(1))]).is_err());
        let n = Dim::sym("n");
        let x = Type::tensor_dims(
            vec![n, Dim::Static(6), Dim::Static(4), Dim::Static(4)],
            DType::F32,
        );
        let p6 = Type::tensor(&[6], DType::F32);
        assert_eq!(g.infer(&[&x, &p6, &p6]), Ok(x.clone()));
        let p5 = Type::tensor(&[5], DType::F32);
        assert!(g.infer(&[&x, &p5, &p6]).is_err_and(|e| e.contains("gamma")));
        let g4 = op(
            "relax.nn.group_norm",
            &[
                ("num_groups", AttrLit::Int(4)),
                ("channel_axis", AttrLit::Int(1)),
                ("axes", ints(&[2, 3])),
            ],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        assert!(
            g4.infer(&[&x, &p6, &p6])
                .is_err_and(|e| e.contains("divisible"))
        );
        let bad_axes = op(
            "relax.nn.instance_norm",
            &[("channel_axis", AttrLit::Int(1)), ("axes", ints(&[1, 2]))],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        assert!(
            bad_axes
                .infer(&[&x, &p6, &p6])
                .is_err_and(|e| e.contains("channel axis"))
        );
        let xi = Type::tensor(&[1, 6, 2, 2], DType::I32);
        assert!(i.infer(&[&xi, &p6, &p6]).is_err());
    }

    #[test]
    fn taps_follow_the_coordinate_rules() {
        let a = |method: &str, mode: &str, rounding: &str| Resize2dAttrs {
            roi: [F64(0.0); 4],
            layout: "NCHW".into(),
            method: method.into(),
            coordinate_transformation_mode: mode.into(),
            rounding_method: rounding.into(),
            cubic_alpha: F64(-0.75),
            cubic_exclude: 0,
            extrapolation_value: F64(0.0),
            out_dtype: None,
            scale: None,
            antialias: false,
        };
        // 2 → 4, half_pixel linear: x_in = (o + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25.
        let t = a("linear", "half_pixel", "round").taps(0, 2, 4);
        let want = [
            vec![(0, 0.25), (0, 0.75)],
            vec![(0, 0.75), (1, 0.25)],
            vec![(0, 0.25), (1, 0.75)],
            vec![(1, 0.75), (1, 0.25)],
        ];
        for (got, w) in t.iter().zip(&want) {
            let got = got.as_ref().unwrap_or_else(|| unreachable!());
            for ((gi, gw), (wi, ww)) in got.iter().zip(w) {
                assert_eq!(gi, wi);
                assert!((gw - ww).abs() < 1e-12, "{got:?} vs {w:?}");
            }
        }
        // Nearest, asymmetric, 4 → 2 (x_in = 2 o): indices 0 and 2.
        let t = a("nearest_neighbor", "asymmetric", "floor").taps(0, 4, 2);
        assert_eq!(t, vec![Some(vec![(0, 1.0)]), Some(vec![(2, 1.0)])]);
        // round_prefer_ceil at exactly .5 goes up, round_prefer_floor goes down.
        let up = a("nearest_neighbor", "asymmetric", "round_prefer_ceil").taps(0, 3, 2);
        assert_eq!(up[1], Some(vec![(2, 1.0)]));
        let down = a("nearest_neighbor", "asymmetric", "round_prefer_floor").taps(0, 3, 2);
        assert_eq!(down[1], Some(vec![(1, 1.0)]));
        // Cubic weights sum to 1.
        for tp in a("cubic", "half_pixel", "round").taps(0, 5, 7) {
            let s: f64 = tp.unwrap_or_default().iter().map(|t| t.1).sum();
            assert!((s - 1.0).abs() < 1e-12);
        }
        // tf_crop_and_resize: a roi past the end of the input gives no taps (extrapolated).
        let mut crop = a("linear", "tf_crop_and_resize", "round");
        crop.roi = [F64(0.5), F64(0.0), F64(1.5), F64(0.0)];
        let t = crop.taps(0, 4, 3);
        assert!(t[0].is_some());
        assert!(t[2].is_none());
    }

    /// `taps` of one output position, weights rounded to 1e-9 for comparison.
    fn close(got: &Taps, want: &[(usize, f64)]) -> bool {
        got.as_ref().is_some_and(|g| {
            g.len() == want.len()
                && g.iter()
                    .zip(want)
                    .all(|(a, b)| a.0 == b.0 && (a.1 - b.1).abs() < 1e-9)
        })
    }

    #[test]
    fn onnx_scales_symmetric_mode_and_antialias_follow_onnx_formulas() {
        let a = |method: &str, mode: &str| Resize2dAttrs {
            roi: [F64(0.0); 4],
            layout: "NCHW".into(),
            method: method.into(),
            coordinate_transformation_mode: mode.into(),
            rounding_method: "round_prefer_floor".into(),
            cubic_alpha: F64(-0.75),
            cubic_exclude: 0,
            extrapolation_value: F64(0.0),
            out_dtype: None,
            scale: Some([F64(0.6), F64(0.6)]),
            antialias: false,
        };
        // ONNX: scale 0.6 on 2 pixels gives floor(1.2) = 1 output at x = 0.5 / 0.6 - 0.5 = 1/3
        // (the size ratio would put it at 0.5).
        let t = a("linear", "half_pixel").taps(0, 2, 1);
        assert!(close(&t[0], &[(0, 2.0 / 3.0), (1, 1.0 / 3.0)]), "{t:?}");
        // half_pixel_symmetric shifts by (2 / 2) · (1 − 1 / 1.2) = 1/6: x = 1/2.
        let t = a("linear", "half_pixel_symmetric").taps(1, 2, 1);
        assert!(close(&t[0], &[(0, 0.5), (1, 0.5)]), "{t:?}");
        // Without `scale` the symmetric mode is half_pixel.
        let mut plain = a("linear", "half_pixel_symmetric");
        plain.scale = None;
        let mut hp = a("linear", "half_pixel");
        hp.scale = None;
        assert_eq!(plain.taps(0, 2, 4), hp.taps(0, 2, 4));
        // Antialiased linear 4 → 2 (scale 0.5), output 0 at x = 0.5: the triangle of half
        // width 2 over pixels −1..=2 weighs 0.25, 0.75, 0.75, 0.25 (sum 2), the edge repeating.
        let mut aa = a("linear", "half_pixel");
        aa.scale = None;
        aa.antialias = true;
        let t = aa.taps(0, 4, 2);
        assert!(
            close(&t[0], &[(0, 0.125), (0, 0.375), (1, 0.375), (2, 0.125)]),
            "{t:?}"
        );
        // With exclude_outside the pixel past the edge is dropped: 0.75, 0.75, 0.25 over 1.75.
        aa.cubic_exclude = 1;
        let t = aa.taps(0, 4, 2);
        assert!(
            close(
                &t[0],
                &[(0, 0.0), (0, 3.0 / 7.0), (1, 3.0 / 7.0), (2, 1.0 / 7.0)]
            ),
            "{t:?}"
        );
        // A size that does not follow from the scale is refused.
        let six = a("linear", "half_pixel");
        assert!(six.check_extent(0, 10, 6).is_ok());
        let e = six.check_extent(1, 10, 1000).err().unwrap_or_default();
        assert!(e.contains("gives 6 outputs, the size asks for 1000"), "{e}");
        assert!(six.check_extent(0, 9, 5).is_ok() && six.check_extent(0, 9, 7).is_err());
        // Upsampling is not antialiased; cubic antialiased weights sum to 1.
        aa.cubic_exclude = 0;
        assert_eq!(aa.taps(0, 2, 4), hp.taps(0, 2, 4));
        aa.method = "cubic".into();
        for tp in aa.taps(0, 9, 4) {
            let tp = tp.unwrap_or_default();
            assert!(tp.len() > 4, "{tp:?}");
            let s: f64 = tp.iter().map(|t| t.1).sum();
            assert!((s - 1.0).abs() < 1e-12, "{tp:?}");
        }
    }
}
