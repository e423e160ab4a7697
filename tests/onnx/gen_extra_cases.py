#!/usr/bin/env python3
"""Writes fusebox's extra ONNX cases, each checked against onnxruntime or numpy: `tests/onnx/extra/`.

The ONNX node conformance suite (`gen_node_cases.py`) leaves parts of some ops untested (Scan's
directions and axes, opset 8's batched Scan, a Scan inside a Scan's body, Col2Im with rows
past its last block, QLinearConv with per-channel weight scales and zero points), and the
value-dependent ops only alone (here NonZero, Compress, Unique and NonMaxSuppression feed other
ops, ask for some of their outputs, select nothing, or take defaults), and has one 3-D
ConvTranspose and no 3-D Conv (here strides, dilations, pads, groups, `auto_pad`,
`output_shape`, and a 3-D Col2Im with pads and dilation, whose reference is `col2im_numpy`:
onnxruntime 1.32 gets that one wrong), nor the shape arithmetic Hugging Face exports write
around Tile, Resize, Expand, Range and EyeLike over symbolic dims (DeBERTa-v2, SegFormer,
BART, XLNet), MPT's Slice from a Max of symbolic dims, Mamba2's padded-then-unpadded view, nor RoiAlign's adaptive sampling, spatial scale and boxes beyond the borders,
BitCast and Det inside larger graphs, or TfIdfVectorizer's weights, skips and shared columns.
The DFT and STFT cases
(padding, truncation, complex and real inputs, odd lengths, windows, two-sided spectra) take
their outputs from numpy's FFT instead: onnxruntime 1.32 fails the suite's own DFT and STFT
cases, so its outputs there would be no reference. Each case here is
a small model built with `onnx.helper`, seeded random inputs, and the outputs onnxruntime's CPU
provider computes on them, written in the node cases' layout (`<case>/model.onnx`,
`<case>/test_data_set_0/{input,output}_<i>.pb`, `manifest.json`) and committed, so
`tests/onnx_node.rs` runs them without onnxruntime. Hand-run, deterministic:

    .venv/bin/python tests/onnx/gen_extra_cases.py            # rewrites tests/onnx/extra/
"""

import itertools
import json
import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "extra")


def f32(name, shape):
    return h.make_tensor_value_info(name, TP.FLOAT, shape)


def scalar(name, v):
    return numpy_helper.from_array(np.array(v, np.float32), name)


def step_body():
    """state (4,), x_t (4,) → state' = state·0.5 + x_t; y_t = state' − 3·x_t; w_t = x_t."""
    nodes = [
        h.make_node("Mul", ["s_in", "half"], ["s_h"]),
        h.make_node("Add", ["s_h", "x_t"], ["s_out"]),
        h.make_node("Mul", ["x_t", "three"], ["x3"]),
        h.make_node("Sub", ["s_out", "x3"], ["y_t"]),
        h.make_node("Identity", ["x_t"], ["w_t"]),
    ]
    return h.make_graph(nodes, "body", [f32("s_in", [4]), f32("x_t", [4])],
                        [f32("s_out", [4]), f32("y_t", [4]), f32("w_t", [4])],
                        [scalar("half", 0.5), scalar("three", 3.0)])


def scan_model(name, attrs, xshape, opset=17, s0shape=(4,), seq_lens=False):
    ins = ["", "s0", "x"] if opset < 9 else ["s0", "x"]
    node = h.make_node("Scan", ins, ["s", "y", "w"], num_scan_inputs=1, body=step_body(), **attrs)
    g = h.make_graph([node], name, [f32("s0", list(s0shape)), f32("x", xshape)],
                     [f32("s", None), f32("y", None), f32("w", None)])
    return g, opset


def nested_model():
    """An outer Scan over x (3, 2, 4) whose body runs an inner Scan over the step's 2 rows."""
    inner = h.make_node("Scan", ["acc_in", "x_t"], ["acc_out", "rows"], num_scan_inputs=1,
                        body=h.make_graph(
                            [h.make_node("Add", ["a_in", "r_t"], ["a_out"]),
                             h.make_node("Mul", ["a_out", "s_in"], ["r_out"])],
                            "inner", [f32("a_in", [4]), f32("r_t", [4])],
                            [f32("a_out", [4]), f32("r_out", [4])]),
                        scan_input_directions=[1])
    outer_body = h.make_graph(
        [h.make_node("Identity", ["s_in"], ["acc_in"]), inner,
         h.make_node("ReduceSum", ["rows"], ["rsum"], axes=[0], keepdims=0),
         h.make_node("Tanh", ["acc_out"], ["s_out"])],
        "outer", [f32("s_in", [4]), f32("x_t", [2, 4])],
        [f32("s_out", [4]), f32("rsum", [4])])
    node = h.make_node("Scan", ["s0", "x"], ["s", "y"], num_scan_inputs=1, body=outer_body)
    g = h.make_graph([node], "scan_nested", [f32("s0", [4]), f32("x", [3, 2, 4])],
                     [f32("s", None), f32("y", None)])
    return g, 11


def col2im_model(name):
    """Col2Im with a remainder past the last block on one axis (transposed conv's output
    padding), a rectangular block, dilation and asymmetric pads, batch 2."""
    image, block = [5, 7], [2, 3]
    strides, dil, pads = [2, 2], [1, 2], [1, 0, 0, 1]
    nb = [(image[d] + pads[d] + pads[d + 2] - (dil[d] * (block[d] - 1) + 1)) // strides[d] + 1
          for d in range(2)]
    c = 2
    node = h.make_node("Col2Im", ["x", "image_shape", "block_shape"], ["y"], strides=strides,
                       dilations=dil, pads=pads)
    g = h.make_graph([node], name, [f32("x", [2, c * block[0] * block[1], nb[0] * nb[1]])],
                     [f32("y", None)],
                     [numpy_helper.from_array(np.array(image, np.int64), "image_shape"),
                      numpy_helper.from_array(np.array(block, np.int64), "block_shape")])
    return g, 18


