//! The template generator: an [`Instance`] (element type, problem kind, threadblock tile, warp
//! tile, instruction shape, pipeline stages, alignment, epilogue) → self-contained CUDA C++
//! (only `cuda_fp16.h` / `cuda_bf16.h`), with CUTLASS's structure:
//!
//! - a global→shared *loader* per operand: vectors of `align` elements copied with 16/8/4-byte
//!   `cp.async` (zero fill through `src-size = 0` when a vector is out of bounds, so M, N, K need
//!   not be multiples of the tile), or predicated scalar loads when a vector is under 4 bytes;
//!   for conv2d the A loader is the implicit-GEMM (im2col) iterator over NHWC activations and
//!   the B loader reads OHWI weights as an `O × (R·S·C)` matrix;
//! - a `stages`-deep multistage mainloop (`cp.async.commit_group` / `wait_group`), padded
//!   shared memory (8 elements per row: conflict-free `ldmatrix`);
//! - the warp-level MMA: `ldmatrix.x4` (`.trans` for a K-major B) feeding
//!   `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}` with fp32 accumulators (sm_80+), or a
//!   SIMT thread tile for float32;
//! - an epilogue generated from the composite's ops, in fp32, with a bounds check per element
//!   ([`Math::Wgmma`] instances are emitted by [`crate::wgmma`], which reuses this epilogue on
//!   the wgmma accumulator fragments).
//!
//! Contract: [`emit`] is deterministic (the same instance gives the same bytes);
//! [`Instance::kernel_name`] is unique per instance and is the `extern "C"` symbol;
//! [`Instance::launch`] gives the grid/block/dynamic shared memory for a problem.
//!
//! ```text
//! Instance { f16, gemm (B N×K), 128x128x32 / 64x64x32 / 16x8x16, 3 stages, align 8,
//!            epilogue [add vector(bias), gelu] }
//!   -> extern "C" __global__ void cutlass_f16_gemm_tn_128x128x32_64x64x32_s3_a8_bias_gelu(
//!          const __half* A, const __half* B, __half* D, const __half* E0,
//!          int M, int N, int K, long long sA, long long sB, long long sD)
//! ```

use std::fmt::Write as _;

/// The element type of A, B and D.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Elem {
    /// `float16` (tensor cores).
    F16,
    /// `bfloat16` (tensor cores).
    Bf16,
    /// `float32` (SIMT).
    F32,
}

impl Elem {
    /// Short name for kernel names.
    pub fn tag(self) -> &'static str {
        match self {
            Elem::F16 => "f16",
            Elem::Bf16 => "bf16",
            Elem::F32 => "f32",
        }
    }
    /// Bytes per element.
    pub fn bytes(self) -> u32 {
        match self {
            Elem::F16 | Elem::Bf16 => 2,
            Elem::F32 => 4,
        }
    }
    /// The alignments (elements per vector) the generator emits, widest first.
    pub fn alignments(self) -> &'static [u32] {
        match self {
            Elem::F16 | Elem::Bf16 => &[8, 4, 2, 1],
            Elem::F32 => &[4, 2, 1],
        }
    }
    fn cty(self) -> &'static str {
        match self {
            Elem::F16 => "__half",
            Elem::Bf16 => "__nv_bfloat16",
            Elem::F32 => "float",
        }
    }
}

/// What the kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `D[b] = A[b] (M×K, row-major) · B[b]`, B stored `N×K` (`b_kmajor = false`: a transposed
    /// rhs, "TN") or `K×N` (`b_kmajor = true`: a plain rhs, "NN").
    Gemm {
        /// B is stored K×N (row-major rhs).
        b_kmajor: bool,
    },
    /// Implicit-GEMM conv2d fprop: NHWC activations, OHWI weights, NHWC output.
    Conv2d,
}

/// The warp-level math.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Math {
    /// Tensor cores: warp tile `[wm, wn, wk]`, instruction m16n8k16.
    TensorOp {
        /// The warp tile (M, N, K).
        warp: [u32; 3],
    },
    /// CUDA cores: each thread computes a `[tm, tn]` tile.
    Simt {
        /// The thread tile (M, N).
        thread: [u32; 2],
    },
    /// Hopper warpgroup MMA (sm_90a only; see [`crate::wgmma`]): one producer warpgroup
    /// issues TMA copies into a `stages`-deep ring of 128-byte-swizzled shared memory, and
    /// `BM / 64` consumer warpgroups each compute 64 × BN with
    /// `wgmma.mma_async.m64nBNk16`.
    Wgmma,
}

/// A tile configuration: threadblock tile, math and stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TileConfig {
    /// The threadblock tile (M, N, K).
    pub tb: [u32; 3],
    /// The warp-level math.
    pub math: Math,
    /// Pipeline stages (≥ 2).
    pub stages: u32,
}

/// The tensor-core tiles, largest first (the heuristic's candidates for f16 / bf16).
pub const TENSOR_OP_TILES: [TileConfig; 3] = [
    TileConfig {
        tb: [128, 128, 32],
        math: Math::TensorOp { warp: [64, 64, 32] },
        stages: 3,
    },
    TileConfig {
        tb: [128, 64, 32],
        math: Math::TensorOp { warp: [64, 32, 32] },
        stages: 4,
    },
    TileConfig {
        tb: [64, 64, 32],
        math: Math::TensorOp { warp: [32, 32, 32] },
        stages: 4,
    },
];

