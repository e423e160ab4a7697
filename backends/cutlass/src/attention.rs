//! A generated fused attention kernel with FlashAttention-2's structure, for TVM's
//! `R.nn.attention(q, k, v, bias, scale, causal_mask)` (the op the `cutlass.attention*`
//! patterns claim), compiled with NVRTC and launched on fusebox-cuda's runtime.
//!
//! Contract:
//!
//! - Layout as TVM's `R.nn.attention` takes it: Q `(batch, seq_q, heads_q, head_dim)`, K and V
//!   `(batch, seq_kv, heads_kv, head_dim)` (BSNH), output `(batch, seq_q, heads_q, head_dim)`
//!   in Q's dtype (float16 or bfloat16); accumulation and softmax in f32. With
//!   [`Layout::Bhsd`] the same with seq and heads swapped (the operands of the unfused
//!   `matmul(softmax(matmul(q, permute_dims(k))), v)` graph): the kernel takes (batch, seq,
//!   head) element strides, so both layouts are the same compiled kernel.
//! - `head_dim` any multiple of 16 from 32 to 128 (a compile-time constant of the kernel; 16
//!   is not generated: ptxas spilled in its causal variant).
//! - Grouped-query heads: `heads_kv` divides `heads_q`; query head `h` reads key/value head
//!   `h / (heads_q / heads_kv)` (TVM's op has equal heads; this is the general case).
//! - `scale` defaults to `1 / sqrt(head_dim)`; an optional additive bias of Q's dtype of any
//!   shape that broadcasts (numpy rules, right-aligned) to `(batch, heads_q, seq_q, seq_kv)`
//!   is added after scaling, like TVM's legalization.
//! - Causal masks as TVM's legalization defines them: key `j` is visible to query `i` when
//!   `j <= i + offset`, with `offset = 0` for `"TopLeft"` and `offset = |seq_q - seq_kv|` for
//!   `"BottomRight"` (TVM takes the absolute difference; for `seq_q <= seq_kv` this is the
//!   usual bottom-right alignment).
//! - Sequence lengths need not be multiples of the tile: out-of-range rows load as zeros
//!   (`cp.async` zero fill) and out-of-range keys are masked to `-inf`.
//! - A row whose keys are all masked (only possible through a `-inf` bias) is written as 0.
//!
//! Structure (one block of 4 warps per 64 query rows of one (batch, head); each warp owns 16
//! rows): Q's tile is staged in shared memory once and stays there (its `ldmatrix` fragments
//! are re-read per key tile, which keeps head_dim 128 within 255 registers); the key/value
//! tiles (64 rows) stream through shared memory with `cp.async`, K of tile `j + 1` loading while tile `j`'s softmax and P·V run and V of tile `j + 1` while its
//! S = Q·Kᵀ runs; S and P·V are `mma.sync.aligned.m16n8k16` (inline PTX, fed by `ldmatrix`,
//! `.trans` for V) with f32 accumulators; the softmax is online (running row max and sum,
//! the output accumulator rescaled by `exp2(m_old - m_new)`), P goes from the S accumulator
//! registers straight into the A fragments of the P·V MMA, and the final `1 / sum` is applied
//! before the f16/bf16 store. The score matrix is never materialised: per block only a 64×64
//! tile of it lives, in registers. Causal blocks stop at the last key tile any of their rows
//! sees.
//!
//! Why inline `mma.sync` and not `nvcuda::wmma`: the online softmax needs each element's
//! (row, column) in the accumulator, which `wmma` fragments leave unspecified, and P must be
//! reused from the S accumulators as the A operand of the second MMA without a trip through
//! shared memory; the m16n8k16 fragment layouts are documented in the PTX ISA, so both stay
//! in registers. The kernel is the same for sm_80 and sm_90 (an sm_90a wgmma/TMA version,
//! FlashAttention-3's structure, is not generated).
//!
//! `__launch_bounds__(128, 1)`: without the minimum-blocks hint ptxas picks 96 or 168 registers
//! for some variants (aiming at more resident blocks) and spills; with it none spills (the
//! NVRTC test checks every variant).
//!
//! Claimed through TVM's `cutlass.attention` / `cutlass.attention_bias` entries
//! ([`crate::patterns`]): [`crate::spec::analyse_attention`] reads the composite and
//! [`crate::artifact::AttentionArtifact`] launches [`FlashAttention`] for it. The rewrite of
//! the unfused softmax(QKᵀ·scale[+bias])·V subgraph into the op
//! (`make_attention_rewrite_pattern`) is not done ([`Layout::Bhsd`] serves that graph's
//! operands directly).
//!
//! ```text
//! y = R.nn.attention(q, k, v, causal_mask="BottomRight")
//!     # q: (2, 300, 8, 128) f16, k, v: (2, 300, 2, 128) f16 (grouped-query, 4 q heads per kv head)
//! # runs as: fusebox_attn_f16_d128_causal  grid (5, 8, 2), block 128, 52224 B shared memory
//! #          args q, k, v, bias (null), o, seq_q 300, seq_kv 300, heads_q 8, heads_kv 2,
//! #          scale·log2(e), causal offset 0, bias strides (0, 0, 0, 0),
//! #          (batch, seq, head) strides of q (307200, 1024, 128), of k and v (76800, 256, 128)
//! #          and of o (= q's)
//! ```