def col2im3d_model(name):
    """Col2Im of 3 spatial axes: a remainder past the last block on one axis, dilation on
    another, asymmetric pads, batch 2."""
    image, block = [5, 6, 4], [2, 2, 2]
    strides, dil, pads = [2, 1, 2], [1, 2, 1], [1, 0, 0, 0, 1, 1]
    nb = [(image[d] + pads[d] + pads[d + 3] - (dil[d] * (block[d] - 1) + 1)) // strides[d] + 1
          for d in range(3)]
    c = 2
    node = h.make_node("Col2Im", ["x", "image_shape", "block_shape"], ["y"], strides=strides,
                       dilations=dil, pads=pads)
    g = h.make_graph([node], name, [f32("x", [2, c * 8, nb[0] * nb[1] * nb[2]])],
                     [f32("y", None)],
                     [numpy_helper.from_array(np.array(image, np.int64), "image_shape"),
                      numpy_helper.from_array(np.array(block, np.int64), "block_shape")])
    return g, 18


def conv3d_model(name, op, xshape, wshape, bias, **attrs):
    """One 3-D `Conv` or `ConvTranspose` (weights and bias as inputs, so the case feeds them)."""
    ins = [f32("x", xshape), f32("w", wshape)]
    names = ["x", "w"]
    if bias:
        ins.append(f32("b", [bias]))
        names.append("b")
    node = h.make_node(op, names, ["y"], **attrs)
    return h.make_graph([node], name, ins, [f32("y", None)]), 22


def qlinear_conv_model(name):
    """QLinearConv with per-output-channel weight scales and zero points, an int32 bias,
    stride 2 and padding: uint8 data and weights."""
    node = h.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                       strides=[2, 2], pads=[1, 1, 1, 1])
    r = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
        numpy_helper.from_array(np.array(128, np.uint8), "xz"),
        numpy_helper.from_array(r.integers(0, 256, (3, 2, 3, 3), dtype=np.uint8), "w"),
        numpy_helper.from_array(np.array([0.01, 0.02, 0.015], np.float32), "ws"),
        numpy_helper.from_array(np.array([120, 128, 131], np.uint8), "wz"),
        numpy_helper.from_array(np.array(0.3, np.float32), "ys"),
        numpy_helper.from_array(np.array(100, np.uint8), "yz"),
        numpy_helper.from_array(np.array([-300, 0, 450], np.int32), "b"),
    ]
    g = h.make_graph([node], name, [h.make_tensor_value_info("x", TP.UINT8, [1, 2, 5, 6])],
                     [h.make_tensor_value_info("y", TP.UINT8, None)], inits)
    return g, 13


def i64(name, shape):
    return h.make_tensor_value_info(name, TP.INT64, shape)


def nonzero_gather_model(name):
    """x[relu(x) != 0] as exporters write a boolean-mask read: NonZero, Transpose, GatherND."""
    nodes = [
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("NonZero", ["r"], ["nz"]),
        h.make_node("Transpose", ["nz"], ["idx"]),
        h.make_node("GatherND", ["r", "idx"], ["y"]),
        h.make_node("Mul", ["y", "two"], ["z"]),
    ]
    g = h.make_graph(nodes, name, [f32("x", [3, 4])], [f32("z", None), i64("idx", None)],
                     [scalar("two", 2.0)])
    return g, 13


def compress_model(name):
    """Compress along axis 1 of a 3-D input with a condition shorter than the axis, then an
    elementwise op on the value-dependent shape."""
    nodes = [
        h.make_node("Compress", ["x", "c"], ["y"], axis=1),
        h.make_node("Add", ["y", "y"], ["z"]),
    ]
    g = h.make_graph(nodes, name, [f32("x", [2, 5, 3]),
                                   h.make_tensor_value_info("c", TP.BOOL, [4])],
                     [f32("z", None)])
    return g, 13


def unique_axis_model(name):
    """Unique rows of an int64 matrix in first-occurrence order, asking for the values and
    the inverse indices only."""
    node = h.make_node("Unique", ["x"], ["y", "", "inv"], axis=0, sorted=0)
    g = h.make_graph([node], name, [i64("x", [7, 2])], [i64("y", None), i64("inv", None)])
    return g, 13


def unique_counts_model(name):
    """Unique values of a flat int64 tensor, sorted, with first indices and counts; the counts
    feed an Add."""
    nodes = [
        h.make_node("Unique", ["x"], ["y", "idx", "", "cnt"]),
        h.make_node("Add", ["cnt", "idx"], ["s"]),
    ]
    g = h.make_graph(nodes, name, [i64("x", [12])],
                     [i64("y", None), i64("idx", None), i64("s", None)])
    return g, 13


