//! The epilogue of a fused convolution: the per-output-channel steps (`batch_norm` for
//! inference, bias, residual add, ReLU, clip, SiLU, an elementwise program) that FuseOps
//! groups after a `conv2d`, applied to each finished row of the output while it is in cache —
//! or, in the shapes [`RegSteps`] takes, to a micro-kernel's sums in registers before their
//! one store.
//!
//! Contract: [`apply_steps`] gives each element what the ops give one by one, in their order
//! and operand order (the same bits, NaN payloads included — except where one operation meets
//! two NaNs: which payload it keeps is the compiler's choice, as it may commute an add or the
//! factors of a multiply-add; a test of [`RegSteps`] found the row code's `x + r` keeping
//! `r`'s); a bias or affine step followed by a residual add (and a `relu`, `clip` or SiLU),
//! and any step followed by one of those three, run as one loop over the row.
//!
//! ```text
//! lv = R.nn.conv2d(x, w)          # the kernel
//! lv1 = R.add(lv, b)              # Step::Bias
//! gv = R.nn.relu(R.add(lv1, r))   # Step::Residual, Step::Relu: with the bias, one loop per row
//! ```

use crate::elementwise::{SILU_K, silu32, silu32_vec};
use fusebox_core::runtime::Tensor;

/// One per-output-channel operation of a fused convolution's epilogue.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Step {
    /// Inference `batch_norm`: `x.mul_add(mul, add)`, per channel (see
    /// [`crate::nn::bn_coeffs_f32`]).
    Affine { mul: Vec<f32>, add: Vec<f32> },
    /// `add` of a per-channel value, `x + b` (`b + x` when `bias_first`).
    Bias { b: Vec<f32>, bias_first: bool },
    /// `add` of a tensor of the output's shape (a residual), element by element: `x + r`
    /// (`r + x` unless `prev_first`).
    Residual { r: Tensor, prev_first: bool },
    /// `relu` (NaN stays NaN; negatives and `-0.0` become `+0.0`).
    Relu,
    /// `clip(x, lo, hi)` of `float32` data: `x.max(lo).min(hi)`, as the `clip` kernel computes
    /// it (MobileNet's ReLU6).
    Clip { lo: f32, hi: f32 },
    /// SiLU, `x · sigmoid(x)` ([`crate::elementwise::silu32`], as the elementwise program's
    /// `silu` instruction computes it): EfficientNet's activation.
    Silu,
    /// An elementwise program over the output ([`crate::elem_program`]: SiLU, hardswish, any
    /// chain of elementwise ops with inputs broadcast to the output), each element as its ops
    /// compute it one by one.
    Program(crate::elem_program::ProgramStep),
}

impl Step {
    /// The number of channels the step has values for (`None`: any).
    pub(crate) fn channels(&self) -> Option<usize> {
        match self {
            Step::Affine { mul, .. } => Some(mul.len()),
            Step::Bias { b, .. } => Some(b.len()),
            Step::Residual { .. }
            | Step::Relu
            | Step::Clip { .. }
            | Step::Silu
            | Step::Program(_) => None,
        }
    }
}

/// How many of `steps`, from the first, act on each element with its channel's values alone
/// (`batch_norm`, a bias, `relu`, `clip`, SiLU): what [`apply_channel_steps`] can run on a
/// block of pixels × channels before the block is written to its rows. The rest (a residual, a
/// program) then run on the rows as before; each element still sees the ops in their order.
pub(crate) fn channel_prefix(steps: &[Step]) -> usize {
    steps
        .iter()
        .take_while(|s| {
            matches!(
                s,
                Step::Affine { .. }
                    | Step::Bias { .. }
                    | Step::Relu
                    | Step::Clip { .. }
                    | Step::Silu
            )
        })
        .count()
}

/// Applies `steps` (all of [`channel_prefix`]'s kinds) to each row of `block`: row `r` holds
/// one pixel's values of channels `ch0..ch0 + cols`. Each element gets the operations
/// [`apply_steps`] gives it, in order (the same bits).
pub(crate) fn apply_channel_steps<const N: usize>(
    steps: &[Step],
    ch0: usize,
    cols: usize,
    block: &mut [[f32; N]],
) {
    struct Op<'a, const N: usize>(&'a [Step], usize, usize, &'a mut [[f32; N]]);
    impl<const N: usize> pulp::WithSimd for Op<'_, N> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Op(steps, ch0, cols, block) = self;
            let cols = cols.min(N);
            for s in steps {
                for row in block.iter_mut() {
                    if !channel_step(s, ch0, &mut row[..cols]) {
                        return;
                    }
                }
            }
        }
    }
    crate::simd::dispatch(Op(steps, ch0, cols, block));
}

