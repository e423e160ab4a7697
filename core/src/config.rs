//! The fusebox config: which backends, in which order, with which options and patterns.
//!
//! Contract: [`Config::parse`] reads TOML into typed tables with `deny_unknown_fields`
//! everywhere; every error names the file, line and column (TOML spans), and an unknown key or
//! enum value lists the valid ones. Names of backends are checked later, when the pipeline is
//! built (plugins add names), with [`Config::error_at`] pointing at the `name` value.
//!
//! ```toml
//! target = "cpu"                   # or "cuda"
//! [partition]
//! simplify = true                  # inference simplification first (constant folding,
//!                                  # batch_norm folding, identities and export noise removed)
//! bind_constants = true            # keep constants inside composites
//! annotate_codegen = true          # wrap composites in `Codegen` functions
//! merge_composites = false         # MergeCompositeFunctions
//! fuse_ops = true                  # FuseOps on what no pattern took
//! fuse_opt_level = 2
//! max_depth = 256
//! strict = false                   # unclaimed work is an error instead of running on the CPU
//! conv2d_layout = "auto"           # the backends' choice where it pays (default); "none": the
//!                                  # model's layouts; ["NHWC", "OHWI"]: ConvertLayout every
//!                                  # conv2d to these (split ones too: ["NCHW16c", "OIHW"])
//! [[backend]]
//! name = "cpu"
//! [backend.options]                # free table handed to that backend
//! [[pattern]]
//! name = "cpu.matmul_relu"
//! pattern = "relax.nn.relu(relax.matmul(_, _))"
//! priority = 0
//! backend = "cpu"                  # optional: the backend whose group it joins
//! [[plugin]]
//! path = "target/debug/libfusebox_plugin_conv2d.so"
//! [runtime]
//! memory_limit = "8GiB"            # largest tensor a run may allocate (bytes, or with a unit);
//!                                  # default 75% of the memory available (runtime::memory)
//! ```
//!
//! ```
//! let c = fusebox_core::config::Config::parse("target = \"cpu\"\n[[backend]]\nname = \"cpu\"\n", "c.toml").unwrap();
//! assert_eq!(c.backends[0].name, "cpu");
//! assert!(c.partition.fuse_ops);
//! ```

use crate::error::{Error, Result};
use crate::pattern_table::{entry_to_pattern, pos_of, toml_error};
use crate::transform::FusionPattern;
use serde::Deserialize;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// The device the module is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// The host CPU.
    Cpu,
    /// An NVIDIA GPU.
    Cuda,
}

/// Where key `key` is set in `src`: the first line that starts with it (after indentation)
/// followed by `=`, so a comment naming the key is passed over; 0 when there is none.
fn key_at(src: &str, key: &str) -> usize {
    let mut at = 0;
    for line in src.split_inclusive('\n') {
        let body = line.trim_start();
        if let Some(rest) = body.strip_prefix(key)
            && rest.trim_start().starts_with('=')
        {
            return at + (line.len() - body.len());
        }
        at += line.len();
    }
    0
}

/// `[partition]`: the passes before claims.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PartitionConfig {
    /// Run the inference simplification passes first
    /// ([`crate::transform::simplify_pipeline`]); `false` partitions the module as given, as
    /// TVM's FuseOpsByPattern does.
    pub simplify: bool,
    /// Keep constants inside composites (else they become parameters).
    pub bind_constants: bool,
    /// Wrap each composite in a public function with `Codegen`.
    pub annotate_codegen: bool,
    /// Merge neighbouring composites of one codegen (MergeCompositeFunctions).
    pub merge_composites: bool,
    /// Run FuseOps on what no pattern took.
    pub fuse_ops: bool,
    /// FuseOps level: 0 nothing, 1 elementwise/broadcast chains, 2 everything.
    pub fuse_opt_level: u32,
    /// FuseOps: the most bindings in one group.
    pub max_depth: usize,
    /// Unclaimed work is an error naming each op instead of falling back to the CPU.
    pub strict: bool,
    /// Which layouts every `conv2d` takes (ConvertLayout,
    /// [`mod@crate::transform::convert_layout`], after simplification): see
    /// [`Conv2dLayout`].
    pub conv2d_layout: Conv2dLayout,
}

