//! ONNX backend node conformance: every tensor case of the `onnx` wheel's node test generators
//! (written out by `tests/onnx/gen_node_cases.py`, which `scripts/test.sh` runs), imported,
//! run on the CPU reference and compared with the expected outputs under each case's own
//! tolerances.
//!
//! Prints `node conformance: P/N passed` (with onnxruntime's count on the same cases), then
//! every failing case grouped by op type with its reason. It fails when a case panics, or when
//! fewer cases pass than [`FLOOR`] (the count this commit reached: raise it as ops land).
//!
//! Integer inputs of rank 0 or 1 and scalar inputs (shapes, axes, pads, `k`, …) are bound as
//! constants before import ([`Bind::ShapeLike`]): exporters write them as constants, and
//! fusebox needs them at import time to type the graph statically. A case whose import still
//! asks for a constant (`Resize`'s float `scales`/`roi`) is tried once more with every rank-1
//! input bound ([`Bind::Rank1`]).
//!
//! ```text
//! .venv/bin/python tests/onnx/gen_node_cases.py --out target/onnx-node --ort
//! ONNX_NODE_DIR=target/onnx-node cargo test --test onnx_node -- --nocapture
//! ```

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

mod onnx_case;

use onnx_case::{Bind, Case, run_case};
use std::collections::BTreeMap;

/// The fewest cases that must pass.
const FLOOR: usize = 1529;

struct Entry {
    name: String,
    ops: Vec<String>,
    rtol: f64,
    atol: f64,
    ort: Option<String>,
}

fn entry(v: &serde_json::Value) -> Option<Entry> {
    Some(Entry {
        name: v.get("name")?.as_str()?.to_string(),
        ops: v
            .get("ops")?
            .as_array()?
            .iter()
            .filter_map(|o| o.as_str().map(str::to_string))
            .collect(),
        rtol: v.get("rtol")?.as_f64()?,
        atol: v.get("atol")?.as_f64()?,
        ort: v.get("ort").and_then(|o| o.as_str()).map(str::to_string),
    })
}

/// The cases of `dir/manifest.json`.
fn entries(dir: &std::path::Path) -> Vec<Entry> {
    let manifest = dir.join("manifest.json");
    let text = std::fs::read_to_string(&manifest)
        .unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
    let json: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
    json.as_array()
        .unwrap_or_else(|| panic!("{}: not a list", manifest.display()))
        .iter()
        .map(|v| entry(v).unwrap_or_else(|| panic!("{}: bad entry {v}", manifest.display())))
        .collect()
}

/// fusebox's extra cases (`tests/onnx/gen_extra_cases.py`: parts of ops the node suite leaves
/// out, with onnxruntime's outputs, committed): every one must pass.
#[test]
fn extra_cases_match_onnxruntime() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/extra");
    let entries = entries(&dir);
    assert!(entries.len() >= 57, "only {} extra cases", entries.len());
    let mut failed = Vec::new();
    for e in &entries {
        match run_case(&dir.join(&e.name), e.rtol, e.atol, Bind::ShapeLike) {
            Case::Pass => {}
            Case::Skipped(why) | Case::Fail(why) => failed.push(format!("{}: {why}", e.name)),
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn a_missing_node_dir_skips_or_fails_as_the_environment_says() {
    let (ok, text) = onnx_case::rerun_without("ONNX_NODE_DIR", "node_conformance", false);
    assert!(
        ok && text.contains("skipped: ONNX_NODE_DIR is not set"),
        "{text}"
    );
    let (ok, text) = onnx_case::rerun_without("ONNX_NODE_DIR", "node_conformance", true);
    assert!(
        !ok && text.contains("FUSEBOX_REQUIRE_ONNX_DATA=1 but ONNX_NODE_DIR is not set"),
        "{text}"
    );
}

#[test]
fn node_conformance() {
    if std::env::var_os("ONNX_NODE_DIR").is_none() && std::env::var_os("CI").is_some() {
        panic!("ONNX_NODE_DIR is not set: scripts/test.sh generates the node cases")
    }
    let Some(dir) =
        onnx_case::data_dir_or_skip("ONNX_NODE_DIR", "scripts/test.sh generates the cases")
    else {
        return;
    };
    let entries = entries(&dir);
    assert!(
        entries.len() > 1000,
        "only {} cases in the manifest",
        entries.len()
    );
    // Reasons are grouped by op type: `op -> [(case, reason)]`, in op order.
    let mut failures: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut panics = Vec::new();
    let (mut passed, mut ort_passed, mut both) = (0, 0, 0);
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for e in &entries {
        let ort_ok = e.ort.as_deref() == Some("pass");
        ort_passed += usize::from(ort_ok);
        let case_dir = dir.join(&e.name);
        let r = std::panic::catch_unwind(|| {
            match run_case(&case_dir, e.rtol, e.atol, Bind::ShapeLike) {
                // An input the importer needs as a constant that is not integer (`Resize`'s
                // float `scales`): bind the rank-1 inputs too and try once more.
                Case::Fail(why) if why.starts_with("import:") && why.contains("constant") => {
                    run_case(&case_dir, e.rtol, e.atol, Bind::Rank1)
                }
                other => other,
            }
        });
        let why = match r {
            Ok(Case::Pass) => {
                passed += 1;
                both += usize::from(ort_ok);
                continue;
            }
            Ok(Case::Skipped(why)) => format!("unsupported: {why}"),
            Ok(Case::Fail(why)) => why,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_string()))
                    .unwrap_or_default();
                panics.push(format!("{}: {msg}", e.name));
                format!("PANIC: {msg}")
            }
        };
        // Shorten the reason: the model path adds nothing.
        let why = why.replace(&format!("{}/", case_dir.display()), "");
        failures
            .entry(e.ops.join("+"))
            .or_default()
            .push((e.name.clone(), why));
    }
    std::panic::set_hook(hook);
    println!(
        "node conformance: {passed}/{} passed (onnxruntime passes {ort_passed}; {both} pass on both)",
        entries.len()
    );
    let mut groups: Vec<(&String, &Vec<(String, String)>)> = failures.iter().collect();
    groups.sort_by_key(|(op, v)| (std::cmp::Reverse(v.len()), (*op).clone()));
    for (op, cases) in groups {
        println!("FAIL {op} ({} cases)", cases.len());
        for (name, why) in cases {
            let one_line: String = why.lines().next().unwrap_or("").chars().take(240).collect();
            println!("  {name}: {one_line}");
        }
    }
    assert!(panics.is_empty(), "cases panicked:\n{}", panics.join("\n"));
    assert!(
        passed >= FLOOR,
        "only {passed} cases pass; the floor is {FLOOR}"
    );
}