use crate::error::{Error, Result};
use fusebox_core::ir::DType;
use fusebox_cuda::{
    Arch, Cache, CompileOptions, Gpu, GpuModule, GpuTensor, KernelArg, LaunchConfig, compile_cached,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Query rows per block (4 warps × 16).
pub const BLOCK_M: usize = 64;
/// Key/value rows per tile.
pub const BLOCK_N: usize = 64;
/// Threads per block.
pub const THREADS: u32 = 128;

/// The element type of Q, K, V, the bias and the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttnElem {
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
}

impl AttnElem {
    /// The fusebox dtype.
    pub fn dtype(self) -> DType {
        match self {
            AttnElem::F16 => DType::F16,
            AttnElem::Bf16 => DType::BF16,
        }
    }

    /// The element type of a dtype, if the kernel takes it.
    pub fn of(d: DType) -> Option<AttnElem> {
        match d {
            DType::F16 => Some(AttnElem::F16),
            DType::BF16 => Some(AttnElem::Bf16),
            _ => None,
        }
    }

    fn tag(self) -> &'static str {
        match self {
            AttnElem::F16 => "f16",
            AttnElem::Bf16 => "bf16",
        }
    }
}

/// TVM's `causal_mask` attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CausalMask {
    /// Key `j` visible to query `i` when `j <= i`.
    TopLeft,
    /// Key `j` visible to query `i` when `j <= i + |seq_q - seq_kv|` (TVM's legalization).
    BottomRight,
}

impl CausalMask {
    /// The mask's diagonal offset for these sequence lengths.
    pub fn offset(self, seq_q: usize, seq_kv: usize) -> usize {
        match self {
            CausalMask::TopLeft => 0,
            CausalMask::BottomRight => seq_q.abs_diff(seq_kv),
        }
    }

    /// From TVM's attribute text (`"TopLeft"`, `"BottomRight"`).
    pub fn parse(s: &str) -> Result<CausalMask> {
        match s {
            "TopLeft" => Ok(CausalMask::TopLeft),
            "BottomRight" => Ok(CausalMask::BottomRight),
            other => Err(Error::Args(format!(
                "causal_mask {other:?}: expected \"TopLeft\" or \"BottomRight\""
            ))),
        }
    }
}

/// The memory layout of Q, K, V and the output (each dense, head_dim innermost).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `(batch, seq, heads, head_dim)`: TVM's `R.nn.attention`.
    #[default]
    Bsnh,
    /// `(batch, heads, seq, head_dim)`: the operands of the unfused
    /// `matmul(softmax(matmul(q, permute_dims(k))), v)` graph (PyTorch's SDPA layout).
    Bhsd,
}

impl Layout {
    /// `(batch, seq, heads, head_dim)` of a shape in this layout.
    fn dims(self, s: &[usize]) -> (usize, usize, usize, usize) {
        match self {
            Layout::Bsnh => (s[0], s[1], s[2], s[3]),
            Layout::Bhsd => (s[0], s[2], s[1], s[3]),
        }
    }

    /// The shape of `(batch, seq, heads, head_dim)` in this layout.
    fn shape(self, batch: usize, seq: usize, heads: usize, d: usize) -> Vec<usize> {
        match self {
            Layout::Bsnh => vec![batch, seq, heads, d],
            Layout::Bhsd => vec![batch, heads, seq, d],
        }
    }

    /// Element strides (batch, seq, head) of a dense tensor in this layout.
    fn strides(self, seq: usize, heads: usize, d: usize) -> Option<[i64; 3]> {
        let i = |x: usize| i64::try_from(x).ok();
        let (seq, heads, d) = (i(seq)?, i(heads)?, i(d)?);
        let batch = seq.checked_mul(heads)?.checked_mul(d)?;
        Some(match self {
            Layout::Bsnh => [batch, heads.checked_mul(d)?, d],
            Layout::Bhsd => [batch, d, seq.checked_mul(d)?],
        })
    }
}

/// The options of one attention call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionOptions {
    /// The softmax scale; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f64>,
    /// The causal mask, if any.
    pub causal: Option<CausalMask>,
    /// The layout of Q, K, V and the output (default: TVM's BSNH).
    pub layout: Layout,
}

/// One compiled kernel: everything that is a compile-time constant of the generated source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttnKernel {
    /// Element type.
    pub elem: AttnElem,
    /// Head dimension (a multiple of 16, 32 to 128).
    pub head_dim: usize,
    /// Whether the causal mask is applied (its offset is a launch argument).
    pub causal: bool,
    /// Whether the kernel reads the additive bias.
    pub bias: bool,
}

impl AttnKernel {
    /// The kernel's `extern "C"` symbol.
    pub fn name(&self) -> String {
        format!(
            "fusebox_attn_{}_d{}{}{}",
            self.elem.tag(),
            self.head_dim,
            if self.causal { "_causal" } else { "" },
            if self.bias { "_bias" } else { "" }
        )
    }

