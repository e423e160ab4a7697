//! `conv2d` in any permutation of `NCHW` (data, output) and `OIHW` (kernel), with strides,
//! padding (top, left, bottom, right), dilation and groups; and [`conv2d_fused`], the same
//! convolution with an epilogue ([`Step`]s: inference `batch_norm`, a per-channel bias `add`,
//! a residual `add` of a tensor of the output's shape, `relu`, `clip`, an elementwise program of
//! [`crate::elem_program`]) applied while each output tile
//! is in cache.
//!
//! Contract:
//!
//! - The data and kernel are brought to `NCHW`/`OIHW`. A 3×3 kernel with stride 1, dilation
//!   1 and one group, on enough channels and pixels, runs as Winograd F(2×2, 3×3) or, where
//!   its weights are small and its tiles many, F(4×4, 3×3) ([`crate::winograd`]: 16 or 36
//!   GEMMs on transformed tiles, 2.25× or 4× fewer multiply-adds); the executor transforms a
//!   constant weight once ([`winograd_weights`]).
//! - Otherwise, per (image, group) the convolution is a GEMM `(O/g) × (C/g · KH · KW)` weights
//!   by a `(C/g · KH · KW) × (OH · OW)` matrix: the data itself for a 1×1 kernel with stride
//!   1 and no padding, else its im2col lowering, made per column tile by the thread that
//!   multiplies it (so it stays in that core's cache), or whole with its rows spread over the
//!   threads when the output is one column tile. The GEMM is
//!   [`crate::matmul::gemm_f32_tiled`] (`faer`'s GEMM on tiles of the output, spread over
//!   [`crate::par::threads`]); a grouped convolution spreads its groups instead.
//! - With AVX-512, a 1×1 kernel (stride 1, no padding) of at most 32 input channels on a plane
//!   of 28×28 or more, whose epilogue has one of the shapes [`epilogue::RegSteps`] takes
//!   (bias or `batch_norm`, residual, `relu` or `clip`; others keep the GEMM above), runs its
//!   own micro-kernel instead ([`pointwise`]: the data read in place, the epilogue applied to
//!   the sums in registers, each output stored once); with so few input
//!   channels the output is as large as the work, and a separate pass over it cost a fifth
//!   of MobileNetV2's 16 → 96 layer on 112×112 (0.588 → 0.503 ms, one thread). On CPUs
//!   whose 16-lane FMAs issue at full rate, 1×1 kernels of more input channels on planes of
//!   14×14 or more run there too, the reduction in chunks that stay in L1 (MobileNetV2's such
//!   layers 0.84–0.97 of `faer`'s time on one thread, bench/RESULTS.md, session bd).
//! - On output planes of up to 64 pixels (ResNet's and MobileNet's 7×7 layers) with AVX-512,
//!   the GEMM runs with the output channels on the vector lanes instead
//!   ([`crate::gemm_packed::gemm_cols`], the weight transposed and packed once per constant
//!   weight: [`cols_weights`]): a 49-pixel row wastes a quarter of `faer`'s four 16-lane
//!   vectors, 48 channels fill three. On Zen 4, 1×1 layers of at least 384 input channels on
//!   planes of up to 14×14 run there too (MobileNetV2's 576 → 96, ResNet-50's 1024 → 256: the
//!   long reduction pays for the transposed write-back); on CPUs that issue two 16-lane FMAs a
//!   cycle they stay on `faer` ([`long_1x1_cpu`]). Stride-1 kernels read the zero-padded
//!   image in place (no im2col matrix, whose 5–7-value copies took a quarter of a 3×3
//!   layer's time there), and stride-2 3×3 kernels the image dealt into its four phases.
//!   The epilogue's leading per-channel steps (`batch_norm`, bias, `relu`, `clip`) run on
//!   each block of sums before it is written back ([`epilogue::apply_channel_steps`]), the
//!   rest (a residual, a program) on the rows after: MobileNetV2's 160 → 960 7×7 layers
//!   0.625 → 0.581 ms for three calls (one thread), the same bits.
//!   ResNet-50's 512×7×7 3×3 layer, one node, 2 threads: 1.53 → 1.32 ms (onnxruntime
//!   0.98); with its weights streamed from memory (`bench/conv_chain.py 512 7 3 8 512`):
//!   19.0 → 11.5 ms for eight (onnxruntime 10.0). Such 3×3 layers of 256 channels or more
//!   now run as Winograd F(2×2, 3×3) instead (the eight 10.7 → 8.7 ms, onnxruntime 9.3).
//! - With AVX-512, a stride-2 convolution with few taps per output (`C · KH · KW` ≤ 160, rows
//!   of 16 pixels or more: a CNN's first layer) runs directly ([`crate::conv_stem`]: each
//!   input row dealt into its even and odd columns, 16 output channels per vector of
//!   pixels), without an im2col matrix: MobileNetV2 one thread 9.02 → 8.91 ms, ResNet-50
//!   78.1 → 77.7 ms. A depthwise convolution (one input channel per group) runs per plane:
//!   stride-2 3×3 layers read straight from the plane with AVX-512 or AVX2
//!   ([`crate::depthwise_s2`]), the others through [`crate::depthwise_flat`] or a row kernel.
//! - With narrower vectors (AVX2), a one-group kernel of several taps with `C · KH · KW` ≥
//!   [`ROWS_MIN_STEPS`] (ResNet-50's stride-2 3×3 layers of 256 and 512 channels) runs as
//!   `yᵀ = xᵀ · wᵀ` on the packed GEMM ([`crate::gemm_packed::gemm_src`]: the pixels read
//!   through [`cols_source`] as its rows, the weight transposed and packed once per constant
//!   weight by [`cols_weights`], the `NCHW` output written tile by tile, the epilogue on each
//!   tile's channel rows): 0.93–0.94 of their time on `faer` (two threads, a 2-core AMD EPYC).
//! - `NHWC` data with an `NHWC` output (what ConvertLayout makes for `conv2d_layout =
//!   ["NHWC", ...]`) runs in that layout ([`nhwc`]: 1×1 layers on the packed GEMM, depthwise
//!   ones with the channels on the vector lanes, others through an `NHWC` im2col), fused chains
//!   included. `NCHW16c` data with an `NCHW16c` output and an `OIHW` weight runs in that layout
//!   where the channels split into blocks of 16: one-group convolutions in [`blocked`] (or
//!   [`blocked_winograd`]), depthwise ones in [`blocked_depthwise`], each with its epilogue in
//!   registers; other layouts are transposed to `NCHW` and back.
//! - The result is bit-identical for every thread count, and the same whether the weight's
//!   Winograd transform or packed copy was cached or not.
//! - Float dtypes compute in `f32` (`float64` too) and round once to `out_dtype` (default: the
//!   data's dtype); integer inputs are an error.
//! - Each [`Step`] repeats the arithmetic of the op it replaces element by element (one `f32`
//!   fused multiply-add per element for `batch_norm`, as its `float32` kernel does; `f32` for
//!   `add` (a per-channel bias or a residual of the output's shape) in its operand order,
//!   `relu` keeping NaN), so a fused result is bit-identical to running the ops one by one.
//!   [`conv2d_fused`] needs a `float32` result in `NCHW`; the executor checks that before
//!   fusing.
//!
//! ```text
//! y: R.Tensor((1, 8, 16, 16), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1],
//!     padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW",
//!     kernel_layout="OIHW", out_layout="NCHW", out_dtype=None)
//! ```

use crate::conv_stem;
use crate::matmul::{Rhs, gemm_f32_tiled};
use crate::nn::layout4;
use crate::util::{KResult, from_canonical, tensor, to_canonical};
use crate::winograd;

mod blocked;
mod blocked_depthwise;
mod blocked_winograd;

/// The split layout of the blocked kernels (`NCHW16c`) and its block of channels.
pub(crate) use blocked::{blocks_for as blocked_blocks, layout as blocked_layout};
mod depthwise;
mod epilogue;
mod nhwc;
mod pointwise;
#[cfg(test)]
use crate::{depthwise_flat, depthwise_s2};
use depthwise::depthwise;
#[cfg(test)]
use depthwise::{FORCE_LANES, Padded, depthwise_flat_planes, depthwise_planes, flat_plan};
pub(crate) use epilogue::{Step, relu};
use epilogue::{apply_channel_steps, apply_steps, apply_steps_inline, channel_prefix};
use fusebox_core::ir::DType;
use fusebox_core::op::{Conv2dAttrs, IndexMap, Layout};
use fusebox_core::runtime::{StorageRef, Tensor};
use std::borrow::Cow;
use std::cell::RefCell;

