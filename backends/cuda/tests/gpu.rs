//! The CUDA runtime on a real GPU: probe, bit-exact transfers of every dtype, launches (f32,
//! f16, bf16, more than 48 KiB of dynamic shared memory), argument checks, events, and device
//! values through the CPU executor.
//!
//! Without a GPU every test but the probe skips with a printed reason; with
//! `FUSEBOX_REQUIRE_GPU=1` they fail instead. Kernels need NVRTC as well.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

mod common;

use common::{HALF, SAXPY};
use fusebox_core::ir::DType;
use fusebox_core::runtime::{Storage, StorageRef, Tensor, Value};
use fusebox_cuda::nvrtc::{Arch, CompileOptions, compile};
use fusebox_cuda::testing::{gpu_or_skip, nvrtc_or_skip};
use fusebox_cuda::{Error, Gpu, GpuTensor, KernelArg, LaunchConfig};
use half::{bf16, f16};
use std::sync::Arc;

#[test]
fn the_probe_returns_a_typed_error_or_a_device() {
    match Gpu::get() {
        Ok(g) => {
            eprintln!(
                "{} cc {:?} arch {:?}, {} SMs, {} MiB, driver {:?}",
                g.describe(),
                g.compute_capability(),
                g.arch(),
                g.sm_count(),
                g.total_memory() >> 20,
                g.driver_version()
            );
            assert!(g.sm_count() > 0 && g.total_memory() > 0);
            assert!(g.max_shared_mem_per_block() >= 48 * 1024);
        }
        Err(e) => {
            assert!(matches!(e, Error::NoDevice { .. }), "{e:?}");
            eprintln!("no GPU: {e}");
            // A machine without the NVIDIA driver's device nodes has no GPU to find.
            if !std::path::Path::new("/dev/nvidiactl").exists() {
                assert!(!Gpu::is_available());
            }
        }
    }
    if !std::path::Path::new("/dev/nvidiactl").exists() {
        assert!(
            matches!(Gpu::get(), Err(Error::NoDevice { .. })),
            "no /dev/nvidiactl, yet a GPU was found"
        );
    }
}

fn every_dtype() -> Vec<Tensor> {
    let n: usize = 1000;
    let shape = vec![10, 100];
    let f: Vec<f32> = (0..n).map(|i| (i as f32 - 500.0) * 0.37).collect();
    let mut half_bits: Vec<f16> = f.iter().map(|&x| f16::from_f32(x)).collect();
    // Bit patterns the round trip must keep: NaN payloads, -0, subnormals, infinities.
    half_bits[0] = f16::from_bits(0x7e01);
    half_bits[1] = f16::from_bits(0x8000);
    half_bits[2] = f16::from_bits(0x0001);
    half_bits[3] = f16::INFINITY;
    let mut bf_bits: Vec<bf16> = f.iter().map(|&x| bf16::from_f32(x)).collect();
    bf_bits[0] = bf16::from_bits(0x7fc1);
    bf_bits[1] = bf16::from_bits(0x8000);
    let mut f32s = f.clone();
    f32s[0] = f32::from_bits(0x7fc0_1234);
    let mk = |s: Storage| Tensor::new(shape.clone(), s).unwrap();
    vec![
        mk(Storage::F16(half_bits)),
        mk(Storage::BF16(bf_bits)),
        mk(Storage::F32(f32s)),
        mk(Storage::F64(
            f.iter().map(|&x| f64::from(x) / 3.0).collect(),
        )),
        mk(Storage::I8((0..n).map(|i| (i % 256) as i8).collect())),
        mk(Storage::U8((0..n).map(|i| (i % 256) as u8).collect())),
        mk(Storage::I32((0..n).map(|i| i as i32 * -7919).collect())),
        mk(Storage::I64((0..n).map(|i| (i as i64) << 40).collect())),
        mk(Storage::Bool((0..n).map(|i| i % 3 == 0).collect())),
    ]
}

fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    a.shape() == b.shape() && a.to_constant().ok() == b.to_constant().ok()
}

#[test]
fn every_dtype_round_trips_bit_exactly() {
    let Some(gpu) = gpu_or_skip("every_dtype_round_trips_bit_exactly") else {
        return;
    };
    for t in every_dtype() {
        let g = GpuTensor::upload(&gpu, &t).unwrap_or_else(|e| panic!("{}: {e}", t.dtype()));
        assert_eq!((g.dtype(), g.shape()), (t.dtype(), t.shape()));
        assert_eq!(g.byte_len(), t.numel() * t.dtype().size_bytes());
        assert_ne!(g.device_ptr(), 0);
        let back = g.download().unwrap();
        assert!(
            same_bits(&t, &back),
            "{} changed in the round trip",
            t.dtype()
        );
        // Through the executor's trait too.
        let v = g.clone().into_value();
        assert!(v.is_on_device());
        let host = v.to_host().unwrap();
        assert!(same_bits(&t, host.as_tensor("t").unwrap()));
    }
    // Zero-size and scalar tensors.
    for shape in [vec![0], vec![3, 0, 2], vec![]] {
        let t = Tensor::zeros(shape.clone(), DType::F32).unwrap();
        let g = GpuTensor::upload(&gpu, &t).unwrap();
        assert_eq!(g.download().unwrap().shape(), shape.as_slice());
    }
    // Typed views for libraries: the element size must match, writes need an unshared buffer.
    let h = GpuTensor::upload(&gpu, &f32_tensor(vec![1.0; 6]).cast(DType::F16)).unwrap();
    assert_eq!(h.view::<u16>().map(|v| v.len()).ok(), Some(6));
    assert!(h.view::<f32>().is_err());
    let mut fresh = GpuTensor::empty(&gpu, DType::F32, vec![6]).unwrap();
    assert!(fresh.view_mut::<f32>().is_ok());
    let _shared = fresh.clone();
    assert!(fresh.view_mut::<f32>().is_err());
    let z = GpuTensor::zeros(&gpu, DType::Bool, vec![5]).unwrap();
    assert_eq!(
        z.download().unwrap().storage(),
        StorageRef::Bool(&[false; 5])
    );
    let r = z.reshaped(vec![5, 1]).unwrap();
    assert_eq!(
        (r.shape(), r.device_ptr()),
        (&[5usize, 1][..], z.device_ptr())
    );
    assert!(z.reshaped(vec![4]).is_err());
}

fn f32_tensor(v: Vec<f32>) -> Tensor {
    Tensor::from_f32(vec![v.len()], v).unwrap()
}

