"""Benchmarks of presets against a baseline and peer implementations (``specli bench``).

``runner`` measures (presets and peers interleaved) and ``runlog`` puts every run on disk as it
finishes (runs.jsonl), ``report`` is pure arithmetic over the per-utterance records, ``render`` writes
report.json / report.md / plots, ``wer`` scores text (jiwer after Whisper's normalisers).
Library code: never prints, never imports click or rich.
"""
