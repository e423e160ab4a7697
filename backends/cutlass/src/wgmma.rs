//! The Hopper (sm_90a) GEMM path: TMA + mbarrier pipeline feeding `wgmma.mma_async`, with
//! CUTLASS 3.x's warp-specialized structure (`KernelTmaWarpSpecializedCooperative`-like):
//!
//! - warpgroup 0 is the *producer*: after `setmaxnreg.dec` one thread waits on the stage's
//!   `empty` mbarrier, arms its `full` mbarrier with `mbarrier.arrive.expect_tx` (the stage's
//!   bytes), and issues `cp.async.bulk.tensor.3d` copies (A: one 64 × BM box; B: one 64 × BN box
//!   when B is N×K, or BN / 64 boxes of 64 × BK when B is K×N) into a `stages`-deep ring of
//!   128-byte-swizzled shared memory; TMA zero-fills what lies outside M, N, K, so no shape needs
//!   to be a multiple of the tile;
//! - warpgroups 1 and 2 are *consumers* (`setmaxnreg.inc`): each owns 64 rows of the BM = 128
//!   tile, waits on `full` with `mbarrier.try_wait.parity`, issues BK / 16
//!   `wgmma.mma_async.sync.aligned.m64nBNk16.f32.{f16,bf16}` from shared-memory matrix
//!   descriptors (`wgmma.fence` / `commit_group` / `wait_group 0`), then arrives on `empty`;
//! - the epilogue ([`crate::generator`]'s, shared with the mma.sync path) runs on the
//!   accumulator fragments with [`acc_row`] / [`acc_col`], guarded by `row < M && col < N`.
//!
//! The layout formulas are Rust values that the emitter prints and the tests evaluate:
//! [`acc_row`] / [`acc_col`] are [`Ex`] expressions; [`operand`] gives each operand's TMA box
//! and descriptor strides; [`tma_offset`] (where TMA's SWIZZLE_128B puts an element) and
//! [`wgmma_offset`] (where wgmma's canonical layout reads it) must agree on every element.
//!
//! Contract: [`emit`] is deterministic and needs `sm_90a` (NVRTC to CUBIN; `sm_90` rejects
//! `wgmma`); the kernel's parameters are `tmA, tmB` (`const __grid_constant__` 128-byte TMA
//! descriptors, [`tma_specs`]), `D`, the epilogue operands, then `M, N, K, zA, zB, sD`
//! (`zA`/`zB` are 1 when that operand is batched, else 0).
//!
//! ```text
//! Instance { f16, gemm (B N×K), 128x256x64 wgmma, 4 stages, align 8, epilogue [bias, relu] }
//!   -> extern "C" __global__ void __launch_bounds__(384, 1)
//!      cutlass_f16_gemm_tn_128x256x64_wgmma_s4_a8_bias_relu(
//!          const __grid_constant__ TmaDesc tmA, const __grid_constant__ TmaDesc tmB,
//!          __half* D, const __half* E0, int M, int N, int K, int zA, int zB, long long sD)
//!      grid (ceil(N / 256), ceil(M / 128), batch), 384 threads, 197696 B shared memory
//! ```

use crate::generator::{Elem, Instance, Kind, Math, epilogue, prelude};
use crate::select::GemmShape;
use fusebox_cuda::{TiledSpec, TmaDtype, TmaSwizzle};
use std::fmt::Write as _;

/// The bytes of one swizzled row (the 128-byte swizzle span).
pub const ROW_BYTES: u32 = 128;
/// The bytes of one swizzle atom (8 rows of 128 bytes); every operand tile starts on one.
pub const ATOM_BYTES: u32 = 1024;
/// The K extent of one `wgmma` instruction.
pub const INSTR_K: u32 = 16;
/// Rows of the output one consumer warpgroup owns.
pub const WG_M: u32 = 64;
/// `setmaxnreg` values: producer (down) and consumers (up); 128·40 + 256·232 ≤ 65536.
pub const PRODUCER_REGS: u32 = 40;
/// See [`PRODUCER_REGS`].
pub const CONSUMER_REGS: u32 = 232;

/// A small integer expression over named variables: evaluated by the tests, printed as C by
/// the emitter, so what is tested is what is emitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ex {
    /// A variable of the emitted code (`lane`, `warp`, `i`).
    Var(&'static str),
    /// A literal.
    Lit(i64),
    /// `a + b`.
    Add(Box<Ex>, Box<Ex>),
    /// `a * b`.
    Mul(Box<Ex>, Box<Ex>),
    /// `a / b` (non-negative operands).
    Div(Box<Ex>, Box<Ex>),
    /// `a % b` (non-negative operands).
    Rem(Box<Ex>, Box<Ex>),
}

