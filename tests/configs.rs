//! Every shipped config parses; those without plugins also build their pipeline.

use fusebox::core::config::Config;
use std::path::Path;

#[test]
fn every_shipped_config_loads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut files = Vec::new();
    for dir in [root.clone(), root.join("examples")] {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            panic!("no {}", dir.display())
        };
        for e in rd.flatten() {
            if e.path().extension().is_some_and(|x| x == "toml") {
                files.push(e.path());
            }
        }
    }
    files.sort();
    assert!(files.len() >= 8, "{files:?}");
    for f in files {
        let c = Config::load(&f).unwrap_or_else(|e| panic!("{e}"));
        if c.plugins.is_empty() {
            fusebox::pipeline(c).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        }
    }
}
