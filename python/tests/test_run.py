"""run: load → partition → run on the bundled small CNN and on ONNX models of the Rust tests,
numerics equal to the CLI's (and to onnxruntime's for one)."""

import numpy as np
import fusebox
import pytest

from conftest import CPU_TOML, RESNET, ROOT, SMALL_CNN, cli

CNN_SHAPES = {
    "data": (1, 3, 32, 32), "w0": (16, 3, 3, 3), "b0": (1, 16, 1, 1),
    "w1": (16, 16, 3, 3), "b1": (1, 16, 1, 1), "w2": (16, 16, 3, 3), "b2": (1, 16, 1, 1),
    "w3": (32, 16, 3, 3), "b3": (1, 32, 1, 1), "fc_w": (32, 10), "fc_b": (10,),
}


def cnn_inputs(seed=1):
    rng = np.random.default_rng(seed)
    return {k: rng.uniform(-1, 1, s).astype(np.float32) for k, s in CNN_SHAPES.items()}


def cli_run(model, inputs, tmp_path, *flags):
    """The CLI's outputs for `inputs` (written as .npy), as arrays by file stem."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    args = ["run", model, "--output-dir", tmp_path / "out", *flags]
    for name, a in inputs.items():
        p = tmp_path / f"in_{len(args)}.npy"
        np.save(p, a)
        args += ["--input", f"{name}={p}"]
    cli(*args)
    return {p.stem: np.load(p) for p in sorted((tmp_path / "out").glob("*.npy"))}


def assert_same(got, want):
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_small_cnn_load_partition_run_equals_the_cli(tmp_path):
    inputs = cnn_inputs()
    want = cli_run(SMALL_CNN, inputs, tmp_path, "--config", CPU_TOML, "--check")
    m = fusebox.load(SMALL_CNN)
    part, report = fusebox.partition(m, config=CPU_TOML)
    # 6 where `conv2d_layout = "auto"` converts to NCHW16c (AVX-512: the flatten's layout change).
    blocked = any("conv2d in NCHW16c/OIHW" in n for n in report.notes)
    assert len(report.functions) == (6 if blocked else 5)
    got = fusebox.run(part, inputs, config=CPU_TOML, check=True)
    # The partitioned main returns FuseOps' `gv` where the original returned `logits`: the
    # outputs keep their order, and the CLI names them the same way for that module.
    assert list(got) == ["gv", "prob"]
    assert_same(dict(zip(["logits", "prob"], got.values())), want)
    part.save(tmp_path / "part.relax")
    assert_same(got, cli_run(tmp_path / "part.relax", inputs, tmp_path / "p", "--config", CPU_TOML, "--check"))
    # The unpartitioned module through the same flow, and the default flow (no config).
    assert_same(fusebox.run(m, inputs, config=CPU_TOML), want)
    assert_same(fusebox.run(m, inputs), cli_run(SMALL_CNN, inputs, tmp_path / "plain"))
    # The outputs are real: softmax rows sum to 1 and match the logits.
    logits, prob = got["gv"], got["prob"]
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(prob, e / e.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_seed_fills_inputs_with_the_clis_random_values(tmp_path):
    cli(*["run", SMALL_CNN, "--config", CPU_TOML, "--seed", "3", "--output-dir", tmp_path / "o"])
    want = {p.stem: np.load(p) for p in (tmp_path / "o").glob("*.npy")}
    got = fusebox.run(fusebox.load(SMALL_CNN), config=CPU_TOML, seed=3)
    assert_same(got, want)
    other = fusebox.run(fusebox.load(SMALL_CNN), config=CPU_TOML, seed=4)
    assert not np.array_equal(other["logits"], got["logits"])
    # A given input wins over the seed.
    data = cnn_inputs()["data"]
    mixed = fusebox.run(fusebox.load(SMALL_CNN), {"data": data}, config=CPU_TOML, seed=3)
    assert not np.array_equal(mixed["logits"], got["logits"])


def test_onnx_model_equals_the_cli_and_onnxruntime(tmp_path):
    import onnxruntime as ort

    model = RESNET / "model.onnx"
    x = np.load(RESNET / "default" / "inputs" / "pixel_values.npy")
    inputs = {"pixel_values": x}
    m = fusebox.load(model)
    got = fusebox.run(m, inputs, check=True)
    assert_same(got, cli_run(model, inputs, tmp_path, "--check"))
    with_config = fusebox.run(m, inputs, config=CPU_TOML, check=True)
    assert_same(with_config, cli_run(model, inputs, tmp_path / "c", "--config", CPU_TOML))
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"pixel_values": x})
    assert got["logits"].shape == want.shape
    # As tests/hf_models.rs: within 1e-4 of the output's range.
    tol = 1e-4 * float(want.max() - want.min())
    assert np.max(np.abs(got["logits"] - want)) <= tol
    committed = np.load(RESNET / "default" / "outputs" / "logits.npy")
    assert np.max(np.abs(got["logits"] - committed)) <= tol


def test_int64_inputs_and_onnx_input_names(tmp_path):
    bert = ROOT / "tests" / "models" / "bert-ts"
    inputs = {p.stem: np.load(p) for p in (bert / "seq8" / "inputs").glob("*.npy")}
    assert {a.dtype for a in inputs.values()} == {np.dtype(np.int64)}
    got = fusebox.run(fusebox.load(bert / "model.onnx"), inputs)
    assert_same(got, cli_run(bert / "model.onnx", inputs, tmp_path))
    want = np.load(bert / "seq8" / "outputs" / "last_hidden_state.npy")
    tol = 1e-4 * float(want.max() - want.min())
    assert np.max(np.abs(got["last_hidden_state"] - want)) <= tol


def test_bound_dims_fix_the_shapes_as_the_cli_bind_does(tmp_path):
    bert = ROOT / "tests" / "models" / "bert-ts"
    inputs = {p.stem: np.load(p) for p in (bert / "seq8" / "inputs").glob("*.npy")}
    m = fusebox.load(bert / "model.onnx")
    assert "batch" in m.text() and "sequence" in m.text()
    bound = m.bind({"batch": 2, "sequence": 8})
    text = bound.text()
    assert "batch" not in text and "sequence" not in text
    assert "R.Tensor((2, 8), dtype=\"int64\")" in text
    assert m.text() != text, "bind returns a new module and leaves this one"
    got = fusebox.run(bound, inputs, check=True)
    assert_same(got, cli_run(bert / "model.onnx", inputs, tmp_path, "--bind", "batch=2", "--bind", "sequence=8"))
    want = np.load(bert / "seq8" / "outputs" / "last_hidden_state.npy")
    assert np.max(np.abs(got["last_hidden_state"] - want)) <= 1e-4 * float(want.max() - want.min())
    # The bound shape is enforced: another sequence length is an error naming the input.
    longer = {k: np.concatenate([v, v], axis=1) for k, v in inputs.items()}
    with pytest.raises(fusebox.RunError):
        fusebox.run(bound, longer)
    # Bad binds: an unknown name, a negative or non-integer value.
    with pytest.raises(fusebox.ModelImportError, match="nope"):
        m.bind({"nope": 1})
    with pytest.raises(fusebox.ModelImportError, match="expected a dim value"):
        m.bind({"batch": -1})
    with pytest.raises(fusebox.ModelImportError, match="expected a dim value"):
        m.bind({"batch": 1.5})


def test_strided_and_non_array_inputs_read_as_their_values():
    inputs = cnn_inputs()
    m = fusebox.load(SMALL_CNN)
    want = fusebox.run(m, inputs)
    strided = dict(inputs)
    # A transposed copy transposed back: the same values, Fortran order in memory.
    strided["fc_w"] = np.asfortranarray(inputs["fc_w"])
    assert not strided["fc_w"].flags.c_contiguous
    strided["w0"] = np.ascontiguousarray(inputs["w0"][:, :, ::-1, :])[:, :, ::-1, :]
    assert not strided["w0"].flags.c_contiguous
    listed = dict(inputs, fc_b=inputs["fc_b"].tolist())
    listed["fc_b"] = np.asarray(listed["fc_b"], dtype=np.float32).tolist()
    assert_same(fusebox.run(m, strided), want)
    with pytest.raises(fusebox.RunError, match="expected dtype float32, found float64"):
        fusebox.run(m, listed)  # a list becomes float64 through numpy.asarray


RELAX_DTYPES = """@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((2, 3), "float16"), y: R.Tensor((2, 3), "float16"), i: R.Tensor((3,), "int32"), b: R.Tensor((3,), "bool")):
        with R.dataflow():
            s = R.add(x, y)
            g = R.greater(x, y)
            j = R.multiply(i, i)
            n = R.logical_not(b)
            R.output(s, g, j, n)
        return (s, g, j, n)
