"""On-policy distillation data for EAGLE-3 / DFlash drafters of an audio LLM (Qwen2-Audio, Qwen3-ASR, Qwen3-Omni).

Each input file is transcribed exactly as ``specli transcribe`` decodes it (``transcribe_stream`` with the
given :class:`~specli.asr.windows.TranscribeOptions` and plain greedy decoding: the same windows, prompts,
instruction and language; ``specli distill data`` passes temperature 0 only, so no window's label is a sampled
fallback), recording every window's audio embeddings, prompt and greedy transcript (the chat
turn's end included when the window finished). One extra target forward over each window's sequence (the
audio rows spliced in at its placeholders, as at inference) gives the hidden states the drafters train on.

Records have the speech-drafter layout (:mod:`specli.distill.speech_data`), so the one trainer
(:mod:`specli.distill.speech_train`) reads them: ``tokens`` int64 ``[T]`` (prompt with its audio placeholders +
transcript + end), ``plen`` (the prompt's length: the loss covers the transcript tokens only, never the prompt
or its audio placeholders), ``aux`` fp16 ``[T, n_aux, H]`` (layers ``manifest["aux_layers"]`` in the target's
input numbering: the union of the family's EAGLE-3 and DFlash recipes), ``last`` fp16 ``[T, H]`` and ``id``
(``file#window``). The manifest records the kind (``audio-lm``), the family, the layers and the target's
fingerprint; a rerun skips the files already done.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specli.asr.drafters.eagle_head import target_fingerprint
from specli.asr.fallback import WindowDecode
from specli.asr.windows import TranscribeOptions, transcribe_stream
from specli.core.drafters.llm.base import target_layer_ids
from specli.distill.data import add_shard, open_manifest
from specli.distill.speech_train import DraftTarget
from specli.errors import SpecliError
from specli.io.audio import iter_audio_chunks
from specli.models.audio_lm import AudioLMTarget

Progress = Callable[[str, int, int], None]  # (message, files done, files total)
KIND = "audio-lm"


@dataclass(frozen=True)
class AudioLMDataSummary:
    """What one :func:`generate_audio_lm` call did."""

    done: int  # files labelled now
    skipped: int  # files already in the manifest
    windows: int  # windows written now
    tokens: int  # transcript tokens written now (the end token included)


def recipe_layers(target: AudioLMTarget) -> tuple[int, ...]:
    """The target layers (input numbering) the family's EAGLE-3 and DFlash recipes read, together."""
    depth = target.dims.layers
    ids: set[int] = set()
    for kind in ("eagle3", "dflash"):
        layers, convention = target.draft_recipe.aux_layers(kind, depth)
        ids.update(target_layer_ids(layers, convention))
    return tuple(sorted(ids))


def use_layers(target: AudioLMTarget, layers: Sequence[int]) -> tuple[int, ...]:
    """Make the target return the states of ``layers`` (input numbering) in ``HiddenStates.aux`` (through the
    draftable-target protocol, core/types.DraftableTarget); the ids to pick them by (``HiddenStates.pick``)."""
    return target.request_aux_layers(layers)


def window_record(target: AudioLMTarget, audio: torch.Tensor, tokens: list[int], plen: int, key: str,
                  layers: Sequence[int]) -> dict:
    """One window's record: its ids, the states of target ``layers`` (requested by :func:`use_layers`) and the
    final state (fp16). The prompt is one prefill and the transcript a second forward, as in decoding: a transcript
    token that happens to be the audio placeholder is text there, not an audio row."""
    state = target.start(audio[None], max_len=len(tokens) + 1)
    ids = torch.tensor([tokens], dtype=torch.long)  # [1, n]
    parts = [target.score(state, ids[:, :plen]).hidden]
    if len(tokens) > plen:
        parts.append(target.score(state, ids[:, plen:]).hidden)
    aux = [torch.cat(states, dim=1) for states in zip(*(h.pick(layers) for h in parts))]  # each [1, n, hidden]
    last = torch.cat([h.last for h in parts], dim=1)  # [1, n, hidden]
    return {"tokens": ids[0], "plen": plen, "id": key,
            "aux": torch.stack([a[0] for a in aux], dim=1).half().cpu().clone(),
            "last": last[0].half().cpu().clone()}


