"""partition, Report, explain, backends: the same module, JSON and text as the CLI's."""

import json

import fusebox

from conftest import CONV_X2, CPU_TOML, DNNL, ROOT, SMALL_CNN, cli

CUBLAS_TOML = ROOT / "configs" / "examples" / "cublas.toml"
BIAS_REJECTED = ROOT / "tests" / "golden" / "cublas" / "bias_2d_rejected.relax"


def test_pattern_partition_equals_the_cli():
    m = fusebox.load(CONV_X2)
    part, report = fusebox.partition(m, patterns=DNNL, annotate_codegen=True)
    args = ["partition", CONV_X2, "--patterns", DNNL, "--annotate-codegen", "true"]
    assert part.text() == cli(*args).stdout
    assert report.json() == cli(*args, "--emit", "json").stdout
    assert [f["codegen"] for f in report.functions] == ["dnnl", "dnnl"]
    assert report.main == ["composite:dnnl.conv2d_relu"] * 2
    assert report.claims == [] and report.rejections == []


def test_flags_merge_and_fuse_ops_equal_the_cli():
    m = fusebox.load(CONV_X2)
    part, report = fusebox.partition(m, patterns=DNNL, merge=True, fuse_ops=True, annotate_codegen=True)
    args = ["partition", CONV_X2, "--patterns", DNNL, "--merge", "--fuse-ops", "--annotate-codegen", "true"]
    assert part.text() == cli(*args).stdout
    assert report.json() == cli(*args, "--emit", "json").stdout
    part1, _ = fusebox.partition(m, fuse_ops=True, fuse_opt_level=1, max_depth=8)
    assert part1.text() == cli("partition", CONV_X2, "--fuse-ops", "--fuse-opt-level", "1", "--max-depth", "8").stdout
    assert part1.text() != part.text()


def test_config_partition_equals_the_cli_and_reports_claims():
    m = fusebox.load(SMALL_CNN)
    part, report = fusebox.partition(m, config=CPU_TOML)
    assert part.text() == cli("partition", SMALL_CNN, "--config", CPU_TOML).stdout
    assert report.json() == cli("partition", SMALL_CNN, "--config", CPU_TOML, "--emit", "json").stdout
    # On AVX-512 `conv2d_layout = "auto"` converts the CNN to NCHW16c (the notes say so): the
    # pooled end's layout change then fuses with the flatten.
    blocked = any("conv2d in NCHW16c/OIHW" in n for n in report.notes)
    assert [f["name"] for f in report.functions] == [
        "fused_conv2d_add_relu", "fused_conv2d_add_relu1", "fused_conv2d_add_add_relu",
        "fused_conv2d_add_relu2"] + (["fused_layout_transform_reshape"] if blocked else []) + [
        "fused_matmul_add"]
    assert {f["backend"] for f in report.functions} == {"cpu"}
    assert [c["function"] for c in report.claims] == [f["name"] for f in report.functions]
    # The original module is untouched; the partitioned one remembers where it came from.
    assert m.functions == ["main"] and part.source == m.source


def test_a_flag_overrides_the_configs_partition_table():
    m = fusebox.load(SMALL_CNN)
    plain, _ = fusebox.partition(m, config=CPU_TOML)
    no_fuse, report = fusebox.partition(m, config=CPU_TOML, fuse_ops=False)
    assert report.functions == [] and no_fuse.functions == ["main"]
    assert plain.functions != no_fuse.functions
    # The same override written in a config dict gives the same module.
    d = {"target": "cpu", "partition": {"fuse_ops": False}, "backend": [{"name": "cpu"}]}
    assert fusebox.partition(m, config=d)[0].text() == no_fuse.text()


def test_config_with_patterns_equals_the_cli():
    m = fusebox.load(SMALL_CNN)
    _, report = fusebox.partition(m, config=CPU_TOML, patterns=DNNL)
    assert report.json() == cli("partition", SMALL_CNN, "--config", CPU_TOML, "--patterns", DNNL, "--emit", "json").stdout


