//! The HTML partition report (issue 21): `fusebox partition … --emit html -o report.html` on
//! ResNet-50 (the light ResNet-50 of the ONNX test data, `$ONNX_DATA_DIR/light/`) and the BERT
//! fixture (`tests/models/bert-ts`), opened in headless Chromium (Debian's `chromium`):
//!
//! - the page is one self-contained file: no `http://`/`https://` anywhere, no `src=`/`<link`;
//!   its embedded JSON is the `--emit json` report; two runs write the same bytes;
//! - the page renders without console messages and without the page's own `window.onerror`
//!   mark, and its script ran to the end (`data-ready="yes"`);
//! - every function of the JSON report is an element `data-function="<name>"` of the dumped
//!   DOM, with one table row each;
//! - the screenshot decodes as a 1600×1000 PNG that is not one colour and shows the boxes of
//!   the graph in the first backend's colour;
//! - `#function=<name>` opens the panel of that function: its ops, and the reason every
//!   other backend declined it.
//!
//! A third test needs no browser: the page of a cuBLAS partition with a rejected match holds
//! every function, legend entry and rejection.
//!
//! Without Chromium (`/usr/bin/chromium`, `chromium` on the PATH or `$FUSEBOX_CHROMIUM`) the
//! test prints why it skipped, unless `FUSEBOX_REQUIRE_CHROMIUM=1` (set by `scripts/test.sh`)
//! makes that a failure. Without `ONNX_DATA_DIR` it fails under `FUSEBOX_REQUIRE_ONNX_DATA=1`
//! and otherwise checks the BERT fixture alone.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const WIDTH: u32 = 1600;
const HEIGHT: u32 = 1000;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fresh(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fusebox-html-report-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

/// Chromium, or why there is none.
fn chromium() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("FUSEBOX_CHROMIUM") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("FUSEBOX_CHROMIUM={} is not a file", p.display()))
        };
    }
    let mut dirs = vec![PathBuf::from("/usr/bin")];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.iter()
        .map(|d| d.join("chromium"))
        .find(|p| p.is_file())
        .ok_or_else(|| "no `chromium` in /usr/bin or on the PATH".to_string())
}

/// Runs `cmd` with stdout and stderr to files, killed after `limit`; returns (stdout, stderr).
fn run_limited(mut cmd: Command, dir: &Path, tag: &str, limit: Duration) -> (String, String) {
    let (out_path, err_path) = (
        dir.join(format!("{tag}.out")),
        dir.join(format!("{tag}.err")),
    );
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{tag}: cannot start: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{tag}: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(status.success(), "{tag}: {status}\n{err}");
    (out, err)
}

/// `chromium --headless` on `url` with a fresh profile; `mode` is `--dump-dom` or
/// `--screenshot=<png>`. Returns (stdout, the console lines of stderr).
fn browse(chromium: &Path, url: &str, mode: &str, dir: &Path, tag: &str) -> (String, Vec<String>) {
    let profile = dir.join(format!("profile-{tag}"));
    std::fs::create_dir_all(&profile).unwrap();
    let mut cmd = Command::new(chromium);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-logging=stderr",
        "--v=0",
        &format!("--window-size={WIDTH},{HEIGHT}"),
        &format!("--user-data-dir={}", profile.display()),
        mode,
        url,
    ]);
    let (out, err) = run_limited(cmd, dir, tag, Duration::from_secs(180));
    let _ = std::fs::remove_dir_all(&profile);
    let console = err
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_string)
        .collect();
    (out, console)
}

fn fusebox(args: &[&str], dir: &Path, tag: &str) -> (String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fusebox"));
    cmd.current_dir(root()).args(args);
    run_limited(cmd, dir, tag, Duration::from_secs(600))
}

/// Text as the DOM serialiser writes it in a text node.
fn dom_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\u{a0}', "&nbsp;")
}

