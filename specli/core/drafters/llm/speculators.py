"""Read and write block drafters in the speculators format, and read z-lab / SpecForge DFlash.

**speculators** (vllm-project/speculators; what vLLM loads): ``config.json`` with
``speculators_model_type`` (``dspark`` / ``dflash`` / ``eagle3``), ``transformer_layer_config`` (the
draft layers' Hugging Face config: hidden size, layers, heads ...; ``vocab_size`` = the verifier's),
``draft_vocab_size``, ``block_size``, ``aux_hidden_state_layer_ids`` (EAGLE-3:
``eagle_aux_hidden_state_layer_ids``), ``mask_token_id``, ``sample_from_anchor``, ``markov_rank`` /
``markov_head_type`` / ``enable_confidence_head`` / ``confidence_head_with_markov``, and
``model.safetensors`` with ``fc``, ``hidden_norm``, ``layers.N.{input_layernorm, self_attn.*, mlp.*,
post_attention_layernorm}``, ``norm``, ``lm_head`` (draft-vocabulary rows), ``d2t`` (draft row ->
target id offset: ``target = row + d2t[row]``), ``t2d`` (bool over the target vocabulary),
``markov_head.markov_w{1,2}``, ``confidence_head.proj``. ``embed_tokens`` is absent (taken from the
target) unless the drafter has its own. specli adds a ``specli`` section: the auxiliary-layer
convention, whether the draft head keeps the target's bias, the token layout the ids refer to.

**z-lab / SpecForge DFlash** (``DFlashDraftModel``): a Qwen3 ``config.json`` whose ``dflash_config``
holds ``block_size``, ``mask_token_id`` and ``target_layer_ids`` (layer *outputs*), the same layer
keys, no head or embedding (both the target's).

Conventions when a file does not say: speculators ids are layer inputs (vLLM captures them), z-lab
ids are layer outputs. Token ids of a drafter trained against another layout of the same CosyVoice
LM (SpeechSpec's merged vocabulary, the official vLLM export) are mapped with a
:class:`~specli.core.drafters.llm.layout.VocabLayout`: draft rows that are not speech ids in
that layout are dropped (they could never be verified), the Markov table is re-indexed, and the
mask token is mapped to the native input layout.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specli.core.drafters.llm.base import SpeechDraftConfig, SpeechDraftModule, TargetParts, default_aux_layers
from specli.core.drafters.llm.dflash import DFlashModule
from specli.core.drafters.llm.dspark import DSparkModule
from specli.core.drafters.llm.eagle3 import Eagle3Module
from specli.core.drafters.llm.layout import VocabLayout
from specli.core.types import DraftableTarget
from specli.errors import ModelLoadError
from specli.io.atomic import write_atomic

ARCHITECTURES = {"dspark": "DSparkSpeculator", "dflash": "DFlashSpeculator", "eagle3": "Eagle3Speculator"}


def _layer_config(cfg: SpeechDraftConfig) -> dict:
    return {"model_type": "llama" if cfg.kind == "eagle3" else "qwen3", "hidden_size": cfg.hidden,
            "num_hidden_layers": cfg.layers, "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads,
            "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate, "rms_norm_eps": cfg.rms_eps,
            "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_positions,
            "vocab_size": cfg.target_vocab, "hidden_act": "silu", "attention_bias": False,
            "tie_word_embeddings": False}


def save_speculators(module: SpeechDraftModule, out: str | Path, training: dict | None = None) -> Path:
    """Write ``module`` as a speculators directory (fp32 safetensors + config.json)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = module.config
    state = {k: v.detach().float().contiguous() for k, v in module.state_dict().items() if k != "draft_ids"}
    ids = module.draft_ids.detach()
    state["d2t"] = (ids - torch.arange(ids.numel(), device=ids.device)).long()
    t2d = torch.zeros(cfg.target_vocab, dtype=torch.bool, device=ids.device)
    t2d[ids] = True
    state["t2d"] = t2d
    state["lm_head.weight"] = module.head_w.detach().float().contiguous()
    if cfg.head_bias and module.head_b is not None:
        state["lm_head.bias"] = module.head_b.detach().float().contiguous()
    save_file({k: v.cpu() for k, v in state.items()}, str(out / "model.safetensors"))
    meta = {
        "speculators_model_type": cfg.kind, "architectures": [ARCHITECTURES[cfg.kind]],
        "transformer_layer_config": _layer_config(cfg), "draft_vocab_size": cfg.draft_vocab,
        "block_size": cfg.block_size, "aux_hidden_state_layer_ids": list(cfg.aux_layers),
        "target_hidden_size": cfg.target_hidden or cfg.hidden, "mask_token_id": cfg.mask_token_id,
        "sample_from_anchor": cfg.sample_from_anchor, "markov_rank": cfg.markov_rank,
        "markov_head_type": "vanilla", "enable_confidence_head": cfg.confidence_head,
        "confidence_head_with_markov": cfg.confidence_head and cfg.markov_rank > 0,
        "speculators_config": {"algorithm": cfg.kind, "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy",
                                                     "speculative_tokens": cfg.drafts_per_block}]},
        "specli": {"aux_layer_convention": cfg.aux_convention, "head_bias": cfg.head_bias,
                   "qk_norm": cfg.qk_norm, "eagle_zero_row": cfg.eagle_zero_row, "training": training or {},
                   # ids in this file are native (a loaded drafter was mapped already)
                   "extra": {k: v for k, v in cfg.extra.items() if k != "token_layout"}},
    }
    if cfg.kind == "eagle3":
        meta["eagle_aux_hidden_state_layer_ids"] = list(cfg.aux_layers)
    write_atomic(out / "config.json", json.dumps(meta, indent=2, sort_keys=True))
    return out


