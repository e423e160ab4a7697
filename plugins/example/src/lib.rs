//! An example third-party plugin: the `example` backend claims `conv2d (+ bias) (+ relu)`
//! composites and runs them with its own fused direct-convolution kernel, applying the bias and
//! relu epilogue to each output plane while it is still in cache (one pass over the output
//! instead of three ops each reading and writing the whole tensor).
//!
//! Contract: patterns `example.conv2d_bias_relu`, `example.conv2d_relu`, `example.conv2d`
//! (most specific first, each with `no_leaking_intermediates`). `claim` accepts a function whose
//! composites are all `example.*` and whose conv is `float32`, `NCHW`/`OIHW`, `groups = 1`, and
//! whose bias (if any) has one value per output channel; otherwise it declines saying which
//! condition failed. No dependency on fusebox-cpu's kernels.
//!
//! ```toml
//! [[plugin]]
//! path = "target/debug/libfusebox_plugin_conv2d.so"
//! [[backend]]
//! name = "example"
//! ```

use fusebox_core::ir::{Callee, ExprKind, Function, Module};
use fusebox_core::op::Op;
use fusebox_plugin_abi::sdk::{OwnedTensor, Plugin, PluginArtifact, TensorView, Verdict};
use std::ffi::CStr;

/// The plugin.
pub struct Conv2dPlugin;

/// A compiled composite: conv attributes, which parameters feed what, and the epilogue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusedConv {
    /// (h, w) strides.
    pub strides: [usize; 2],
    /// (top, left, bottom, right) padding.
    pub padding: [usize; 4],
    /// (h, w) dilation.
    pub dilation: [usize; 2],
    /// Parameter indices of data, weight and bias.
    pub data: usize,
    /// See `data`.
    pub weight: usize,
    /// See `data`.
    pub bias: Option<usize>,
    /// Whether relu follows.
    pub relu: bool,
}

const PATTERNS: &CStr = c"[[pattern]]
name = \"example.conv2d_bias_relu\"
pattern = \"relax.nn.relu(relax.add(relax.nn.conv2d(_, _), _))\"
priority = 30
check = \"no_leaking_intermediates\"
[[pattern]]
name = \"example.conv2d_relu\"
pattern = \"relax.nn.relu(relax.nn.conv2d(_, _))\"
priority = 20
check = \"no_leaking_intermediates\"
[[pattern]]
name = \"example.conv2d\"
pattern = \"relax.nn.conv2d(_, _)\"
priority = 10
";

impl Plugin for Conv2dPlugin {
    const NAME: &'static CStr = c"example";
    const VERSION: &'static CStr = c"0.1.0";
    const PATTERNS: &'static CStr = PATTERNS;
    type Artifact = FusedConv;

    fn create(options_toml: &str) -> Result<Self, String> {
        if !options_toml.trim().is_empty() {
            return Err(format!(
                "the example backend takes no options, got: {}",
                options_toml.trim()
            ));
        }
        Ok(Conv2dPlugin)
    }

    fn claim(&self, module_text: &str, func: &str) -> Result<Verdict, String> {
        Ok(match analyse(module_text, func) {
            Ok(_) => Verdict::Accept,
            Err(reason) => Verdict::Decline(reason),
        })
    }

    fn compile(&self, module_text: &str, func: &str) -> Result<FusedConv, String> {
        analyse(module_text, func)
    }
}

fusebox_plugin_abi::export_plugin!(Conv2dPlugin);

