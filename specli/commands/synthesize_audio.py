"""The audio half of ``specli synthesize`` (``--format wav|flac``): CLI glue over :mod:`specli.tts.audio_out`, and
the outcome tally both halves report into."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import click

from specli.tts.acoustic.pipeline import Vocalizer, audio_dtype, stage_dtypes
from specli.tts.synthesis import Synthesizer
from specli.io.batch import Outcome
from specli.tts.audio_out import AudioOptions, prepare_voice, run_audio_synthesis
from specli.tts.pipeline import RunOptions, SpeechItem


class OutcomeTally:
    """Counts a run's outcomes, echoes each failure, and gives the summary line."""

    def __init__(self) -> None:
        self.counts = {"ok": 0, "failed": 0, "skipped": 0}
        self.done = 0  # outcomes seen so far
        self.t0 = time.perf_counter()

    def produced(self, out: Outcome) -> bool:
        """Count ``out`` (echoing it when it failed); True when it was produced (the caller reports it)."""
        self.done += 1
        if out.error:
            self.counts["failed"] += 1
            click.echo(f"failed: {out.input}: {out.error}", err=True)
            return False
        if out.skipped:
            self.counts["skipped"] += 1
            return False
        self.counts["ok"] += 1
        return True

    def line(self) -> str:
        """The summary line: counts so far and the wall time."""
        c = self.counts
        return (f"utterances: {c['ok']} ok, {c['failed']} failed, {c['skipped']} skipped; "
                f"wall {time.perf_counter() - self.t0:.1f} s")


def echo_skipped(out: Outcome, jsonl: bool) -> None:
    """With ``--jsonl -``, a kept utterance's JSON record (read back from its sidecar) on stdout, or why not."""
    if not (jsonl and out.skipped):
        return
    if out.record is not None:
        click.echo(json.dumps(out.record, ensure_ascii=False))
    else:
        click.echo(f"skipped {out.id}: no JSON record of it on disk to print", err=True)


@dataclass(frozen=True)
class VoiceFlags:
    """The run's voice as the flags give it (``prepare_voice``): a prompt recording and its transcript, a stored
    speaker, or none."""

    prompt_wav: str | None = None  # --prompt-wav: a voice prompt recording
    prompt_text: str | None = None  # --prompt-text: its transcript
    speaker: str | None = None  # --speaker: a stored speaker of the model's spk2info.pt


def run_audio(synth: Synthesizer, items: list[SpeechItem], run: RunOptions, options: AudioOptions,
              voice: VoiceFlags) -> list[Outcome]:
    """Load flow + HiFT, prepare the voice (before any output), then render every item (``run.on_outcome`` told
    each outcome in input order)."""
    model = synth.model
    device = model.lm.qwen.device
    flow_dtype, vocoder_dtype = stage_dtypes(options.dtype, options.vocoder_dtype)
    vocalizer = Vocalizer.from_dir(model.path, model.spec.kind, device, options.flow_steps,
                                   audio_dtype(flow_dtype, device), vocoder_dtype)
    prepared = prepare_voice(vocalizer, voice.prompt_wav, voice.prompt_text, voice.speaker)
    return run_audio_synthesis(synth, vocalizer, items, run, options, prepared)
