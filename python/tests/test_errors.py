"""Every exception class, raised by a bad input, with the CLI's message."""

import re

import numpy as np
import fusebox
import pytest

from conftest import CONV_X2, CPU_TOML, ROOT, SMALL_CNN, cli_error

PLUGIN_DIR = ROOT / "target" / "debug"


def test_every_class_is_a_fusebox_error():
    for cls in (fusebox.ParseError, fusebox.ModelImportError, fusebox.ConfigError,
                fusebox.PluginError, fusebox.PartitionError, fusebox.RunError):
        assert issubclass(cls, fusebox.Error) and issubclass(cls, Exception)
    assert issubclass(fusebox.CheckError, fusebox.RunError)


def test_parse_error_has_the_clis_message_and_position(tmp_path):
    bad = tmp_path / "bad.relax"
    bad.write_text(SMALL_CNN.read_text().replace("R.nn.relu(R.add(R.nn.conv2d(stem", "R.nn.relu(R.add(R.nn.conv2d(stem,,", 1))
    with pytest.raises(fusebox.ParseError) as e:
        fusebox.load(bad)
    want = cli_error("show", bad)
    assert str(e.value) == want
    line, col = map(int, re.match(rf"{re.escape(str(bad))}:(\d+):(\d+): ", want).groups())
    assert (e.value.file, e.value.line, e.value.col) == (str(bad), line, col)
    assert "^" in str(e.value)  # the caret under the column
    # A file that is not there.
    with pytest.raises(fusebox.ParseError) as e:
        fusebox.load(tmp_path / "missing.relax")
    assert str(e.value) == cli_error("show", tmp_path / "missing.relax")
    assert e.value.line is None