fn pos(v: i64, what: &str) -> KResult<usize> {
    usize::try_from(v).map_err(|_| format!("invalid {what} {v}"))
}

/// The sizes of one convolution (canonical layouts).
#[derive(Clone, Copy, Debug)]
struct Geom {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    ci: usize,
    kh: usize,
    kw: usize,
    g: usize,
    sh: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    pt: usize,
    pl: usize,
    oh: usize,
    ow: usize,
}

impl Geom {
    fn kdim(&self) -> usize {
        self.ci * self.kh * self.kw
    }
    fn npix(&self) -> usize {
        self.oh * self.ow
    }
    /// One plane's geometry as the depthwise plane kernels take it
    /// ([`crate::depthwise_flat::Shape`]).
    fn plane_shape(&self) -> crate::depthwise_flat::Shape {
        [
            self.h, self.w, self.kh, self.kw, self.sh, self.sw, self.dh, self.dw, self.pt, self.pl,
            self.oh, self.ow,
        ]
    }
    /// The Winograd variant of a 3×3 kernel, stride 1, dilation 1, one group, of a size where
    /// Winograd pays ([`winograd::Tile::choose`]).
    fn winograd_tile(&self) -> Option<winograd::Tile> {
        let plain = self.g == 1
            && (self.kh, self.kw, self.sh, self.sw, self.dh, self.dw) == (3, 3, 1, 1, 1, 1);
        plain
            .then(|| winograd::Tile::choose(self.c, self.o, self.oh, self.ow))
            .flatten()
    }
    /// The Winograd tiles of one image in variant `tile`.
    fn winograd_tiles(&self, tile: winograd::Tile) -> usize {
        tile.tiles(self.oh, self.ow)
    }
    /// Whether the convolution runs as Winograd ([`Geom::winograd_tile`]).
    fn winograd(&self) -> bool {
        self.winograd_tile().is_some()
    }
    /// One group, stride 2, dilation 1 and few taps per output, where [`conv_stem`] takes it
    /// (not where a test forces the GEMM paths).
    fn stem(&self) -> Option<conv_stem::Shape> {
        let s = conv_stem::Shape {
            c: self.c,
            h: self.h,
            w: self.w,
            o: self.o,
            kh: self.kh,
            kw: self.kw,
            pt: self.pt,
            pl: self.pl,
            oh: self.oh,
            ow: self.ow,
        };
        let fits = self.g == 1 && (self.sh, self.sw, self.dh, self.dw) == (2, 2, 1, 1);
        (fits && !no_stem() && s.takes()).then_some(s)
    }
    /// One group, no Winograd path, and an output plane of at most [`COLS_PIXELS`] pixels —
    /// or a larger one of a kernel of several taps with at least [`COLS_MIN_STEPS`] steps of
    /// `k` ([`COLS_MIN_STEPS_S1`] at stride 1), read in place from its phases
    /// ([`Geom::reads_phases`]), or of a 1×1 kernel with at least [`COLS_MIN_STEPS_1X1`] input
    /// channels on up to [`COLS_PIXELS_1X1`] pixels where that pays ([`long_1x1_cpu`]) — on
    /// a CPU with 16-lane vectors: the GEMM runs with the output channels on the lanes
    /// ([`crate::gemm_packed::gemm_cols`], the weight packed transposed: [`cols_weights`]).
    fn packs(&self) -> bool {
        let npix = self.npix();
        let bound = if (self.sh, self.sw) == (1, 1) {
            COLS_MIN_STEPS_S1
        } else {
            COLS_MIN_STEPS
        };
        let long = self.kdim() >= bound && self.kh * self.kw > 1 && self.reads_phases();
        let long_1x1 = self.direct()
            && npix <= COLS_PIXELS_1X1
            && self.kdim() >= COLS_MIN_STEPS_1X1
            && long_1x1_cpu();
        self.g == 1
            && !self.winograd()
            && npix > 0
            && (npix <= COLS_PIXELS || long || long_1x1)
            && self.kdim() > 0
            && cols_lanes()
    }
    /// One group, no Winograd, column-kernel or stem path, a kernel of several taps with at
    /// least [`ROWS_MIN_STEPS`] steps of `k`, at least [`crate::gemm_packed::MIN_ROWS`]
    /// output pixels, on a CPU whose packed GEMM reads `A` through a source
    /// ([`crate::gemm_packed::takes_src`]: narrower than AVX-512): the convolution runs as
    /// `yᵀ = xᵀ · wᵀ` on that GEMM ([`crate::gemm_packed::gemm_src`], the pixels as rows read
    /// through [`cols_source`], the transposed weight packed once: [`cols_weights`]) instead
    /// of on `faer`, which packs the weight on every call.
    fn rows(&self) -> bool {
        self.g == 1
            && !self.winograd()
            && !self.packs()
            && self.stem().is_none()
            && self.npix() >= crate::gemm_packed::MIN_ROWS
            && self.kh * self.kw > 1
            && self.kdim() >= ROWS_MIN_STEPS
            && crate::gemm_packed::takes_src()
    }
    /// Whether [`cols_source`] reads the data in place from its zero-padded phases (every
    /// phase of the stride read by some tap, and the output rows whole blocks of
    /// [`crate::gemm_packed::cols_rows`] pixels) rather than from an im2col matrix.
    fn reads_phases(&self) -> bool {
        let every_phase = self.kh.saturating_sub(1) * self.dh + 1 >= self.sh
            && self.kw.saturating_sub(1) * self.dw + 1 >= self.sw;
        every_phase
            && self
                .ow
                .is_multiple_of(crate::gemm_packed::cols_rows(self.npix()))
    }
    /// A 1×1 kernel, stride 1, no padding: the data is the GEMM's right operand as it is.
    fn direct(&self) -> bool {
        self.kh == 1
            && self.kw == 1
            && self.sh == 1
            && self.sw == 1
            && self.pt == 0
            && self.pl == 0
            && self.oh == self.h
            && self.ow == self.w
    }
}

fn geometry(x: &[usize], wt: &[usize], a: &Conv2dAttrs) -> KResult<Geom> {
    let (n, c, h, wd) = (x[0], x[1], x[2], x[3]);
    let (o, ci, kh, kw) = (wt[0], wt[1], wt[2], wt[3]);
    let g = pos(a.groups, "groups")?;
    if g == 0 || ci * g != c || o % g != 0 {
        return Err(format!(
            "data has {c} channels and the weight {wt:?} with groups={g}: expected C = I * \
             groups and O divisible by groups"
        ));
    }
    let [sh, sw] = [pos(a.strides[0], "stride")?, pos(a.strides[1], "stride")?];
    let [dh, dw] = [
        pos(a.dilation[0], "dilation")?,
        pos(a.dilation[1], "dilation")?,
    ];
    let [pt, pl, pb, pr] = [
        pos(a.padding[0], "padding")?,
        pos(a.padding[1], "padding")?,
        pos(a.padding[2], "padding")?,
        pos(a.padding[3], "padding")?,
    ];
    if sh == 0 || sw == 0 || dh == 0 || dw == 0 {
        return Err("strides and dilation must be at least 1".to_string());
    }
    let ekh = kh.saturating_sub(1) * dh + 1;
    let ekw = kw.saturating_sub(1) * dw + 1;
    let (ph, pw) = (h + pt + pb, wd + pl + pr);
    if kh == 0 || kw == 0 || ph < ekh || pw < ekw {
        return Err(format!(
            "the kernel ({kh}x{kw}, dilated {ekh}x{ekw}) does not fit the padded input \
             ({ph}x{pw})"
        ));
    }
    let (oh, ow) = ((ph - ekh) / sh + 1, (pw - ekw) / sw + 1);
    Ok(Geom {
        n,
        c,
        h,
        w: wd,
        o,
        ci,
        kh,
        kw,
        g,
        sh,
        sw,
        dh,
        dw,
        pt,
        pl,
        oh,
        ow,
    })
}

