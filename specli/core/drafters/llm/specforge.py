"""Read SpecForge's own EAGLE-3 checkpoints (``LlamaForCausalLMEagle3``) into specli's EAGLE-3 drafter.

**Layout** (sgl-project/SpecForge ``specforge/modeling/draft/llama3_eagle.py``, written by ``save_pretrained``
through its HF and SGLang exporters): ``config.json`` is a Llama config with ``architectures:
["LlamaForCausalLMEagle3"]``, ``num_hidden_layers: 1``, the draft layer's ``hidden_size`` / heads / ``head_dim`` /
``intermediate_size`` / ``rms_norm_eps`` / ``rope_theta`` (``rope_scaling`` null), ``vocab_size`` (the target's),
``draft_vocab_size``, optionally ``target_hidden_size`` (default ``hidden_size``), ``fc_norm`` (an RMSNorm on each
of the three target states before ``fc``), ``norm_output`` (default true: the head reads ``norm(h)``) and
``eagle_config.eagle_aux_hidden_state_layer_ids``. The weights (``model.safetensors``, sharded
``model-*.safetensors`` or ``pytorch_model.bin``) are ``midlayer.{input_layernorm, hidden_norm,
self_attn.{q,k,v}_proj`` (``2H`` inputs), ``self_attn.o_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}``,
``fc`` (``3 * target_hidden -> H``), ``fc_norm.{0,1,2}`` (with ``fc_norm``), ``norm``, ``lm_head`` (draft-vocabulary
rows), ``d2t`` (``target id = row + d2t[row]``), ``t2d`` (bool over the target vocabulary) and, from the HF
export only, ``embed_tokens`` (the SGLang export leaves the embedding to the target).

**Conventions found in SpecForge and matched here.**

* Auxiliary layers: SpecForge captures the target at ``eagle_config``'s ids or, by default, ``[1, L // 2 - 1,
  L - 4]`` for an ``L``-block target, as layer *outputs* (SGLang's ``set_eagle3_layers_to_capture`` adds one to
  read the next block's input): the blocks of SGLang's default input ids ``[2, L // 2, L - 3]``. The drafter
  reads them in the ``output`` convention; the audio-LLM families' ``DraftRecipe`` gives the same ids for
  targets of 8 blocks or more (it spreads distinct ids over shallower test targets, where a SpecForge
  checkpoint keeps SpecForge's own rule, duplicates included; a target under 4 blocks needs ``eagle_config``).
* Rows: the trainer shifts the input ids left by one, so draft row ``t`` is ``[embed(x_{t+1}); fc(aux_t)]`` at
  position ``t``: there is no row for ``x_0`` (``eagle_zero_row`` False) and positions are one less than
  specli's, which relative RoPE does not see.
* A step: attention input ``[input_layernorm(embed); hidden_norm(g)]``, residual ``g``, logits
  ``lm_head(norm(h))``, the next step reads the pre-norm ``h``: :class:`~specli.core.drafters.llm.eagle3.Eagle3Module`.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from specli.core.drafters.llm.base import RMSNorm, SpeechDraftConfig, TargetParts
from specli.core.drafters.llm.layout import VocabLayout
from specli.core.types import DraftableTarget
from specli.core.drafters.llm.eagle3 import Eagle3Module
from specli.errors import ModelLoadError

SPECFORGE_EAGLE3 = "LlamaForCausalLMEagle3"
# SpecForge draft classes specli does not read (DFlashDraftModel is read as z-lab's DFlash)
UNREAD = ("PEagleDraftModel", "DSparkDraftModel", "DominoDraftModel")
TTT_LENGTH = 7  # SpecForge's default test-time-training unroll (kept as the module's block size)
LAYER_KEYS = ("input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
              *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
              *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")))
REQUIRED = ("fc.weight", "norm.weight", "lm_head.weight", *(f"midlayer.{k}" for k in LAYER_KEYS))
OPTIONAL = ("d2t", "t2d", "embed_tokens.weight", "fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight")


class SpecForgeEagle3Module(Eagle3Module):
    """:class:`Eagle3Module` with SpecForge's optional ``fc_norm`` (one RMSNorm per target state before ``fc``)."""

    def __init__(self, config: SpeechDraftConfig, parts: TargetParts, draft_ids: torch.Tensor | None = None,
                 fc_norm: bool = False) -> None:
        super().__init__(config, parts, draft_ids)
        width = config.target_hidden or config.hidden
        self.fc_norm = nn.ModuleList([RMSNorm(width, config.rms_eps) for _ in range(3)]) if fc_norm else None
        self.to(parts.device)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        if self.fc_norm is None:
            return super().fuse(features)
        chunks = features.float().chunk(3, -1)
        return self.fc(torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)], -1))


