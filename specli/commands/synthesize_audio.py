"""The audio half of ``specli synthesize`` (``--format wav|flac``): CLI glue over :mod:`specli.tts.audio_out`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from specli.tts.acoustic.pipeline import Vocalizer, audio_dtype, stage_dtypes
from specli.tts.synthesis import Synthesizer
from specli.tts.audio_out import AudioOptions, AudioOutcome, prepare_voice, run_audio_synthesis
from specli.tts.pipeline import Resume, SpeechItem, SpeechOutcome


class OutcomeTally:
    """Counts a run's outcomes, echoes each failure, and ends with the summary line (exit 1 on failures)."""

    def __init__(self) -> None:
        self.counts = {"ok": 0, "failed": 0, "skipped": 0}
        self.done = 0  # outcomes seen so far
        self.t0 = time.perf_counter()

    def produced(self, out: SpeechOutcome | AudioOutcome) -> bool:
        """Count ``out`` (echoing it when it failed); True when it was produced (the caller reports it)."""
        self.done += 1
        if out.error:
            self.counts["failed"] += 1
            click.echo(f"failed: {out.where}: {out.error}", err=True)
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

    def finish(self, prefix: str = "") -> None:
        """Echo the summary line (after ``prefix``); exit 1 when any utterance failed."""
        click.echo(prefix + self.line(), err=True)
        if self.counts["failed"]:
            raise SystemExit(1)


def echo_skipped(out: SpeechOutcome | AudioOutcome, jsonl: bool) -> None:
    """With ``--jsonl -``, a kept utterance's JSON record (read back from its sidecar) on stdout, or why not."""
    if not (jsonl and out.skipped):
        return
    if out.record is not None:
        click.echo(json.dumps(out.record, ensure_ascii=False))
    else:
        click.echo(f"skipped {out.id}: no JSON record of it on disk to print", err=True)


def run_audio(synth: Synthesizer, items: list[SpeechItem], output_dir: Path, options: AudioOptions,
              prompt_wav: str | None, prompt_text: str | None, speaker: str | None, resume: Resume,
              jsonl: bool, show: bool, tally: OutcomeTally, batch_size: int = 1) -> list[AudioOutcome]:
    """Load flow + HiFT, prepare the voice (before any output), then render every item into ``tally`` (the
    caller ends it with ``tally.finish()``: exit 1 on failures)."""
    model = synth.model
    device = model.lm.qwen.device
    flow_dtype, vocoder_dtype = stage_dtypes(options.dtype, options.vocoder_dtype)
    vocalizer = Vocalizer.from_dir(model.path, model.spec.kind, device, options.flow_steps,
                                   audio_dtype(flow_dtype, device), vocoder_dtype)
    voice = prepare_voice(vocalizer, prompt_wav, prompt_text, speaker)

    def report(out: AudioOutcome) -> None:
        if not tally.produced(out):
            echo_skipped(out, jsonl)
            return
        rec = out.record
        if show:
            click.echo(f"[{tally.done}/{len(items)}] {out.id}: {rec['duration_s']:.2f} s audio, rtf llm "
                       f"{rec['rtf']['llm']:.2f} flow {rec['rtf']['flow']:.2f} vocoder {rec['rtf']['vocoder']:.2f}",
                       err=True)
        if jsonl:
            click.echo(json.dumps(rec, ensure_ascii=False))

    return run_audio_synthesis(synth, vocalizer, items, output_dir, options, voice, on_outcome=report, resume=resume,
                               batch_size=batch_size)