/// Checks the operands and returns the canonical data, weight, output layout and dtype.
fn prepare(
    x: &Tensor,
    w: &Tensor,
    a: &Conv2dAttrs,
) -> KResult<(Tensor, Tensor, [usize; 4], DType, Geom)> {
    if x.rank() != 4 || w.rank() != 4 {
        return Err(format!(
            "expected 4-D data and weight, found {:?} and {:?}",
            x.shape(),
            w.shape()
        ));
    }
    for (t, what) in [(x, "data"), (w, "weight")] {
        if !t.dtype().is_float() {
            return Err(format!(
                "expected {what} to have a float dtype, found {}",
                t.dtype()
            ));
        }
    }
    if a.out_dtype.is_none() && x.dtype() != w.dtype() {
        return Err(format!(
            "expected data and weight of the same dtype, found {} and {}",
            x.dtype(),
            w.dtype()
        ));
    }
    let out_dtype = a.out_dtype.unwrap_or(x.dtype());
    let xc = to_canonical(x, layout4(&a.data_layout, "NCHW")?);
    let wc = to_canonical(w, layout4(&a.kernel_layout, "OIHW")?);
    let op = layout4(&a.out_layout, "NCHW")?;
    let geom = geometry(xc.shape(), wc.shape(), a)?;
    Ok((xc, wc, op, out_dtype, geom))
}

/// `conv2d(x, w)`.
pub(crate) fn conv2d(x: &Tensor, w: &Tensor, a: &Conv2dAttrs) -> KResult<Tensor> {
    if let Some(l) = split_layouts(a)? {
        return conv2d_split(x, w, a, &l);
    }
    if nhwc::takes(x, w, a) {
        return nhwc::conv2d(x, w, a, &[], None);
    }
    let (xc, wc, op, out_dtype, geom) = prepare(x, w, a)?;
    let out = compute(&xc, &wc, &geom, &[], Prepared::default())?;
    let shape = vec![geom.n, geom.o, geom.oh, geom.ow];
    let t = if out_dtype == DType::F32 {
        out.into_tensor(shape)?
    } else {
        tensor(shape, StorageRef::F32(&out).cast(out_dtype))?
    };
    Ok(from_canonical(&t, op))
}

/// Whether [`conv2d_fused`] can run this convolution: a `float32` result in `NCHW`, or an
/// `NHWC` convolution of the `NHWC` kernels ([`nhwc::takes`]).
pub(crate) fn fusable(x: &Tensor, w: &Tensor, a: &Conv2dAttrs) -> bool {
    nhwc::takes(x, w, a)
        || (a.out_dtype.unwrap_or(x.dtype()) == DType::F32
            && (a.out_dtype.is_some() || x.dtype() == w.dtype())
            && layout4(&a.out_layout, "NCHW").is_ok_and(|p| p == [0, 1, 2, 3]))
}

/// The shape of `conv2d(x, w)` as [`conv2d_fused`] gives it (`NCHW`; `NHWC` where
/// [`nhwc::takes`] it; `NCHW16c` where [`blocked_geom`] or [`blocked_depthwise_geom`] does) and the axes that index its
/// output channels, outer first (`[1]`, `[3]`, `[1, 4]`: channel `16 · c + l`).
pub(crate) fn out_dims(
    x: &Tensor,
    w: &Tensor,
    a: &Conv2dAttrs,
) -> KResult<(Vec<usize>, &'static [usize])> {
    if let Some(b) = blocked_geom(x, w, a).or_else(|| blocked_depthwise_geom(x, w, a)) {
        return Ok((blocked_out_shape(&b), &[1, 4]));
    }
    let g = shape_geometry(x, w, a)?.0;
    Ok(if nhwc::takes(x, w, a) {
        (vec![g.n, g.oh, g.ow, g.o], &[3])
    } else {
        (vec![g.n, g.o, g.oh, g.ow], &[1])
    })
}

/// The layouts of a convolution that splits an axis (`NCHW16c`): `None` when every layout is
/// a permutation of its letters (the paths above), an error when one does not parse.
fn split_layouts(a: &Conv2dAttrs) -> KResult<Option<[Layout; 3]>> {
    let parse = |l: &str, letters: &str| {
        Layout::parse(l, letters).ok_or_else(|| format!("invalid layout \"{l}\""))
    };
    let l = [
        parse(&a.data_layout, "NCHW")?,
        parse(&a.kernel_layout, "OIHW")?,
        parse(&a.out_layout, "NCHW")?,
    ];
    Ok((!l.iter().all(Layout::is_plain)).then_some(l))
}

/// The geometry of `conv2d(x, w)` when [`blocked::conv`] can run it (its epilogue aside:
/// [`blocked_steps`]): `NCHW16c` (or `NCHW8c`) output, data in the same layout or `NCHW` (a
/// first layer's 3 channels: [`blocked::Geom::nchw_input`]), an `OIHW` weight, one group,
/// `float32` throughout, output channels (and blocked input channels) that are multiples of
/// the block, on a CPU whose vectors run the block ([`blocked::block_fits`]: AVX-512 or AVX2
/// for 16, AVX2 for 8).
pub(crate) fn blocked_geom(x: &Tensor, w: &Tensor, a: &Conv2dAttrs) -> Option<blocked::Geom> {
    let b = blocked::block_of(&a.out_layout)?;
    let fits = a.kernel_layout == "OIHW"
        && a.groups == 1
        && a.out_dtype.is_none_or(|d| d == DType::F32)
        && x.dtype() == DType::F32
        && w.dtype() == DType::F32;
    let &[o, c, kh, kw] = w.shape() else {
        return None;
    };
    let (n, h, wd, ib) = match (a.data_layout.as_str(), x.shape()) {
        (l, &[n, cb, h, wd, lanes])
            if l == a.out_layout && lanes == b && cb.checked_mul(b) == Some(c) =>
        {
            (n, h, wd, b)
        }
        ("NCHW", &[n, xc, h, wd]) if xc == c => (n, h, wd, 1),
        _ => return None,
    };
    if !(fits && blocked::takes(o, c, [ib, b], &[])) {
        return None;
    }
    let g = blocked::Geom::new([n, c, h, wd], o, [kh, kw], a.strides, a.dilation, a.padding)?
        .with_block(b);
    Some(if ib == 1 { g.nchw_input() } else { g })
}

/// The geometry of `conv2d(x, w)` when [`blocked_depthwise::conv`] can run it (its epilogue
/// aside: [`blocked_steps`]): `NCHW16c` (or `NCHW8c`) data and output, an `OIHW` weight of
/// one input channel per group and as many groups as channels, `float32` throughout, the
/// channel count a multiple of the block.
pub(crate) fn blocked_depthwise_geom(
    x: &Tensor,
    w: &Tensor,
    a: &Conv2dAttrs,
) -> Option<blocked::Geom> {
    let b = blocked::block_of(&a.out_layout)?;
    let fits = a.data_layout == a.out_layout
        && a.kernel_layout == "OIHW"
        && a.out_dtype.is_none_or(|d| d == DType::F32)
        && x.dtype() == DType::F32
        && w.dtype() == DType::F32;
    let (&[n, cb, h, wd, lanes], &[o, 1, kh, kw]) = (x.shape(), w.shape()) else {
        return None;
    };
    let depthwise = usize::try_from(a.groups).ok() == Some(o) && cb.checked_mul(b) == Some(o);
    if !(fits && lanes == b && depthwise && blocked_depthwise::takes(o, b, &[])) {
        return None;
    }
    blocked::Geom::new([n, o, h, wd], o, [kh, kw], a.strides, a.dilation, a.padding)
        .map(|g| g.with_block(b))
}

/// Whether [`conv2d_fused`] runs `conv2d(x, w)` on a blocked kernel ([`blocked_geom`] or
/// [`blocked_depthwise_geom`]), whose epilogue is [`epilogue::RegSteps`]' alone.
pub(crate) fn runs_blocked(x: &Tensor, w: &Tensor, a: &Conv2dAttrs) -> bool {
    blocked_geom(x, w, a).is_some() || blocked_depthwise_geom(x, w, a).is_some()
}

