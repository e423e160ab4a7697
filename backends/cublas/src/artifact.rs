//! The compiled artifact (placeholder until the device runtime lands).

use crate::error::{Error, Result};
use crate::options::Options;
use crate::plan::LtPlan;
use crate::spec::MatmulSpec;
use fusebox_core::backend::Artifact;
use fusebox_core::runtime::Value;

/// A compiled cuBLAS function.
pub struct CublasArtifact {
    /// The function's name.
    pub name: String,
    /// What it computes.
    pub spec: MatmulSpec,
    /// The plan, when every shape is static.
    pub static_plan: Option<LtPlan>,
    /// The backend's options.
    pub options: Options,
}

impl CublasArtifact {
    /// Makes the artifact; needs a device.
    pub fn new(
        name: &str,
        spec: MatmulSpec,
        static_plan: Option<LtPlan>,
        options: Options,
    ) -> Result<Self> {
        let _ = (name, spec, static_plan, options);
        Err(Error::NoDevice {
            reason: "the device runtime is not built yet".into(),
        })
    }
}

impl Artifact for CublasArtifact {
    fn run(&self, _args: &[Value]) -> fusebox_core::Result<Value> {
        Err(Error::NoDevice {
            reason: "the device runtime is not built yet".into(),
        }
        .into())
    }
}