impl Ex {
    /// Its value, with `var` giving each variable's.
    pub fn eval(&self, var: &dyn Fn(&str) -> i64) -> i64 {
        match self {
            Ex::Var(v) => var(v),
            Ex::Lit(x) => *x,
            Ex::Add(a, b) => a.eval(var) + b.eval(var),
            Ex::Mul(a, b) => a.eval(var) * b.eval(var),
            Ex::Div(a, b) => a.eval(var) / b.eval(var),
            Ex::Rem(a, b) => a.eval(var) % b.eval(var),
        }
    }

    /// The C expression (fully parenthesized where C's precedence would differ).
    pub fn c(&self) -> String {
        fn prec(e: &Ex) -> u8 {
            match e {
                Ex::Var(_) | Ex::Lit(_) => 3,
                Ex::Mul(..) | Ex::Div(..) | Ex::Rem(..) => 2,
                Ex::Add(..) => 1,
            }
        }
        let wrap = |e: &Ex, min: u8| {
            if prec(e) >= min {
                e.c()
            } else {
                format!("({})", e.c())
            }
        };
        match self {
            Ex::Var(v) => (*v).to_string(),
            Ex::Lit(x) => x.to_string(),
            Ex::Add(a, b) => format!("{} + {}", a.c(), wrap(b, 2)),
            // Left-associative: the right operand of * / % needs parentheses unless atomic.
            Ex::Mul(a, b) => format!("{} * {}", wrap(a, 2), wrap(b, 3)),
            Ex::Div(a, b) => format!("{} / {}", wrap(a, 2), wrap(b, 3)),
            Ex::Rem(a, b) => format!("{} % {}", wrap(a, 2), wrap(b, 3)),
        }
    }
}

fn var(v: &'static str) -> Ex {
    Ex::Var(v)
}
macro_rules! ex_op {
    ($tr:ident, $f:ident, $v:ident) => {
        impl std::ops::$tr<Ex> for Ex {
            type Output = Ex;
            fn $f(self, b: Ex) -> Ex {
                Ex::$v(Box::new(self), Box::new(b))
            }
        }
        impl std::ops::$tr<i64> for Ex {
            type Output = Ex;
            fn $f(self, b: i64) -> Ex {
                Ex::$v(Box::new(self), Box::new(Ex::Lit(b)))
            }
        }
        impl std::ops::$tr<Ex> for i64 {
            type Output = Ex;
            fn $f(self, b: Ex) -> Ex {
                Ex::$v(Box::new(Ex::Lit(self)), Box::new(b))
            }
        }
    };
}
ex_op!(Add, add, Add);
ex_op!(Mul, mul, Mul);
ex_op!(Div, div, Div);
ex_op!(Rem, rem, Rem);

/// The row (within the warpgroup's 64 × N tile) of accumulator register `i` of lane `lane` of
/// warp `warp` (of the warpgroup), per the PTX ISA's m64nNk16 f32 accumulator layout.
pub fn acc_row() -> Ex {
    16 * var("warp") + var("lane") / 4 + 8 * ((var("i") / 2) % 2)
}

/// The column of accumulator register `i` of lane `lane` (see [`acc_row`]).
pub fn acc_col() -> Ex {
    8 * (var("i") / 4) + 2 * (var("lane") % 4) + var("i") % 2
}

/// TMA's SWIZZLE_128B on a byte offset from a 1024-byte aligned base: the 16-byte chunk index
/// (bits 4–6) XOR the 128-byte row index mod 8 (bits 7–9). wgmma's 128-byte swizzle mode
/// applies the same function to the addresses it reads.
pub fn swizzle128(off: u32) -> u32 {
    off ^ (((off >> 7) & 7) << 4)
}

/// How one operand tile (A: BM × BK; B: BN × BK) lies in shared memory, and the matching TMA
/// boxes and wgmma descriptor fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    /// MN-major (B stored K×N: wgmma's "transposed" B, `imm-trans-b = 1`), else K-major.
    pub mn_major: bool,
    /// The M or N extent of the tile.
    pub mn: u32,
    /// The K extent of the tile.
    pub bk: u32,
    /// Bytes per element.
    pub eb: u32,
    /// The TMA box, innermost first (elements).
    pub box_inner: u32,
    /// See `box_inner`.
    pub box_outer: u32,
    /// Boxes per stage (MN-major B: one per 64 columns).
    pub boxes: u32,
    /// The descriptor's leading-dimension byte offset.
    pub lbo: u32,
    /// The descriptor's stride-dimension byte offset.
    pub sbo: u32,
    /// Bytes the descriptor's start address advances per `wgmma` (K step of 16).
    pub k_step: u32,
}