/// [`blocked_depthwise::conv`] of `x` by `w` with `steps`.
fn blocked_depthwise_conv(
    x: &Tensor,
    w: &Tensor,
    g: &blocked::Geom,
    steps: &[Step],
    prepared: Option<&BlockedWeights>,
) -> KResult<Tensor> {
    let xd = x.as_f32().ok_or("expected float32 data")?;
    let wd = w.as_f32().ok_or("expected float32 weights")?;
    let shape = blocked_out_shape(g);
    check_steps(steps, g.o, &shape)?;
    let threads = crate::par::threads();
    let mut out = crate::par::scratch_f32(shape.iter().product());
    let packed = match prepared {
        Some(BlockedWeights::Depthwise { b, w }) if *b == g.block() => Some(&w[..]),
        _ => None,
    };
    blocked_depthwise::conv(wd, packed, xd, g, &mut out, threads, steps)?;
    out.into_tensor(shape)
}

fn blocked_out_shape(g: &blocked::Geom) -> Vec<usize> {
    let b = g.block();
    vec![g.n, g.o / b, g.oh, g.ow, b]
}

/// Whether [`blocked::conv`] applies these epilogue steps.
pub(crate) fn blocked_steps(steps: &[Step]) -> bool {
    epilogue::RegSteps::new(steps).is_some()
}

/// The weight of an `NCHW16c` (or `NCHW8c`) convolution as its kernel reads it: packed for
/// [`blocked::conv`], transformed for [`blocked_winograd::conv`] (3×3, stride 1, where
/// [`blocked_winograd::takes`]), or packed for [`blocked_depthwise::conv`] in blocks of `b`
/// channels (a depthwise layer's weight was packed by every call before: 1.5–2% of
/// MobileNetV2's run on the calling thread, session bg).
#[derive(Debug)]
pub(crate) enum BlockedWeights {
    Direct(blocked::Packed),
    Winograd(blocked_winograd::Weights),
    Depthwise { b: usize, w: Vec<f32> },
}

impl BlockedWeights {
    /// `w` prepared for the convolution of geometry `g`.
    fn new(w: &Tensor, g: &blocked::Geom) -> KResult<BlockedWeights> {
        let data = w.as_f32().ok_or("expected float32 weights")?;
        if blocked_winograd::takes(g) {
            return blocked_winograd::weights(data, g.o, g.c).map(BlockedWeights::Winograd);
        }
        direct_weights(data, g).map(BlockedWeights::Direct)
    }
}

/// `w` packed for [`blocked::conv`] on the convolution of geometry `g`.
fn direct_weights(w: &[f32], g: &blocked::Geom) -> KResult<blocked::Packed> {
    let taps = g.kernel().iter().product();
    blocked::pack(w, g.o, g.c, taps, [g.input_block(), g.block()])
        .ok_or_else(|| "blocked convolution: the weight does not fit its shape".to_string())
}

/// The weight of a [`blocked_geom`] or [`blocked_depthwise_geom`] convolution prepared for its
/// kernel ([`BlockedWeights`]).
pub(crate) fn blocked_weights(x: &Tensor, w: &Tensor, a: &Conv2dAttrs) -> Option<BlockedWeights> {
    if let Some(g) = blocked_geom(x, w, a) {
        return BlockedWeights::new(w, &g).ok();
    }
    let g = blocked_depthwise_geom(x, w, a)?;
    let taps = g.kernel().iter().product();
    let b = g.block();
    blocked_depthwise::pack(w.as_f32()?, g.o, taps, b).map(|w| BlockedWeights::Depthwise { b, w })
}

/// Checks that an epilogue fits a convolution of `channels` output channels and output
/// `shape`: per-channel values for each channel, a program and a residual (`float32`) of the
/// output's shape.
fn check_steps(steps: &[Step], channels: usize, shape: &[usize]) -> KResult<()> {
    for s in steps {
        if s.channels().is_some_and(|c| c != channels) {
            return Err(format!(
                "the epilogue has values for {:?} channels, the convolution has {channels}",
                s.channels(),
            ));
        }
        if let Step::Program(p) = s
            && p.0.shape() != shape
        {
            return Err(format!(
                "the epilogue's program gives shape {:?}, the convolution {shape:?}",
                p.0.shape(),
            ));
        }
        if let Step::Residual { r, .. } = s
            && (r.shape() != shape || r.as_f32().is_none())
        {
            return Err(format!(
                "the epilogue adds a {} tensor of shape {:?}, the convolution gives float32 \
                 {shape:?}",
                r.dtype(),
                r.shape(),
            ));
        }
    }
    Ok(())
}

/// [`blocked::conv`] or [`blocked_winograd::conv`] on `x`, with the prepared weight when
/// there is one.
fn blocked_conv(
    x: &Tensor,
    w: &Tensor,
    g: &blocked::Geom,
    steps: &[Step],
    prepared: Option<&BlockedWeights>,
) -> KResult<Tensor> {
    let own;
    let prepared = match prepared {
        Some(p) => p,
        None => {
            own = BlockedWeights::new(w, g)?;
            &own
        }
    };
    let xd = x.as_f32().ok_or("expected float32 data")?;
    let shape = blocked_out_shape(g);
    check_steps(steps, g.o, &shape)?;
    let threads = crate::par::threads();
    let mut out = crate::par::scratch_f32(shape.iter().product());
    match prepared {
        BlockedWeights::Winograd(wt) if blocked_winograd::takes(g) => {
            blocked_winograd::conv(wt, xd, g, &mut out, threads, steps)?
        }
        BlockedWeights::Direct(p) => blocked::conv(p, xd, g, &mut out, threads, steps)?,
        BlockedWeights::Winograd(_) | BlockedWeights::Depthwise { .. } => {
            // Prepared for a plane Winograd took (or, which the geometries rule out, a
            // depthwise layer); this one (another size) runs direct.
            let p = direct_weights(w.as_f32().ok_or("expected float32 weights")?, g)?;
            blocked::conv(&p, xd, g, &mut out, threads, steps)?
        }
    }
    out.into_tensor(shape)
}

/// A convolution in split layouts: [`blocked::conv`] where it runs, else the `NCHW`
/// convolution of the operands transformed to `NCHW` / `OIHW`, its result transformed to
/// `out_layout`.
fn conv2d_split(x: &Tensor, w: &Tensor, a: &Conv2dAttrs, l: &[Layout; 3]) -> KResult<Tensor> {
    if let Some(g) = blocked_geom(x, w, a) {
        return blocked_conv(x, w, &g, &[], None);
    }
    if let Some(g) = blocked_depthwise_geom(x, w, a) {
        return blocked_depthwise_conv(x, w, &g, &[], None);
    }
    let plain = |letters: &str| Layout::parse(letters, letters).ok_or("layout");
    let (nchw, oihw) = (plain("NCHW")?, plain("OIHW")?);
    let xc = crate::layout::layout_transform(x, &IndexMap::between(&l[0], &nchw)?)?;
    let wc = crate::layout::layout_transform(w, &IndexMap::between(&l[1], &oihw)?)?;
    let canon = Conv2dAttrs {
        data_layout: "NCHW".into(),
        kernel_layout: "OIHW".into(),
        out_layout: "NCHW".into(),
        ..a.clone()
    };
    let y = conv2d(&xc, &wc, &canon)?;
    crate::layout::layout_transform(&y, &IndexMap::between(&nchw, &l[2])?)
}

/// The geometry of `conv2d(x, w)` from the shapes alone (no data moved), with the kernel's
/// layout positions.
fn shape_geometry(x: &Tensor, w: &Tensor, a: &Conv2dAttrs) -> KResult<(Geom, [usize; 4])> {
    if x.rank() != 4 || w.rank() != 4 {
        return Err("expected 4-D data and weight".to_string());
    }
    let (xp, wp) = (
        layout4(&a.data_layout, "NCHW")?,
        layout4(&a.kernel_layout, "OIHW")?,
    );
    let xs: Vec<usize> = xp.iter().map(|&p| x.shape()[p]).collect();
    let ws: Vec<usize> = wp.iter().map(|&p| w.shape()[p]).collect();
    Ok((geometry(&xs, &ws, a)?, wp))
}

