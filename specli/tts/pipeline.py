"""Batch synthesis: read utterances (text files, stdin, ``--text``, JSONL manifests), skip finished ones,
synthesize the rest, write ``<id>.npy`` speech tokens atomically. A bad line is reported with its line
number and the batch goes on.

Resume works as transcription's (:mod:`specli.io.resume`): beside each output a hidden sidecar
(``.<id>.npy.specli``, written before the output) records the settings that change it
(:func:`synthesis_settings` + the line's request, + format, rate, voice and acoustic checkpoints for
audio) and its JSON record; a rerun keeps an output made with the same settings (its record read back),
redoes one made with others (``Resume.on_redo`` says why), and ``Resume.mode`` "overwrite" /
"skip-existing" redoes or keeps every existing one.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from specli.io.atomic import remove_stale_parts, write_atomic_with
from specli.io.batch import Outcome, in_input_order
from specli.io.outputs import mirrored_bases, path_tag
from specli.io.resume import ResumeMode, decide, file_fingerprint, read_sidecar, sidecar_path, write_sidecar
from specli.models.cosyvoice.lm import CosyVoiceModel, lm_fingerprint
from specli.presets.draft import llm_draft_options
from specli.tts.drafters import drafter_dir
from specli.tts.synthesis import SynthesisInputError, SynthesisOptions, SynthesisRequest, SynthesisResult, Synthesizer


@dataclass(frozen=True)
class SpeechItem:
    """One input line: a request, or why it cannot become one."""

    where: str  # "file:line" (or "--text 2") for messages
    request: SynthesisRequest | None  # None when the line is bad
    error: str = ""  # why the line is bad
    prompt_wav: str = ""  # a manifest line's voice prompt recording (audio output only; see speech_audio.py)
    source: str = ""  # the input it came from: a file's resolved path, "--text" or "<stdin>" (its records' "source")
    fallback_id: str = ""  # the id it takes when the output under its id was made from another input ("": none)


_SAFE_ID = re.compile(r"[^A-Za-z0-9._-]+")


def _safe(name: str) -> str:
    return _SAFE_ID.sub("_", name).strip("._") or "utt"


def _manifest_item(where: str, line: str, default_id: str, base: Path | None = None, tag: str = "") -> SpeechItem:
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
                      prompt_wav=wav_path, fallback_id=_safe(f"{rid}-{tag}") if tag else "")


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


@dataclass(frozen=True)
class _Input:
    """One input of the batch and how its lines are named."""

    name: str  # as given ("<stdin>" for '-')
    stem: str  # its text lines' id prefix: the mirrored file name, tagged when another input's would be the same
    source: str  # its items' source (a file's resolved path, or "<stdin>")
    tag: str = ""  # a file's path tag: the fallback ids of its lines carry it ("": none)
    manifest: bool = False  # a *.jsonl manifest (ids its own)


def _lines(src: _Input, raw_lines: Iterable[bytes | str]) -> Iterator[SpeechItem]:
    for n, line, why in _decoded(raw_lines):
        where, default_id = f"{src.name}:{n}", f"{src.stem}_{n:05d}"
        if line is None:
            yield SpeechItem(where, None, why, source=src.source)
        elif src.manifest:
            if line.strip():
                yield replace(_manifest_item(where, line, default_id, Path(src.name).parent, src.tag),
                              source=src.source)
        elif not line.strip():
            yield SpeechItem(where, None, "empty line", source=src.source)
        else:
            fallback = f"{src.stem}-{src.tag}_{n:05d}" if src.tag and not src.stem.endswith(src.tag) else ""
            yield SpeechItem(where, SynthesisRequest(default_id, line.strip()), source=src.source,
                             fallback_id=fallback)


def _named_inputs(inputs: Sequence[str], texts: bool) -> list[_Input]:
    """Every input named as transcription names its outputs (:func:`~specli.io.outputs.mirrored_bases`): a text
    file's lines are ``<file stem>_<line>``, with the file's path tag when another input of the run (or ``--text``,
    ``-``) would give the same names; stdin's ``stdin_<n>``."""
    files = [Path(n) for n in inputs if n != "-"]
    reserved = [Path(r) for r, used in (("text", texts), ("stdin", "-" in inputs)) if used]  # --text and '-' ids
    bases = mirrored_bases([(f, f.parent) for f in files] + [(r, Path()) for r in reserved], Path())
    named = iter(zip(files, bases))
    out = []
    for name in inputs:
        if name == "-":
            out.append(_Input("<stdin>", "stdin", "<stdin>"))
            continue
        path, base = next(named)
        out.append(_Input(name, _safe(base.name), str(path.resolve()), path_tag(path), path.suffix == ".jsonl"))
    return out


