"""What audio-LLM targets share: a window's audio embeddings spliced into a lean decoder's prompt, and how
their models are found offline.

:class:`AudioLMTarget` holds a family's audio tower + projector (transformers modules; the family's
:meth:`~AudioLMTarget.encode` runs them on one window's log-mel) and the lean static-cache decoder over its
language model (:class:`~specli.models.qwen2.Qwen2Target`). The decode prompt holds the chat template's tokens
with the audio placeholder expanded to the window's ``N`` audio positions. A forward that starts at position 0
(a prompt's prefill) takes the window's audio embeddings in place of its placeholders, in order (the k-th
placeholder gets audio row k), exactly where transformers' ``masked_scatter`` puts them; every later forward
embeds tokens plainly, as transformers' decode steps do. So the state (cache + the window's audio rows) meets
the whole target contract: chains and trees, crop / compact, batch rows (the audio rows are a row's context),
beam rows, aux hidden states.

Models are local Hugging Face directories: a path, a name under ``$SPECLI_MODELS_DIR``, or a hub id / short
name already in the local Hugging Face cache. Nothing is downloaded; missing files are a
:class:`ModelLoadError` (exit 3) naming them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specli.core.device import resolve_device, resolve_dtype
from specli.core.goodput import MoEProfile
from specli.core.job import DecodeJob
from specli.core.kv_cache import KVCache, RaggedKVCache
from specli.core.types import ScoreOutput, TargetParts
from specli.errors import ModelLoadError, UsageError
from specli.io.locate import Lookup, locate, under_models_dir
from specli.models.moe import ExpertTally
from specli.models.qwen2 import Qwen2Target
from specli.models.speech import WindowPrompt

PROMPT_ROOM = 512  # cache positions a window's prompt and text have besides its audio rows


@dataclass(frozen=True)
class AudioLMState:
    """A window's decoder state: the self-attention cache, the window's audio embeddings, and each row's RoPE
    offset."""

    cache: KVCache | RaggedKVCache  # a batch state (start_batch) holds one row per slot
    audio: torch.Tensor  # [B, A, hidden] projected audio embeddings (rows past a window's N are unused)
    rope_delta: torch.Tensor  # [B] long: RoPE position = cache position + delta (set at each row's prefill)

    @property
    def length(self) -> int:
        return self.cache.length


@dataclass(frozen=True)
class DraftRecipe:
    """A family's published EAGLE-3 / DFlash drafter shape (yuekaizhang/SpecForge configs, z-lab DFlash). Layer
    ids are layer *outputs* (SpecForge / z-lab capture ``hidden_states[i + 1]``) of a ``ref_layers``-deep target;
    :meth:`aux_layers` scales them to another depth (tiny test targets)."""

    ref_layers: int  # depth of the published target
    dflash_aux: tuple[int, ...]  # DFlash target layer ids (outputs) at ref_layers
    dflash_block: int  # DFlash block size
    eagle3_unroll: int  # EAGLE-3 test-time-training unroll

    def aux_layers(self, kind: str, layers: int) -> tuple[tuple[int, ...], str]:
        """(layer ids, ``"output"``) a ``kind`` drafter reads on a ``layers``-deep target: EAGLE-3
        ``[1, L/2 - 1, L - 4]``, DFlash the published ids scaled to ``layers`` (distinct, within 0..L-1)."""
        top = layers - 1
        if kind == "eagle3":
            ids = sorted({min(max(i, 0), top) for i in (1, layers // 2 - 1, layers - 4)})
            if len(ids) < 3:  # a target too shallow for the default: spread over its blocks
                ids = sorted({int(round(k * top / 2)) for k in range(3)})
            if len(ids) < 3:
                raise ValueError(f"EAGLE-3 needs a target of at least 3 blocks, this one has {layers}")
            return tuple(ids), "output"
        if kind != "dflash":
            raise ValueError(f"no {kind} recipe for audio-LLM targets (eagle3, dflash)")
        if layers == self.ref_layers:
            return self.dflash_aux, "output"
        scale = top / max(self.ref_layers - 1, 1)
        return tuple(sorted({min(int(round(i * scale)), top) for i in self.dflash_aux})), "output"


# z-lab's build_target_layer_ids for a 5-layer drafter of a 32-block target: a family without a published one
DEFAULT_RECIPE = DraftRecipe(32, (1, 8, 15, 22, 28), 4, 5)


class AudioLMTarget:
    """Audio tower + projector (transformers modules, run by the family's :meth:`encode`) and the lean decoder
    (``lm``).

    Drafters (:mod:`specli.core.drafters.llm`) read it as a
    :class:`~specli.core.types.DraftableTarget`: the lean decoder's sizes, head and aux layers (numbered like
    transformers' ``hidden_states``), and :meth:`embed` (an audio placeholder embeds as its token, as SpecForge
    trains). ``draft_recipe`` is the family's published
    drafter shape; ``experts`` tallies the distinct experts each decoder forward touched (MoE decoders; None
    for dense ones)."""

    draft_recipe: DraftRecipe = DEFAULT_RECIPE

    def __init__(self, tower: torch.nn.Module, projector: torch.nn.Module, lm: Qwen2Target, audio_token: int,
                 audio_ctx: int, prompt_room: int = PROMPT_ROOM) -> None:
        self.tower, self.projector, self.lm = tower.eval(), projector.eval(), lm
        self.audio_token = audio_token
        self.dims, self.dtype, self.device = lm.dims, lm.dtype, lm.device
        self.audio_ctx = audio_ctx  # audio embeddings of a full window
        self.max_len = audio_ctx + prompt_room
        self.compiled_encoder = None  # the tower runs eagerly
        self.experts = ExpertTally() if lm.has_moe else None

    def moe_profile(self) -> MoEProfile | None:
        """The lean decoder's MoE routing and expert share (None: dense)."""
        return self.lm.moe_profile()

    # ---- the draftable-target protocol (core/types.DraftableTarget): the lean decoder's
    def draft_parts(self) -> TargetParts:
        return self.lm.draft_parts(self.embed)

    def request_aux_layers(self, layers: Sequence[int]) -> tuple[int, ...]:
        return self.lm.request_aux_layers(layers)

    def token_layout(self, record: dict) -> None:
        return self.lm.token_layout(record)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings of ids ``tokens [...]`` (audio placeholders as their token)."""
        return self.lm.embed(tokens)

    def encode(self, mel: torch.Tensor, frames: Sequence[int] | None = None) -> torch.Tensor:
        """``mel [B, n_mels, frames]`` with ``frames[b]`` real frames -> audio embeddings ``[B, A, hidden]``
        (a family's tower and projector; rows past a window's own count are unused)."""
        raise NotImplementedError

    def start(self, audio: torch.Tensor, max_len: int | None = None, features: torch.Tensor | None = None
              ) -> AudioLMState:
        """A new window state: an empty cache and the window's audio embeddings ``[1, A, hidden]``."""
        d = self.dims
        audio = audio.to(self.device, self.dtype)
        cache = KVCache(d.layers, audio.shape[0], d.kv_heads, max_len or self.max_len, d.head_dim, self.dtype,
                        self.device)
        return AudioLMState(cache, audio, self._deltas(audio.shape[0]))

    def widen(self, state: AudioLMState, rows: int) -> AudioLMState:
        """Beam search's ``rows``-row state of a one-row state (the audio rows broadcast)."""
        return AudioLMState(state.cache.widened(rows), state.audio.expand(rows, -1, -1),
                            state.rope_delta.repeat(rows // state.rope_delta.shape[0]))

    # ---- the batch contract (core/batched.py): slots of one preallocated state, rows [0, B) score
    def batch_target(self) -> AudioLMTarget:
        """An audio LM batches: itself (models/speech.SpeechTarget)."""
        return self

    def start_batch(self, capacity: int, max_len: int | None = None, spare: int = 0) -> AudioLMState:
        """An empty state of ``capacity`` slots (``max_len`` positions a row, + ``spare`` padding slots)."""
        d = self.dims
        cache = RaggedKVCache(d.layers, capacity, d.kv_heads, max_len or self.max_len, d.head_dim, spare,
                              self.dtype, self.device)
        audio = torch.zeros(capacity, self.audio_ctx, d.hidden, dtype=self.dtype, device=self.device)
        return AudioLMState(cache, audio, self._deltas(capacity))

    def admit(self, state: AudioLMState, slot: int, context: torch.Tensor) -> None:
        """Slot ``slot`` starts a new window: its audio embeddings ``[1, A, hidden]``; empty cache."""
        audio = context.to(self.device, self.dtype)
        if audio.shape[1:] != state.audio.shape[1:]:
            raise ValueError(f"audio embeddings {tuple(audio.shape)} do not fit {tuple(state.audio.shape)}")
        state.audio[slot] = audio[0]
        state.rope_delta[slot] = 0
        state.cache.set_length(slot, 0)

    def row_state(self, state: AudioLMState, slot: int, context: object = None) -> AudioLMState:
        """Slot ``slot`` as a batch-1 state over the same memory."""
        return AudioLMState(state.cache.row(slot), state.audio[slot : slot + 1], state.rope_delta[slot : slot + 1])

    def move(self, state: AudioLMState, src: int, dst: int) -> None:
        """Copy slot ``src`` into slot ``dst``."""
        state.audio[dst] = state.audio[src]
        state.rope_delta[dst] = state.rope_delta[src]
        state.cache.move(src, dst)

    @torch.inference_mode()
    def score(self, state: AudioLMState, tokens: torch.Tensor, positions: torch.Tensor | None = None,
              tree_mask: torch.Tensor | None = None, logit_rows: Sequence[int] | None = None) -> ScoreOutput:
        """One decoder forward over a chain or tree (the :class:`~specli.models.qwen2.Qwen2Target` contract);
        rows starting at position 0 (a prompt's prefill) take the audio embeddings at their audio placeholders
        and set their RoPE offset (:meth:`prompt_rope_delta`); every row's RoPE runs at position + offset."""
        tokens = tokens.to(self.device)
        b, n = tokens.shape
        if positions is None:
            positions = state.cache.positions(b, n, self.device)
        positions = positions.to(self.device)
        embeds = self.lm.embed(tokens)
        audio = (tokens == self.audio_token) & (positions[:, :1] == 0)  # [B, n]: a prompt's placeholders
        if bool(audio.any()):
            index = audio.long().cumsum(1) - 1  # k-th placeholder of its row -> audio row k
            if int(index.max()) >= state.audio.shape[1]:
                raise ValueError(f"more audio placeholders than the window's {state.audio.shape[1]} audio rows")
            rows = torch.arange(b, device=self.device)[:, None].expand(b, n)
            embeds = embeds.clone()
            embeds[audio] = state.audio[rows[audio], index[audio]].to(embeds.dtype)
        prefill = (positions[:, 0] == 0).nonzero()[:, 0].tolist()
        for row in prefill:
            state.rope_delta[row] = self.prompt_rope_delta(tokens[row])
        out = self.lm.score(state, None, positions + state.rope_delta[:b, None], tree_mask, embeds=embeds,
                            logit_rows=logit_rows)
        if self.experts is not None and not prefill:
            self.experts.add(b, n, self.lm.experts_touched())
        return out

    def prompt_rope_delta(self, prompt: torch.Tensor) -> int:
        """The RoPE offset of the text after ``prompt [n]`` (its prefill's ids): 0 for a family with 1-D RoPE;
        an M-RoPE family derives it from its 3-D prompt positions (and checks that 1-D RoPE is exact there)."""
        return 0

    def _deltas(self, rows: int) -> torch.Tensor:
        return torch.zeros(rows, dtype=torch.long, device=self.device)


@dataclass(frozen=True)
class SuppressRule:
    """Logit rule: ``ids`` are never emitted."""

    ids: tuple[int, ...]

    def __call__(self, logits: torch.Tensor, prefixes) -> torch.Tensor:
        out = logits.clone()
        out[..., list(self.ids)] = float("-inf")
        return out


@dataclass(frozen=True)
class AudioLMHooks:
    """An audio LLM's part of the window loop (:class:`specli.models.speech.SpeechHooks`), less its features and
    prompt: no timestamp tokens (a window is one segment spanning it), no language detection from the encoder
    (the language is given, or the model handles it in text), the chat turn's end as the stop token."""

    model: Any  # the loaded model: .target (an AudioLMTarget), .tokenizer (.eot)
    word_timestamps: bool = False

    @property
    def eot(self) -> int:
        return self.model.tokenizer.eot

    @property
    def timestamp_begin(self) -> int:
        return self.model.target.dims.vocab  # no timestamp tokens

    def language(self, given: str | None) -> str | None:
        return given

    def detect_language(self, state: object) -> None:
        return None

    def window_prompt(self, p: WindowPrompt) -> list[int]:
        """The family's prompt ids of one window (its audio placeholders expanded)."""
        raise NotImplementedError

    def window_job(self, p: WindowPrompt) -> DecodeJob:
        prompt = self.window_prompt(p)
        room = self.model.target.max_len - len(prompt)
        if room < 1:
            raise UsageError(f"the instruction leaves no room to decode ({len(prompt)} prompt tokens)")
        ids = tuple(t for t in p.suppress_tokens if t >= 0)
        return DecodeJob(tuple(prompt), SuppressRule(ids) if ids else None, self.eot, min(p.max_new_tokens, room),
                         generator=p.generator)


def read_config(path: Path) -> dict | None:
    """A directory's ``config.json`` (None: absent or unreadable)."""
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None


def claims_dir(name_or_dir: str, names: dict[str, str], marker: str, model_type: str) -> bool:
    """Whether ``name_or_dir`` names a family's model: a short name in ``names``, a name containing ``marker``,
    or a directory (as given or under ``$SPECLI_MODELS_DIR``) whose ``config.json`` says ``model_type``."""
    if name_or_dir in names or marker in name_or_dir.lower():
        return True
    for path in (Path(name_or_dir).expanduser(), *under_models_dir(name_or_dir)):
        cfg = read_config(path) if path.is_dir() else None
        if cfg is not None and cfg.get("model_type") == model_type:
            return True
    return False


def resolve_dir(name_or_dir: str, names: dict[str, str], label: str) -> Path:
    """The model directory, found offline by :func:`~specli.io.locate.locate`: a path, ``$SPECLI_MODELS_DIR/<name>``,
    or a cached hub snapshot of ``names``' hub id (never downloaded); ``label`` names the family in the error."""
    return locate(name_or_dir, Lookup(f"{label} model", repo=names.get(name_or_dir)))


#: what a directory lacks when it has no feature-extractor settings (both places they are read from)
FEATURE_FILES = "preprocessor_config.json (or processor_config.json with a feature_extractor entry)"


def _find_feature_settings(path: Path) -> tuple[dict[str, Any], Path] | None:
    """The feature extractor's settings and the file they were read from, looked up as transformers 5 does:
    the ``feature_extractor`` entry of ``processor_config.json`` (what ``processor.save_pretrained`` writes
    in transformers >= 5), else ``preprocessor_config.json`` (a feature extractor saved alone, and processors
    saved by transformers 4); None: neither. An unreadable file is a :class:`ModelLoadError` naming it."""
    for name, key in (("processor_config.json", "feature_extractor"), ("preprocessor_config.json", None)):
        file = path / name
        if not file.is_file():
            continue
        try:
            cfg = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{file}: cannot read it: {exc}") from exc
        settings = cfg.get(key) if key and isinstance(cfg, dict) else cfg
        if isinstance(settings, dict):
            return settings, file
    return None


def feature_extractor_settings(path: Path) -> tuple[dict[str, Any], Path]:
    """The directory's feature-extractor settings and their file (:func:`_find_feature_settings`); none is a
    :class:`ModelLoadError` naming both files looked for."""
    found = _find_feature_settings(path)
    if found is None:
        raise ModelLoadError(f"{path}: no feature extractor settings, missing {FEATURE_FILES}")
    return found


def load_feature_extractor(path: Path, hf_class: Any) -> Any:
    """transformers' feature extractor ``hf_class`` built from the directory's settings
    (:func:`feature_extractor_settings`); settings saved for another class are refused, naming the file."""
    settings, file = feature_extractor_settings(path)
    kind = settings.get("feature_extractor_type", hf_class.__name__)
    if kind != hf_class.__name__:
        raise ModelLoadError(f"{file}: the feature extractor is {kind}, not {hf_class.__name__}")
    try:
        return hf_class.from_dict(dict(settings))
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{file}: cannot build the feature extractor: {exc}") from exc


def missing_files(path: Path) -> list[str]:
    """The files a model directory lacks (config, weights and the shards its index names, tokenizer,
    feature-extractor settings)."""
    missing = [n for n in ("config.json", "tokenizer_config.json") if not (path / n).is_file()]
    if _find_feature_settings(path) is None:
        missing.append(FEATURE_FILES)
    if not (path / "tokenizer.json").is_file() and not (path / "vocab.json").is_file():
        missing.append("tokenizer.json (or vocab.json + merges.txt)")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        missing += [s for s in shards if not (path / s).is_file()]
    elif not any(path.glob("*.safetensors")):
        missing.append("model.safetensors")
    return missing


def load_hf_model(path: Path, label: str, model_type: str, hf_class: Any, dtype: str, device: str | torch.device,
                  type_hint: str = "", **kwargs: Any) -> tuple[Any, torch.device, torch.dtype]:
    """transformers' ``hf_class`` loaded offline from a resolved directory, with the device and dtype it was loaded
    for: the directory is checked first (its files, ``config.json``'s ``model_type``; ``label`` and ``type_hint``
    word the errors), int8 is refused (a Whisper-only dtype), transformers' progress bar stays off."""
    from transformers.utils import logging as hf_logging  # noqa: PLC0415 (heavy; not a specli module)

    hf_logging.disable_progress_bar()  # library code shows nothing (transformers' loading bar included)
    missing = missing_files(path)
    if missing:
        raise ModelLoadError(f"{path}: not a complete {label} directory, missing {', '.join(missing)}")
    if (read_config(path) or {}).get("model_type") != model_type:
        raise ModelLoadError(f"{path / 'config.json'}: model_type is not {model_type!r}{type_hint}")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if dt == torch.int8:
        raise UsageError("dtype int8 is for Whisper targets; use float32, bfloat16 or float16")
    try:
        hf = hf_class.from_pretrained(str(path), dtype=dt, local_files_only=True, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot load the weights: {exc}") from exc
    return hf, dev, dt


def load_tokenizer(path: Path, specials: Sequence[str]) -> tuple[Any, dict[str, int]]:
    """A model directory's tokenizer (offline) and the ids of its ``specials`` (ModelLoadError naming a missing
    one)."""
    from transformers import AutoTokenizer  # noqa: PLC0415 (heavy; not a specli module)

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot read the tokenizer: {exc}") from exc
    ids = {}
    for token in specials:
        tid = tok.convert_tokens_to_ids(token)
        if tid is None or tid == tok.unk_token_id:
            raise ModelLoadError(f"{path}: special token {token} missing from the tokenizer")
        ids[token] = int(tid)
    return tok, ids


def read_chat_template(path: Path) -> str | None:
    """The model's chat template: ``chat_template.jinja``, ``chat_template.json`` or ``tokenizer_config.json``
    (None: none, e.g. a base model)."""
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    for name in ("chat_template.json", "tokenizer_config.json"):
        if (path / name).is_file():
            template = json.loads((path / name).read_text()).get("chat_template")
            if isinstance(template, str):
                return template
    return None
