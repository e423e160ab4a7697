//! The partition report after inference simplification (issue 19): with `configs/cpu.toml`
//! (simplification on by default), every conv2d of ResNet-50 lands in a FuseOps group with its
//! epilogue — the bias (FoldBatchNorm's shift), then the residual add and the ReLU where the
//! block has them — and no conv2d or batch_norm is left bare in `main`. The same holds for the
//! Hugging Face fixtures `resnet-ts` and `mobilenet-v2-ts` (bias, then ReLU / ReLU6 `clip` or
//! the residual add). With `[partition] simplify = false` ResNet-50's batch_norms stay, and no
//! conv2d group has a bias epilogue, which shows the switch does what it says.
//!
//! ResNet-50 is the onnx package's light model (`$ONNX_DATA_DIR/light/light_resnet50.onnx`,
//! the model `tests/ort/resnet50_random.py` randomises): the data folder is found as the
//! conformance tests find it (skipped without `ONNX_DATA_DIR`, a failure under
//! `FUSEBOX_REQUIRE_ONNX_DATA=1`, which `scripts/test.sh` sets).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

mod onnx_case;

use fusebox::core::config::Config;
use fusebox::core::frontend::onnx::import_onnx_file;
use fusebox::core::report::Report;
use std::collections::BTreeMap;
use std::path::Path;

fn report(model: &Path, simplify: bool) -> Report {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut config = Config::load(&root.join("configs/cpu.toml")).unwrap();
    config.partition.simplify = simplify;
    let pipeline = fusebox::pipeline(config).unwrap();
    let module = import_onnx_file(model).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    pipeline.run_for_report(&module).unwrap().report()
}

/// The op lists of the groups `main` calls that hold a conv2d, one entry per call, and the
/// ops left bare in `main`.
fn conv_groups(r: &Report) -> (Vec<Vec<String>>, Vec<String>) {
    let by_name: BTreeMap<&str, &Vec<String>> = r
        .functions
        .iter()
        .map(|f| (f.name.as_str(), &f.ops))
        .collect();
    let mut groups = Vec::new();
    let mut bare = Vec::new();
    for entry in &r.main {
        match entry.split_once(':') {
            Some(("op", op)) => bare.push(op.to_string()),
            Some((kind, name)) => {
                // A composite call names its pattern: its ops are those of the function
                // that holds that composite.
                let ops = match kind {
                    "composite" => r
                        .functions
                        .iter()
                        .find(|f| f.inner_composites.iter().any(|c| c == name))
                        .map(|f| &f.ops),
                    _ => by_name.get(name).copied(),
                }
                .unwrap_or_else(|| panic!("`{name}` is called but not reported"));
                if ops.iter().any(|o| o == "relax.nn.conv2d") {
                    groups.push(ops.to_vec());
                }
            }
            None => panic!("unexpected main entry `{entry}`"),
        }
    }
    (groups, bare)
}

/// Counts the groups by their op lists, after checking each is one conv2d followed by its
/// bias add and then only the epilogue ops `epilogue` allows.
fn epilogues(groups: &[Vec<String>], epilogue: &[&str]) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    for ops in groups {
        let convs = ops.iter().filter(|o| *o == "relax.nn.conv2d").count();
        assert_eq!(convs, 1, "one conv2d per group: {ops:?}");
        assert_eq!(ops[0], "relax.nn.conv2d", "{ops:?}");
        assert_eq!(
            ops.get(1).map(String::as_str),
            Some("relax.add"),
            "the conv's bias is in its group: {ops:?}"
        );
        for o in &ops[2..] {
            assert!(
                epilogue.contains(&o.as_str()),
                "`{o}` is not an epilogue op: {ops:?}"
            );
        }
        let short: Vec<&str> = ops.iter().map(|o| o.trim_start_matches("relax.")).collect();
        *kinds.entry(short.join(" ")).or_insert(0) += 1;
    }
    kinds
}

#[test]
fn resnet50_has_every_conv2d_in_a_group_with_its_epilogue() {
    let Some(dir) = onnx_case::data_dir_or_skip(
        "ONNX_DATA_DIR",
        "scripts/test.sh sets it to the onnx package's backend test data",
    ) else {
        return;
    };
    let model = dir.join("light/light_resnet50.onnx");
    let r = report(&model, true);
    let (groups, bare) = conv_groups(&r);
    assert_eq!(groups.len(), 53, "ResNet-50 has 53 conv2d");
    assert!(
        !bare
            .iter()
            .any(|o| o == "relax.nn.conv2d" || o == "relax.nn.batch_norm"),
        "bare in main: {bare:?}"
    );
    let kinds = epilogues(&groups, &["relax.add", "relax.nn.relu"]);
    // 33 convs with bias + ReLU, 16 block tails with bias + residual + ReLU, 4 projection
    // shortcuts with their bias (their sum is the residual of the block tail's group).
    let want: BTreeMap<String, usize> = [
        ("nn.conv2d add".to_string(), 4),
        ("nn.conv2d add add nn.relu".to_string(), 16),
        ("nn.conv2d add nn.relu".to_string(), 33),
    ]
    .into_iter()
    .collect();
    assert_eq!(kinds, want);
    // The classifier's transposed weight was folded: no permute_dims is left to run.
    assert!(!bare.iter().any(|o| o == "relax.permute_dims"), "{bare:?}");

    // `simplify = false`: the batch_norms stay between each conv2d and its epilogue.
    let r = report(&model, false);
    let (groups, bare) = conv_groups(&r);
    let bn_bare = bare.iter().filter(|o| *o == "relax.nn.batch_norm").count();
    let bn_grouped: usize = r
        .functions
        .iter()
        .map(|f| f.ops.iter().filter(|o| *o == "relax.nn.batch_norm").count())
        .sum();
    assert!(bn_bare + bn_grouped > 0, "no batch_norm without simplify");
    assert!(
        groups
            .iter()
            .all(|ops| ops.get(1).map(String::as_str) != Some("relax.add")),
        "without simplify no conv2d has a bias: {groups:?}"
    );
}

#[test]
fn hf_cnn_fixtures_have_every_conv2d_in_a_group_with_its_epilogue() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/models");
    for (fixture, convs, epilogue) in [
        ("resnet-ts", 8, &["relax.add", "relax.nn.relu"][..]),
        ("mobilenet-v2-ts", 52, &["relax.add", "relax.clip"][..]),
    ] {
        let model = root.join(fixture).join("model.onnx");
        assert!(model.exists(), "{} is missing", model.display());
        let r = report(&model, true);
        let (groups, bare) = conv_groups(&r);
        assert_eq!(groups.len(), convs, "{fixture}");
        assert!(
            !bare.iter().any(|o| o == "relax.nn.conv2d"),
            "{fixture}: bare in main: {bare:?}"
        );
        let kinds = epilogues(&groups, epilogue);
        assert!(kinds.len() >= 2, "{fixture}: {kinds:?}");
    }
}
