//! The `cublas` backend: TVM's cuBLAS pattern table, a claim that reads each function into a
//! [`MatmulSpec`], and a compile that hands the spec to the cuBLASLt runtime.
//!
//! Contract: registered as `cublas` with `inventory::submit!`; options are [`Options`]
//! (unknown keys are errors listing the valid ones). [`CublasBackend::claim`] accepts a
//! function whose `Codegen` is `cublas` (or whose `Composite` is `cublas.*`) and whose body
//! [`crate::spec::analyse`] understands, and declines anything else with the reason.
//! [`CublasBackend::compile`] analyses again, builds the plan once when every shape is static
//! (so a shape cuBLASLt cannot run fails at compile time), then needs a device: without one it
//! fails with the typed [`Error::NoDevice`] (`no CUDA device: …`), and the pipeline tries the
//! next backend that claims the function.
//!
//! ```
//! fusebox_cublas::link();
//! let b = fusebox_core::backend::make_backend("cublas", &Default::default()).unwrap();
//! assert_eq!(b.name(), "cublas");
//! assert_eq!(b.patterns().len(), 9);
//! ```

use crate::error::{Error, Result};
use crate::options::Options;
use crate::plan::{LtPlan, PlanRequest, build_plan};
use crate::spec::{MatmulSpec, Operand, analyse};
use fusebox_core::backend::{
    Artifact, Backend, BackendRegistration, BuildOutput, Candidate, Claim,
};
use fusebox_core::ir::{Function, Type};
use fusebox_core::transform::FusionPattern;

/// The cuBLAS backend.
#[derive(Debug, Default)]
pub struct CublasBackend {
    /// Its options.
    pub options: Options,
}

fn make(options: &toml::Table) -> fusebox_core::Result<Box<dyn Backend>> {
    Ok(Box::new(CublasBackend::new(Options::from_table(options)?)))
}

inventory::submit! {
    BackendRegistration { name: "cublas", make }
}

impl CublasBackend {
    /// A backend with these options.
    pub fn new(options: Options) -> Self {
        CublasBackend { options }
    }

    /// Analyses `func` and, when its shapes are static, plans it (what `compile` does before it
    /// needs a device). Returns the spec and the static plan, if any.
    pub fn prepare(&self, name: &str, func: &Function) -> Result<(MatmulSpec, Option<LtPlan>)> {
        let spec = analyse(name, func)?;
        let plan = match static_request(&spec, func, &self.options) {
            Some(req) => Some(build_plan(&req).map_err(|e| Error::Unsupported {
                function: name.to_string(),
                reason: e.to_string(),
            })?),
            None => None,
        };
        Ok((spec, plan))
    }

    /// `compile` with this crate's error type (so callers can match [`Error::NoDevice`]).
    pub fn compile_function(&self, name: &str, func: &Function) -> Result<crate::CublasArtifact> {
        let (spec, plan) = self.prepare(name, func)?;
        crate::CublasArtifact::new(name, spec, plan, self.options)
    }
}

impl Backend for CublasBackend {
    fn name(&self) -> &str {
        "cublas"
    }

    fn patterns(&self) -> Vec<FusionPattern> {
        crate::patterns::table()
    }

    fn claim(&self, c: &Candidate<'_>) -> Claim {
        match self.prepare(c.name, c.func) {
            Ok(_) => Claim::Accept,
            Err(Error::Unsupported { reason, .. }) => Claim::Decline { reason },
            Err(e) => Claim::Decline {
                reason: e.to_string(),
            },
        }
    }

    fn compile(&self, c: &Candidate<'_>) -> fusebox_core::Result<Box<dyn Artifact>> {
        Ok(Box::new(self.compile_function(c.name, c.func)?))
    }

    /// Nothing is generated ahead of time (cuBLASLt is a library); the build writes the
    /// function's spec and, for static shapes, its plan as `<name>.cublaslt.txt`.
    fn build(&self, c: &Candidate<'_>) -> fusebox_core::Result<Option<BuildOutput>> {
        let (spec, plan) = self.prepare(c.name, c.func)?;
        let mut text = format!("{}: {spec}\n", c.name);
        match plan {
            Some(p) => text.push_str(&format!("plan: {p}\nout shape: {:?}\n", p.out_shape)),
            None => text.push_str("plan: made per call (symbolic shapes)\n"),
        }
        Ok(Some(BuildOutput {
            files: vec![(format!("{}.cublaslt.txt", c.name), text.into_bytes())],
            kernels: Vec::new(),
            arch: None,
        }))
    }
}

/// The plan request of `spec` when every operand of `func` has a static shape.
fn static_request(spec: &MatmulSpec, func: &Function, options: &Options) -> Option<PlanRequest> {
    let shape = |o: &Operand| -> Option<Vec<usize>> {
        match o {
            Operand::Const(t) => Some(t.shape().to_vec()),
            Operand::Param(i) => {
                let p = func.params.get(*i)?;
                let t = match &func.var(*p).ty {
                    Type::Tensor(t) => t,
                    _ => return None,
                };
                t.static_shape()?
                    .into_iter()
                    .map(|d| usize::try_from(d).ok())
                    .collect()
            }
        }
    };
    Some(PlanRequest {
        lhs: shape(&spec.lhs)?,
        rhs: shape(&spec.rhs)?,
        rhs_transposed: spec.rhs_transposed,
        bias: match &spec.bias {
            Some(b) => Some(shape(b)?),
            None => None,
        },
        in_dtype: spec.in_dtype,
        out_dtype: spec.out_dtype,
        activation: spec.activation,
        scaled: spec.scale.is_some(),
        allow_tf32: options.allow_tf32,
    })
}
