"""CosyVoice2/3 speech-token LMs from the official checkpoint directory, as specli targets.

Directory layout (as published: ``FunAudioLLM/CosyVoice2-0.5B``, ``FunAudioLLM/Fun-CosyVoice3-0.5B-2512``)::

    llm.pt                      weights (read with torch.load(weights_only=True)):
                                llm.model.model.{embed_tokens,layers.N.*,norm}.weight, llm.model.lm_head
                                (unused), speech_embedding, llm_decoder (+bias in CV2), llm_embedding (CV2)
    cosyvoice2.yaml | cosyvoice3.yaml   HyperPyYAML; only read (llm class, speech_token_size, sampler)
    CosyVoice-BlankEN/          config.json (Qwen2 shape) + tokenizer files

The LM is :class:`CosyVoiceLM`: a :class:`~specli.models.qwen2.Qwen2Target` whose inputs
are ids of :class:`~specli.models.cosyvoice.layout.InputLayout` (speech rows, CV2's
sos/task rows, text rows) mapped to embeddings, and whose head is ``llm_decoder``. Model names
resolve offline from ``$SPECLI_MODELS_DIR`` and the local Hugging Face cache; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specli.core.drafters.llm.layout import VocabLayout
from specli.models.cosyvoice.layout import (InputLayout, ModelKind, RasSettings, SpeechLMSpec, merged_layout,
                                           vllm_layout)
from specli.models.cosyvoice.text import CosyVoiceTokenizer
from specli.models.cosyvoice.voices import SUMS, SHIPPED_VOICES, shipped_voice, verify_voice
from specli.models.cosyvoice.yaml import Tagged, read_hyperpyyaml, whole_number
from specli.models.layers import Linear
from specli.models.qwen2 import Qwen2Dims, Qwen2State, Qwen2Target
from specli.core.types import ScoreOutput, TargetParts
from specli.errors import ModelLoadError
from specli.io.locate import Lookup, locate

# model name -> (Hugging Face repo, yaml file)
KNOWN_MODELS: dict[str, tuple[str, str]] = {
    "cosyvoice2": ("FunAudioLLM/CosyVoice2-0.5B", "cosyvoice2.yaml"),
    "cosyvoice3": ("FunAudioLLM/Fun-CosyVoice3-0.5B-2512", "cosyvoice3.yaml"),
}
LM_CLASSES: dict[str, ModelKind] = {"Qwen2LM": "cosyvoice2", "CosyVoice3LM": "cosyvoice3"}
QWEN_DIR = "CosyVoice-BlankEN"
_QWEN_PREFIX = "llm.model.model."


class CosyVoiceLM:
    """A CosyVoice speech-token LM as a :class:`~specli.core.types.Target` over input-layout ids."""

    def __init__(self, spec: SpeechLMSpec, qwen: Qwen2Target, speech_embedding: torch.Tensor,
                 llm_embedding: torch.Tensor | None) -> None:
        self.spec = spec
        self.layout = InputLayout(spec)
        self.qwen = qwen
        self.speech_embedding = speech_embedding.to(qwen.device, qwen.dtype)  # [speech_rows, hidden]
        self.llm_embedding = None if llm_embedding is None else llm_embedding.to(qwen.device, qwen.dtype)  # [2, d]

    @property
    def vocab(self) -> int:
        """Outputs of the head (speech rows)."""
        return self.spec.speech_rows

    # ---- the draftable-target protocol (core/types.DraftableTarget)
    def draft_parts(self) -> TargetParts:
        """The decoder's sizes and speech head, input-layout embeddings, the fill id as the default mask token."""
        return self.qwen.draft_parts(self.embed, self.spec.fill)

    def request_aux_layers(self, layers: Sequence[int]) -> tuple[int, ...]:
        return self.qwen.request_aux_layers(layers)

    def token_layout(self, record: dict) -> VocabLayout:
        """The layout a drafter file's ``token_layout`` record names: the official vLLM export or SpeechSpec's
        merged vocabulary (their speech ids map onto this LM's native ones)."""
        if record.get("name") == "vllm":
            return vllm_layout(self.spec, record.get("pad_to", 1))
        return merged_layout(self.spec, record["text_vocab"], record.get("pad_to", 128))

    def start(self, max_len: int, device: torch.device | str | None = None) -> Qwen2State:
        return self.qwen.start(max_len, 1, device)  # None: the target's device

    def start_batch(self, capacity: int, max_len: int | None, spare: int = 0) -> Qwen2State:
        """The batch contract (core/batched.py) is the Qwen2 decoder's."""
        return self.qwen.start_batch(capacity, max_len, spare)

    def admit(self, state: Qwen2State, slot: int, context: None = None) -> None:
        self.qwen.admit(state, slot, context)

    def row_state(self, state: Qwen2State, slot: int, context: None = None) -> Qwen2State:
        return self.qwen.row_state(state, slot, context)

    def move(self, state: Qwen2State, src: int, dst: int) -> None:
        self.qwen.move(state, src, dst)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Input embeddings ``[B, n, hidden]`` of input-layout ids ``tokens [B, n]``."""
        lay = self.layout
        out = self.speech_embedding.new_empty(*tokens.shape, self.speech_embedding.shape[1])
        speech = tokens < self.spec.speech_rows
        text = tokens >= lay.text_base
        extra = ~speech & ~text
        out[speech] = self.speech_embedding[tokens[speech]]
        out[text] = self.qwen.embed_tokens[tokens[text] - lay.text_base]
        if bool(extra.any()):
            if self.llm_embedding is None:
                raise ValueError("input id outside the layout")
            out[extra] = self.llm_embedding[tokens[extra] - self.spec.speech_rows]
        return out

    def score(self, state: Qwen2State, tokens: torch.Tensor, positions: torch.Tensor | None = None,
              tree_mask: torch.Tensor | None = None, logit_rows: Sequence[int] | None = None) -> ScoreOutput:
        """Score input-layout ids ``tokens [B, n]`` (chain or tree); logits over the speech head."""
        return self.qwen.score(state, None, positions, tree_mask, embeds=self.embed(tokens), logit_rows=logit_rows)


@dataclass(frozen=True)
class CosyVoiceModel:
    """A loaded CosyVoice LM with its tokenizer."""

    name: str  # what the user asked for (name or directory)
    path: Path  # the checkpoint directory
    spec: SpeechLMSpec
    lm: CosyVoiceLM
    tokenizer: CosyVoiceTokenizer


def read_spec(yaml_path: Path) -> SpeechLMSpec:
    """The LM kind, speech vocabulary, RAS settings and (specli's own keys) token/text length ratios and piece
    length from ``cosyvoice{2,3}.yaml`` (nothing is run)."""
    try:
        cfg = read_hyperpyyaml(yaml_path)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{yaml_path}: {exc}") from exc
    llm = cfg.get("llm")
    if not isinstance(llm, Tagged) or llm.kind != "new":
        raise ModelLoadError(f"{yaml_path}: no 'llm: !new:...' entry")
    kind = LM_CLASSES.get(llm.target.rsplit(".", 1)[-1])
    if kind is None:
        raise ModelLoadError(f"{yaml_path}: unsupported LLM class {llm.target!r} (known: {sorted(LM_CLASSES)})")
    sampling = llm.get("sampling")
    try:
        ras = RasSettings()
        is_ras = isinstance(sampling, Tagged) and sampling.target.endswith("ras_sampling")
        if is_ras and isinstance(sampling.value, dict):
            known = {k: sampling.value[k] for k in ("top_p", "top_k", "win_size", "tau_r") if k in sampling.value}
            ras = RasSettings(**known)
        ratios = {k: float(cfg[k]) for k in ("min_token_text_ratio", "max_token_text_ratio") if k in cfg}
        pieces = whole_number(cfg["max_piece_words"], "max_piece_words") if "max_piece_words" in cfg else 0
        return SpeechLMSpec(kind, int(llm.get("speech_token_size", 6561)), ras=ras, max_piece_words=pieces,
                            **ratios)
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{yaml_path}: unusable llm settings: {exc}") from exc


def _required(path: Path) -> list[str]:
    """Files of ``path`` that a CosyVoice LM needs and that are missing."""
    missing = [f for f in ("llm.pt", f"{QWEN_DIR}/config.json") if not (path / f).is_file()]
    if not any((path / y).is_file() for y in ("cosyvoice2.yaml", "cosyvoice3.yaml")):
        missing.append("cosyvoice2.yaml or cosyvoice3.yaml")
    tok = path / QWEN_DIR
    if not ((tok / "tokenizer.json").is_file() or ((tok / "vocab.json").is_file() and (tok / "merges.txt").is_file())):
        missing.append(f"{QWEN_DIR}/tokenizer.json (or vocab.json + merges.txt)")
    return missing


def resolve_cosyvoice(name_or_dir: str) -> Path:
    """The checkpoint directory of a shipped voice, ``cosyvoice2`` / ``cosyvoice3`` (found offline by
    :func:`~specli.io.locate.locate`) or a directory (checked against its ``SHA256SUMS`` when it has one, as
    specli's own voices do); never downloads."""
    if name_or_dir in SHIPPED_VOICES:
        return shipped_voice(name_or_dir)
    known = KNOWN_MODELS.get(name_or_dir)
    if known is None and not Path(name_or_dir).expanduser().is_dir():
        names = ", ".join([*SHIPPED_VOICES, *KNOWN_MODELS])
        raise ModelLoadError(f"{name_or_dir!r} is neither a CosyVoice model name ({names}) nor a directory")
    repo, yaml_name = known or (None, "cosyvoice2.yaml or cosyvoice3.yaml")
    hint = (f"It needs llm.pt, {yaml_name}, {QWEN_DIR}/config.json and the {QWEN_DIR} tokenizer files"
            + (f" of {repo}." if repo else "."))
    path = locate(name_or_dir, Lookup("CosyVoice model", repo=repo, required=_required, hint=hint))
    return verify_voice(path) if (path / SUMS).is_file() else path  # specli's own voices carry sha256 sums


def read_llm_weights(path: Path) -> dict[str, torch.Tensor]:
    """``llm.pt`` as a flat dict of tensors (no pickled code is run: ``weights_only=True``)."""
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds on a bad or unsafe file
        raise ModelLoadError(f"{path}: cannot read the weights: {exc}") from exc
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ModelLoadError(f"{path}: not a flat state dict of tensors")
    return sd


def _check(path: Path, w: dict, key: str, rows: int | None, present: bool = True) -> None:
    if (key in w) != present:
        raise ModelLoadError(f"{path}: '{key}' is {'missing' if present else 'unexpected for this LM'}")
    if present and rows is not None and w[key].shape[0] != rows:
        raise ModelLoadError(f"{path}: '{key}' has {w[key].shape[0]} rows, expected {rows}")


def build_lm(spec: SpeechLMSpec, qwen_config: dict, weights: dict[str, torch.Tensor], where: Path,
             dtype: torch.dtype = torch.float32, aux_layers: Sequence[int] = (),
             device: torch.device | str = "cpu") -> CosyVoiceLM:
    """A :class:`CosyVoiceLM` from ``llm.pt`` tensors (official key names) and the Qwen ``config.json``."""
    rows, cv2 = spec.speech_rows, spec.kind == "cosyvoice2"
    _check(where, weights, "speech_embedding.weight", rows)
    _check(where, weights, "llm_decoder.weight", rows)
    _check(where, weights, "llm_decoder.bias", rows, present=spec.head_bias)
    _check(where, weights, "llm_embedding.weight", 2, present=cv2)
    _check(where, weights, f"{_QWEN_PREFIX}embed_tokens.weight", None)
    cfg = dict(qwen_config, vocab_size=weights[f"{_QWEN_PREFIX}embed_tokens.weight"].shape[0])
    try:
        dims = Qwen2Dims.from_hf_config(cfg)
        bias = weights.get("llm_decoder.bias")
        head = Linear(weights["llm_decoder.weight"].to(device, dtype), None if bias is None else bias.to(device, dtype))
        qwen = Qwen2Target(dims, weights, dtype, prefix=_QWEN_PREFIX, head=head, aux_layers=aux_layers, device=device)
    except (KeyError, ValueError) as exc:
        raise ModelLoadError(f"{where}: weights do not match {QWEN_DIR}/config.json: {exc}") from exc
    return CosyVoiceLM(spec, qwen, weights["speech_embedding.weight"], weights.get("llm_embedding.weight"))


def load_cosyvoice(name_or_dir: str, dtype: str = "float32", aux_layers: Sequence[int] = (),
                   device: torch.device | str = "cpu") -> CosyVoiceModel:
    """Resolve (offline) and load a CosyVoice2/3 LM and its tokenizer onto ``device``."""
    path = resolve_cosyvoice(name_or_dir)
    yaml_path = next(path / y for y in ("cosyvoice3.yaml", "cosyvoice2.yaml") if (path / y).is_file())
    spec = read_spec(yaml_path)
    try:
        qwen_config = json.loads((path / QWEN_DIR / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path / QWEN_DIR / 'config.json'}: {exc}") from exc
    lm = build_lm(spec, qwen_config, read_llm_weights(path / "llm.pt"), path / "llm.pt",
                  getattr(torch, dtype), aux_layers, device)
    try:
        tokenizer = CosyVoiceTokenizer(path / QWEN_DIR, spec.kind)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path / QWEN_DIR}: cannot load the tokenizer: {exc}") from exc
    return CosyVoiceModel(name_or_dir, path, spec, lm, tokenizer)


def lm_fingerprint(model: CosyVoiceModel) -> str:
    """A short hash of the LM's architecture and output vocabulary (what a drafter depends on; not the voice's
    piece length, which cuts the text before the LM: synthesis settings record it)."""
    spec = asdict(model.spec)
    del spec["max_piece_words"]
    data = {"dims": asdict(model.lm.qwen.dims), "spec": spec}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
