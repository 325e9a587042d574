"""Round trip of specli's own voice: held-out sentences spoken, then read back by the bundled whisper-base.

For the first ``--sentences`` held-out sentences of the voice corpus (``python -m scripts.voice corpus``: piper's
joe voice reading Debian fortunes never trained on), four systems, each transcribed by whisper-base (greedy,
English, the ``whisper-base-ar`` preset), word error rate after Whisper's English normaliser:

- ``piper``: piper's own audio of the sentence (what the voice was trained to imitate; the ceiling);
- ``hifigan-copy``: the HiFi-GAN V1 vocoder on the mel of piper's audio (the vocoder alone);
- ``griffin-lim``: Griffin-Lim (64 iterations) on the same mel (the floor a trained vocoder must beat);
- ``flow``: the voice's flow + vocoder on the clip's true speech tokens (``data/voice/tokens``: what the
  tokenizer hears in piper's audio), so the flow is judged apart from the LM;
- ``specli``: ``specli synthesize`` with the voice (text -> LM -> flow -> vocoder), run as a subprocess with
  ``--jsonl -``, whose per-stage seconds give the real-time factor of the LLM, flow and vocoder stages; with
  the shipped name (``--voice specli-en``, the default) that is synthesize's default (preset specli-en-dflash,
  greedy, the same tokens as specli-en-ar), with a directory the plain AR preset (RAS) unless `--preset` names one.

Each ``--flow-variant NAME=VOICE`` puts another voice's flow on the same true tokens, scored against ``flow``
(``NAME=VOICE@TOKENS``: on another tokenizer's tokens of the same clips, for a flow trained on them; VOICE may
then be the flow-only copy ``python -m scripts.voice assemble --flow-run RUN --out VOICE`` writes for a flow of
another codebook); its flow + vocoder seconds are kept (``flow_variant_seconds``), as each ``--variant``'s
per-stage real-time factor (``variant_rtf``).
``--first K`` starts at the K-th held-out sentence (settings are chosen on 100-199, shipped on 0-99). Each
``--variant`` is scored against ``specli`` on the same sentences (a paired bootstrap's 95% interval of the WER
difference, sentences better / worse), and ``report.json`` keeps every transcript (``heard``) so that systems of two
reports can be paired later (``specli.bench.wer.paired_wer_diff``).

Writes ``report.json``, ``README.md`` and ``mel.png`` (piper's and specli's log-mel of one sentence) to
``--out``. Not a test; run it by hand on a quiet machine, e.g.

    python benchmarks/voice_roundtrip.py --corpus WORK/data --sentences 50 --threads 2 --out docs/benchmarks/voice
    python benchmarks/voice_roundtrip.py --voice CANDIDATE_DIR --corpus WORK/data --sentences 20 --out /tmp/rt
    python benchmarks/voice_roundtrip.py --corpus WORK/data --first 100 --sentences 100 --threads 1 --skip-copy \
        --variant "cand=--model CANDIDATE_DIR --preset specli-en-ar" --out /tmp/rt-cand   # a candidate, paired
    python -m scripts.voice roundtrip --work WORK --voice CANDIDATE_DIR --sentences 100   # the build's stage
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from specli.asr.pipeline import transcribe
from specli.asr.windows import TranscribeOptions
from specli.bench.runner import machine_info
from specli.bench.wer import ErrorCounts, error_counts, paired_wer_diff
from specli.io.digest import file_sha256
from specli.models.cosyvoice.lm import resolve_cosyvoice
from specli.models.cosyvoice.voices import SUMS, read_sums
from specli.tts.acoustic.hifigan import load_hifigan

RATE = 22050
N_FFT, HOP, FMAX = 1024, 256, 8000.0


def heldout(corpus: Path, n: int, first: int = 0, split: str = "heldout") -> list[tuple[str, str]]:
    """``(clip id, text)`` of ``n`` held-out sentences from the ``first``-th (0: the first ``n``); ``split``
    "train": training sentences instead (in train.tsv's order, the sha1 order: is a figure a floor of the tokens or a
    gap the decoder leaves on sentences it never saw?)."""
    table = corpus / f"{split}.tsv"
    rows = [line.split("\t")[:2] for line in table.read_text().splitlines() if line.strip()]
    picked = [(cid, text) for cid, text in rows[first : first + n]]
    if len(picked) < n:
        raise SystemExit(f"{table} has {len(rows)} sentences: {first} + {n} asked for")
    return picked


def griffin_lim(mel_log: torch.Tensor, iterations: int = 64) -> np.ndarray:
    """Waveform from a jik876 log-mel ``[80, frames]``: minimum-norm linear magnitude (pseudo-inverse), then Griffin-Lim."""
    from specli.tts.acoustic.features import slaney_mel_filters

    basis = slaney_mel_filters(RATE, N_FFT, 80, 0.0, FMAX).double()  # [80, 513]
    mag = (torch.linalg.pinv(basis) @ mel_log.double().exp()).clamp(min=1e-5).float()  # [513, frames]
    window = torch.hann_window(N_FFT)
    gen = torch.Generator().manual_seed(0)
    angles = torch.polar(torch.ones_like(mag), 2 * torch.pi * torch.rand(mag.shape, generator=gen))
    for _ in range(iterations):
        audio = torch.istft(mag * angles, N_FFT, HOP, window=window)
        spec = torch.stft(audio, N_FFT, HOP, window=window, return_complex=True)
        angles = torch.polar(torch.ones_like(mag), spec[:, : mag.shape[1]].angle())
    return torch.istft(mag * angles, N_FFT, HOP, window=window).numpy()


def copy_synthesis(corpus: Path, clips: list[tuple[str, str]], out: Path) -> dict[str, float]:
    """Piper audio -> mel -> HiFi-GAN and Griffin-Lim wavs under ``out``; seconds of each vocoder."""
    vocoder = load_hifigan().eval()
    seconds = {"hifigan-copy": 0.0, "griffin-lim": 0.0}
    for name in seconds:
        (out / name).mkdir(parents=True, exist_ok=True)
    for cid, _text in clips:
        audio, rate = sf.read(corpus / "wavs" / f"{cid}.wav", dtype="float32")
        assert rate == RATE, (cid, rate)
        mel = vocoder.mel(audio)  # [1, 80, frames]
        t0 = time.perf_counter()
        with torch.inference_mode():
            wav = vocoder.vocode(mel)[0].numpy()
        seconds["hifigan-copy"] += time.perf_counter() - t0
        sf.write(out / "hifigan-copy" / f"{cid}.wav", wav, RATE)
        t0 = time.perf_counter()
        sf.write(out / "griffin-lim" / f"{cid}.wav", griffin_lim(mel[0]), RATE)
        seconds["griffin-lim"] += time.perf_counter() - t0
    return seconds


def flow_from_tokens(voice: str, clips: list[tuple[str, str]], out: Path, tokens: Path, seed: int,
                     name: str = "flow") -> float:
    """The voice's flow + vocoder on each clip's committed speech tokens -> ``out/name``; seconds spent."""
    from specli.tts.acoustic.pipeline import Vocalizer, VoicePrompt

    # a directory as it is: a flow-only copy (``assemble`` of a flow on another tokenizer's codes) has no LM
    vocalizer = Vocalizer.from_dir(Path(voice) if Path(voice).is_dir() else resolve_cosyvoice(voice), "cosyvoice3")
    (out / name).mkdir(parents=True, exist_ok=True)
    with np.load(tokens) as z:
        where = {str(cid): i for i, cid in enumerate(z["ids"])}
        offsets, codes = z["offsets"], z["tokens"]
    seconds = 0.0
    for cid, _text in clips:
        i = where[cid]
        ids = [int(t) for t in codes[offsets[i] : offsets[i + 1]]]
        res = vocalizer.render(ids, VoicePrompt.none(), torch.Generator().manual_seed(seed))
        seconds += res.flow_seconds + res.vocoder_seconds
        sf.write(out / name / f"{cid}.wav", res.audio, res.sample_rate)
    return seconds


def speak(voice: str, clips: list[tuple[str, str]], out: Path, threads: int, seed: int, name: str = "specli",
          options: tuple[str, ...] = ()) -> list[dict]:
    """``specli synthesize`` of the sentences (one line each, ids = clip ids) into ``out/name``, with the extra
    command-line ``options``; its JSONL records."""
    (out / name).mkdir(parents=True, exist_ok=True)
    lines = out / "sentences.txt"
    lines.write_text("".join(f"{text}\n" for _cid, text in clips), encoding="utf-8")
    cmd = [sys.executable, "-m", "specli", "synthesize", str(lines), "--model", voice, "--format", "wav",
           "--threads", str(threads), "--seed", str(seed), "-o", str(out / name), "--jsonl", "-",
           "--no-progress", "--overwrite", *options]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"specli synthesize failed ({res.returncode}): {res.stderr[-2000:]}")
    records = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    for (cid, _text), i in zip(clips, range(1, len(clips) + 1)):
        (out / name / f"sentences_{i:05d}.wav").rename(out / name / f"{cid}.wav")
    return records


def heard(folder: Path, threads: int) -> dict[str, str]:
    torch.set_num_threads(threads)
    outcomes = transcribe([folder], preset="whisper-base-ar", options=TranscribeOptions(language="en"))
    return {o.path.stem: o.result.text for o in outcomes if o.result is not None}


def mel_picture(piper_wav: Path, specli_wav: Path, text: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vocoder = load_hifigan()
    fig, axes = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
    for ax, (name, wav) in zip(axes, [("piper", piper_wav), ("specli-en", specli_wav)]):
        audio, _ = sf.read(wav, dtype="float32")
        ax.imshow(vocoder.mel(audio)[0].numpy(), origin="lower", aspect="auto", vmin=-11, vmax=2)
        ax.set_ylabel(f"{name}\nmel bin")
    axes[0].set_title(text[:100])
    axes[1].set_xlabel("frame (11.6 ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def stage_rtf(records: list[dict]) -> dict[str, float]:
    audio = sum(r["duration_s"] for r in records)
    return {k: round(sum(r["seconds"][k] for r in records) / audio, 4) for k in ("llm", "flow", "vocoder", "total")}


LENGTHS = ((1, 6), (7, 10), (11, 15), (16, 10**6))  # sentence-length buckets (reference words) of the WER table


def by_length(per_sentence: list[ErrorCounts]) -> dict[str, dict[str, float]]:
    """WER per bucket of :data:`LENGTHS` (``"7-10"``, ``"16+"``) with the bucket's sentence count."""
    table = {}
    for lo, hi in LENGTHS:
        picked = [c for c in per_sentence if lo <= c.words <= hi]
        name = f"{lo}-{hi}" if hi < 10**6 else f"{lo}+"
        total = sum(picked, ErrorCounts(0, 0, 0, 0))
        table[name] = {"sentences": len(picked), "wer": round(total.wer, 4) if picked else None}
    return table