def _read(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    try:
        meta = json.loads((path / "config.json").read_text())
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise OSError("no *.safetensors file")
        weights: dict[str, torch.Tensor] = {}
        for f in files:
            weights.update(load_file(str(f)))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"drafter {path}: cannot read config.json / safetensors: {exc}") from exc
    return meta, {_rename(k): v for k, v in weights.items()}


def _rename(key: str) -> str:
    """SafeAILab / SpecForge names -> speculators names (``midlayer.`` is EAGLE-3's one layer)."""
    for old, new in (("model.", ""), ("midlayer.", "layers.0.")):
        if key.startswith(old):
            key = new + key[len(old):]
    return key


def _config_from(meta: dict, weights: dict, parts: TargetParts, rows_kept: int, mask_id: int) -> SpeechDraftConfig:
    """A :class:`SpeechDraftConfig` from a speculators or z-lab ``config.json``."""
    zlab = "speculators_model_type" not in meta
    lc = meta if zlab else meta.get("transformer_layer_config", {})
    dflash_cfg = meta.get("dflash_config", {})
    kind = "dflash" if zlab else meta["speculators_model_type"]
    mine = meta.get("specli", {})
    aux = (dflash_cfg.get("target_layer_ids") if zlab else
           meta.get("aux_hidden_state_layer_ids") or meta.get("eagle_aux_hidden_state_layer_ids"))
    if not aux:

        aux, _ = default_aux_layers(kind, parts.layers, lc.get("num_hidden_layers", 3))
    rope = lc.get("rope_parameters") or {}
    heads = lc.get("num_attention_heads", parts.heads)
    block = dflash_cfg.get("block_size") or meta.get("block_size") or 8
    return SpeechDraftConfig(
        kind=kind, hidden=lc.get("hidden_size", parts.hidden), layers=lc.get("num_hidden_layers", 1),
        heads=heads, kv_heads=lc.get("num_key_value_heads") or heads,
        head_dim=lc.get("head_dim") or lc.get("hidden_size", parts.hidden) // heads,
        intermediate=lc.get("intermediate_size", parts.intermediate), target_vocab=parts.vocab,
        draft_vocab=rows_kept, aux_layers=tuple(aux),
        aux_convention=mine.get("aux_layer_convention", "output" if zlab else "input"),
        target_hidden=0, block_size=int(block), mask_token_id=mask_id,
        sample_from_anchor=bool(meta.get("sample_from_anchor", kind == "dspark")),
        markov_rank=int(meta.get("markov_rank", 0)),
        confidence_head="confidence_head.proj.weight" in weights,
        qk_norm=any(k.endswith("self_attn.q_norm.weight") for k in weights),
        rms_eps=float(lc.get("rms_norm_eps", parts.rms_eps)),
        rope_theta=float(rope.get("rope_theta", lc.get("rope_theta", parts.rope_theta))),
        max_positions=int(lc.get("max_position_embeddings", parts.max_positions)),
        head_bias=bool(mine.get("head_bias", False)), eagle_zero_row=bool(mine.get("eagle_zero_row", True)),
        extra={"source": "z-lab" if zlab else "speculators"})


