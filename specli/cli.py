"""The ``specli`` command: a Click group with lazily imported subcommands.

Domain errors (:class:`specli.errors.SpecliError`) are translated to a message and exit code here,
once; library code never prints. Exit codes: 0 ok, 1 some inputs failed, 2 usage or preset error,
3 model could not be loaded, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM, handled as Ctrl-C),
141 standard output closed (``specli.commands.interrupt``).
"""

from __future__ import annotations

import importlib
import sys

import click

from specli import __version__
from specli.commands.interrupt import exit_code, sigterm_as_interrupt
from specli.errors import SpecliError


SUBCOMMANDS = {
    "transcribe": "specli.commands.transcribe:transcribe",
    "translate": "specli.commands.transcribe:translate",
    "presets": "specli.commands.presets:presets",
    "models": "specli.commands.presets:models",
    "bench": "specli.commands.bench:bench",
    "distill": "specli.commands.distill:distill",
    "synthesize": "specli.commands.synthesize:synthesize",
}


class LazyGroup(click.Group):
    """Imports a subcommand's module only when that subcommand runs (fast ``--help``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx: click.Context):
        try:
            with sigterm_as_interrupt():
                return super().invoke(ctx)
        except SpecliError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt as exc:  # commands that print a summary catch it themselves
            click.echo("interrupted", err=True)
            ctx.exit(exit_code(exc))


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="specli")
def main() -> None:
    """Offline batch speech transcription, translation and synthesis with lossless speculative decoding."""


if __name__ == "__main__":
    sys.exit(main())