def report(args: argparse.Namespace, clips, texts: dict[str, dict[str, str]], extra: dict) -> dict:
    """Scores of every system; each variant against ``specli`` (paired bootstrap over the sentences); every
    transcript (``heard``: system -> clip id -> text), so that two reports' systems can be paired later."""
    systems, per_system = {}, {}
    for name, got in texts.items():
        per_system[name] = [error_counts(ref, got.get(cid, ""), "en") for cid, ref in clips]
        counts = sum(per_system[name], ErrorCounts(0, 0, 0, 0))
        systems[name] = {"wer": round(counts.wer, 4), "cer": round(counts.cer, 4),
                         "missing": sum(cid not in got for cid, _ in clips), "by_length": by_length(per_system[name])}
    for name in extra.get("variants", {}):
        systems[name]["vs_specli"] = paired_wer_diff(per_system["specli"], per_system[name])
    for name in extra.get("flow_variants", {}):
        systems[name]["vs_flow"] = paired_wer_diff(per_system["flow"], per_system[name])
    return {"voice": args.voice, "voice_sha256": voice_digest(args.voice), "preset": args.preset,
            "command": shlex.join(["python", "benchmarks/voice_roundtrip.py", *sys.argv[1:]]),
            "split": args.split, "sentences": len(clips), "first": args.first, "threads": args.threads,
            "seed": args.seed, "machine": machine_info(args.threads), "torch": torch.__version__,
            "systems": systems, **extra,
            "examples": [{"ref": text, **{n: texts[n].get(cid, "") for n in texts}} for cid, text in clips[:5]],
            "heard": {n: {cid: texts[n].get(cid, "") for cid, _ in clips} for n in texts}}