/// Applies one step of [`channel_prefix`]'s kinds to `row`, whose element `i` belongs to
/// channel `ch0 + i`: what [`apply_steps`] gives each element. `false` (nothing done) for a
/// residual or a program, or values missing for those channels. Inlined into the caller's SIMD
/// dispatch.
#[inline(always)]
pub(super) fn channel_step(s: &Step, ch0: usize, row: &mut [f32]) -> bool {
    let ch = ch0..ch0 + row.len();
    match s {
        Step::Affine { mul, add } => {
            let (Some(k), Some(b)) = (mul.get(ch.clone()), add.get(ch)) else {
                return false;
            };
            for ((v, &k), &b) in row.iter_mut().zip(k).zip(b) {
                *v = v.mul_add(k, b);
            }
        }
        Step::Bias { b, bias_first } => {
            let Some(b) = b.get(ch) else {
                return false;
            };
            if *bias_first {
                // `add(b, x)` in its operand order (the NaN payload it gives).
                #[allow(
                    clippy::assign_op_pattern,
                    reason = "b + x, not x + b: the operand order of the op"
                )]
                row.iter_mut().zip(b).for_each(|(v, &b)| *v = b + *v);
            } else {
                row.iter_mut().zip(b).for_each(|(v, &b)| *v += b);
            }
        }
        Step::Relu => row.iter_mut().for_each(|v| *v = relu(*v)),
        Step::Clip { lo, hi } => row.iter_mut().for_each(|v| *v = v.max(*lo).min(*hi)),
        Step::Silu => row.iter_mut().for_each(|v| *v = silu32(*v)),
        Step::Residual { .. } | Step::Program(_) => return false,
    }
    true
}

/// `relu` as a select (NaN stays NaN; negatives and `-0.0` become `+0.0`), which vectorises.
#[inline(always)]
pub(crate) fn relu(v: f32) -> f32 {
    if v > 0.0 || v.is_nan() { v } else { 0.0 }
}

/// Applies `steps` to `row`, whose elements all belong to output channel `ch` and start at
/// element `at` of the (`N × O × OH × OW`) output. A step followed by a `relu`, `clip` or
/// SiLU, and a bias or affine step followed by a residual add (and one of those), run as one
/// loop (the same operations per element, in order).
pub(super) fn apply_steps(steps: &[Step], ch: usize, at: usize, row: &mut [f32]) {
    struct Op<'a>(&'a [Step], usize, usize, &'a mut [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            apply_steps_inline(self.0, self.1, self.2, self.3);
        }
    }
    crate::simd::dispatch(Op(steps, ch, at, row));
}

/// The `relu`, `clip` or SiLU step that follows a step, run in the same loop.
#[derive(Clone, Copy)]
enum Post {
    None,
    Relu,
    Clip(f32, f32),
    Silu,
}

impl Post {
    /// `step` as the step that ends a loop, if it is one.
    fn of(step: Option<&Step>) -> Post {
        match step {
            Some(Step::Relu) => Post::Relu,
            Some(&Step::Clip { lo, hi }) => Post::Clip(lo, hi),
            Some(Step::Silu) => Post::Silu,
            _ => Post::None,
        }
    }
}

/// `row[i] = post(f(row[i]))`, one loop per kind of `post` (each vectorises).
#[inline(always)]
fn each(row: &mut [f32], post: Post, f: impl Fn(f32) -> f32) {
    match post {
        Post::None => row.iter_mut().for_each(|v| *v = f(*v)),
        Post::Relu => row.iter_mut().for_each(|v| *v = relu(f(*v))),
        Post::Clip(lo, hi) => row.iter_mut().for_each(|v| *v = f(*v).max(lo).min(hi)),
        Post::Silu => row.iter_mut().for_each(|v| *v = silu32(f(*v))),
    }
}