/// `[partition] conv2d_layout`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawConv2dLayout")]
pub enum Conv2dLayout {
    /// `"auto"` (the default): the layouts the first backend that prefers some for this
    /// target and machine names ([`crate::backend::Backend::conv2d_layout`]: the `cpu`
    /// backend's `NCHW16c` on AVX-512 or AVX2), kept only where the conversion pays
    /// ([`crate::transform::LayoutCost::pays`]: the convolutions move into the layout, and
    /// the layout changes left at run time are small beside them); else the model's own.
    #[default]
    Auto,
    /// `"none"`: the model's own layouts.
    Keep,
    /// `[data, kernel]`: every `conv2d` into these (`["NHWC", "OHWI"]`, what the `cutlass`
    /// backend's conv2d needs; split ones too: `["NCHW16c", "OIHW"]`).
    Fixed([String; 2]),
}

impl Conv2dLayout {
    /// The `[data, kernel]` layouts of [`Conv2dLayout::Fixed`].
    pub fn fixed(&self) -> Option<&[String; 2]> {
        match self {
            Conv2dLayout::Fixed(l) => Some(l),
            _ => None,
        }
    }
}

/// `conv2d_layout` as written: a word or a pair of layouts.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawConv2dLayout {
    Word(String),
    Pair([String; 2]),
}

impl TryFrom<RawConv2dLayout> for Conv2dLayout {
    type Error = String;
    fn try_from(r: RawConv2dLayout) -> std::result::Result<Self, String> {
        match r {
            RawConv2dLayout::Word(w) if w == "auto" => Ok(Conv2dLayout::Auto),
            RawConv2dLayout::Word(w) if w == "none" => Ok(Conv2dLayout::Keep),
            RawConv2dLayout::Word(w) => Err(format!(
                "conv2d_layout: expected \"auto\", \"none\" or [data, kernel] layouts, found \"{w}\""
            )),
            RawConv2dLayout::Pair(p) => Ok(Conv2dLayout::Fixed(p)),
        }
    }
}

impl Default for PartitionConfig {
    fn default() -> Self {
        PartitionConfig {
            simplify: true,
            bind_constants: true,
            annotate_codegen: true,
            merge_composites: false,
            fuse_ops: true,
            fuse_opt_level: 2,
            max_depth: 256,
            strict: false,
            conv2d_layout: Conv2dLayout::Auto,
        }
    }
}

/// `[runtime]`: how models run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// `memory_limit`: the largest tensor a run may allocate, in bytes (`None`: the default of
    /// [`crate::runtime::memory`]).
    pub memory_limit: Option<u64>,
}

/// One `[[backend]]` table.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendEntry {
    /// The backend's name.
    pub name: String,
    /// Where the name is in the file (for errors).
    pub span: Range<usize>,
    /// `[backend.options]`, empty when absent.
    pub options: toml::Table,
}

/// One `[[pattern]]` table: a user pattern.
#[derive(Clone, Debug)]
pub struct UserPattern {
    /// The pattern entry.
    pub pattern: FusionPattern,
    /// The backend whose group it joins (else the backend named by the codegen prefix, else
    /// the end of the table).
    pub backend: Option<String>,
    /// Where the `backend` value is (for errors).
    pub backend_span: Option<Range<usize>>,
}

/// One `[[plugin]]` table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginEntry {
    /// The shared library, as written (relative paths are relative to the working directory).
    pub path: PathBuf,
    /// Where the path is in the file (for errors).
    pub span: Range<usize>,
}