def nms_center_model(name):
    """NonMaxSuppression on center-point boxes, two batches and three classes, no score
    threshold input; the kept box indices then gather batch 0's boxes."""
    r = np.random.default_rng(11)
    centers = r.uniform(0.0, 4.0, (2, 8, 2))
    sizes = r.uniform(0.5, 2.5, (2, 8, 2))
    boxes = np.concatenate([centers, sizes], axis=2).astype(np.float32)
    nodes = [
        h.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou"], ["sel"],
                    center_point_box=1),
        h.make_node("Gather", ["sel", "two"], ["box_idx"], axis=1),
        h.make_node("Gather", ["boxes0", "box_idx"], ["kept"], axis=0),
    ]
    inits = [
        numpy_helper.from_array(boxes, "boxes"),
        numpy_helper.from_array(boxes[0], "boxes0"),
        numpy_helper.from_array(np.array([3], np.int64), "max_out"),
        numpy_helper.from_array(np.array([0.3], np.float32), "iou"),
        numpy_helper.from_array(np.array(2, np.int64), "two"),
    ]
    g = h.make_graph(nodes, name, [f32("scores", [2, 3, 8])],
                     [i64("sel", None), f32("kept", None)], inits)
    return g, 11


def nms_default_max_model(name):
    """NonMaxSuppression with only boxes and scores: max_output_boxes_per_class defaults to
    0, so nothing is selected (a (0, 3) result)."""
    node = h.make_node("NonMaxSuppression", ["boxes", "scores"], ["sel"])
    g = h.make_graph([node], name, [f32("boxes", [1, 5, 4]), f32("scores", [1, 2, 5])],
                     [i64("sel", None)])
    return g, 11


def maxpool_unpool_model(name):
    """SegNet's pooling pair: MaxPool with its Indices output (padding, stride 2), then
    MaxUnpool of the pooled values at those indices."""
    nodes = [
        h.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[3, 3], strides=[2, 2],
                    pads=[1, 1, 1, 1]),
        h.make_node("MaxUnpool", ["p", "i", "shape"], ["y"], kernel_shape=[3, 3],
                    strides=[2, 2], pads=[1, 1, 1, 1]),
    ]
    inits = [numpy_helper.from_array(np.array([2, 3, 9, 7], np.int64), "shape")]
    g = h.make_graph(nodes, name, [f32("x", [2, 3, 9, 7])],
                     [f32("p", None), i64("i", None), f32("y", None)], inits)
    return g, 12


def maxpool_indices_model(name, shape, attrs):
    node = h.make_node("MaxPool", ["x"], ["p", "i"], **attrs)
    g = h.make_graph([node], name, [f32("x", shape)], [f32("p", None), i64("i", None)])
    return g, 12


def deform_conv_model(name, mask):
    """DeformConv with two groups and two offset groups, stride 2, dilation, padding, a bias
    and (optionally) a mask; offsets reach past the image."""
    r = np.random.default_rng(5)
    ins = ["x", "w", "off", "b"] + (["m"] if mask else [])
    node = h.make_node("DeformConv", ins, ["y"], group=2, offset_group=2, strides=[2, 1],
                       dilations=[1, 2], pads=[1, 2, 1, 0])
    inits = [
        numpy_helper.from_array(r.standard_normal((6, 2, 3, 2)).astype(np.float32), "w"),
        numpy_helper.from_array(r.standard_normal(6).astype(np.float32), "b"),
    ]
    # Output (4, 6): (7 + 1 + 1 - 3) // 2 + 1 = 4 rows, (6 + 2 + 0 - 3) // 1 + 1 = 6 columns.
    inputs = [f32("x", [2, 4, 7, 6]), f32("off", [2, 2 * 2 * 6, 4, 6])]
    if mask:
        inputs.append(f32("m", [2, 2 * 6, 4, 6]))
    g = h.make_graph([node], name, inputs, [f32("y", None)], inits)
    return g, 19


def loop_model(name):
    """A Loop with no trip count that stops through its condition (i + 1 < 4, computed in the
    body from the iteration number), two loop-carried values (one the body never changes) and
    a scan output that reads the enclosing graph's `x` by name."""
    body = h.make_graph(
        [
            h.make_node("Add", ["i", "one"], ["next"]),
            h.make_node("Less", ["next", "four"], ["c_out"]),
            h.make_node("Gather", ["x", "i"], ["row"], axis=0),
            h.make_node("Mul", ["acc", "row"], ["acc_out"]),
            h.make_node("Identity", ["keep"], ["keep_out"]),
            h.make_node("Add", ["acc_out", "keep"], ["scan"]),
        ],
        "body",
        [i64("i", []), h.make_tensor_value_info("c", TP.BOOL, []), f32("acc", [3]),
         f32("keep", [3])],
        [h.make_tensor_value_info("c_out", TP.BOOL, []), f32("acc_out", [3]),
         f32("keep_out", [3]), f32("scan", [3])],
        [numpy_helper.from_array(np.array(1, np.int64), "one"),
         numpy_helper.from_array(np.array(4, np.int64), "four")])
    node = h.make_node("Loop", ["", "", "acc0", "keep0"], ["acc", "keep", "rows"], body=body)
    g = h.make_graph([node], name, [f32("x", [5, 3]), f32("acc0", [3]), f32("keep0", [3])],
                     [f32("acc", None), f32("keep", None), f32("rows", None)])
    return g, 13


def complex_of(x):
    """A signal's complex values: its last axis is 1 (real) or 2 (real, imaginary)."""
    x = x.astype(np.float64)
    return x[..., 0] + (1j * x[..., 1] if x.shape[-1] == 2 else 0)


def split(c):
    return np.stack([c.real, c.imag], axis=-1).astype(np.float32)


def dft_model(name, shape, attrs, opset, n=None, axis_input=None):
    ins = ["x", "n" if n is not None else ""]
    inits = [] if n is None else [numpy_helper.from_array(np.array(n, np.int64), "n")]
    if axis_input is not None:
        ins.append("axis")
        inits.append(numpy_helper.from_array(np.array(axis_input, np.int64), "axis"))
    node = h.make_node("DFT", ins, ["y"], **attrs)
    g = h.make_graph([node], name, [f32("x", shape)], [f32("y", None)], inits)
    return g, opset


