"""Batched synthesis to audio on specli-en (real weights), one process, interleaved passes, best of ``--repeat``:

- the flow: the utterances one after another (``TokenFlow.inference``) vs in padded batches
  (``TokenFlow.inference_rows``), with a bit-for-bit check of every mel;
- the vocoder (HiFi-GAN V1): one after another vs one zero-padded batch;
- end to end (``run_audio_synthesis``, AR with RAS, wav files written): ``--batch-size 1`` vs N, with a byte check
  of every file.

    python benchmarks/bench_synthesis_batch.py --sentences 16 --batch 8 --threads 2 --out docs/benchmarks/synthesis-batch
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # scripts.voice, the voice's build

from scripts.voice.corpus.texts import sentences  # noqa: E402  (the corpus's held-out sentences)

from specli.models.cosyvoice.lm import load_cosyvoice  # noqa: E402
from specli.presets.synthesis import load_synthesis_preset  # noqa: E402
from specli.tts.acoustic.pipeline import Vocalizer, VoicePrompt  # noqa: E402
from specli.tts.audio_out import AudioOptions, run_audio_synthesis  # noqa: E402
from specli.tts.pipeline import Resume, RunOptions, read_items, synthesis_settings  # noqa: E402
from specli.tts.synthesis import PresetOverrides, build_synthesizer  # noqa: E402


def best(fn, repeat: int) -> tuple[float, object]:
    """Fastest wall time of ``repeat`` calls (after one warm-up) and the last result."""
    fn()
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--voice", type=Path, default=REPO / "specli" / "voices" / "specli-en")
    ap.add_argument("--sentences", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="synth-batch-"))
    texts = work / "heldout.jsonl"
    rows = sentences("heldout")[: args.sentences]
    texts.write_text("".join(json.dumps({"id": sid, "text": text}) + "\n" for sid, text in rows))
    items = read_items([str(texts)])
    preset = load_synthesis_preset("cosyvoice3-ar")
    model = load_cosyvoice(str(args.voice), "float32")
    vocalizer = Vocalizer.from_dir(args.voice, "cosyvoice3")
    synth = build_synthesizer(preset, model, PresetOverrides(seed=0))
    tokens = [vocalizer.flow_tokens(synth.synthesize(it.request).tokens) for it in items]
    none = VoicePrompt.none(80)
    flow_rows = [(torch.tensor([t]), none.speech_tokens, none.prompt_mel, none.embedding) for t in tokens]
    groups = [flow_rows[i : i + args.batch] for i in range(0, len(flow_rows), args.batch)]
    t_turn, mels = best(lambda: [vocalizer.flow.inference(*r) for r in flow_rows], args.repeat)
    t_rows, batched = best(lambda: [m for g in groups for m in vocalizer.flow.inference_rows(g)], args.repeat)
    same_mels = all(torch.equal(a, b) for a, b in zip(mels, batched))
    gen = torch.Generator()
    t_voc, _ = best(lambda: [vocalizer.vocoder.vocode(m, gen) for m in mels], args.repeat)
    width = max(m.shape[2] for m in mels[: args.batch])
    padded = torch.cat([torch.nn.functional.pad(m, (0, width - m.shape[2])) for m in mels[: args.batch]])
    t_voc_first, _ = best(lambda: [vocalizer.vocoder.vocode(m, gen) for m in mels[: args.batch]], args.repeat)
    t_voc_pad, _ = best(lambda: vocalizer.vocoder.vocode(padded, gen), args.repeat)

    def e2e(batch: int) -> float:
        out = work / f"wav-{batch}"
        t0 = time.perf_counter()
        synth = build_synthesizer(preset, model, PresetOverrides(seed=0))
        run = RunOptions(out, Resume(synthesis_settings(synth), "overwrite"), batch)
        run_audio_synthesis(synth, vocalizer, items, run, AudioOptions("wav", None, 0))
        return time.perf_counter() - t0

    walls: dict[int, list[float]] = {1: [], args.batch: []}
    for _ in range(args.repeat):
        for batch in walls:
            walls[batch].append(e2e(batch))
    same_files = all((work / "wav-1" / p.name).read_bytes() == p.read_bytes()
                     for p in (work / f"wav-{args.batch}").glob("*.wav"))
    frames = sum(m.shape[2] for m in mels)
    report = {
        "voice": str(args.voice), "sentences": len(items), "batch": args.batch, "threads": args.threads,
        "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
        "audio_seconds": frames * 256 / 22050, "padding_share": 1 - frames / sum(
            len(g) * max(r[0].shape[1] for r in g) * 4 for g in groups),
        "flow": {"in_turn_s": t_turn, "rows_s": t_rows, "rows_speedup": t_turn / t_rows, "same_bits": same_mels},
        "vocoder": {"in_turn_s": t_voc, "first_batch_in_turn_s": t_voc_first, "first_batch_padded_s": t_voc_pad,
                    "padded_speedup": t_voc_first / t_voc_pad},
        "end_to_end": {"wall_s": {str(k): min(v) for k, v in walls.items()},
                       "speedup": min(walls[1]) / min(walls[args.batch]), "same_bytes": same_files},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