def file_records(model, path: Path, opts: TranscribeOptions, layers: Sequence[int]) -> list[dict]:
    """Transcribe ``path`` as ``transcribe`` does (greedy) and return its windows' records (target ``layers``)."""
    windows: list[tuple[torch.Tensor, list[int], int]] = []
    eot = model.speech_hooks().eot

    def record(state, prompt: list[int], win: WindowDecode, _span) -> None:
        res = win.result
        windows.append((state.audio[0].clone(), list(prompt) + res.tokens + [eot] * res.finished, len(prompt)))

    transcribe_stream(model, iter_audio_chunks(path), opts, on_decode=record)
    return [window_record(model.target, audio, tokens, plen, f"{path.name}#{i}", layers)
            for i, (audio, tokens, plen) in enumerate(windows)]


def generate_audio_lm(inputs: Sequence[Path], model, out: Path, opts: TranscribeOptions = TranscribeOptions(),
                      layers: Sequence[int] = (), progress: Progress | None = None) -> AudioLMDataSummary:
    """Write one shard per input file not yet in ``out``'s manifest (``layers``: target layer ids, input
    numbering; () = the family's recipes)."""
    out.mkdir(parents=True, exist_ok=True)
    target = model.target
    manifest = open_manifest(out, target_fingerprint(target.dims), model.name)
    layers = tuple(sorted({int(i) for i in layers})) or recipe_layers(target)
    if any(not 0 <= i <= target.dims.layers for i in layers):
        raise SpecliError(f"aux layers {list(layers)} outside 0..{target.dims.layers} of this target")
    settings = {"kind": KIND, "aux_layers": list(layers), "aux_convention": "input", "eos": model.speech_hooks().eot,
                "options": {k: v for k, v in asdict(opts).items() if k in ("task", "language", "instruction")}}
    for name, value in settings.items():
        if manifest.setdefault(name, value) != value:
            raise SpecliError(f"{out}: data was generated with {name} {manifest[name]!r}, not {value!r} "
                              "(use another --out directory)")
    todo = list(dict.fromkeys(Path(p) for p in inputs if str(Path(p).resolve()) not in manifest["done"]))
    skipped, done, windows, tokens = len(inputs) - len(todo), 0, 0, 0
    picked = use_layers(target, layers)
    for path in todo:
        records = file_records(model, path, opts, picked)
        shard = add_shard(out, manifest, str(path.resolve()), records)
        done, windows = done + 1, windows + len(records)
        tokens += sum(len(r["tokens"]) - r["plen"] for r in records)
        if progress is not None:
            progress(f"{path}: {len(records)} window(s) -> {shard}", skipped + done, len(inputs))
    return AudioLMDataSummary(done, skipped, windows, tokens)


def read_audio_lm_manifest(data_dir: Path) -> dict:
    """The manifest of an audio-LLM data directory (refuses another kind)."""
    manifest = open_manifest(data_dir)
    if manifest.get("kind") != KIND:
        raise SpecliError(f"{data_dir}: not audio-LLM distillation data (run `specli distill data --preset "
                          "qwen2-audio-ar ...`)")
    return manifest


def audio_lm_target(model) -> DraftTarget:
    """An audio LLM's training view: the chat turn's end pads and is always drafted with the special ids after
    it; the family's EAGLE-3 / DFlash recipes (layer outputs, block / unroll). No validation decode (the
    records keep no audio): check a trained drafter with ``transcribe`` / ``bench``."""
    target, eot = model.target, model.speech_hooks().eot
    recipe = target.draft_recipe
    return DraftTarget(target, eot, min(eot, target.dims.vocab - 1), recipe.aux_layers,
                       {"dflash": recipe.dflash_block, "eagle3": recipe.eagle3_unroll})
