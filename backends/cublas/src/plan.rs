//! The cuBLASLt matmul plan of one call: a pure-Rust description of every descriptor,
//! layout and launch, built from a [`MatmulSpec`](crate::spec::MatmulSpec)'s dtypes and
//! epilogue and the concrete shapes of the call. Nothing here touches a GPU; `crate::lt`
//! turns a plan into cuBLASLt objects.
//!
//! Contract — the row-major recipe. fusebox tensors are row-major; cuBLASLt is column-major.
//! A row-major `C[M,N] = X[M,K] · W[K,N]` is the column-major `Cᵀ[N,M] = Wᵀ[N,K] · Xᵀ[K,M]`,
//! and the bytes of a row-major `R×C` matrix are those of a column-major `C×R` one. So the
//! plan passes **the rhs as cuBLASLt's A and the lhs as B**, with
//!
//! ```text
//! m = N, n = M, k = K
//! A = rhs:  op N, stored N×K, lda = N         (rhs W[K,N] row-major)
//!           op T, stored K×N, lda = K         (rhs = permute_dims(w), w[N,K] row-major)
//! B = lhs:  op N, stored K×M, ldb = K
//! C = D:    stored N×M, ldc = ldd = N          (beta = 0: C is not read)
//! bias:     N values, one per row of D = per column of the row-major output
//! ```
//!
//! Batches: the batch dims broadcast as numpy does. When both operands carry the whole batch
//! it is one strided-batched launch (strides K·N, M·K, M·N); a batched lhs with an unbatched rhs
//! is flattened into M (one plain GEMM, as TVM does); an unbatched lhs with a batched rhs uses
//! batch stride 0 for B; any other broadcast (e.g. `(2,1,…) × (1,2,…)`) becomes one launch per
//! batch entry with explicit offsets. 1-D operands get a unit M or N that the output drops.
//!
//! Types: float16/bfloat16 inputs compute in `CUBLAS_COMPUTE_32F` with a float32 scale;
//! float32 in `CUBLAS_COMPUTE_32F` (true fp32) unless TF32 is allowed
//! (`CUBLAS_COMPUTE_32F_FAST_TF32`); int8 in `CUBLAS_COMPUTE_32I` with an int32 scale and an
//! int32 D. The bias has D's type (cuBLASLt's default bias type). Workspace: 32 MiB.
//!
//! ```
//! use fusebox_cublas::plan::{PlanRequest, Epilogue, build_plan};
//! use fusebox_core::ir::DType;
//! let p = build_plan(&PlanRequest {
//!     lhs: vec![16, 32], rhs: vec![64, 32], rhs_transposed: true, bias: Some(vec![64]),
//!     in_dtype: DType::F16, out_dtype: DType::F16, activation: None, scaled: false,
//!     allow_tf32: false,
//! }).unwrap();
//! assert_eq!((p.m, p.n, p.k, p.trans_a), (64, 16, 32, true));
//! assert_eq!((p.a.ld, p.b.ld, p.d.ld), (32, 32, 64));
//! assert_eq!(p.epilogue, Epilogue::Bias);
//! assert_eq!(p.out_shape, vec![16, 64]);
//! ```

use crate::error::{Error, Result};
use crate::spec::Activation;
use fusebox_core::ir::DType;
use std::fmt;

/// 32 MiB, as NVIDIA suggests for Hopper (TVM and cudarc use the same).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// cuBLASLt's epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Epilogue {
    /// `CUBLASLT_EPILOGUE_DEFAULT`: D = alpha·A·B.
    Default,
    /// `CUBLASLT_EPILOGUE_RELU`.
    Relu,
    /// `CUBLASLT_EPILOGUE_GELU` (tanh approximation).
    Gelu,
    /// `CUBLASLT_EPILOGUE_BIAS`: add the bias vector to every column of D.
    Bias,
    /// `CUBLASLT_EPILOGUE_RELU_BIAS`: bias, then relu.
    ReluBias,
    /// `CUBLASLT_EPILOGUE_GELU_BIAS`: bias, then GELU (tanh approximation).
    GeluBias,
}

