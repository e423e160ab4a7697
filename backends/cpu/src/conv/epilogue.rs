//! The epilogue of a fused convolution: the per-output-channel steps (`batch_norm` for
//! inference, bias, residual add, ReLU, clip, an elementwise program) that FuseOps groups after
//! a `conv2d`, applied to each finished row of the output while it is in cache.
//!
//! Contract: [`apply_steps`] gives each element what the ops give one by one, in their order
//! and operand order (the same bits, NaN payloads included); a bias or affine step followed by
//! a residual add (and a `relu` or `clip`), and any step followed by a `relu` or `clip`, run as
//! one loop over the row.
//!
//! ```text
//! lv = R.nn.conv2d(x, w)          # the kernel
//! lv1 = R.add(lv, b)              # Step::Bias
//! gv = R.nn.relu(R.add(lv1, r))   # Step::Residual, Step::Relu: with the bias, one loop per row
//! ```

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
            Step::Residual { .. } | Step::Relu | Step::Clip { .. } | Step::Program(_) => None,
        }
    }
}

/// `relu` as a select (NaN stays NaN; negatives and `-0.0` become `+0.0`), which vectorises.
#[inline(always)]
pub(crate) fn relu(v: f32) -> f32 {
    if v > 0.0 || v.is_nan() { v } else { 0.0 }
}

/// Applies `steps` to `row`, whose elements all belong to output channel `ch` and start at
/// element `at` of the (`N × O × OH × OW`) output. A step followed by a `relu` or `clip`, and
/// a bias or affine step followed by a residual add (and a `relu` or `clip`), run as one loop
/// (the same operations per element, in order).
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

/// The `relu` or `clip` step that follows a step, run in the same loop.
#[derive(Clone, Copy)]
enum Post {
    None,
    Relu,
    Clip(f32, f32),
}

/// `row[i] = post(f(row[i]))`, one loop per kind of `post` (each vectorises).
#[inline(always)]
fn each(row: &mut [f32], post: Post, f: impl Fn(f32) -> f32) {
    match post {
        Post::None => row.iter_mut().for_each(|v| *v = f(*v)),
        Post::Relu => row.iter_mut().for_each(|v| *v = relu(f(*v))),
        Post::Clip(lo, hi) => row.iter_mut().for_each(|v| *v = f(*v).max(lo).min(hi)),
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

#[inline(always)]
pub(super) fn apply_steps_inline(steps: &[Step], ch: usize, at: usize, row: &mut [f32]) {
    let mut i = 0;
    while let Some(s) = steps.get(i) {
        // A bias or affine step, then a residual add (then a `relu` or `clip`), as one loop
        // (ResNet's bias + shortcut + relu; the same operations per element, in order).
        if let (Step::Affine { .. } | Step::Bias { .. }, Some(Step::Residual { r, prev_first })) =
            (s, steps.get(i + 1))
            && let Some(src) = r.as_f32().and_then(|d| d.get(at..at + row.len()))
        {
            let post = match steps.get(i + 2) {
                Some(Step::Relu) => Post::Relu,
                Some(&Step::Clip { lo, hi }) => Post::Clip(lo, hi),
                _ => Post::None,
            };
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
        // A `relu` or `clip` right after an affine, bias or residual step joins its loop
        // (the same operations per element).
        let post = match (s, steps.get(i + 1)) {
            (Step::Affine { .. } | Step::Bias { .. } | Step::Residual { .. }, Some(Step::Relu)) => {
                Post::Relu
            }
            (
                Step::Affine { .. } | Step::Bias { .. } | Step::Residual { .. },
                Some(&Step::Clip { lo, hi }),
            ) => Post::Clip(lo, hi),
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
            Step::Program(p) => p.0.apply(at, row),
        }
        i += 1;
    }
}