#[test]
fn a_kernel_runs_and_its_arguments_are_checked() {
    let Some(gpu) = gpu_or_skip("a_kernel_runs_and_its_arguments_are_checked") else {
        return;
    };
    if !nvrtc_or_skip("a_kernel_runs_and_its_arguments_are_checked") {
        return;
    }
    let arch = gpu.arch().expect("a device fusebox builds for");
    let k = compile(SAXPY, "saxpy.cu", arch, &CompileOptions::default()).unwrap();
    let module = gpu.load_module(&k.cubin).unwrap();
    let saxpy = module.kernel("saxpy").unwrap();
    assert_eq!(saxpy.param_sizes(), &[8, 8, 8, 4, 4]);
    let n = 100_003usize;
    let x = GpuTensor::upload(&gpu, &f32_tensor((0..n).map(|i| i as f32).collect())).unwrap();
    let y = GpuTensor::upload(&gpu, &f32_tensor(vec![1.0; n])).unwrap();
    let out = GpuTensor::empty(&gpu, DType::F32, vec![n]).unwrap();
    let cfg = LaunchConfig::linear(n, 256).unwrap();
    let args = [
        KernelArg::Buffer(&out),
        KernelArg::Buffer(&x),
        KernelArg::Buffer(&y),
        KernelArg::F32(2.0),
        KernelArg::I32(n as i32),
    ];
    let ((), ms) = gpu.time(|| saxpy.launch(&cfg, &args)).unwrap();
    assert!(ms >= 0.0);
    let got = out.download().unwrap().to_f32_vec();
    for (i, v) in got.iter().enumerate() {
        assert_eq!(*v, 2.0 * i as f32 + 1.0, "element {i}");
    }
    // Wrong count, wrong size, bad shapes: typed errors, nothing launched.
    for bad in [
        &args[..4],
        &[
            KernelArg::Buffer(&out),
            KernelArg::Buffer(&x),
            KernelArg::Buffer(&y),
            KernelArg::F64(2.0),
            KernelArg::I32(n as i32),
        ][..],
    ] {
        let e = saxpy.launch(&cfg, bad);
        assert!(matches!(e, Err(Error::Device(_))), "{e:?}");
    }
    let e = saxpy.launch(
        &LaunchConfig {
            grid: [1, 1, 1],
            block: [4096, 1, 1],
            shared_mem_bytes: 0,
        },
        &args,
    );
    assert!(matches!(e, Err(Error::Device(_))), "{e:?}");
    let e = saxpy.launch(
        &LaunchConfig {
            grid: [0, 1, 1],
            block: [1, 1, 1],
            shared_mem_bytes: 0,
        },
        &args,
    );
    assert!(matches!(e, Err(Error::Device(_))), "{e:?}");
    assert!(module.kernel("no_such_kernel").is_err());
    assert!(gpu.load_module(&[]).is_err());
    assert!(gpu.load_module(b"not a cubin").is_err());
    assert!(saxpy.num_registers().unwrap() > 0);
    assert_eq!(saxpy.local_bytes().unwrap(), 0);
}

#[test]
fn f16_and_bf16_kernels_compute() {
    let Some(gpu) = gpu_or_skip("f16_and_bf16_kernels_compute") else {
        return;
    };
    if !nvrtc_or_skip("f16_and_bf16_kernels_compute") {
        return;
    }
    let arch = gpu.arch().expect("a device fusebox builds for");
    let k = compile(HALF, "half.cu", arch, &CompileOptions::default()).unwrap();
    let module = gpu.load_module(&k.cubin).unwrap();
    let n = 4099usize;
    let vals: Vec<f32> = (0..n).map(|i| (i as f32) * 0.25 - 100.0).collect();
    for (dtype, kernel) in [(DType::F16, "scale_f16"), (DType::BF16, "scale_bf16")] {
        let x = f32_tensor(vals.clone()).cast(dtype);
        let gx = GpuTensor::upload(&gpu, &x).unwrap();
        let out = GpuTensor::empty(&gpu, dtype, vec![n]).unwrap();
        let k = module.kernel(kernel).unwrap();
        k.launch(
            &LaunchConfig::linear(n, 128).unwrap(),
            &[
                KernelArg::Buffer(&out),
                KernelArg::Buffer(&gx),
                KernelArg::I64(n as i64),
            ],
        )
        .unwrap();
        let got = out.download().unwrap();
        let want: Vec<f32> = x.to_f32_vec().iter().map(|v| v * 2.0 + 1.0).collect();
        let want = f32_tensor(want).cast(dtype);
        assert!(same_bits(&got, &want), "{dtype}: {got:?} vs {want:?}");
    }
}