def _layout_for(meta: dict, target: DraftableTarget, layout: VocabLayout | None) -> VocabLayout | None:
    """The layout the file's ids refer to: given, recorded by specli (the target maps the record to one of its
    layouts: ``target.token_layout(record)``), or None (native ids)."""
    if layout is not None:
        return layout
    rec = meta.get("specli", {}).get("extra", {}).get("token_layout")
    if not rec or rec.get("name") == "native":
        return None
    return target.token_layout(rec)


def _input_id(layout: VocabLayout | None, layout_id: int) -> int:
    """A layout *input* id (mask token) -> the native input id the target embeds."""
    if layout is None:
        return layout_id
    native = layout.native_input_id(layout_id)
    if native is None:
        raise ModelLoadError(f"mask token id {layout_id} has no native input id in the {layout.name} layout")
    return native


def load_speech_drafter(path: str | Path, target: DraftableTarget, layout: VocabLayout | None = None
                        ) -> SpeechDraftModule:
    """Load a speculators-format or z-lab DFlash directory for ``target`` (ids mapped from ``layout`` when the
    drafter was trained on another layout of the same LM; read from config.json when it says); see the module
    docstring."""
    path = Path(path)
    meta, w = _read(path)
    parts = target.draft_parts()
    layout = _layout_for(meta, target, layout)
    _check_vocab(meta, w, parts, layout, path)
    try:
        ids, keep = _draft_rows(meta, w, parts, layout)
        raw_mask = meta.get("mask_token_id", meta.get("dflash_config", {}).get("mask_token_id"))
        mask = parts.mask_token_id if raw_mask is None else _input_id(layout, int(raw_mask))
        cfg = _config_from(meta, w, parts, int(ids.numel()), mask)
        if layout is not None:
            cfg = cfg.with_(extra={**cfg.extra, "token_layout": {"name": layout.name, "offset": layout.offset,
                                                                 "size": layout.size}})
        cls = {"dspark": DSparkModule, "dflash": DFlashModule, "eagle3": Eagle3Module}[cfg.kind]
        state = _module_state(w, keep, layout, cfg)
        kw = {}
        if cfg.kind == "dspark" and "markov_head.markov_w1.weight" in state:
            kw["markov_rows"] = state["markov_head.markov_w1.weight"].shape[0]
        module = cls(cfg, parts, ids, **kw)
        module.load_state_dict({**state, "draft_ids": ids.to(parts.device)}, strict=True)
        _load_head(module, w, keep)
        if "embed_tokens.weight" in w:
            module.parts = _with_own_embedding(parts, w["embed_tokens.weight"], layout)
    except (KeyError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"drafter {path}: {exc}") from exc
    return module.to(parts.device).eval()