def test_rejections_are_reported_as_the_cli_reports_them():
    m = fusebox.load(BIAS_REJECTED)
    _, report = fusebox.partition(m, config=CUBLAS_TOML)
    cli_json = json.loads(cli("partition", BIAS_REJECTED, "--config", CUBLAS_TOML, "--emit", "json").stdout)
    assert report.rejections == cli_json["rejections"]
    assert report.rejections[0]["pattern"] == "cublas.matmul_bias"
    assert report.rejections[0]["at"] == "main/y"
    assert "bias must be a vector" in report.rejections[0]["reason"]
    # Each getter hands out a fresh object: changing it changes nothing in the report.
    report.rejections.clear()
    assert len(report.rejections) == 1


def test_explain_prints_what_the_cli_prints():
    m = fusebox.load(BIAS_REJECTED)
    _, report = fusebox.partition(m, config=CUBLAS_TOML)
    want = cli("explain", BIAS_REJECTED, "--config", CUBLAS_TOML, "--binding", "y").stdout
    assert report.explain("y") == want
    assert fusebox.explain(m, "y", config=CUBLAS_TOML) == want
    assert "rejected" in want and "cublas.matmul_bias" in want
    # The default config, as `fusebox explain` without --config.
    cnn = fusebox.load(SMALL_CNN)
    assert fusebox.explain(cnn, "logits") == cli("explain", SMALL_CNN, "--binding", "logits").stdout


def test_explain_after_a_pattern_partition_names_the_users_patterns():
    m = fusebox.load(CONV_X2)
    _, report = fusebox.partition(m, patterns=DNNL)
    text = report.explain("conv1")
    assert "dnnl.conv2d_relu [user]: match" in text
    assert "ended in `fused_relax_nn_conv2d_relax_nn_relu`" in text


def test_patterns_from_a_list_of_dicts_equal_the_same_table_in_toml():
    import tomllib  # the suite runs on .venv's Python (3.11)

    table = tomllib.loads(DNNL.read_text())["pattern"]
    assert len(table) >= 2 and all("name" in e and "pattern" in e for e in table)
    m = fusebox.load(CONV_X2)
    for kw in ({}, {"fuse_ops": True, "merge": True}):
        a, ra = fusebox.partition(m, patterns=DNNL, **kw)
        b, rb = fusebox.partition(m, patterns=table, **kw)
        assert a.text() == b.text()
        assert ra.json() == rb.json()
    # With a config too.
    a, ra = fusebox.partition(m, config=CPU_TOML, patterns=DNNL)
    b, rb = fusebox.partition(m, config=CPU_TOML, patterns=table)
    assert a.text() == b.text() and ra.json() == rb.json()


def test_patterns_from_dicts_keep_priority_and_check():
    m = fusebox.load(CONV_X2)
    low_first = [
        {"name": "a.conv", "pattern": "relax.nn.conv2d(_, _)", "priority": 1},
        {"name": "b.conv_relu", "pattern": "relax.nn.relu(relax.nn.conv2d(_, _))", "priority": 5,
         "check": "no_leaking_intermediates"},
    ]
    _, report = fusebox.partition(m, patterns=low_first)
    # The higher priority entry wins although it comes second.
    assert [f["composite"] for f in report.functions] == ["b.conv_relu", "b.conv_relu"]


def test_backends_lists_what_the_cli_lists():
    listing = fusebox.backends()
    text = cli("backends").stdout.splitlines()
    assert listing["config"] == "configs/cpu.toml" and text[0] == "config: configs/cpu.toml"
    assert [b["name"] for b in listing["backends"]] == ["cpu"]
    cpu = listing["backends"][0]
    assert cpu["origin"] == "built-in"
    lines = [f"  {p['name']} priority {p['priority']}{' check ' + p['check'] if p['check'] else ''}: {p['pattern']}"
             for p in cpu["patterns"]]
    assert lines == text[2:2 + len(lines)]
    assert listing["lint"] == [] and text[-1] == "lint: no findings"
    cublas = fusebox.backends(CUBLAS_TOML)
    assert [b["name"] for b in cublas["backends"]] == ["cublas", "cpu"]
    assert len(cublas["backends"][0]["patterns"]) == sum(
        1 for line in cli("backends", "--config", CUBLAS_TOML).stdout.splitlines()
        if line.startswith("  cublas."))


def test_backends_with_a_plugin_and_user_patterns():
    plugin = ROOT / "configs" / "plugin-example.toml"
    listing = fusebox.backends(plugin)
    text = cli("backends", "--config", plugin).stdout
    for b in listing["backends"]:
        assert f"backend {b['name']} ({b['origin']})" in text
    assert any(b["origin"] != "built-in" for b in listing["backends"])
