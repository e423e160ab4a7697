//! `fusebox::execute` moves data only where placement changes: a device artifact gets device
//! values as they are, a host artifact gets them downloaded, and the caller downloads the
//! result. A fake device tensor counts the downloads.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    reason = "test code: a failure is a panic"
)]

use fusebox::core::backend::Artifact;
use fusebox::core::backend::pipeline::Plan;
use fusebox::core::ir::DType;
use fusebox::core::runtime::{DeviceTensor, Placement, Tensor, Value};
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
struct Fake {
    data: Tensor,
    downloads: Arc<AtomicUsize>,
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
    fn to_host(&self) -> fusebox::core::Result<Tensor> {
        self.downloads.fetch_add(1, Ordering::SeqCst);
        Ok(self.data.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Negates its argument "on the device": host arguments are fine (uploaded), device ones are
/// read in place; the result is a device value.
struct DeviceNeg(Arc<AtomicUsize>);

impl Artifact for DeviceNeg {
    fn run(&self, args: &[Value]) -> fusebox::core::Result<Value> {
        let t = match &args[0] {
            Value::Tensor(t) => t.clone(),
            Value::Device(d) => match d.as_any().downcast_ref::<Fake>() {
                Some(f) => f.data.clone(),
                None => panic!("not a fake"),
            },
            other => panic!("unexpected {}", other.kind()),
        };
        let v: Vec<f32> = t.to_f32_vec().iter().map(|x| -x).collect();
        Ok(Value::Device(Arc::new(Fake {
            data: Tensor::from_f32(t.shape().to_vec(), v)?,
            downloads: Arc::clone(&self.0),
        })))
    }
    fn placement(&self) -> Placement {
        Placement::Device
    }
}

/// Adds one on the host: must only ever see host tensors.
struct HostInc;

impl Artifact for HostInc {
    fn run(&self, args: &[Value]) -> fusebox::core::Result<Value> {
        let t = args[0].as_tensor("x")?;
        let v: Vec<f32> = t.to_f32_vec().iter().map(|x| x + 1.0).collect();
        Ok(Value::Tensor(Tensor::from_f32(t.shape().to_vec(), v)?))
    }
}

const MODULE: &str = r#"
@I.ir_module
class Module:
    @R.function
    def dev_neg(x: R.Tensor((3,), dtype="float32")) -> R.Tensor((3,), dtype="float32"):
        y: R.Tensor((3,), dtype="float32") = R.negative(x)
        return y

    @R.function
    def host_inc(x: R.Tensor((3,), dtype="float32")) -> R.Tensor((3,), dtype="float32"):
        y: R.Tensor((3,), dtype="float32") = R.add(x, R.const(1.0, "float32"))
        return y

    @R.function
    def main(x: R.Tensor((3,), dtype="float32")) -> R.Tuple(R.Tensor((3,), dtype="float32"), R.Tensor((3,), dtype="float32")):
        cls = Module
        a: R.Tensor((3,), dtype="float32") = cls.dev_neg(x)
        b: R.Tensor((3,), dtype="float32") = cls.dev_neg(a)
        c: R.Tensor((3,), dtype="float32") = cls.host_inc(b)
        return (a, c)
"#;

#[test]
fn execute_downloads_for_host_artifacts_only() {
    let module = fusebox::core::text::parse_module_str(MODULE).unwrap_or_else(|e| panic!("{e}"));
    let downloads = Arc::new(AtomicUsize::new(0));
    let mut artifacts: BTreeMap<String, Box<dyn Artifact>> = BTreeMap::new();
    artifacts.insert(
        "dev_neg".into(),
        Box::new(DeviceNeg(Arc::clone(&downloads))),
    );
    artifacts.insert("host_inc".into(), Box::new(HostInc));
    let plan = Plan {
        module,
        rejections: Vec::new(),
        claims: Vec::new(),
        artifacts,
        notes: Vec::new(),
    };
    let x = Tensor::from_f32(vec![3], vec![1.0, -2.0, 3.0]).unwrap();
    let out =
        fusebox::execute(&plan, "main", vec![Value::Tensor(x)]).unwrap_or_else(|e| panic!("{e}"));
    // dev_neg(x): x is on the host, nothing to download; dev_neg(a): a stays on the device;
    // host_inc(b): b is downloaded once.
    assert_eq!(downloads.load(Ordering::SeqCst), 1);
    let Value::Tuple(parts) = &out else {
        panic!("expected a tuple")
    };
    assert!(matches!(parts[0], Value::Device(_)));
    assert!(matches!(parts[1], Value::Tensor(_)));
    let host = out.to_host().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(downloads.load(Ordering::SeqCst), 2);
    let Value::Tuple(parts) = host else {
        panic!("expected a tuple")
    };
    assert_eq!(
        parts[0].as_tensor("a").unwrap().to_f32_vec(),
        vec![-1.0, 2.0, -3.0]
    );
    assert_eq!(
        parts[1].as_tensor("c").unwrap().to_f32_vec(),
        vec![2.0, -1.0, 4.0]
    );
}
