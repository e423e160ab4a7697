//! NVRTC without a GPU: real kernels compiled to CUBIN for sm_80, sm_90 and sm_90a, the ptxas
//! report, compile errors with NVRTC's log, batches in parallel, and the on-disk cache.
//!
//! Each test skips with a printed reason when NVRTC is missing, and fails instead when
//! `FUSEBOX_REQUIRE_NVRTC=1` (scripts/test.sh installs the wheels and sets it).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

mod common;

use common::{HALF, SAXPY};
use fusebox_cuda::nvrtc::{Arch, CompileJob, CompileOptions, compile, compile_many};
use fusebox_cuda::testing::{nvrtc_or_skip, temp_dir};
use fusebox_cuda::{Cache, Error, compile_cached};

fn verbose() -> CompileOptions {
    CompileOptions {
        ptxas_verbose: true,
        ..CompileOptions::default()
    }
}

fn is_elf(b: &[u8]) -> bool {
    b.starts_with(b"\x7fELF")
}

#[test]
fn nvrtc_is_version_13() {
    if !nvrtc_or_skip("nvrtc_is_version_13") {
        return;
    }
    let nv = fusebox_cuda::nvrtc::nvrtc().unwrap();
    assert_eq!(nv.version().0, 13, "{nv:?}");
    assert!(
        nv.include_dir()
            .is_some_and(|d| d.join("cuda_bf16.h").is_file()),
        "no CUDA headers found: {nv:?}"
    );
    eprintln!("NVRTC {:?}", nv);
}

#[test]
fn an_f32_kernel_compiles_to_cubin_for_every_arch() {
    if !nvrtc_or_skip("an_f32_kernel_compiles_to_cubin_for_every_arch") {
        return;
    }
    for arch in Arch::ALL {
        let k = compile(SAXPY, "saxpy.cu", arch, &verbose()).unwrap_or_else(|e| panic!("{e}"));
        assert!(is_elf(&k.cubin), "{arch}: not a CUBIN");
        assert_eq!((k.arch, k.from_cache), (arch, false));
        let info = k
            .ptxas_info("saxpy")
            .unwrap_or_else(|| panic!("{arch}: no ptxas report in\n{}", k.log));
        assert!(info.entry && info.arch == arch.as_str(), "{info:?}");
        assert!(info.registers > 0 && info.registers < 64, "{info:?}");
        assert!(!k.has_spills(), "{arch}: {info:?}");
        assert_eq!(info.shared_mem, 0);
    }
}

#[test]
fn f16_and_bf16_kernels_compile_with_the_cuda_headers() {
    if !nvrtc_or_skip("f16_and_bf16_kernels_compile_with_the_cuda_headers") {
        return;
    }
    for arch in Arch::ALL {
        let k = compile(HALF, "half.cu", arch, &verbose()).unwrap_or_else(|e| panic!("{e}"));
        assert!(is_elf(&k.cubin));
        let names: Vec<&str> = k.ptxas.iter().map(|p| p.function.as_str()).collect();
        assert!(
            names.contains(&"scale_f16") && names.contains(&"scale_bf16"),
            "{arch}: {names:?}"
        );
        assert!(!k.has_spills());
    }
}