def stft_model(name, shape, step, window, frame_length, onesided):
    ins = ["x", "step", "window" if window is not None else "",
           "len" if frame_length is not None else ""]
    inits = [numpy_helper.from_array(np.array(step, np.int64), "step")]
    if window is not None:
        inits.append(numpy_helper.from_array(window.astype(np.float32), "window"))
    if frame_length is not None:
        inits.append(numpy_helper.from_array(np.array(frame_length, np.int64), "len"))
    while ins[-1] == "":
        ins.pop()
    node = h.make_node("STFT", ins, ["y"], onesided=onesided)
    g = h.make_graph([node], name, [f32("x", shape)], [f32("y", None)], inits)
    return g, 17


def stft_numpy(x, step, window, f, onesided):
    c = complex_of(x)
    frames = 1 + (c.shape[1] - f) // step
    fr = np.stack([c[:, t * step:t * step + f] for t in range(frames)], axis=1)
    if window is not None:
        fr = fr * window.astype(np.float32).astype(np.float64)
    y = np.fft.fft(fr, axis=2)
    return split(y[:, :, :f // 2 + 1] if onesided else y)


HANN8 = np.hanning(10)[1:-1]

# name -> (model builder, numpy definition of the outputs from the inputs)
NUMPY = {
    "dft17_complex_padded_axis2": (
        lambda n: dft_model(n, [2, 3, 5, 2], dict(axis=2), 17, n=8),
        lambda x: [split(np.fft.fft(complex_of(x), n=8, axis=2))]),
    "dft20_real_inverse_truncated": (
        lambda n: dft_model(n, [3, 12, 1], dict(inverse=1), 20, n=8, axis_input=-2),
        lambda x: [split(np.fft.ifft(complex_of(x), n=8, axis=1))]),
    "dft20_irfft_odd_length": (
        lambda n: dft_model(n, [1, 7, 2], dict(inverse=1, onesided=1), 20, n=11, axis_input=1),
        lambda x: [np.fft.irfft(complex_of(x), n=11, axis=1)[..., None].astype(np.float32)]),
    "dft17_rfft_axis1_of_4d": (
        lambda n: dft_model(n, [2, 9, 3, 1], dict(axis=1, onesided=1), 17),
        lambda x: [split(np.fft.rfft(complex_of(x).real, axis=1))]),
    "stft_complex_hann_two_sided": (
        lambda n: stft_model(n, [2, 40, 2], 5, HANN8, None, 0),
        lambda x: [stft_numpy(x, 5, HANN8, 8, False)]),
    "stft_real_no_window_odd_frame": (
        lambda n: stft_model(n, [1, 33, 1], 4, None, 7, 1),
        lambda x: [stft_numpy(x, 4, None, 7, True)]),
}


def col2im_numpy(x, image, block, strides, dil, pads):
    """Col2Im as ONNX defines it, block by block: element `k` of block `b` adds onto image
    position `b·stride + k·dilation − pad_begin` when that lies inside the image."""
    r = len(image)
    nb = [(image[i] + pads[i] + pads[i + r] - (dil[i] * (block[i] - 1) + 1)) // strides[i] + 1
          for i in range(r)]
    n, ck, _ = x.shape
    c = ck // int(np.prod(block))
    out = np.zeros((n, c) + tuple(image), np.float64)
    xr = x.reshape((n, c) + tuple(block) + tuple(nb))
    for b in itertools.product(*[range(v) for v in nb]):
        for k in itertools.product(*[range(v) for v in block]):
            p = [b[i] * strides[i] + k[i] * dil[i] - pads[i] for i in range(r)]
            if all(0 <= p[i] < image[i] for i in range(r)):
                out[(slice(None), slice(None)) + tuple(p)] += xr[(slice(None), slice(None))
                                                               + k + b]
    return out.astype(np.float32)


# Cases whose reference is numpy because onnxruntime 1.32 computes them wrong: its 3-D Col2Im
# with pads and dilation disagrees with ONNX's reference evaluator and with `col2im_numpy`
# (which agree with each other), by up to 5.2 on this case.
NUMPY_ORT_WRONG = {
    "col2im_3d_remainder_dilated": (
        col2im3d_model,
        lambda x: [col2im_numpy(x, [5, 6, 4], [2, 2, 2], [2, 1, 2], [1, 2, 1],
                                [1, 0, 0, 0, 1, 1])]),
}


# Values of the symbolic dims (`dim_param`) of the exporter-shape cases' inputs.
SYMBOLIC = {"batch": 3, "n": 5, "chunked": 8}


def i64c(name, v):
    return numpy_helper.from_array(np.array(v, np.int64), name)


def tile_symbolic_model(name):
    """DeBERTa-v2's Tile: repeats [2·batch, 2] computed from another input's shape."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"], start=0, end=1),
        h.make_node("Mul", ["s", "two"], ["b2"]),
        h.make_node("Concat", ["b2", "two"], ["reps"], axis=0),
        h.make_node("Tile", ["z", "reps"], ["y"]),
    ]
    return h.make_graph(nodes, name, [f32("x", ["batch", 4]), f32("z", [2, 3])],
                        [f32("y", None)], [i64c("two", [2])]), 15


def resize_symbolic_batch_model(name):
    """SegFormer's Resize: sizes = Concat(Shape(x)[:2], [5, 7]) over a symbolic batch."""
    nodes = [
        h.make_node("Shape", ["x"], ["nc"], start=0, end=2),
        h.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
        h.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear"),
    ]
    return h.make_graph(nodes, name, [f32("x", ["batch", 2, 3, 4])], [f32("y", None)],
                        [i64c("hw", [5, 7])]), 15


def expand_bart_positions_model(name):
    """BART's Expand: target Where(Equal(s, -1), 1, s), s = Shape(r[:, None] + r[1:]) =
    (n, n − 1) for r = Range(n), then added to the input's first n − 1 columns."""
    nodes = [
        h.make_node("Shape", ["x"], ["n1"], start=1, end=2),
        h.make_node("Squeeze", ["n1"], ["n"]),
        h.make_node("Range", ["zero", "n", "one"], ["r"]),
        h.make_node("Reshape", ["r", "col"], ["rc"]),
        h.make_node("Slice", ["r", "one1", "big"], ["tail"]),
        h.make_node("Add", ["rc", "tail"], ["sum"]),
        h.make_node("Shape", ["sum"], ["s"]),
        h.make_node("Equal", ["s", "minus1"], ["m1"]),
        h.make_node("Where", ["m1", "ones", "s"], ["target"]),
        h.make_node("Expand", ["bias", "target"], ["e"]),
        h.make_node("Slice", ["x", "zero1", "minus1", "one1"], ["xs"]),
        h.make_node("Add", ["e", "xs"], ["y"]),
    ]
    return h.make_graph(
        nodes, name, [f32("x", ["n", "n"])], [f32("y", None)],
        [i64c("zero", 0), i64c("one", 1), i64c("one1", [1]), i64c("zero1", [0]),
         i64c("big", [2**62]), i64c("col", [-1, 1]), i64c("minus1", [-1]), i64c("ones", [1, 1]),
         numpy_helper.from_array(np.array([0.5], np.float32), "bias")]), 15



def xlnet_positions_model(name):
    """XLNet's relative positions: Range(n, −n, −1) over a symbolic n, and EyeLike (k = 1) of
    ConstantOfShape([n, n + 1]), each added to float data so both are checked as values."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"], start=0, end=1),
        h.make_node("Squeeze", ["s"], ["n"]),
        h.make_node("Neg", ["n"], ["neg"]),
        h.make_node("Range", ["n", "neg", "minus1"], ["r"]),
        h.make_node("Cast", ["r"], ["rf"], to=TP.FLOAT),
        h.make_node("Add", ["s", "one"], ["s1"]),
        h.make_node("Concat", ["s", "s1"], ["nn"], axis=0),
        h.make_node("ConstantOfShape", ["nn"], ["zeros"]),
        h.make_node("EyeLike", ["zeros"], ["eye"], k=1),
        h.make_node("Add", ["eye", "x"], ["y"]),
    ]
    return h.make_graph(
        nodes, name, [f32("x", ["n", 1])], [f32("rf", None), f32("y", None)],
        [i64c("minus1", -1), i64c("one", [1])]), 15


def resize_1d_model(name, mode, sizes=None, scales=None, axes=None, opset=15, **attrs):
    """SAM's Resize of a sequence: (N, C, L) → (N, C, L'), as `F.interpolate(mode="linear")`
    exports it (three sizes or scales, or one with `axes`)."""
    inits, args = [], ["x", "", "", ""]
    if sizes is not None:
        inits.append(i64c("sizes", sizes))
        args[3] = "sizes"
    else:
        inits.append(numpy_helper.from_array(np.array(scales, np.float32), "scales"))
        args[2] = "scales"
    if axes is not None:
        attrs["axes"] = axes
    nodes = [h.make_node("Resize", args, ["y"], mode=mode, **attrs)]
    return h.make_graph(nodes, name, [f32("x", [2, 3, 7])], [f32("y", None)], inits), opset


def moe_repeat_model(name):
    """The MoE experts' `x.unsqueeze(1).repeat(1, top_k, 1)` as TorchScript exports it: the
    repeats are `OneHot([1], 3, [1, top_k])`, top_k read off another input's shape."""
    nodes = [
        h.make_node("Unsqueeze", ["x", "one1"], ["z"]),
        h.make_node("Shape", ["w"], ["k"], start=-1),
        h.make_node("Concat", ["one1", "k"], ["vals"], axis=0),
        h.make_node("OneHot", ["one1", "three", "vals"], ["oh"]),
        h.make_node("Reshape", ["oh", "minus1"], ["reps"]),
        h.make_node("Tile", ["z", "reps"], ["y"]),
    ]
    return h.make_graph(
        nodes, name, [f32("x", ["batch", 3]), f32("w", ["batch", 2])], [f32("y", None)],
        [i64c("one1", [1]), i64c("three", 3), i64c("minus1", [-1])]), 15


def slice_symbolic_start_model(name, negative=False):
    """MPT's ALiBi bias `bias[:, max_len - n:]`: a Slice whose start is a static length less
    the symbolic sequence length, to INT64_MAX; `negative`: `bias[:, -n:]` (start `-n`)."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"], start=0, end=1),
        h.make_node("Neg", ["s"], ["start"]) if negative else
        h.make_node("Sub", ["ten", "s"], ["start"]),
        h.make_node("Slice", ["t", "start", "big", "one1"], ["y"]),
    ]
    return h.make_graph(
        nodes, name, [f32("x", ["n"]), f32("t", [4, 10])], [f32("y", None)],
        [i64c("ten", [10]), i64c("big", [2**63 - 1]), i64c("one1", [1])]), 15


def mpt_alibi_model(name):
    """MPT's ALiBi bias as its dynamo export slices it: `bias[:, max(1 - n, 0):, max(L - n,
    0):]` of a `[heads, 1, L]` bias (the starts are `Max`es of symbolic dims), added to the
    `[batch, heads, n, n]` scores, then viewed as `[batch, n, -1]`."""
    nodes = [
        h.make_node("Shape", ["s"], ["n"], start=2, end=3),
        h.make_node("Shape", ["s"], ["b"], start=0, end=1),
        h.make_node("Sub", ["one", "n"], ["q0"]),
        h.make_node("Max", ["q0", "zero"], ["qs"]),
        h.make_node("Sub", ["ten", "n"], ["k0"]),
        h.make_node("Max", ["k0", "zero"], ["ks"]),
        h.make_node("Slice", ["bias", "qs", "big", "one"], ["b1"]),
        h.make_node("Slice", ["b1", "ks", "big", "two"], ["b2"]),
        h.make_node("Add", ["s", "b2"], ["y"]),
        h.make_node("Concat", ["b", "n", "minus1"], ["shape"], axis=0),
        h.make_node("Reshape", ["y", "shape"], ["z"]),
    ]
    bias = np.arange(20, dtype=np.float32).reshape(2, 1, 10) * 0.125 - 1.0
    return h.make_graph(
        nodes, name, [f32("s", ["batch", 2, "n", "n"])], [f32("z", None)],
        [numpy_helper.from_array(bias, "bias"), i64c("one", [1]), i64c("two", [2]),
         i64c("zero", [0]), i64c("ten", [10]), i64c("big", [2**63 - 1]),
         i64c("minus1", [-1])]), 18


def mamba2_padded_view_model(name):
    """Mamba2's dynamo export: the sequence padded to whole chunks of 4 (`Pad` by `(-n) % 4`),
    viewed in chunks, scaled, then viewed back as `[batch, n, -1]` (valid for the multiples of
    4 it was traced at: the `-1` is `(n + 3) // 4 * 64 // n`), gated by the input and
    projected."""
    nodes = [
        h.make_node("Shape", ["x"], ["b"], start=0, end=1),
        h.make_node("Shape", ["x"], ["n"], start=1, end=2),
        h.make_node("Neg", ["n"], ["neg"]),
        h.make_node("Mod", ["neg", "four"], ["padw"]),
        h.make_node("Concat", ["zero3", "padw", "zero1"], ["pads"], axis=0),
        h.make_node("Pad", ["x", "pads"], ["padded"]),
        h.make_node("Reshape", ["padded", "chunks"], ["c"]),
        h.make_node("Mul", ["c", "scale"], ["cs"]),
        h.make_node("Concat", ["b", "n", "minus1"], ["back"], axis=0),
        h.make_node("Reshape", ["cs", "back"], ["v"]),
        h.make_node("Mul", ["v", "x"], ["g"]),
        h.make_node("MatMul", ["g", "w"], ["y"]),
    ]
    r = np.random.default_rng(7)
    return h.make_graph(
        nodes, name, [f32("x", ["batch", "chunked", 16])], [f32("y", None)],
        [i64c("four", [4]), i64c("zero3", [0, 0, 0, 0]), i64c("zero1", [0]),
         i64c("chunks", [0, -1, 4, 16]), i64c("minus1", [-1]),
         numpy_helper.from_array(r.standard_normal((4, 1)).astype(np.float32), "scale"),
         numpy_helper.from_array(r.standard_normal((16, 3)).astype(np.float32), "w")]), 18


# Numpy-defined cases over symbolic dims, after every other case (so earlier cases keep their
# seeded inputs): FNet's FFT over the symbolic sequence.
def roi_align_model(name, opset, n_rois, seed, **attrs):
    """RoiAlign over a two-image batch of 13×11 feature maps with boxes (in image
    coordinates, `spatial_scale` away from the map) that straddle the borders, lie beyond them,
    are thinner than a pixel or have x2 < x1; the batch indices alternate."""
    r = np.random.default_rng(seed)
    scale = attrs.get("spatial_scale", 1.0)
    lo = r.uniform(-3.0, 12.0, (n_rois, 2)) / scale
    ext = r.uniform(-1.0, 9.0, (n_rois, 2)) / scale
    ext[0] = [0.3, 0.2]
    rois = np.concatenate([lo, lo + ext], axis=1).astype(np.float32)
    idx = (np.arange(n_rois) % 2).astype(np.int64)
    node = h.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], **attrs)
    g = h.make_graph([node], name, [f32("x", [2, 3, 13, 11])], [f32("y", None)],
                     [numpy_helper.from_array(rois, "rois"), numpy_helper.from_array(idx, "idx")])
    return g, opset


def bitcast_chain_model(name):
    """A float's exponent kept through its bits: Abs, BitCast to int32, BitwiseAnd with the
    exponent mask, BitCast back, Mul: the reinterpretations inside one elementwise chain."""
    nodes = [
        h.make_node("Abs", ["x"], ["a"]),
        h.make_node("BitCast", ["a"], ["bits"], to=TP.INT32),
        h.make_node("BitwiseAnd", ["bits", "mask"], ["e"]),
        h.make_node("BitCast", ["e"], ["p"], to=TP.FLOAT),
        h.make_node("Mul", ["p", "two"], ["y"]),
    ]
    g = h.make_graph(nodes, name, [f32("x", [3, 4])], [f32("y", None)],
                     [numpy_helper.from_array(np.array(0x7F800000, np.int32), "mask"),
                      scalar("two", 2.0)])
    return g, 26


def det_batched_model(name):
    """Det of a (2, 3, 5, 5) batch of products x·xᵀ + x (well away from singular), then Mul."""
    nodes = [
        h.make_node("Transpose", ["x"], ["xt"], perm=[0, 1, 3, 2]),
        h.make_node("MatMul", ["x", "xt"], ["g"]),
        h.make_node("Add", ["g", "x"], ["a"]),
        h.make_node("Det", ["a"], ["d"]),
        h.make_node("Mul", ["d", "two"], ["y"]),
    ]
    g = h.make_graph(nodes, name, [f32("x", [2, 3, 5, 5])], [f32("y", None)],
                     [scalar("two", 2.0)])
    return g, 22


def tfidf_model(name, shape, **attrs):
    """TfIdfVectorizer over int64 tokens in 0..3 (the generator's), so n-grams hit often."""
    node = h.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs)
    return h.make_graph([node], name, [i64("x", shape)], [f32("y", None)]), 9


