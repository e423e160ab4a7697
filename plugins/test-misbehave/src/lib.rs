//! A test plugin that misbehaves on request: backend `misbehave`, one pattern
//! `misbehave.relu`, and `mode` in its options selects the fault: `claim_panic`,
//! `claim_error`, `compile_panic`, `compile_error`, `run_error`, `run_panic`, `create_error`,
//! `wrong_result` (runs relu(x) + 1: a wrong answer that only `--check` catches), or `ok`
//! (claims `misbehave.*` composites and runs relu).
//!
//! A fault of the table itself cannot wait for the options (the host checks the table when it
//! loads the library, before any `create`): with the environment variable
//! `FUSEBOX_TEST_MISBEHAVE_TABLE=null_callbacks` the entry point returns a table whose `claim`
//! and `free_string` callbacks are NULL.

use fusebox_plugin_abi::sdk::{
    OwnedTensor, Plugin, PluginArtifact, StaticVTable, TensorView, Verdict,
};
use std::ffi::CStr;

/// The plugin, with its fault.
pub struct Misbehave {
    mode: String,
}

/// A relu (or a failing run).
pub struct Relu {
    mode: String,
}

#[allow(clippy::panic, reason = "panicking on purpose is this plugin's job")]
impl PluginArtifact for Relu {
    fn run(&self, args: &[TensorView<'_>]) -> Result<OwnedTensor, String> {
        match self.mode.as_str() {
            "run_error" => return Err("run failed on purpose".into()),
            "run_panic" => panic!("run panicked on purpose"),
            _ => {}
        }
        let t = args.first().ok_or("no argument")?;
        let d = t.as_f32().ok_or("not f32")?;
        let off = if self.mode == "wrong_result" {
            1.0
        } else {
            0.0
        };
        Ok(OwnedTensor {
            shape: t.shape.clone(),
            data: d.iter().map(|v| v.max(0.0) + off).collect(),
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
                mode: m.to_string(),
            }),
        }
    }
}

/// The table with NULL `claim` and `free_string` (see the crate doc).
static NULL_CALLBACKS: StaticVTable = StaticVTable::from_table({
    let mut t = StaticVTable::new::<Misbehave>().table();
    t.claim = None;
    t.free_string = None;
    t
});

/// The entry point: the plugin's table, or a broken one (see the crate doc).
#[allow(unsafe_code, reason = "the one exported C symbol of the plugin")]
#[unsafe(no_mangle)]
pub extern "C" fn fusebox_plugin_entry_v1() -> *const fusebox_plugin_abi::PluginVTable {
    static VTABLE: StaticVTable = StaticVTable::new::<Misbehave>();
    match std::env::var("FUSEBOX_TEST_MISBEHAVE_TABLE").as_deref() {
        Ok("null_callbacks") => NULL_CALLBACKS.as_ptr(),
        _ => VTABLE.as_ptr(),
    }
}