    /// Whether the head dimension is one the kernel is generated for.
    pub fn check(&self) -> Result<()> {
        if self.head_dim < 32 || !self.head_dim.is_multiple_of(16) || self.head_dim > 128 {
            return Err(Error::Args(format!(
                "head_dim {}: the fused attention kernel takes a multiple of 16 from 32 to 128",
                self.head_dim
            )));
        }
        Ok(())
    }

    /// Dynamic shared memory per block: Q, K and V tiles, rows padded by 8 elements.
    pub fn smem_bytes(&self) -> u32 {
        let ld = self.head_dim + 8;
        ((BLOCK_M + 2 * BLOCK_N) * ld * 2) as u32
    }

    /// The CUDA C++ source (see the module doc).
    pub fn source(&self) -> String {
        let (header, t, t2, to2, tof, mma_t) = match self.elem {
            AttnElem::F16 => (
                "#include <cuda_fp16.h>",
                "__half",
                "__half2",
                "__floats2half2_rn",
                "__half2float",
                "f16",
            ),
            AttnElem::Bf16 => (
                "#include <cuda_bf16.h>",
                "__nv_bfloat16",
                "__nv_bfloat162",
                "__floats2bfloat162_rn",
                "__bfloat162float",
                "bf16",
            ),
        };
        let mut s = String::new();
        s.push_str(&format!(
            "// {name}: fused attention (FlashAttention-2 structure), generated by fusebox-cutlass.\n\
             {header}\n\
             #define HEAD_DIM {d}\n#define BM {bm}\n#define BN {bn}\n#define LDS (HEAD_DIM + 8)\n\
             #define CAUSAL {c}\n#define HAS_BIAS {b}\n\
             typedef {t} T;\ntypedef {t2} T2;\n\
             __device__ __forceinline__ unsigned pack2(float a, float b) {{\n\
             \x20 T2 h = {to2}(a, b);\n  return *reinterpret_cast<unsigned*>(&h);\n}}\n\
             __device__ __forceinline__ float to_f(T x) {{ return {tof}(x); }}\n\
             __device__ __forceinline__ void store2(T* p, float a, float b) {{\n\
             \x20 *reinterpret_cast<T2*>(p) = {to2}(a, b);\n}}\n\
             __device__ __forceinline__ void mma_16816(float* c, const unsigned* a, const unsigned* b) {{\n\
             \x20 asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.{mma_t}.{mma_t}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};\\n\"\n\
             \x20              : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3])\n\
             \x20              : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));\n}}\n",
            name = self.name(),
            d = self.head_dim,
            bm = BLOCK_M,
            bn = BLOCK_N,
            c = u8::from(self.causal),
            b = u8::from(self.bias),
        ));
        s.push_str(HELPERS);
        s.push_str(&format!(
            "extern \"C\" __global__ void __launch_bounds__({THREADS}, 1) {}(\n{}",
            self.name(),
            KERNEL_BODY
        ));
        s
    }
}

const HELPERS: &str = r#"
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async_16(void* s, const void* g, bool p) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(smem_u32(s)), "l"(g), "r"(p ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
// `nrows` rows of HEAD_DIM elements into a tile with row pitch LDS; row r of the tile is row
// `row0 + r` of `src` (pitch `stride` elements); rows at or past `rows_total` are zero-filled.
__device__ __forceinline__ void load_tile(T* dst, const T* src, long long stride, int row0,
                                          int rows_total, int nrows, int tid) {
  constexpr int VPR = HEAD_DIM / 8;
  for (int i = tid; i < nrows * VPR; i += blockDim.x) {
    int r = i / VPR, c = (i % VPR) * 8;
    bool p = row0 + r < rows_total;
    const T* g = p ? src + (long long)(row0 + r) * stride + c : src;
    cp_async_16(dst + r * LDS + c, g, p);
  }
}
"#;

const KERNEL_BODY: &str = r#"    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const T* __restrict__ bias, T* __restrict__ o,
    int seq_q, int seq_kv, int heads_q, int heads_kv, float scale_log2, int causal_offset,
    long long sb_b, long long sb_h, long long sb_q, long long sb_k,
    long long q_sb, long long q_ss, long long q_sh, long long kv_sb, long long kv_ss,
    long long kv_sh, long long o_sb, long long o_ss, long long o_sh) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);
  T* Ks = Qs + BM * LDS;
  T* Vs = Ks + BN * LDS;
#if HAS_BIAS
  const float LOG2E = 1.4426950408889634f;
#endif
  const float NEG_INF = __int_as_float(0xff800000u);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int qb = blockIdx.x * BM;
  const int h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (heads_q / heads_kv);
  // Element strides (batch, seq, head) of Q, of K and V (the same), of O; head_dim is dense.
  const long long q_pitch = q_ss, kv_pitch = kv_ss;
  const T* qp = q + (long long)b * q_sb + (long long)h * q_sh;
  const T* kp = k + (long long)b * kv_sb + (long long)hk * kv_sh;
  const T* vp = v + (long long)b * kv_sb + (long long)hk * kv_sh;
  T* op = o + (long long)b * o_sb + (long long)h * o_sh;

  int n_tiles = (seq_kv + BN - 1) / BN;
#if CAUSAL
  {
    long long last = (long long)qb + BM - 1 + causal_offset;
    int lim = (int)(last / BN + 1);
    if (lim < n_tiles) n_tiles = lim;
  }