/// The wgmma tiles (sm_90a), largest first: two consumer warpgroups of 64 rows each.
pub const WGMMA_TILES: [TileConfig; 2] = [
    TileConfig {
        tb: [128, 256, 64],
        math: Math::Wgmma,
        stages: 4,
    },
    TileConfig {
        tb: [128, 128, 64],
        math: Math::Wgmma,
        stages: 4,
    },
];

/// The SIMT tiles, largest first (the candidates for f32).
pub const SIMT_TILES: [TileConfig; 2] = [
    TileConfig {
        tb: [128, 128, 8],
        math: Math::Simt { thread: [8, 8] },
        stages: 3,
    },
    TileConfig {
        tb: [64, 64, 8],
        math: Math::Simt { thread: [4, 4] },
        stages: 3,
    },
];

impl TileConfig {
    /// Threads per block.
    pub fn threads(&self) -> u32 {
        match self.math {
            Math::TensorOp { warp } => (self.tb[0] / warp[0]) * (self.tb[1] / warp[1]) * 32,
            Math::Simt { thread } => (self.tb[0] / thread[0]) * (self.tb[1] / thread[1]),
            Math::Wgmma => (self.tb[0] / 64 + 1) * 128,
        }
    }
    /// `128x128x32_64x64x32_s3`.
    pub fn tag(&self) -> String {
        let [m, n, k] = self.tb;
        match self.math {
            Math::TensorOp { warp: [a, b, c] } => {
                format!("{m}x{n}x{k}_{a}x{b}x{c}_s{}", self.stages)
            }
            Math::Simt { thread: [a, b] } => format!("{m}x{n}x{k}_t{a}x{b}_s{}", self.stages),
            Math::Wgmma => format!("{m}x{n}x{k}_wgmma_s{}", self.stages),
        }
    }
    /// Shared-memory padding per row, in elements.
    fn pad(&self) -> u32 {
        match self.math {
            Math::TensorOp { .. } => 8,
            Math::Simt { .. } => 4,
            Math::Wgmma => 0,
        }
    }
}

/// An activation of the epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Act {
    /// `relax.nn.relu`.
    Relu,
    /// `relax.nn.gelu` (erf form).
    Gelu,
    /// `relax.nn.gelu_tanh`.
    GeluTanh,
    /// `relax.sigmoid`.
    Sigmoid,
    /// `relax.nn.silu`.
    Silu,
}

/// A binary op of the epilogue with an extra operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinOp {
    /// `relax.add`.
    Add,
    /// `relax.multiply`.
    Mul,
}

/// How the extra operand of a [`EpOp::Binary`] is indexed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bcast {
    /// One value per output column (a bias vector of length N).
    Vector,
    /// One value per output element (a residual of the output's shape).
    Full,
}

/// One op of the epilogue, applied in order to the fp32 accumulator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EpOp {
    /// `v = v op E[i]`, the next extra operand.
    Binary(BinOp, Bcast),
    /// An activation.
    Act(Act),
    /// `relax.clip(v, lo, hi)`.
    Clip(f64, f64),
}

impl Eq for EpOp {}
impl std::hash::Hash for EpOp {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.tag().hash(state);
    }
}

impl EpOp {
    /// Its token in kernel names (`bias`, `radd`, `relu`, `clip0_6`).
    pub fn tag(&self) -> String {
        match self {
            EpOp::Binary(BinOp::Add, Bcast::Vector) => "bias".into(),
            EpOp::Binary(BinOp::Mul, Bcast::Vector) => "vmul".into(),
            EpOp::Binary(BinOp::Add, Bcast::Full) => "radd".into(),
            EpOp::Binary(BinOp::Mul, Bcast::Full) => "rmul".into(),
            EpOp::Act(Act::Relu) => "relu".into(),
            EpOp::Act(Act::Gelu) => "gelu".into(),
            EpOp::Act(Act::GeluTanh) => "gelutanh".into(),
            EpOp::Act(Act::Sigmoid) => "sigmoid".into(),
            EpOp::Act(Act::Silu) => "silu".into(),
            EpOp::Clip(lo, hi) => {
                let s = |x: f64| format!("{x}").replace('-', "m").replace('.', "p");
                format!("clip{}_{}", s(*lo), s(*hi))
            }
        }
    }
}

/// One kernel the generator can emit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Instance {
    /// Element type.
    pub elem: Elem,
    /// GEMM or conv2d.
    pub kind: Kind,
    /// Tile configuration.
    pub tile: TileConfig,
    /// Elements per global→shared vector (divides K, and N for a K-major B; C for conv).
    pub align: u32,
    /// The epilogue.
    pub epilogue: Vec<EpOp>,
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Blocks.
    pub grid: [u32; 3],
    /// Threads per block.
    pub block: [u32; 3],
    /// Dynamic shared memory bytes.
    pub smem: u32,
}