def read_config(path: Path) -> dict:
    """``config.json`` of a drafter directory (a clear error when it is missing or not JSON)."""
    try:
        meta = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"drafter {path / 'config.json'}: cannot read it: {exc}") from exc
    if not isinstance(meta, dict):
        raise ModelLoadError(f"drafter {path / 'config.json'}: not a JSON object")
    return meta


def drafter_format(path: Path) -> str:
    """``"specforge-eagle3"``, ``"speculators"`` or ``"z-lab"`` from ``config.json``; an unknown architecture
    is an error (speculators files say ``speculators_model_type``, z-lab DFlash files ``dflash_config``)."""
    meta = read_config(path)
    archs = meta.get("architectures") or []
    if "speculators_model_type" in meta:
        return "speculators"
    if SPECFORGE_EAGLE3 in archs:
        return "specforge-eagle3"
    if "dflash_config" in meta or "DFlashDraftModel" in archs:
        return "z-lab"
    what = f"architecture {archs}" if archs else "no architectures and no speculators_model_type"
    hint = " (a SpecForge layout specli does not read)" if any(a in UNREAD for a in archs) else ""
    raise ModelLoadError(f"drafter {path / 'config.json'}: unknown drafter format: {what}{hint}; specli reads "
                         f"speculators (speculators_model_type), SpecForge {SPECFORGE_EAGLE3} and z-lab "
                         "DFlashDraftModel (dflash_config)")


