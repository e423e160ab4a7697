"""load, Module, save: text and ONNX models, the round trip through a file and its side file."""

import fusebox

from conftest import CONV_X2, RESNET, SMALL_CNN, cli


def test_load_text_gives_the_module_the_cli_prints():
    m = fusebox.load(SMALL_CNN)
    assert m.functions == ["main"]
    assert m.params[:3] == ["data", "w0", "b0"] and len(m.params) == 11
    assert m.source == str(SMALL_CNN)
    assert m.text() == cli("show", SMALL_CNN).stdout
    assert "small_cnn.relax" in repr(m) and "1 function(s)" in repr(m)


def test_load_onnx_imports_as_the_cli_does():
    m = fusebox.load(RESNET / "model.onnx")
    assert m.params == ["pixel_values"]
    assert m.text() == cli("show", RESNET / "model.onnx").stdout


def test_save_writes_text_and_side_file_that_load_reads_back(tmp_path):
    m = fusebox.load(RESNET / "model.onnx")
    out = tmp_path / "resnet.relax"
    m.save(out)
    # The constants went to the side file, and the text names them by reference.
    assert (tmp_path / "resnet.safetensors").stat().st_size > 10_000
    assert 'metadata["relax.expr.Constant"]' in out.read_text()
    back = fusebox.load(out)
    assert back.text() == m.text()
    assert back.source == str(out)


def test_a_partitioned_module_saves_and_loads_back(tmp_path):
    part, _ = fusebox.partition(fusebox.load(CONV_X2), patterns=[
        {"name": "dnnl.conv2d_relu", "pattern": "relax.nn.relu(relax.nn.conv2d(_, _))"}
    ])
    part.save(tmp_path / "p.relax")
    back = fusebox.load(tmp_path / "p.relax")
    assert back.text() == part.text()
    assert sorted(back.functions) == sorted(part.functions) == [
        "fused_relax_nn_conv2d_relax_nn_relu", "fused_relax_nn_conv2d_relax_nn_relu1", "main"]