/// The innermost composite of `f` (itself, or a local function inside a `Codegen` wrapper)
/// and, for a wrapper, the map from composite parameter to wrapper parameter.
fn composite(f: &Function) -> Result<(&Function, Vec<usize>), String> {
    if let Some(c) = &f.attrs.composite {
        if !c.starts_with("example.") {
            return Err(format!(
                "composite `{c}` is not one of the example patterns"
            ));
        }
        return Ok((f, (0..f.params.len()).collect()));
    }
    let mut inner = None;
    let mut call_args = None;
    for b in f.bindings() {
        match &f.expr(b.value).kind {
            ExprKind::Function(g) => {
                if inner.is_some() {
                    return Err("more than one composite inside (a merged region)".into());
                }
                inner = Some(g.as_ref());
            }
            ExprKind::Call {
                callee: Callee::Local(_),
                args,
            } => call_args = Some(args.clone()),
            _ => {}
        }
    }
    let (Some(g), Some(args)) = (inner, call_args) else {
        return Err("not a composite function".into());
    };
    let (g, _) = composite(g)?;
    let map = args
        .iter()
        .map(|&a| {
            f.as_var(a)
                .and_then(|v| f.params.iter().position(|p| *p == v))
                .ok_or_else(|| "the wrapper passes something other than its parameters".to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((g, map))
}

fn to_usize<const N: usize>(v: [i64; N], what: &str) -> Result<[usize; N], String> {
    let mut out = [0usize; N];
    for (o, x) in out.iter_mut().zip(v) {
        *o = usize::try_from(x).map_err(|_| format!("negative {what}"))?;
    }
    Ok(out)
}

/// Checks that `func` of the module is a composite this backend runs, and extracts its plan.
pub fn analyse(module_text: &str, func: &str) -> Result<FusedConv, String> {
    let m: Module = fusebox_core::text::parse_module_str(module_text)
        .map_err(|e| format!("cannot parse the function: {e}"))?;
    let f = m.get(func).ok_or_else(|| format!("no function `{func}`"))?;
    let (g, map) = composite(f)?;
    let param_of = |e| {
        g.as_var(e)
            .and_then(|v| g.params.iter().position(|p| *p == v))
            .and_then(|i| map.get(i).copied())
    };
    let mut conv = None;
    let mut bias = None;
    let mut relu = false;
    for b in g.bindings() {
        let ExprKind::Call {
            callee: Callee::Op(op),
            args,
        } = &g.expr(b.value).kind
        else {
            return Err("the composite has a binding that is not an op call".into());
        };
        match op {
            Op::Conv2d(a) => {
                if a.groups != 1 {
                    return Err(format!("conv2d with groups = {} (only 1)", a.groups));
                }
                if a.data_layout != "NCHW" || a.kernel_layout != "OIHW" || a.out_layout != "NCHW" {
                    return Err(format!(
                        "conv2d layouts {}/{}/{} (only NCHW/OIHW/NCHW)",
                        a.data_layout, a.kernel_layout, a.out_layout
                    ));
                }
                let (Some(d), Some(w)) = (
                    args.first().and_then(|&x| param_of(x)),
                    args.get(1).and_then(|&x| param_of(x)),
                ) else {
                    return Err(
                        "conv2d data or weight is not a parameter (a bound constant?)".into(),
                    );
                };
                for &x in args.iter().take(2) {
                    let dt = g.expr(x).ty.as_tensor().and_then(|t| t.dtype);
                    if dt != Some(fusebox_core::ir::DType::F32) {
                        return Err(format!("conv2d operand of dtype {dt:?} (only float32)"));
                    }
                }
                conv = Some((a.clone(), d, w));
            }
            Op::Add => {
                let other = args
                    .iter()
                    .find_map(|&x| param_of(x))
                    .ok_or_else(|| "the bias is not a parameter".to_string())?;
                bias = Some(other);
            }
            Op::Relu => relu = true,
            other => return Err(format!("op {} is not conv2d, add or relu", other.name())),
        }
    }
    let (a, data, weight) = conv.ok_or_else(|| "no conv2d inside".to_string())?;
    Ok(FusedConv {
        strides: to_usize(a.strides, "stride")?,
        padding: to_usize(a.padding, "padding")?,
        dilation: to_usize(a.dilation, "dilation")?,
        data,
        weight,
        bias,
        relu,
    })
}

impl PluginArtifact for FusedConv {
    fn run(&self, args: &[TensorView<'_>]) -> Result<OwnedTensor, String> {
        let get = |i: usize, what: &str| {
            let t = args
                .get(i)
                .ok_or_else(|| format!("missing argument {i} ({what})"))?;
            let d = t
                .as_f32()
                .ok_or_else(|| format!("{what} is not a contiguous float32 CPU tensor"))?;
            Ok::<_, String>((t.shape.as_slice(), d))
        };
        let (xs, x) = get(self.data, "data")?;
        let (ws, w) = get(self.weight, "weight")?;
        let bias = match self.bias {
            Some(i) => Some(get(i, "bias")?),
            None => None,
        };
        conv2d_fused(self, xs, x, ws, w, bias.map(|b| b.1))
    }
}

/// The fused kernel: NCHW/OIHW convolution as im2col + SGEMM, the output channels split across
/// the machine's threads, with bias and relu applied to each output plane right after its GEMM.
pub fn conv2d_fused(
    p: &FusedConv,
    xs: &[usize],
    x: &[f32],
    ws: &[usize],
    w: &[f32],
    bias: Option<&[f32]>,
) -> Result<OwnedTensor, String> {
    let [n, c, h, wd] = <[usize; 4]>::try_from(xs).map_err(|_| "data must be 4-d")?;
    let [k, wc, kh, kw] = <[usize; 4]>::try_from(ws).map_err(|_| "weight must be 4-d")?;
    if wc != c {
        return Err(format!("weight has {wc} input channels, data has {c}"));
    }
    let [sh, sw] = p.strides;
    let [pt, pl, pb, pr] = p.padding;
    let [dh, dw] = p.dilation;
    if sh == 0 || sw == 0 || dh == 0 || dw == 0 {
        return Err("zero stride or dilation".into());
    }
    let eh = dh * (kh.max(1) - 1) + 1;
    let ew = dw * (kw.max(1) - 1) + 1;
    if h + pt + pb < eh || wd + pl + pr < ew {
        return Err("the kernel is larger than the padded input".into());
    }
    let oh = (h + pt + pb - eh) / sh + 1;
    let ow = (wd + pl + pr - ew) / sw + 1;
    if let Some(b) = bias
        && b.len() != k
    {
        return Err(format!(
            "the bias has {} values; this kernel needs one per output channel ({k})",
            b.len()
        ));
    }
    // im2col + one SGEMM per image (ndarray's `general_mat_mul`, i.e. matrixmultiply's packed
    // kernel), then the epilogue (bias, relu) in one pass over each output plane while it is
    // still in cache. Separate ops would make one more full pass over the output per op.
    let kdim = c * kh * kw;
    let pix = oh * ow;
    let mut out = vec![0f32; n * k * pix];
    let mut col = vec![0f32; kdim * pix];
    let wm = ndarray::ArrayView2::from_shape((k, kdim), w).map_err(|e| e.to_string())?;
    for ni in 0..n {
        let xin = &x[ni * c * h * wd..][..c * h * wd];
        for ci in 0..c {
            for r in 0..kh {
                for s in 0..kw {
                    let row0 = ((ci * kh + r) * kw + s) * pix;
                    let crow = &mut col[row0..][..pix];
                    let off = (s * dw) as isize - pl as isize;
                    for oy in 0..oh {
                        let iy = (oy * sh + r * dh) as isize - pt as isize;
                        let dst = &mut crow[oy * ow..][..ow];
                        if iy < 0 || iy >= h as isize {
                            dst.iter_mut().for_each(|v| *v = 0.0);
                            continue;
                        }
                        let src = &xin[(ci * h + iy as usize) * wd..][..wd];
                        for (ox, d) in dst.iter_mut().enumerate() {
                            let ix = (ox * sw) as isize + off;
                            *d = if ix >= 0 && (ix as usize) < wd {
                                src[ix as usize]
                            } else {
                                0.0
                            };
                        }
                    }
                }
            }
        }
        let cm = ndarray::ArrayView2::from_shape((kdim, pix), &col).map_err(|e| e.to_string())?;
        let oslice = &mut out[ni * k * pix..][..k * pix];
        // Output channels are split across the machine's threads; each thread runs the GEMM for
        // its rows and applies the epilogue to them while they are in its cache.
        let threads = std::thread::available_parallelism()
            .map_or(1, |t| t.get())
            .clamp(1, k.max(1));
        let rows = k.div_ceil(threads);
        let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = oslice
                .chunks_mut(rows * pix)
                .enumerate()
                .map(|(t, chunk)| {
                    let (wm, cm) = (&wm, &cm);
                    scope.spawn(move || -> Result<(), String> {
                        let k0 = t * rows;
                        let nk = chunk.len() / pix;
                        let wpart = wm.slice(ndarray::s![k0..k0 + nk, ..]);
                        let mut om = ndarray::ArrayViewMut2::from_shape((nk, pix), &mut *chunk)
                            .map_err(|e| e.to_string())?;
                        ndarray::linalg::general_mat_mul(1.0, &wpart, cm, 0.0, &mut om);
                        for (i, plane) in chunk.chunks_mut(pix).enumerate() {
                            let b = bias.map_or(0.0, |b| b[k0 + i]);
                            if p.relu {
                                plane.iter_mut().for_each(|v| *v = (*v + b).max(0.0));
                            } else if bias.is_some() {
                                plane.iter_mut().for_each(|v| *v += b);
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("a kernel thread panicked".into()))
                })
                .collect()
        });
        results.into_iter().collect::<Result<(), String>>()?;
    }
    Ok(OwnedTensor {
        shape: vec![n, k, oh, ow],
        data: out,
    })
}