/// `row[i] = post(f(row[i], src[i]))`, as [`each`].
#[inline(always)]
fn each2(row: &mut [f32], src: &[f32], post: Post, f: impl Fn(f32, f32) -> f32) {
    let pairs = row.iter_mut().zip(src);
    match post {
        Post::None => pairs.for_each(|(v, &q)| *v = f(*v, q)),
        Post::Relu => pairs.for_each(|(v, &q)| *v = relu(f(*v, q))),
        Post::Clip(lo, hi) => pairs.for_each(|(v, &q)| *v = f(*v, q).max(lo).min(hi)),
        Post::Silu => pairs.for_each(|(v, &q)| *v = silu32(f(*v, q))),
    }
}

/// `row[i] = post(add(f(row[i]), src[i]))`, the residual `add` in its operand order
/// (`prev_first`: `f(x) + r`, else `r + f(x)`), as [`each`].
#[inline(always)]
fn each_residual(
    row: &mut [f32],
    src: &[f32],
    post: Post,
    prev_first: bool,
    f: impl Fn(f32) -> f32,
) {
    if prev_first {
        each2(row, src, post, |v, q| f(v) + q);
    } else {
        each2(row, src, post, |v, q| q + f(v));
    }
}

/// What a fused convolution's steps do before the `relu`/`clip` that may end them, when they
/// have one of the shapes a micro-kernel applies to its sums in registers ([`RegSteps`]).
#[derive(Clone, Copy)]
enum Head<'a> {
    None,
    Bias { b: &'a [f32], first: bool },
    Affine { mul: &'a [f32], add: &'a [f32] },
}

/// The steps of a fused convolution in a shape a micro-kernel applies to a run of one
/// channel's outputs before storing them: nothing, a bias or `batch_norm`, a residual add, or
/// a bias or `batch_norm` then a residual add, each optionally followed by a `relu`, `clip`
/// or SiLU (MobileNet's, ResNet's and EfficientNet's epilogues). [`RegSteps::apply_vecs`]
/// gives each element in registers what [`apply_steps`] gives it on the rows.
#[derive(Clone, Copy)]
pub(crate) struct RegSteps<'a> {
    head: Head<'a>,
    /// The residual's data (the whole output's) and whether the sum comes first in its `add`.
    residual: Option<(&'a [f32], bool)>,
    post: Post,
}

