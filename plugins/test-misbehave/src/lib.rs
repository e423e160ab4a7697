//! A test plugin that misbehaves on request: backend `misbehave`, one pattern
//! `misbehave.relu`, and `mode` in its options selects the fault: `claim_panic`,
//! `claim_error`, `compile_panic`, `compile_error`, `run_error`, `create_error`, or `ok`
//! (claims `misbehave.*` composites and runs relu).

use fusebox_plugin_abi::sdk::{OwnedTensor, Plugin, PluginArtifact, TensorView, Verdict};
use std::ffi::CStr;

/// The plugin, with its fault.
pub struct Misbehave {
    mode: String,
}

/// A relu (or a failing run).
pub struct Relu {
    fail: bool,
}

impl PluginArtifact for Relu {
    fn run(&self, args: &[TensorView<'_>]) -> Result<OwnedTensor, String> {
        if self.fail {
            return Err("run failed on purpose".into());
        }
        let t = args.first().ok_or("no argument")?;
        let d = t.as_f32().ok_or("not f32")?;
        Ok(OwnedTensor {
            shape: t.shape.clone(),
            data: d.iter().map(|v| v.max(0.0)).collect(),
        })
    }
}

#[allow(clippy::panic, reason = "panicking on purpose is this plugin's job")]
impl Plugin for Misbehave {
    const NAME: &'static CStr = c"misbehave";
    const VERSION: &'static CStr = c"0.0.1";
    const PATTERNS: &'static CStr =
        c"[[pattern]]\nname = \"misbehave.relu\"\npattern = \"relax.nn.relu(_)\"\n";
    type Artifact = Relu;
    fn create(options_toml: &str) -> Result<Self, String> {
        // The options are `mode = "..."` (or empty): no TOML parser needed for this test.
        let mode = options_toml.split('"').nth(1).unwrap_or("ok").to_string();
        if mode == "create_error" {
            return Err("create failed on purpose".into());
        }
        Ok(Misbehave { mode })
    }
    fn claim(&self, module_text: &str, _f: &str) -> Result<Verdict, String> {
        match self.mode.as_str() {
            "claim_panic" => panic!("claim panicked on purpose"),
            "claim_error" => Err("claim failed on purpose".into()),
            _ if module_text.contains("misbehave.relu") => Ok(Verdict::Accept),
            _ => Ok(Verdict::Decline("not a misbehave.relu composite".into())),
        }
    }
    fn compile(&self, _m: &str, _f: &str) -> Result<Relu, String> {
        match self.mode.as_str() {
            "compile_panic" => panic!("compile panicked on purpose"),
            "compile_error" => Err("compile failed on purpose".into()),
            m => Ok(Relu {
                fail: m == "run_error",
            }),
        }
    }
}

fusebox_plugin_abi::export_plugin!(Misbehave);