#[test]
fn large_dynamic_shared_memory_and_sm_90a() {
    let Some(gpu) = gpu_or_skip("large_dynamic_shared_memory_and_sm_90a") else {
        return;
    };
    if !nvrtc_or_skip("large_dynamic_shared_memory_and_sm_90a") {
        return;
    }
    let arch = gpu.arch().expect("a device fusebox builds for");
    // Reverses `n` floats through dynamic shared memory in one block.
    let src = r#"extern "C" __global__ void reverse(float* x, int n) {
        extern __shared__ float buf[];
        for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = x[i];
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = buf[n - 1 - i];
    }"#;
    let k = compile(src, "reverse.cu", arch, &CompileOptions::default()).unwrap();
    let m = gpu.load_module(&k.cubin).unwrap();
    let reverse = m.kernel("reverse").unwrap();
    let limit = gpu.max_shared_mem_per_block();
    let n = (limit.min(160 * 1024) / 4) as usize;
    assert!(n * 4 > 48 * 1024, "the device allows only {limit} bytes");
    let x = GpuTensor::upload(&gpu, &f32_tensor((0..n).map(|i| i as f32).collect())).unwrap();
    reverse
        .launch(
            &LaunchConfig {
                grid: [1, 1, 1],
                block: [256, 1, 1],
                shared_mem_bytes: (n * 4) as u32,
            },
            &[KernelArg::Buffer(&x), KernelArg::I32(n as i32)],
        )
        .unwrap();
    let got = x.download().unwrap().to_f32_vec();
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, &v)| v == (n - 1 - i) as f32)
    );
    // More than the device allows is refused before the launch.
    let e = reverse.launch(
        &LaunchConfig {
            grid: [1, 1, 1],
            block: [256, 1, 1],
            shared_mem_bytes: limit + 1,
        },
        &[KernelArg::Buffer(&x), KernelArg::I32(n as i32)],
    );
    assert!(matches!(e, Err(Error::Device(_))), "{e:?}");
    // Hopper: sm_90a CUBIN loads and runs.
    if gpu.supports(Arch::Sm90a) {
        let src = r#"extern "C" __global__ void fence(int* x) {
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
            x[threadIdx.x] = threadIdx.x;
        }"#;
        let k = compile(src, "fence.cu", Arch::Sm90a, &CompileOptions::default()).unwrap();
        let m = gpu.load_module(&k.cubin).unwrap();
        let out = GpuTensor::zeros(&gpu, DType::I32, vec![128]).unwrap();
        m.kernel("fence")
            .unwrap()
            .launch(
                &LaunchConfig {
                    grid: [1, 1, 1],
                    block: [128, 1, 1],
                    shared_mem_bytes: 0,
                },
                &[KernelArg::Buffer(&out)],
            )
            .unwrap();
        assert_eq!(
            out.download().unwrap().to_i64_vec(),
            (0..128).collect::<Vec<i64>>()
        );
    }
}