impl Instance {
    /// The `extern "C"` symbol (unique per instance).
    pub fn kernel_name(&self) -> String {
        let kind = match self.kind {
            Kind::Gemm { b_kmajor: false } => "gemm_tn",
            Kind::Gemm { b_kmajor: true } => "gemm_nn",
            Kind::Conv2d => "conv2d_fprop",
        };
        let mut s = format!(
            "cutlass_{}_{kind}_{}_a{}",
            self.elem.tag(),
            self.tile.tag(),
            self.align
        );
        for op in &self.epilogue {
            s.push('_');
            s.push_str(&op.tag());
        }
        s
    }

    /// Whether B is stored K×N (row-major rhs).
    pub(crate) fn b_kmajor(&self) -> bool {
        matches!(self.kind, Kind::Gemm { b_kmajor: true })
    }

    /// Dynamic shared memory bytes.
    pub fn smem_bytes(&self) -> u32 {
        if self.tile.math == Math::Wgmma {
            return crate::wgmma::smem_bytes(self);
        }
        let [bm, bn, bk] = self.tile.tb;
        let pad = self.tile.pad();
        let a = bm * (bk + pad);
        let b = if self.b_kmajor() {
            bk * (bn + pad)
        } else {
            bn * (bk + pad)
        };
        (a + b) * self.tile.stages * self.elem.bytes()
    }

    /// The launch for a problem of `m × n` outputs and `batch` batches.
    pub fn launch(&self, m: usize, n: usize, batch: usize) -> Option<Launch> {
        let [bm, bn, _] = self.tile.tb;
        let gx = u32::try_from(n.div_ceil(bn as usize)).ok()?.max(1);
        let gy = u32::try_from(m.div_ceil(bm as usize)).ok()?.max(1);
        let gz = u32::try_from(batch).ok()?.max(1);
        if gy > 65535 || gz > 65535 {
            return None;
        }
        Some(Launch {
            grid: [gx, gy, gz],
            block: [self.tile.threads(), 1, 1],
            smem: self.smem_bytes(),
        })
    }

    /// The number of extra operands (bias, residual) the epilogue reads.
    pub fn num_extra(&self) -> usize {
        self.epilogue
            .iter()
            .filter(|o| matches!(o, EpOp::Binary(..)))
            .count()
    }
}

/// Every instance the generator emits without an epilogue for `arch`: [`all_instances`], and
/// on sm_90a also [`wgmma_instances`].
pub fn instances_for(arch: fusebox_cuda::Arch) -> Vec<Instance> {
    let mut out = all_instances();
    if arch == fusebox_cuda::Arch::Sm90a {
        out.extend(wgmma_instances());
    }
    out
}

/// The sm_90a wgmma instances: f16 and bf16 × GEMM with B N×K or K×N × [`WGMMA_TILES`], at
/// alignment 8 (TMA needs 16-byte row strides).
pub fn wgmma_instances() -> Vec<Instance> {
    let mut out = Vec::new();
    for elem in [Elem::F16, Elem::Bf16] {
        for kind in [
            Kind::Gemm { b_kmajor: false },
            Kind::Gemm { b_kmajor: true },
        ] {
            for tile in WGMMA_TILES {
                out.push(Instance {
                    elem,
                    kind,
                    tile,
                    align: 8,
                    epilogue: Vec::new(),
                });
            }
        }
    }
    out
}

/// Every mma.sync / SIMT instance the generator emits without an epilogue: every element type
/// × kind × tile × alignment (the compile test builds all of them for every arch; the wgmma
/// instances, sm_90a only, are [`wgmma_instances`]).
pub fn all_instances() -> Vec<Instance> {
    let mut out = Vec::new();
    for elem in [Elem::F16, Elem::Bf16, Elem::F32] {
        let tiles: &[TileConfig] = if elem == Elem::F32 {
            &SIMT_TILES
        } else {
            &TENSOR_OP_TILES
        };
        for kind in [
            Kind::Gemm { b_kmajor: false },
            Kind::Gemm { b_kmajor: true },
            Kind::Conv2d,
        ] {
            for tile in tiles {
                for &align in elem.alignments() {
                    out.push(Instance {
                        elem,
                        kind,
                        tile: *tile,
                        align,
                        epilogue: Vec::new(),
                    });
                }
            }
        }
    }
    out
}

const HELPERS: &str = r#"
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async_16(void* s, const void* g, bool p) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(smem_u32(s)), "l"(g), "r"(p ? 16 : 0));
}
__device__ __forceinline__ void cp_async_8(void* s, const void* g, bool p) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" :: "r"(smem_u32(s)), "l"(g), "r"(p ? 8 : 0));
}
__device__ __forceinline__ void cp_async_4(void* s, const void* g, bool p) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(smem_u32(s)), "l"(g), "r"(p ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}
"#;

const TC_HELPERS: &str = r#"
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
"#;

fn mma_helper(elem: Elem) -> String {
    let t = if elem == Elem::Bf16 { "bf16" } else { "f16" };
    format!(
        r#"
__device__ __forceinline__ void mma_16816(float* c, const unsigned* a, const unsigned* b) {{
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}}
"#
    )
}

fn float_lit(x: f64) -> String {
    if x.is_finite() {
        let f = x as f32;
        format!("{f:?}f")
    } else if x > 0.0 {
        "__int_as_float(0x7f800000)".into()
    } else {
        "__int_as_float(0xff800000)".into()
    }
}

