//! Runtime CPU-feature dispatch for the kernels' own loops.
//!
//! The crate is compiled for the baseline target (`x86-64`: SSE2), so the compiler vectorises
//! plain loops two `f64` or four `f32` lanes wide. [`dispatch`] runs an op (a
//! `pulp::WithSimd`) inside a function compiled with the widest instruction set the running
//! CPU has (through `pulp`: AVX-512, else AVX2 + FMA, on x86-64 where present), so the loops inlined into it
//! are vectorised for that set; elsewhere it just runs the op.
//!
//! Contract: the result is the same bit for bit whatever the instruction set. Rust never
//! fuses a multiply and an add into an FMA unless the code asks for one (`mul_add`), and
//! lane-wise `+ - * /`, conversions and selects round exactly as their scalar forms; so
//! only the speed depends on the CPU. Loops whose order of evaluation matters (a reduction)
//! stay in source order: the compiler does not reassociate floating-point sums.
//!
//! ```text
//! y = R.nn.relu(R.add(x, b))   # the CPU kernel's loop runs 16 f32 lanes wide on AVX-512
//! ```

use std::sync::LazyLock;

/// The instruction set detected once per process.
static ARCH: LazyLock<pulp::Arch> = LazyLock::new(pulp::Arch::new);

/// Runs `op` compiled for the widest instruction set of this CPU (see the module doc). The
/// loop must be reached through `#[inline(always)]` functions only (a closure's body is not
/// inlined, and would keep the baseline instruction set): `op`'s `with_simd` is
/// `#[inline(always)]` and calls an `#[inline(always)]` kernel body.
#[inline(always)]
pub(crate) fn dispatch<Op: pulp::WithSimd>(op: Op) -> Op::Output {
    ARCH.dispatch(op)
}

/// The `f32` lanes of the instruction set [`dispatch`] runs on this CPU (16 with AVX-512, 8
/// with AVX2), for kernels whose data layout depends on it.
pub(crate) fn f32_lanes() -> usize {
    struct Lanes;
    impl pulp::WithSimd for Lanes {
        type Output = usize;
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) -> usize {
            S::F32_LANES
        }
    }
    dispatch(Lanes)
}

/// Whether the running CPU has AVX-512 (`pulp`'s `V4` token, which the AVX-512-only kernels
/// take): [`dispatch`] then runs 16-lane vectors.
pub(crate) fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        pulp::x86::V4::try_new().is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the running CPU executes a 16-lane FMA at half rate: AMD's Zen 4 (family 19h)
/// splits each 512-bit FMA into two 256-bit halves, one a cycle, where Intel's AVX-512 server
/// cores and Zen 5's desktop and server parts issue two whole ones a cycle (Zen 5's mobile
/// parts, family 1Ah too, split them as Zen 4 does; unmeasured, they count as full rate). The choice between the crate's own AVX-512
/// kernels and `faer`'s GEMM was measured on Zen 4; a kernel whose loads kept up with its FMAs
/// there can fall behind `faer` where they come twice as fast (ResNet-50's 1024 → 256 layers
/// on 14×14 on the column kernel on a 5th-generation Xeon: 1.6× `faer`'s time, two threads;
/// bench/RESULTS.md, session ao). Read once per process from `cpuid`.
pub(crate) fn half_rate_fma512() -> bool {
    static HALF: LazyLock<bool> = LazyLock::new(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let v = std::arch::x86_64::__cpuid(0);
            let vendor: Vec<u8> = [v.ebx, v.edx, v.ecx]
                .iter()
                .flat_map(|r| r.to_le_bytes())
                .collect();
            let eax = std::arch::x86_64::__cpuid(1).eax;
            vendor == b"AuthenticAMD" && family(eax) == 0x19
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    });
    *HALF
}

/// The x86 family of `cpuid` leaf 1's `eax`: the base family (bits 8–11), plus the extended
/// family (bits 20–27) when the base is 0xF.
#[cfg_attr(not(any(test, target_arch = "x86_64")), allow(dead_code))]
fn family(eax: u32) -> u32 {
    let base = (eax >> 8) & 0xF;
    if base == 0xF {
        base + ((eax >> 20) & 0xFF)
    } else {
        base
    }
}

/// Lanes of [`striped_sum`].
const LANES: usize = 8;

/// `Σ f(x)` over `row`, as [`LANES`] interleaved partial sums (element `i` into sum
/// `i % LANES`, each in index order) added pairwise at the end: a fixed order, so the same
/// bits on every CPU and for every thread count, and a loop that vectorises when inlined into
/// a [`dispatch`]ed op. The accumulator type `A` is `f64` for LayerNorm's statistics, `f32`
/// for the softmax sums.
#[inline(always)]
pub(crate) fn striped_sum<T: Copy, A: Copy + Default + std::ops::Add<Output = A>>(
    row: &[T],
    f: impl Fn(T) -> A,
) -> A {
    let mut acc = [A::default(); LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = *a + f(x);
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a = *a + f(x);
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

#[cfg(test)]
mod tests {
    use super::family;

    #[test]
    fn family_adds_the_extended_family_only_to_0xf() {
        // AMD EPYC 9004 (Zen 4, Genoa): family 19h; Zen 5: 1Ah; a 5th-generation Xeon
        // (Emerald Rapids, `cpuid` 1 eax 0xC06F2): 6, whatever its extended bits.
        assert_eq!(family(0x00A1_0F11), 0x19);
        assert_eq!(family(0x00B0_0F21), 0x1A);
        assert_eq!(family(0x000C_06F2), 6);
        assert_eq!(family(0x0FF0_06F2), 6);
    }
}