#endif

  // Prologue: group 1 = Q and K_0, group 2 = V_0.
  load_tile(Qs, qp, q_pitch, qb, seq_q, BM, tid);
  if (n_tiles > 0) load_tile(Ks, kp, kv_pitch, 0, seq_kv, BN, tid);
  cp_async_commit();
  if (n_tiles > 0) load_tile(Vs, vp, kv_pitch, 0, seq_kv, BN, tid);
  cp_async_commit();

  float acc[HEAD_DIM / 8][4];
#pragma unroll
  for (int i = 0; i < HEAD_DIM / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;
  const int r0 = qb + warp * 16 + lane / 4, r1 = r0 + 8;
#if CAUSAL
  // The last key each of this thread's rows sees (the host keeps seq_q + offset in int).
  const int vis0 = r0 + causal_offset, vis1 = r1 + causal_offset;
#endif

#if HAS_BIAS
  const T* bias_bh = bias + (long long)b * sb_b + (long long)h * sb_h;
  const long long bias_r0 = (long long)r0 * sb_q, bias_r1 = (long long)r1 * sb_q;
#endif
  // This warp's 16 rows of Q, read from shared memory as ldmatrix fragments per k-step.
  const T* q_frag = Qs + (warp * 16 + lane % 16) * LDS + (lane / 16) * 8;

  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<1>();  // Q and K_j (only V_j may still be in flight)
    __syncthreads();
    // S = Q K^T for this warp's 16 rows x BN keys.
    float s[BN / 8][4];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
#pragma unroll
      unsigned qa[4];
      ldmatrix_x4(qa, q_frag + kk * 16);
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        unsigned bk[4];
        ldmatrix_x4(bk, Ks + (np * 16 + lane % 8 + (lane / 16) * 8) * LDS + kk * 16 + ((lane / 8) % 2) * 8);
        mma_16816(s[2 * np], qa, bk);
        mma_16816(s[2 * np + 1], qa, bk + 2);
      }
    }
    __syncthreads();  // every warp is done with K_j
    if (j + 1 < n_tiles) load_tile(Ks, kp, kv_pitch, (j + 1) * BN, seq_kv, BN, tid);
    cp_async_commit();

    // Scale (in log2 units), bias, masks; the new row maxima.
    const int kv0 = j * BN;
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = e < 2 ? r0 : r1;
        const int col = kv0 + nt * 8 + (lane % 4) * 2 + (e & 1);
        float x = s[nt][e] * scale_log2;
#if HAS_BIAS
        if (row < seq_q && col < seq_kv)
          x += to_f(bias_bh[(e < 2 ? bias_r0 : bias_r1) + (long long)col * sb_k]) * LOG2E;
#endif
        bool masked = col >= seq_kv;
#if CAUSAL
        masked = masked || col > (e < 2 ? vis0 : vis1);
#endif
        x = masked ? NEG_INF : x;
        s[nt][e] = x;
        if (e < 2) mx0 = fmaxf(mx0, x); else mx1 = fmaxf(mx1, x);
      }
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // A row with every key so far masked keeps max -inf: exponentiate against 0 (all give 0).
    const float base0 = mx0 == NEG_INF ? 0.f : mx0;
    const float base1 = mx1 == NEG_INF ? 0.f : mx1;
    const float alpha0 = exp2f(m0 - base0), alpha1 = exp2f(m1 - base1);
    m0 = mx0;
    m1 = mx1;
    l0 *= alpha0;
    l1 *= alpha1;
#pragma unroll
    for (int dt = 0; dt < HEAD_DIM / 8; ++dt) {
      acc[dt][0] *= alpha0; acc[dt][1] *= alpha0;
      acc[dt][2] *= alpha1; acc[dt][3] *= alpha1;
    }
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - base0);
      s[nt][1] = exp2f(s[nt][1] - base0);
      s[nt][2] = exp2f(s[nt][2] - base1);
      s[nt][3] = exp2f(s[nt][3] - base1);
      l0 += s[nt][0] + s[nt][1];
      l1 += s[nt][2] + s[nt][3];
    }

    // O += P V: P from the S accumulators as A fragments, V through ldmatrix.trans.
    cp_async_wait<1>();  // V_j (only K_{j+1} may still be in flight)
    __syncthreads();
#pragma unroll
    for (int kt = 0; kt < BN / 16; ++kt) {
      unsigned pa[4];
      pa[0] = pack2(s[2 * kt][0], s[2 * kt][1]);
      pa[1] = pack2(s[2 * kt][2], s[2 * kt][3]);
      pa[2] = pack2(s[2 * kt + 1][0], s[2 * kt + 1][1]);
      pa[3] = pack2(s[2 * kt + 1][2], s[2 * kt + 1][3]);
#pragma unroll
      for (int dp = 0; dp < HEAD_DIM / 16; ++dp) {
        unsigned bv[4];
        ldmatrix_x4_trans(bv, Vs + (kt * 16 + lane % 8 + ((lane / 8) % 2) * 8) * LDS + dp * 16 + (lane / 16) * 8);
        mma_16816(acc[2 * dp], pa, bv);
        mma_16816(acc[2 * dp + 1], pa, bv + 2);
      }
    }
    __syncthreads();  // every warp is done with V_j
    if (j + 1 < n_tiles) load_tile(Vs, vp, kv_pitch, (j + 1) * BN, seq_kv, BN, tid);
    cp_async_commit();
  }
  cp_async_wait<0>();

  // The row sums across the quad that shares each row, then O / sum.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f;
  const float inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
  for (int dt = 0; dt < HEAD_DIM / 8; ++dt) {
    const int c = dt * 8 + (lane % 4) * 2;
    if (r0 < seq_q) store2(op + (long long)r0 * o_ss + c, acc[dt][0] * inv0, acc[dt][1] * inv0);
    if (r1 < seq_q) store2(op + (long long)r1 * o_ss + c, acc[dt][2] * inv1, acc[dt][3] * inv1);
  }
}
"#;