def read_items(inputs: Iterable[str], texts: Iterable[str] = (), stdin: Iterable[bytes | str] | None = None
               ) -> list[SpeechItem]:
    """Items of every input: ``*.jsonl`` manifests, text files (one utterance a line), ``-`` (stdin, bytes
    or text lines), ``--text``. Files are decoded line by line: an undecodable line fails alone; an input
    with no line to speak (an empty file) fails as a whole."""
    texts, items = list(texts), []
    for i, text in enumerate(texts, 1):
        items.append(SpeechItem(f"--text {i}", SynthesisRequest(f"text_{i:05d}", text), source="--text")
                     if text.strip() else SpeechItem(f"--text {i}", None, "empty text", source="--text"))
    for src in _named_inputs(list(inputs), bool(texts)):
        if src.source == "<stdin>":
            raw_lines = list(stdin or ())
        else:
            try:
                raw_lines = Path(src.name).read_bytes().splitlines(keepends=True)
            except OSError as exc:
                items.append(SpeechItem(src.name, None, f"cannot read: {exc.strerror or exc}"))
                continue
        found = list(_lines(src, raw_lines))
        if not found:
            why = "no input lines" if src.source == "<stdin>" else (
                "no utterances (only blank lines)" if raw_lines else "file is empty (0 bytes)")
            found = [SpeechItem(src.name, None, why, source=src.source)]
        items += found
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


def tokens_bytes(tokens: list[int]) -> bytes:
    """``tokens`` as the bytes of an int32 ``.npy`` file."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(tokens, dtype=np.int32))
    return buf.getvalue()


def write_tokens_atomic(path: Path, tokens: list[int]) -> None:
    """``tokens`` as an int32 ``.npy``, through a hidden temporary file and a rename (as ``write_atomic``)."""
    data = tokens_bytes(tokens)
    write_atomic_with(path, lambda fh: fh.write(data))


@dataclass(frozen=True)
class Resume:
    """How a run treats an utterance whose output exists (:mod:`specli.io.resume`, one sidecar per output)."""

    settings: dict  # the run's output-changing settings (synthesis_settings); each line adds its request
    mode: ResumeMode = "changed"  # changed: redo outputs made with other settings; overwrite: redo every one;
    # skip-existing: keep every one
    on_redo: Callable[[str, str], None] | None = None  # told (id, why) of each existing output redone ("changed")
    # told (id, new id, the other input) of each line renamed because its output was made from another input
    on_rename: Callable[[str, str, str], None] | None = None


def synthesis_settings(synth: Synthesizer, preset: str = "") -> dict:
    """The run-wide settings that change an utterance's speech tokens (each line adds its request).

    The seed and the drafter are recorded under a sampler only: greedy tokens depend on neither, while a
    sampled utterance draws from its own seeded generator and a drafter changes which sample is drawn (the
    same distribution, another realisation: the accept tests consume the draws differently).
    """
    model, opts = synth.model, synth.options
    settings: dict = {"preset": preset, "model": model_settings(model),
                      "dtype": str(model.lm.qwen.dtype).removeprefix("torch."), "sampler": asdict(opts.sampler)}
    if model.spec.max_piece_words:  # recorded only where set: outputs of voices without it stay current
        settings["max_piece_words"] = model.spec.max_piece_words
    if opts.sampler.name != "greedy":
        settings["seed"] = opts.seed
        settings["drafter"] = _drafter_settings(opts)
    return settings


def model_settings(model: CosyVoiceModel) -> dict:
    """The LM: its directory, its architecture and output vocabulary (``lm_fingerprint``, as distillation
    data records it) and the content of ``llm.pt`` (:func:`file_fingerprint`: sampled, milliseconds)."""
    return {"path": str(model.path.resolve()), "lm": lm_fingerprint(model),
            "weights": content_fingerprint(model.path / "llm.pt")}


def _drafter_settings(opts: SynthesisOptions) -> dict:
    """The drafter and its strategy; a drafter directory by where it resolves and its weights' content."""
    spec = opts.draft
    if spec.drafter == "none":
        return {"kind": "none"}
    settings: dict = {"kind": spec.drafter, "max_draft": spec.max_draft}
    if spec.learns:  # the n-gram pool: no weights
        settings["ngram"] = spec.ngram
    else:
        where = drafter_dir(spec.draft_dir)
        files = [where / "config.json", *sorted(where.glob("*.safetensors"))]  # what loading it reads
        settings.update(dir=str(where.resolve()), options=asdict(llm_draft_options(spec)),
                        files={f.name: content_fingerprint(f) for f in files})
    return settings


def content_fingerprint(path: Path) -> str:
    """:func:`file_fingerprint` of ``path``, or "missing" when it cannot be read (the line fails later)."""
    try:
        return file_fingerprint(path)
    except OSError:
        return "missing"