def specforge_aux_layers(meta: dict, target_layers: int, where: Path) -> tuple[int, ...]:
    """The target layers (outputs) a SpecForge EAGLE-3 reads: ``eagle_config``'s, else ``[1, L // 2 - 1, L - 4]``."""
    L = target_layers
    ids = (meta.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    ids = [1, L // 2 - 1, L - 4] if ids is None else ids
    if len(ids) != 3 or any(not isinstance(i, int) or not 0 <= i < L for i in ids):
        raise ModelLoadError(f"drafter {where}: EAGLE-3 reads three target layer outputs within 0..{L - 1}, got "
                             f"{list(ids)} for this {L}-block target (record eagle_config."
                             "eagle_aux_hidden_state_layer_ids for a shallow target)")
    return tuple(ids)


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors of ``*.safetensors`` (else ``pytorch_model*.bin``) and the file name(s) for messages."""
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
    if not files:
        raise ModelLoadError(f"drafter {path}: no model.safetensors or pytorch_model.bin")
    name = ", ".join(f.name for f in files)
    weights: dict[str, torch.Tensor] = {}
    try:
        for f in files:
            part = (load_file(str(f)) if f.suffix == ".safetensors"
                    else torch.load(str(f), map_location="cpu", weights_only=True))
            if not isinstance(part, dict):
                raise ValueError("not a state dict")
            weights.update(part)
    except (OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError, SafetensorError) as exc:
        raise ModelLoadError(f"drafter {path / name}: cannot read the weights: {exc}") from exc
    return weights, name


def _check_keys(w: dict, where: Path) -> None:
    missing = [k for k in REQUIRED if k not in w]
    extra = sorted(k for k in w if k not in REQUIRED and k not in OPTIONAL)
    if missing or extra:
        said = (f"misses {missing}" if missing else "") + ("; " if missing and extra else "")
        said += f"has keys a {SPECFORGE_EAGLE3} does not: {extra[:6]}" if extra else ""
        raise ModelLoadError(f"drafter {where}: {said}")


def _check_sizes(meta: dict, w: dict, parts: TargetParts, path: Path, where: Path) -> tuple[int, int]:
    """(draft width, target width) after checking them, the vocabularies and the layer count against the target."""
    cfg_file = path / "config.json"
    if int(meta.get("num_hidden_layers", 1)) != 1:
        raise ModelLoadError(f"drafter {cfg_file}: num_hidden_layers {meta['num_hidden_layers']}, "
                             f"a {SPECFORGE_EAGLE3} has one midlayer")
    hidden = int(meta.get("hidden_size", 0))
    width = int(meta.get("target_hidden_size") or hidden)
    if width != parts.hidden:
        raise ModelLoadError(f"drafter {cfg_file}: reads {width}-wide target states (target_hidden_size / "
                             f"hidden_size), this target's hidden size is {parts.hidden}")
    if tuple(w["fc.weight"].shape) != (hidden, 3 * width):
        raise ModelLoadError(f"drafter {where}: fc.weight is {list(w['fc.weight'].shape)}, config.json says "
                             f"[{hidden}, {3 * width}] (hidden_size, 3 x target_hidden_size)")
    if hidden != parts.hidden and "embed_tokens.weight" not in w:
        raise ModelLoadError(f"drafter {where}: a {hidden}-wide draft layer over a {parts.hidden}-wide target "
                             "needs its own embed_tokens.weight")
    vocab = int(meta.get("vocab_size", parts.vocab))
    if vocab != parts.vocab or ("t2d" in w and w["t2d"].numel() != parts.vocab):
        raise ModelLoadError(f"drafter {cfg_file}: trained for a {vocab}-token vocabulary, this target's "
                             f"is {parts.vocab}")
    if "embed_tokens.weight" in w and tuple(w["embed_tokens.weight"].shape) != (parts.vocab, hidden):
        raise ModelLoadError(f"drafter {where}: embed_tokens.weight is {list(w['embed_tokens.weight'].shape)}, "
                             f"expected [{parts.vocab}, {hidden}]")
    scaling = meta.get("rope_scaling") or meta.get("rope_parameters") or {}
    if (scaling.get("rope_type") or scaling.get("type") or "default") != "default":
        raise ModelLoadError(f"drafter {cfg_file}: rope scaling {scaling} is not supported (plain RoPE only)")
    return hidden, width


def _draft_ids(meta: dict, w: dict, parts: TargetParts, where: Path) -> torch.Tensor:
    """Target id of each draft row (``row + d2t[row]``), checked against ``t2d`` and ``lm_head``."""
    rows = int(meta.get("draft_vocab_size") or parts.vocab)
    if "d2t" not in w and rows != parts.vocab:
        raise ModelLoadError(f"drafter {where}: a {rows}-row draft vocabulary needs d2t")
    dev = w["lm_head.weight"].device  # the checkpoint's tensors (loaded on the CPU)
    d2t = w["d2t"].long().flatten() if "d2t" in w else torch.zeros(rows, dtype=torch.long, device=dev)
    ids = torch.arange(d2t.numel(), device=d2t.device) + d2t
    if d2t.numel() != rows or w["lm_head.weight"].shape[0] != rows:
        raise ModelLoadError(f"drafter {where}: draft_vocab_size {rows}, d2t has {d2t.numel()} rows, lm_head.weight "
                             f"{w['lm_head.weight'].shape[0]}")
    if bool((ids < 0).any() or (ids >= parts.vocab).any()) or ids.unique().numel() != ids.numel():
        raise ModelLoadError(f"drafter {where}: d2t maps draft rows outside 0..{parts.vocab - 1} or twice")
    t2d = w.get("t2d")
    if t2d is not None and (int(t2d.bool().sum()) != rows or not bool(t2d.bool()[ids].all())):
        raise ModelLoadError(f"drafter {where}: d2t and t2d disagree")
    return ids


def _draft_config(meta: dict, parts: TargetParts, hidden: int, width: int, rows: int,
                  aux: tuple[int, ...]) -> SpeechDraftConfig:
    heads = int(meta.get("num_attention_heads", parts.heads))
    return SpeechDraftConfig(
        kind="eagle3", hidden=hidden, layers=1, heads=heads, kv_heads=int(meta.get("num_key_value_heads") or heads),
        head_dim=int(meta.get("head_dim") or hidden // heads),
        intermediate=int(meta.get("intermediate_size", parts.intermediate)), target_vocab=parts.vocab,
        draft_vocab=rows, aux_layers=aux, aux_convention="output", target_hidden=0 if width == hidden else width,
        block_size=TTT_LENGTH, mask_token_id=parts.mask_token_id, qk_norm=False,
        rms_eps=float(meta.get("rms_norm_eps", 1e-6)),  # transformers' LlamaConfig default
        rope_theta=float(meta.get("rope_theta", (meta.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
        max_positions=parts.max_positions, head_bias=False, eagle_zero_row=False,
        extra={"source": "specforge", "fc_norm": bool(meta.get("fc_norm", False)),
               "norm_output": bool(meta.get("norm_output", True))})


def load_specforge_eagle3(path: str | Path, target: DraftableTarget, layout: VocabLayout | None = None
                          ) -> Eagle3Module:
    """Load a SpecForge ``LlamaForCausalLMEagle3`` directory for ``target`` (see the module docstring); every
    mismatch with the target (widths, vocabulary, layers, missing or unknown keys) is a :class:`ModelLoadError`
    naming the file. The aux layers are not attached here (``loading.load_drafter`` does it)."""
    path = Path(path)
    meta = read_config(path)
    if SPECFORGE_EAGLE3 not in (meta.get("architectures") or []):
        raise ModelLoadError(f"drafter {path / 'config.json'}: architectures {meta.get('architectures')}, "
                             f"expected [{SPECFORGE_EAGLE3!r}]")
    if layout is not None:
        raise ModelLoadError(f"drafter {path}: a SpecForge checkpoint holds the target's own token ids (no layout)")
    parts = target.draft_parts()
    w, name = read_weights(path)
    where = path / name
    _check_keys(w, where)
    hidden, width = _check_sizes(meta, w, parts, path, where)
    ids = _draft_ids(meta, w, parts, where)
    aux = specforge_aux_layers(meta, parts.layers, path / "config.json")
    fc_norm = bool(meta.get("fc_norm", False))
    if fc_norm != ("fc_norm.0.weight" in w):
        raise ModelLoadError(f"drafter {where}: config.json fc_norm is {fc_norm}, the fc_norm weights are "
                             f"{'absent' if fc_norm else 'present'}")
    state = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v.float()
             for k, v in w.items() if k not in ("d2t", "t2d", "lm_head.weight", "embed_tokens.weight")}
    try:
        cfg = _draft_config(meta, parts, hidden, width, int(ids.numel()), aux)
        module = SpecForgeEagle3Module(cfg, parts, ids, fc_norm=fc_norm)
        module.load_state_dict({**state, "draft_ids": ids.to(parts.device)}, strict=True)
    except (RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"drafter {where}: the weights do not fit config.json: {exc}") from exc
    module.head_w = w["lm_head.weight"].float().to(parts.device).contiguous()
    if not cfg.extra["norm_output"]:
        module.norm = nn.Identity()  # SpecForge's compute_logits without norm_output: lm_head(h)
    if "embed_tokens.weight" in w:
        table = w["embed_tokens.weight"].float().to(parts.device)
        module.parts = replace(parts, embed=lambda tokens: table[tokens.long()])
    return module.eval()