/// The forms of a constant weight the executor prepares once ([`winograd_weights`],
/// [`cols_weights`]); a convolution whose path reads one that is missing makes it per call.
#[derive(Clone, Copy, Default)]
pub(crate) struct Prepared<'a> {
    pub(crate) wino: Option<&'a winograd::Weights>,
    pub(crate) cols: Option<&'a crate::gemm_packed::PackedB>,
    pub(crate) blocked: Option<&'a BlockedWeights>,
}

/// `conv2d(x, w)` followed by `steps` on every output element (see the module doc).
pub(crate) fn conv2d_fused(
    x: &Tensor,
    w: &Tensor,
    a: &Conv2dAttrs,
    steps: &[Step],
    prepared: Prepared<'_>,
) -> KResult<Tensor> {
    if let Some(g) = blocked_geom(x, w, a) {
        return blocked_conv(x, w, &g, steps, prepared.blocked);
    }
    if let Some(g) = blocked_depthwise_geom(x, w, a) {
        return blocked_depthwise_conv(x, w, &g, steps, prepared.blocked);
    }
    if !fusable(x, w, a) {
        return Err(
            "a fused conv2d needs a float32 result in NCHW (or NHWC from NHWC data)".to_string(),
        );
    }
    let (out_shape, axes) = out_dims(x, w, a)?;
    let channels = axes.iter().map(|&i| out_shape[i]).product();
    check_steps(steps, channels, &out_shape)?;
    if axes == [3] {
        // `out_dims` found an NHWC convolution of the NHWC kernels.
        return nhwc::conv2d(x, w, a, steps, prepared.cols);
    }
    let (xc, wc, _, _, geom) = prepare(x, w, a)?;
    let out = compute(&xc, &wc, &geom, steps, prepared)?;
    out.into_tensor(out_shape.to_vec())
}

/// The most output pixels of a plane [`Geom::packs`] takes: 7×7 and 8×8. Measured on
/// ResNet-50 and MobileNetV2 (bench/RESULTS.md, session u): on 14×14 planes `faer`'s GEMM was
/// as fast (K = 1024) or faster (K = 64 to 576: MobileNetV2 6.3 against 5.6 ms), the
/// transposed write-back of each block then weighing on too few steps of `k`.
const COLS_PIXELS: usize = 64;

/// The fewest steps of `k` (`C · KH · KW`) for which [`Geom::packs`] takes a plane of more
/// than [`COLS_PIXELS`] pixels (kernels of several taps read from their phases): enough
/// steps per block for its transposed write-back to weigh little. ResNet-50's stride-2 3×3
/// layers (K = 1152 on 28×28, 2304 on 14×14), two threads, went from 1.368–1.409 ms to
/// 1.201–1.244 against `faer` on the im2col blocks; its stride-2 1×1 layers (K = 256 and
/// 512) gained nothing. One-layer models, two threads: 5×5 stride-1 layers with K = 1200 and
/// 1600 took 0.86 and 0.72–0.79 of their time, a stride-2 3×3 with K = 1728 0.94; below the
/// bound, stride-2 3×3 layers with K = 288 and 576 took 2.2–2.5 times theirs (5×5 ones with
/// K = 600 and 800 0.88–0.94), so the bound stays (bench/RESULTS.md, session y).
const COLS_MIN_STEPS: usize = 1024;

/// [`COLS_MIN_STEPS`] for stride-1 kernels (read from the padded image itself, no phases
/// dealt). One-layer models, two threads, against `faer` on im2col blocks: 5×5 layers with
/// K = 300 to 900 on 14×14 to 56×56 planes took 0.14–0.98 of their time in 26 of 27 shapes
/// (1.08 in the last), a 7×7 with K = 392 0.69–0.73, a dilated 3×3 with K = 576 0.88–0.91;
/// below, 5×5 layers with K = 75 to 200 took 0.96–1.59 and a dilated 3×3 with K = 288 1.26
/// (bench/RESULTS.md, session y).
const COLS_MIN_STEPS_S1: usize = 300;

/// The most output pixels of a plane on which [`Geom::packs`] takes a [`Geom::direct`] (1×1)
/// convolution of at least [`COLS_MIN_STEPS_1X1`] input channels: 14×14.
const COLS_PIXELS_1X1: usize = 196;

/// The fewest input channels of a 1×1 convolution on a plane of more than [`COLS_PIXELS`] and
/// at most [`COLS_PIXELS_1X1`] pixels that [`Geom::packs`] takes: a long enough reduction per
/// block for the transposed write-back to weigh little. Alternated runs, against `faer` on
/// the data in place (bench/RESULTS.md, session ad), sums over a model's calls: MobileNetV2's
/// 576 → 96 one thread 0.458 → 0.408 ms, two 0.243 → 0.216; 384 → 96 0.153 → 0.137 and 0.081
/// → 0.074; 384 → 64 0.325 → 0.302 on one thread, even on two; ResNet-50's 1024 → 256 two
/// threads 2.63 → 2.49–2.54 ms. Below it the column kernel lost — 96 → 576 0.698 → 0.792 ms,
/// 64 → 384 0.424 → 0.523 (one thread), ResNet-50's 256 → 1024 3.35 → 3.54 ms (two) — or
/// was even (192 → 64).
const COLS_MIN_STEPS_1X1: usize = 384;

/// Whether [`Geom::packs`] takes 1×1 kernels of [`COLS_MIN_STEPS_1X1`] input channels on
/// planes of more than [`COLS_PIXELS`] pixels on this CPU: where a 16-lane FMA runs at half
/// rate (Zen 4, where [`COLS_MIN_STEPS_1X1`] was measured; [`crate::simd::half_rate_fma512`]).
/// On a 5th-generation Xeon, two threads, ResNet-50's 1024 → 256 layers on 14×14 took 0.61 of
/// their time on `faer` instead, its 1024 → 512 0.74, the whole run 0.89 (median of per-round
/// ratios over 10 rounds; bench/RESULTS.md, session ao). A test forcing the column kernel
/// ([`cols_lanes`]) takes it on any CPU.
fn long_1x1_cpu() -> bool {
    #[cfg(test)]
    if FORCE_COLS.with(std::cell::Cell::get) {
        return true;
    }
    crate::simd::half_rate_fma512()
}

/// The fewest steps of `k` (`C · KH · KW`) of a kernel of several taps that [`Geom::rows`]
/// takes. Alternated per layer against `faer` on the im2col blocks (`bench/ab_layers.py`, two
/// threads, a 2-core AMD EPYC with AVX2; bench/RESULTS.md, session bs): ResNet-50's stride-2
/// 3×3 layers with K = 2304 took 0.85–0.90 of their time and with K = 4608 0.92–0.94, with K =
/// 1152 0.99–1.04; its 7×7 stem (K = 147) 1.41–1.83, and 1×1 layers (the data packed from
/// its channel rows, K = 64 to 2048) 1.00–2.05, so those stay on `faer`.
const ROWS_MIN_STEPS: usize = 2048;

/// Whether a test keeps [`conv_stem`] off (to reach the GEMM paths it would take).
fn no_stem() -> bool {
    #[cfg(test)]
    {
        NO_STEM.with(std::cell::Cell::get)
    }
    #[cfg(not(test))]
    {
        false
    }
}