def voice_digest(voice: str) -> dict[str, str]:
    """sha256 of each weight file of the voice (``*.pt`` / ``*.onnx``): a report names the bytes it measured, so a
    candidate directory measured before shipping can be matched with what was shipped. A voice with a
    ``SHA256SUMS`` (specli's own, assembled ones) was checked against it on loading: its sums are read, not redone."""
    root = resolve_cosyvoice(voice)
    if (root / SUMS).is_file():
        sums = read_sums(root)
    else:
        sums = {p.name: file_sha256(p) for p in root.iterdir() if p.is_file()}
    return {name: digest for name, digest in sorted(sums.items())
            if "/" not in name and Path(name).suffix in (".pt", ".onnx")}


def write_markdown(rep: dict, path: Path) -> None:
    rows = "\n".join(f"| {n} | {s['wer'] * 100:.1f}% | {s['missing']} |" for n, s in rep["systems"].items())
    sizes = next(iter(rep["systems"].values()))["by_length"]  # every system has the same buckets
    buckets = list(sizes)
    length_rows = "\n".join(
        f"| {n} | " + " | ".join("-" if s["by_length"][b]["wer"] is None else f"{s['by_length'][b]['wer'] * 100:.1f}%"
                                 for b in buckets) + " |" for n, s in rep["systems"].items())
    length_table = ("| system | " + " | ".join(f"{b} words ({sizes[b]['sentences']})" for b in buckets) + " |\n|---|"
                    + "---|" * len(buckets) + "\n" + length_rows)
    rtf = rep.get("rtf", {})
    path.write_text(
        f"# specli-en round trip ({rep['sentences']} held-out sentences, whisper-base greedy)\n\n"
        f"Voice `{rep['voice']}`, {rep['threads']} threads, seed {rep['seed']}, torch {rep['torch']}.\n"
        f"Reproduce: `python benchmarks/voice_roundtrip.py --voice {rep['voice']} --corpus CORPUS "
        f"--sentences {rep['sentences']} --threads {rep['threads']}`.\n\n| system | WER | missing |\n|---|---|---|\n{rows}\n\n"
        f"WER by sentence length (words; sentences in each bucket):\n\n{length_table}\n\n"
        f"specli real-time factor per stage (seconds per second of audio): "
        + ", ".join(f"{k} {v:.3f}" for k, v in rtf.items()) + "\n\n![mel](mel.png)\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--voice", default="specli-en", help="a shipped voice's name or a voice's model directory")
    ap.add_argument("--corpus", type=Path, required=True, help="the voice corpus (<work>/data of scripts.voice)")
    ap.add_argument("--tokens", type=Path, default=Path("data/voice/tokens/tokens.npz"),
                    help="the corpus's committed speech tokens (for the flow-only system)")
    ap.add_argument("--sentences", type=int, default=50)
    ap.add_argument("--first", type=int, default=0,
                    help="start at this held-out sentence (e.g. 100: choose settings on sentences the ship set "
                    "has not)")
    ap.add_argument("--split", choices=("heldout", "train"), default="heldout",
                    help="the corpus's held-out sentences, or its training ones (the flow and LM saw them)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-copy", action="store_true", help="only piper and specli (no vocoder copies)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=OPTIONS",
                    help="another specli system with these synthesize options, e.g. 'greedy=--sampler greedy'")
    ap.add_argument("--flow-variant", action="append", default=[], metavar="NAME=VOICE[@TOKENS]",
                    help="another voice's flow + vocoder on the same true tokens, scored against flow (e.g. the "
                    "shipped flow beside a candidate's); @TOKENS: on another tokenizer's tokens of the same clips "
                    "(a flow trained on them)")
    ap.add_argument("--preset", help="the specli system's preset (default: synthesize's for --voice), e.g. "
                    "specli-en-ar to measure a candidate directory as the shipped default would run it")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks/voice"))
    args = ap.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant)
    flow_variants = dict(v.split("=", 1) for v in args.flow_variant)
    if importlib.util.find_spec("matplotlib") is None:  # before minutes of synthesis, not after
        raise SystemExit("voice_roundtrip.py draws mel.png with matplotlib: pip install 'specli[plots]'")
    clips = heldout(args.corpus, args.sentences, args.first, args.split)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        piper = work / "piper"
        piper.mkdir()
        for cid, _text in clips:
            (piper / f"{cid}.wav").symlink_to((args.corpus / "wavs" / f"{cid}.wav").resolve())
        extra: dict = {}
        if not args.skip_copy:
            extra["copy_seconds"] = copy_synthesis(args.corpus, clips, work)
        extra["flow_seconds"] = flow_from_tokens(args.voice, clips, work, args.tokens, args.seed)
        extra["flow_variants"], extra["flow_variant_seconds"] = flow_variants, {}
        for name, spec in flow_variants.items():
            voice, _, tokens = spec.partition("@")
            extra["flow_variant_seconds"][name] = flow_from_tokens(
                voice, clips, work, Path(tokens) if tokens else args.tokens, args.seed, name)
        records = speak(args.voice, clips, work, args.threads, args.seed,
                        options=("--preset", args.preset) if args.preset else ())
        extra["rtf"] = stage_rtf(records)
        extra["variants"], extra["variant_rtf"] = variants, {}
        for name, options in variants.items():
            extra["variant_rtf"][name] = stage_rtf(
                speak(args.voice, clips, work, args.threads, args.seed, name, tuple(options.split())))
        copies = [] if args.skip_copy else ["hifigan-copy", "griffin-lim"]
        names = ["piper", "flow", *flow_variants, "specli", *variants, *copies]
        texts = {name: heard(work / name, args.threads) for name in names}
        mel_picture(piper / f"{clips[0][0]}.wav", work / "specli" / f"{clips[0][0]}.wav", clips[0][1],
                    args.out / "mel.png")
    rep = report(args, clips, texts, extra)
    (args.out / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    write_markdown(rep, args.out / "README.md")
    print(json.dumps(rep["systems"]), json.dumps(rep["rtf"]))


if __name__ == "__main__":
    main()