/// Every kernel variant: both element types, head dims 32 to 128 in steps of 16, causal or
/// not, with or without bias (grouped-query heads, the causal offset and the scale are launch
/// arguments, so every variant runs every head grouping and both causal kinds).
pub fn variants() -> Vec<AttnKernel> {
    let mut v = Vec::new();
    for elem in [AttnElem::F16, AttnElem::Bf16] {
        for head_dim in (32..=128).step_by(16) {
            for causal in [false, true] {
                for bias in [false, true] {
                    v.push(AttnKernel {
                        elem,
                        head_dim,
                        causal,
                        bias,
                    });
                }
            }
        }
    }
    v
}

/// A checked attention problem: sizes, the kernel, and its launch arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnPlan {
    /// The kernel to launch.
    pub kernel: AttnKernel,
    /// Batch.
    pub batch: usize,
    /// Query sequence length.
    pub seq_q: usize,
    /// Key/value sequence length.
    pub seq_kv: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads (divides `heads_q`).
    pub heads_kv: usize,
    /// The softmax scale.
    pub scale: f64,
    /// The causal offset (see [`CausalMask::offset`]); 0 without a mask.
    pub causal_offset: usize,
    /// The bias's element strides over (batch, heads_q, seq_q, seq_kv); 0 where broadcast.
    pub bias_strides: [i64; 4],
    /// Q's element strides over (batch, seq, head); the output's are the same.
    pub q_strides: [i64; 3],
    /// K's and V's element strides over (batch, seq, head).
    pub kv_strides: [i64; 3],
    /// The output shape, Q's shape (in the options' layout).
    pub out_shape: Vec<usize>,
}

impl AttnPlan {
    /// The launch shape: one block per 64 query rows of one (batch, head).
    pub fn launch(&self) -> Result<LaunchConfig> {
        let bx = u32::try_from(self.seq_q.div_ceil(BLOCK_M)).ok();
        let by = u32::try_from(self.heads_q).ok().filter(|&y| y <= 65535);
        let bz = u32::try_from(self.batch).ok().filter(|&z| z <= 65535);
        match (bx, by, bz) {
            (Some(x), Some(y), Some(z)) => Ok(LaunchConfig {
                grid: [x.max(1), y.max(1), z.max(1)],
                block: [THREADS, 1, 1],
                shared_mem_bytes: self.kernel.smem_bytes(),
            }),
            _ => Err(Error::Args(format!(
                "attention of batch {} and {} heads exceeds the grid limits (65535 each)",
                self.batch, self.heads_q
            ))),
        }
    }

    /// Floating-point operations of the two matrix products (causal masking not subtracted).
    pub fn flops(&self) -> f64 {
        4.0 * (self.batch * self.heads_q * self.seq_q * self.seq_kv * self.kernel.head_dim) as f64
    }
}