#[cfg(test)]
thread_local! {
    /// [`no_stem`]'s switch.
    static NO_STEM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether [`Geom::packs`] may take a convolution on this CPU: with 16-lane vectors (AVX-512),
/// where it was measured; a test may force it on any instruction set.
fn cols_lanes() -> bool {
    #[cfg(test)]
    if FORCE_COLS.with(std::cell::Cell::get) {
        return true;
    }
    crate::simd::f32_lanes() >= 16
}

#[cfg(test)]
thread_local! {
    /// Tests: take [`Geom::packs`]'s path whatever the vector width.
    static FORCE_COLS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The transposed weight of `conv2d(x, w)` (`(C · KH · KW) × O`) packed for
/// [`crate::gemm_packed::gemm_cols`] or [`crate::gemm_packed::gemm_src`], when the
/// convolution runs that path ([`Geom::packs`], [`Geom::rows`]); `None` otherwise. Reads only
/// the shapes of `x`.
pub(crate) fn cols_weights(
    x: &Tensor,
    w: &Tensor,
    a: &Conv2dAttrs,
) -> Option<crate::gemm_packed::PackedB> {
    if let Some(g) = nhwc::packs(x, w, a) {
        return cols_pack(
            &f32s(&to_canonical(w, layout4(&a.kernel_layout, "OIHW").ok()?)),
            &g,
        )
        .ok();
    }
    if !fusable(x, w, a) || nhwc::takes(x, w, a) {
        return None;
    }
    // The geometry first (shapes only): most convolutions stop here, before any copy.
    let (g, wp) = shape_geometry(x, w, a).ok()?;
    if !w.dtype().is_float() {
        return None;
    }
    if g.packs() {
        cols_pack(&f32s(&to_canonical(w, wp)), &g).ok()
    } else if g.rows() {
        rows_pack(&f32s(&to_canonical(w, wp)), &g).ok()
    } else {
        None
    }
}

/// Runs `f` on the right operand of [`crate::gemm_packed::gemm_cols`] for image `x`: the data
/// itself for a 1×1 kernel with stride 1 and no padding; for other kernels whose output rows
/// divide into the kernel's pixel blocks and whose taps read every phase of the stride (stride
/// 1, or ResNet-50's 3×3 of stride 2), the image zero-padded and dealt into its phases once
/// (every tap then reads a block of pixels in place: its 512×14×14 stride-2 layer, one thread,
/// 2.54 → 2.35 ms against its im2col matrix); else the im2col matrix, its rows spread over the
/// threads.
fn cols_source(
    x: &[f32],
    g: &Geom,
    threads: usize,
    f: impl FnOnce(crate::gemm_packed::ColsSrc<'_>) -> KResult<()>,
) -> KResult<()> {
    use crate::gemm_packed::ColsSrc;
    let (kdim, npix) = (g.kdim(), g.npix());
    if g.direct() {
        let steps: Vec<usize> = (0..kdim).map(|p| p * npix).collect();
        let (row, pitch) = (npix, npix);
        return f(ColsSrc {
            data: x,
            steps: &steps,
            row,
            pitch,
        });
    }
    // Every phase of a strided kernel is read (a 3×3 kernel of stride 2: all four), so dealing
    // the image into them copies no value the taps do not read.
    if g.reads_phases() {
        // The image zero-padded and dealt into its `sh × sw` phases (padded row `r` to phase
        // row `r % sh`, position `r / sh`; columns alike; stride 1: the padded image itself):
        // tap `(ch, ky, kx)` of output pixel `(oy, ox)` then reads phase
        // `(ky·dh % sh, kx·dw % sw)` at `(oy + ky·dh / sh, ox + kx·dw / sw)`, one offset per
        // tap for every pixel, so each block of pixels is read in place.
        let (hp, wp) = (
            (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1,
            (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1,
        );
        let (hq, wq) = (hp.div_ceil(g.sh), wp.div_ceil(g.sw));
        let phases = g.sh * g.sw;
        fusebox_core::runtime::check_alloc(
            "the padded input of relax.nn.conv2d",
            DType::F32,
            &[g.c, phases, hq, wq],
        )
        .map_err(|e| e.to_string())?;
        let plane = phases * hq * wq;
        // Each tap's offset in a channel's phases (worked out once per tap: a division per
        // step of `k` cost a ResNet-50 7×7 layer 4% of its time), then per channel.
        let taps: Vec<usize> = (0..g.kh)
            .flat_map(|ky| {
                (0..g.kw).map(move |kx| {
                    let (ry, rx) = (ky * g.dh, kx * g.dw);
                    let phase = (ry % g.sh) * g.sw + rx % g.sw;
                    phase * hq * wq + (ry / g.sh) * wq + rx / g.sw
                })
            })
            .collect();
        let steps: Vec<usize> = (0..g.c)
            .flat_map(|ch| taps.iter().map(move |t| ch * plane + t))
            .collect();
        return crate::par::with_scratch(&COLUMNS, |pad| {
            // Each task zeroes and deals its own channels' planes. Done whole on the calling
            // thread first, they kept the other threads waiting: ResNet-50's 128 × 56×56
            // stride-2 layer alone, two threads, 1.393 → 1.265 ms (bench/RESULTS.md, session
            // am).
            pad.resize(g.c * plane, 0.0);
            let image = g.h * g.w;
            let per = (DEAL_ELEMS / plane.max(1)).max(1);
            let t = crate::par::threads_for(g.c * plane, DEAL_ELEMS).min(threads);
            crate::par::for_each_chunk_mut(pad, per * plane, t, |off, chunk| {
                chunk.fill(0.0);
                let ch = off / plane;
                let channels = chunk.len() / plane;
                deal_phases(
                    &x[ch * image..(ch + channels) * image],
                    g,
                    [hp, wp, hq, wq],
                    chunk,
                );
            });
            f(ColsSrc {
                data: pad,
                steps: &steps,
                row: g.ow,
                pitch: wq,
            })
        });
    }
    fusebox_core::runtime::check_alloc(
        "the im2col matrix of relax.nn.conv2d",
        DType::F32,
        &[kdim, npix],
    )
    .map_err(|e| e.to_string())?;
    crate::par::with_scratch(&COLUMNS, |col| {
        col.resize(kdim * npix, 0.0);
        let rows_per_task = (64 * 1024 / npix).max(1);
        let t = crate::par::threads_for(kdim * npix, 64 * 1024).min(threads);
        crate::par::for_each_chunk_mut(col, rows_per_task * npix, t, |off, c| {
            im2col(x, g, off / npix, 0, npix, c);
        });
        let steps: Vec<usize> = (0..kdim).map(|p| p * npix).collect();
        f(ColsSrc {
            data: col,
            steps: &steps,
            row: npix,
            pitch: npix,
        })
    })
}

/// The elements of the dealt phases (zeroed and written) per task of [`cols_source`]: whole
/// channels of about 64 Ki elements.
const DEAL_ELEMS: usize = 1 << 16;

/// [`cols_source`]'s phases: each channel of `x` zero-padded (padded extent `hp × wp`) and dealt
/// into `pad`'s `sh × sw` phase planes of `hq × wq` (padded row `r` to phase row `r % sh`,
/// position `r / sh`; columns alike). Rows of stride 2 go through
/// [`crate::depthwise_flat::deal_pairs`] (inlined into the SIMD context here), other strides
/// value by value, stride 1 as one copy per row. `pad` holds whole channels' planes (as many as
/// `x` has channels); what the padding covers is left as it is (the caller zeroes it).
fn deal_phases(x: &[f32], g: &Geom, [hp, wp, hq, wq]: [usize; 4], pad: &mut [f32]) {
    struct Op<'a>(&'a [f32], &'a Geom, [usize; 4], &'a mut [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Op(x, g, [hp, wp, hq, wq], pad) = self;
            let plane = g.sh * g.sw * hq * wq;
            let n = g.w.min(wp.saturating_sub(g.pl));
            for (src, dst) in x.chunks_exact(g.h * g.w).zip(pad.chunks_exact_mut(plane)) {
                for (r, row) in src.chunks_exact(g.w).enumerate() {
                    // Input row r is padded row r + pt; rows past the padded extent are never
                    // read.
                    let pr = r + g.pt;
                    if pr >= hp {
                        continue;
                    }
                    let (py, qy) = (pr % g.sh, pr / g.sh);
                    let at = |px: usize, qx: usize| (py * g.sw + px) * hq * wq + qy * wq + qx;
                    let row = &row[..n];
                    match g.sw {
                        1 => {
                            let a = at(0, g.pl);
                            dst[a..a + n].copy_from_slice(row);
                        }
                        2 => {
                            // Even image columns to phase pl % 2 from position pl / 2, odd ones
                            // to the other phase from (pl + 1) / 2.
                            let (a, b) =
                                (at(g.pl % 2, g.pl / 2), at((g.pl + 1) % 2, g.pl.div_ceil(2)));
                            let (e, o) = if a < b {
                                let (lo, hi) = dst.split_at_mut(b);
                                (&mut lo[a..], hi)
                            } else {
                                let (lo, hi) = dst.split_at_mut(a);
                                (hi, &mut lo[b..])
                            };
                            let pairs = n / 2;
                            crate::depthwise_flat::deal_pairs(
                                row,
                                &mut e[..pairs],
                                &mut o[..pairs],
                            );
                            if n % 2 == 1 {
                                e[pairs] = row[n - 1];
                            }
                        }
                        _ => {
                            // Column c + pl to phase (c + pl) % sw, position (c + pl) / sw.
                            let (mut px, mut qx) = (g.pl % g.sw, g.pl / g.sw);
                            for &v in row {
                                dst[at(px, qx)] = v;
                                px += 1;
                                if px == g.sw {
                                    (px, qx) = (0, qx + 1);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    crate::simd::dispatch(Op(x, g, [hp, wp, hq, wq], pad));
}

/// The executor's packed copy of the weight where it has this convolution's sizes, else the
/// weight `ws` packed by `pack` for this call.
fn kept_or_packed<'p>(
    kept: Option<&'p crate::gemm_packed::PackedB>,
    ws: &[f32],
    g: &Geom,
    pack: fn(&[f32], &Geom) -> KResult<crate::gemm_packed::PackedB>,
) -> KResult<Cow<'p, crate::gemm_packed::PackedB>> {
    match kept.filter(|p| p.dims() == (g.kdim(), g.o)) {
        Some(p) => Ok(Cow::Borrowed(p)),
        None => pack(ws, g).map(Cow::Owned),
    }
}

/// `w` (`O × K`, row-major) transposed and packed for [`crate::gemm_packed::gemm_cols`].
fn cols_pack(w: &[f32], g: &Geom) -> KResult<crate::gemm_packed::PackedB> {
    let wt = transposed(w, g)?;
    crate::gemm_packed::PackedB::for_cols(&wt, g.kdim(), g.o)
}

/// `w` (`O × K`, row-major) transposed and packed for [`crate::gemm_packed::gemm_src`].
fn rows_pack(w: &[f32], g: &Geom) -> KResult<crate::gemm_packed::PackedB> {
    let wt = transposed(w, g)?;
    crate::gemm_packed::PackedB::new(&wt, g.kdim(), g.o)
}

/// `w` (`O × K`, row-major) transposed (`K × O`), after the checks of its size and of the
/// memory its packed copy takes.
fn transposed(w: &[f32], g: &Geom) -> KResult<Vec<f32>> {
    let (o, k) = (g.o, g.kdim());
    if w.len() != o * k {
        return Err(format!(
            "conv2d: a {o}-channel kernel of {k} taps needs {} elements, found {}",
            o * k,
            w.len()
        ));
    }
    fusebox_core::runtime::memory::check_alloc(
        "the packed weight of relax.nn.conv2d",
        DType::F32,
        &[crate::gemm_packed::PackedB::cols_len_for(k, o)],
    )
    .map_err(|e| e.to_string())?;
    let mut wt = vec![0.0f32; o * k];
    for (ch, row) in w.chunks_exact(k).enumerate() {
        for (p, &v) in row.iter().enumerate() {
            wt[p * o + ch] = v;
        }
    }
    Ok(wt)
}

/// The Winograd transform of conv2d weight `w` for [`conv2d_fused`] on data `x`, in the
/// variant the convolution runs ([`Geom::winograd_tile`]); `None` when it runs another path.
/// Reads only the shapes of `x`.
pub(crate) fn winograd_weights(
    x: &Tensor,
    w: &Tensor,
    a: &Conv2dAttrs,
) -> Option<winograd::Weights> {
    if nhwc::takes(x, w, a) {
        return None;
    }
    let (g, wp) = shape_geometry(x, w, a).ok()?;
    let tile = g.winograd_tile()?;
    if !w.dtype().is_float() {
        return None;
    }
    let wc = to_canonical(w, wp);
    winograd::Weights::for_image(&f32s(&wc), g.o, g.c, tile, g.winograd_tiles(tile)).ok()
}

/// The elements of a float tensor as `f32`, borrowed when they already are.
fn f32s(t: &Tensor) -> Cow<'_, [f32]> {
    match t.as_f32() {
        Some(v) => Cow::Borrowed(v),
        None => Cow::Owned(t.to_f32_vec()),
    }
}

thread_local! {
    /// The im2col buffer of the calling thread, kept between calls.
    static COLUMNS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The convolution in canonical layouts, with the epilogue, as `f32` `N × O × OH × OW`.
fn compute(
    xc: &Tensor,
    wc: &Tensor,
    g: &Geom,
    steps: &[Step],
    prepared: Prepared<'_>,
) -> KResult<crate::par::Scratch> {
    let wino = prepared.wino;
    let xs = f32s(xc);
    let ws = f32s(wc);
    let (kdim, npix) = (g.kdim(), g.npix());
    let og = g.o / g.g;
    let threads = crate::par::threads();
    if kdim == 0 {
        return Ok(crate::par::Scratch::from_vec(vec![0.0; g.n * g.o * npix]));
    }
    // Every element is written below (GEMMs replace, the Winograd output transform covers
    // each row): a kept buffer's old contents never show.
    let mut out = crate::par::scratch_f32(g.n * g.o * npix);
    if out.is_empty() {
        return Ok(out);
    }
    let image = g.c * g.h * g.w;
    if g.g == 1 {
        for (img, dst) in out.chunks_mut(g.o * npix).enumerate() {
            let base = img * g.o * npix;
            let ep = |row: usize, col: usize, r: &mut [f32]| {
                apply_steps(steps, row, base + row * npix + col, r);
            };
            let ep: crate::matmul::Epilogue<'_> = &ep;
            let epilogue = (!steps.is_empty()).then_some(ep);
            let x_img = &xs[img * image..(img + 1) * image];
            if let Some(tile) = g.winograd_tile() {
                let computed;
                let tiles = g.winograd_tiles(tile);
                let wt = match wino.filter(|w| w.fits(g.o, g.c, tile, tiles)) {
                    Some(w) => w,
                    None => {
                        computed = winograd::Weights::for_image(&ws, g.o, g.c, tile, tiles)?;
                        &computed
                    }
                };
                let ep = |ch: usize, r0: usize, r: &mut [f32]| {
                    apply_steps(steps, ch, base + ch * npix + r0 * g.ow, r);
                };
                let ep: winograd::Epilogue<'_> = &ep;
                let image = winograd::Image {
                    x: x_img,
                    c: g.c,
                    h: g.h,
                    w: g.w,
                    pt: g.pt,
                    pl: g.pl,
                    oh: g.oh,
                    ow: g.ow,
                };
                winograd::conv(image, wt, dst, threads, (!steps.is_empty()).then_some(ep))?;
            } else if g.packs() {
                let packed = kept_or_packed(prepared.cols, &ws, g, cols_pack)?;
                let packed = &*packed;
                // The per-channel steps run on each block of sums before it is written back
                // (no pass over the rows, no call per channel row); the rest on the rows.
                let k = channel_prefix(steps);
                let (head, tail) = steps.split_at(k);
                let pre = |ch0: usize, cols: usize, block: &mut [[f32; crate::gemm_packed::NR]]| {
                    apply_channel_steps(head, ch0, cols, block);
                };
                let pre: crate::gemm_packed::ColsPre<'_> = &pre;
                let ep = |row: usize, col: usize, r: &mut [f32]| {
                    apply_steps(tail, row, base + row * npix + col, r);
                };
                let ep: crate::matmul::Epilogue<'_> = &ep;
                let (pre, ep) = (
                    (!head.is_empty()).then_some(pre),
                    (!tail.is_empty()).then_some(ep),
                );
                cols_source(x_img, g, threads, |src: crate::gemm_packed::ColsSrc<'_>| {
                    crate::gemm_packed::gemm_cols(npix, src, packed, dst, threads, pre, ep)
                })?;
            } else if g.rows() {
                let packed = kept_or_packed(prepared.cols, &ws, g, rows_pack)?;
                let packed = &*packed;
                // Each finished tile (pixels × channels, in place in `dst`): the steps on
                // its part of each channel's row.
                let ep = |r0: usize, c0: usize, mut tile: faer::MatMut<'_, f32>| {
                    for j in 0..tile.ncols() {
                        let ch = c0 + j;
                        let Some(part) = faer::reborrow::ReborrowMut::rb_mut(&mut tile)
                            .col_mut(j)
                            .try_as_col_major_mut()
                        else {
                            return Err("conv2d: an output row is not contiguous".to_string());
                        };
                        apply_steps(steps, ch, base + ch * npix + r0, part.as_slice_mut());
                    }
                    Ok(())
                };
                let ep: crate::gemm_packed::TileEpilogue<'_> = &ep;
                let ep = (!steps.is_empty()).then_some(ep);
                let y = faer::MatMut::from_row_major_slice_mut(dst, g.o, npix).transpose_mut();
                cols_source(x_img, g, threads, |src: crate::gemm_packed::ColsSrc<'_>| {
                    crate::gemm_packed::gemm_src(npix, src, packed, y, threads, ep)
                })?;
            } else if let Some(stem) = g.stem() {
                let ep = |ch: usize, oy: usize, r: &mut [f32]| {
                    apply_steps(steps, ch, base + ch * npix + oy * g.ow, r);
                };
                let ep: conv_stem::Epilogue<'_> = &ep;
                let epilogue = (!steps.is_empty()).then_some(ep);
                conv_stem::conv(&stem, x_img, &ws, dst, threads, epilogue)?;
            } else if g.direct() && pointwise::takes(g.o, kdim, npix, steps) {
                pointwise::conv1x1(g.o, kdim, npix, &ws, x_img, dst, threads, steps, base)?;
            } else if g.direct() {
                let x_img = Rhs::Matrix(x_img);
                gemm_f32_tiled(g.o, kdim, npix, &ws, x_img, dst, threads, epilogue)?;
            } else if crate::matmul::column_tiles(g.o, npix, kdim) > 1 {
                // Each column tile's block of the im2col matrix is made where it is used.
                let fill = |c0: usize, block: &mut [f32]| {
                    im2col(x_img, g, 0, c0, block.len() / kdim.max(1), block);
                };
                let fill = Rhs::Columns(&fill);
                gemm_f32_tiled(g.o, kdim, npix, &ws, fill, dst, threads, epilogue)?;
            } else {
                // One column tile: the whole im2col matrix, its rows spread over the threads.
                // The im2col matrix may be larger than the output: it goes through the limit.
                fusebox_core::runtime::check_alloc(
                    "the im2col matrix of relax.nn.conv2d",
                    fusebox_core::ir::DType::F32,
                    &[kdim, npix],
                )
                .map_err(|e| e.to_string())?;
                crate::par::with_scratch(&COLUMNS, |col| {
                    col.resize(kdim * npix, 0.0);
                    let rows_per_task = (64 * 1024 / npix.max(1)).max(1);
                    let t = crate::par::threads_for(kdim * npix, 64 * 1024).min(threads);
                    crate::par::for_each_chunk_mut(col, rows_per_task * npix, t, |off, chunk| {
                        im2col(x_img, g, off / npix, 0, npix, chunk);
                    });
                    let b = Rhs::Matrix(col);
                    gemm_f32_tiled(g.o, kdim, npix, &ws, b, dst, threads, epilogue)
                })?;
            }
        }
        return Ok(out);
    }
    if og == 1 && g.ci == 1 {
        depthwise(&xs, &ws, g, steps, &mut out, threads);
        return Ok(out);
    }
    // Grouped: the (image, group) pairs are the tasks, each a serial GEMM into its own rows.
    let tasks: Vec<(usize, &mut [f32])> = out.chunks_mut(og * npix).enumerate().collect();
    let work = g.n * g.o * kdim * npix;
    let t = crate::par::threads_for(work, 1 << 20).min(threads);
    crate::par::run_tasks(tasks, t, |(k, dst)| {
        let (img, grp) = (k / g.g, k % g.g);
        let x_grp = &xs[img * image + grp * g.ci * g.h * g.w..][..g.ci * g.h * g.w];
        let wg = &ws[grp * og * kdim..(grp + 1) * og * kdim];
        let ep = |row: usize, col: usize, r: &mut [f32]| {
            let ch = grp * og + row;
            apply_steps(steps, ch, (img * g.o + ch) * npix + col, r);
        };
        let ep: crate::matmul::Epilogue<'_> = &ep;
        let epilogue = (!steps.is_empty()).then_some(ep);
        if g.direct() {
            gemm_f32_tiled(og, kdim, npix, wg, Rhs::Matrix(x_grp), dst, 1, epilogue)
        } else {
            let fill = |c0: usize, block: &mut [f32]| {
                im2col(x_grp, g, 0, c0, block.len() / kdim.max(1), block);
            };
            gemm_f32_tiled(og, kdim, npix, wg, Rhs::Columns(&fill), dst, 1, epilogue)
        }
    })?;
    Ok(out)
}

/// Fills `block` (whole `cols`-long rows, row-major) with rows `first..` and columns
/// `c0..c0 + cols` of the im2col matrix of one (image, group) `x` (`ci × h × w`): row
/// `(ch, ky, kx)`, column `(oy, ox)`, zero where the window is in the padding.
fn im2col(x: &[f32], g: &Geom, first: usize, c0: usize, cols: usize, block: &mut [f32]) {
    struct Op<'a>(&'a [f32], &'a Geom, [usize; 3], &'a mut [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let [first, c0, cols] = self.2;
            im2col_inline(self.0, self.1, first, c0, cols, self.3);
        }
    }
    crate::simd::dispatch(Op(x, g, [first, c0, cols], block));
}

#[inline(always)]
fn im2col_inline(x: &[f32], g: &Geom, first: usize, c0: usize, cols: usize, block: &mut [f32]) {
    let (h, ow) = (g.h as isize, g.ow);
    if cols == 0 || ow == 0 {
        return;
    }
    for (i, row) in block.chunks_mut(cols).enumerate() {
        let r = first + i;
        let (ch, ky, kx) = (r / (g.kh * g.kw), (r / g.kw) % g.kh, r % g.kw);
        let plane = &x[ch * g.h * g.w..(ch + 1) * g.h * g.w];
        // Columns ox whose input column ix = ox * sw + kx * dw - pl lies in 0..w.
        let x0 = (kx * g.dw) as isize - g.pl as isize;
        let (lo, hi) = crate::util::in_range_outputs(x0, g.sw, g.w, ow);
        let sw = g.sw as isize;
        // The output rows the block's columns cover, each clipped to the block.
        let mut p = c0;
        let mut filled = 0;
        while filled < row.len() {
            let (oy, ox_a) = (p / ow, p % ow);
            let ox_b = (ox_a + (row.len() - filled)).min(ow);
            let dst = &mut row[filled..filled + (ox_b - ox_a)];
            filled += ox_b - ox_a;
            p += ox_b - ox_a;
            let y = (oy * g.sh + ky * g.dh) as isize - g.pt as isize;
            if y < 0 || y >= h {
                dst.fill(0.0);
                continue;
            }
            let src = &plane[y as usize * g.w..(y as usize + 1) * g.w];
            // Output columns ox_a..ox_b of this row: zeros, then the copied run, then zeros.
            let (a, b) = (lo.clamp(ox_a, ox_b), hi.clamp(ox_a, ox_b));
            dst[..a - ox_a].fill(0.0);
            dst[b - ox_a..].fill(0.0);
            if a >= b {
                continue;
            }
            let dst = &mut dst[a - ox_a..b - ox_a];
            let start = (a as isize * sw + x0) as usize;
            if g.sw == 1 {
                dst.copy_from_slice(&src[start..start + dst.len()]);
            } else if g.sw == 2 {
                // Even elements of pairs (the compiler vectorises the de-interleave), then the
                // odd tail.
                let pairs = src[start..].chunks_exact(2);
                let full = pairs.len().min(dst.len());
                for (d, p) in dst[..full].iter_mut().zip(pairs) {
                    *d = p[0];
                }
                let rest = src[start + 2 * full..].iter().step_by(2);
                for (d, s) in dst[full..].iter_mut().zip(rest) {
                    *d = *s;
                }
            } else {
                for (d, s) in dst.iter_mut().zip(src[start..].iter().step_by(g.sw)) {
                    *d = *s;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
