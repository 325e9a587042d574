"""Batch synthesis to audio: text -> speech tokens (the LLM stage) -> mel (flow) -> audio (HiFT).

Beside :mod:`specli.tts.pipeline` (speech tokens only): the same input items, one ``<id>.wav`` /
``<id>.flac`` per utterance written atomically (resumed as there: kept when its sidecar records the same
settings, which for audio add the format, rate, voice, the flow / vocoder checkpoints and, with HiFT, the seed of
its noise), a bad
line or an utterance that cannot be rendered reported with its position while the batch goes on, and a
JSON record with the audio duration and per-stage real-time factors (LLM / flow / vocoder seconds per
second of audio).

The run's voice comes from a zero-shot prompt (a recording and its transcript, through the ONNX frontend)
or a stored speaker of ``spk2info.pt``; it is prepared once, before any utterance, so a bad prompt stops
the run with nothing written. A manifest line may bring its own ``prompt_wav`` (+ ``prompt_text``, its
transcript): prepared per line (cached by recording and transcript), a bad one fails that line only. A
line's own ``prompt_text`` / ``prompt_tokens`` without a recording still steer its LLM stage; the flow
stage takes the voice prompt's tokens, mel and x-vector.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from specli.tts.acoustic.pipeline import (AUDIO_DTYPES, AudioDtype, AudioFormat, RenderedAudio, RenderError,
                                         VoicePrompt, Vocalizer, encode_audio)
from specli.core.sampling import request_generator
from specli.tts.synthesis import SynthesisInputError, SynthesisRequest, SynthesisResult, Synthesizer
from specli.models.cosyvoice.text import CV3_DEFAULT_PROMPT, ENDOFPROMPT
from specli.errors import AudioError, UsageError
from specli.io.batch import Outcome
from specli.tts.pipeline import (OutputWriteError, Resume, RunOptions, SpeechItem, content_fingerprint, failed,
                                 own_outputs, report_in_order, request_settings, result_record, settled_item,
                                 write_output)

__all__ = ["AudioOptions", "SpokenLine", "Voice", "audio_path", "audio_record", "audio_settings", "prepare_voice",
           "run_audio_synthesis", "vocoder_generator", "voice_settings"]

_VOCODER_KEY = "/vocoder"  # the vocoder's generator key suffix (its own stream, apart from the LLM's)


@dataclass(frozen=True)
class AudioOptions:
    """How audio is written."""

    format: AudioFormat = "wav"  # container: 16-bit PCM wav or flac
    sample_rate: int | None = None  # output rate; None: the vocoder's own; any other is resampled with soxr
    seed: int = 0  # run seed; each utterance's vocoder noise comes from (seed, id)
    flow_steps: int | None = None  # the flow's Euler steps; None: the model's (10); fewer are faster and rougher
    dtype: AudioDtype | None = None  # flow + vocoder compute dtype (pipeline.audio_dtype); None: a float32 flow
    vocoder_dtype: AudioDtype | None = None  # the vocoder's, over dtype; both None: auto (pipeline.stage_dtypes)

    def __post_init__(self) -> None:
        if self.format not in ("wav", "flac"):
            raise ValueError(f"unknown audio format {self.format!r} (wav, flac)")
        if self.sample_rate is not None and not 8000 <= self.sample_rate <= 192000:
            raise ValueError("sample_rate must be within 8000..192000 Hz")
        if self.flow_steps is not None and not 1 <= self.flow_steps <= 100:
            raise ValueError("flow_steps must be within 1..100")
        for dtype in (self.dtype, self.vocoder_dtype):
            if dtype is not None and dtype not in AUDIO_DTYPES:
                raise ValueError(f"unknown audio dtype {dtype!r} ({', '.join(AUDIO_DTYPES)})")


@dataclass(frozen=True)
class Voice:
    """The voice of a run: what the flow stage gets, and the LLM prompt for lines without their own."""

    flow: VoicePrompt  # prompt tokens, mel and x-vector for the flow stage
    prompt_text: str = ""  # LLM prompt text (the prompt's transcript)
    prompt_tokens: tuple[int, ...] = ()  # LLM prompt speech tokens
    settings: dict = field(default_factory=lambda: voice_settings())  # what names it in resume settings


@dataclass(frozen=True)
class SpokenLine:
    """What a line synthesized to audio now is made of (the result of its :class:`~specli.io.batch.Outcome`)."""

    speech: SynthesisResult  # the speech tokens (the LLM stage)
    audio: RenderedAudio  # the audio and its flow / vocoder times
    llm_seconds: float = 0.0  # wall time of the LLM stage (a batched row: its time in the shared decode)

    @property
    def tokens(self) -> list[int]:
        """The line's speech tokens."""
        return self.speech.tokens


