"""Flow steps x guidance sweep of a voice's flow, on held-out sentences read back by the bundled whisper-base.

For the first ``--sentences`` held-out sentences of the voice corpus, the voice's flow at ``--steps`` x ``--cfg``
(a copy of the voice whose yaml says so: ``scripts/voice/assemble.py``'s ``n_timesteps`` / ``inference_cfg_rate``
keys, read by specli's loader), on two token sources:

- ``true``: the clip's committed speech tokens (``data/voice/tokens``: what the tokenizer hears in piper's audio),
  so the flow is judged apart from the LM;
- ``e2e``: the tokens the voice's LM speaks for the text (``specli synthesize --format npy`` with the voice's
  default preset, once), then the same flow + vocoder as ``specli synthesize`` runs.

First, for every grid point, the log-mel L1 of the flow's mel on true tokens against piper's (jik876 mel of the
clip padded to 4 x 256 samples a token: frame for frame aligned); then, for each of ``--systems``
(``SOURCE-sSTEPS-cfgRATE``, most telling first), the audio read back: WER / CER after Whisper's English
normaliser, overall and by sentence length (true tokens <= 96, the old training crop, vs longer), and the flow's
real-time factor. Audio and transcripts are kept under ``--work`` (a rerun skips what is there); ``report.json``
in ``--out`` is rewritten after each system. Not a test:

    python benchmarks/voice_flow_sweep.py --sentences 50 --threads 1 --out docs/benchmarks/voice/sweep
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts.voice, the voice's build
from voice_roundtrip import heard, heldout  # noqa: E402

from scripts.voice.paths import Layout, work_dir  # noqa: E402

from specli.bench.runner import machine_info  # noqa: E402
from specli.bench.wer import ErrorCounts, error_counts  # noqa: E402
from specli.models.cosyvoice.lm import resolve_cosyvoice  # noqa: E402
from specli.tts.acoustic.pipeline import Vocalizer, VoicePrompt  # noqa: E402

LONG = 96  # tokens: the old training crop; longer sentences form their own bucket
# most telling first (a slow machine may stop part way; the report is rewritten after each)
SYSTEMS = ("true-s1-cfg0", "true-s10-cfg0.7", "true-s10-cfg0", "e2e-s1-cfg0", "e2e-s10-cfg0.7", "true-s4-cfg0",
           "true-s2-cfg0", "e2e-s10-cfg0", "e2e-s4-cfg0", "true-s1-cfg0.7", "true-s4-cfg0.7", "true-s2-cfg0.7",
           "e2e-s2-cfg0", "e2e-s1-cfg0.7", "e2e-s4-cfg0.7", "e2e-s2-cfg0.7")


def lm_tokens(voice: str, clips: list[tuple[str, str]], work: Path, threads: int, seed: int) -> dict[str, list[int]]:
    """The voice's LM tokens of each sentence (synthesize's default preset for the voice), cached in ``work``."""
    out = work / "e2e-tokens"
    if not all((out / f"{cid}.npy").is_file() for cid, _ in clips):
        out.mkdir(parents=True, exist_ok=True)
        lines = work / "sentences.txt"
        lines.write_text("".join(f"{text}\n" for _cid, text in clips), encoding="utf-8")
        cmd = [sys.executable, "-m", "specli", "synthesize", str(lines), "--model", voice, "--format", "npy",
               "--threads", str(threads), "--seed", str(seed), "-o", str(out), "--no-progress", "--overwrite"]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise SystemExit(f"specli synthesize failed ({res.returncode}): {res.stderr[-2000:]}")
        for i, (cid, _text) in enumerate(clips, 1):
            (out / f"sentences_{i:05d}.npy").rename(out / f"{cid}.npy")
    return {cid: [int(t) for t in np.load(out / f"{cid}.npy").reshape(-1)] for cid, _ in clips}


def true_tokens(path: Path, clips: list[tuple[str, str]]) -> dict[str, list[int]]:
    with np.load(path) as z:
        where = {str(cid): i for i, cid in enumerate(z["ids"])}
        return {cid: [int(t) for t in z["tokens"][z["offsets"][where[cid]]: z["offsets"][where[cid] + 1]]]
                for cid, _ in clips}


def piper_mel(corpus: Path, cid: str, vocalizer: Vocalizer) -> torch.Tensor:
    """jik876 log-mel ``[80, frames]`` of piper's clip zero-padded to a multiple of ratio x 256 samples."""
    audio, _ = sf.read(corpus / "wavs" / f"{cid}.wav", dtype="float32")
    audio = np.pad(audio, (0, -len(audio) % (vocalizer.spec.token_mel_ratio * 256)))
    return vocalizer.vocoder.mel(audio)[0]


