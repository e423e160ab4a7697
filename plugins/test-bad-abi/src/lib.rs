//! A test plugin whose entry point reports ABI major version 999: the host must refuse it
//! before touching anything but the table's header.

use fusebox_plugin_abi::sdk::{
    OwnedTensor, Plugin, PluginArtifact, StaticVTable, TensorView, Verdict,
};
use std::ffi::CStr;

/// The plugin.
pub struct BadAbi;

/// Never made.
pub struct Never;

impl PluginArtifact for Never {
    fn run(&self, _args: &[TensorView<'_>]) -> Result<OwnedTensor, String> {
        Err("never".into())
    }
}

impl Plugin for BadAbi {
    const NAME: &'static CStr = c"bad_abi";
    const VERSION: &'static CStr = c"0.0.0";
    const PATTERNS: &'static CStr = c"";
    type Artifact = Never;
    fn create(_options_toml: &str) -> Result<Self, String> {
        Ok(BadAbi)
    }
    fn claim(&self, _m: &str, _f: &str) -> Result<Verdict, String> {
        Ok(Verdict::Decline("never".into()))
    }
    fn compile(&self, _m: &str, _f: &str) -> Result<Never, String> {
        Err("never".into())
    }
}

/// The entry point, claiming ABI 999.
#[allow(unsafe_code, reason = "the one exported C symbol of the plugin")]
#[unsafe(no_mangle)]
pub extern "C" fn fusebox_plugin_entry_v1() -> *const fusebox_plugin_abi::PluginVTable {
    static VTABLE: StaticVTable = StaticVTable::with_major::<BadAbi>(999);
    VTABLE.as_ptr()
}