def prepare_voice(vocalizer: Vocalizer, prompt_wav: str | None = None, prompt_text: str | None = None,
                  speaker: str | None = None, names: tuple[str, str] = ("--prompt-wav", "--prompt-text")) -> Voice:
    """The voice of a prompt recording + transcript, or of a stored speaker (UsageError when bad);
    ``names`` are what the messages call the recording and the transcript. A stored speaker's saved prompt
    (tokens, mel, x-vector) goes to the flow stage only: ``spk2info.pt`` keeps its transcript as token ids
    of its own tokenizer run, so the LLM gets no prompt (like upstream's cross-lingual mode)."""
    if prompt_wav and speaker:
        raise UsageError("--prompt-wav and --speaker are exclusive: give one voice")
    if prompt_text and not prompt_wav:
        raise UsageError("--prompt-text is the transcript of --prompt-wav; give the recording too")
    if speaker:
        stored = vocalizer.frontend.speaker(speaker)
        return Voice(VoicePrompt.from_speaker(stored, vocalizer.spec.token_mel_ratio), settings=voice_settings(
            speaker=speaker, speakers_file=vocalizer.frontend.speakers_path))
    if not prompt_wav:
        return Voice(VoicePrompt.none(vocalizer.spec.mel.n_mels))
    text = (prompt_text or "").strip()
    if not text:
        rule = (f" (CosyVoice3 puts it after {ENDOFPROMPT}, e.g. '{CV3_DEFAULT_PROMPT}<transcript>')"
                if vocalizer.kind == "cosyvoice3" else "")
        raise UsageError(f"{names[0]} needs {names[1]}, the transcript of the recording{rule}")
    if vocalizer.kind == "cosyvoice3" and ENDOFPROMPT not in text:
        text = CV3_DEFAULT_PROMPT + text  # upstream's usual CosyVoice3 prompt text (example.py)
    try:
        prompt = vocalizer.frontend.prompt(prompt_wav, text)
    except AudioError as exc:  # a bad voice prompt is a bad option value: refused before any output
        raise UsageError(f"{names[0]}: {exc}") from exc
    return Voice(VoicePrompt.from_prompt(prompt), text, tuple(int(t) for t in prompt.speech_tokens[0].tolist()),
                 voice_settings(prompt_wav, prompt_text))


def voice_settings(prompt_wav: str | None = None, prompt_text: str | None = None, speaker: str | None = None,
                   speakers_file: Path | None = None, digest: str | None = None) -> dict:
    """What names a voice in the resume settings: a prompt recording by content (``digest``, else its
    :func:`~specli.io.resume.file_fingerprint`) and its transcript, or a stored speaker (id and the content of
    ``spk2info.pt``), or none."""
    if speaker:
        return {"kind": "speaker", "speaker": speaker,
                "spk2info": content_fingerprint(speakers_file) if speakers_file else "missing"}
    if prompt_wav:
        return {"kind": "prompt", "prompt_wav": digest or content_fingerprint(Path(prompt_wav)),
                "prompt_text": (prompt_text or "").strip()}
    return {"kind": "none"}