def render(vocalizer: Vocalizer, tokens: dict[str, list[int]], folder: Path, seed: int) -> dict:
    """Flow + vocoder of every utterance into ``folder`` (kept ones skipped); flow and audio seconds of each."""
    folder.mkdir(parents=True, exist_ok=True)
    stats_path = folder / "stats.json"
    stats = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
    for cid, ids in tokens.items():
        if cid in stats and (folder / f"{cid}.wav").is_file():
            continue
        t0 = time.perf_counter()
        mel = vocalizer.mel(ids, VoicePrompt.none())  # [1, 80, 4 n]
        flow_s = time.perf_counter() - t0
        with torch.inference_mode():
            audio = vocalizer.vocoder.vocode(mel, torch.Generator().manual_seed(seed))[0].float().numpy()
        sf.write(folder / f"{cid}.wav", audio, vocalizer.vocoder.sample_rate)
        stats[cid] = {"flow_s": flow_s, "audio_s": len(audio) / vocalizer.vocoder.sample_rate}
        stats_path.write_text(json.dumps(stats))
    return stats


def scores(clips: list[tuple[str, str]], got: dict[str, str], lengths: dict[str, int]) -> dict:
    buckets: dict[str, ErrorCounts] = {}
    for cid, ref in clips:
        counts = error_counts(ref, got.get(cid, ""), "en")
        for key in ("all", f"<={LONG}" if lengths[cid] <= LONG else f">{LONG}"):
            buckets[key] = buckets.get(key, ErrorCounts(0, 0, 0, 0)) + counts
    out = {"wer": round(buckets["all"].wer, 4), "cer": round(buckets["all"].cer, 4),
           "missing": sum(cid not in got for cid, _ in clips)}
    out.update({f"wer{k}": round(v.wer, 4) for k, v in buckets.items() if k != "all"})
    return out