/// Checks the operand shapes and dtypes of `attention(q, k, v, bias)` and plans the launch.
pub fn plan(
    q: (&[usize], DType),
    k: (&[usize], DType),
    v: (&[usize], DType),
    bias: Option<(&[usize], DType)>,
    opts: &AttentionOptions,
) -> Result<AttnPlan> {
    let bad = |m: String| Err(Error::Args(format!("attention: {m}")));
    for (name, (s, _)) in [("q", q), ("k", k), ("v", v)] {
        if s.len() != 4 {
            return bad(format!(
                "{name} has shape {s:?}; expected 4 dims ({:?}: {})",
                opts.layout,
                match opts.layout {
                    Layout::Bsnh => "batch, seq, heads, head_dim",
                    Layout::Bhsd => "batch, heads, seq, head_dim",
                }
            ));
        }
    }
    let Some(elem) = AttnElem::of(q.1) else {
        return bad(format!(
            "q is {}; the kernel takes float16 or bfloat16",
            q.1
        ));
    };
    for (name, d) in [("k", k.1), ("v", v.1)] {
        if d != q.1 {
            return bad(format!("{name} is {d}, q is {}", q.1));
        }
    }
    let (qs, ks, vs) = (q.0, k.0, v.0);
    let layout = opts.layout;
    let (batch, seq_q, heads_q, head_dim) = layout.dims(qs);
    let (kb, seq_kv, heads_kv, kd) = layout.dims(ks);
    if kb != batch || kd != head_dim {
        return bad(format!(
            "k has shape {ks:?}; q {qs:?} needs batch {batch} and head_dim {head_dim} ({layout:?})"
        ));
    }
    if vs != ks {
        return bad(format!(
            "v has shape {vs:?}; the kernel needs k's shape {ks:?} (a head_dim_v different from head_dim is not generated)"
        ));
    }
    if heads_kv == 0 || !heads_q.is_multiple_of(heads_kv) {
        return bad(format!(
            "{heads_kv} key/value heads do not divide {heads_q} query heads"
        ));
    }
    if seq_kv == 0 {
        return bad("seq_kv is 0: the softmax of an empty row is undefined".into());
    }
    let kernel = AttnKernel {
        elem,
        head_dim,
        causal: opts.causal.is_some(),
        bias: bias.is_some(),
    };
    kernel.check()?;
    let i32_max = i32::MAX as usize;
    if seq_q > i32_max || seq_kv > i32_max || heads_q > i32_max {
        return bad("sequence lengths and heads must fit 32-bit indexing".into());
    }
    let scale = opts.scale.unwrap_or(1.0 / (head_dim as f64).sqrt());
    if !scale.is_finite() {
        return bad(format!("scale {scale} is not finite"));
    }
    let causal_offset = opts.causal.map_or(0, |c| c.offset(seq_q, seq_kv));
    if causal_offset.saturating_add(seq_q).saturating_add(BLOCK_M) > i32_max {
        return bad("the causal offset must fit 32-bit indexing".into());
    }
    let too_big = || Error::Args(format!("attention: {qs:?} / {ks:?} exceed 64-bit indexing"));
    let q_strides = layout
        .strides(seq_q, heads_q, head_dim)
        .ok_or_else(too_big)?;
    let kv_strides = layout
        .strides(seq_kv, heads_kv, head_dim)
        .ok_or_else(too_big)?;
    let mut bias_strides = [0i64; 4];
    if let Some((bs, bd)) = bias {
        if bd != q.1 {
            return bad(format!("bias is {bd}; the kernel takes q's dtype {}", q.1));
        }
        let full = [batch, heads_q, seq_q, seq_kv];
        if bs.len() > 4 {
            return bad(format!(
                "bias has shape {bs:?}; expected at most 4 dims broadcasting to {full:?}"
            ));
        }
        let pad = 4 - bs.len();
        let mut stride: i64 = 1;
        for i in (0..4).rev() {
            let d = if i < pad { 1 } else { bs[i - pad] };
            if d != 1 && d != full[i] {
                return bad(format!(
                    "bias has shape {bs:?}, which does not broadcast to (batch, heads, seq_q, seq_kv) = {full:?}"
                ));
            }
            bias_strides[i] = if d == 1 { 0 } else { stride };
            stride = i64::try_from(d)
                .ok()
                .and_then(|d| stride.checked_mul(d))
                .ok_or_else(|| Error::Args(format!("attention: bias {bs:?} is too large")))?;
        }
    }
    Ok(AttnPlan {
        kernel,
        batch,
        seq_q,
        seq_kv,
        heads_q,
        heads_kv,
        scale,
        causal_offset,
        bias_strides,
        q_strides,
        kv_strides,
        out_shape: layout.shape(batch, seq_q, heads_q, head_dim),
    })
}

/// The fused attention kernels on one GPU: compiled on first use (through fusebox-cuda's
/// compile cache) for the device's arch, loaded once.
pub struct FlashAttention {
    gpu: Arc<Gpu>,
    arch: Arch,
    modules: Mutex<BTreeMap<AttnKernel, Arc<GpuModule>>>,
}

impl std::fmt::Debug for FlashAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlashAttention")
            .field("gpu", &self.gpu.describe())
            .field("arch", &self.arch)
            .finish_non_exhaustive()
    }
}

impl FlashAttention {
    /// On the process's GPU; without one, the typed no-device error
    /// ([`crate::Error::is_no_device`]).
    pub fn new() -> Result<FlashAttention> {
        FlashAttention::on(Gpu::get()?)
    }