def audio_settings(vocalizer: Vocalizer, options: AudioOptions) -> dict:
    """The audio half of an utterance's settings: container, rate, and the flow / vocoder checkpoints by content."""
    root, vocoder = vocalizer.model_dir, vocalizer.vocoder_file
    settings = {"format": options.format, "sample_rate": options.sample_rate or vocalizer.vocoder.sample_rate,
                "flow": content_fingerprint(root / "flow.pt") if root else "unknown",
                "vocoder": content_fingerprint(vocoder) if vocoder else "unknown"}
    if options.flow_steps is not None:  # recorded only when asked: outputs made before the option stay kept
        settings["flow_steps"] = options.flow_steps
    if vocalizer.dtype != torch.float32:  # as flow_steps: float32 outputs made before the option stay kept
        settings["dtype"] = str(vocalizer.dtype).removeprefix("torch.")
    if vocalizer.vocoder_dtype != vocalizer.dtype:  # a vocoder computing apart from the flow (its default bf16)
        settings["vocoder_dtype"] = str(vocalizer.vocoder_dtype).removeprefix("torch.")
    return settings


def audio_path(output_dir: Path, rid: str, fmt: AudioFormat) -> Path:
    return output_dir / f"{rid}.{fmt}"


def _with_voice(request: SynthesisRequest, voice: Voice) -> SynthesisRequest:
    if request.prompt_text or request.prompt_tokens or not (voice.prompt_text or voice.prompt_tokens):
        return request  # a manifest line's own prompt wins for the LLM stage
    return replace(request, prompt_text=voice.prompt_text, prompt_tokens=voice.prompt_tokens)


def _line_voice(vocalizer: Vocalizer, item: SpeechItem, run_voice: Voice,
                cache: dict[tuple[str, str], Voice]) -> tuple[Voice, SynthesisRequest]:
    """The voice of one line and its request with the LLM prompt filled in (AudioError / UsageError: bad line)."""
    request = item.request
    if request is None:
        raise ValueError("a bad line has no voice")
    if not item.prompt_wav:
        return run_voice, _with_voice(request, run_voice)
    key = (item.prompt_wav, request.prompt_text)
    if key not in cache:
        cache[key] = prepare_voice(vocalizer, item.prompt_wav, request.prompt_text, names=("prompt_wav", "prompt_text"))
    voice = cache[key]
    return voice, replace(request, prompt_text=voice.prompt_text,
                          prompt_tokens=request.prompt_tokens or voice.prompt_tokens)


def joined_audio(parts: list[RenderedAudio]) -> RenderedAudio:
    """The audio of a line spoken in pieces: the pieces' samples one after another (no gap, as upstream joins
    the speech of its text pieces), stage counters and times added up."""
    if len(parts) == 1:
        return parts[0]
    return RenderedAudio(np.concatenate([p.audio for p in parts]), parts[0].sample_rate,
                         sum(p.flow_tokens for p in parts), sum(p.mel_frames for p in parts),
                         sum(p.flow_seconds for p in parts), sum(p.vocoder_seconds for p in parts))


def vocoder_generator(seed: int, request_id: str) -> torch.Generator:
    """The vocoder's noise stream of one utterance: from (run seed, id), whatever the batch (its own stream,
    apart from the LLM's)."""
    return request_generator(seed, request_id + _VOCODER_KEY, "cpu")


def _write_audio(item: SpeechItem, spoken: SpokenLine, path: Path, settings: dict, options: AudioOptions) -> Outcome:
    """Encode and write a line's rendered audio to ``path`` (sidecar with ``settings`` and the record, naming the
    line's source, first); a file that cannot be written fails this line only."""
    record = audio_record(spoken, path, item.source)
    audio = spoken.audio
    try:
        write_output(path, encode_audio(audio.audio, audio.sample_rate, options.format), settings, record)
    except OutputWriteError as exc:
        return failed(item, str(exc))
    return Outcome(item.where, spoken, outputs=(path,), record=record, id=item.request.id)