"""


def test_outputs_keep_their_dtypes(tmp_path):
    path = tmp_path / "dtypes.relax"
    path.write_text(RELAX_DTYPES)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (2, 3)).astype(np.float16)
    y = rng.uniform(-1, 1, (2, 3)).astype(np.float16)
    i = np.array([1, -2, 3], dtype=np.int32)
    b = np.array([True, False, True])
    out = fusebox.run(fusebox.load(path), {"x": x, "y": y, "i": i, "b": b}, check=True)
    assert list(out) == ["s", "g", "j", "n"]
    assert out["s"].dtype == np.float16 and np.array_equal(out["s"], x + y)
    assert out["g"].dtype == np.bool_ and np.array_equal(out["g"], x > y)
    assert out["j"].dtype == np.int32 and np.array_equal(out["j"], i * i)
    assert out["n"].dtype == np.bool_ and np.array_equal(out["n"], ~b)
    # The arrays are numpy's to keep and change.
    out["s"][0, 0] = 7
    assert out["s"][0, 0] == 7


def test_every_run_of_a_session_gives_runs_outputs(tmp_path):
    # The ONNX model and the small CNN, each with and without a config: every run of a session
    # gives `fusebox.run`'s outputs bit for bit, for changing inputs (a session that kept a
    # previous run's values, or cached by input, would fail the second and third runs).
    x = np.load(RESNET / "default" / "inputs" / "pixel_values.npy")
    m = fusebox.load(RESNET / "model.onnx")
    for config in (None, CPU_TOML):
        sess = fusebox.Session(m, config=config)
        assert "fused" in sess.module.text() or len(sess.module.functions) > 1
        for scale in (1.0, -0.5, 2.0):
            inputs = {"pixel_values": (x * scale).astype(np.float32)}
            assert_same(sess.run(inputs), fusebox.run(m, inputs, config=config))
    cnn = fusebox.load(SMALL_CNN)
    sess = fusebox.Session(cnn, config=CPU_TOML)
    for seed in (1, 2):
        inputs = cnn_inputs(seed)
        assert_same(sess.run(inputs), fusebox.run(cnn, inputs, config=CPU_TOML))
    # `seed` fills what `inputs` leaves out, as in `fusebox.run`.
    assert_same(sess.run(seed=3), fusebox.run(cnn, seed=3, config=CPU_TOML))
    assert repr(sess) == f"<fusebox.Session of {SMALL_CNN}>"


def test_a_session_reports_bad_inputs_and_configs_as_run_does(tmp_path):
    cnn = fusebox.load(SMALL_CNN)
    sess = fusebox.Session(cnn)
    with pytest.raises(fusebox.RunError, match="no_such_input"):
        sess.run({"no_such_input": np.zeros(3, np.float32)})
    with pytest.raises(fusebox.RunError):
        sess.run({"data": np.zeros((1, 3, 32, 32), np.float32)})  # the weights are missing
    bad = tmp_path / "bad.toml"
    bad.write_text("target = \"cpu\"\n[partition]\nfuse_opps = true\n")
    with pytest.raises(fusebox.ConfigError, match="unknown field `fuse_opps`") as e:
        fusebox.Session(cnn, config=bad)
    assert (e.value.file, e.value.line) == (str(bad), 3)
    # The session still runs after the failed calls.
    inputs = cnn_inputs(4)
    assert_same(sess.run(inputs), fusebox.run(cnn, inputs))