    /// On `gpu` (an sm_80+ device).
    pub fn on(gpu: Arc<Gpu>) -> Result<FlashAttention> {
        let arch = gpu.arch().ok_or_else(|| {
            Error::Cuda(fusebox_cuda::Error::NoDevice {
                reason: format!(
                    "{} (compute capability {:?}) is not an sm_80+ device the attention kernel targets",
                    gpu.name(),
                    gpu.compute_capability()
                ),
            })
        })?;
        // The kernel uses no sm_90a instruction: plain sm_90 CUBIN on Hopper.
        let arch = if arch == Arch::Sm90a {
            Arch::Sm90
        } else {
            arch
        };
        Ok(FlashAttention {
            gpu,
            arch,
            modules: Mutex::new(BTreeMap::new()),
        })
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The arch the kernels are compiled for.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// Compiles (through the compile cache) and loads `kernel` now rather than at its first
    /// launch.
    pub fn load(&self, kernel: &AttnKernel) -> Result<()> {
        kernel.check()?;
        self.module(kernel).map(|_| ())
    }

    fn module(&self, kernel: &AttnKernel) -> Result<Arc<GpuModule>> {
        let mut mods = self
            .modules
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(m) = mods.get(kernel) {
            return Ok(m.clone());
        }
        let cache = Cache::from_env();
        let c = compile_cached(
            cache.as_ref(),
            &kernel.source(),
            &format!("{}.cu", kernel.name()),
            self.arch,
            &CompileOptions::default(),
        )?;
        let m = Arc::new(self.gpu.load_module(&c.cubin)?);
        mods.insert(*kernel, m.clone());
        Ok(m)
    }

    /// Plans `attention(q, k, v, bias)` for these device tensors.
    pub fn plan(
        &self,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        bias: Option<&GpuTensor>,
        opts: &AttentionOptions,
    ) -> Result<AttnPlan> {
        plan(
            (q.shape(), q.dtype()),
            (k.shape(), k.dtype()),
            (v.shape(), v.dtype()),
            bias.map(|b| (b.shape(), b.dtype())),
            opts,
        )
    }

    /// `attention(q, k, v, bias)` into a new device tensor (asynchronous on the GPU's stream).
    pub fn run(
        &self,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        bias: Option<&GpuTensor>,
        opts: &AttentionOptions,
    ) -> Result<GpuTensor> {
        let p = self.plan(q, k, v, bias, opts)?;
        let out = GpuTensor::empty(&self.gpu, q.dtype(), p.out_shape.clone())?;
        self.run_into(&p, q, k, v, bias, &out)?;
        Ok(out)
    }

    /// Launches plan `p` writing `out` (of shape `p.out_shape` and q's dtype).
    pub fn run_into(
        &self,
        p: &AttnPlan,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        bias: Option<&GpuTensor>,
        out: &GpuTensor,
    ) -> Result<()> {
        if out.shape() != p.out_shape.as_slice() || out.dtype() != q.dtype() {
            return Err(Error::Args(format!(
                "attention output is {} {:?}; the plan writes {} {:?}",
                out.dtype(),
                out.shape(),
                q.dtype(),
                p.out_shape
            )));
        }
        if bias.is_some() != p.kernel.bias {
            return Err(Error::Args(
                "attention: the bias operand does not match the plan".into(),
            ));
        }
        if p.seq_q == 0 || p.batch == 0 || p.heads_q == 0 {
            return Ok(());
        }
        for (name, t) in [
            ("q", Some(q)),
            ("k", Some(k)),
            ("v", Some(v)),
            ("o", Some(out)),
        ] {
            if let Some(t) = t
                && !t.device_ptr().is_multiple_of(16)
            {
                return Err(Error::Args(format!(
                    "attention: {name} is not 16-byte aligned on the device"
                )));
            }
        }
        let cfg = p.launch()?;
        let module = self.module(&p.kernel)?;
        let kernel = module.kernel(&p.kernel.name())?;
        let i32_ = |x: usize| -> Result<i32> {
            i32::try_from(x).map_err(|_| Error::Args(format!("{x} exceeds 32-bit indexing")))
        };
        let log2e = std::f64::consts::LOG2_E;
        let mut args = vec![
            KernelArg::Buffer(q),
            KernelArg::Buffer(k),
            KernelArg::Buffer(v),
        ];
        match bias {
            Some(b) => args.push(KernelArg::Buffer(b)),
            None => args.push(KernelArg::Ptr(0)),
        }
        args.push(KernelArg::Buffer(out));
        args.push(KernelArg::I32(i32_(p.seq_q)?));
        args.push(KernelArg::I32(i32_(p.seq_kv)?));
        args.push(KernelArg::I32(i32_(p.heads_q)?));
        args.push(KernelArg::I32(i32_(p.heads_kv)?));
        args.push(KernelArg::F32((p.scale * log2e) as f32));
        args.push(KernelArg::I32(i32_(p.causal_offset)?));
        for s in p
            .bias_strides
            .iter()
            .chain(&p.q_strides)
            .chain(&p.kv_strides)
            .chain(&p.q_strides)
        {
            args.push(KernelArg::I64(*s));
        }
        kernel.launch(&cfg, &args)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    fn p(
        q: &[usize],
        k: &[usize],
        bias: Option<&[usize]>,
        opts: AttentionOptions,
    ) -> Result<AttnPlan> {
        plan(
            (q, DType::F16),
            (k, DType::F16),
            (k, DType::F16),
            bias.map(|b| (b, DType::F16)),
            &opts,
        )
    }

    #[test]
    fn plans_grouped_heads_broadcast_bias_and_both_causal_offsets() {
        let o = AttentionOptions {
            scale: None,
            causal: Some(CausalMask::BottomRight),
            ..Default::default()
        };
        let pl = p(&[2, 17, 8, 64], &[2, 300, 2, 64], Some(&[8, 1, 300]), o).unwrap();
        assert_eq!((pl.heads_q, pl.heads_kv, pl.causal_offset), (8, 2, 283));
        assert_eq!(pl.bias_strides, [0, 300, 0, 1]);
        assert_eq!(pl.scale, 0.125);
        assert_eq!(pl.out_shape, vec![2, 17, 8, 64]);
        assert_eq!(pl.kernel.name(), "fusebox_attn_f16_d64_causal_bias");
        let l = pl.launch().unwrap();
        assert_eq!((l.grid, l.block), ([1, 8, 2], [128, 1, 1]));
        assert_eq!(l.shared_mem_bytes, 3 * 64 * 72 * 2);
        let o = AttentionOptions {
            scale: Some(0.5),
            causal: Some(CausalMask::TopLeft),
            ..Default::default()
        };
        let pl = p(
            &[1, 300, 4, 128],
            &[1, 17, 4, 128],
            Some(&[1, 4, 300, 17]),
            o,
        )
        .unwrap();
        assert_eq!((pl.causal_offset, pl.scale), (0, 0.5));
        assert_eq!(pl.bias_strides, [0, 300 * 17, 17, 1]);
        assert_eq!(pl.launch().unwrap().grid, [5, 4, 1]);
        assert_eq!(pl.q_strides, [300 * 4 * 128, 4 * 128, 128]);
        assert_eq!(pl.kv_strides, [17 * 4 * 128, 4 * 128, 128]);
        // The same problem in (batch, heads, seq, head_dim).
        let o = AttentionOptions {
            layout: Layout::Bhsd,
            ..o
        };
        let pb = p(
            &[1, 4, 300, 128],
            &[1, 4, 17, 128],
            Some(&[1, 4, 300, 17]),
            o,
        )
        .unwrap();
        assert_eq!((pb.seq_q, pb.seq_kv, pb.heads_q), (300, 17, 4));
        assert_eq!(pb.q_strides, [300 * 4 * 128, 128, 300 * 128]);
        assert_eq!(pb.kv_strides, [17 * 4 * 128, 128, 17 * 128]);
        assert_eq!(pb.out_shape, vec![1, 4, 300, 128]);
        assert_eq!(
            (pb.kernel, pb.launch().unwrap()),
            (pl.kernel, pl.launch().unwrap())
        );
        assert_eq!(CausalMask::BottomRight.offset(300, 17), 283);
        assert_eq!(CausalMask::BottomRight.offset(17, 300), 283);
    }

    #[test]
    fn bad_operands_are_typed_errors_naming_the_problem() {
        let o = AttentionOptions::default();
        let cases: Vec<(Result<AttnPlan>, &str)> = vec![
            (p(&[2, 17, 8], &[2, 17, 8, 64], None, o), "q has shape"),
            (
                p(&[2, 17, 8, 64], &[2, 17, 3, 64], None, o),
                "do not divide",
            ),
            (p(&[2, 17, 8, 64], &[1, 17, 8, 64], None, o), "k has shape"),
            (
                p(&[2, 17, 8, 72], &[2, 17, 8, 72], None, o),
                "multiple of 16",
            ),
            (
                p(&[2, 17, 8, 256], &[2, 17, 8, 256], None, o),
                "from 32 to 128",
            ),
            (
                p(&[2, 17, 8, 16], &[2, 17, 8, 16], None, o),
                "from 32 to 128",
            ),
            (p(&[2, 17, 8, 64], &[2, 0, 8, 64], None, o), "seq_kv is 0"),
            (
                p(&[2, 17, 8, 64], &[2, 9, 8, 64], Some(&[2, 8, 17, 8]), o),
                "does not broadcast",
            ),
            (
                p(&[2, 17, 8, 64], &[2, 9, 8, 64], Some(&[1, 2, 8, 17, 9]), o),
                "at most 4 dims",
            ),
        ];
        for (r, want) in cases {
            let e = r.unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} should mention {want:?}");
        }
        let e = plan(
            (&[1, 1, 1, 16], DType::F32),
            (&[1, 1, 1, 16], DType::F32),
            (&[1, 1, 1, 16], DType::F32),
            None,
            &o,
        )
        .unwrap_err();
        assert!(e.to_string().contains("float16 or bfloat16"), "{e}");
        let e = plan(
            (&[1, 1, 1, 16], DType::F16),
            (&[1, 1, 1, 16], DType::F16),
            (&[1, 2, 1, 16], DType::F16),
            None,
            &o,
        )
        .unwrap_err();
        assert!(e.to_string().contains("v has shape"), "{e}");
        assert!(CausalMask::parse("Diagonal").is_err());
        assert_eq!(
            CausalMask::parse("BottomRight").unwrap(),
            CausalMask::BottomRight
        );
    }

    #[test]
    fn variants_are_distinct_and_sources_name_their_kernel() {
        let v = variants();
        assert_eq!(v.len(), 2 * 7 * 2 * 2);
        let names: std::collections::BTreeSet<String> = v.iter().map(AttnKernel::name).collect();
        assert_eq!(names.len(), v.len());
        for k in &v {
            k.check().unwrap();
            let s = k.source();
            assert!(s.contains(&format!("void __launch_bounds__(128, 1) {}(", k.name())));
            assert!(s.contains(&format!("#define HEAD_DIM {}\n", k.head_dim)));
            assert!(s.contains(&format!("#define CAUSAL {}\n", u8::from(k.causal))));
        }
        // The largest tile set fits the 227 KiB of an sm_80/sm_90 block.
        assert!(v.iter().all(|k| k.smem_bytes() <= 227 * 1024));
    }

    #[test]
    fn without_a_gpu_the_runner_is_the_typed_no_device_error() {
        match FlashAttention::new() {
            Ok(f) => assert!(f.gpu().arch().is_some()),
            Err(e) => assert!(e.is_no_device(), "{e}"),
        }
    }
}