def request_settings(request: SynthesisRequest) -> dict:
    """What a line asks for: its text, prompt text and prompt speech tokens (a digest: they can be many)."""
    tokens = request.prompt_tokens
    digest = hashlib.sha256(json.dumps(list(tokens)).encode()).hexdigest()[:12] if tokens else ""
    return {"text": request.text, "prompt_text": request.prompt_text,
            "prompt_tokens": f"{len(tokens)} tokens {digest}" if tokens else ""}


class OutputWriteError(SynthesisInputError):
    """One output (or its sidecar) could not be written: that line fails, the batch goes on."""


def write_output(path: Path, data: bytes, settings: Mapping[str, object], record: dict) -> None:
    """``data`` to ``path`` atomically, its sidecar (settings, hash, JSON record) first (:mod:`specli.io.resume`);
    :class:`OutputWriteError` names ``path`` (never a temporary file) and the reason when it cannot be."""
    try:
        write_sidecar(sidecar_path(path), settings, {path: data}, record)
        write_atomic_with(path, lambda fh: fh.write(data))
    except OSError as exc:
        raise OutputWriteError(f"cannot write {path}: {exc.strerror or exc}") from exc


def made_from_other_input(path: Path, source: str) -> str | None:
    """The input the output at ``path`` was made from, when it exists and its sidecar's record names another
    input than ``source`` (outputs made before records named their input: None)."""
    if not path.is_file():
        return None
    sidecar = read_sidecar(sidecar_path(path))
    theirs = sidecar.record.get("source") if sidecar is not None else None
    return theirs if isinstance(theirs, str) and theirs != source else None


def own_outputs(items: list[SpeechItem], path_of: Callable[[str], Path], resume: Resume) -> list[SpeechItem]:
    """``items``, each whose output (``path_of(id)``) was made from another input renamed to its fallback id (its
    input's path tag added): a run never overwrites another input's output; ``resume.on_rename`` is told. The
    temporary files a killed earlier run left for these outputs and their sidecars are removed."""
    out = []
    for it in items:
        other = None
        if it.request is not None and it.fallback_id:
            other = made_from_other_input(path_of(it.request.id), it.source)
        if other is not None:
            if resume.on_rename is not None:
                resume.on_rename(it.request.id, it.fallback_id, other)
            it = replace(it, request=replace(it.request, id=it.fallback_id))
        out.append(it)
    paths = [path_of(it.request.id) for it in out if it.request is not None]
    remove_stale_parts([*paths, *map(sidecar_path, paths)])
    return out


Target = Callable[[SpeechItem], tuple[Path, dict]]  # a good line's output path and its settings
Pairs = Iterator[tuple[int, Outcome]]  # (input position, outcome) of each line, in the order they finish


def failed(it: SpeechItem, why: str) -> Outcome:
    """The failed outcome of a line (a bad line has no id)."""
    return Outcome(it.where, error=why, id=it.request.id if it.request is not None else "")


def run_items(items: list[SpeechItem], resume: Resume, target: Target,
              produce: Callable[[SpeechItem, Path, dict], Outcome], errors: tuple[type[Exception], ...]) -> Pairs:
    """The batch-1 loop: a bad line fails, a request whose output (``target``) is kept by ``resume`` is skipped,
    any other is ``produce``d to its output with its settings (``errors`` it raises fail that line)."""
    for k, it in enumerate(items):
        out, path, settings = settled_item(it, resume, target)
        if out is None:
            try:
                out = produce(it, path, settings)
            except errors as exc:
                out = failed(it, str(exc))
        yield k, out


def report_in_order(synth: Synthesizer, pairs: Pairs, on_outcome: Callable[[Outcome], None] | None
                    ) -> list[Outcome]:
    """The outcomes of ``pairs``, each released to ``on_outcome`` in input order as soon as all earlier ones are
    known (batched rows finish out of order; on Ctrl-C those held back, already written, are reported before the
    interrupt goes on); then the synthesizer's run ends (:meth:`Synthesizer.finish`)."""
    outcomes = []
    for out in in_input_order(pairs):
        outcomes.append(out)
        if on_outcome is not None:
            on_outcome(out)
    synth.finish()
    return outcomes


def settled_item(it: SpeechItem, resume: Resume, target: Target) -> tuple[Outcome | None, Path | None, dict]:
    """``(outcome, None, {})`` of an item that needs no synthesis (a bad line, or its output is kept), else
    ``(None, output path, settings)``; an existing output redone is told to ``resume.on_redo``."""
    if it.request is None:
        return failed(it, it.error), None, {}
    path, settings = target(it)
    decision = decide([path], path, settings, resume.mode, fallback=None)
    if decision.skip:
        return Outcome(it.where, skipped=True, outputs=(path,), record=decision.record, id=it.request.id), None, {}
    if decision.redo_reason and resume.on_redo is not None:
        resume.on_redo(it.request.id, decision.redo_reason)
    return None, path, settings