impl<'a> RegSteps<'a> {
    /// `steps` as a [`RegSteps`], or `None` when they have another shape.
    pub(crate) fn new(steps: &'a [Step]) -> Option<RegSteps<'a>> {
        let mut rest = steps;
        let head = match rest.first() {
            Some(Step::Bias { b, bias_first }) => {
                rest = &rest[1..];
                Head::Bias {
                    b,
                    first: *bias_first,
                }
            }
            Some(Step::Affine { mul, add }) => {
                rest = &rest[1..];
                Head::Affine { mul, add }
            }
            _ => Head::None,
        };
        let residual = match rest.first() {
            Some(Step::Residual { r, prev_first }) => {
                rest = &rest[1..];
                Some((r.as_f32()?, *prev_first))
            }
            _ => None,
        };
        let post = match rest {
            [] => Post::None,
            [Step::Relu] => Post::Relu,
            [Step::Clip { lo, hi }] => Post::Clip(*lo, *hi),
            [Step::Silu] => Post::Silu,
            _ => return None,
        };
        Some(RegSteps {
            head,
            residual,
            post,
        })
    }

    /// The steps on `N` whole vectors of one channel `ch`'s outputs held in registers (`v`,
    /// lanes in order, from element `at` of the output): what [`apply_steps`] gives them, as
    /// lane-wise operations that round and select as its scalar code does on x86-64, whose `max`/`min` instructions the
    /// clip is written with (tested against [`apply_steps`] with NaN, infinities and signed
    /// zeros; the one caller is the AVX-512 kernel). `false` (nothing done) when a value is
    /// missing.
    #[inline(always)]
    pub(crate) fn apply_vecs<S: pulp::Simd, const N: usize>(
        &self,
        simd: S,
        ch: usize,
        at: usize,
        v: &mut [S::f32s; N],
    ) -> bool {
        let lanes = S::F32_LANES;
        let src = match self.residual {
            Some((r, first)) => match r.get(at..at + N * lanes) {
                Some(src) => Some((src, first)),
                None => return false,
            },
            None => None,
        };
        match self.head {
            Head::None => {}
            Head::Bias { b, first } => {
                let Some(&b) = b.get(ch) else { return false };
                let b = simd.splat_f32s(b);
                for x in v.iter_mut() {
                    *x = if first {
                        simd.add_f32s(b, *x)
                    } else {
                        simd.add_f32s(*x, b)
                    };
                }
            }
            Head::Affine { mul, add } => {
                let (Some(&k), Some(&b)) = (mul.get(ch), add.get(ch)) else {
                    return false;
                };
                let (k, b) = (simd.splat_f32s(k), simd.splat_f32s(b));
                for x in v.iter_mut() {
                    *x = simd.mul_add_f32s(*x, k, b);
                }
            }
        }
        if let Some((src, prev_first)) = src {
            for (x, q) in v.iter_mut().zip(src.chunks_exact(lanes)) {
                let q: S::f32s = bytemuck::pod_read_unaligned(bytemuck::cast_slice(q));
                *x = if prev_first {
                    simd.add_f32s(*x, q)
                } else {
                    simd.add_f32s(q, *x)
                };
            }
        }
        self.post_vecs(simd, v);
        true
    }

    /// The steps on one vector of `S::F32_LANES` consecutive channels `ch0..` of one pixel
    /// (an `NCHW16c` block, element `at` of the output and of the residual, which has the
    /// output's layout): per lane what [`RegSteps::apply_vecs`] gives that channel's element.
    /// `false` (nothing done) when a value is missing.
    #[inline(always)]
    pub(crate) fn apply_block<S: pulp::Simd>(
        &self,
        simd: S,
        ch0: usize,
        at: usize,
        v: &mut S::f32s,
    ) -> bool {
        let mut one = [*v];
        let ok = self.apply_pixels(simd, ch0, at, 0, &mut one);
        *v = one[0];
        ok
    }

    /// [`RegSteps::apply_block`] on `N` pixels' vectors of the same channels `ch0..`, pixel
    /// `j` at element `at + j · stride` (a row of an `NCHW16c` tile): the bias or
    /// `batch_norm` values loaded once and the final step chosen once for all `N`, the same
    /// operations per element. (A 3×3 depthwise output has 9 multiply-adds per vector: with
    /// the steps chosen per vector, they took most of its time on AVX2; session bu.)
    #[inline(always)]
    pub(crate) fn apply_pixels<S: pulp::Simd, const N: usize>(
        &self,
        simd: S,
        ch0: usize,
        at: usize,
        stride: usize,
        v: &mut [S::f32s; N],
    ) -> bool {
        let lanes = S::F32_LANES;
        let load = |s: &[f32], i: usize| -> Option<S::f32s> {
            s.get(i..i + lanes)
                .map(|q| bytemuck::pod_read_unaligned(bytemuck::cast_slice(q)))
        };
        match self.head {
            Head::None => {}
            Head::Bias { b, first } => {
                let Some(b) = load(b, ch0) else { return false };
                for x in v.iter_mut() {
                    *x = if first {
                        simd.add_f32s(b, *x)
                    } else {
                        simd.add_f32s(*x, b)
                    };
                }
            }
            Head::Affine { mul, add } => {
                let (Some(k), Some(b)) = (load(mul, ch0), load(add, ch0)) else {
                    return false;
                };
                for x in v.iter_mut() {
                    *x = simd.mul_add_f32s(*x, k, b);
                }
            }
        }
        if let Some((r, prev_first)) = self.residual {
            for (j, x) in v.iter_mut().enumerate() {
                let Some(q) = load(r, at + j * stride) else {
                    return false;
                };
                *x = if prev_first {
                    simd.add_f32s(*x, q)
                } else {
                    simd.add_f32s(q, *x)
                };
            }
        }
        self.post_vecs(simd, v);
        true
    }

    /// The final `relu`, `clip` or SiLU on vectors in registers.
    #[inline(always)]
    fn post_vecs<S: pulp::Simd>(&self, simd: S, v: &mut [S::f32s]) {
        match self.post {
            Post::None => {}
            Post::Relu => {
                // `relu`: the value where it is above zero or NaN, else `+0.0`.
                let zero = simd.splat_f32s(0.0);
                for x in v.iter_mut() {
                    let keep = simd.or_m32s(
                        simd.greater_than_f32s(*x, zero),
                        simd.not_m32s(simd.equal_f32s(*x, *x)),
                    );
                    *x = simd.select_f32s(keep, *x, zero);
                }
            }
            Post::Clip(lo, hi) => {
                // `x.max(lo).min(hi)` as the compiler lowers it on x86: `max(lo, x)` (`x`
                // where they are equal or `x` is NaN), then `lo` where `x` is NaN; likewise
                // `min(hi, ·)`, then `hi` where its operand is NaN.
                let (lo, hi) = (simd.splat_f32s(lo), simd.splat_f32s(hi));
                for x in v.iter_mut() {
                    let nan = simd.not_m32s(simd.equal_f32s(*x, *x));
                    let m = simd.select_f32s(nan, lo, simd.max_f32s(lo, *x));
                    let nan = simd.not_m32s(simd.equal_f32s(m, m));
                    *x = simd.select_f32s(nan, hi, simd.min_f32s(hi, m));
                }
            }
            Post::Silu => {
                let k = std::hint::black_box(&SILU_K);
                for x in v.iter_mut() {
                    *x = silu32_vec(simd, k, *x);
                }
            }
        }
    }
}

#[inline(always)]
pub(super) fn apply_steps_inline(steps: &[Step], ch: usize, at: usize, row: &mut [f32]) {
    let mut i = 0;
    while let Some(s) = steps.get(i) {
        // A bias or affine step, then a residual add (then a `relu`, `clip` or SiLU), as one
        // loop (ResNet's bias + shortcut + relu; the same operations per element, in order).
        if let (Step::Affine { .. } | Step::Bias { .. }, Some(Step::Residual { r, prev_first })) =
            (s, steps.get(i + 1))
            && let Some(src) = r.as_f32().and_then(|d| d.get(at..at + row.len()))
        {
            let post = Post::of(steps.get(i + 2));
            let first = *prev_first;
            match s {
                Step::Affine { mul, add } => {
                    let (k, b) = (mul[ch], add[ch]);
                    each_residual(row, src, post, first, |v| v.mul_add(k, b));
                }
                Step::Bias {
                    b,
                    bias_first: true,
                } => {
                    let b = b[ch];
                    each_residual(row, src, post, first, |v| b + v);
                }
                Step::Bias { b, .. } => {
                    let b = b[ch];
                    each_residual(row, src, post, first, |v| v + b);
                }
                _ => {}
            }
            i += if matches!(post, Post::None) { 2 } else { 3 };
            continue;
        }
        // A `relu`, `clip` or SiLU right after an affine, bias or residual step joins its
        // loop (the same operations per element).
        let post = match s {
            Step::Affine { .. } | Step::Bias { .. } | Step::Residual { .. } => {
                Post::of(steps.get(i + 1))
            }
            _ => Post::None,
        };
        if !matches!(post, Post::None) {
            i += 1;
        }
        match s {
            Step::Affine { mul, add } => {
                let (k, b) = (mul[ch], add[ch]);
                each(row, post, |v| v.mul_add(k, b));
            }
            Step::Bias { b, bias_first } => {
                let b = b[ch];
                // `add(b, x)` keeps its operand order (the same NaN payload, too).
                if *bias_first {
                    each(row, post, |v| b + v);
                } else {
                    each(row, post, |v| v + b);
                }
            }
            Step::Residual { r, prev_first } => {
                // `conv2d_fused` checked the shape, so the slice is there.
                if let Some(src) = r.as_f32().and_then(|d| d.get(at..at + row.len())) {
                    // `add(x, r)` or `add(r, x)`: the operand order of the op it replaces.
                    if *prev_first {
                        each2(row, src, post, |v, q| v + q);
                    } else {
                        each2(row, src, post, |v, q| q + v);
                    }
                } else {
                    each(row, post, |v| v);
                }
            }
            Step::Relu => row.iter_mut().for_each(|v| *v = relu(*v)),
            Step::Clip { lo, hi } => row.iter_mut().for_each(|v| *v = v.max(*lo).min(*hi)),
            Step::Silu => row.iter_mut().for_each(|v| *v = silu32(*v)),
            Step::Program(p) => p.0.apply(at, row),
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;

    /// Bits of a slice, so that NaN payloads and signed zeros compare too.
    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// [`RegSteps::apply_vecs`] gives each lane the bits [`apply_steps`] gives it on the row:
    /// NaN (two payloads, also in the bias, so that an `add` of two NaNs shows which operand
    /// it keeps), infinities, signed zeros at the clip bounds, a bias of `-0.0`, every step
    /// shape it takes, on the widest instruction set of this CPU.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn steps_on_vectors_equal_the_steps_on_rows() {
        struct Case<'a>(&'a [Step], usize, &'a [f32]);
        impl pulp::WithSimd for Case<'_> {
            type Output = Vec<u32>;
            #[inline(always)]
            fn with_simd<S: pulp::Simd>(self, simd: S) -> Vec<u32> {
                let Case(steps, ch, vals) = self;
                let reg = RegSteps::new(steps).unwrap_or_else(|| panic!("{steps:?}"));
                let mut out = Vec::new();
                for chunk in vals.chunks_exact(2 * S::F32_LANES) {
                    let mut v: [S::f32s; 2] = std::array::from_fn(|i| {
                        bytemuck::pod_read_unaligned(bytemuck::cast_slice(
                            &chunk[i * S::F32_LANES..(i + 1) * S::F32_LANES],
                        ))
                    });
                    let at = out.len();
                    assert!(reg.apply_vecs(simd, ch, at, &mut v));
                    let lanes: &[f32] = bytemuck::cast_slice(&v[..]);
                    out.extend(lanes.iter().map(|x| x.to_bits()));
                }
                out
            }
        }
        let nan_a = f32::from_bits(0x7fc0_0123);
        let nan_b = f32::from_bits(0xffc0_0456);
        let special = [
            nan_a,
            nan_b,
            -0.0,
            0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            6.0,
            -6.0,
            0.5,
            -0.5,
            1e-40,
            -1e-40,
            7.25,
            -3.5,
            1.0,
            -1.0,
        ];
        // 64 values: every special value against every lane position of two 16-lane vectors.
        let vals: Vec<f32> = (0..64).map(|i| special[(i * 7 + i / 16) % 16]).collect();
        let residual = Tensor::from_f32(
            vec![1, 1, 1, 64],
            (0..64).map(|i| special[(i * 5 + 3) % 16]).collect(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // Channel 2 has a NaN bias, channel 3 a bias of -0.0.
        let b = vec![0.25, -1.5, nan_b, -0.0];
        let k = vec![2.0, -0.5, 0.0, nan_a];
        let mut chains: Vec<Vec<Step>> = Vec::new();
        let posts = [
            vec![],
            vec![Step::Relu],
            vec![Step::Clip { lo: 0.0, hi: 6.0 }],
            vec![Step::Clip { lo: -0.0, hi: 0.0 }],
            vec![Step::Silu],
        ];
        for post in &posts {
            for head in [
                vec![],
                vec![Step::Bias {
                    b: b.clone(),
                    bias_first: false,
                }],
                vec![Step::Bias {
                    b: b.clone(),
                    bias_first: true,
                }],
                vec![Step::Affine {
                    mul: k.clone(),
                    add: b.clone(),
                }],
            ] {
                for res in [None, Some(true), Some(false)] {
                    let mut steps = head.clone();
                    if let Some(prev_first) = res {
                        steps.push(Step::Residual {
                            r: residual.clone(),
                            prev_first,
                        });
                    }
                    steps.extend(post.iter().cloned());
                    chains.push(steps);
                }
            }
        }
        for steps in &chains {
            for ch in 0..4 {
                let want: Vec<u32> = vals
                    .chunks_exact(32)
                    .enumerate()
                    .flat_map(|(i, chunk)| {
                        let mut row = chunk.to_vec();
                        apply_steps(steps, ch, i * 32, &mut row);
                        bits(&row)
                    })
                    .collect();
                let got = crate::simd::dispatch(Case(steps, ch, &vals));
                // Where an operation met two NaNs (the value and the residual, a NaN bias or
                // a NaN scale), which payload it keeps is the compiler's choice (it may commute
                // the operands, in the row code as here): both NaN is all that holds there.
                let two_nans = |i: usize| {
                    let res = steps.iter().any(|s| matches!(s, Step::Residual { .. }));
                    let bias = steps
                        .iter()
                        .any(|s| matches!(s, Step::Bias { .. } | Step::Affine { .. }));
                    let affine = steps.iter().any(|s| matches!(s, Step::Affine { .. }));
                    let nans = [
                        vals[i].is_nan(),
                        res && residual.as_f32().is_some_and(|r| r[i].is_nan()),
                        bias && b[ch].is_nan(),
                        affine && k[ch].is_nan(),
                    ];
                    nans.iter().filter(|&&n| n).count() >= 2
                };
                // SiLU multiplies a NaN by the NaN it made of it: its payload is not pinned
                // either.
                let silu = steps.contains(&Step::Silu);
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let nans = f32::from_bits(g).is_nan() && f32::from_bits(w).is_nan();
                    assert!(
                        g == w || (nans && (silu || two_nans(i))),
                        "{steps:?} on channel {ch}, lane {i}: {g:#x} against {w:#x}"
                    );
                }
                assert_eq!(got.len(), want.len());
            }
        }
    }

    /// Per-channel steps on a block of pixels × channels (before the write-back of the column
    /// kernel) give each element the bits the steps give it on its channel's row, NaN,
    /// infinities and signed zeros included; a residual splits the steps, and running the
    /// rest on the rows afterwards gives the bits of running all of them on the rows.
    #[test]
    fn channel_steps_on_a_block_equal_the_steps_on_rows() {
        const N: usize = 8;
        let (ch0, cols, pixels) = (3usize, 7usize, 5usize);
        let channels = ch0 + cols;
        let special = [
            f32::NAN,
            -0.0,
            0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            7.5,
            -7.5,
        ];
        let value = |p: usize, c: usize| {
            let i = p * cols + c;
            special
                .get(i)
                .copied()
                .unwrap_or(((i * 37) % 23) as f32 * 0.7 - 8.0)
        };
        let per = |k: usize| -> Vec<f32> {
            (0..channels)
                .map(|c| ((c * k + 5) % 11) as f32 * 0.25 - 1.0)
                .collect()
        };
        let residual = Tensor::from_f32(
            vec![1, channels, 1, pixels],
            (0..channels * pixels)
                .map(|i| ((i * 13) % 17) as f32 * 0.5 - 4.0)
                .collect(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let chains: Vec<Vec<Step>> = vec![
            vec![
                Step::Bias {
                    b: per(3),
                    bias_first: false,
                },
                Step::Clip { lo: 0.0, hi: 6.0 },
            ],
            vec![
                Step::Bias {
                    b: per(5),
                    bias_first: true,
                },
                Step::Relu,
            ],
            vec![
                Step::Affine {
                    mul: per(7),
                    add: per(2),
                },
                Step::Relu,
            ],
            vec![
                Step::Bias {
                    b: per(3),
                    bias_first: false,
                },
                Step::Residual {
                    r: residual.clone(),
                    prev_first: true,
                },
                Step::Relu,
            ],
            vec![
                Step::Affine {
                    mul: per(7),
                    add: per(2),
                },
                Step::Residual {
                    r: residual,
                    prev_first: false,
                },
                Step::Clip { lo: -1.0, hi: 1.0 },
            ],
        ];
        for steps in &chains {
            // On rows: channel c's row holds pixels 0..pixels (at c · pixels of the output).
            let mut rows: Vec<Vec<f32>> = (0..channels)
                .map(|c| {
                    (0..pixels)
                        .map(|p| if c >= ch0 { value(p, c - ch0) } else { 0.0 })
                        .collect()
                })
                .collect();
            for (c, row) in rows.iter_mut().enumerate().skip(ch0) {
                apply_steps(steps, c, c * pixels, row);
            }
            // On the block, then the rest on the rows.
            let k = channel_prefix(steps);
            let mut block = vec![[f32::NAN; N]; pixels];
            for (p, r) in block.iter_mut().enumerate() {
                for (c, v) in r.iter_mut().enumerate().take(cols) {
                    *v = value(p, c);
                }
            }
            apply_channel_steps(&steps[..k], ch0, cols, &mut block);
            for c in 0..cols {
                let mut row: Vec<f32> = block.iter().map(|r| r[c]).collect();
                apply_steps(&steps[k..], ch0 + c, (ch0 + c) * pixels, &mut row);
                assert_eq!(bits(&row), bits(&rows[ch0 + c]), "{steps:?}, channel {c}");
            }
            // Columns past `cols` are left alone.
            assert!(block.iter().all(|r| r[cols].is_nan()));
        }
        assert_eq!(channel_prefix(&chains[3]), 1);
        assert_eq!(channel_prefix(&chains[0]), 2);
    }
}