/// The epilogue of `inst`, shared by every math path: the per-batch offsets of full-shaped
/// extra operands (`E{i} += blockIdx.z * sD`), and the guarded store of one accumulator
/// element `val` at (`row`, `col`) of an `M × N` output `D`, with the composite's ops applied
/// in fp32 in order.
pub(crate) fn epilogue(inst: &Instance) -> (String, String) {
    let mut ep = String::new();
    let mut e = 0usize;
    for op in &inst.epilogue {
        let line = match op {
            EpOp::Binary(b, bc) => {
                let idx = match bc {
                    Bcast::Vector => "col".to_string(),
                    Bcast::Full => "(long long)row * N + col".to_string(),
                };
                let o = match b {
                    BinOp::Add => "+",
                    BinOp::Mul => "*",
                };
                let l = format!("      v = v {o} to_f(E{e}[{idx}]);\n");
                e += 1;
                l
            }
            EpOp::Act(Act::Relu) => "      v = fmaxf(v, 0.f);\n".into(),
            EpOp::Act(Act::Gelu) => "      v = 0.5f * v * (1.f + erff(v * 0.70710678118654752f));\n".into(),
            EpOp::Act(Act::GeluTanh) => "      v = 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));\n".into(),
            EpOp::Act(Act::Sigmoid) => "      v = 1.f / (1.f + expf(-v));\n".into(),
            EpOp::Act(Act::Silu) => "      v = v / (1.f + expf(-v));\n".into(),
            EpOp::Clip(lo, hi) => format!(
                "      v = fminf(fmaxf(v, {}), {});\n",
                float_lit(*lo),
                float_lit(*hi)
            ),
        };
        ep.push_str(&line);
    }
    let full_offsets: String = inst
        .epilogue
        .iter()
        .filter(|o| matches!(o, EpOp::Binary(..)))
        .enumerate()
        .filter(|(_, o)| matches!(o, EpOp::Binary(_, Bcast::Full)))
        .map(|(i, _)| format!("  E{i} += (long long)blockIdx.z * sD;\n"))
        .collect();
    let store = format!(
        "    if (row < M && col < N) {{\n      float v = val;\n{ep}      D[(long long)row * N + col] = from_f(v);\n    }}\n"
    );
    (full_offsets, store)
}

/// The source's head: the name, the fp16/bf16 header, `T` and its fp32 conversions.
pub(crate) fn prelude(name: &str, elem: Elem) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "// Generated by fusebox-cutlass: {name}");
    match elem {
        Elem::F16 => s.push_str("#include <cuda_fp16.h>\n"),
        Elem::Bf16 => s.push_str("#include <cuda_bf16.h>\n"),
        Elem::F32 => {}
    }
    let _ = writeln!(s, "typedef {} T;", elem.cty());
    match elem {
        Elem::F16 => s.push_str(
            "__device__ __forceinline__ float to_f(T x) { return __half2float(x); }\n\
             __device__ __forceinline__ T from_f(float x) { return __float2half_rn(x); }\n",
        ),
        Elem::Bf16 => s.push_str(
            "__device__ __forceinline__ float to_f(T x) { return __bfloat162float(x); }\n\
             __device__ __forceinline__ T from_f(float x) { return __float2bfloat16_rn(x); }\n",
        ),
        Elem::F32 => s.push_str(
            "__device__ __forceinline__ float to_f(T x) { return x; }\n\
             __device__ __forceinline__ T from_f(float x) { return x; }\n",
        ),
    }
    s
}