/// Text as the DOM serialiser writes it in an attribute value.
fn attr(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('\u{a0}', "&nbsp;")
}

/// The embedded JSON of the page.
fn embedded(html: &str) -> serde_json::Value {
    let open = "<script type=\"application/json\" id=\"fusebox-report\">";
    let start = html.find(open).expect("the embedded report") + open.len();
    let end = start + html[start..].find("</script>").unwrap();
    serde_json::from_str(&html[start..end]).unwrap()
}

/// Decodes a PNG: (width, height, RGB pixels).
fn decode_png(path: &Path) -> (u32, u32, Vec<[u8; 3]>) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert_eq!(info.bit_depth, png::BitDepth::Eight, "{}", path.display());
    assert!(channels >= 3, "{}: {:?}", path.display(), info.color_type);
    let pixels = buf[..info.buffer_size()]
        .chunks_exact(channels)
        .map(|p| [p[0], p[1], p[2]])
        .collect();
    (info.width, info.height, pixels)
}

fn hex_rgb(hex: &str) -> [u8; 3] {
    let c = |i: usize| u8::from_str_radix(&hex[i..i + 2], 16).unwrap();
    [c(1), c(3), c(5)]
}

/// Partitions `model` with `config`, writes the HTML report and checks it in Chromium.
fn check_model(chromium: &Path, label: &str, model: &Path, config: &str) {
    let dir = fresh(label);
    let model = model.to_str().unwrap();
    let (json, _) = fusebox(
        &["partition", model, "--config", config, "--emit", "json"],
        &dir,
        "json",
    );
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    let functions: Vec<&str> = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(
        functions.len() >= 10,
        "{label}: {} functions",
        functions.len()
    );

    // Two runs, two processes: the same bytes.
    let html_path = dir.join("report.html");
    let t = Instant::now();
    let (_, timings) = fusebox(
        &[
            "partition",
            model,
            "--config",
            config,
            "--emit",
            "html",
            "--timings",
            "-o",
            html_path.to_str().unwrap(),
        ],
        &dir,
        "html",
    );
    let wall = t.elapsed();
    let emit = timings
        .lines()
        .find(|l| l.starts_with("time emit "))
        .unwrap_or_else(|| panic!("{label}: no `time emit` line in\n{timings}"));
    println!(
        "{label}: fusebox partition --emit html {:.0} ms in all (debug build); {emit}",
        wall.as_secs_f64() * 1e3
    );
    let again = dir.join("again.html");
    fusebox(
        &[
            "partition",
            model,
            "--config",
            config,
            "--emit",
            "html",
            "-o",
            again.to_str().unwrap(),
        ],
        &dir,
        "html-again",
    );
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(
        html == std::fs::read_to_string(&again).unwrap(),
        "{label}: two runs wrote different pages"
    );

    // Self-contained: nothing to fetch.
    for bad in [
        "http://", "https://", " src=", "<link", "@import", "url(http",
    ] {
        assert!(!html.contains(bad), "{label}: the page contains `{bad}`");
    }
    assert_eq!(
        embedded(&html),
        report,
        "{label}: the embedded report is --emit json's"
    );

    // The DOM after the page's script ran.
    let url = format!("file://{}", html_path.display());
    let (dom, console) = browse(chromium, &url, "--dump-dom", &dir, "dom");
    assert!(
        console.is_empty(),
        "{label}: console messages:\n{console:#?}"
    );
    assert!(
        dom.contains("data-ready=\"yes\""),
        "{label}: the page's script did not finish"
    );
    assert!(
        !dom.contains("data-js-error=\""),
        "{label}: window.onerror fired: {}",
        dom.split("data-js-error=\"")
            .nth(1)
            .unwrap_or("")
            .lines()
            .next()
            .unwrap_or("")
    );
    for f in &functions {
        let row = format!("<tr data-function=\"{}\"", attr(f));
        assert_eq!(dom.matches(&row).count(), 1, "{label}: row of `{f}`");
    }
    assert_eq!(
        dom.matches("<tr data-function=").count(),
        functions.len(),
        "{label}: one row per function"
    );
    // Every function main calls has a box in the graph.
    let boxes = dom.matches("<g class=\"node call\"").count();
    let calls = report["main"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            let e = e.as_str().unwrap();
            e.starts_with("primitive:")
                || e.starts_with("composite:")
                || e.starts_with("region:")
                || e.strip_prefix("call:")
                    .is_some_and(|g| functions.contains(&g))
        })
        .count();
    assert_eq!(
        boxes, calls,
        "{label}: one box per call of a fused function"
    );

    // The screenshot: right size, not one colour, the first backend's boxes drawn.
    let png_path = dir.join("report.png");
    let (_, console) = browse(
        chromium,
        &url,
        &format!("--screenshot={}", png_path.display()),
        &dir,
        "shot",
    );
    assert!(
        console.is_empty(),
        "{label}: console messages:\n{console:#?}"
    );
    let (w, h, pixels) = decode_png(&png_path);
    assert_eq!((w, h), (WIDTH, HEIGHT), "{label}: screenshot size");
    let distinct: std::collections::BTreeSet<[u8; 3]> = pixels.iter().copied().collect();
    assert!(
        distinct.len() > 50,
        "{label}: {} colours in the screenshot",
        distinct.len()
    );
    let swatch = "<li><span class=\"swatch\" style=\"background:";
    let first = &html[html.find(swatch).unwrap() + swatch.len()..][..7];
    let fill = hex_rgb(first);
    let near = |p: &[u8; 3]| (0..3).all(|i| p[i].abs_diff(fill[i]) <= 3);
    let filled = pixels.iter().filter(|p| near(p)).count();
    assert!(
        filled > 5_000,
        "{label}: only {filled} pixels of the first legend colour {first}: the graph is not drawn"
    );

    // `#function=<name>` opens the panel; for a function others declined, their reasons.
    let claims = report["claims"].as_array().cloned().unwrap_or_default();
    let declined = claims
        .iter()
        .find(|c| !c["declines"].as_array().unwrap().is_empty());
    let pick = match declined {
        Some(c) => c["function"].as_str().unwrap(),
        None => functions[0],
    };
    let (dom, console) = browse(
        chromium,
        &format!("{url}#function={pick}"),
        "--dump-dom",
        &dir,
        "panel",
    );
    assert!(
        console.is_empty(),
        "{label}: console messages:\n{console:#?}"
    );
    let panel = &dom[dom.find("<div id=\"panel\">").unwrap()..];
    let panel = &panel[..panel.find("</section>").unwrap()];
    assert!(
        panel.contains(&format!("<h3>{}</h3>", dom_text(pick))),
        "{label}: panel of {pick}: {panel}"
    );
    let f = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == pick)
        .unwrap();
    let ops = f["ops"].as_array().unwrap();
    assert!(
        panel.contains(&format!("ops ({})", ops.len())),
        "{label}: {panel}"
    );
    for op in ops {
        let li = format!("<li>{}</li>", dom_text(op.as_str().unwrap()));
        assert!(panel.contains(&li), "{label}: {li} not in {panel}");
    }
    if let Some(c) = declined {
        for d in c["declines"].as_array().unwrap() {
            let (b, r) = (d[0].as_str().unwrap(), d[1].as_str().unwrap());
            let line = format!("{} declined: {}", dom_text(b), dom_text(r));
            assert!(panel.contains(&line), "{label}: `{line}` not in {panel}");
        }
    }
    println!(
        "{label}: {} functions, {} boxes of fused calls, {} colours in the screenshot; panel of {pick} checked",
        functions.len(),
        boxes,
        distinct.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn chromium_or_skip() -> Option<PathBuf> {
    match chromium() {
        Ok(c) => Some(c),
        Err(why) if flag("FUSEBOX_REQUIRE_CHROMIUM") => {
            panic!("FUSEBOX_REQUIRE_CHROMIUM=1 but {why}")
        }
        Err(why) => {
            println!("skipped: {why} (scripts/test.sh installs Debian's chromium)");
            None
        }
    }
}

#[test]
fn resnet50_report_renders_in_chromium() {
    let Some(chromium) = chromium_or_skip() else {
        return;
    };
    let Some(data) = std::env::var_os("ONNX_DATA_DIR") else {
        assert!(
            !flag("FUSEBOX_REQUIRE_ONNX_DATA"),
            "FUSEBOX_REQUIRE_ONNX_DATA=1 but ONNX_DATA_DIR is not set"
        );
        println!("skipped: ONNX_DATA_DIR is not set (scripts/test.sh sets it)");
        return;
    };
    let model = PathBuf::from(data).join("light/light_resnet50.onnx");
    assert!(model.is_file(), "{}: missing", model.display());
    // configs/cuda.toml: cuBLAS and CUTLASS decline the FuseOps groups, so the panel has
    // reasons to show (and, without a GPU, the cuda backend's compile failure).
    check_model(&chromium, "resnet50", &model, "configs/cuda.toml");
}

#[test]
fn bert_report_renders_in_chromium() {
    let Some(chromium) = chromium_or_skip() else {
        return;
    };
    let model = root().join("tests/models/bert-ts/model.onnx");
    assert!(model.is_file(), "{}: missing fixture", model.display());
    check_model(&chromium, "bert", &model, "configs/cpu.toml");
}

/// Without a browser: the page of a cuBLAS partition with a rejected match holds every
/// function (a row and a box), every rejection with its reason, the JSON report, a legend entry
/// per backend, and nothing to fetch; `#function=` and ghost boxes aside, this is what the
/// Chromium tests open.
#[test]
fn report_page_holds_every_function_and_rejection() {
    let dir = fresh("structure");
    let args = [
        "partition",
        "tests/golden/cublas/bias_2d_rejected.relax",
        "--config",
        "configs/examples/cublas.toml",
        "--emit",
    ];
    let (json, _) = fusebox(&[&args[..], &["json"]].concat(), &dir, "json");
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    let (html, _) = fusebox(&[&args[..], &["html"]].concat(), &dir, "html");
    assert!(html.starts_with("<!DOCTYPE html>"), "{}", &html[..100]);
    for bad in ["http://", "https://", " src=", "<link"] {
        assert!(!html.contains(bad), "the page contains `{bad}`");
    }
    assert_eq!(embedded(&html), report);
    let functions = report["functions"].as_array().unwrap();
    assert!(functions.len() >= 3);
    for f in functions {
        let name = f["name"].as_str().unwrap();
        let row = format!("<tr data-function=\"{}\">", attr(name));
        assert_eq!(html.matches(&row).count(), 1, "row of {name}");
        let backend = f["backend"].as_str().unwrap();
        let legend = format!("></span>backend {} · ", escape_all(backend));
        assert!(html.contains(&legend), "no legend entry `{legend}`");
    }
    let rejections = report["rejections"].as_array().unwrap();
    assert!(!rejections.is_empty(), "the fixture has a rejected match");
    for r in rejections {
        let reason = r["reason"].as_str().unwrap();
        let row = format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape_all(r["pattern"].as_str().unwrap()),
            escape_all(r["at"].as_str().unwrap()),
            escape_all(reason)
        );
        assert!(html.contains(&row), "rejection `{row}` not in the page");
    }
    assert!(html.contains(&format!("Rejected pattern matches ({})", rejections.len())));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Text as the generator escapes it (`&`, `<`, `>`, `"`, `'`).
fn escape_all(s: &str) -> String {
    dom_text(s).replace('"', "&quot;").replace('\'', "&#39;")
}
