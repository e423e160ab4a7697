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
//! - On output planes of up to 64 pixels (ResNet's and MobileNet's 7×7 layers) with AVX-512,
//!   the GEMM runs with the output channels on the vector lanes instead
//!   ([`crate::gemm_packed::gemm_cols`], the weight transposed and packed once per constant
//!   weight: [`cols_weights`]): a 49-pixel row wastes a quarter of `faer`'s four 16-lane
//!   vectors, 48 channels fill three. 1×1 layers of at least 384 input channels on planes of
//!   up to 14×14 run there too (MobileNetV2's 576 → 96, ResNet-50's 1024 → 256: the long
//!   reduction pays for the transposed write-back). Stride-1 kernels read the zero-padded image in place
//!   (no im2col matrix, whose 5–7-value copies took a quarter of a 3×3 layer's time there),
//!   and stride-2 3×3 kernels the image dealt into its four phases. The epilogue's leading
//!   per-channel steps (`batch_norm`, bias, `relu`, `clip`) run on each block of sums before
//!   it is written back ([`epilogue::apply_channel_steps`]), the rest (a residual, a program)
//!   on the rows after: MobileNetV2's 160 → 960 7×7 layers 0.625 → 0.581 ms for three calls
//!   (one thread), the same bits.
//!   ResNet-50's 512×7×7 3×3 layer, one node, 2 threads: 1.53 → 1.32 ms (onnxruntime
//!   0.98); with its weights streamed from memory (`bench/conv_chain.py 512 7 3 8 512`):
//!   19.0 → 11.5 ms for eight (onnxruntime 10.0). Such 3×3 layers of 256 channels or more
//!   now run as Winograd F(2×2, 3×3) instead (the eight 10.7 → 8.7 ms, onnxruntime 9.3).
//! - With AVX-512, a stride-2 convolution with few taps per output (`C · KH · KW` ≤ 160, rows
//!   of 16 pixels or more: a CNN's first layer) runs directly ([`crate::conv_stem`]: each
//!   input row dealt into its even and odd columns, 16 output channels per vector of
//!   pixels), without an im2col matrix: MobileNetV2 one thread 9.02 → 8.91 ms, ResNet-50
//!   78.1 → 77.7 ms. A depthwise convolution (one input channel per group) runs per plane:
//!   stride-2 3×3 layers read straight from the plane with AVX-512
//!   ([`crate::depthwise_s2`]), the others through [`crate::depthwise_flat`] or a row kernel.
//! - The result is bit-identical for every thread count, and the same whether the weight's
//!   Winograd transform or packed copy was cached or not.
//! - Float dtypes compute in `f32` (`float64` too) and round once to `out_dtype` (default: the
//!   data's dtype); integer inputs are an error.
//! - Each [`Step`] repeats the arithmetic of the op it replaces element by element (one `f32`
//!   fused multiply-add per element for `batch_norm`, as its `float32` kernel does; `f32` for
//!   `add` (a per-channel bias or a residual of the output's shape) in its operand order,
//!   `relu` keeping NaN), so a fused result is bit-identical to running the ops one by one. [`conv2d_fused`] needs a
//!   `float32` result in `NCHW`; the executor checks that before fusing.
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

mod depthwise;
mod epilogue;
#[cfg(test)]
use crate::{depthwise_flat, depthwise_s2};
use depthwise::depthwise;
#[cfg(test)]
use depthwise::{FORCE_LANES, Padded, depthwise_flat_planes, depthwise_planes, flat_plan};
pub(crate) use epilogue::{Step, relu};
use epilogue::{apply_channel_steps, apply_steps, apply_steps_inline, channel_prefix};
use fusebox_core::ir::DType;
use fusebox_core::op::Conv2dAttrs;
use fusebox_core::runtime::{Storage, Tensor};
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
    /// channels on up to [`COLS_PIXELS_1X1`] pixels — on a CPU with 16-lane
    /// vectors: the GEMM runs with the output channels on the lanes
    /// ([`crate::gemm_packed::gemm_cols`], the weight packed transposed: [`cols_weights`]).
    fn packs(&self) -> bool {
        let npix = self.npix();
        let bound = if (self.sh, self.sw) == (1, 1) {
            COLS_MIN_STEPS_S1
        } else {
            COLS_MIN_STEPS
        };
        let long = self.kdim() >= bound && self.kh * self.kw > 1 && self.reads_phases();
        let long_1x1 =
            self.direct() && npix <= COLS_PIXELS_1X1 && self.kdim() >= COLS_MIN_STEPS_1X1;
        self.g == 1
            && !self.winograd()
            && npix > 0
            && (npix <= COLS_PIXELS || long || long_1x1)
            && self.kdim() > 0
            && cols_lanes()
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
    let (xc, wc, op, out_dtype, geom) = prepare(x, w, a)?;
    let out = compute(&xc, &wc, &geom, &[], Prepared::default())?;
    let t = tensor(
        vec![geom.n, geom.o, geom.oh, geom.ow],
        Storage::from_f32(out_dtype, out),
    )?;
    Ok(from_canonical(&t, op))
}

/// Whether [`conv2d_fused`] can run this convolution: a `float32` result in `NCHW`.
pub(crate) fn fusable(x: &Tensor, w: &Tensor, a: &Conv2dAttrs) -> bool {
    a.out_dtype.unwrap_or(x.dtype()) == DType::F32
        && (a.out_dtype.is_some() || x.dtype() == w.dtype())
        && layout4(&a.out_layout, "NCHW").is_ok_and(|p| p == [0, 1, 2, 3])
}

