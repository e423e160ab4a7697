//! Device values in the CPU executor: a fake `DeviceTensor` counts its downloads, and the
//! executor must download exactly where a CPU op needs the data (once per var and frame) and
//! nowhere else.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::ir::DType;
use fusebox_core::runtime::{DeviceTensor, Tensor, Value};
use fusebox_core::text::parse_module_str;
use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Transfer counters shared by every fake tensor of one test.
#[derive(Debug, Default)]
struct Counters {
    uploads: AtomicUsize,
    downloads: AtomicUsize,
}

/// A "device" tensor: the data sits in host memory, but reading it through `to_host` counts
/// as a download.
#[derive(Debug)]
struct Fake {
    data: Tensor,
    counters: Arc<Counters>,
}

impl DeviceTensor for Fake {
    fn dtype(&self) -> DType {
        self.data.dtype()
    }
    fn shape(&self) -> &[usize] {
        self.data.shape()
    }
    fn device(&self) -> String {
        "fake:0".into()
    }
    fn to_host(&self) -> fusebox_core::Result<Tensor> {
        self.counters.downloads.fetch_add(1, Ordering::SeqCst);
        Ok(self.data.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The fake GPU artifact of `gpu_double`: uploads a host argument (counted), reads a fake
/// device argument in place (no download), returns a device value.
fn gpu_double(counters: &Arc<Counters>, args: &[Value]) -> fusebox_core::Result<Value> {
    let x = match &args[0] {
        Value::Tensor(t) => {
            counters.uploads.fetch_add(1, Ordering::SeqCst);
            t.clone()
        }
        Value::Device(d) => match d.as_any().downcast_ref::<Fake>() {
            Some(f) => f.data.clone(),
            None => panic!("not a fake device tensor"),
        },
        other => panic!("unexpected {}", other.kind()),
    };
    let doubled: Vec<f32> = x.to_f32_vec().iter().map(|v| v * 2.0).collect();
    Ok(Value::Device(Arc::new(Fake {
        data: Tensor::from_f32(x.shape().to_vec(), doubled)?,
        counters: Arc::clone(counters),
    })))
}

const MODULE: &str = r#"
@I.ir_module
class Module:
    @R.function
    def gpu_double(x: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
        y: R.Tensor((4,), dtype="float32") = R.add(x, x)
        return y

    @R.function
    def cpu_relu(x: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
        y: R.Tensor((4,), dtype="float32") = R.nn.relu(x)
        return y

    @R.function
    def main(x: R.Tensor((4,), dtype="float32")) -> R.Tuple(R.Tensor((4,), dtype="float32"), R.Tensor((4,), dtype="float32"), R.Tensor((4,), dtype="float32")):
        cls = Module
        a: R.Tensor((4,), dtype="float32") = cls.gpu_double(x)
        b: R.Tensor((4,), dtype="float32") = R.nn.relu(a)
        c: R.Tensor((4,), dtype="float32") = R.add(a, b)
        d: R.Tensor((4,), dtype="float32") = cls.gpu_double(a)
        e: R.Tensor((4,), dtype="float32") = cls.cpu_relu(d)
        return (c, d, e)
"#;

#[test]
fn the_executor_downloads_only_where_a_cpu_op_reads_device_data() {
    let m = parse_module_str(MODULE).unwrap_or_else(|e| panic!("{e}"));
    let counters = Arc::new(Counters::default());
    let hook =
        |name: &str, vals: &[Value]| (name == "gpu_double").then(|| gpu_double(&counters, vals));
    let x = Tensor::from_f32(vec![4], vec![1.0, -2.0, 3.0, -4.0]).unwrap();
    let out = fusebox_cpu::run_with(&m, "main", vec![Value::Tensor(x)], Some(&hook))
        .unwrap_or_else(|e| panic!("{e}"));
    // x is uploaded once (the first gpu_double). `a` lives on the device: relu downloads it,
    // add reuses that host copy, the second gpu_double gets it as it is. `d` goes into the
    // interpreted `cpu_relu`, whose relu downloads it once.
    assert_eq!(counters.uploads.load(Ordering::SeqCst), 1);
    assert_eq!(counters.downloads.load(Ordering::SeqCst), 2);
    let Value::Tuple(parts) = &out else {
        panic!("expected a tuple, got {}", out.kind())
    };
    assert!(matches!(parts[0], Value::Tensor(_)));
    assert!(
        matches!(parts[1], Value::Device(_)),
        "d stays on the device"
    );
    assert!(matches!(parts[2], Value::Tensor(_)));
    assert!(out.is_on_device());
    // The caller downloads the device part of the result: one more transfer, and nothing else.
    let host = out.to_host().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(counters.downloads.load(Ordering::SeqCst), 3);
    assert!(!host.is_on_device());
    let Value::Tuple(parts) = host else {
        panic!("expected a tuple")
    };
    let vals: Vec<Vec<f32>> = parts
        .iter()
        .map(|p| p.as_tensor("output").unwrap().to_f32_vec())
        .collect();
    assert_eq!(vals[0], vec![4.0, -4.0, 12.0, -8.0]); // a + relu(a), a = 2x
    assert_eq!(vals[1], vec![4.0, -8.0, 12.0, -16.0]); // 4x
    assert_eq!(vals[2], vec![4.0, 0.0, 12.0, 0.0]);
    // A host result converts without any transfer.
    let again = Value::Tensor(Tensor::scalar_f32(1.0)).to_host();
    assert!(again.is_ok());
    assert_eq!(counters.downloads.load(Ordering::SeqCst), 3);
}

#[test]
fn device_values_are_type_checked_without_a_download() {
    let m = parse_module_str(MODULE).unwrap_or_else(|e| panic!("{e}"));
    let counters = Arc::new(Counters::default());
    // A device argument of the wrong shape is caught by the parameter check; no data moves.
    let wrong = Value::Device(Arc::new(Fake {
        data: Tensor::from_f32(vec![5], vec![0.0; 5]).unwrap(),
        counters: Arc::clone(&counters),
    }));
    let e = fusebox_cpu::run(&m, "cpu_relu", vec![wrong]);
    let msg = e.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(msg.contains("expected dim"), "{msg}");
    assert_eq!(counters.downloads.load(Ordering::SeqCst), 0);
    // A right one runs, downloading once for the relu.
    let right = Value::Device(Arc::new(Fake {
        data: Tensor::from_f32(vec![4], vec![-1.0, 1.0, -1.0, 1.0]).unwrap(),
        counters: Arc::clone(&counters),
    }));
    let out = fusebox_cpu::run(&m, "cpu_relu", vec![right]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(counters.downloads.load(Ordering::SeqCst), 1);
    assert_eq!(
        out.as_tensor("y").unwrap().to_f32_vec(),
        vec![0.0, 1.0, 0.0, 1.0]
    );
}