# 1-, 2- and 3-grams; two n-grams on one column.
TFIDF_POOL = dict(ngram_counts=[0, 3, 11], pool_int64s=[0, 2, 1, 0, 1, 1, 2, 2, 2, 2, 0,
                                                         1, 1, 0, 2, 0, 1],
                  ngram_indexes=[0, 1, 2, 3, 4, 5, 6, 2, 7])
# The same n-grams on permuted columns: weights belong to the n-grams (the spec, onnxruntime).
TFIDF_POOL_PERM = {**TFIDF_POOL, "ngram_indexes": [3, 1, 0, 2, 4, 8, 5, 7, 6]}


NUMPY_SYMBOLIC = {
    "dft_symbolic_length_complex": (
        lambda n: dft_model(n, ["batch", "n", 2], dict(axis=1), 17),
        lambda x: [split(np.fft.fft(complex_of(x), axis=1))]),
    "dft_symbolic_length_real_inverse": (
        lambda n: dft_model(n, ["n", 3, 1], dict(axis=0, inverse=1), 17),
        lambda x: [split(np.fft.ifft(complex_of(x), axis=0))]),
    "dft_symbolic_length_rfft": (
        lambda n: dft_model(n, ["batch", "n", 1], dict(axis=1, onesided=1), 17),
        lambda x: [split(np.fft.rfft(complex_of(x).real, axis=1))]),
}