def test_import_error_for_a_file_that_is_not_onnx(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07this is not a protobuf \xff\xff\xff")
    with pytest.raises(fusebox.ModelImportError) as e:
        fusebox.load(bad)
    assert str(e.value) == cli_error("show", bad)
    assert "not a valid ONNX model" in str(e.value)


def test_config_errors_from_a_file_a_dict_and_a_pattern_list(tmp_path):
    m = fusebox.load(SMALL_CNN)
    bad = tmp_path / "bad.toml"
    bad.write_text("target = \"cpu\"\n[partition]\nfuse_opps = true\n")
    with pytest.raises(fusebox.ConfigError) as e:
        fusebox.partition(m, config=bad)
    assert str(e.value) == cli_error("partition", SMALL_CNN, "--config", bad)
    assert (e.value.file, e.value.line, e.value.col) == (str(bad), 3, 1)
    assert "unknown field `fuse_opps`" in str(e.value) and "`fuse_ops`" in str(e.value)
    # An unknown backend, at its name.
    nope = tmp_path / "nope.toml"
    nope.write_text("[[backend]]\nname = \"nope\"\n")
    with pytest.raises(fusebox.ConfigError) as e:
        fusebox.run(m, config=nope, seed=0)
    assert str(e.value) == cli_error("run", SMALL_CNN, "--config", nope, "--output-dir", tmp_path / "o")
    assert "unknown backend `nope`" in str(e.value) and e.value.line == 2
    # The same mistakes as Python values.
    with pytest.raises(fusebox.ConfigError, match="unknown field `fuse_opps`") as e:
        fusebox.partition(m, config={"partition": {"fuse_opps": True}})
    assert e.value.file == "<config dict>"
    with pytest.raises(fusebox.ConfigError, match="in pattern: ") as e:
        fusebox.partition(m, patterns=[{"name": "a.b", "pattern": "relax.nn.relu(_"}])
    assert e.value.file == "<patterns list>"
    with pytest.raises(fusebox.ConfigError, match=r"patterns\[1\]: expected a dict"):
        fusebox.partition(m, patterns=[{"name": "a.b", "pattern": "_"}, "relax.nn.relu(_)"])
    with pytest.raises(fusebox.ConfigError, match=r"config\['partition'\]\['strict'\]: a NoneType has no TOML"):
        fusebox.partition(m, config={"partition": {"strict": None}})
    with pytest.raises(fusebox.ConfigError, match="fuse_opt_level must be 0, 1 or 2, found 7"):
        fusebox.partition(m, fuse_ops=True, fuse_opt_level=7)
    with pytest.raises(fusebox.ConfigError, match="memory_limit: invalid size `lots`"):
        fusebox.run(m, seed=0, memory_limit="lots")


def test_plugin_error_for_a_library_that_is_not_there(tmp_path):
    cfg = tmp_path / "plugin.toml"
    cfg.write_text("[[plugin]]\npath = \"target/debug/libfusebox_plugin_nothere.so\"\n")
    with pytest.raises(fusebox.PluginError) as e:
        fusebox.partition(fusebox.load(CONV_X2), config=cfg)
    assert str(e.value) == cli_error("partition", CONV_X2, "--config", cfg)
    assert "libfusebox_plugin_nothere.so" in str(e.value)
    with pytest.raises(fusebox.PluginError):
        fusebox.backends({"plugin": [{"path": "target/debug/libfusebox_plugin_nothere.so"}]})


RELU = """@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((2, 3), dtype="float32")):
        with R.dataflow():
            gv = R.nn.relu(x)
            R.output(gv)
        return gv
"""


def misbehave(tmp_path, mode):
    lib = PLUGIN_DIR / "libfusebox_plugin_test_misbehave.so"
    assert lib.is_file(), f"build it first: cargo build -p fusebox-plugin-test-misbehave ({lib})"
    cfg = tmp_path / f"{mode}.toml"
    cfg.write_text(f"[partition]\nstrict = true\nbind_constants = false\n[[plugin]]\npath = \"{lib}\"\n"
                   f"[[backend]]\nname = \"misbehave\"\n[backend.options]\nmode = \"{mode}\"\n")
    model = tmp_path / "relu.relax"
    model.write_text(RELU)
    return fusebox.load(model), model, cfg


def test_plugin_errors_for_a_bad_library_and_a_failing_run(tmp_path):
    # A library with the wrong ABI version is refused at load.
    bad_abi = tmp_path / "bad_abi.toml"
    bad_abi.write_text(f"[[plugin]]\npath = \"{PLUGIN_DIR / 'libfusebox_plugin_test_bad_abi.so'}\"\n")
    with pytest.raises(fusebox.PluginError) as e:
        fusebox.partition(fusebox.load(CONV_X2), config=bad_abi)
    assert str(e.value) == cli_error("partition", CONV_X2, "--config", bad_abi)
    assert "ABI mismatch" in str(e.value)
    # A plugin's artifact that panics while running: caught in the plugin, a PluginError here.
    x = {"x": np.ones((2, 3), np.float32)}
    for mode, needle in (("run_panic", "`run` panicked: panicked: run panicked on purpose"),
                         ("run_error", "`run` failed: run failed on purpose")):
        m, model, cfg = misbehave(tmp_path, mode)
        with pytest.raises(fusebox.PluginError) as e:
            fusebox.run(m, x, config=cfg)
        assert needle in str(e.value) and "libfusebox_plugin_test_misbehave.so" in str(e.value)
        np.save(tmp_path / "x.npy", x["x"])
        assert str(e.value) == cli_error("run", model, "--config", cfg, "--input", f"x={tmp_path / 'x.npy'}",
                                         "--output-dir", tmp_path / "o")
    # A plugin that cannot compile under strict = true: strict mode's PartitionError, naming it.
    m, model, cfg = misbehave(tmp_path, "compile_error")
    with pytest.raises(fusebox.PartitionError) as e:
        fusebox.partition(m, config=cfg)
    assert str(e.value) == cli_error("partition", model, "--config", cfg)
    assert "compile failed on purpose" in str(e.value)


def test_check_error_names_the_output_that_differs(tmp_path):
    m, model, cfg = misbehave(tmp_path, "wrong_result")
    x = {"x": np.array([[-1, 0, 1], [2, -3, 4]], np.float32)}
    # Without check the wrong answer comes back (relu + 1: the plugin's fault) ...
    np.testing.assert_array_equal(fusebox.run(m, x, config=cfg)["gv"], np.maximum(x["x"], 0) + 1)
    # ... with it, CheckError with the CLI's message.
    with pytest.raises(fusebox.CheckError) as e:
        fusebox.run(m, x, config=cfg, check=True)
    np.save(tmp_path / "x.npy", x["x"])
    assert str(e.value) == cli_error("run", model, "--config", cfg, "--check", "--input", f"x={tmp_path / 'x.npy'}",
                                     "--output-dir", tmp_path / "o")
    assert "check failed: output `gv` differs from the unpartitioned module" in str(e.value)


def test_partition_errors(tmp_path):
    m = fusebox.load(SMALL_CNN)
    with pytest.raises(fusebox.PartitionError) as e:
        fusebox.explain(m, "nope")
    assert str(e.value) == cli_error("explain", SMALL_CNN, "--binding", "nope")
    _, report = fusebox.partition(m, config=CPU_TOML)
    with pytest.raises(fusebox.PartitionError) as e2:
        report.explain("nope")
    assert str(e2.value) == str(e.value)
    # strict = true and nothing claims the work.
    strict = tmp_path / "strict.toml"
    strict.write_text("[partition]\nstrict = true\n")
    with pytest.raises(fusebox.PartitionError) as e:
        fusebox.run(m, config=strict, seed=0)
    assert str(e.value) == cli_error("run", SMALL_CNN, "--config", strict, "--output-dir", tmp_path / "o")
    assert "strict mode: no backend claimed" in str(e.value)


def test_run_errors_for_bad_inputs(tmp_path):
    m = fusebox.load(SMALL_CNN)
    inputs = {"data": np.zeros((1, 3, 32, 32), np.float32)}
    with pytest.raises(fusebox.RunError) as e:
        fusebox.run(m, inputs)
    assert str(e.value) == (f"{SMALL_CNN}: no input for `w0`, `b0`, `w1`, `b1`, `w2`, `b2`, `w3`, `b3`, "
                            "`fc_w`, `fc_b` of `main` (it takes data, w0, b0, w1, b1, w2, b2, w3, b3, fc_w, fc_b)")
    with pytest.raises(fusebox.RunError, match=r"input `nope`: `main` has no parameter of that name \(parameters: data, w0"):
        fusebox.run(m, {"nope": np.zeros(1, np.float32)}, seed=0)
    with pytest.raises(fusebox.RunError, match=r"input `data`: dtype complex64 is not supported"):
        fusebox.run(m, {"data": np.zeros((1, 3, 32, 32), np.complex64)}, seed=0)
    # The executor's own errors, word for word as the CLI's.
    for bad in (np.zeros((1, 3, 32, 32), np.float64), np.zeros((1, 3, 16, 16), np.float32)):
        with pytest.raises(fusebox.RunError) as e:
            fusebox.run(m, {"data": bad}, seed=0)
        np.save(tmp_path / "bad.npy", bad)
        assert str(e.value) == cli_error("run", SMALL_CNN, "--input", f"data={tmp_path / 'bad.npy'}",
                                         "--output-dir", tmp_path / "o")
    # The memory limit, as --memory-limit.
    with pytest.raises(fusebox.RunError) as e:
        fusebox.run(m, seed=0, memory_limit=1000)
    assert str(e.value) == cli_error("run", SMALL_CNN, "--memory-limit", "1000", "--output-dir", tmp_path / "o")
    assert "input `data` needs 12 KiB" in str(e.value)
    # A given input is held to it too, before it is copied.
    with pytest.raises(fusebox.RunError, match=r"input `data` needs 12 KiB \(12288 bytes\) for float32 \[1, 3, 32, 32\]"):
        fusebox.run(m, inputs, seed=0, memory_limit="4KiB")


def test_a_panic_is_a_fusebox_error_not_a_panic_exception():
    with pytest.raises(fusebox.Error) as e:
        fusebox._fusebox._panic_for_test("boom")
    assert type(e.value) is fusebox.Error
    assert str(e.value) == "internal error (a bug in fusebox, please report it): boom"
    # The module keeps working after it.
    assert fusebox.load(SMALL_CNN).functions == ["main"]
