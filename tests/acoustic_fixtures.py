"""Tiny random CosyVoice acoustic files in the official layouts (offline, for tests).

- :func:`official_hift_state`: a ``hift.pt`` state dict whose keys and shapes are enumerated here from
  upstream's module tree (``cosyvoice/hifigan/generator.py``, ``f0_predictor.py``), independently of
  ``specli.tts.acoustic.hift``; weight-normed layers in either key style.
- :func:`write_speech_tokenizer` / :func:`write_campplus`: ONNX models built with ``onnx.helper`` with the
  real models' signatures (``feats`` float32 [1, 128, T] + ``feats_length`` int32 [1] -> ``indices``
  int32 [1, ceil(T / 4)] or int64 [1, 1, ceil(T / 4)]; ``input`` float32 [1, T, 80] -> ``output`` float32 [1, 192]). Their outputs are
  simple functions of the input (every 4th frame's arg-max bin x 51; max over time times a fixed
  matrix), so a test can recompute what the frontend must get.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from specli.tts.acoustic.hift import HiFTConfig

Style = Literal["old", "param", "plain"]
SOURCE_F0_HZ = 150.0  # classifier bias: F0 well above the 10 Hz voicing threshold


def tiny_hift_config(kind: str) -> HiFTConfig:
    """The published CosyVoice2/3 HiFT numbers with 16 base channels and an 8-channel F0 predictor."""
    return replace(HiFTConfig.for_kind(kind), base_channels=16, f0_cond_channels=8)  # type: ignore[arg-type]


def _hift_layers(cfg: HiFTConfig) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(weight-normed layer -> weight shape, plain parameter -> shape) of upstream's HiFT generator."""
    wn: dict[str, tuple[int, ...]] = {}
    plain: dict[str, tuple[int, ...]] = {"m_source.l_linear.weight": (1, cfg.nb_harmonics + 1),
                                         "m_source.l_linear.bias": (1,)}
    base, spec = cfg.base_channels, cfg.n_fft + 2

    def conv(name: str, cout: int, cin: int, k: int, normed: bool = True) -> None:
        (wn if normed else plain)[name + ("" if normed else ".weight")] = (cout, cin, k)
        plain[name + ".bias"] = (cout,)

    def resblock(name: str, ch: int, k: int, dilations: tuple[int, ...]) -> None:
        for j in range(len(dilations)):
            conv(f"{name}.convs1.{j}", ch, ch, k)
            conv(f"{name}.convs2.{j}", ch, ch, k)
            plain[f"{name}.activations1.{j}.alpha"] = (ch,)
            plain[f"{name}.activations2.{j}.alpha"] = (ch,)

    conv("conv_pre", base, cfg.in_channels, cfg.conv_pre_look_right + 1 if cfg.causal else 7)
    for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes)):
        cin, cout = base // 2**i, base // 2 ** (i + 1)
        if cfg.causal:  # CausalConv1dUpsample is a Conv1d: [out, in, k]
            conv(f"ups.{i}", cout, cin, k)
        else:  # ConvTranspose1d: weight [in, out, k], weight norm over dim 0 (= in)
            wn[f"ups.{i}"] = (cin, cout, k)
            plain[f"ups.{i}.bias"] = (cout,)
    rates = [1, *cfg.upsample_rates[::-1][:-1]]
    cum = list(np.cumprod(rates))[::-1]
    for i, (u, k, d) in enumerate(zip(cum, cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes)):
        ch = base // 2 ** (i + 1)
        conv(f"source_downs.{i}", ch, spec, 1 if u == 1 else int(u) * 2, normed=False)
        resblock(f"source_resblocks.{i}", ch, k, tuple(d))
    n = 0
    for i in range(len(cfg.upsample_rates)):
        for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes):
            resblock(f"resblocks.{n}", base // 2 ** (i + 1), k, tuple(d))
            n += 1
    conv("conv_post", spec, base // 2 ** len(cfg.upsample_rates), 7)
    c = cfg.f0_cond_channels
    for i in range(5):
        conv(f"f0_predictor.condnet.{2 * i}", c, cfg.in_channels if i == 0 else c,
             4 if (cfg.causal and i == 0) else 3)
    plain["f0_predictor.classifier.weight"] = (1, c)
    plain["f0_predictor.classifier.bias"] = (1,)
    return wn, plain


def official_hift_state(cfg: HiFTConfig, style: Style = "old", seed: int = 0,
                        prefix: str = "") -> dict[str, torch.Tensor]:
    """A random ``hift.pt`` state dict in upstream's key layout (``prefix`` e.g. ``generator.``)."""
    gen = torch.Generator().manual_seed(seed)
    wn, plain = _hift_layers(cfg)
    state: dict[str, torch.Tensor] = {}
    for name, shape in plain.items():
        if name.endswith(".alpha"):
            state[name] = 0.5 + torch.rand(shape, generator=gen)
        else:
            state[name] = torch.randn(shape, generator=gen) / math.sqrt(max(1, math.prod(shape[1:])))
    for name, shape in wn.items():
        v = torch.randn(shape, generator=gen)
        g = 0.3 + 0.2 * torch.rand(shape[0], 1, 1, generator=gen)
        if style == "old":
            state[f"{name}.weight_g"], state[f"{name}.weight_v"] = g, v
        elif style == "param":
            state[f"{name}.parametrizations.weight.original0"] = g
            state[f"{name}.parametrizations.weight.original1"] = v
        else:
            state[f"{name}.weight"] = g * v / v.flatten(1).norm(dim=1).reshape(-1, 1, 1)
    state["f0_predictor.classifier.bias"] = torch.tensor([SOURCE_F0_HZ])
    return {prefix + key: value for key, value in state.items()}


def write_hift(path: Path, cfg: HiFTConfig, style: Style = "old", seed: int = 0, prefix: str = "") -> Path:
    torch.save(official_hift_state(cfg, style, seed, prefix), path)
    return path


def write_speech_tokenizer(path: Path, nested_int64: bool = False) -> Path:
    """feats [1, 128, T] + feats_length [1] -> every 4th frame's argmax over 128 bins x 51, as ``indices``:
    int32 [1, N], or with ``nested_int64`` int64 [1, 1, N] (both seen in the wild; upstream flattens)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def const(name: str, values: list[int]) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64)))

    nodes = [
        helper.make_node("Cast", ["feats_length"], ["len64"], to=TensorProto.INT64),
        const("starts", [0]), const("axes", [2]), const("steps", [4]), const("scale", [51]),
        helper.make_node("Slice", ["feats", "starts", "len64", "axes", "steps"], ["frames"]),
        helper.make_node("ArgMax", ["frames"], ["best"], axis=1, keepdims=0),
        helper.make_node("Mul", ["best", "scale"], ["scaled"]),
    ]
    if nested_int64:
        nodes += [const("one", [1]), helper.make_node("Unsqueeze", ["scaled", "one"], ["indices"])]
        output = helper.make_tensor_value_info("indices", TensorProto.INT64, [1, 1, "N"])
    else:
        nodes.append(helper.make_node("Cast", ["scaled"], ["indices"], to=TensorProto.INT32))
        output = helper.make_tensor_value_info("indices", TensorProto.INT32, [1, "N"])
    graph = helper.make_graph(
        nodes, "tiny_speech_tokenizer",
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
         helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1])],
        [output],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def campplus_weight(seed: int = 0, dim: int = 192) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((80, dim)).astype(np.float32)


def write_campplus(path: Path, seed: int = 0, dim: int = 192) -> Path:
    """input [1, T, 80] -> max over time @ W[80, dim] -> output [1, dim] (W: ``campplus_weight(seed)``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = campplus_weight(seed, dim)
    nodes = [
        helper.make_node("ReduceMax", ["input"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "W"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny_campplus",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "T", 80])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, dim])],
        initializer=[numpy_helper.from_array(weight, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def write_acoustic_dir(root: Path, kind: str, style: Style = "param") -> Path:
    """``root`` with ``hift.pt`` (tiny), the speech tokenizer of ``kind`` and ``campplus.onnx``."""
    root.mkdir(parents=True, exist_ok=True)
    write_hift(root / "hift.pt", tiny_hift_config(kind), style)
    name = "speech_tokenizer_v3.onnx" if kind == "cosyvoice3" else "speech_tokenizer_v2.onnx"
    write_speech_tokenizer(root / name, nested_int64=kind == "cosyvoice3")
    write_campplus(root / "campplus.onnx")
    return root
