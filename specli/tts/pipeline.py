"""Batch synthesis: read utterances (text files, stdin, ``--text``, JSONL manifests), skip finished ones,
synthesize the rest, write ``<id>.npy`` speech tokens atomically. A bad line is reported with its line
number and the batch goes on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from specli.tts.synthesis import SynthesisInputError, SynthesisRequest, SynthesisResult, Synthesizer
from specli.io.atomic import write_atomic_with

O = TypeVar("O")  # an outcome record (SpeechOutcome, or speech_audio.AudioOutcome)


@dataclass(frozen=True)
class SpeechItem:
    """One input line: a request, or why it cannot become one."""

    where: str  # "file:line" (or "--text 2") for messages
    request: SynthesisRequest | None  # None when the line is bad
    error: str = ""  # why the line is bad
    prompt_wav: str = ""  # a manifest line's voice prompt recording (audio output only; see speech_audio.py)


@dataclass(frozen=True)
class SpeechOutcome:
    """What happened to one input line."""

    where: str  # "file:line"
    id: str  # request id ("" for a line that had none)
    result: SynthesisResult | None = None  # set when synthesized now
    skipped: bool = False  # output existed and --overwrite was not given
    error: str = ""  # why it failed


_SAFE_ID = re.compile(r"[^A-Za-z0-9._-]+")


def _safe(name: str) -> str:
    return _SAFE_ID.sub("_", name).strip("._") or "utt"


def _manifest_item(where: str, line: str, default_id: str, base: Path | None = None) -> SpeechItem:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        return SpeechItem(where, None, f"not valid JSON: {exc.msg}")
    if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
        return SpeechItem(where, None, "a manifest line needs a string 'text'")
    tokens = rec.get("prompt_tokens")
    wav = rec.get("prompt_wav")
    if wav is not None and (not isinstance(wav, str) or not wav.strip()):
        return SpeechItem(where, None, "prompt_wav must be a non-empty path (relative to the manifest)")
    if tokens is not None and (not isinstance(tokens, list) or not all(type(t) is int for t in tokens)):
        return SpeechItem(where, None, "prompt_tokens must be a list of integers")
    prompt_text = rec.get("prompt_text") or ""
    if not isinstance(prompt_text, str):
        return SpeechItem(where, None, "prompt_text must be a string")
    rid = rec.get("id", default_id)
    if not isinstance(rid, (str, int)) or not str(rid).strip():
        return SpeechItem(where, None, "id must be a non-empty string")
    wav_path = "" if not wav else str(base / wav if base is not None else Path(wav))
    return SpeechItem(where, SynthesisRequest(_safe(str(rid)), rec["text"], prompt_text, tuple(tokens or ())),
                      prompt_wav=wav_path)


def _decoded(raw_lines: Iterable[bytes | str]) -> Iterator[tuple[int, str | None, str]]:
    """``(line number, text or None, why not)`` per line: each line decoded as UTF-8 on its own, so one bad
    byte fails its line only (a byte-order mark at the start is dropped)."""
    for n, raw in enumerate(raw_lines, 1):
        if isinstance(raw, str):
            yield n, raw.rstrip("\r\n"), ""
            continue
        if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            yield n, raw.rstrip(b"\r\n").decode("utf-8"), ""
        except UnicodeDecodeError as exc:
            yield n, None, f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at column {exc.start + 1}"


def _lines(name: str, raw_lines: Iterable[bytes | str], stem: str, manifest: bool) -> Iterator[SpeechItem]:
    for n, line, why in _decoded(raw_lines):
        where, default_id = f"{name}:{n}", f"{stem}_{n:05d}"
        if line is None:
            yield SpeechItem(where, None, why)
        elif manifest:
            if line.strip():
                yield _manifest_item(where, line, default_id, Path(name).parent)
        elif not line.strip():
            yield SpeechItem(where, None, "empty line")
        else:
            yield SpeechItem(where, SynthesisRequest(default_id, line.strip()))


def read_items(inputs: Iterable[str], texts: Iterable[str] = (), stdin: Iterable[bytes | str] | None = None
               ) -> list[SpeechItem]:
    """Items of every input: ``*.jsonl`` manifests, text files (one utterance a line), ``-`` (stdin, bytes
    or text lines), ``--text``. Files are decoded line by line: an undecodable line fails alone."""
    items: list[SpeechItem] = []
    for i, text in enumerate(texts, 1):
        items.append(SpeechItem(f"--text {i}", SynthesisRequest(f"text_{i:05d}", text))
                     if text.strip() else SpeechItem(f"--text {i}", None, "empty text"))
    for name in inputs:
        if name == "-":
            items += _lines("<stdin>", stdin or (), "stdin", False)
            continue
        path = Path(name)
        try:
            raw_lines = path.read_bytes().splitlines(keepends=True)
        except OSError as exc:
            items.append(SpeechItem(name, None, f"cannot read: {exc.strerror or exc}"))
            continue
        items += _lines(name, raw_lines, _safe(path.stem), path.suffix == ".jsonl")
    seen: set[str] = set()
    out = []
    for it in items:
        if it.request is not None and it.request.id in seen:
            it = SpeechItem(it.where, None, f"duplicate id {it.request.id!r}")
        elif it.request is not None:
            seen.add(it.request.id)
        out.append(it)
    return out


def tokens_path(output_dir: Path, rid: str) -> Path:
    return output_dir / f"{rid}.npy"


def write_tokens_atomic(path: Path, tokens: list[int]) -> None:
    """``tokens`` as an int32 ``.npy``, through a hidden temporary file and a rename (as ``write_atomic``)."""
    write_atomic_with(path, lambda fh: np.save(fh, np.asarray(tokens, dtype=np.int32)))


def run_items(synth: Synthesizer, items: list[SpeechItem], done: Callable[[str], bool], overwrite: bool,
              outcome: Callable[..., O], produce: Callable[[SpeechItem], O], errors: tuple[type[Exception], ...],
              on_outcome: Callable[[O], None] | None = None) -> list[O]:
    """The batch loop: a bad line gives an error ``outcome``, a request whose output is ``done`` (by id) is
    skipped unless ``overwrite``, any other is ``produce``d (``errors`` it raises become error outcomes)."""
    outcomes = []
    for it in items:
        out = _settled(it, done, overwrite, outcome)
        if out is None:
            try:
                out = produce(it)
            except errors as exc:
                out = outcome(it.where, it.request.id, error=str(exc))
        outcomes.append(out)
        if on_outcome is not None:
            on_outcome(out)
    synth.finish()
    return outcomes


def _settled(it: SpeechItem, done: Callable[[str], bool], overwrite: bool, outcome: Callable[..., O]) -> O | None:
    """The outcome of an item that needs no synthesis (a bad line, or its output is ``done``), else None."""
    if it.request is None:
        return outcome(it.where, "", error=it.error)
    if not overwrite and done(it.request.id):
        return outcome(it.where, it.request.id, skipped=True)
    return None


def _frontend_needed(it: SpeechItem) -> SpeechOutcome | None:
    """The failure of a line whose voice prompt is a recording: speech tokens only cannot read it."""
    if it.prompt_wav and not it.request.prompt_tokens:
        return SpeechOutcome(it.where, it.request.id, error="prompt_wav needs the speech-tokenizer frontend: "
                             "give --format wav or flac, or prompt_tokens (speech token ids of the prompt)")
    return None


def run_synthesis(synth: Synthesizer, items: list[SpeechItem], output_dir: Path, overwrite: bool = False,
                  on_outcome: Callable[[SpeechOutcome], None] | None = None, batch_size: int = 1
                  ) -> list[SpeechOutcome]:
    """Synthesize every good item whose ``<id>.npy`` is missing (or all with ``overwrite``); with ``batch_size``
    > 1 up to that many decode together (the same tokens; outcomes still reported in input order)."""
    done = lambda rid: tokens_path(output_dir, rid).is_file()  # noqa: E731
    if batch_size > 1:
        return _run_batched(synth, items, output_dir, done, overwrite, on_outcome, batch_size)

    def produce(it: SpeechItem) -> SpeechOutcome:
        failed = _frontend_needed(it)
        if failed is not None:
            return failed
        res = synth.synthesize(it.request)
        write_tokens_atomic(tokens_path(output_dir, it.request.id), res.tokens)
        return SpeechOutcome(it.where, it.request.id, res)

    return run_items(synth, items, done, overwrite, SpeechOutcome, produce, (SynthesisInputError,), on_outcome)


def _run_batched(synth: Synthesizer, items: list[SpeechItem], output_dir: Path, done: Callable[[str], bool],
                 overwrite: bool, on_outcome: Callable[[SpeechOutcome], None] | None, batch_size: int
                 ) -> list[SpeechOutcome]:
    """:func:`run_synthesis` through :meth:`Synthesizer.synthesize_batch`: each output is written as its row
    finishes; outcomes are released to ``on_outcome`` in input order as soon as all earlier ones are known."""
    outcomes: list[SpeechOutcome | None] = [None] * len(items)
    released = 0

    def settle(k: int, out: SpeechOutcome) -> None:
        nonlocal released
        outcomes[k] = out
        while released < len(items) and outcomes[released] is not None:
            if on_outcome is not None:
                on_outcome(outcomes[released])
            released += 1

    todo = []
    for k, it in enumerate(items):
        out = _settled(it, done, overwrite, SpeechOutcome) or _frontend_needed(it)
        if out is None:
            todo.append(k)
        else:
            settle(k, out)
    for j, res in synth.synthesize_batch([items[k].request for k in todo], batch_size):
        it = items[todo[j]]
        if isinstance(res, SynthesisInputError):
            settle(todo[j], SpeechOutcome(it.where, it.request.id, error=str(res)))
            continue
        write_tokens_atomic(tokens_path(output_dir, it.request.id), res.tokens)
        settle(todo[j], SpeechOutcome(it.where, it.request.id, res))
    synth.finish()
    return [out for out in outcomes if out is not None]


def result_record(result: SynthesisResult) -> dict:
    """The JSONL record of one synthesized utterance."""
    s = result.stats
    return {
        "id": result.id, "text": result.text, "tokens": len(result.tokens), "text_tokens": result.text_tokens,
        "min_len": result.min_len, "max_len": result.max_len, "finished": result.finished,
        "stats": {"target_forwards": s.target_forwards, "decode_seconds": round(s.decode_seconds, 4),
                  "tokens_per_second": round(len(result.tokens) / s.decode_seconds, 2) if s.decode_seconds else 0.0,
                  "verify_steps": s.verify_steps, "drafted": s.drafted, "accepted": s.accepted,
                  "acceptance_length": round(s.acceptance_length, 3)},
    }