def voice_copy(source: Path, steps: int, cfg: float, work: Path) -> Path:
    """A copy of the voice with the flow's steps and CFG in its yaml (assemble.py's keys)."""
    from scripts.voice.assemble import replace_flow

    out = work / "voices" / f"s{steps}-cfg{cfg:g}"
    if not (out / "SHA256SUMS").is_file():
        replace_flow(source, None, out, steps, cfg)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--voice", default="specli-en", help="a shipped voice's name or a voice's model directory")
    ap.add_argument("--corpus", type=Path, help="the voice corpus (default: <$SPECLI_VOICE_WORK>/data)")
    ap.add_argument("--tokens", type=Path, default=Path("data/voice/tokens/tokens.npz"))
    ap.add_argument("--sentences", type=int, default=50)
    ap.add_argument("--steps", default="1,2,4,10", help="flow Euler steps, comma-separated")
    ap.add_argument("--cfg", default="0,0.7", help="guidance weights, comma-separated")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help="read back by whisper, in this order: SOURCE-sSTEPS-cfgRATE, SOURCE true or e2e")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, help="audio and voice copies, kept (default: <$SPECLI_VOICE_WORK>/sweep)")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks/voice/sweep"))
    args = ap.parse_args()
    args.corpus = args.corpus or Layout(work_dir(None)).data
    args.work = args.work or work_dir(None) / "sweep"
    torch.set_num_threads(args.threads)
    clips = heldout(args.corpus, args.sentences)
    source = Path(resolve_cosyvoice(args.voice))
    truth = true_tokens(args.tokens, clips)
    lengths = {cid: len(ids) for cid, ids in truth.items()}
    tokens = {"true": truth}
    if "e2e-" in args.systems:
        tokens["e2e"] = lm_tokens(args.voice, clips, args.work, args.threads, args.seed)
    rep = {"voice": args.voice, "sentences": len(clips), "threads": args.threads, "seed": args.seed,
           "long_tokens": LONG, "long_sentences": sum(n > LONG for n in lengths.values()),
           "machine": machine_info(args.threads), "torch": torch.__version__,
           "command": shlex.join(["python", "benchmarks/voice_flow_sweep.py", *sys.argv[1:]]),
           "mel_l1": {}, "systems": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    grid = [(int(s), float(c)) for s in args.steps.split(",") for c in args.cfg.split(",")]
    l1_cache = args.work / f"mel_l1-{len(clips)}.json"
    rep["mel_l1"] = json.loads(l1_cache.read_text()) if l1_cache.is_file() else {}
    for steps, cfg in grid:  # cheap first: the flow alone on true tokens, log-mel L1 against piper's mel
        key = f"s{steps}-cfg{cfg:g}"
        if key not in rep["mel_l1"]:
            vocalizer = Vocalizer.from_dir(voice_copy(source, steps, cfg, args.work), "cosyvoice3")
            rep["mel_l1"][key] = mel_l1(vocalizer, truth, args.corpus)
            l1_cache.write_text(json.dumps(rep["mel_l1"]))
        print(f"{key} mel L1 {rep['mel_l1'][key]}", file=sys.stderr, flush=True)
    for name in args.systems.split(","):  # then audio + whisper, most telling first; the report after each
        src, steps, cfg = parse_system(name)
        vocalizer = Vocalizer.from_dir(voice_copy(source, steps, cfg, args.work), "cosyvoice3")
        stats = render(vocalizer, tokens[src], args.work / name, args.seed)
        row = scores(clips, transcripts(args.work / name, args.threads), lengths)
        row["flow_rtf"] = round(sum(s["flow_s"] for s in stats.values()) / sum(s["audio_s"] for s in stats.values()), 4)
        rep["systems"][name] = row
        print(name, json.dumps(row), file=sys.stderr, flush=True)
        (args.out / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    rep["piper"] = scores(clips, heard_piper(args.corpus, clips, args.work, args.threads), lengths)
    (args.out / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    print(json.dumps(rep["systems"], indent=1))


def parse_system(name: str) -> tuple[str, int, float]:
    """``true-s1-cfg0`` -> ("true", 1, 0.0)."""
    src, steps, cfg = name.split("-")
    if src not in ("true", "e2e") or not steps.startswith("s") or not cfg.startswith("cfg"):
        raise SystemExit(f"system {name!r}: SOURCE-sSTEPS-cfgRATE, SOURCE true or e2e")
    return src, int(steps[1:]), float(cfg[3:])


def mel_l1(vocalizer: Vocalizer, tokens: dict[str, list[int]], corpus: Path) -> float:
    """Mean over utterances of the flow mel's mean |log-mel - piper's| (frame-aligned: 4 frames a token)."""
    out = []
    for cid, ids in tokens.items():
        mel = vocalizer.mel(ids, VoicePrompt.none())[0]  # [80, 4 n]
        ref = piper_mel(corpus, cid, vocalizer)
        n = min(ref.shape[1], mel.shape[1])
        out.append(float((mel[:, :n] - ref[:, :n]).abs().mean()))
    return round(float(np.mean(out)), 4)


def heard_piper(corpus: Path, clips: list[tuple[str, str]], work: Path, threads: int) -> dict[str, str]:
    folder = work / "piper"
    folder.mkdir(parents=True, exist_ok=True)
    for cid, _ in clips:
        link = folder / f"{cid}.wav"
        if not link.exists():
            link.symlink_to((corpus / "wavs" / f"{cid}.wav").resolve())
    return transcripts(folder, threads)


def transcripts(folder: Path, threads: int) -> dict[str, str]:
    """whisper-base's text of every wav in ``folder``, cached in ``folder/heard.json`` (rendered wavs are kept)."""
    cache = folder / "heard.json"
    wavs = {p.stem for p in folder.glob("*.wav")}
    if cache.is_file():
        got = json.loads(cache.read_text())
        if set(got) == wavs:
            return got
    got = heard(folder, threads)
    cache.write_text(json.dumps(got))
    return got


if __name__ == "__main__":
    main()