impl Epilogue {
    /// The epilogue for an optional bias and activation.
    pub fn of(bias: bool, act: Option<Activation>) -> Epilogue {
        match (bias, act) {
            (false, None) => Epilogue::Default,
            (false, Some(Activation::Relu)) => Epilogue::Relu,
            (false, Some(Activation::Gelu)) => Epilogue::Gelu,
            (true, None) => Epilogue::Bias,
            (true, Some(Activation::Relu)) => Epilogue::ReluBias,
            (true, Some(Activation::Gelu)) => Epilogue::GeluBias,
        }
    }

    /// Whether it reads a bias vector.
    pub fn has_bias(self) -> bool {
        matches!(
            self,
            Epilogue::Bias | Epilogue::ReluBias | Epilogue::GeluBias
        )
    }

    /// cuBLAS's name.
    pub fn name(self) -> &'static str {
        match self {
            Epilogue::Default => "CUBLASLT_EPILOGUE_DEFAULT",
            Epilogue::Relu => "CUBLASLT_EPILOGUE_RELU",
            Epilogue::Gelu => "CUBLASLT_EPILOGUE_GELU",
            Epilogue::Bias => "CUBLASLT_EPILOGUE_BIAS",
            Epilogue::ReluBias => "CUBLASLT_EPILOGUE_RELU_BIAS",
            Epilogue::GeluBias => "CUBLASLT_EPILOGUE_GELU_BIAS",
        }
    }
}

/// cuBLAS's compute type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Compute {
    /// `CUBLAS_COMPUTE_32F`.
    F32,
    /// `CUBLAS_COMPUTE_32F_FAST_TF32` (float32 operands on TF32 tensor cores).
    F32FastTf32,
    /// `CUBLAS_COMPUTE_32I`.
    I32,
}

/// The type of alpha and beta.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScaleType {
    /// `CUDA_R_32F`.
    F32,
    /// `CUDA_R_32I`.
    I32,
}

/// One matrix layout (column-major): stored rows, columns, leading dim, batch count and
/// stride, all in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Layout {
    /// cuBLAS's data type of the elements.
    pub dtype: DType,
    /// Stored rows.
    pub rows: u64,
    /// Stored columns.
    pub cols: u64,
    /// Leading dimension (>= rows).
    pub ld: i64,
    /// `CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT` (1: not batched).
    pub batch: i32,
    /// `CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET` (0 with `batch = 1`, or a broadcast).
    pub batch_stride: i64,
}

/// One `cublasLtMatmul` call: element offsets into A, B and D (the bias is never offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Launch {
    /// Offset into the rhs (cuBLASLt's A), in elements.
    pub a: u64,
    /// Offset into the lhs (cuBLASLt's B), in elements.
    pub b: u64,
    /// Offset into the output, in elements.
    pub d: u64,
}

/// What [`build_plan`] needs: the concrete shapes of one call and the spec's types.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PlanRequest {
    /// The lhs shape.
    pub lhs: Vec<usize>,
    /// The rhs shape as stored (`w` of `permute_dims(w)` when transposed).
    pub rhs: Vec<usize>,
    /// Whether the rhs is read transposed (last two axes).
    pub rhs_transposed: bool,
    /// The bias shape, when there is one.
    pub bias: Option<Vec<usize>>,
    /// The dtype of lhs and rhs.
    pub in_dtype: DType,
    /// The dtype of the result.
    pub out_dtype: DType,
    /// The activation.
    pub activation: Option<Activation>,
    /// Whether alpha is `sa * sb` from two scale tensors (else 1).
    pub scaled: bool,
    /// Whether float32 may run on TF32 tensor cores.
    pub allow_tf32: bool,
}

