"""Benchmarks of presets against a baseline and peer implementations (``specli bench``).

``runner`` measures (presets and peers interleaved), ``report`` is pure arithmetic over the
per-utterance records, ``render`` writes report.json / report.md / plots, ``wer`` scores text.
Library code: never prints, never imports click or rich.
"""
