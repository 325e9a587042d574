"""The corpus' clip store: piper's wavs under ``<data>/wavs``, checked and renamed into place, and the append-only
journal (``journal.tsv``: id, sha1, frames, sha256) that lets a rerun skip every finished wav; clips spoken on
another machine stand in through their frame counts (``corpus --spoken``)."""

from __future__ import annotations

import json
import os
import shutil
import wave
from dataclasses import dataclass, field
from pathlib import Path

from specli.io.atomic import write_atomic
from specli.io.digest import file_sha256

SAMPLE_RATE = 22050  # piper en_US-joe-medium's output rate


def wav_frames(path: Path) -> int | None:
    """Frame count of a complete piper WAV (22.05 kHz, 16-bit, mono), else None."""
    try:
        with wave.open(str(path), "rb") as w:
            ok = (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, SAMPLE_RATE)
            frames = w.getnframes()
    except (OSError, EOFError, wave.Error):
        return None
    if not ok or frames <= 0 or path.stat().st_size != 44 + 2 * frames:
        return None
    return frames


@dataclass
class Store:
    """The output directory: wavs/ plus an append-only journal of finished wavs."""

    root: Path
    journal: dict[str, tuple[int, str]]  # sha1 -> (frames, sha256)
    spoken: dict[str, int] = field(default_factory=dict)  # clip id -> frames of clips spoken elsewhere (--spoken)

    @classmethod
    def open(cls, root: Path, fingerprint: dict) -> Store:
        (root / "wavs").mkdir(parents=True, exist_ok=True)
        fp_path = root / "settings.json"
        fp_text = json.dumps(fingerprint, indent=2, sort_keys=True) + "\n"
        if fp_path.exists() and fp_path.read_text(encoding="utf-8") != fp_text:
            raise SystemExit(f"error: {root} was built with other piper/voice settings "
                             f"(see {fp_path}); use another --out or remove it")
        write_atomic(fp_path, fp_text)
        for stale in root.glob("piper-*"):  # temp dirs of a killed run
            shutil.rmtree(stale, ignore_errors=True)
        journal: dict[str, tuple[int, str]] = {}
        jpath = root / "journal.tsv"
        if jpath.exists():
            for line in jpath.read_text(encoding="utf-8").splitlines():
                parts = line.split("\t")
                if len(parts) == 4:
                    journal[parts[1]] = (int(parts[2]), parts[3])
        return cls(root, journal)

    def wav(self, key: str) -> Path:
        return self.root / "wavs" / f"{key[:12]}.wav"

    def existing(self, key: str) -> int | None:
        """Frames of an existing wav with the expected content, else of a clip spoken elsewhere, else None."""
        path = self.wav(key)
        frames = wav_frames(path) if path.exists() else None
        if frames is None:
            return self.spoken.get(key[:12])
        digest = file_sha256(path)
        if key in self.journal:
            return frames if self.journal[key] == (frames, digest) else None
        self._record(key, frames, digest)  # renamed into place, journal line lost
        return frames

    def commit(self, key: str, tmp_wav: Path) -> int:
        """Check piper's finished temp wav and rename it into place."""
        frames = wav_frames(tmp_wav)
        if frames is None:
            raise RuntimeError(f"piper wrote an unexpected wav for {key}: {tmp_wav}")
        digest = file_sha256(tmp_wav)
        os.replace(tmp_wav, self.wav(key))
        self._record(key, frames, digest)
        return frames

    def _record(self, key: str, frames: int, digest: str) -> None:
        self.journal[key] = (frames, digest)
        with (self.root / "journal.tsv").open("a", encoding="utf-8") as f:
            f.write(f"{key[:12]}\t{key}\t{frames}\t{digest}\n")