def _check_vocab(meta: dict, w: dict, parts: TargetParts, layout: VocabLayout | None, path: Path) -> None:
    """Refuse a drafter whose verifier vocabulary is not this target's (unless a layout maps it)."""
    lc = meta if "speculators_model_type" not in meta else meta.get("transformer_layer_config", {})
    sizes = {int(n) for n in (lc.get("vocab_size"), w["t2d"].numel() if "t2d" in w else None) if n}
    want = parts.vocab if layout is None else layout.size
    if "speculators_model_type" in meta and sizes and sizes != {want}:
        hint = "" if layout is not None else " (a drafter for another layout of this LM needs that layout's id map)"
        raise ModelLoadError(f"drafter {path} was trained for a {max(sizes)}-token vocabulary, "
                             f"this target's is {want}{hint}")


def _draft_rows(meta: dict, w: dict, parts: TargetParts, layout: VocabLayout | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Native target id of each kept draft row, and the kept rows of the file's draft vocabulary."""
    if "d2t" in w:
        d2t = w["d2t"].long()
        file_ids = torch.arange(d2t.numel(), device=d2t.device) + d2t
    else:
        n = meta.get("draft_vocab_size") or (layout.size if layout is not None else parts.vocab)
        file_ids = torch.arange(min(int(n), layout.size if layout is not None else parts.vocab), device="cpu")
    t2d = w.get("t2d")
    if t2d is not None and t2d.dtype == torch.bool and bool((~t2d[file_ids.clamp(max=t2d.numel() - 1)]).any()):
        raise ValueError("d2t and t2d disagree")
    if layout is None:
        keep = torch.nonzero(file_ids < parts.vocab).flatten()
        return file_ids[keep], keep
    speech = (file_ids >= layout.offset) & (file_ids < layout.offset + layout.native_rows)
    keep = torch.nonzero(speech).flatten()
    if keep.numel() == 0:
        raise ValueError(f"no draft row is a speech id of the {layout.name} layout")
    return file_ids[keep] - layout.offset, keep


def _module_state(w: dict, keep: torch.Tensor, layout: VocabLayout | None, cfg: SpeechDraftConfig) -> dict:
    """The module's own tensors (head / vocab maps / embedding excluded), draft rows subset to ``keep``."""
    skip = {"d2t", "t2d", "lm_head.weight", "lm_head.bias", "embed_tokens.weight", "verifier_norm.weight",
            "verifier_lm_head.weight"}
    state = {k: v.float() for k, v in w.items() if k not in skip}
    if "markov_head.markov_w2.weight" in state:
        state["markov_head.markov_w2.weight"] = state["markov_head.markov_w2.weight"][keep]
    w1 = state.get("markov_head.markov_w1.weight")
    if w1 is not None:
        if layout is not None and w1.shape[0] >= layout.offset + layout.native_rows:
            state["markov_head.markov_w1.weight"] = w1[layout.offset : layout.offset + layout.native_rows]
        elif w1.shape[0] == int(w["d2t"].numel() if "d2t" in w else keep.numel()) and w1.shape[0] != cfg.target_vocab:
            state["markov_head.markov_w1.weight"] = w1[keep]
    return state


def _load_head(module: SpeechDraftModule, w: dict, keep: torch.Tensor) -> None:
    """A stored draft head (``lm_head``: the rows it was trained with) replaces the target's rows."""
    dev = module.head_w.device
    if "lm_head.weight" in w:
        module.head_w = w["lm_head.weight"].float()[keep.to(w["lm_head.weight"].device)].to(dev).contiguous()
    if module.config.head_bias and "lm_head.bias" in w:
        module.head_b = w["lm_head.bias"].float()[keep.to(w["lm_head.bias"].device)].to(dev).contiguous()


def _with_own_embedding(parts: TargetParts, table: torch.Tensor, layout: VocabLayout | None) -> TargetParts:
    """``parts`` whose ``embed`` reads the drafter's own table (rows in the file's layout)."""
    table = table.float().to(parts.device)

    def embed(ids: torch.Tensor) -> torch.Tensor:  # native input ids [...] -> [..., H]
        return table[ids.long() if layout is None else layout.input_rows(ids)]

    return replace(parts, embed=embed)
