"""``python -m specli``: the same command as the ``specli`` script."""

from specli.cli import main

main(prog_name="specli")