#[test]
fn device_values_flow_through_the_cpu_executor() {
    let Some(gpu) = gpu_or_skip("device_values_flow_through_the_cpu_executor") else {
        return;
    };
    if !nvrtc_or_skip("device_values_flow_through_the_cpu_executor") {
        return;
    }
    let arch = gpu.arch().expect("a device fusebox builds for");
    let k = compile(SAXPY, "saxpy.cu", arch, &CompileOptions::default()).unwrap();
    let module = gpu.load_module(&k.cubin).unwrap();
    let saxpy = module.kernel("saxpy").unwrap();
    // `gpu_twice(x) = 2x + x` on the GPU; relu on the CPU reference.
    let text = r#"
@I.ir_module
class Module:
    @R.function
    def gpu_twice(x: R.Tensor((8,), dtype="float32")) -> R.Tensor((8,), dtype="float32"):
        y: R.Tensor((8,), dtype="float32") = R.add(x, R.add(x, x))
        return y

    @R.function
    def main(x: R.Tensor((8,), dtype="float32")) -> R.Tuple(R.Tensor((8,), dtype="float32"), R.Tensor((8,), dtype="float32")):
        cls = Module
        a: R.Tensor((8,), dtype="float32") = cls.gpu_twice(x)
        b: R.Tensor((8,), dtype="float32") = R.nn.relu(a)
        c: R.Tensor((8,), dtype="float32") = cls.gpu_twice(a)
        return (b, c)
"#;
    let m = fusebox_core::text::parse_module_str(text).unwrap();
    let hook = |name: &str, vals: &[Value]| {
        (name == "gpu_twice").then(|| {
            let run = || -> fusebox_cuda::Result<Value> {
                let x = GpuTensor::from_value(&gpu, &vals[0])?;
                let out = GpuTensor::empty(&gpu, x.dtype(), x.shape().to_vec())?;
                saxpy.launch(
                    &LaunchConfig::linear(x.numel(), 128)?,
                    &[
                        KernelArg::Buffer(&out),
                        KernelArg::Buffer(&x),
                        KernelArg::Buffer(&x),
                        KernelArg::F32(2.0),
                        KernelArg::I32(x.numel() as i32),
                    ],
                )?;
                Ok(out.into_value())
            };
            run().map_err(|e| fusebox_core::Error::Runtime(e.to_string()))
        })
    };
    let x: Vec<f32> = (0..8).map(|i| i as f32 - 4.0).collect();
    let out = fusebox_cpu::run_with(
        &m,
        "main",
        vec![Value::Tensor(f32_tensor(x.clone()))],
        Some(&hook),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let Value::Tuple(parts) = &out else {
        panic!("expected a tuple")
    };
    assert!(matches!(parts[0], Value::Tensor(_)));
    let Value::Device(c) = &parts[1] else {
        panic!("c should stay on the device")
    };
    assert!(c.device().starts_with("cuda:"));
    assert!(c.as_any().downcast_ref::<GpuTensor>().is_some());
    let host = out.to_host().unwrap();
    let Value::Tuple(parts) = host else {
        panic!("expected a tuple")
    };
    let b = parts[0].as_tensor("b").unwrap().to_f32_vec();
    let c = parts[1].as_tensor("c").unwrap().to_f32_vec();
    for i in 0..8 {
        assert_eq!(b[i], (3.0 * x[i]).max(0.0));
        assert_eq!(c[i], 9.0 * x[i]);
    }
    // A device value of this GPU is shared, not copied, when passed back in.
    let g = GpuTensor::upload(&gpu, &f32_tensor(x)).unwrap();
    let v = Value::Device(Arc::new(g.clone()));
    assert_eq!(
        GpuTensor::from_value(&gpu, &v).unwrap().device_ptr(),
        g.device_ptr()
    );
    assert!(GpuTensor::from_value(&gpu, &Value::Shape(vec![1])).is_err());
}

/// A host tensor passed again (a model's constant, which the executor hands every call) is
/// on the device already: the same buffer comes back, and a tensor with other storage or
/// written since gets its own upload with its own values.
#[test]
fn host_tensors_are_uploaded_once_while_their_storage_lives() {
    let Some(gpu) = gpu_or_skip("host_tensors_are_uploaded_once_while_their_storage_lives") else {
        return;
    };
    let vals: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
    let t = f32_tensor(vals.clone());
    let a = GpuTensor::from_value(&gpu, &Value::Tensor(t.clone())).unwrap();
    let b = GpuTensor::from_value(&gpu, &Value::Tensor(t.clone())).unwrap();
    assert_eq!(a.device_ptr(), b.device_ptr());
    assert_eq!(b.download().unwrap().to_f32_vec(), vals);
    let twin = GpuTensor::from_value(&gpu, &Value::Tensor(f32_tensor(vals.clone()))).unwrap();
    assert_ne!(twin.device_ptr(), a.device_ptr());
    let mut changed = t.clone();
    if let Storage::F32(v) = changed.storage_mut() {
        v[0] = -1.0;
    }
    let c = GpuTensor::from_value(&gpu, &Value::Tensor(changed)).unwrap();
    assert_ne!(c.device_ptr(), a.device_ptr());
    assert_eq!(c.download().unwrap().to_f32_vec()[..2], [-1.0, 0.5]);
    assert_eq!(a.download().unwrap().to_f32_vec(), vals);
}