def run_audio_synthesis(synth: Synthesizer, vocalizer: Vocalizer, items: list[SpeechItem], run: RunOptions,
                        options: AudioOptions = AudioOptions(), voice: Voice | None = None) -> list[Outcome]:
    """Synthesize every good item whose audio file is not kept by ``run.resume`` (each outcome's result a
    :class:`SpokenLine`). With ``run.batch_size`` > 1 the LLM decodes up to that many together and the acoustic
    stages take the finished rows in groups (:meth:`Vocalizer.render_rows`): the same bytes as one at a time (for
    the same speech tokens), each file written as its audio is done, outcomes reported in input order. A batched
    row's LLM seconds are its time in the shared decode."""
    voice = voice or Voice(VoicePrompt.none(vocalizer.spec.mel.n_mels))
    resume, output_dir = run.resume_for(synth), run.output_dir
    batch_size = max(run.batch_size, 1)  # below 1: one at a time, as 1
    run_settings = {**resume.settings, "audio": audio_settings(vocalizer, options)}
    if vocalizer.spec.vocoder == "hift":  # HiFT draws its source noise from the seed; HiFi-GAN draws none
        run_settings["seed"] = options.seed
    items = own_outputs(items, lambda rid: audio_path(output_dir, rid, options.format), resume)
    cache: dict[tuple[str, str], Voice] = {}
    digests: dict[str, str] = {}  # a line's prompt recording -> its content fingerprint

    def target(it: SpeechItem) -> tuple[Path, dict]:
        line_voice = voice.settings
        if it.prompt_wav:
            if it.prompt_wav not in digests:
                digests[it.prompt_wav] = content_fingerprint(Path(it.prompt_wav))
            line_voice = voice_settings(it.prompt_wav, it.request.prompt_text, digest=digests[it.prompt_wav])
        settings = {**run_settings, "request": request_settings(it.request), "voice": line_voice}
        return audio_path(output_dir, it.request.id, options.format), settings

    pairs = _run_audio(synth, vocalizer, _rows(vocalizer, items, target, (voice, cache), resume), options,
                       batch_size)
    return report_in_order(synth, pairs, run.on_outcome)


@dataclass(frozen=True)
class _Row:
    """A line on its way through the audio stages."""

    k: int  # its input position
    item: SpeechItem  # its input line
    path: Path  # its audio file
    settings: dict  # its resume settings
    voice: Voice  # its voice
    request: SynthesisRequest  # its request, LLM prompt filled in


_Spoken = tuple[_Row, SynthesisResult, float]  # a row, its speech tokens and its LLM seconds


def _rows(vocalizer: Vocalizer, items: list[SpeechItem], target: Callable[[SpeechItem], tuple[Path, dict]],
          voices: tuple[Voice, dict[tuple[str, str], Voice]], resume: Resume) -> Iterator[tuple[int, Outcome | _Row]]:
    """Each line as it comes: its outcome when it needs no synthesis (a bad line, a kept output, a voice that
    cannot be prepared), else its :class:`_Row`."""
    for k, it in enumerate(items):
        out, path, settings = settled_item(it, resume, target)
        if out is None:
            try:
                line_voice, request = _line_voice(vocalizer, it, *voices)
                yield k, _Row(k, it, path, settings, line_voice, request)
                continue
            except (AudioError, UsageError) as exc:
                out = failed(it, str(exc))
        yield k, out