/// A cuBLASLt matmul plan (see the module doc). Equal plans share descriptors and algorithms.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LtPlan {
    /// Rows of op(A) and of D: the output's N.
    pub m: u64,
    /// Columns of op(B) and of D: the output's M (times the flattened lhs batch).
    pub n: u64,
    /// The reduction dim K.
    pub k: u64,
    /// `CUBLASLT_MATMUL_DESC_TRANSA`: the rhs was given as `permute_dims(w)`.
    pub trans_a: bool,
    /// `CUBLASLT_MATMUL_DESC_TRANSB`: always false (the lhs is never transposed).
    pub trans_b: bool,
    /// A (the rhs).
    pub a: Layout,
    /// B (the lhs).
    pub b: Layout,
    /// C and D (the output; C has D's layout and is not read, beta = 0).
    pub d: Layout,
    /// The compute type.
    pub compute: Compute,
    /// The alpha/beta type.
    pub scale_type: ScaleType,
    /// The epilogue.
    pub epilogue: Epilogue,
    /// The bias length (N) when the epilogue has a bias; its type is D's.
    pub bias_len: Option<u64>,
    /// Whether alpha is read from the two scale tensors.
    pub scaled: bool,
    /// The calls, usually one; several for mixed batch broadcasting. Empty for an empty output.
    pub launches: Vec<Launch>,
    /// The output's shape (row-major, contiguous).
    pub out_shape: Vec<usize>,
    /// Workspace bytes offered to the heuristic and to each call.
    pub workspace: usize,
}

impl LtPlan {
    /// Elements of the output.
    pub fn out_numel(&self) -> usize {
        self.out_shape.iter().product()
    }

    /// A one-line description (for errors and benchmark output).
    pub fn describe(&self) -> String {
        format!(
            "m={} n={} k={} {}{} batch={} {}x{}->{} {:?} {}",
            self.m,
            self.n,
            self.k,
            if self.trans_a { "T" } else { "N" },
            if self.trans_b { "T" } else { "N" },
            self.d.batch,
            self.a.dtype,
            self.b.dtype,
            self.d.dtype,
            self.compute,
            self.epilogue.name()
        )
    }
}

impl fmt::Display for LtPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

fn plan_err(msg: impl Into<String>) -> Error {
    Error::Plan(msg.into())
}

fn to_u64(x: usize) -> Result<u64> {
    u64::try_from(x).map_err(|_| plan_err("a dim does not fit in 64 bits"))
}

fn to_i64(x: usize) -> Result<i64> {
    i64::try_from(x).map_err(|_| plan_err("a dim does not fit in 64 bits"))
}

fn mul(a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| plan_err("the problem size overflows"))
}

fn numel(s: &[usize]) -> Result<usize> {
    s.iter().try_fold(1usize, |acc, &d| mul(acc, d))
}

/// Numpy broadcasting of two batch shapes.
fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let x = (i + a.len()).checked_sub(n).map_or(1, |j| a[j]);
        let y = (i + b.len()).checked_sub(n).map_or(1, |j| b[j]);
        out.push(match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(plan_err(format!(
                    "batch dims {a:?} and {b:?} do not broadcast"
                )));
            }
        });
    }
    Ok(out)
}