/// The CUDA C++ source of `inst` (one kernel; see the module doc).
pub fn emit(inst: &Instance) -> String {
    if inst.tile.math == Math::Wgmma {
        return crate::wgmma::emit(inst);
    }
    let mut s = String::new();
    let elem = inst.elem;
    let name = inst.kernel_name();
    let [bm, bn, bk] = inst.tile.tb;
    let pad = inst.tile.pad();
    let stages = inst.tile.stages;
    let threads = inst.tile.threads();
    let al = inst.align;
    s.push_str(&prelude(&name, elem));
    s.push_str(HELPERS);
    let tensor_op = matches!(inst.tile.math, Math::TensorOp { .. });
    if tensor_op {
        s.push_str(TC_HELPERS);
        s.push_str(&mma_helper(elem));
    }
    let bkm = inst.b_kmajor();
    let _ = writeln!(
        s,
        "constexpr int BM = {bm}, BN = {bn}, BK = {bk}, STAGES = {stages}, THREADS = {threads}, AL = {al};"
    );
    let _ = writeln!(
        s,
        "constexpr int A_LD = BK + {pad}, A_STAGE = BM * A_LD;\nconstexpr int B_LD = {} + {pad}, B_STAGE = {};",
        if bkm { "BN" } else { "BK" },
        if bkm { "BK * B_LD" } else { "BN * B_LD" },
    );

    // Vector copy: cp.async for >= 4 bytes, predicated plain loads below.
    let vbytes = al * elem.bytes();
    let copy = match vbytes {
        16 => "cp_async_16(dst, pred ? (const void*)src : (const void*)base, pred);".to_string(),
        8 => "cp_async_8(dst, pred ? (const void*)src : (const void*)base, pred);".to_string(),
        4 => "cp_async_4(dst, pred ? (const void*)src : (const void*)base, pred);".to_string(),
        _ => {
            "#pragma unroll\n    for (int e = 0; e < AL; ++e) dst[e] = pred ? src[e] : from_f(0.f);"
                .to_string()
        }
    };
    let _ = writeln!(
        s,
        "__device__ __forceinline__ void copy_vec(T* dst, const T* src, const T* base, bool pred) {{\n    {copy}\n}}"
    );

    // Kernel signature.
    let extra: Vec<String> = (0..inst.num_extra())
        .map(|i| format!("const T* __restrict__ E{i}"))
        .collect();
    let extra_sig = if extra.is_empty() {
        String::new()
    } else {
        format!("{}, ", extra.join(", "))
    };
    let conv = inst.kind == Kind::Conv2d;
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void __launch_bounds__({threads}, 1) {name}(\n    const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ D, {extra_sig}"
    );
    if conv {
        s.push_str(
            "    int NB, int H, int W, int C, int O, int P, int Q, int R, int S,\n    int SH, int SW, int PH, int PW, int DH, int DW) {\n\
             \x20 const int M = NB * P * Q, N = O, K = R * S * C;\n\
             \x20 const long long sD = 0;\n",
        );
    } else {
        s.push_str(
            "    int M, int N, int K, long long sA, long long sB, long long sD) {\n\
             \x20 A += (long long)blockIdx.z * sA;\n  B += (long long)blockIdx.z * sB;\n  D += (long long)blockIdx.z * sD;\n",
        );
    }
    s.push_str(
        "  extern __shared__ __align__(16) unsigned char smem_raw[];\n\
         \x20 T* As = reinterpret_cast<T*>(smem_raw);\n\
         \x20 T* Bs = As + STAGES * A_STAGE;\n\
         \x20 const int tid = threadIdx.x;\n\
         \x20 const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;\n\
         \x20 const int ktiles = (K + BK - 1) / BK;\n",
    );
    // Loaders.
    // Synchronous (sub-4-byte) copies are not unrolled: ptxas would hoist every load.
    // So are loaders with many vectors per thread (their address math costs registers the
    // accumulators need).
    let per_thread = (bm.max(bn) * bk / al).div_ceil(threads);
    let unroll = if vbytes >= 4 && per_thread <= 8 {
        "#pragma unroll"
    } else {
        "#pragma unroll 1"
    };
    s.push_str("  auto load_tile = [&](int stage, int kt) {\n    const int k0 = kt * BK;\n");
    s.push_str(
        "    UNROLL\n    for (int it = 0; it < (BM * BK / AL + THREADS - 1) / THREADS; ++it) {\n\
         \x20     const int v = tid + it * THREADS;\n\
         \x20     if ((BM * BK / AL) % THREADS != 0 && v >= BM * BK / AL) break;\n\
         \x20     const int row = v / (BK / AL), kv = (v % (BK / AL)) * AL;\n\
         \x20     const int gm = m0 + row, gk = k0 + kv;\n\
         \x20     T* dst = As + stage * A_STAGE + row * A_LD + kv;\n",
    );
    if conv {
        s.push_str(
            "      bool pred = gm < M && gk < K;\n\
             \x20     const int n = gm / (P * Q), pq = gm % (P * Q), p = pq / Q, q = pq % Q;\n\
             \x20     const int rs = gk / C, c = gk % C, r = rs / S, sx = rs % S;\n\
             \x20     const int h = p * SH - PH + r * DH, w = q * SW - PW + sx * DW;\n\
             \x20     pred = pred && h >= 0 && h < H && w >= 0 && w < W;\n\
             \x20     const T* src = A + (pred ? (((long long)n * H + h) * W + w) * C + c : 0);\n",
        );
    } else {
        s.push_str(
            "      const bool pred = gm < M && gk < K;\n\
             \x20     const T* src = A + (pred ? (long long)gm * K + gk : 0);\n",
        );
    }
    s.push_str("      copy_vec(dst, src, A, pred);\n    }\n");
    if bkm {
        s.push_str(
            "    UNROLL\n    for (int it = 0; it < (BK * BN / AL + THREADS - 1) / THREADS; ++it) {\n\
         \x20     const int v = tid + it * THREADS;\n\
         \x20     if ((BK * BN / AL) % THREADS != 0 && v >= BK * BN / AL) break;\n\
             \x20     const int krow = v / (BN / AL), nv = (v % (BN / AL)) * AL;\n\
             \x20     const int gk = k0 + krow, gn = n0 + nv;\n\
             \x20     const bool pred = gk < K && gn < N;\n\
             \x20     const T* src = B + (pred ? (long long)gk * N + gn : 0);\n\
             \x20     copy_vec(Bs + stage * B_STAGE + krow * B_LD + nv, src, B, pred);\n    }\n",
        );
    } else {
        s.push_str(
            "    UNROLL\n    for (int it = 0; it < (BN * BK / AL + THREADS - 1) / THREADS; ++it) {\n\
         \x20     const int v = tid + it * THREADS;\n\
         \x20     if ((BN * BK / AL) % THREADS != 0 && v >= BN * BK / AL) break;\n\
             \x20     const int row = v / (BK / AL), kv = (v % (BK / AL)) * AL;\n\
             \x20     const int gn = n0 + row, gk = k0 + kv;\n\
             \x20     const bool pred = gn < N && gk < K;\n\
             \x20     const T* src = B + (pred ? (long long)gn * K + gk : 0);\n\
             \x20     copy_vec(Bs + stage * B_STAGE + row * B_LD + kv, src, B, pred);\n    }\n",
        );
    }
    s.push_str("  };\n");
    s = s.replace("UNROLL", unroll);

    // Accumulators and the warp/thread compute.
    match inst.tile.math {
        Math::TensorOp { warp: [wm, wn, _] } => {
            let _ = writeln!(
                s,
                "  constexpr int WM = {wm}, WN = {wn}, MI = WM / 16, NI = WN / 8, WARPS_N = BN / WN;\n\
                 \x20 const int warp = tid / 32, lane = tid % 32;\n\
                 \x20 const int wr = warp / WARPS_N, wc = warp % WARPS_N;\n\
                 \x20 float acc[MI][NI][4];\n\
                 \x20 #pragma unroll\n  for (int i = 0; i < MI; ++i)\n    #pragma unroll\n    for (int j = 0; j < NI; ++j)\n      #pragma unroll\n      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;"
            );
            let bload = if bkm {
                "        const int k = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;\n\
                 \x20       const int n = wc * WN + nj * 16 + (lane / 16) * 8;\n\
                 \x20       ldmatrix_x4_trans(r, Bsm + k * B_LD + n);\n"
            } else {
                "        const int n = wc * WN + nj * 16 + (lane / 16) * 8 + (lane % 8);\n\
                 \x20       const int k = kk * 16 + ((lane / 8) % 2) * 8;\n\
                 \x20       ldmatrix_x4(r, Bsm + n * B_LD + k);\n"
            };
            let _ = write!(
                s,
                "  auto compute = [&](int stage) {{\n\
                 \x20   const T* Asm = As + stage * A_STAGE;\n    const T* Bsm = Bs + stage * B_STAGE;\n\
                 \x20   #pragma unroll\n    for (int kk = 0; kk < BK / 16; ++kk) {{\n\
                 \x20     unsigned a[MI][4], b[NI][2];\n\
                 \x20     #pragma unroll\n      for (int i = 0; i < MI; ++i)\n\
                 \x20       ldmatrix_x4(a[i], Asm + (wr * WM + i * 16 + (lane % 16)) * A_LD + kk * 16 + (lane / 16) * 8);\n\
                 \x20     #pragma unroll\n      for (int nj = 0; nj < NI / 2; ++nj) {{\n\
                 \x20       unsigned r[4];\n{bload}\
                 \x20       b[2 * nj][0] = r[0]; b[2 * nj][1] = r[1]; b[2 * nj + 1][0] = r[2]; b[2 * nj + 1][1] = r[3];\n\
                 \x20     }}\n\
                 \x20     #pragma unroll\n      for (int i = 0; i < MI; ++i)\n        #pragma unroll\n        for (int j = 0; j < NI; ++j) mma_16816(acc[i][j], a[i], b[j]);\n\
                 \x20   }}\n  }};\n"
            );
        }
        Math::Simt { thread: [tm, tn] } => {
            let bidx = if bkm {
                "Bsm[k * B_LD + tx * TN + j]"
            } else {
                "Bsm[(tx * TN + j) * B_LD + k]"
            };
            let _ = write!(
                s,
                "  constexpr int TM = {tm}, TN = {tn}, TX = BN / TN;\n\
                 \x20 const int tx = tid % TX, ty = tid / TX;\n\
                 \x20 float acc[TM][TN];\n\
                 \x20 #pragma unroll\n  for (int i = 0; i < TM; ++i)\n    #pragma unroll\n    for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;\n\
                 \x20 auto compute = [&](int stage) {{\n\
                 \x20   const T* Asm = As + stage * A_STAGE;\n    const T* Bsm = Bs + stage * B_STAGE;\n\
                 \x20   #pragma unroll\n    for (int k = 0; k < BK; ++k) {{\n\
                 \x20     float a[TM], b[TN];\n\
                 \x20     #pragma unroll\n      for (int i = 0; i < TM; ++i) a[i] = to_f(Asm[(ty * TM + i) * A_LD + k]);\n\
                 \x20     #pragma unroll\n      for (int j = 0; j < TN; ++j) b[j] = to_f({bidx});\n\
                 \x20     #pragma unroll\n      for (int i = 0; i < TM; ++i)\n        #pragma unroll\n        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);\n\
                 \x20   }}\n  }};\n"
            );
        }
        // Emitted by crate::wgmma (emit returns early).
        Math::Wgmma => {}
    }

    // The multistage mainloop.
    s.push_str(
        "  #pragma unroll\n  for (int st = 0; st < STAGES - 1; ++st) {\n    if (st < ktiles) load_tile(st, st);\n    cp_async_commit();\n  }\n\
         \x20 for (int kt = 0; kt < ktiles; ++kt) {\n\
         \x20   cp_async_wait<STAGES - 2>();\n    __syncthreads();\n\
         \x20   const int nk = kt + STAGES - 1;\n\
         \x20   if (nk < ktiles) load_tile(nk % STAGES, nk);\n    cp_async_commit();\n\
         \x20   compute(kt % STAGES);\n  }\n  cp_async_wait<0>();\n",
    );

    // The epilogue.
    let (full_offsets, store) = epilogue(inst);
    s.push_str(&full_offsets);
    s.push_str("  (void)sD;\n");
    match inst.tile.math {
        Math::TensorOp { .. } => {
            let _ = write!(
                s,
                "  #pragma unroll\n  for (int i = 0; i < MI; ++i)\n  #pragma unroll\n  for (int j = 0; j < NI; ++j)\n  #pragma unroll\n  for (int e = 0; e < 4; ++e) {{\n\
                 \x20   const int row = m0 + wr * WM + i * 16 + lane / 4 + (e / 2) * 8;\n\
                 \x20   const int col = n0 + wc * WN + j * 8 + (lane % 4) * 2 + (e % 2);\n\
                 \x20   const float val = acc[i][j][e];\n{store}  }}\n}}\n"
            );
        }
        Math::Simt { .. } => {
            let _ = write!(
                s,
                "  #pragma unroll\n  for (int i = 0; i < TM; ++i)\n  #pragma unroll\n  for (int j = 0; j < TN; ++j) {{\n\
                 \x20   const int row = m0 + ty * TM + i, col = n0 + tx * TN + j;\n\
                 \x20   const float val = acc[i][j];\n{store}  }}\n}}\n"
            );
        }
        Math::Wgmma => {}
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_emission_is_deterministic() {
        let all = all_instances();
        let mut names: Vec<String> = all.iter().map(Instance::kernel_name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
        for i in &all {
            assert_eq!(emit(i), emit(i));
            assert!(emit(i).contains(&format!(
                "void __launch_bounds__({}, 1) {}(",
                i.tile.threads(),
                i.kernel_name()
            )));
        }
    }

    #[test]
    fn tiles_are_consistent() {
        for t in TENSOR_OP_TILES {
            let Math::TensorOp { warp } = t.math else {
                unreachable!()
            };
            assert_eq!(t.tb[0] % warp[0], 0);
            assert_eq!(t.tb[1] % warp[1], 0);
            assert_eq!(warp[0] % 16, 0);
            assert_eq!(warp[1] % 16, 0);
            assert_eq!(t.tb[2] % 16, 0);
            assert!(t.stages >= 2);
        }
        for t in SIMT_TILES {
            assert!(t.threads() <= 1024);
            assert!(t.stages >= 2);
        }
        let i = Instance {
            elem: Elem::F16,
            kind: Kind::Gemm { b_kmajor: false },
            tile: TENSOR_OP_TILES[0],
            align: 8,
            epilogue: vec![],
        };
        assert_eq!(i.smem_bytes(), (128 * 40 * 2) * 3 * 2);
        assert_eq!(
            i.launch(1000, 300, 2),
            Some(Launch {
                grid: [3, 8, 2],
                block: [128, 1, 1],
                smem: 61440
            })
        );
    }
}

/// A CPU model of one warp's k-step on the tensor-core path: the lane → shared-memory address
/// formulas the generator emits for `ldmatrix.x4` (A, and B N-major or `.trans` K-major), the
/// register contents PTX defines for `ldmatrix` and the m16n8k16 fragments, and the epilogue's
/// lane → (row, col) mapping. The test checks that the model's result is the 16·MI × 8·NI
/// product, and that the emitted source contains exactly these formulas.
#[cfg(test)]
#[allow(
    clippy::needless_range_loop,
    reason = "the model indexes lanes and fragments as the PTX tables do"
)]
mod fragment_model {
    /// `ldmatrix.x4` (`trans = false`): lane `t` gets, for matrix `j`, the pair
    /// `M_j[t / 4][2 (t % 4) .. + 1]`, where matrix `j`'s row `r` starts at the address lane
    /// `8 j + r` supplies. With `.trans`: `M_j[2 (t % 4) .. + 1][t / 4]`.
    fn ldmatrix_x4(
        addr: impl Fn(usize) -> (usize, usize),
        smem: impl Fn(usize, usize) -> f64,
        trans: bool,
    ) -> Vec<[[f64; 2]; 4]> {
        (0..32)
            .map(|t| {
                let mut regs = [[0.0; 2]; 4];
                for (j, reg) in regs.iter_mut().enumerate() {
                    for (e, x) in reg.iter_mut().enumerate() {
                        let (r, c) = if trans {
                            (2 * (t % 4) + e, t / 4)
                        } else {
                            (t / 4, 2 * (t % 4) + e)
                        };
                        let (row, col) = addr(8 * j + r);
                        *x = smem(row, col + c);
                    }
                }
                regs
            })
            .collect()
    }