def _frontend_needed(it: SpeechItem) -> Outcome | None:
    """The failure of a line whose voice prompt is a recording: speech tokens only cannot read it."""
    if it.prompt_wav and not it.request.prompt_tokens:
        return failed(it, "prompt_wav needs the speech-tokenizer frontend: "
                          "give --format wav or flac, or prompt_tokens (speech token ids of the prompt)")
    return None


def _written(it: SpeechItem, res: SynthesisResult, path: Path, settings: dict) -> Outcome:
    record = result_record(res, it.source)
    try:
        write_output(path, tokens_bytes(res.tokens), settings, record)
    except OutputWriteError as exc:
        return failed(it, str(exc))
    return Outcome(it.where, res, outputs=(path,), record=record, id=it.request.id)


@dataclass(frozen=True)
class RunOptions:
    """Where a synthesis batch writes and how it runs (:func:`run_synthesis`, ``audio_out.run_audio_synthesis``)."""

    output_dir: Path  # where each line's output goes: <id>.npy, <id>.wav or <id>.flac
    resume: Resume | None = None  # what a rerun does with existing outputs; None: redo those made with other
    # settings (synthesis_settings of the synthesizer)
    batch_size: int = 1  # lines decoded together (the same tokens as at 1; outcomes still in input order)
    on_outcome: Callable[[Outcome], None] | None = None  # told each outcome, in input order, as soon as it is known

    def resume_for(self, synth: Synthesizer) -> Resume:
        """``resume``, or by default: redo the outputs made with other settings than ``synth``'s."""
        return self.resume or Resume(synthesis_settings(synth))


def run_synthesis(synth: Synthesizer, items: list[SpeechItem], run: RunOptions) -> list[Outcome]:
    """Synthesize every good item whose ``<id>.npy`` is not kept by ``run.resume``; with ``run.batch_size`` > 1
    up to that many decode together (the same tokens; outcomes still reported in input order). Each outcome's
    result is the line's :class:`SynthesisResult`."""
    resume, output_dir, on_outcome = run.resume_for(synth), run.output_dir, run.on_outcome
    items = own_outputs(items, lambda rid: tokens_path(output_dir, rid), resume)

    def target(it: SpeechItem) -> tuple[Path, dict]:
        return tokens_path(output_dir, it.request.id), {**resume.settings, "request": request_settings(it.request)}

    if run.batch_size > 1:
        return report_in_order(synth, _run_batched(synth, items, resume, target, run.batch_size), on_outcome)

    def produce(it: SpeechItem, path: Path, settings: dict) -> Outcome:
        return _frontend_needed(it) or _written(it, synth.synthesize(it.request), path, settings)

    return report_in_order(synth, run_items(items, resume, target, produce, (SynthesisInputError,)), on_outcome)


def _run_batched(synth: Synthesizer, items: list[SpeechItem], resume: Resume, target: Target, batch_size: int
                 ) -> Pairs:
    """:func:`run_synthesis` through :meth:`Synthesizer.synthesize_batch`: each output is written as its row
    finishes."""
    todo: list[tuple[int, Path, dict]] = []
    for k, it in enumerate(items):
        out, path, settings = settled_item(it, resume, target)
        out = out or _frontend_needed(it)
        if out is None:
            todo.append((k, path, settings))
        else:
            yield k, out
    for j, res in synth.synthesize_batch([items[k].request for k, _, _ in todo], batch_size):
        k, path, settings = todo[j]
        it = items[k]
        if isinstance(res, SynthesisInputError):
            yield k, failed(it, str(res))
        else:
            yield k, _written(it, res, path, settings)


def result_record(result: SynthesisResult, source: str = "") -> dict:
    """The JSONL record of one synthesized utterance (``source``: the input it came from, ``SpeechItem.source``;
    ``pieces``: the tokens of each piece of a line spoken in pieces)."""
    s = result.stats
    return {
        "id": result.id, "source": source, "text": result.text,
        **({"pieces": list(result.pieces)} if result.pieces else {}),
        "tokens": len(result.tokens), "text_tokens": result.text_tokens,
        "min_len": result.min_len, "max_len": result.max_len, "finished": result.finished,
        "stats": {"target_forwards": s.target_forwards, "decode_seconds": round(s.decode_seconds, 4),
                  "tokens_per_second": round(len(result.tokens) / s.decode_seconds, 2) if s.decode_seconds else 0.0,
                  "verify_steps": s.verify_steps, "drafted": s.drafted, "accepted": s.accepted,
                  "acceptance_length": round(s.acceptance_length, 3)},
    }
