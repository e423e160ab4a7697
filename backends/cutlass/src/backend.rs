//! The `cutlass` backend: the pattern table, a claim that reads each function into a
//! [`KernelSpec`], `build` (the `.cu`, `.cubin` and launch of the chosen instance, without a
//! device) and `compile` (a [`CutlassArtifact`] on the device).
//!
//! Contract: registered as `cutlass` with `inventory::submit!`; options are [`Options`].
//! [`CutlassBackend::claim`] accepts a function whose `Codegen` is `cutlass` (or whose
//! `Composite` is `cutlass.*`) that [`analyse`] understands and, when its shapes are static,
//! that [`plan`] accepts; it declines anything else with the reason (int8 matmuls TVM's table
//! accepts, grouped convs, constants …), so the pipeline hands it to the next backend. A
//! `cutlass.attention*` function is read by [`analyse_attention`] instead (the fused attention
//! kernel's variants, exactly: declined otherwise) and compiles to an [`AttentionArtifact`].
//! [`CutlassBackend::compile`] without a device fails with the typed no-device error.
//! `build` writes, per function, `<kernel>.cu`, `<kernel>.cubin` (for the `arch` option,
//! default sm_90; `arch = "sm_90a"` selects the wgmma + TMA path for f16/bf16 GEMMs with
//! 16-byte row strides) and `<function>.cutlass.txt` (spec, plan, path, instance, launch); with symbolic
//! shapes it builds the instance for the alignment the static dims allow and the launch is
//! made per call.
//!
//! ```
//! fusebox_cutlass::link();
//! let b = fusebox_core::backend::make_backend("cutlass", &Default::default()).unwrap();
//! assert_eq!(b.name(), "cutlass");
//! assert_eq!(b.patterns().len(), 50);
//! ```

use crate::artifact::{AttentionArtifact, CutlassArtifact};
use crate::error::{Error, Result};
use crate::generator::{Instance, emit};
use crate::options::Options;
use crate::plan::{Plan, plan};
use crate::spec::{KernelSpec, analyse, analyse_attention, is_attention};
use fusebox_core::backend::{
    Artifact, Backend, BackendRegistration, BuildOutput, Candidate, Claim, KernelInfo,
};
use fusebox_core::ir::{Function, Type};
use fusebox_core::transform::FusionPattern;
use fusebox_cuda::{CompileOptions, compile_cached};

/// The CUTLASS backend.
#[derive(Debug, Default)]
pub struct CutlassBackend {
    /// Its options.
    pub options: Options,
}

fn make(options: &toml::Table) -> fusebox_core::Result<Box<dyn Backend>> {
    Ok(Box::new(CutlassBackend {
        options: Options::from_table(options)?,
    }))
}

inventory::submit! {
    BackendRegistration { name: "cutlass", make }
}

/// The static shape of every parameter of `func`, when all are static.
pub fn static_shapes(func: &Function) -> Option<Vec<Vec<usize>>> {
    func.params
        .iter()
        .map(|&p| match &func.var(p).ty {
            Type::Tensor(t) => t
                .static_shape()?
                .into_iter()
                .map(|d| usize::try_from(d).ok())
                .collect(),
            _ => None,
        })
        .collect()
}

impl CutlassBackend {
    /// Analyses `func` and plans it when its shapes are static.
    pub fn prepare(&self, name: &str, func: &Function) -> Result<(KernelSpec, Option<Plan>)> {
        let spec = analyse(name, func)?;
        let p = match static_shapes(func) {
            Some(s) => Some(plan(&spec, &s).map_err(|e| Error::Unsupported {
                function: name.to_string(),
                reason: e.to_string(),
            })?),
            None => None,
        };
        Ok((spec, p))
    }

    /// The instance `build` emits: the heuristic's for a static plan, else the largest tile at
    /// the alignment the static dims allow.
    pub fn build_instance(&self, spec: &KernelSpec, p: Option<&Plan>) -> Instance {
        match p.and_then(|p| p.choose(spec, self.options.sm_count as usize, self.options.arch)) {
            Some(i) => i,
            None => {
                let kind = match spec.problem {
                    crate::spec::Problem::Gemm { rhs_transposed, .. } => {
                        crate::generator::Kind::Gemm {
                            b_kmajor: !rhs_transposed,
                        }
                    }
                    crate::spec::Problem::Conv2d { .. } => crate::generator::Kind::Conv2d,
                };
                let mut c = crate::select::candidates(spec.elem, kind, 1, &spec.epilogue);
                c.swap_remove(0)
            }
        }
    }