#[test]
fn hopper_only_instructions_need_sm_90a() {
    if !nvrtc_or_skip("hopper_only_instructions_need_sm_90a") {
        return;
    }
    let src = r#"extern "C" __global__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }"#;
    let ok = compile(src, "fence.cu", Arch::Sm90a, &CompileOptions::default());
    assert!(ok.is_ok_and(|k| is_elf(&k.cubin)));
    match compile(src, "fence.cu", Arch::Sm90, &CompileOptions::default()) {
        Err(Error::Compile { kernel, arch, log }) => {
            assert_eq!((kernel.as_str(), arch.as_str()), ("fence.cu", "sm_90"));
            assert!(log.contains("wgmma"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn a_broken_kernel_is_a_compile_error_with_the_log() {
    if !nvrtc_or_skip("a_broken_kernel_is_a_compile_error_with_the_log") {
        return;
    }
    let src = "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }";
    match compile(src, "broken.cu", Arch::Sm80, &CompileOptions::default()) {
        Err(Error::Compile { kernel, arch, log }) => {
            assert_eq!((kernel.as_str(), arch.as_str()), ("broken.cu", "sm_80"));
            assert!(
                log.contains("broken.cu(1)") && log.contains("undefined_name"),
                "{log}"
            );
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    // NUL bytes and bad options are errors, never panics.
    let nul = compile("int x;\0", "nul.cu", Arch::Sm90, &CompileOptions::default());
    assert!(matches!(nul, Err(Error::Compile { .. })), "{nul:?}");
    let opts = CompileOptions {
        extra: vec!["--no-such-option".into()],
        ..CompileOptions::default()
    };
    let bad = compile(SAXPY, "saxpy.cu", Arch::Sm90, &opts);
    assert!(matches!(bad, Err(Error::Compile { .. })), "{bad:?}");
    let nul_opt = CompileOptions {
        extra: vec!["-DX=\0".into()],
        ..CompileOptions::default()
    };
    let bad = compile(SAXPY, "saxpy.cu", Arch::Sm90, &nul_opt);
    assert!(matches!(bad, Err(Error::Compile { .. })), "{bad:?}");
}

#[test]
fn the_ptxas_report_sees_shared_memory_and_spills() {
    if !nvrtc_or_skip("the_ptxas_report_sees_shared_memory_and_spills") {
        return;
    }
    let smem = r#"extern "C" __global__ void tile(float* x) {
        __shared__ float buf[1024];
        buf[threadIdx.x] = x[threadIdx.x];
        __syncthreads();
        x[threadIdx.x] = buf[1023 - threadIdx.x];
    }"#;
    let k = compile(smem, "tile.cu", Arch::Sm90, &verbose()).unwrap_or_else(|e| panic!("{e}"));
    let info = k.ptxas_info("tile").expect("report");
    assert_eq!(info.shared_mem, 4096, "{}", k.log);
    assert!(info.barriers >= 1, "{}", k.log);
    // 64 values live at once under a 16-register cap (ptxas raises it to its minimum, 24 on
    // sm_80): ptxas must spill.
    let spill = r#"extern "C" __global__ void spill(float* x, int n) {
        float v[64];
        #pragma unroll
        for (int i = 0; i < 64; ++i) v[i] = x[i * n + threadIdx.x];
        float acc = 0.f;
        #pragma unroll
        for (int i = 0; i < 64; ++i)
            #pragma unroll
            for (int j = 0; j < 8; ++j) acc += v[i] * v[(i + j) & 63];
        #pragma unroll
        for (int i = 0; i < 64; ++i) x[i * n + threadIdx.x] = v[i] * acc;
    }"#;
    let capped = CompileOptions {
        ptxas_verbose: true,
        max_registers: Some(16),
        ..CompileOptions::default()
    };
    let k = compile(spill, "spill.cu", Arch::Sm80, &capped).unwrap_or_else(|e| panic!("{e}"));
    assert!(k.has_spills(), "expected spills:\n{}", k.log);
    let info = k.ptxas_info("spill").expect("report");
    assert!(info.registers <= 32 && info.spill_stores > 0, "{info:?}");
}

#[test]
fn batches_compile_in_parallel_in_input_order() {
    if !nvrtc_or_skip("batches_compile_in_parallel_in_input_order") {
        return;
    }
    let mut jobs = Vec::new();
    for i in 0..9 {
        let arch = Arch::ALL[i % 3];
        let source = if i == 4 {
            "this is not CUDA".to_string()
        } else {
            SAXPY.replace("saxpy", &format!("saxpy{i}"))
        };
        jobs.push(CompileJob {
            name: format!("k{i}.cu"),
            source,
            arch,
            options: verbose(),
        });
    }
    let t = std::time::Instant::now();
    let out = compile_many(&jobs, None);
    eprintln!("{} kernels in {:?}", jobs.len(), t.elapsed());
    assert_eq!(out.len(), jobs.len());
    for (i, (j, r)) in jobs.iter().zip(&out).enumerate() {
        match r {
            Ok(k) => {
                assert_ne!(i, 4);
                assert_eq!((k.name.as_str(), k.arch), (j.name.as_str(), j.arch));
                assert!(k.ptxas_info(&format!("saxpy{i}")).is_some(), "{}", k.log);
            }
            Err(Error::Compile { kernel, .. }) => {
                assert_eq!((i, kernel.as_str()), (4, "k4.cu"));
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(compile_many(&[], None).is_empty());
}

#[test]
fn the_cache_hits_misses_and_survives_corruption() {
    if !nvrtc_or_skip("the_cache_hits_misses_and_survives_corruption") {
        return;
    }
    let dir = temp_dir("nvrtc-cache");
    let cache = Cache::new(&dir);
    let c = Some(&cache);
    let first = compile_cached(c, SAXPY, "saxpy.cu", Arch::Sm90, &verbose()).unwrap();
    assert!(!first.from_cache);
    let again = compile_cached(c, SAXPY, "saxpy.cu", Arch::Sm90, &verbose()).unwrap();
    assert!(again.from_cache);
    assert_eq!(
        (&again.cubin, &again.log, &again.ptxas),
        (&first.cubin, &first.log, &first.ptxas)
    );
    // Another arch, other options, another source: misses.
    for (src, arch, opts) in [
        (SAXPY, Arch::Sm90a, verbose()),
        (SAXPY, Arch::Sm90, CompileOptions::default()),
        (HALF, Arch::Sm90, verbose()),
    ] {
        let k = compile_cached(c, src, "saxpy.cu", arch, &opts).unwrap();
        assert!(!k.from_cache);
    }
    // Corrupt every entry: the next lookups are misses that recompile and repair.
    let entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .collect();
    assert_eq!(entries.len(), 4, "{entries:?}");
    for p in &entries {
        let mut b = std::fs::read(p).unwrap();
        let n = b.len();
        b.truncate(n / 2);
        std::fs::write(p, b).unwrap();
    }
    let k = compile_cached(c, SAXPY, "saxpy.cu", Arch::Sm90, &verbose()).unwrap();
    assert!(!k.from_cache);
    assert_eq!(k.cubin, first.cubin, "NVRTC output is deterministic");
    let k = compile_cached(c, SAXPY, "saxpy.cu", Arch::Sm90, &verbose()).unwrap();
    assert!(k.from_cache);
    // A cache that cannot be written does not stop the compile.
    let blocked = dir.join("blocked");
    std::fs::write(&blocked, b"a file, not a directory").unwrap();
    let ro = Cache::new(blocked.join("cuda"));
    let k = compile_cached(Some(&ro), SAXPY, "saxpy.cu", Arch::Sm80, &verbose()).unwrap();
    assert!(!k.from_cache && is_elf(&k.cubin));
    // Batches go through the cache too.
    let jobs = vec![CompileJob {
        name: "saxpy.cu".into(),
        source: SAXPY.into(),
        arch: Arch::Sm90,
        options: verbose(),
    }];
    let out = compile_many(&jobs, c);
    assert!(out[0].as_ref().is_ok_and(|k| k.from_cache));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_nvrtc_skips_or_fails_as_the_environment_says() {
    // Re-run one NVRTC test of this binary in a child whose locator is pointed at a library
    // that does not exist.
    let exe = std::env::current_exe().expect("test binary");
    let run = |require: bool| {
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["--exact", "nvrtc_is_version_13", "--nocapture"])
            .env("FUSEBOX_NVRTC_LIB", "/nonexistent/libnvrtc.so.13")
            .env_remove("FUSEBOX_REQUIRE_NVRTC");
        if require {
            cmd.env("FUSEBOX_REQUIRE_NVRTC", "1");
        }
        let out = cmd.output().expect("child test run");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = run(false);
    assert!(
        ok && text.contains("skipping nvrtc_is_version_13"),
        "{text}"
    );
    assert!(text.contains("FUSEBOX_NVRTC_LIB"), "{text}");
    let (ok, text) = run(true);
    assert!(
        !ok && text.contains("FUSEBOX_REQUIRE_NVRTC=1 but"),
        "{text}"
    );
}
