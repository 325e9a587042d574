"""Where the voice's build reads and writes: one work directory outside git, the committed files inside it.

The work directory is the ``--work`` argument, else ``$SPECLI_VOICE_WORK`` (read here and nowhere else); there is
no default, so no machine's path is built in. Its layout is the one earlier sessions' runs left on disk (a resumed
run continues in it)::

    data/            the piper corpus: wavs/<id>.wav, train.tsv, heldout.tsv, manifest.json, journal.tsv
    text/            the text-only corpus: train.jsonl, heldout.jsonl, meta.json (``corpus --text-only``)
    tokenizer/       speech-tokenizer caches: features/, runs/<name>/, phonemes.tsv, speech_tokenizer_v3.onnx
    train/<run>/     LM and flow runs: checkpoints/ckpt-*.pt, best.pt (the flow's mels/ cache too)
    drafters/        drafter labels and runs
    roundtrip/       round-trip reports of a candidate voice

What must outlive a machine is committed under ``data/voice/`` of the repository (sentence hashes, the tokenizer's
measurements, the corpus's speech tokens, the text tokenizer; ``candidate/``: the next tokenizer and its tokens, while
the voice built on them is not shipped) and in the voice itself (``specli/voices/specli-en``, which training continues
from when a run has no checkpoint). A fresh machine rebuilds the rest by these stages; ``corpus --spoken TOKENS``
skips the clips a committed tokens file already holds.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

ENV = "SPECLI_VOICE_WORK"  # the environment variable naming the work directory
REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "data" / "voice"  # the build's committed outputs
ONNX_NAME = "speech_tokenizer_v3.onnx"  # the speech tokenizer's file name (the official frontend's)
BLANK = "CosyVoice-BlankEN"  # the text tokenizer + Qwen2 config directory inside a model directory


def work_dir(arg: Path | str | None) -> Path:
    """The work directory: ``arg`` when given, else ``$SPECLI_VOICE_WORK``; neither is an error that says so."""
    if arg:
        return Path(arg)
    env = os.environ.get(ENV)
    if not env:
        raise SystemExit(f"error: no work directory: pass --work DIR or set {ENV}")
    return Path(env)


@dataclass(frozen=True)
class Layout:
    """Every path of the build, from the work directory and the voice directory."""

    work: Path  # the work directory (outside git)
    voice: Path = REPO / "specli" / "voices" / "specli-en"  # the voice training continues from and assembles into
    committed: Path = COMMITTED  # data/voice/ of the repository

    @property
    def data(self) -> Path:  # the piper corpus
        return self.work / "data"

    @property
    def text(self) -> Path:  # the text-only corpus
        return self.work / "text"

    @property
    def tokenizer(self) -> Path:  # the speech tokenizer's work files
        return self.work / "tokenizer"

    @property
    def onnx(self) -> Path:  # the exported speech tokenizer
        return self.tokenizer / ONNX_NAME

    @property
    def speech_tokenizer(self) -> Path:
        """The ONNX tokenizer the committed tokens come from: the one exported here when there is one, else the
        voice's (a fresh machine rebuilding the corpus tokenizes the new clips with the shipped tokenizer)."""
        return self.onnx if self.onnx.is_file() else self.voice / ONNX_NAME

    def run(self, name: str) -> Path:  # an LM or flow training run
        return self.work / "train" / name

    @property
    def drafters(self) -> Path:
        return self.work / "drafters"

    @property
    def roundtrip(self) -> Path:
        return self.work / "roundtrip"

    @property
    def sha1_list(self) -> Path:  # '<sha1> <split>' per corpus sentence (committed)
        return self.committed / "sentences.sha1"

    @property
    def tokens(self) -> Path:  # the corpus's speech tokens (committed)
        return self.committed / "tokens" / "tokens.npz"

    @property
    def tokenizer_json(self) -> Path:  # the speech tokenizer's choices and measurements (committed)
        return self.committed / "tokenizer.json"

    @property
    def blank(self) -> Path:  # the text tokenizer in the CosyVoice-BlankEN layout (committed)
        return self.committed / "blank"

    def codebook(self) -> int:
        """The speech codebook size, as the committed tokenizer's FSQ levels give it."""
        return int(json.loads(self.tokenizer_json.read_text(encoding="utf-8"))["fsq"]["codebook"])