CASES = [
    ("scan_reverse_input_axis1_output_axes", lambda n: scan_model(
        n, dict(scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1, -1],
                scan_output_directions=[1, 0]), [4, 5])),
    ("scan_forward", lambda n: scan_model(n, {}, [3, 4])),
    ("scan_single_step", lambda n: scan_model(n, dict(scan_output_axes=[0, 1]), [1, 4])),
    ("scan8_batched_reverse", lambda n: scan_model(
        n, dict(directions=[1]), [2, 3, 4], opset=8, s0shape=(2, 4))),
    ("scan_nested", lambda n: nested_model()),
    ("col2im_remainder_dilated_rect", col2im_model),
    ("qlinearconv_per_channel_bias_strided", qlinear_conv_model),
    ("nonzero_transpose_gathernd", nonzero_gather_model),
    ("compress_axis1_short_condition", compress_model),
    ("unique_rows_unsorted_inverse", unique_axis_model),
    ("unique_sorted_counts_add", unique_counts_model),
    ("nms_center_two_batches_gather", nms_center_model),
    ("nms_default_max_selects_nothing", nms_default_max_model),
] + [(name, build) for name, (build, _) in NUMPY.items()] + [
    ("maxpool_indices_then_maxunpool", maxpool_unpool_model),
    ("maxpool1d_indices_dilated_ceil", lambda n: maxpool_indices_model(
        n, [2, 3, 11], dict(kernel_shape=[3], strides=[2], dilations=[2], ceil_mode=1))),
    ("maxpool2d_indices_column_major", lambda n: maxpool_indices_model(
        n, [1, 2, 6, 5], dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 1],
                              storage_order=1))),
    ("deform_conv_groups_offset_groups_mask", lambda n: deform_conv_model(n, True)),
    ("deform_conv_groups_offset_groups", lambda n: deform_conv_model(n, False)),
    ("loop_condition_from_iteration", loop_model),
    ("conv3d_strides_dilations_pads_bias", lambda n: conv3d_model(
        n, "Conv", [2, 4, 7, 8, 6], [6, 4, 3, 2, 3], 6, strides=[2, 1, 2],
        dilations=[2, 1, 1], pads=[1, 0, 1, 2, 1, 0])),
    ("conv3d_groups_same_upper", lambda n: conv3d_model(
        n, "Conv", [1, 4, 5, 6, 7], [4, 2, 2, 3, 3], 0, group=2, auto_pad="SAME_UPPER",
        strides=[2, 2, 1])),
    ("conv3d_depth_kernel_1", lambda n: conv3d_model(
        n, "Conv", [1, 3, 4, 5, 5], [2, 3, 1, 3, 3], 2)),
    ("convtranspose3d_groups_strides_pads_output_padding_bias", lambda n: conv3d_model(
        n, "ConvTranspose", [1, 4, 3, 4, 5], [4, 3, 3, 2, 3], 6, group=2, strides=[2, 1, 2],
        pads=[1, 0, 1, 0, 1, 0], output_padding=[1, 0, 1], dilations=[1, 2, 1])),
    ("convtranspose3d_output_shape", lambda n: conv3d_model(
        n, "ConvTranspose", [1, 2, 3, 3, 3], [2, 2, 3, 3, 3], 0, strides=[3, 2, 2],
        output_shape=[10, 8, 7])),
    ("convtranspose3d_dilated_depth_cropped", lambda n: conv3d_model(
        n, "ConvTranspose", [2, 1, 4, 3, 3], [1, 1, 3, 2, 2], 1, strides=[2, 1, 1],
        dilations=[3, 1, 1], pads=[4, 0, 0, 3, 0, 0])),
] + [(name, build) for name, (build, _) in NUMPY_ORT_WRONG.items()] + [
    ("tile_symbolic_repeats", tile_symbolic_model),
    ("resize_sizes_symbolic_batch", resize_symbolic_batch_model),
    ("expand_to_n_by_n_minus_1", expand_bart_positions_model),
    ("range_n_to_minus_n_and_eyelike", xlnet_positions_model),
    ("resize_1d_linear_sizes", lambda n: resize_1d_model(n, "linear", sizes=[2, 3, 12])),
    ("resize_1d_linear_scales_align_corners", lambda n: resize_1d_model(
        n, "linear", scales=[1.0, 1.0, 2.0], coordinate_transformation_mode="align_corners")),
    ("resize_1d_nearest_axes", lambda n: resize_1d_model(
        n, "nearest", sizes=[17], axes=[-1], opset=18, nearest_mode="ceil")),
    ("tile_by_onehot_repeats", moe_repeat_model),
    ("slice_from_symbolic_start", slice_symbolic_start_model),
]
CASES += [(name, build) for name, (build, _) in NUMPY_SYMBOLIC.items()]
CASES += [("slice_last_n_symbolic", lambda n: slice_symbolic_start_model(n, negative=True))]
CASES += [
    ("roialign10_adaptive_scaled", lambda n: roi_align_model(
        n, 10, 6, 1, output_height=3, output_width=2, spatial_scale=0.25)),
    ("roialign16_half_pixel_max_ratio3", lambda n: roi_align_model(
        n, 16, 5, 2, output_height=3, output_width=4, sampling_ratio=3, mode="max")),
    ("roialign16_half_pixel_adaptive_scaled", lambda n: roi_align_model(
        n, 16, 7, 3, output_height=2, output_width=2, spatial_scale=0.5)),
    ("roialign16_output_half_pixel_max_adaptive", lambda n: roi_align_model(
        n, 16, 4, 4, output_height=2, output_width=3, mode="max",
        coordinate_transformation_mode="output_half_pixel")),
]
CASES += [("bitcast_exponent_of_float", bitcast_chain_model),
          ("det_batched_5x5", det_batched_model)]
