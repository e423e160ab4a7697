//! ONNX external data: side files next to the model.

use super::*;
use std::path::{Path, PathBuf};

/// A fresh, empty folder under the system temp dir.
fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "fusebox-ext-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn entry(k: &str, v: &str) -> StringStringEntryProto {
    StringStringEntryProto {
        key: k.into(),
        value: v.into(),
    }
}

/// `y = x + w` with `w: f32[2, 3]` stored externally at `location`, `offset`, `length`.
fn ext_model(location: &str, offset: Option<u64>, length: Option<u64>) -> Vec<u8> {
    let mut ext = vec![entry("location", location)];
    if let Some(o) = offset {
        ext.push(entry("offset", &o.to_string()));
    }
    if let Some(l) = length {
        ext.push(entry("length", &l.to_string()));
    }
    let w = TensorProto {
        name: "w".into(),
        dims: vec![2, 3],
        data_type: 1,
        data_location: 1,
        external_data: ext,
        ..Default::default()
    };
    model(
        17,
        vec![node("Add", "add", &["x", "w"], &["y"], vec![])],
        vec![vi("x", 1, &["2", "3"])],
        vec![w],
        &["y"],
    )
}

const W: [f32; 6] = [1.0, -2.0, 3.5, 0.25, 8.0, -0.5];

/// Writes `model.onnx` and a side file `weights.bin` holding 8 junk bytes, then `W`.
fn write(dir: &Path, model_bytes: &[u8]) {
    std::fs::write(dir.join("model.onnx"), model_bytes).unwrap();
    let mut data = vec![0xAB; 8];
    data.extend(W.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(dir.join("weights.bin"), data).unwrap();
}

fn weight_values(m: &Module) -> Vec<f32> {
    let f = m.get("main").unwrap();
    let c = f
        .exprs
        .iter()
        .find_map(|(_, d)| match &d.kind {
            ExprKind::Const(c) if c.shape == [2, 3] => Some(c.clone()),
            _ => None,
        })
        .expect("the weight constant");
    (0..6).map(|i| c.get_f64(i).unwrap() as f32).collect()
}

#[test]
fn reads_the_range_from_the_side_file() {
    let d = tmp("ok");
    write(&d, &ext_model("weights.bin", Some(8), Some(24)));
    let m = import_onnx_file(&d.join("model.onnx")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(weight_values(&m), W);
    // The folder names the model too.
    let m2 = import_onnx_file(&d).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(weight_values(&m2), W);
    // `./` prefixes are fine.
    write(&d, &ext_model("./weights.bin", Some(8), None));
    let m3 = import_onnx_file(&d.join("model.onnx")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(weight_values(&m3), W);
}

fn err_of(dir: &Path, bytes: &[u8]) -> String {
    std::fs::write(dir.join("model.onnx"), bytes).unwrap();
    match import_onnx_file(&dir.join("model.onnx")) {
        Ok(_) => panic!("imported a model with bad external data"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn locations_outside_the_folder_are_errors() {
    let d = tmp("escape");
    write(&d, &ext_model("weights.bin", Some(8), Some(24)));
    for loc in ["../weights.bin", "/etc/passwd", "sub/../../x", ""] {
        let e = err_of(&d, &ext_model(loc, None, None));
        assert!(
            e.contains("relative path inside the model's folder"),
            "{loc}: {e}"
        );
        assert!(e.contains("initializer `w`"), "{loc}: {e}");
    }
    // A symlink that leads out of the folder.
    let outside = tmp("outside");
    std::fs::write(outside.join("secret.bin"), [0u8; 24]).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.bin"), d.join("link.bin")).unwrap();
    let e = err_of(&d, &ext_model("link.bin", None, None));
    assert!(e.contains("outside the model's folder"), "{e}");
}

#[test]
fn bad_ranges_and_files_are_errors() {
    let d = tmp("range");
    write(&d, &ext_model("weights.bin", Some(8), Some(24)));
    // Past the end of the file: checked before allocating.
    let e = err_of(&d, &ext_model("weights.bin", Some(16), Some(24)));
    assert!(e.contains("outside the file (32 bytes)"), "{e}");
    let e = err_of(&d, &ext_model("weights.bin", Some(0), Some(1 << 40)));
    assert!(e.contains("outside the file"), "{e}");
    // A length that does not match the shape.
    let e = err_of(&d, &ext_model("weights.bin", Some(0), Some(20)));
    assert!(e.contains("needs 24"), "{e}");
    let e = err_of(&d, &ext_model("missing.bin", None, None));
    assert!(e.contains("missing.bin"), "{e}");
    // A folder (or a FIFO) is not a regular file: refused before opening.
    std::fs::create_dir_all(d.join("dir.bin")).unwrap();
    let e = err_of(&d, &ext_model("dir.bin", None, None));
    assert!(e.contains("not a regular file"), "{e}");
    let fifo = d.join("fifo.bin");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        let e = err_of(&d, &ext_model("fifo.bin", None, None));
        assert!(e.contains("not a regular file"), "{e}");
    }
    // Bad numbers.
    let mut bytes = ModelProto::decode(ext_model("weights.bin", None, None).as_slice()).unwrap();
    if let Some(g) = bytes.graph.as_mut() {
        g.initializer[0].external_data.push(entry("offset", "-4"));
    }
    let e = err_of(&d, &bytes.encode_to_vec());
    assert!(e.contains("non-negative integer"), "{e}");
}

#[test]
fn models_from_memory_cannot_resolve_side_files() {
    let e = import_onnx(&ext_model("weights.bin", None, None), "t.onnx")
        .unwrap_err()
        .to_string();
    assert!(e.contains("import it by path"), "{e}");
}

#[test]
fn folders_without_one_model_are_errors() {
    let d = tmp("folder");
    let e = import_onnx_file(&d).unwrap_err().to_string();
    assert!(e.contains("without model.onnx"), "{e}");
    std::fs::write(d.join("a.onnx"), b"").unwrap();
    std::fs::write(d.join("b.onnx"), b"").unwrap();
    let e = import_onnx_file(&d).unwrap_err().to_string();
    assert!(e.contains("several .onnx files"), "{e}");
}