/// The `NCHW` output shape of `conv2d(x, w)`.
pub(crate) fn out_shape(x: &Tensor, w: &Tensor, a: &Conv2dAttrs) -> KResult<[usize; 4]> {
    let g = shape_geometry(x, w, a)?.0;
    Ok([g.n, g.o, g.oh, g.ow])
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
}

/// `conv2d(x, w)` followed by `steps` on every output element (see the module doc).
pub(crate) fn conv2d_fused(
    x: &Tensor,
    w: &Tensor,
    a: &Conv2dAttrs,
    steps: &[Step],
    prepared: Prepared<'_>,
) -> KResult<Tensor> {
    if !fusable(x, w, a) {
        return Err("a fused conv2d needs a float32 result in NCHW".to_string());
    }
    let (xc, wc, _, _, geom) = prepare(x, w, a)?;
    if let Some(s) = steps
        .iter()
        .find(|s| s.channels().is_some_and(|c| c != geom.o))
    {
        return Err(format!(
            "the epilogue has values for {:?} channels, the convolution has {}",
            s.channels(),
            geom.o
        ));
    }
    let out_shape = [geom.n, geom.o, geom.oh, geom.ow];
    for s in steps {
        if let Step::Program(p) = s
            && p.0.shape() != out_shape
        {
            return Err(format!(
                "the epilogue's program gives shape {:?}, the convolution {:?}",
                p.0.shape(),
                out_shape
            ));
        }
        if let Step::Residual { r, .. } = s
            && (r.shape() != out_shape || r.as_f32().is_none())
        {
            return Err(format!(
                "the epilogue adds a {} tensor of shape {:?}, the convolution gives float32 {:?}",
                r.dtype(),
                r.shape(),
                out_shape
            ));
        }
    }
    let out = compute(&xc, &wc, &geom, steps, prepared)?;
    tensor(out_shape.to_vec(), Storage::F32(out))
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

/// The transposed weight of `conv2d(x, w)` packed for [`crate::gemm_packed::gemm_cols`]
/// (`(C · KH · KW) × O`), when the convolution runs that path ([`Geom::packs`]); `None`
/// otherwise. Reads only the shapes of `x`.
pub(crate) fn cols_weights(
    x: &Tensor,
    w: &Tensor,
    a: &Conv2dAttrs,
) -> Option<crate::gemm_packed::PackedB> {
    if !fusable(x, w, a) {
        return None;
    }
    // The geometry first (shapes only): most convolutions stop here, before any copy.
    let (g, wp) = shape_geometry(x, w, a).ok()?;
    if !g.packs() || !w.dtype().is_float() {
        return None;
    }
    cols_pack(&f32s(&to_canonical(w, wp)), &g).ok()
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
            pad.clear();
            pad.resize(g.c * plane, 0.0);
            deal_phases(x, g, [hp, wp, hq, wq], pad);
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

/// [`cols_source`]'s phases: each channel of `x` zero-padded (padded extent `hp × wp`) and dealt
/// into `pad`'s `sh × sw` phase planes of `hq × wq` (padded row `r` to phase row `r % sh`,
/// position `r / sh`; columns alike). Rows of stride 2 go through
/// [`crate::depthwise_flat::deal_pairs`] (inlined into the SIMD context here), other strides
/// value by value, stride 1 as one copy per row.
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

/// `w` (`O × K`, row-major) transposed and packed for [`crate::gemm_packed::gemm_cols`].
fn cols_pack(w: &[f32], g: &Geom) -> KResult<crate::gemm_packed::PackedB> {
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
    crate::gemm_packed::PackedB::for_cols(&wt, k, o)
}

/// The Winograd transform of conv2d weight `w` for [`conv2d_fused`] on data `x`, in the
/// variant the convolution runs ([`Geom::winograd_tile`]); `None` when it runs another path.
/// Reads only the shapes of `x`.
pub(crate) fn winograd_weights(
    x: &Tensor,
    w: &Tensor,
    a: &Conv2dAttrs,
) -> Option<winograd::Weights> {
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
) -> KResult<Vec<f32>> {
    let wino = prepared.wino;
    let xs = f32s(xc);
    let ws = f32s(wc);
    let (kdim, npix) = (g.kdim(), g.npix());
    let og = g.o / g.g;
    let threads = crate::par::threads();
    if kdim == 0 {
        return Ok(vec![0.0; g.n * g.o * npix]);
    }
    // Every element is written below (GEMMs replace, the Winograd output transform covers
    // each row): a kept buffer's old contents never show.
    let mut out = crate::par::scratch_f32(g.n * g.o * npix, threads);
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
                let computed;
                let packed = match prepared.cols.filter(|p| p.dims() == (kdim, g.o)) {
                    Some(p) => p,
                    None => {
                        computed = cols_pack(&ws, g)?;
                        &computed
                    }
                };
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
            } else if let Some(stem) = g.stem() {
                let ep = |ch: usize, oy: usize, r: &mut [f32]| {
                    apply_steps(steps, ch, base + ch * npix + oy * g.ow, r);
                };
                let ep: conv_stem::Epilogue<'_> = &ep;
                let epilogue = (!steps.is_empty()).then_some(ep);
                conv_stem::conv(&stem, x_img, &ws, dst, threads, epilogue)?;
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
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;

    /// The direct definition, for comparison.
    /// `NCHW`/`OIHW` attributes with equal strides, padding and dilation on every side.
    fn attrs(s: i64, p: i64, d: i64, groups: i64) -> Conv2dAttrs {
        Conv2dAttrs {
            strides: [s, s],
            padding: [p, p, p, p],
            dilation: [d, d],
            groups,
            data_layout: "NCHW".into(),
            kernel_layout: "OIHW".into(),
            out_layout: "NCHW".into(),
            out_dtype: None,
        }
    }

    /// Small-integer data (`xs`, shape `xsh`) and weights (`ws`, shape `wsh`) whose products
    /// and sums are exact in `f32`, as slices and as tensors; `seed` shifts both patterns.
    fn exact_operands(
        xsh: [usize; 4],
        wsh: [usize; 4],
        seed: usize,
    ) -> (Vec<f32>, Vec<f32>, Tensor, Tensor) {
        let xs: Vec<f32> = (0..xsh.iter().product::<usize>())
            .map(|i| ((i * 37 + seed) % 17) as f32 - 8.0)
            .collect();
        let ws: Vec<f32> = (0..wsh.iter().product::<usize>())
            .map(|i| ((i * 11 + seed) % 7) as f32 - 3.0)
            .collect();
        let x = Tensor::from_f32(xsh.to_vec(), xs.clone()).unwrap_or_else(|e| panic!("{e}"));
        let wt = Tensor::from_f32(wsh.to_vec(), ws.clone()).unwrap_or_else(|e| panic!("{e}"));
        (xs, ws, x, wt)
    }

    fn naive(x: &[f32], wt: &[f32], g: &Geom) -> Vec<f32> {
        let og = g.o / g.g;
        let mut out = vec![0.0f32; g.n * g.o * g.npix()];
        for img in 0..g.n {
            for oc in 0..g.o {
                let grp = oc / og;
                for oy in 0..g.oh {
                    for ox in 0..g.ow {
                        let mut acc = 0.0f64;
                        for ch in 0..g.ci {
                            for ky in 0..g.kh {
                                for kx in 0..g.kw {
                                    let y = (oy * g.sh + ky * g.dh) as isize - g.pt as isize;
                                    let xx = (ox * g.sw + kx * g.dw) as isize - g.pl as isize;
                                    if y < 0 || xx < 0 || y >= g.h as isize || xx >= g.w as isize {
                                        continue;
                                    }
                                    let xi = ((img * g.c + grp * g.ci + ch) * g.h + y as usize)
                                        * g.w
                                        + xx as usize;
                                    let wi = ((oc * g.ci + ch) * g.kh + ky) * g.kw + kx;
                                    acc += f64::from(x[xi]) * f64::from(wt[wi]);
                                }
                            }
                        }
                        out[((img * g.o + oc) * g.oh + oy) * g.ow + ox] = acc as f32;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn matches_the_definition_for_strides_padding_dilation_groups() {
        type Case = (usize, usize, usize, usize, usize, usize, i64, i64, i64, i64);
        let cases: [Case; 31] = [
            // n, c, h, w, o, k, stride, pad, dilation, groups
            (1, 3, 9, 7, 4, 3, 1, 1, 1, 1),
            (2, 4, 8, 8, 6, 3, 2, 1, 1, 2),
            (1, 4, 7, 9, 4, 3, 1, 2, 2, 4),
            (1, 8, 5, 5, 16, 1, 1, 0, 1, 1),
            (1, 8, 6, 6, 16, 1, 2, 0, 1, 1),
            (1, 3, 11, 13, 5, 5, 3, 2, 1, 1),
            // Stride 2 on odd widths: a 7×7 stem, dilation 2, a 2-wide kernel.
            (1, 3, 15, 13, 4, 7, 2, 3, 1, 1),
            (1, 4, 9, 11, 4, 3, 2, 1, 2, 1),
            (1, 2, 6, 5, 3, 2, 2, 0, 1, 1),
            // Depthwise (MobileNet): stride 2 over two images, and a 3x3 on a 4x4 plane.
            (2, 6, 9, 8, 6, 3, 2, 1, 1, 6),
            (1, 5, 4, 4, 5, 3, 1, 1, 1, 5),
            // Depthwise: stride 2 with dilation 2, stride 3 on an odd plane, a 5x5 with pad 2,
            // no padding, and a 1-wide output.
            (1, 3, 11, 12, 3, 3, 2, 2, 2, 3),
            (1, 2, 13, 10, 2, 3, 3, 1, 1, 2),
            (1, 4, 7, 9, 4, 5, 1, 2, 1, 4),
            (1, 3, 6, 7, 3, 3, 1, 0, 1, 3),
            (1, 2, 3, 3, 2, 3, 2, 0, 1, 2),
            // Depthwise on wider planes (blocks of 4, 2 and 1 vectors, rows left over): a
            // 41-wide output, stride 2 with the left padding 1, 2 and 0 (the deinterleave
            // starting in either phase), and 12 wide over 13 rows.
            (1, 3, 37, 41, 3, 3, 1, 1, 1, 3),
            (1, 2, 40, 35, 2, 3, 2, 1, 1, 2),
            (1, 2, 30, 33, 2, 3, 2, 2, 1, 2),
            (1, 2, 20, 19, 2, 3, 2, 0, 1, 2),
            (1, 3, 13, 12, 3, 3, 1, 1, 1, 3),
            // Depthwise with output rows under 16 pixels (the flat kernel): dilation 2 with
            // padding 2, two 15-wide images, a 1x1 kernel, a 1x1 image.
            (1, 3, 7, 7, 3, 3, 1, 2, 2, 3),
            (2, 4, 5, 15, 4, 3, 1, 1, 1, 4),
            (1, 2, 6, 6, 2, 1, 1, 0, 1, 2),
            (1, 2, 1, 1, 2, 3, 1, 1, 1, 2),
            // Two images on the unrolled 3x3 flat kernel (rows of 16 pixels or more), stride
            // 1 and 2.
            (2, 3, 20, 24, 3, 3, 1, 1, 1, 3),
            (2, 2, 34, 36, 2, 3, 2, 1, 1, 2),
            // An empty input plane: every output reads only the padding.
            (1, 2, 3, 0, 2, 1, 1, 1, 1, 2),
            (1, 2, 3, 0, 2, 1, 2, 1, 1, 2),
            // Stride-2 first layers with rows of 16 pixels or more (`conv_stem` with AVX-512):
            // a 3x3 stem, and two images through a 7x7 with a partial group of channels.
            (1, 3, 40, 36, 8, 3, 2, 1, 1, 1),
            (2, 3, 35, 40, 20, 7, 2, 3, 1, 1),
        ];
        for (n, c, h, w, o, k, s, p, d, gr) in cases {
            let ci = c / gr as usize;
            let (xs, ws, x, wt) = exact_operands([n, c, h, w], [o, ci, k, k], 0);
            let a = attrs(s, p, d, gr);
            let g = geometry(x.shape(), wt.shape(), &a).unwrap_or_else(|e| panic!("{e}"));
            let want = naive(&xs, &ws, &g);
            // The depthwise kernel's paths: the CPU's widest vectors, then 16, 8 and 1 lanes
            // where the CPU has them (one thread: the kernel reads the choice on this one).
            // Then the widest vectors again with `conv_stem` kept off (the GEMM path).
            for (lanes, stem_off) in [(0, false), (16, false), (8, false), (1, false), (0, true)] {
                FORCE_LANES.with(|f| f.set(lanes));
                NO_STEM.with(|f| f.set(stem_off));
                let got = crate::par::with_threads(1, || conv2d(&x, &wt, &a));
                FORCE_LANES.with(|f| f.set(0));
                NO_STEM.with(|f| f.set(false));
                let got = got.unwrap_or_else(|e| panic!("{e}"));
                // Small integers: every sum is exact, whatever the order.
                assert_eq!(
                    got.as_f32(),
                    Some(&want[..]),
                    "case {n} {c} {h} {w} {o} {k} {s} {p} {d} {gr}, {lanes} lanes, stem off {stem_off}"
                );
            }
        }
    }

    /// `conv2d` with [`Geom::packs`]'s path forced on (any vector width) or off.
    fn conv_cols(x: &Tensor, w: &Tensor, a: &Conv2dAttrs, on: bool, threads: usize) -> Tensor {
        FORCE_COLS.with(|f| f.set(on));
        let y = crate::par::with_threads(threads, || conv2d(x, w, a));
        FORCE_COLS.with(|f| f.set(false));
        y.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Whether [`Geom::packs`] takes `g` with the vector width forced (any CPU).
    fn packs_forced(g: &Geom) -> bool {
        FORCE_COLS.with(|f| f.set(true));
        let takes = g.packs();
        FORCE_COLS.with(|f| f.set(false));
        takes
    }

    /// The column kernel's result on 1 and 2 threads is `want` bit for bit (`label` names the
    /// case).
    fn assert_cols_exact(x: &Tensor, wt: &Tensor, a: &Conv2dAttrs, want: &[f32], label: &str) {
        for threads in [1, 2] {
            let got = conv_cols(x, wt, a, true, threads);
            assert_eq!(got.as_f32(), Some(want), "{label}, {threads} threads");
        }
    }

    #[test]
    fn small_planes_with_the_channels_on_the_lanes_match_the_definition() {
        type Case = (usize, usize, usize, usize, usize, usize, i64, i64, i64);
        let cases: [Case; 9] = [
            // n, c, h, w, o, k, stride, pad, dilation
            // The padded plane read in place: blocks of 7 on a 7×7 plane over two panels of
            // channels, blocks of 8 on two 8×8 images, dilation 2, padding past the image.
            (1, 5, 7, 7, 60, 3, 1, 1, 1),
            (2, 4, 8, 8, 50, 3, 1, 1, 1),
            (1, 6, 7, 7, 20, 3, 1, 2, 2),
            (1, 3, 3, 3, 5, 3, 1, 3, 1),
            // The data itself (1×1, stride 1).
            (1, 16, 7, 7, 100, 1, 1, 0, 1),
            // The im2col matrix: stride 2 (ResNet-50's 14×14 → 7×7), rows that do not divide
            // into blocks (a partial last block), a 1×1 of stride 2, a 5×5 without padding.
            (1, 8, 14, 14, 30, 3, 2, 1, 1),
            (1, 3, 9, 5, 7, 3, 1, 1, 1),
            (1, 4, 6, 6, 10, 1, 2, 0, 1),
            (1, 2, 7, 7, 3, 5, 1, 0, 1),
        ];
        for (n, c, h, w, o, k, s, p, d) in cases {
            let (xs, ws, x, wt) = exact_operands([n, c, h, w], [o, c, k, k], 0);
            let a = attrs(s, p, d, 1);
            let g = geometry(x.shape(), wt.shape(), &a).unwrap_or_else(|e| panic!("{e}"));
            let label = format!("case {n} {c} {h} {w} {o} {k} {s} {p} {d}");
            assert!(packs_forced(&g), "{label} runs the column kernel");
            // Small integers: every sum is exact, whatever the order.
            assert_cols_exact(&x, &wt, &a, &naive(&xs, &ws, &g), &label);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Any geometry the column kernel takes (output planes of up to 64 pixels; any kernel
        /// size, stride, padding and dilation; channel counts across panel edges; one or two
        /// images and threads): small integers give the direct definition exactly.
        #[test]
        fn any_small_plane_matches_the_definition(
            n in 1usize..3, c in 1usize..9, oh in 1usize..9, ow in 1usize..10,
            o in 1usize..100, k in 1usize..4, s in 1i64..3, p in 0i64..3, d in 1i64..3,
            threads in 1usize..3, seed in 0usize..1000,
        ) {
            // The input that gives an `oh × ow` output (drawn by its output, so that the padded
            // path's rows of 7 and 8 come up often).
            let span = |o: usize| ((o - 1) * s as usize + d as usize * (k - 1) + 1) as i64 - 2 * p;
            let (h, w) = (span(oh), span(ow));
            proptest::prop_assume!(h >= 1 && w >= 1);
            let (h, w) = (h as usize, w as usize);
            let a = attrs(s, p, d, 1);
            let (xs, ws, x, wt) = exact_operands([n, c, h, w], [o, c, k, k], seed);
            // Geometries with no output (the kernel past the padded image) are not this test's.
            let Ok(g) = geometry(x.shape(), wt.shape(), &a) else {
                return Ok(());
            };
            proptest::prop_assume!(packs_forced(&g));
            let want = naive(&xs, &ws, &g);
            let got = conv_cols(&x, &wt, &a, true, threads);
            proptest::prop_assert_eq!(got.as_f32(), Some(&want[..]));
        }
    }

    #[test]
    fn strided_kernels_read_their_phases_in_place() {
        // Stride 2 with 3×3 (ResNet-50's), 2×2 and dilated 2×2 kernels, rows of 7 and 8 (the
        // phase-dealt source), and a 1×1 stride-2 kernel (one phase read: the im2col matrix),
        // against the direct definition on small integers (exact).
        for (c, k, d, p, oh, ow, o) in [
            (5usize, 3usize, 1i64, 1i64, 7usize, 7usize, 50usize),
            (3, 3, 1, 1, 8, 8, 17),
            (4, 2, 1, 0, 7, 7, 9),
            (2, 2, 2, 1, 8, 8, 49),
            (6, 1, 1, 0, 7, 7, 20),
        ] {
            let span = |o: usize| ((o - 1) * 2 + d as usize * (k - 1) + 1) as i64 - 2 * p;
            let (h, w) = (span(oh) as usize, span(ow) as usize);
            let a = attrs(2, p, d, 1);
            let (xs, ws, x, wt) = exact_operands([1, c, h, w], [o, c, k, k], 0);
            let g = geometry(x.shape(), wt.shape(), &a).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!((g.oh, g.ow), (oh, ow));
            let want = naive(&xs, &ws, &g);
            assert_cols_exact(
                &x,
                &wt,
                &a,
                &want,
                &format!("c{c} k{k} d{d} p{p} {oh}x{ow}"),
            );
        }
    }

    #[test]
    fn long_kernels_on_larger_planes_take_the_column_kernel() {
        // Stride-2 3×3 layers with at least COLS_MIN_STEPS steps of `k` on planes of more
        // than COLS_PIXELS pixels (ResNet-50's 28×28 and 14×14 ones, scaled down: 114
        // channels, K = 1026, 14×14 and 10×8 outputs, rows of 7 and 8) take the column kernel,
        // read in place from the phases, and give the definition exactly; 113 channels
        // (K = 1017), a 1×1 stride-2 kernel and rows that are not whole blocks do not. At
        // stride 1 the bound is COLS_MIN_STEPS_S1; 1×1 stride-1 kernels have their own.
        let cases = [
            (
                114usize, 28usize, 28usize, 3usize, 2i64, 1i64, 20usize, true,
            ),
            (114, 20, 16, 3, 2, 1, 49, true),
            (113, 28, 28, 3, 2, 1, 20, false),
            (1100, 28, 28, 1, 2, 0, 20, false),
            (114, 18, 18, 3, 2, 1, 20, false),
            // Stride 1 (COLS_MIN_STEPS_S1): a 5×5 with K = 300 on 16×16 takes it, K = 275 not.
            (12, 16, 16, 5, 1, 2, 20, true),
            (11, 16, 16, 5, 1, 2, 20, false),
            // 1×1, stride 1 (COLS_MIN_STEPS_1X1 on up to COLS_PIXELS_1X1 pixels): 384 input
            // channels on 14×14 and on 10×10 (blocks of 8 and a last one of 4) take it; 383
            // channels, or a 15×15 plane, do not.
            (384, 14, 14, 1, 1, 0, 20, true),
            (384, 10, 10, 1, 1, 0, 52, true),
            (383, 14, 14, 1, 1, 0, 20, false),
            (384, 15, 15, 1, 1, 0, 20, false),
        ];
        for (c, h, w, k, s, p, o, takes) in cases {
            let a = attrs(s, p, 1, 1);
            let (xs, ws, x, wt) = exact_operands([1, c, h, w], [o, c, k, k], 3);
            let g = geometry(x.shape(), wt.shape(), &a).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                g.npix() > COLS_PIXELS,
                "c{c} {h}x{w}: a plane past COLS_PIXELS"
            );
            let label = format!("c{c} {h}x{w} k{k} s{s}");
            assert_eq!(packs_forced(&g), takes, "{label}: the column kernel or not");
            if takes {
                assert_cols_exact(&x, &wt, &a, &naive(&xs, &ws, &g), &label);
            }
        }
    }

    /// The bits of a `float32` tensor's elements (NaN payloads and signed zeros compare too).
    fn bits(t: &Tensor) -> Vec<u32> {
        t.as_f32()
            .unwrap_or_else(|| panic!("f32"))
            .iter()
            .map(|v| v.to_bits())
            .collect()
    }

    #[test]
    fn winograd_variants_do_not_depend_on_threads_or_the_kept_transform() {
        // F(4×4) with its GEMMs on the column kernel (16 → 16 on 28×28: 49 tiles) and on
        // plain `faer` (30×30: 64 tiles); F(2×2) on a 7×7 output of 256 channels (16 tiles)
        // and, with weights past F(4×4)'s bound, on 16×16 (64 tiles, plain `faer`).
        let cases = [
            (16, 28, 16, Some(winograd::Tile::F4)),
            (24, 30, 20, Some(winograd::Tile::F4)),
            (256, 7, 256, Some(winograd::Tile::F2)),
            (136, 16, 136, Some(winograd::Tile::F2)),
        ];
        for (c, hw, o, tile) in cases {
            let xs: Vec<f32> = (0..c * hw * hw)
                .map(|i| ((i * 7919) % 1000) as f32 / 997.0 - 0.5)
                .collect();
            let ws: Vec<f32> = (0..o * c * 9)
                .map(|i| ((i * 104_729) % 1000) as f32 / 991.0 - 0.5)
                .collect();
            let x =
                Tensor::from_f32(vec![1, c, hw, hw], xs.clone()).unwrap_or_else(|e| panic!("{e}"));
            let wt =
                Tensor::from_f32(vec![o, c, 3, 3], ws.clone()).unwrap_or_else(|e| panic!("{e}"));
            let a = attrs(1, 1, 1, 1);
            let g = geometry(&[1, c, hw, hw], &[o, c, 3, 3], &a).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(g.winograd_tile(), tile, "{c} → {o} on {hw}×{hw}");
            let kept = winograd_weights(&x, &wt, &a).unwrap_or_else(|| panic!("no transform"));
            let run = |prep: Prepared<'_>, threads: usize| {
                crate::par::with_threads(threads, || conv2d_fused(&x, &wt, &a, &[], prep))
                    .unwrap_or_else(|e| panic!("{e}"))
            };
            let with_kept = Prepared {
                wino: Some(&kept),
                cols: None,
            };
            let one = bits(&run(Prepared::default(), 1));
            for threads in [1, 2, 3] {
                assert_eq!(
                    bits(&run(with_kept, threads)),
                    one,
                    "{c} → {o}, {threads} threads"
                );
                assert_eq!(bits(&run(Prepared::default(), threads)), one);
            }
            // A transform kept for another image size (its GEMMs run the other way) is not
            // taken: the call makes its own, with the same bits.
            let big = Tensor::from_f32(vec![1, c, 2 * hw, 2 * hw], vec![0.25; c * 4 * hw * hw])
                .unwrap_or_else(|e| panic!("{e}"));
            if let Some(other) = winograd_weights(&big, &wt, &a) {
                let foreign = Prepared {
                    wino: Some(&other),
                    cols: None,
                };
                assert_eq!(
                    bits(&run(foreign, 2)),
                    one,
                    "{c} → {o}: a foreign transform"
                );
            }
            // Against the direct sum: within the variant's rounding.
            let want = naive(&xs, &ws, &g);
            let got = run(Prepared::default(), 2);
            let got = got.as_f32().unwrap_or_else(|| panic!("f32"));
            let scale = (c * 9) as f32 * 0.25;
            for (i, (&v, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (v - w).abs() <= scale * 1e-5,
                    "{c} → {o}, element {i}: {v} vs {w}"
                );
            }
        }
    }

    #[test]
    fn small_plane_bits_do_not_depend_on_threads_caching_or_fusion() {
        // Rounding sums, a NaN and an infinity: one chain per element whatever the tiling.
        let (c, hw, o) = (64, 7, 100);
        let mut xs: Vec<f32> = (0..c * hw * hw)
            .map(|i| ((i * 7919) % 1000) as f32 / 997.0 - 0.5)
            .collect();
        xs[100] = f32::NAN;
        let mut ws: Vec<f32> = (0..o * c * 9)
            .map(|i| ((i * 104_729) % 1000) as f32 / 991.0 - 0.5)
            .collect();
        ws[7] = f32::INFINITY;
        let x = Tensor::from_f32(vec![1, c, hw, hw], xs).unwrap_or_else(|e| panic!("{e}"));
        let wt = Tensor::from_f32(vec![o, c, 3, 3], ws).unwrap_or_else(|e| panic!("{e}"));
        let a = attrs(1, 1, 1, 1);
        let one = conv_cols(&x, &wt, &a, true, 1);
        for threads in [2, 3] {
            assert_eq!(bits(&conv_cols(&x, &wt, &a, true, threads)), bits(&one));
        }
        // Fused with a bias and a relu, the packed weight cached by the executor or made by
        // the call: the convolution's bits, then the ops one by one.
        let b: Vec<f32> = (0..o).map(|i| i as f32 / 10.0 - 5.0).collect();
        let steps = [
            Step::Bias {
                b: b.clone(),
                bias_first: false,
            },
            Step::Relu,
        ];
        let want: Vec<u32> = one
            .as_f32()
            .unwrap_or_else(|| panic!("f32"))
            .iter()
            .enumerate()
            .map(|(i, &v)| relu(v + b[i / (hw * hw)]).to_bits())
            .collect();
        FORCE_COLS.with(|f| f.set(true));
        let packed = cols_weights(&x, &wt, &a);
        let cached = Prepared {
            wino: None,
            cols: packed.as_ref(),
        };
        let fused = [cached, Prepared::default()].map(|p| conv2d_fused(&x, &wt, &a, &steps, p));
        FORCE_COLS.with(|f| f.set(false));
        assert!(packed.is_some());
        for y in fused {
            assert_eq!(bits(&y.unwrap_or_else(|e| panic!("{e}"))), want);
        }
    }

    #[test]
    fn stride_two_planes_read_in_place_give_the_row_kernels_bits() {
        // MobileNetV2's 112x112 stride-2 layer, odd planes, a plane of two rows of one vector:
        // depthwise() takes `depthwise_s2` where the CPU has AVX-512 (the flat kernel
        // elsewhere), on 1-3 threads; the row kernel is the reference.
        for (h, w) in [(112, 112), (29, 33), (4, 28)] {
            let c = 5;
            let a = attrs(2, 1, 1, c);
            let c = c as usize;
            let g = geometry(&[1, c, h, w], &[c, 1, 3, 3], &a).unwrap_or_else(|e| panic!("{e}"));
            let mut xs: Vec<f32> = (0..c * h * w)
                .map(|i| ((i * 7919) % 1013) as f32 / 97.0 - 5.0)
                .collect();
            let mut ws: Vec<f32> = (0..c * 9)
                .map(|i| ((i * 104_729) % 997) as f32 / 331.0 - 1.5)
                .collect();
            ws[9] = f32::INFINITY;
            ws[19] = f32::NAN;
            xs[3 * h * w + w + 1] = f32::NEG_INFINITY;
            let avx512 = crate::simd::avx512();
            assert_eq!(
                depthwise_s2::Plan::new(g.plane_shape()).is_some(),
                avx512,
                "{h}x{w}"
            );
            let mut rows = vec![0.0f32; c * g.npix()];
            let mut pad = Padded::default();
            depthwise_planes(&xs, &ws, &g, &[], 0, &mut rows, &mut pad);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for threads in 1..=3 {
                let mut out = vec![1.0f32; c * g.npix()];
                depthwise(&xs, &ws, &g, &[], &mut out, threads);
                assert_eq!(bits(&out), bits(&rows), "{h}x{w}, {threads} threads");
            }
        }
    }

    #[test]
    fn the_flat_depthwise_kernel_gives_the_row_kernels_bits() {
        // Non-integer values (the sums round), infinite and NaN weights and inputs: the flat
        // kernel adds the same taps in the same order, 0 * w over the padding included.
        // (h, w, k, stride, pad, dilation): stride 1 "same", stride 2 on even and odd planes
        // (MobileNetV2's 14x14 and 28x28 stride-2 layers), stride 3; 3x3 kernels on rows of
        // 16 pixels or more (the unrolled kernel: MobileNetV2's 56x56 stride 1 and 112x112
        // stride 2, rows not a multiple of 16, odd planes, the largest plane it takes; by
        // strips on stride 1: 112x112, fewer rows than the kernel, one row, rows just under
        // a multiple of the strip).
        for (h, w, k, st, p, d) in [
            (7, 7, 3, 1, 1, 1),
            (14, 14, 3, 1, 1, 1),
            (56, 56, 3, 1, 1, 1),
            (20, 33, 3, 1, 1, 1),
            (64, 64, 3, 1, 1, 1),
            (112, 112, 3, 1, 1, 1),
            (65, 65, 3, 1, 1, 1),
            (30, 40, 3, 1, 1, 1),
            (3, 25, 3, 1, 1, 1),
            (1, 24, 3, 1, 1, 1),
            (9, 127, 3, 1, 1, 1),
            (112, 112, 3, 2, 1, 1),
            (57, 41, 3, 2, 1, 1),
            (40, 36, 3, 1, 2, 2),
            (5, 9, 5, 1, 2, 1),
            (8, 6, 3, 1, 2, 2),
            (14, 14, 3, 2, 1, 1),
            (28, 28, 3, 2, 1, 1),
            (60, 20, 3, 1, 1, 1),
            (9, 11, 3, 2, 1, 1),
            (12, 13, 5, 2, 2, 1),
            (13, 10, 3, 3, 1, 1),
        ] {
            let c = 5;
            let a = attrs(st, p, d, c);
            let c = c as usize;
            let g = geometry(&[1, c, h, w], &[c, 1, k, k], &a).unwrap_or_else(|e| panic!("{e}"));
            let mut xs: Vec<f32> = (0..c * h * w)
                .map(|i| ((i * 7919) % 1013) as f32 / 97.0 - 5.0)
                .collect();
            let mut ws: Vec<f32> = (0..c * k * k)
                .map(|i| ((i * 104_729) % 997) as f32 / 331.0 - 1.5)
                .collect();
            ws[k * k] = f32::INFINITY;
            ws[2 * k * k + 1] = f32::NAN;
            xs[3 * h * w + w + 1] = f32::NEG_INFINITY;
            let case = format!("{h}x{w} k{k} s{st} p{p} d{d}");
            let plan = flat_plan(&g).unwrap_or_else(|| panic!("{case}: no flat plan"));
            let mut rows = vec![0.0f32; c * g.npix()];
            let mut pad = Padded::default();
            depthwise_planes(&xs, &ws, &g, &[], 0, &mut rows, &mut pad);
            for lanes in [0, 8, 1] {
                let mut flat = vec![1.0f32; c * g.npix()];
                FORCE_LANES.with(|f| f.set(lanes));
                crate::par::with_scratch(&depthwise_flat::BUFFER, |buf| {
                    depthwise_flat_planes(&xs, &ws, &g, &[], &plan, 0, &mut flat, buf);
                });
                FORCE_LANES.with(|f| f.set(0));
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&flat), bits(&rows), "{case}, {lanes} lanes");
            }
        }
        // Unequal strides, a tap past the output's last column that reads the image (stride
        // 1, no padding), and rows of 16 pixels or more but for a 3x3 kernel of stride 1 or 2
        // on planes of up to 64x64 (128x128 for stride 1 with one pixel of padding and rows
        // of 14 or more) keep the row kernel.
        for s in [
            [7, 7, 3, 3, 2, 1, 1, 1, 1, 1, 4, 7],
            [7, 7, 3, 3, 1, 1, 1, 1, 0, 0, 5, 5],
            [131, 131, 3, 3, 2, 2, 1, 1, 1, 1, 66, 66],
            [129, 129, 3, 3, 1, 1, 1, 1, 1, 1, 129, 129],
            [70, 70, 3, 3, 1, 1, 1, 1, 0, 0, 68, 68],
            [300, 60, 3, 3, 1, 1, 1, 1, 1, 1, 300, 60],
            [20, 20, 5, 5, 1, 1, 1, 1, 2, 2, 20, 20],
            [48, 48, 3, 3, 3, 3, 1, 1, 1, 1, 16, 16],
        ] {
            assert_eq!(depthwise_flat::Plan::new(s), None, "{s:?}");
        }
    }

    #[test]
    fn im2col_blocks_match_the_definition() {
        // Blocks of rows that start and end inside a (ch, ky) group of kx rows, and column
        // blocks that start and end inside an output row (as the GEMM's column strips and
        // the threads' row ranges cut them), for strides 2 and 1, dilation and odd widths.
        for (c, h, w, k, s, p, d) in [
            (3usize, 15usize, 13usize, 7usize, 2i64, 3i64, 1i64),
            (4, 9, 11, 3, 2, 1, 2),
            (2, 8, 10, 3, 2, 1, 1),
            (2, 7, 9, 3, 1, 1, 1),
        ] {
            let xs: Vec<f32> = (0..c * h * w).map(|i| i as f32 + 1.0).collect();
            let a = attrs(s, p, d, 1);
            let g = geometry(&[1, c, h, w], &[1, c, k, k], &a).unwrap_or_else(|e| panic!("{e}"));
            let (kdim, npix) = (g.kdim(), g.npix());
            let want = |r: usize, col: usize| -> f32 {
                let (ch, ky, kx) = (r / (k * k), (r / k) % k, r % k);
                let (oy, ox) = (col / g.ow, col % g.ow);
                let y = (oy * g.sh + ky * g.dh) as isize - g.pt as isize;
                let xx = (ox * g.sw + kx * g.dw) as isize - g.pl as isize;
                if y < 0 || xx < 0 || y >= h as isize || xx >= w as isize {
                    0.0
                } else {
                    xs[(ch * h + y as usize) * w + xx as usize]
                }
            };
            for (first, rows, c0, cols) in [
                (0, kdim, 0, npix),
                (1, kdim - 2, 3, npix - 5),
                (k + 2, 2 * k - 1, g.ow - 1, g.ow + 2),
            ] {
                let mut block = vec![f32::NAN; rows * cols];
                im2col(&xs, &g, first, c0, cols, &mut block);
                for (i, row) in block.chunks(cols).enumerate() {
                    for (j, v) in row.iter().enumerate() {
                        assert_eq!(
                            *v,
                            want(first + i, c0 + j),
                            "k {k} s {s} d {d}: row {} column {}",
                            first + i,
                            c0 + j
                        );
                    }
                }
            }
        }
    }
}