CASES += [
    ("tfidf_tf_1to3_grams_skip2_batch", lambda n: tfidf_model(
        n, [3, 9], mode="TF", min_gram_length=1, max_gram_length=3, max_skip_count=2,
        **TFIDF_POOL)),
    ("tfidf_idf_weights_bigrams_1d", lambda n: tfidf_model(
        n, [12], mode="IDF", min_gram_length=2, max_gram_length=2, max_skip_count=1,
        weights=[0.5, 1.5, 2.0, 3.0, 0.25, 4.0, 1.0, 2.5, 9.0], **TFIDF_POOL_PERM)),
    ("tfidf_tfidf_weights_2to3_grams", lambda n: tfidf_model(
        n, [2, 7], mode="TFIDF", min_gram_length=2, max_gram_length=3, max_skip_count=3,
        weights=[0.5, 1.5, 2.0, 3.0, 0.25, 4.0, 1.0, 2.5, 9.0], **TFIDF_POOL_PERM)),
    ("tfidf_idf_no_weights_unigrams", lambda n: tfidf_model(
        n, [2, 5], mode="IDF", min_gram_length=1, max_gram_length=1, max_skip_count=4,
        **TFIDF_POOL)),
]
CASES += [("mpt_alibi_slice_from_max_start", mpt_alibi_model),
          ("mamba2_padded_sequence_viewed_unpadded", mamba2_padded_view_model)]