    #[test]
    fn warp_fragments_compute_the_product() {
        const MI: usize = 2;
        const NI: usize = 4;
        let (wm, wn, kk0) = (16 * MI, 8 * NI, 0usize);
        // A: wm × 16 (row-major), B as B[k][n].
        let a = |m: usize, k: usize| ((m * 7 + k * 3) % 11) as f64 - 5.0;
        let b = |k: usize, n: usize| ((k * 5 + n * 2) % 13) as f64 - 6.0;
        for kmajor in [false, true] {
            let mut acc = vec![[[0.0f64; 4]; NI * MI]; 32];
            let mut afrag = vec![vec![[[0.0; 2]; 4]; 32]; MI];
            for (i, fr) in afrag.iter_mut().enumerate() {
                // Emitted: (wr * WM + i * 16 + (lane % 16)) * A_LD + kk * 16 + (lane / 16) * 8
                *fr = ldmatrix_x4(|l| (i * 16 + l % 16, kk0 * 16 + (l / 16) * 8), a, false);
            }
            let mut bfrag = vec![vec![[[0.0; 2]; 2]; 32]; NI];
            for nj in 0..NI / 2 {
                let regs = if kmajor {
                    // Emitted: k = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
                    //          n = wc * WN + nj * 16 + (lane / 16) * 8; smem [k][n], .trans
                    ldmatrix_x4(
                        |l| (kk0 * 16 + l % 8 + ((l / 8) % 2) * 8, nj * 16 + (l / 16) * 8),
                        b,
                        true,
                    )
                } else {
                    // Emitted: n = wc * WN + nj * 16 + (lane / 16) * 8 + (lane % 8);
                    //          k = kk * 16 + ((lane / 8) % 2) * 8; smem [n][k]
                    ldmatrix_x4(
                        |l| (nj * 16 + (l / 16) * 8 + l % 8, kk0 * 16 + ((l / 8) % 2) * 8),
                        |n, k| b(k, n),
                        false,
                    )
                };
                for t in 0..32 {
                    bfrag[2 * nj][t] = [regs[t][0], regs[t][1]];
                    bfrag[2 * nj + 1][t] = [regs[t][2], regs[t][3]];
                }
            }
            // mma.m16n8k16 per PTX: A a0 (g, 2c..), a1 (g+8, 2c..), a2 (g, 2c+8..),
            // a3 (g+8, 2c+8..); B b0 (k 2c.., n g), b1 (k 2c+8.., n g); C c0,c1 (g, 2c..),
            // c2,c3 (g+8, 2c..). Gather the warp's fragments back into matrices.
            for i in 0..MI {
                for j in 0..NI {
                    let mut am = [[0.0; 16]; 16];
                    let mut bm = [[0.0; 8]; 16];
                    for t in 0..32 {
                        let (g, c) = (t / 4, t % 4);
                        let f = afrag[i][t];
                        for e in 0..2 {
                            am[g][2 * c + e] = f[0][e];
                            am[g + 8][2 * c + e] = f[1][e];
                            am[g][2 * c + 8 + e] = f[2][e];
                            am[g + 8][2 * c + 8 + e] = f[3][e];
                            bm[2 * c + e][g] = bfrag[j][t][0][e];
                            bm[2 * c + 8 + e][g] = bfrag[j][t][1][e];
                        }
                    }
                    for t in 0..32 {
                        let (g, c) = (t / 4, t % 4);
                        for e in 0..4 {
                            let (r, col) = (g + (e / 2) * 8, 2 * c + e % 2);
                            acc[t][i * NI + j][e] +=
                                (0..16).map(|k| am[r][k] * bm[k][col]).sum::<f64>();
                        }
                    }
                }
            }
            // Emitted epilogue: row = wr * WM + i * 16 + lane / 4 + (e / 2) * 8;
            //                   col = wc * WN + j * 8 + (lane % 4) * 2 + (e % 2)
            let mut seen = vec![false; wm * wn];
            for (t, lane_acc) in acc.iter().enumerate() {
                for i in 0..MI {
                    for j in 0..NI {
                        for e in 0..4 {
                            let row = i * 16 + t / 4 + (e / 2) * 8;
                            let col = j * 8 + (t % 4) * 2 + e % 2;
                            let want: f64 = (0..16)
                                .map(|k| a(row, kk0 * 16 + k) * b(kk0 * 16 + k, col))
                                .sum();
                            assert_eq!(
                                lane_acc[i * NI + j][e],
                                want,
                                "kmajor {kmajor} ({row}, {col})"
                            );
                            seen[row * wn + col] = true;
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&s| s), "every output written once");
        }
        // The formulas above are the emitted ones.
        let src = |kmajor| {
            super::emit(&super::Instance {
                elem: super::Elem::F16,
                kind: super::Kind::Gemm { b_kmajor: kmajor },
                tile: super::TENSOR_OP_TILES[0],
                align: 8,
                epilogue: vec![],
            })
        };
        for needle in [
            "(wr * WM + i * 16 + (lane % 16)) * A_LD + kk * 16 + (lane / 16) * 8",
            "const int n = wc * WN + nj * 16 + (lane / 16) * 8 + (lane % 8);",
            "const int k = kk * 16 + ((lane / 8) % 2) * 8;",
            "const int row = m0 + wr * WM + i * 16 + lane / 4 + (e / 2) * 8;",
            "const int col = n0 + wc * WN + j * 8 + (lane % 4) * 2 + (e % 2);",
        ] {
            assert!(src(false).contains(needle), "{needle}");
        }
        for needle in [
            "const int k = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;",
            "const int n = wc * WN + nj * 16 + (lane / 16) * 8;",
            "ldmatrix_x4_trans(r, Bsm + k * B_LD + n);",
        ] {
            assert!(src(true).contains(needle), "{needle}");
        }
    }
}