impl Operand {
    /// Bytes of one box.
    pub fn box_bytes(&self) -> u32 {
        self.box_inner * self.box_outer * self.eb
    }
    /// Bytes of the tile (one stage of this operand).
    pub fn stage_bytes(&self) -> u32 {
        self.mn * self.bk * self.eb
    }
}

/// The shared-memory layout of an operand tile of `mn × bk` elements of `eb` bytes. K-major:
/// one 128-byte row per M/N index (`bk · eb = 128`), TMA box `bk × mn`; the descriptor's SBO
/// is one 8-row atom (1024 B), LBO unused (16 B), and each k16 step moves 32 bytes along the
/// row. MN-major: per 64 columns, one box of `bk` rows of 128 bytes (64 elements); LBO is the
/// distance between those boxes, SBO one 8-row atom, and a k16 step is 16 rows (2048 B).
pub fn operand(eb: u32, mn_major: bool, mn: u32, bk: u32) -> Operand {
    let per_row = ROW_BYTES / eb;
    if mn_major {
        Operand {
            mn_major,
            mn,
            bk,
            eb,
            box_inner: per_row,
            box_outer: bk,
            boxes: mn / per_row,
            lbo: bk * ROW_BYTES,
            sbo: ATOM_BYTES,
            k_step: INSTR_K * ROW_BYTES,
        }
    } else {
        Operand {
            mn_major,
            mn,
            bk,
            eb,
            box_inner: bk,
            box_outer: mn,
            boxes: 1,
            lbo: 16,
            sbo: ATOM_BYTES,
            k_step: INSTR_K * eb,
        }
    }
}

/// The byte offset (from the tile's 1024-byte aligned start) where TMA stores element
/// (`mn`, `k`) of the tile.
pub fn tma_offset(op: &Operand, mn: u32, k: u32) -> u32 {
    if op.mn_major {
        let per_row = ROW_BYTES / op.eb;
        swizzle128((mn / per_row) * op.box_bytes() + k * ROW_BYTES + (mn % per_row) * op.eb)
    } else {
        swizzle128(mn * ROW_BYTES + k * op.eb)
    }
}

/// The byte offset wgmma reads element (`mn`, `k`) of one m64nNk16 operand from, for a
/// descriptor whose start is `start` bytes into the tile: PTX's canonical 128-byte-swizzle
/// layouts, K-major `((8,m),(T,2k)):((8T,SBO),(1,T))` and MN-major
/// `((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))` (T = 16 bytes of elements), then the swizzle.
pub fn wgmma_offset(op: &Operand, start: u32, mn: u32, k: u32) -> u32 {
    let eb = op.eb;
    let per_row = ROW_BYTES / eb;
    let canon = if op.mn_major {
        (mn % per_row) * eb + (mn / per_row) * op.lbo + (k % 8) * ROW_BYTES + (k / 8) * op.sbo
    } else {
        (mn % 8) * ROW_BYTES + (mn / 8) * op.sbo + k * eb
    };
    swizzle128(start + canon)
}

/// The A and B operands of a wgmma instance.
pub fn operands(inst: &Instance) -> (Operand, Operand) {
    let [bm, bn, bk] = inst.tile.tb;
    let eb = inst.elem.bytes();
    (
        operand(eb, false, bm, bk),
        operand(eb, inst.b_kmajor(), bn, bk),
    )
}

/// Dynamic shared memory: the stages of A and B, 2 mbarriers per stage, and 1024 bytes to align
/// the ring to a swizzle atom.
pub fn smem_bytes(inst: &Instance) -> u32 {
    let (a, b) = operands(inst);
    inst.tile.stages * (a.stage_bytes() + b.stage_bytes() + 16) + ATOM_BYTES
}

/// Why `inst` is not a wgmma instance the generator emits (`None`: it is one).
pub fn unsupported(inst: &Instance) -> Option<String> {
    let [bm, bn, bk] = inst.tile.tb;
    if !matches!(inst.kind, Kind::Gemm { .. }) {
        return Some("the wgmma path is GEMM only".into());
    }
    if !matches!(inst.elem, Elem::F16 | Elem::Bf16) {
        return Some(format!(
            "wgmma takes float16 or bfloat16, not {}",
            inst.elem.tag()
        ));
    }
    if inst.align * inst.elem.bytes() != 16 {
        return Some(format!(
            "TMA needs 16-byte row strides; the problem's alignment is {} element(s)",
            inst.align
        ));
    }
    let per_row = ROW_BYTES / inst.elem.bytes();
    if bm != 2 * WG_M || bk != per_row || bn % per_row != 0 || !(64..=256).contains(&bn) {
        return Some(format!("no wgmma tile {bm}x{bn}x{bk}"));
    }
    None
}