def main() -> int:
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    rng = np.random.default_rng(20261204)
    manifest = []
    for name, build in CASES:
        g, opset = build(name)
        m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
        m.ir_version = 8
        d = os.path.join(OUT, name)
        ds = os.path.join(d, "test_data_set_0")
        os.makedirs(ds)
        path = os.path.join(d, "model.onnx")
        onnx.save(m, path)
        feeds = {}
        for vi in g.input:
            shape = [x.dim_value if x.HasField("dim_value") else SYMBOLIC[x.dim_param]
                     for x in vi.type.tensor_type.shape.dim]
            if vi.type.tensor_type.elem_type == TP.UINT8:
                feeds[vi.name] = rng.integers(0, 256, shape, dtype=np.uint8)
            elif vi.type.tensor_type.elem_type == TP.BOOL:
                feeds[vi.name] = rng.random(shape) < 0.5
            elif vi.type.tensor_type.elem_type == TP.INT64:
                # Few distinct values, so Unique finds repeats.
                feeds[vi.name] = rng.integers(0, 3, shape, dtype=np.int64)
            else:
                feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
        numpy_defs = {**NUMPY, **NUMPY_ORT_WRONG, **NUMPY_SYMBOLIC}
        if name in numpy_defs:
            outs = numpy_defs[name][1](*feeds.values())
        else:
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            outs = sess.run(None, feeds)
        for prefix, vals in (("input", list(feeds.values())), ("output", outs)):
            for i, v in enumerate(vals):
                with open(os.path.join(ds, f"{prefix}_{i}.pb"), "wb") as f:
                    f.write(numpy_helper.from_array(v).SerializeToString())
        manifest.append({"name": name, "ops": sorted({n.op_type for n in g.node}),
                         "opset": opset, "rtol": 1e-5, "atol": 1e-6,
                         "ort": "numpy" if name in numpy_defs else "pass"})
        print(name, [o.shape for o in outs])
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"onnxruntime {ort.__version__}: wrote {len(manifest)} cases to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