def _speech(synth: Synthesizer, rows: Iterator[tuple[int, Outcome | _Row]], batch_size: int
            ) -> Iterator[tuple[int, Outcome | _Spoken]]:
    """The LLM stage: batch 1 speaks each line as it comes (its LLM seconds the wall time of its decode); a larger
    batch takes every line first and decodes up to ``batch_size`` together (a row's LLM seconds: its time in the
    shared decode). A request that cannot be spoken fails its line."""
    if batch_size == 1:
        for k, row in rows:
            if isinstance(row, Outcome):
                yield k, row
                continue
            t0 = time.perf_counter()
            try:
                res = synth.synthesize(row.request)
            except SynthesisInputError as exc:
                yield k, failed(row.item, str(exc))
                continue
            yield k, (row, res, time.perf_counter() - t0)
        return
    pending: list[_Row] = []
    for k, row in rows:
        if isinstance(row, Outcome):
            yield k, row
        else:
            pending.append(row)
    for j, res in synth.synthesize_batch([row.request for row in pending], batch_size):
        row = pending[j]
        if isinstance(res, SynthesisInputError):
            yield row.k, failed(row.item, str(res))
        else:
            yield row.k, (row, res, res.stats.decode_seconds)


def _run_audio(synth: Synthesizer, vocalizer: Vocalizer, rows: Iterator[tuple[int, Outcome | _Row]],
               options: AudioOptions, batch_size: int) -> Iterator[tuple[int, Outcome]]:
    """:func:`run_audio_synthesis` for any batch size: the LLM stage speaks the lines (:func:`_speech`); the rows
    it finishes are rendered ``batch_size`` at a time (and the last ones when it is done), each file written as
    its audio is done. Batch 1 renders a line's pieces one after another (as :meth:`Vocalizer.render`)."""
    flow_together = None if batch_size > 1 else False
    done: list[_Spoken] = []
    for k, spoken in _speech(synth, rows, batch_size):
        if isinstance(spoken, Outcome):
            yield k, spoken
            continue
        done.append(spoken)
        if len(done) == batch_size:
            yield from _render_done(vocalizer, done, options, flow_together)
            done = []
    yield from _render_done(vocalizer, done, options, flow_together)


def _render_done(vocalizer: Vocalizer, done: list[_Spoken], options: AudioOptions, flow_together: bool | None
                 ) -> Iterator[tuple[int, Outcome]]:
    """Render and write the rows the LLM finished (each piece of a line spoken in pieces a render job of its
    own), yielding each outcome as its file is written."""
    jobs, owner = [], []  # owner[j]: the done row whose piece job j renders
    for d, (row, res, _) in enumerate(done):
        for pid, tokens in res.segments():
            jobs.append((tokens, row.voice.flow, vocoder_generator(options.seed, pid)))
            owner.append(d)
    parts: dict[int, dict[int, RenderedAudio | RenderError]] = {d: {} for d in range(len(done))}
    counts = {d: owner.count(d) for d in parts}
    for j, audio in vocalizer.render_rows(jobs, options.sample_rate, flow_together):
        d = owner[j]
        parts[d][j] = audio
        if len(parts[d]) < counts[d]:
            continue
        row, res, llm_seconds = done[d]
        pieces = [parts[d][k] for k in sorted(parts[d])]
        broken = next((a for a in pieces if isinstance(a, RenderError)), None)
        if broken is not None:
            yield row.k, failed(row.item, str(broken))
            continue
        yield row.k, _write_audio(row.item, SpokenLine(res, joined_audio(pieces), llm_seconds), row.path,
                                  row.settings, options)


def audio_record(spoken: SpokenLine, path: Path, source: str = "") -> dict:
    """The JSONL record of one utterance rendered to audio at ``path`` (the token record + audio and stage
    times)."""
    audio, rec = spoken.audio, result_record(spoken.speech, source)
    seconds = {"llm": spoken.llm_seconds, "flow": audio.flow_seconds, "vocoder": audio.vocoder_seconds}
    seconds["total"] = sum(seconds.values())
    dur = audio.duration
    rec.update({
        "audio": path.name, "sample_rate": audio.sample_rate, "duration_s": round(dur, 4),
        "flow_tokens": audio.flow_tokens, "mel_frames": audio.mel_frames,
        "seconds": {k: round(v, 4) for k, v in seconds.items()},
        "rtf": {k: round(v / dur, 4) if dur else 0.0 for k, v in seconds.items()},
    })
    return rec