/// The TMA descriptors of a problem (A then B): 3-D (the batch outermost; an unbatched
/// operand has one batch, read by every block), boxes as [`operand`] lays them out.
pub fn tma_specs(inst: &Instance, g: &GemmShape) -> (TiledSpec, TiledSpec) {
    let (a, b) = operands(inst);
    let dtype = match inst.elem {
        Elem::Bf16 => TmaDtype::Bf16,
        _ => TmaDtype::F16,
    };
    let eb = u64::from(inst.elem.bytes());
    let (m, n, k) = (g.m as u64, g.n as u64, g.k as u64);
    let nb = |batched: bool| if batched { g.batch.max(1) as u64 } else { 1 };
    let spec_a = TiledSpec {
        dtype,
        dims: vec![k, m, nb(g.a_batched)],
        strides: vec![k * eb, m * k * eb],
        boxdim: vec![a.box_inner, a.box_outer, 1],
        swizzle: TmaSwizzle::B128,
    };
    // B's contiguous extent first: N when it is stored K×N (MN-major), else K.
    let (inner, outer) = if b.mn_major { (n, k) } else { (k, n) };
    let spec_b = TiledSpec {
        dtype,
        dims: vec![inner, outer, nb(g.b_batched)],
        strides: vec![inner * eb, outer * inner * eb],
        boxdim: vec![b.box_inner, b.box_outer, 1],
        swizzle: TmaSwizzle::B128,
    };
    (spec_a, spec_b)
}

const HELPERS: &str = r#"
// A CUtensorMap (the driver's TMA descriptor), passed by value.
struct __align__(128) TmaDesc { unsigned long long v[16]; };
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned parity) {
  unsigned ok;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  return ok != 0;
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {}
}
__device__ __forceinline__ void tma_load_3d(void* dst, const TmaDesc* map, unsigned bar, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
               :: "r"(smem_u32(dst)), "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
__device__ __forceinline__ void tma_prefetch(const TmaDesc* map) {
  asm volatile("prefetch.tensormap [%0];\n" :: "l"(map) : "memory");
}
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4)
       | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16)
       | ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32)
       | (1ull << 62);  // 128-byte swizzle
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
"#;

/// The `wgmma.mma_async` wrapper for an m64n`n`k16 instruction (`trans_b`: B is MN-major).
fn wgmma_helper(elem: Elem, n: u32, trans_b: bool) -> String {
    let t = elem.tag();
    let regs = n / 2;
    let dlist: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
    let outs: Vec<String> = (0..regs).map(|i| format!("\"+f\"(d[{i}])")).collect();
    let (da, db, sc) = (regs, regs + 1, regs + 2);
    let tb = u32::from(trans_b);
    format!(
        "__device__ __forceinline__ void wgmma_m64n{n}k16(float* d, unsigned long long da, unsigned long long db) {{\n\
         \x20 asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{sc}, 0;\\n\"\n\
         \x20              \"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {{{}}}, %{da}, %{db}, p, 1, 1, 0, {tb};\\n}}\\n\"\n\
         \x20              : {}\n\
         \x20              : \"l\"(da), \"l\"(db), \"r\"(1));\n}}\n\
         // Keeps the compiler from moving accumulator reads and writes across the asynchronous MMA.\n\
         __device__ __forceinline__ void fence_acc(float* d) {{\n\
         #pragma unroll\n  for (int i = 0; i < {regs}; ++i) asm volatile(\"\" : \"+f\"(d[i]) :: \"memory\");\n}}\n",
        dlist.join(", "),
        outs.join(", "),
    )
}