    /// `build` of a `cutlass.attention*` function: the fused attention kernel's `.cu` and
    /// `.cubin` (for the `arch` option; sm_90a builds the sm_90 kernel, which uses no sm_90a
    /// instruction) and `<function>.cutlass.txt` (spec, kernel, launch when the shapes are
    /// static).
    pub fn build_attention(&self, name: &str, func: &Function) -> Result<BuildOutput> {
        let spec = analyse_attention(name, func)?;
        let kernel = spec.kernel();
        let kname = kernel.name();
        let src = kernel.source();
        let arch = match self.options.arch {
            fusebox_cuda::Arch::Sm90a => fusebox_cuda::Arch::Sm90,
            a => a,
        };
        let cache = fusebox_cuda::Cache::from_env();
        let compiled = compile_cached(
            cache.as_ref(),
            &src,
            &format!("{kname}.cu"),
            arch,
            &CompileOptions::default(),
        )?;
        let mut text = format!("{name}: {spec}\nkernel: {kname}\n");
        let mut kernels = Vec::new();
        let shapes = static_shapes(func);
        let planned = shapes.as_ref().map(|s| {
            let arg = |i: usize| s.get(i).map_or(&[][..], Vec::as_slice);
            let dt = spec.elem.dtype();
            let [q, k, v] = spec.qkv;
            crate::attention::plan(
                (arg(q), dt),
                (arg(k), dt),
                (arg(v), dt),
                spec.bias.map(|b| (arg(b), dt)),
                &spec.options,
            )
            .and_then(|p| p.launch())
        });
        match planned {
            Some(l) => {
                let l = l?;
                text.push_str(&format!(
                    "launch: grid {:?} block {:?} smem {}\n",
                    l.grid, l.block, l.shared_mem_bytes
                ));
                kernels.push(KernelInfo {
                    name: kname.clone(),
                    grid: l.grid,
                    block: l.block,
                    shared_mem_bytes: l.shared_mem_bytes,
                });
            }
            None => text.push_str("launch: made per call (symbolic shapes)\n"),
        }
        Ok(BuildOutput {
            files: vec![
                (format!("{kname}.cu"), src.into_bytes()),
                (format!("{kname}.cubin"), compiled.cubin),
                (format!("{name}.cutlass.txt"), text.into_bytes()),
            ],
            kernels,
            arch: Some(arch.to_string()),
        })
    }

    /// `compile` with this crate's error type.
    pub fn compile_function(&self, name: &str, func: &Function) -> Result<CutlassArtifact> {
        let (spec, _) = self.prepare(name, func)?;
        CutlassArtifact::new(name, spec, static_shapes(func), self.options)
    }
}

impl Backend for CutlassBackend {
    fn name(&self) -> &str {
        "cutlass"
    }

    fn patterns(&self) -> Vec<FusionPattern> {
        crate::patterns::table(self.options.bf16)
    }

    fn claim(&self, c: &Candidate<'_>) -> Claim {
        if is_attention(c.name, c.func) {
            return match analyse_attention(c.name, c.func) {
                Ok(_) => Claim::Accept,
                Err(Error::Unsupported { reason, .. }) => Claim::Decline { reason },
                Err(e) => Claim::Decline {
                    reason: e.to_string(),
                },
            };
        }
        match self.prepare(c.name, c.func) {
            Ok(_) => Claim::Accept,
            Err(Error::Unsupported { reason, .. }) => Claim::Decline { reason },
            Err(e) => Claim::Decline {
                reason: e.to_string(),
            },
        }
    }

    fn compile(&self, c: &Candidate<'_>) -> fusebox_core::Result<Box<dyn Artifact>> {
        if is_attention(c.name, c.func) {
            let spec = analyse_attention(c.name, c.func)?;
            return Ok(Box::new(AttentionArtifact::new(c.name, spec)?));
        }
        Ok(Box::new(self.compile_function(c.name, c.func)?))
    }

    fn build(&self, c: &Candidate<'_>) -> fusebox_core::Result<Option<BuildOutput>> {
        if is_attention(c.name, c.func) {
            return Ok(Some(self.build_attention(c.name, c.func)?));
        }
        let (spec, p) = self.prepare(c.name, c.func)?;
        let inst = self.build_instance(&spec, p.as_ref());
        let kname = inst.kernel_name();
        let src = emit(&inst);
        let arch = self.options.arch;
        let cache = fusebox_cuda::Cache::from_env();
        let compiled = compile_cached(
            cache.as_ref(),
            &src,
            &format!("{kname}.cu"),
            arch,
            &CompileOptions::default(),
        )
        .map_err(Error::from)?;
        let mut text = format!("{}: {spec}\ninstance: {kname}\n", c.name);
        if let Some(p) = p.as_ref() {
            text.push_str(&format!("path: {}\n", p.path(&spec, arch)));
        }
        let mut kernels = Vec::new();
        match p.as_ref().and_then(|p| {
            let (m, n, b) = p.mnb();
            inst.launch(m, n, b).map(|l| (p, l))
        }) {
            Some((p, l)) => {
                text.push_str(&format!(
                    "problem: {:?}\nout shape: {:?}\nlaunch: grid {:?} block {:?} smem {}\n",
                    p.shape, p.out_shape, l.grid, l.block, l.smem
                ));
                kernels.push(KernelInfo {
                    name: kname.clone(),
                    grid: l.grid,
                    block: l.block,
                    shared_mem_bytes: l.smem,
                });
            }
            None => text.push_str("launch: made per call (symbolic shapes)\n"),
        }
        Ok(Some(BuildOutput {
            files: vec![
                (format!("{kname}.cu"), src.into_bytes()),
                (format!("{kname}.cubin"), compiled.cubin),
                (format!("{}.cutlass.txt", c.name), text.into_bytes()),
            ],
            kernels,
            arch: Some(arch.to_string()),
        }))
    }
}
