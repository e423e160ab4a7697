//! The `fusebox` facade: re-exports fusebox-core, links every built-in backend crate so that
//! their `inventory` registrations are kept by the linker, loads plugins, and runs a
//! partitioned module with each function's compiled artifact.
//!
//! Contract: [`link_backends`] references every backend crate (today: `fusebox-cpu`,
//! `fusebox-cublas`);
//! [`pipeline`] builds the config's [`BackendPipeline`] with the plugin loader of
//! `fusebox-plugin-host`; [`execute`] runs a function of a [`Plan`]'s module, calling the
//! compiled artifact for every unit of work and the CPU reference for the ops left in `main`.
//!
//! ```no_run
//! let config = fusebox::core::config::Config::load("configs/cpu.toml".as_ref())?;
//! let pipeline = fusebox::pipeline(config)?;
//! let module = fusebox::core::text::read_module("examples/conv2d_relu.relax".as_ref())?;
//! let plan = pipeline.run(&module)?;
//! println!("{}", plan.report().to_json());
//! # Ok::<(), fusebox::Error>(())
//! ```

pub use fusebox_core as core;
pub use fusebox_cpu as cpu;
pub use fusebox_cublas as cublas;

use fusebox_core::backend::pipeline::{BackendPipeline, Plan};
use fusebox_core::config::Config;
use fusebox_core::runtime::{Placement, Value, host_args};

/// Every error of the facade.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// From fusebox-core (parsing, configs, passes, backends).
    #[error(transparent)]
    Core(#[from] fusebox_core::Error),
    /// From the CPU reference executor.
    #[error(transparent)]
    Cpu(#[from] fusebox_cpu::Error),
}

/// The result type of the facade.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// References every built-in backend crate so the linker keeps their registrations.
pub fn link_backends() {
    fusebox_cpu::link();
    fusebox_cublas::link();
}

/// The names of the built-in backends this build must register (checked by a test).
pub const BUILT_IN_BACKENDS: &[&str] = &["cpu", "cublas"];

/// Builds the backend pipeline of `config`, loading its plugins.
pub fn pipeline(config: Config) -> Result<BackendPipeline> {
    link_backends();
    let loader = |p: &std::path::Path| fusebox_plugin_host::load(p);
    Ok(BackendPipeline::new(config, Some(&loader))?)
}

/// Runs `func` of the plan's module on `args`: calls of compiled functions go to their
/// artifacts, everything else to the CPU reference. Data moves only where the placement
/// changes: a host artifact ([`Placement::Host`]) and the CPU ops get device values
/// downloaded, a device artifact gets values as they are. The result may hold device
/// values; [`Value::to_host`] downloads them (as `fusebox run` does for its outputs).
pub fn execute(plan: &Plan, func: &str, args: Vec<Value>) -> Result<Value> {
    let hook = |name: &str, vals: &[Value]| {
        plan.artifacts.get(name).map(|a| match a.placement() {
            Placement::Device => a.run(vals),
            Placement::Host => a.run(&host_args(vals)?),
        })
    };
    Ok(fusebox_cpu::run_with(
        &plan.module,
        func,
        args,
        Some(&hook),
    )?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn registry_holds_exactly_the_built_in_backends() {
        super::link_backends();
        let names = fusebox_core::backend::registered_names().unwrap_or_default();
        assert_eq!(names, super::BUILT_IN_BACKENDS);
    }
}