/// The CUDA C++ of a wgmma instance (see the module doc).
pub fn emit(inst: &Instance) -> String {
    let name = inst.kernel_name();
    let elem = inst.elem;
    let [bm, bn, bk] = inst.tile.tb;
    let stages = inst.tile.stages;
    let threads = inst.tile.threads();
    let consumers = bm / WG_M;
    let (a, b) = operands(inst);
    let mut s = prelude(&name, elem);
    if let Some(why) = unsupported(inst) {
        // Not reachable through the instance table; a readable compile error otherwise.
        let _ = writeln!(s, "#error \"{name}: {why}\"");
        return s;
    }
    debug_assert_eq!(inst.tile.math, Math::Wgmma);
    s.push_str(HELPERS);
    s.push_str(&wgmma_helper(elem, bn, b.mn_major));
    let _ = writeln!(
        s,
        "constexpr int BM = {bm}, BN = {bn}, BK = {bk}, STAGES = {stages}, THREADS = {threads}, CONSUMERS = {consumers};\n\
         constexpr unsigned A_STAGE = {}, B_STAGE = {}, STAGE_TX = {};\n\
         constexpr unsigned A_LBO = {}, A_SBO = {}, A_KSTEP = {}, A_WG = {};\n\
         constexpr unsigned B_LBO = {}, B_SBO = {}, B_KSTEP = {}, B_BOX = {};",
        a.stage_bytes(),
        b.stage_bytes(),
        a.boxes * a.box_bytes() + b.boxes * b.box_bytes(),
        a.lbo,
        a.sbo,
        a.k_step,
        WG_M * ROW_BYTES,
        b.lbo,
        b.sbo,
        b.k_step,
        b.box_bytes(),
    );
    let extra: Vec<String> = (0..inst.num_extra())
        .map(|i| format!("const T* __restrict__ E{i}, "))
        .collect();
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void __launch_bounds__({threads}, 1) {name}(\n\
         \x20   const __grid_constant__ TmaDesc tmA, const __grid_constant__ TmaDesc tmB,\n\
         \x20   T* __restrict__ D, {}int M, int N, int K, int zA, int zB, long long sD) {{",
        extra.concat()
    );
    s.push_str(
        "  extern __shared__ __align__(1024) unsigned char smem_raw[];\n\
         \x20 // The swizzle pattern repeats every 1024 bytes of shared-memory address: align the ring.\n\
         \x20 unsigned char* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);\n\
         \x20 unsigned char* As = smem;\n\
         \x20 unsigned char* Bs = smem + STAGES * A_STAGE;\n\
         \x20 unsigned long long* full = reinterpret_cast<unsigned long long*>(Bs + STAGES * B_STAGE);\n\
         \x20 unsigned long long* empty = full + STAGES;\n\
         \x20 const int tid = threadIdx.x, wg = tid / 128;\n\
         \x20 const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN, z = blockIdx.z;\n\
         \x20 const int ktiles = (K + BK - 1) / BK;\n\
         \x20 if (tid == 0) {\n\
         \x20   #pragma unroll 1\n    for (int st = 0; st < STAGES; ++st) {\n\
         \x20     mbar_init(smem_u32(&full[st]), 1);\n\
         \x20     mbar_init(smem_u32(&empty[st]), CONSUMERS * 128);\n    }\n\
         \x20   // The barriers are written by the generic proxy and updated by TMA (the async\n\
         \x20   // proxy, complete_tx): make the initialised barriers visible to it.\n\
         \x20   asm volatile(\"fence.proxy.async.shared::cta;\\n\" ::: \"memory\");\n\
         \x20   asm volatile(\"fence.mbarrier_init.release.cluster;\\n\" ::: \"memory\");\n  }\n\
         \x20 __syncthreads();\n",
    );
    // The producer.
    let bload = if b.mn_major {
        "        #pragma unroll\n        for (int c = 0; c < BN / 64; ++c)\n\
         \x20         tma_load_3d(Bs + st * B_STAGE + c * B_BOX, &tmB, fb, n0 + c * 64, kt * BK, z * zB);\n"
    } else {
        "        tma_load_3d(Bs + st * B_STAGE, &tmB, fb, kt * BK, n0, z * zB);\n"
    };
    let _ = write!(
        s,
        "  if (wg == 0) {{\n\
         \x20   asm volatile(\"setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGS};\\n\");\n\
         \x20   if (tid == 0) {{\n\
         \x20     tma_prefetch(&tmA);\n      tma_prefetch(&tmB);\n\
         \x20     #pragma unroll 1\n      for (int kt = 0; kt < ktiles; ++kt) {{\n\
         \x20       const int st = kt % STAGES;\n\
         \x20       const unsigned phase = (unsigned)(kt / STAGES) & 1u;\n\
         \x20       mbar_wait(smem_u32(&empty[st]), phase ^ 1u);\n\
         \x20       const unsigned fb = smem_u32(&full[st]);\n\
         \x20       mbar_expect_tx(fb, STAGE_TX);\n\
         \x20       tma_load_3d(As + st * A_STAGE, &tmA, fb, kt * BK, m0, z * zA);\n\
         {bload}\
         \x20     }}\n    }}\n    return;\n  }}\n"
    );
    // The consumers.
    let regs = bn / 2;
    let _ = write!(
        s,
        "  asm volatile(\"setmaxnreg.inc.sync.aligned.u32 {CONSUMER_REGS};\\n\");\n\
         \x20 const int cw = wg - 1;\n\
         \x20 float acc[{regs}];\n\
         \x20 #pragma unroll\n  for (int i = 0; i < {regs}; ++i) acc[i] = 0.f;\n\
         \x20 #pragma unroll 1\n  for (int kt = 0; kt < ktiles; ++kt) {{\n\
         \x20   const int st = kt % STAGES;\n\
         \x20   mbar_wait(smem_u32(&full[st]), (unsigned)(kt / STAGES) & 1u);\n\
         \x20   const unsigned a0 = smem_u32(As + st * A_STAGE) + cw * A_WG;\n\
         \x20   const unsigned b0 = smem_u32(Bs + st * B_STAGE);\n\
         \x20   fence_acc(acc);\n    wgmma_fence();\n\
         \x20   #pragma unroll\n    for (int kk = 0; kk < BK / {INSTR_K}; ++kk)\n\
         \x20     wgmma_m64n{bn}k16(acc, smem_desc(a0 + kk * A_KSTEP, A_LBO, A_SBO), smem_desc(b0 + kk * B_KSTEP, B_LBO, B_SBO));\n\
         \x20   wgmma_commit();\n    wgmma_wait0();\n    fence_acc(acc);\n\
         \x20   mbar_arrive(smem_u32(&empty[st]));\n  }}\n"
    );
    // The epilogue on the accumulator fragments.
    let (full_offsets, store) = epilogue(inst);
    s.push_str("  D += (long long)z * sD;\n");
    s.push_str(&full_offsets);
    let _ = write!(
        s,
        "  const int warp = (tid % 128) / 32, lane = tid % 32;\n\
         \x20 const int r0 = m0 + cw * {WG_M};\n\
         \x20 #pragma unroll\n  for (int i = 0; i < {regs}; ++i) {{\n\
         \x20   const int row = r0 + {};\n\
         \x20   const int col = n0 + {};\n\
         \x20   const float val = acc[i];\n{store}  }}\n}}\n",
        acc_row().c(),
        acc_col().c(),
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::{WGMMA_TILES, wgmma_instances};

    #[test]
    fn expressions_print_as_c_and_evaluate() {
        assert_eq!(
            acc_row().c(),
            "16 * warp + lane / 4 + 8 * (i / 2 % 2)",
            "C's left-to-right * / % make this (i / 2) % 2"
        );
        assert_eq!(acc_col().c(), "8 * (i / 4) + 2 * (lane % 4) + i % 2");
        let env = |v: &str| match v {
            "warp" => 3,
            "lane" => 29,
            _ => 6,
        };
        assert_eq!(acc_row().eval(&env), 48 + 7 + 8);
        assert_eq!(acc_col().eval(&env), 10);
    }

    /// Every (warp, lane, register) of an m64nNk16 warpgroup maps to a distinct element of the
    /// 64 × N tile, and every element is covered: the PTX ISA's fragment formula, as emitted.
    #[test]
    fn accumulator_fragments_cover_the_tile_once() {
        for n in [64u32, 128, 256] {
            let mut seen = vec![0u32; (64 * n) as usize];
            for warp in 0..4i64 {
                for lane in 0..32i64 {
                    for i in 0..i64::from(n / 2) {
                        let env = |v: &str| match v {
                            "warp" => warp,
                            "lane" => lane,
                            _ => i,
                        };
                        let (r, c) = (acc_row().eval(&env), acc_col().eval(&env));
                        // The ISA's statement of the layout, written independently.
                        assert_eq!(r, 16 * warp + lane / 4 + 8 * ((i / 2) % 2));
                        assert_eq!(c, 8 * (i / 4) + 2 * (lane % 4) + (i % 2));
                        assert!((0..64).contains(&r) && (0..i64::from(n)).contains(&c));
                        seen[(r * i64::from(n) + c) as usize] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&k| k == 1), "n = {n}");
        }
    }

    #[test]
    fn swizzle_is_a_bijection_and_tma_s_pattern() {
        for tile in [8192u32, 16384, 32768] {
            let mut seen = vec![false; tile as usize / 16];
            for off in (0..tile).step_by(16) {
                let s = swizzle128(off);
                // Chunk index XOR (row % 8), within the same 128-byte row.
                let (row, chunk) = (off / 128, (off / 16) % 8);
                assert_eq!(s, row * 128 + ((chunk ^ (row % 8)) * 16));
                assert!(s < tile);
                assert!(!seen[(s / 16) as usize]);
                seen[(s / 16) as usize] = true;
                // Bytes within a chunk stay in order.
                for b in 0..16 {
                    assert_eq!(swizzle128(off + b), s + b);
                }
            }
        }
    }

    /// Where TMA writes each element of a stage equals where wgmma's descriptors (start, LBO,
    /// SBO, k step, warpgroup offset: the emitted constants) read it, for both majornesses.
    #[test]
    fn descriptors_read_what_tma_wrote() {
        for inst in wgmma_instances() {
            let [_, bn, bk] = inst.tile.tb;
            let (a, b) = operands(&inst);
            // A: consumer warpgroup cw reads rows 64 cw .. 64 cw + 63.
            for cw in 0..2 {
                for kk in 0..bk / INSTR_K {
                    let start = cw * WG_M * ROW_BYTES + kk * a.k_step;
                    for m in 0..WG_M {
                        for k in 0..INSTR_K {
                            assert_eq!(
                                wgmma_offset(&a, start, m, k),
                                tma_offset(&a, cw * WG_M + m, kk * INSTR_K + k),
                                "{} A cw {cw} kk {kk} ({m}, {k})",
                                inst.kernel_name()
                            );
                        }
                    }
                }
            }
            // B: the whole BN for every warpgroup.
            let mut seen = std::collections::HashSet::new();
            for kk in 0..bk / INSTR_K {
                for nn in 0..bn {
                    for k in 0..INSTR_K {
                        let got = wgmma_offset(&b, kk * b.k_step, nn, k);
                        assert_eq!(
                            got,
                            tma_offset(&b, nn, kk * INSTR_K + k),
                            "{} B kk {kk} ({nn}, {k})",
                            inst.kernel_name()
                        );
                        assert!(got < b.stage_bytes());
                        assert!(seen.insert(got));
                    }
                }
            }
            // The emitted constants are these.
            let src = emit(&inst);
            for needle in [
                format!(
                    "A_LBO = {}, A_SBO = {}, A_KSTEP = {}, A_WG = {}",
                    a.lbo,
                    a.sbo,
                    a.k_step,
                    WG_M * ROW_BYTES
                ),
                format!(
                    "B_LBO = {}, B_SBO = {}, B_KSTEP = {}, B_BOX = {}",
                    b.lbo,
                    b.sbo,
                    b.k_step,
                    b.box_bytes()
                ),
                format!("const int row = r0 + {};", acc_row().c()),
                format!("const int col = n0 + {};", acc_col().c()),
                format!(
                    "0, {};",
                    u32::from(b.mn_major) // imm-trans-b
                ),
            ] {
                assert!(src.contains(&needle), "{}: {needle}", inst.kernel_name());
            }
        }
    }

    /// The descriptor fields pinned to the PTX ISA / CUTLASS statement of the 128-byte swizzle
    /// canonical layouts, independently of [`wgmma_offset`] (which the previous test checks
    /// against TMA, and which would not notice LBO and SBO swapped in both places): K-major
    /// `((8,m),(T,2)):((8T,SBO),(1,T))`, LBO unused (encoded 1); MN-major
    /// `((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))`, LBO the step between 64-element MN blocks and
    /// SBO the step between 8-row K groups. Bit fields: start 0-13, LBO 16-29, SBO 32-45,
    /// swizzle 62-63 (128B = 1), each offset `(x & 0x3FFFF) >> 4`.
    #[test]
    fn descriptor_fields_follow_the_canonical_layouts() {
        let eb = 2; // f16 / bf16
        let k = operand(eb, false, 128, 64);
        assert_eq!((k.lbo, k.sbo, k.k_step), (16, 8 * 128, 16 * eb));
        for bn in [64u32, 128, 256] {
            let mn = operand(eb, true, bn, 64);
            // The next 64 columns start one TMA box (64 K-rows of 128 bytes) later.
            assert_eq!(mn.lbo, 64 * 128);
            assert_eq!(mn.lbo, mn.box_bytes());
            assert_eq!((mn.sbo, mn.k_step), (8 * 128, 16 * 128));
        }
        for needle in [
            "(unsigned long long)((addr & 0x3FFFF) >> 4)",
            "((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16)",
            "((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32)",
            "(1ull << 62)",
        ] {
            assert!(HELPERS.contains(needle), "{needle}");
        }
    }

    /// The synchronisation the PTX ISA asks for, in the emitted order: barriers initialised by
    /// one thread, made visible to the async proxy (TMA's complete_tx) and fenced, then a block
    /// barrier before any thread uses them; `setmaxnreg` by whole warpgroups (before the
    /// producer's `tid == 0` branch); `wgmma.fence` before the MMAs of a stage, and
    /// `wgmma.wait_group 0` before the stage is released to the producer and before the
    /// accumulators are read by the epilogue.
    #[test]
    fn pipeline_synchronisation_is_in_order() {
        for inst in wgmma_instances() {
            let src = emit(&inst);
            let name = inst.kernel_name();
            let body = &src[src.find("extern \"C\"").unwrap_or(0)..];
            let mut at = 0;
            for needle in [
                "mbar_init(smem_u32(&full[st]), 1);" as &str,
                "mbar_init(smem_u32(&empty[st]), CONSUMERS * 128);",
                "fence.proxy.async.shared::cta;",
                "fence.mbarrier_init.release.cluster;",
                "__syncthreads();",
                "if (wg == 0) {",
                &format!("setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGS};"),
                "if (tid == 0) {",
                "mbar_wait(smem_u32(&empty[st]), phase ^ 1u);",
                "mbar_expect_tx(fb, STAGE_TX);",
                "tma_load_3d(As",
                "return;",
                &format!("setmaxnreg.inc.sync.aligned.u32 {CONSUMER_REGS};"),
                "mbar_wait(smem_u32(&full[st]), (unsigned)(kt / STAGES) & 1u);",
                "wgmma_fence();",
                "wgmma_m64n",
                "wgmma_commit();",
                "wgmma_wait0();",
                "mbar_arrive(smem_u32(&empty[st]));",
                "const float val = acc[i];",
            ] {
                let pos = body[at..].find(needle).map(|p| p + at);
                assert!(pos.is_some(), "{name}: `{needle}` missing or out of order");
                at = pos.unwrap_or(at) + needle.len();
            }
            // Only the initialising thread touches the barriers before the block barrier.
            assert_eq!(body.matches("mbar_init(").count(), 2, "{name}");
            assert_eq!(body.matches("__syncthreads();").count(), 1, "{name}");
        }
        // setmaxnreg's operand rules (PTX ISA: 24 to 256, a multiple of 8) and the direction of
        // each change from the 168 registers __launch_bounds__(384, 1) leaves a thread.
        for r in [PRODUCER_REGS, CONSUMER_REGS] {
            assert!((24..=256).contains(&r) && r % 8 == 0, "{r}");
        }
        let launch = (65536 / 384) / 8 * 8;
        assert_eq!(launch, 168);
        assert!((PRODUCER_REGS..=CONSUMER_REGS).contains(&launch));
        assert!(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= 384 * launch);
    }

    #[test]
    fn tma_boxes_fill_exactly_the_stage() {
        for inst in wgmma_instances() {
            assert_eq!(unsupported(&inst), None);
            let (a, b) = operands(&inst);
            let g = GemmShape {
                m: 1000,
                n: 3000,
                k: 72,
                batch: 3,
                a_batched: true,
                b_batched: false,
            };
            let (sa, sb) = tma_specs(&inst, &g);
            assert!(sa.check(0).is_ok() && sb.check(0).is_ok());
            assert_eq!(sa.box_bytes(), u64::from(a.stage_bytes()));
            assert_eq!(
                sb.box_bytes() * u64::from(b.boxes),
                u64::from(b.stage_bytes())
            );
            assert_eq!(sa.dims[2], 3);
            assert_eq!(sb.dims[2], 1);
            let tx = format!(
                "STAGE_TX = {};",
                sa.box_bytes() + sb.box_bytes() * u64::from(b.boxes)
            );
            assert!(emit(&inst).contains(&tx), "{}", inst.kernel_name());
            // Every stage (A + B + barriers) fits the 227 KiB an H100 block may use.
            assert!(inst.smem_bytes() <= 232_448, "{}", inst.smem_bytes());
        }
        for t in WGMMA_TILES {
            assert_eq!(t.threads(), 384);
        }
        let mut i = wgmma_instances()[0].clone();
        i.align = 4;
        assert!(unsupported(&i).is_some_and(|r| r.contains("16-byte")));
        i.align = 8;
        i.kind = Kind::Conv2d;
        assert!(unsupported(&i).is_some());
    }
}