/// Per batch entry of `out`, the matrix index into an operand of batch shape `own`.
fn batch_indices(own: &[usize], out: &[usize]) -> Vec<usize> {
    let total: usize = out.iter().product();
    let pad = out.len() - own.len();
    // Row-major strides of `own`, in matrices, 0 where it broadcasts.
    let mut strides = vec![0usize; out.len()];
    let mut s = 1usize;
    for i in (0..own.len()).rev() {
        strides[pad + i] = if own[i] == 1 { 0 } else { s };
        s = s.saturating_mul(own[i]);
    }
    let mut idx = vec![0usize; out.len()];
    let mut res = Vec::with_capacity(total);
    for _ in 0..total {
        res.push(idx.iter().zip(&strides).map(|(i, s)| i * s).sum());
        for d in (0..out.len()).rev() {
            idx[d] += 1;
            if idx[d] < out[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    res
}

/// Builds the plan of one call (see the module doc).
pub fn build_plan(req: &PlanRequest) -> Result<LtPlan> {
    let (lr, rr) = (req.lhs.len(), req.rhs.len());
    if lr == 0 || rr == 0 {
        return Err(plan_err("an operand is a scalar"));
    }
    let (compute, scale_type) = match (req.in_dtype, req.out_dtype) {
        (DType::F16, DType::F16 | DType::F32) | (DType::BF16, DType::BF16 | DType::F32) => {
            (Compute::F32, ScaleType::F32)
        }
        (DType::F32, DType::F32) => (
            if req.allow_tf32 {
                Compute::F32FastTf32
            } else {
                Compute::F32
            },
            ScaleType::F32,
        ),
        (DType::I8, DType::I32) => (Compute::I32, ScaleType::I32),
        (i, o) => {
            return Err(plan_err(format!(
                "no cuBLASLt type combination for {i} operands and a {o} result"
            )));
        }
    };
    let epilogue = Epilogue::of(req.bias.is_some(), req.activation);
    if compute == Compute::I32 && (epilogue != Epilogue::Default || req.scaled) {
        return Err(plan_err("int8 GEMMs take no epilogue"));
    }
    // Numpy matmul: a 1-D lhs is [1, K] and a 1-D rhs is [K, 1], the unit dim dropped after.
    let (m, k, lb): (usize, usize, &[usize]) = if lr == 1 {
        (1, req.lhs[0], &[])
    } else {
        (req.lhs[lr - 2], req.lhs[lr - 1], &req.lhs[..lr - 2])
    };
    // The rhs as the matmul reads it: [.., K, N].
    let transposed = req.rhs_transposed && rr >= 2;
    let (k2, n, rb): (usize, usize, &[usize]) = if rr == 1 {
        (req.rhs[0], 1, &[])
    } else if transposed {
        (req.rhs[rr - 1], req.rhs[rr - 2], &req.rhs[..rr - 2])
    } else {
        (req.rhs[rr - 2], req.rhs[rr - 1], &req.rhs[..rr - 2])
    };
    if k != k2 {
        return Err(plan_err(format!(
            "reduction dims differ: lhs {:?} has {k} columns, rhs{} {:?} has {k2} rows",
            req.lhs,
            if transposed { " (transposed)" } else { "" },
            req.rhs
        )));
    }
    if k == 0 {
        return Err(plan_err("an empty reduction (K = 0)"));
    }
    let batch = broadcast(lb, rb)?;
    let mut out_shape = batch.clone();
    if lr != 1 {
        out_shape.push(m);
    }
    if rr != 1 {
        out_shape.push(n);
    }
    let bias_len = match &req.bias {
        None => None,
        Some(bs) => {
            let total = numel(bs)?;
            let last = bs.last().copied().unwrap_or(1);
            if total != last || last != n {
                return Err(plan_err(format!(
                    "the bias {bs:?} is not a vector of N = {n} values (cuBLASLt's bias \
                     epilogue reads one value per output column)"
                )));
            }
            // A bias of higher rank than the matmul adds leading unit dims to the result.
            while out_shape.len() < bs.len() {
                out_shape.insert(0, 1);
            }
            Some(to_u64(n)?)
        }
    };
    let (lbn, rbn, nb) = (numel(lb)?, numel(rb)?, numel(&batch)?);
    let (mk, kn, mn) = (mul(m, k)?, mul(k, n)?, mul(m, n)?);
    numel(&out_shape)?;
    // Decide the batching: (gemm columns n_cm, batch count, A/B strides, explicit launches).
    let full = |own: &[usize]| {
        let pad = batch.len() - own.len();
        own.iter().enumerate().all(|(i, &d)| d == batch[pad + i]) && numel(own).ok() == Some(nb)
    };
    let (n_cm, count, stride_a, stride_b, launches): (usize, usize, usize, usize, Vec<Launch>) =
        if nb == 0 || m == 0 || n == 0 {
            (m, 1, 0, 0, Vec::new())
        } else if nb == 1 {
            (m, 1, 0, 0, vec![Launch { a: 0, b: 0, d: 0 }])
        } else if rbn == 1 {
            // Flatten the lhs batch into M: [lb.., M, K] is [lb*M, K].
            (mul(nb, m)?, 1, 0, 0, vec![Launch { a: 0, b: 0, d: 0 }])
        } else if full(lb) && full(rb) {
            (m, nb, kn, mk, vec![Launch { a: 0, b: 0, d: 0 }])
        } else if lbn == 1 && full(rb) {
            (m, nb, kn, 0, vec![Launch { a: 0, b: 0, d: 0 }])
        } else {
            let (ia, ib) = (batch_indices(rb, &batch), batch_indices(lb, &batch));
            let mut v = Vec::with_capacity(nb);
            for (i, (&a, &b)) in ia.iter().zip(&ib).enumerate() {
                v.push(Launch {
                    a: to_u64(mul(a, kn)?)?,
                    b: to_u64(mul(b, mk)?)?,
                    d: to_u64(mul(i, mn)?)?,
                });
            }
            (m, 1, 0, 0, v)
        };
    let count = i32::try_from(count).map_err(|_| plan_err("more than 2^31 batches"))?;
    let (n64, m64, k64) = (to_u64(n)?, to_u64(n_cm)?, to_u64(k)?);
    let a = if transposed {
        Layout {
            dtype: req.in_dtype,
            rows: k64,
            cols: n64,
            ld: to_i64(k.max(1))?,
            batch: count,
            batch_stride: to_i64(stride_a)?,
        }
    } else {
        Layout {
            dtype: req.in_dtype,
            rows: n64,
            cols: k64,
            ld: to_i64(n.max(1))?,
            batch: count,
            batch_stride: to_i64(stride_a)?,
        }
    };
    let b = Layout {
        dtype: req.in_dtype,
        rows: k64,
        cols: m64,
        ld: to_i64(k.max(1))?,
        batch: count,
        batch_stride: to_i64(stride_b)?,
    };
    let d = Layout {
        dtype: req.out_dtype,
        rows: n64,
        cols: m64,
        ld: to_i64(n.max(1))?,
        batch: count,
        batch_stride: if count > 1 { to_i64(mn)? } else { 0 },
    };
    Ok(LtPlan {
        m: n64,
        n: m64,
        k: k64,
        trans_a: transposed,
        trans_b: false,
        a,
        b,
        d,
        compute,
        scale_type,
        epilogue,
        bias_len,
        scaled: req.scaled,
        launches,
        out_shape,
        workspace: WORKSPACE_BYTES,
    })
}

/// The largest power of two (at most 256) dividing a device address: what
/// `CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES` should say for a pointer.
pub fn alignment_of(addr: u64) -> u32 {
    if addr == 0 {
        return 256;
    }
    let low = addr & addr.wrapping_neg();
    u32::try_from(low.min(256)).unwrap_or(256)
}

/// The alignment preferences of one call: the least alignment over its launches of each of
/// A, B, C/D (bytes), plus the bias pointer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Alignments {
    /// A (the rhs).
    pub a: u32,
    /// B (the lhs).
    pub b: u32,
    /// C and D.
    pub d: u32,
    /// The bias (256 when there is none).
    pub bias: u32,
}

impl Alignments {
    /// The alignments of a call with base addresses `a`, `b`, `d`, `bias` under `plan`.
    pub fn of(plan: &LtPlan, a: u64, b: u64, d: u64, bias: Option<u64>) -> Alignments {
        let (ea, eb, ed) = (
            plan.a.dtype.size_bytes() as u64,
            plan.b.dtype.size_bytes() as u64,
            plan.d.dtype.size_bytes() as u64,
        );
        let least = |base: u64, off: &dyn Fn(&Launch) -> u64, es: u64| {
            plan.launches
                .iter()
                .map(|l| alignment_of(base.wrapping_add(off(l).wrapping_mul(es))))
                .min()
                .unwrap_or_else(|| alignment_of(base))
        };
        Alignments {
            a: least(a, &|l| l.a, ea),
            b: least(b, &|l| l.b, eb),
            d: least(d, &|l| l.d, ed),
            bias: bias.map_or(256, alignment_of),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]
    use super::*;
    use proptest::prelude::*;

    fn req(lhs: &[usize], rhs: &[usize], t: bool) -> PlanRequest {
        PlanRequest {
            lhs: lhs.to_vec(),
            rhs: rhs.to_vec(),
            rhs_transposed: t,
            bias: None,
            in_dtype: DType::F16,
            out_dtype: DType::F16,
            activation: None,
            scaled: false,
            allow_tf32: false,
        }
    }

    #[test]
    fn plain_gemm_is_the_operand_swap() {
        let p = build_plan(&req(&[16, 32], &[32, 64], false)).unwrap();
        assert_eq!((p.m, p.n, p.k), (64, 16, 32));
        assert!(!p.trans_a && !p.trans_b);
        assert_eq!((p.a.rows, p.a.cols, p.a.ld), (64, 32, 64));
        assert_eq!((p.b.rows, p.b.cols, p.b.ld), (32, 16, 32));
        assert_eq!((p.d.rows, p.d.cols, p.d.ld), (64, 16, 64));
        assert_eq!(p.out_shape, vec![16, 64]);
        assert_eq!(p.launches, vec![Launch { a: 0, b: 0, d: 0 }]);
        assert_eq!(p.epilogue, Epilogue::Default);
        assert_eq!((p.compute, p.scale_type), (Compute::F32, ScaleType::F32));
        assert_eq!(p.workspace, 32 * 1024 * 1024);
    }

    #[test]
    fn transposed_rhs_is_op_t() {
        let p = build_plan(&req(&[16, 32], &[64, 32], true)).unwrap();
        assert!(p.trans_a);
        assert_eq!((p.a.rows, p.a.cols, p.a.ld), (32, 64, 32));
        assert_eq!(p.out_shape, vec![16, 64]);
        let e = build_plan(&req(&[16, 32], &[32, 64], true)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cuBLASLt plan: reduction dims differ: lhs [16, 32] has 32 columns, rhs (transposed) \
             [32, 64] has 64 rows"
        );
    }

    #[test]
    fn epilogues_and_types() {
        let mut r = req(&[8, 16], &[16, 24], false);
        r.bias = Some(vec![24]);
        r.activation = Some(Activation::Relu);
        let p = build_plan(&r).unwrap();
        assert_eq!((p.epilogue, p.bias_len), (Epilogue::ReluBias, Some(24)));
        r.activation = Some(Activation::Gelu);
        assert_eq!(build_plan(&r).unwrap().epilogue, Epilogue::GeluBias);
        r.bias = Some(vec![1, 1, 24]);
        assert_eq!(build_plan(&r).unwrap().out_shape, vec![1, 8, 24]);
        r.bias = Some(vec![1]);
        assert!(
            build_plan(&r)
                .unwrap_err()
                .to_string()
                .contains("not a vector of N = 24")
        );
        r.bias = None;
        assert_eq!(build_plan(&r).unwrap().epilogue, Epilogue::Gelu);
        r.activation = Some(Activation::Relu);
        assert_eq!(build_plan(&r).unwrap().epilogue, Epilogue::Relu);

        let mut f = req(&[8, 16], &[16, 24], false);
        f.in_dtype = DType::F32;
        f.out_dtype = DType::F32;
        assert_eq!(build_plan(&f).unwrap().compute, Compute::F32);
        f.allow_tf32 = true;
        assert_eq!(build_plan(&f).unwrap().compute, Compute::F32FastTf32);
        let mut i = req(&[8, 16], &[16, 24], false);
        i.in_dtype = DType::I8;
        i.out_dtype = DType::I32;
        let p = build_plan(&i).unwrap();
        assert_eq!(
            (p.compute, p.scale_type, p.d.dtype),
            (Compute::I32, ScaleType::I32, DType::I32)
        );
        i.out_dtype = DType::I8;
        assert!(build_plan(&i).is_err());
        let mut h = req(&[8, 16], &[16, 24], false);
        h.out_dtype = DType::F32;
        assert_eq!(build_plan(&h).unwrap().d.dtype, DType::F32);
    }

    #[test]
    fn batches() {
        // Equal batches: strided.
        let p = build_plan(&req(&[3, 8, 16], &[3, 16, 24], false)).unwrap();
        assert_eq!(
            (
                p.a.batch,
                p.a.batch_stride,
                p.b.batch_stride,
                p.d.batch_stride
            ),
            (3, 384, 128, 192)
        );
        assert_eq!(p.out_shape, vec![3, 8, 24]);
        // Batched lhs, 2-D rhs: flattened into M.
        let p = build_plan(&req(&[2, 3, 8, 16], &[16, 24], false)).unwrap();
        assert_eq!((p.n, p.d.batch, p.b.cols), (48, 1, 48));
        assert_eq!(p.out_shape, vec![2, 3, 8, 24]);
        // 2-D lhs, batched rhs: B broadcast with stride 0.
        let p = build_plan(&req(&[8, 16], &[4, 16, 24], false)).unwrap();
        assert_eq!((p.d.batch, p.b.batch_stride, p.a.batch_stride), (4, 0, 384));
        // Mixed broadcast: one launch per batch entry.
        let p = build_plan(&req(&[2, 1, 8, 16], &[1, 2, 16, 24], false)).unwrap();
        assert_eq!(p.out_shape, vec![2, 2, 8, 24]);
        assert_eq!(
            p.launches,
            vec![
                Launch { a: 0, b: 0, d: 0 },
                Launch {
                    a: 384,
                    b: 0,
                    d: 192
                },
                Launch {
                    a: 0,
                    b: 128,
                    d: 384
                },
                Launch {
                    a: 384,
                    b: 128,
                    d: 576
                },
            ]
        );
        assert!(build_plan(&req(&[2, 8, 16], &[3, 16, 24], false)).is_err());
        // 1-D operands.
        let p = build_plan(&req(&[16], &[16, 24], false)).unwrap();
        assert_eq!((p.n, p.out_shape.clone()), (1, vec![24]));
        let p = build_plan(&req(&[8, 16], &[16], false)).unwrap();
        assert_eq!((p.m, p.out_shape.clone()), (1, vec![8]));
        // Empty output: no launches.
        assert!(
            build_plan(&req(&[0, 16], &[16, 24], false))
                .unwrap()
                .launches
                .is_empty()
        );
    }

    #[test]
    fn alignments() {
        assert_eq!(alignment_of(0x7f00_0000_0000), 256);
        assert_eq!(alignment_of(0x1002), 2);
        assert_eq!(alignment_of(0x1010), 16);
        let p = build_plan(&req(&[2, 1, 8, 16], &[1, 2, 16, 24], false)).unwrap();
        let al = Alignments::of(&p, 0x1000, 0x2000, 0x3000, None);
        // Offsets of 384 and 128 f16 elements (768 and 256 bytes) keep 256-byte alignment;
        // 192 elements (384 bytes) of D only 128.
        assert_eq!((al.a, al.b, al.d, al.bias), (256, 256, 128, 256));
    }

    /// Reference semantics of a plan: run its launches on the CPU in cuBLAS's column-major
    /// terms and compare with a direct row-major matmul.
    fn run_plan_on_cpu(p: &LtPlan, lhs: &[f64], rhs: &[f64]) -> Vec<f64> {
        let mut d = vec![0.0; p.out_numel()];
        let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
        for l in &p.launches {
            for bi in 0..p.d.batch.max(1) as usize {
                let ao = l.a as usize + bi * p.a.batch_stride as usize;
                let bo = l.b as usize + bi * p.b.batch_stride as usize;
                let dof = l.d as usize + bi * p.d.batch_stride as usize;
                for j in 0..n {
                    for i in 0..m {
                        let mut s = 0.0;
                        for kk in 0..k {
                            // op(A)[i, kk]
                            let a = if p.trans_a {
                                rhs[ao + kk + i * p.a.ld as usize]
                            } else {
                                rhs[ao + i + kk * p.a.ld as usize]
                            };
                            let b = lhs[bo + kk + j * p.b.ld as usize];
                            s += a * b;
                        }
                        d[dof + i + j * p.d.ld as usize] = s;
                    }
                }
            }
        }
        d
    }

    fn direct(lhs_s: &[usize], rhs_s: &[usize], t: bool, lhs: &[f64], rhs: &[f64]) -> Vec<f64> {
        // Materialise the transposed rhs, then a numpy-style batched matmul.
        let mut rs = rhs_s.to_vec();
        let r = rs.len();
        let rhs_eff: Vec<f64> = if t {
            let (nn, kk) = (rs[r - 2], rs[r - 1]);
            let mats = rhs.len() / (nn * kk).max(1);
            let mut out = vec![0.0; rhs.len()];
            for b in 0..mats {
                for i in 0..nn {
                    for j in 0..kk {
                        out[b * nn * kk + j * nn + i] = rhs[b * nn * kk + i * kk + j];
                    }
                }
            }
            rs.swap(r - 2, r - 1);
            out
        } else {
            rhs.to_vec()
        };
        let (m, k) = (lhs_s[lhs_s.len() - 2], lhs_s[lhs_s.len() - 1]);
        let n = rs[r - 1];
        let lb = &lhs_s[..lhs_s.len() - 2];
        let rb = &rs[..r - 2];
        let batch = broadcast(lb, rb).unwrap();
        let (ia, ib) = (batch_indices(lb, &batch), batch_indices(rb, &batch));
        let mut out = Vec::new();
        for (x, y) in ia.iter().zip(&ib) {
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0.0;
                    for kk in 0..k {
                        s += lhs[x * m * k + i * k + kk] * rhs_eff[y * k * n + kk * n + j];
                    }
                    out.push(s);
                }
            }
        }
        out
    }

    fn batch_dims() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
        prop_oneof![
            Just((vec![], vec![])),
            (1usize..4).prop_map(|b| (vec![b], vec![b])),
            (1usize..4).prop_map(|b| (vec![b], vec![])),
            (1usize..4).prop_map(|b| (vec![], vec![b])),
            (1usize..3, 1usize..3).prop_map(|(a, b)| (vec![a, 1], vec![1, b])),
            (1usize..3, 1usize..3).prop_map(|(a, b)| (vec![a, b], vec![b])),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn plans_compute_the_row_major_matmul(
            (lb, rb) in batch_dims(),
            m in 1usize..6, k in 1usize..6, n in 1usize..6,
            t in any::<bool>(),
            seed in 0u64..1000,
        ) {
            let mut lhs_s = lb.clone();
            lhs_s.extend([m, k]);
            let mut rhs_s = rb.clone();
            rhs_s.extend(if t { [n, k] } else { [k, n] });
            let p = build_plan(&req(&lhs_s, &rhs_s, t)).unwrap();
            // Consistency of the swap: m·n·k, leading dims and the layouts' extents.
            prop_assert_eq!(p.m as usize, n);
            prop_assert_eq!(p.k as usize, k);
            prop_assert_eq!(p.n as usize % m, 0);
            prop_assert!(p.a.ld as u64 >= p.a.rows && p.b.ld as u64 >= p.b.rows && p.d.ld as u64 >= p.d.rows);
            let (ar, ac) = if p.trans_a { (p.k, p.m) } else { (p.m, p.k) };
            prop_assert_eq!((p.a.rows, p.a.cols), (ar, ac));
            prop_assert_eq!((p.b.rows, p.b.cols), (p.k, p.n));
            prop_assert_eq!((p.d.rows, p.d.cols), (p.m, p.n));
            // Every launch stays inside its buffers.
            let nl: usize = lhs_s.iter().product();
            let nr: usize = rhs_s.iter().product();
            let span = |l: &Layout| (l.batch.max(1) as u64 - 1) * l.batch_stride as u64
                + (l.cols - 1) * l.ld as u64 + l.rows;
            for l in &p.launches {
                prop_assert!(l.a + span(&p.a) <= nr as u64);
                prop_assert!(l.b + span(&p.b) <= nl as u64);
                prop_assert!(l.d + span(&p.d) <= p.out_numel() as u64);
            }
            // And the numbers.
            let fill = |len: usize, s: u64| -> Vec<f64> {
                (0..len).map(|i| (((i as u64 * 7919 + s * 31) % 17) as f64) - 8.0).collect()
            };
            let (x, w) = (fill(nl, seed), fill(nr, seed + 1));
            prop_assert_eq!(run_plan_on_cpu(&p, &x, &w), direct(&lhs_s, &rhs_s, t, &x, &w));
        }
    }
}
