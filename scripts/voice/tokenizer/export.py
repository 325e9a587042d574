"""ONNX export of the tokenizer graphs, int8 weight quantisation of the encoder, and onnxruntime sessions."""
from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from specli.io.digest import file_sha256

INPUT_NAMES = ["feats", "feats_length"]
OPSET = 17


def export_fp32(module: torch.nn.Module, path: Path, output_names: list[str]) -> None:
    """Legacy (TorchScript) export with a dynamic frame axis; one file, no external data."""
    mel = torch.zeros(1, 128, 200)
    length = torch.tensor([200], dtype=torch.int32)
    axes = {"feats": {2: "T"}, **{name: {1: "N"} for name in output_names}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (mel, length), str(path), dynamo=False, input_names=INPUT_NAMES,
                          output_names=output_names, dynamic_axes=axes, opset_version=OPSET,
                          do_constant_folding=True)


def encoder_matmuls(path: Path) -> list[str]:
    """Names of the MatMul nodes with a weight initializer inside the encoder blocks."""
    import onnx

    model = onnx.load(str(path))
    inits = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node
            if n.op_type == "MatMul" and "/encoder/layers." in n.name and any(i in inits for i in n.input)]


def quantize_encoder(src: Path, dst: Path) -> int:
    """int8 per-channel dynamic quantisation of the encoder blocks' MatMul weights; returns nodes done."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    nodes = encoder_matmuls(src)
    quantize_dynamic(str(src), str(dst), per_channel=True, weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul"], nodes_to_quantize=nodes)
    return len(nodes)


def int8_targets(path: Path, extra: bool) -> dict[str, int]:
    """Initializers to store as int8 -> per-channel axis: the encoder blocks' MatMul weights ``[K, N]``
    (per output column); with ``extra`` also both conv weights (per output channel) and the positional
    table (per column)."""
    import onnx

    model = onnx.load(str(path))
    inits = [i.name for i in model.graph.initializer]  # graph order: the written file must not follow set hashing
    names = set(encoder_matmuls(path))
    out = {n.input[1]: 1 for n in model.graph.node if n.name in names and n.input[1] in inits}
    if extra:  # "encoder.*" in the feature graph, "features.encoder.*" in the tokenizer graph
        suffixes = {"encoder.conv1.weight": 0, "encoder.conv2.weight": 0, "encoder.embed_positions": 1}
        out.update({name: ax for name in inits for suffix, ax in suffixes.items()
                    if name == suffix or name.endswith("." + suffix)})
    return out


def int8_weights(src: Path, dst: Path, extra: bool = True) -> int:
    """Weight-only int8: each target initializer becomes int8 + a per-channel scale feeding a
    DequantizeLinear; activations stay float32.  Returns the number of tensors converted."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    targets = int8_targets(src, extra)
    for base, axis in targets.items():
        w = numpy_helper.to_array(inits[base]).astype(np.float32)
        other = tuple(d for d in range(w.ndim) if d != axis)
        scale = np.maximum(np.abs(w).max(axis=other), 1e-12) / 127.0
        shape = [1] * w.ndim
        shape[axis] = -1
        q = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
        model.graph.initializer.remove(inits[base])
        model.graph.initializer.extend([numpy_helper.from_array(q, base + "_q"),
                                        numpy_helper.from_array(scale.astype(np.float32), base + "_s"),
                                        numpy_helper.from_array(np.zeros_like(scale, np.int8), base + "_z")])
        model.graph.node.append(helper.make_node("DequantizeLinear", [base + "_q", base + "_s", base + "_z"],
                                                 [base], name=base + "_dq", axis=axis))
    model = _toposort(model)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
    return len(targets)


def _toposort(model):  # -> onnx.ModelProto; the DequantizeLinear nodes were appended at the end
    from onnx import helper

    g = model.graph
    known = {i.name for i in g.initializer} | {i.name for i in g.input}
    pending, order = list(g.node), []
    while pending:
        ready = [n for n in pending if all(not i or i in known for i in n.input)]
        if not ready:
            raise ValueError("graph has a cycle or a missing input")
        for n in ready:
            order.append(n)
            known.update(n.output)
        pending = [n for n in pending if all(n is not r for r in ready)]
    graph = helper.make_graph(order, g.name, g.input, g.output, g.initializer, value_info=g.value_info)
    return helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)


QUANT_MODES = ("weights", "dynamic", "none")


def export(module: torch.nn.Module, path: Path, output_names: list[str], quant: str = "weights") -> dict:
    """Export ``module`` to ``path`` (atomically); ``quant``: int8 encoder weights only (``weights``),
    onnxruntime dynamic quantisation (``dynamic``: int8 weights and activations) or none."""
    if quant not in QUANT_MODES:
        raise ValueError(f"quant must be one of {QUANT_MODES}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as td:
        fp32 = Path(td) / "fp32.onnx"
        export_fp32(module, fp32, output_names)
        out = Path(td) / "out.onnx"
        nodes = {"weights": int8_weights, "dynamic": quantize_encoder}.get(quant, lambda a, b: 0)(fp32, out)
        os.replace(out if nodes else fp32, path)
    return {"path": str(path), "bytes": path.stat().st_size, "sha256": file_sha256(path),
            "quant": quant, "int8_matmuls": nodes}


def session(path: Path, threads: int = 1):  # -> onnxruntime.InferenceSession
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def run(sess, mel128: np.ndarray) -> list[np.ndarray]:
    """Run a tokenizer/feature session on one ``[1, 128, T]`` log-mel."""
    feeds = {"feats": np.ascontiguousarray(mel128, dtype=np.float32),
             "feats_length": np.array([mel128.shape[2]], dtype=np.int32)}
    return sess.run(None, feeds)
