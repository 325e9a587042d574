"""The audio half of ``specli synthesize`` (``--format wav|flac``): CLI glue over :mod:`specli.speech_audio`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from specli.acoustic.pipeline import Vocalizer
from specli.engines.synthesis import Synthesizer
from specli.speech_audio import AudioOptions, AudioOutcome, audio_record, prepare_voice, run_audio_synthesis
from specli.speech_batch import SpeechItem


def run_audio(synth: Synthesizer, items: list[SpeechItem], output_dir: Path, options: AudioOptions,
              prompt_wav: str | None, prompt_text: str | None, speaker: str | None, overwrite: bool,
              jsonl: bool, show: bool) -> None:
    """Load flow + HiFT, prepare the voice (before any output), then render every item; exit 1 on failures."""
    model = synth.model
    vocalizer = Vocalizer.from_dir(model.path, model.spec.kind, model.lm.qwen.device)
    voice = prepare_voice(vocalizer, prompt_wav, prompt_text, speaker)
    counts = {"ok": 0, "failed": 0, "skipped": 0}
    t0, done = time.perf_counter(), [0]

    def report(out: AudioOutcome) -> None:
        done[0] += 1
        if out.error:
            counts["failed"] += 1
            click.echo(f"failed: {out.where}: {out.error}", err=True)
        elif out.skipped:
            counts["skipped"] += 1
        else:
            counts["ok"] += 1
            rec = audio_record(out)
            if show:
                click.echo(f"[{done[0]}/{len(items)}] {out.id}: {rec['duration_s']:.2f} s audio, rtf llm "
                           f"{rec['rtf']['llm']:.2f} flow {rec['rtf']['flow']:.2f} vocoder {rec['rtf']['vocoder']:.2f}",
                           err=True)
            if jsonl:
                click.echo(json.dumps(rec, ensure_ascii=False))

    run_audio_synthesis(synth, vocalizer, items, output_dir, options, voice, overwrite, report)
    click.echo(f"utterances: {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped; "
               f"wall {time.perf_counter() - t0:.1f} s", err=True)
    if counts["failed"]:
        raise SystemExit(1)