/// A parsed config (see the module doc).
#[derive(Clone, Debug)]
pub struct Config {
    /// The file name, for errors.
    pub file: String,
    /// The source text, for errors.
    pub src: String,
    /// `target`.
    pub target: Target,
    /// `[partition]`.
    pub partition: PartitionConfig,
    /// `[[backend]]` tables in file order.
    pub backends: Vec<BackendEntry>,
    /// `[[pattern]]` tables in file order.
    pub patterns: Vec<UserPattern>,
    /// `[[plugin]]` tables in file order.
    pub plugins: Vec<PluginEntry>,
    /// `[runtime]`.
    pub runtime: RuntimeConfig,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    target: Option<Target>,
    #[serde(default)]
    partition: PartitionConfig,
    #[serde(default)]
    backend: Vec<RawBackend>,
    #[serde(default)]
    pattern: Vec<RawPattern>,
    #[serde(default)]
    plugin: Vec<RawPlugin>,
    #[serde(default)]
    runtime: RawRuntime,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRuntime {
    /// Bytes (an integer) or a size with a unit (a string).
    #[serde(default)]
    memory_limit: Option<Spanned<toml::Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    name: Spanned<String>,
    #[serde(default)]
    options: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPattern {
    name: Spanned<String>,
    pattern: Spanned<String>,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    check: Option<Spanned<String>>,
    #[serde(default)]
    backend: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlugin {
    path: Spanned<String>,
}

impl Config {
    /// Parses a config text; `file` names it in errors.
    pub fn parse(src: &str, file: &str) -> Result<Config> {
        let raw: RawConfig = toml::from_str(src).map_err(|e| toml_error(file, src, &e))?;
        let mut cfg = Config {
            file: file.to_string(),
            src: src.to_string(),
            target: raw.target.unwrap_or(Target::Cpu),
            partition: raw.partition,
            backends: Vec::new(),
            patterns: Vec::new(),
            plugins: Vec::new(),
            runtime: RuntimeConfig::default(),
        };
        if let Some(m) = &raw.runtime.memory_limit {
            let parsed = match m.get_ref() {
                toml::Value::Integer(i) if *i > 0 => Ok(i.unsigned_abs()),
                toml::Value::Integer(i) => Err(format!("the limit must be above 0, found {i}")),
                toml::Value::String(t) => crate::runtime::memory::parse_size(t),
                v => Err(format!(
                    "expected a byte count or a size string such as \"8GiB\", found a {}",
                    v.type_str()
                )),
            };
            cfg.runtime.memory_limit = Some(
                parsed.map_err(|e| cfg.error_at(m.span(), format!("runtime.memory_limit: {e}")))?,
            );
        }
        for b in raw.backend {
            if let Some(prev) = cfg.backends.iter().find(|x| x.name == *b.name.get_ref()) {
                let _ = prev;
                return Err(cfg.error_at(
                    b.name.span(),
                    format!("backend `{}` is listed twice", b.name.get_ref()),
                ));
            }
            cfg.backends.push(BackendEntry {
                name: b.name.get_ref().clone(),
                span: b.name.span(),
                options: b.options,
            });
        }
        for p in raw.pattern {
            let pattern =
                entry_to_pattern(src, file, &p.name, &p.pattern, p.priority, p.check.as_ref())?;
            cfg.patterns.push(UserPattern {
                pattern,
                backend: p.backend.as_ref().map(|b| b.get_ref().clone()),
                backend_span: p.backend.as_ref().map(|b| b.span()),
            });
        }
        for p in raw.plugin {
            if p.path.get_ref().is_empty() {
                return Err(cfg.error_at(p.path.span(), "a plugin path must not be empty"));
            }
            cfg.plugins.push(PluginEntry {
                path: PathBuf::from(p.path.get_ref()),
                span: p.path.span(),
            });
        }
        if let Some([data, kernel]) = cfg.partition.conv2d_layout.fixed() {
            for (what, layout, letters) in [("data", data, "NCHW"), ("kernel", kernel, "OIHW")] {
                if crate::op::Layout::parse(layout, letters).is_none() {
                    return Err(Error::source(
                        file,
                        src,
                        pos_of(src, key_at(src, "conv2d_layout")),
                        format!(
                            "conv2d_layout: the {what} layout must be a permutation of {letters}, \
                             each axis possibly split by a sub-axis (\"{letters}16{}\"), found \
                             \"{layout}\"",
                            letters.as_bytes()[1].to_ascii_lowercase() as char
                        ),
                    ));
                }
            }
        }
        if cfg.partition.fuse_opt_level > 2 {
            return Err(Error::source(
                file,
                src,
                pos_of(src, key_at(src, "fuse_opt_level")),
                format!(
                    "fuse_opt_level must be 0, 1 or 2, found {}",
                    cfg.partition.fuse_opt_level
                ),
            ));
        }
        Ok(cfg)
    }

    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<Config> {
        let src = std::fs::read_to_string(path).map_err(|e| Error::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        Config::parse(&src, &path.display().to_string())
    }

    /// An error positioned at byte range `span` of the config.
    pub fn error_at(&self, span: Range<usize>, message: impl Into<String>) -> Error {
        Error::source(
            &self.file,
            &self.src,
            pos_of(&self.src, span.start),
            message,
        )
    }

    /// The entry of backend `name`, if listed.
    pub fn backend(&self, name: &str) -> Option<&BackendEntry> {
        self.backends.iter().find(|b| b.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(src: &str) -> String {
        Config::parse(src, "c.toml")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn runtime_memory_limit_takes_bytes_or_sizes() {
        let limit = |src: &str| Config::parse(src, "c.toml").map(|c| c.runtime.memory_limit);
        assert_eq!(limit("").ok(), Some(None));
        assert_eq!(
            limit("[runtime]\nmemory_limit = \"8GiB\"\n").ok(),
            Some(Some(8 << 30))
        );
        assert_eq!(
            limit("[runtime]\nmemory_limit = 4096\n").ok(),
            Some(Some(4096))
        );
        let e = err("[runtime]\nmemory_limit = \"lots\"\n");
        assert!(
            e.starts_with("c.toml:2:16: runtime.memory_limit: invalid size `lots`"),
            "{e}"
        );
        let e = err("[runtime]\nmemory_limit = -5\n");
        assert!(e.contains("the limit must be above 0, found -5"), "{e}");
        let e = err("[runtime]\nmemory_limt = 5\n");
        assert!(e.contains("memory_limt"), "{e}");
    }

    #[test]
    fn defaults_and_full_config() {
        let c = match Config::parse(
            "target = \"cuda\"\n[partition]\nstrict = true\n[[backend]]\nname = \"cpu\"\n[backend.options]\nx = 1\n[[pattern]]\nname = \"cpu.r\"\npattern = \"relax.nn.relu(_)\"\nbackend = \"cpu\"\n[[plugin]]\npath = \"a.so\"\n",
            "c.toml",
        ) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(c.target, Target::Cuda);
        assert!(c.partition.strict && c.partition.fuse_ops);
        assert_eq!(c.backends[0].options.len(), 1);
        assert_eq!(c.patterns[0].backend.as_deref(), Some("cpu"));
        assert_eq!(c.plugins[0].path, PathBuf::from("a.so"));
    }

    #[test]
    fn errors_are_positioned_and_list_valid_names() {
        let e = err("target = \"cpu\"\nflavour = 1\n");
        assert!(e.starts_with("c.toml:2:1: unknown field `flavour`"), "{e}");
        assert!(e.contains("`partition`") && e.contains("`plugin`"), "{e}");
        let e = err("[partition]\nfuse_opps = true\n");
        assert!(
            e.starts_with("c.toml:2:1: unknown field `fuse_opps`"),
            "{e}"
        );
        assert!(e.contains("`fuse_ops`"), "{e}");
        let e = err("target = \"tpu\"\n");
        assert!(e.starts_with("c.toml:1:10: unknown variant `tpu`"), "{e}");
        assert!(e.contains("`cpu`") && e.contains("`cuda`"), "{e}");
        let e = err("[[pattern]]\nname = \"a.b\"\npattern = \"relax.nn.relu(\"\n");
        assert!(e.starts_with("c.toml:3:"), "{e}");
        let e = err("[[backend]]\nname = \"cpu\"\n[[backend]]\nname = \"cpu\"\n");
        assert!(
            e.starts_with("c.toml:4:8: backend `cpu` is listed twice"),
            "{e}"
        );
        let e = err("[partition]\nfuse_opt_level = 7\n");
        assert!(e.starts_with("c.toml:2:1: fuse_opt_level must be"), "{e}");
        let e = err("[partition]\nsimplify = \"yes\"\n");
        assert!(e.starts_with("c.toml:2:12: invalid type"), "{e}");
        let e = err("[partition]\nsimplfy = false\n");
        assert!(e.contains("`simplify`"), "{e}");
    }

    #[test]
    fn conv2d_layout_takes_a_data_and_a_kernel_layout() {
        let c = Config::parse(
            "[partition]\nconv2d_layout = [\"NHWC\", \"OHWI\"]\n",
            "c.toml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.partition.conv2d_layout,
            Conv2dLayout::Fixed(["NHWC".to_string(), "OHWI".to_string()])
        );
        assert_eq!(
            Config::parse("", "c.toml").unwrap().partition.conv2d_layout,
            Conv2dLayout::Auto
        );
        for (src, want) in [
            ("\"auto\"", Conv2dLayout::Auto),
            ("\"none\"", Conv2dLayout::Keep),
        ] {
            let c = Config::parse(&format!("[partition]\nconv2d_layout = {src}\n"), "c.toml")
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(c.partition.conv2d_layout, want);
        }
        let e = err("[partition]\nconv2d_layout = \"NHWC\"\n");
        assert!(
            e.starts_with("c.toml:2:17:") && e.contains("expected \"auto\", \"none\""),
            "{e}"
        );
        let c = Config::parse(
            "[partition]\nconv2d_layout = [\"NCHW16c\", \"OIHW16i16o\"]\n",
            "c.toml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(c.partition.conv2d_layout.fixed().is_some());
        let e = err("[partition]\nconv2d_layout = [\"NCHW16\", \"OIHW\"]\n");
        assert!(e.contains("sub-axis"), "{e}");
        let e = err("[partition]\nconv2d_layout = [\"NHWC\", \"OHW\"]\n");
        assert!(
            e.contains("c.toml:2:1") && e.contains("permutation of OIHW"),
            "{e}"
        );
        let e = err("[partition]\nconv2d_layout = [\"NCHX\", \"OIHW\"]\n");
        assert!(
            e.contains("permutation of NCHW") && e.contains("NCHX"),
            "{e}"
        );
        // A comment naming the key does not take the error's position.
        let e =
            err("# conv2d_layout is auto\n[partition]\n  conv2d_layout = [\"NHWC\", \"OHX\"]\n");
        assert!(e.contains("c.toml:3:3"), "{e}");
        let e = err("[partition]\nconv2d_layout = [\"NHWC\"]\n");
        assert!(e.contains("conv2d_layout"), "{e}");
    }

    #[test]
    fn simplify_defaults_to_true_and_can_be_turned_off() {
        let on = Config::parse("target = \"cpu\"\n", "c.toml").unwrap_or_else(|e| panic!("{e}"));
        assert!(on.partition.simplify);
        let off = Config::parse("[partition]\nsimplify = false\n", "c.toml")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!off.partition.simplify);
    }
}
