"""Whisper encoder before/after in ONE process (issue 45, "encoder near peak"): ``WhisperTarget.encode`` at git
revision ``--before`` (extracted to a temporary directory) and the working tree's, on one 30-s window of real speech,
interleaved call by call (the order flipped every repeat), per thread count and dtype. Prints median ms per window,
after/before, GFLOP/s (the encoder's multiply-adds counted from its shapes) and whether the outputs are equal
(float32 must be: ``torch.equal``). Wall and process CPU time are both reported: on a shared machine the CPU time
of a 1-thread run is the steadier measure (other processes stretch wall time, not the thread's own work).
``--variants`` also times the working tree's encoder with one fusion left out at a time (float32: each fusion
alone, to see which keep its bits), ``--attention`` the candidate bf16 attention kernels::

    python benchmarks/whisper_encoder_ab.py --before cee3496 --threads 1,2 --repeat 9 --variants --attention
    python benchmarks/whisper_encoder_ab.py --before cee3496 --dtypes bfloat16 \
        --manifest docs/benchmarks/dtype-bf16/manifest.tsv   # transcripts before / after, WER
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from whisper_decode_ab import _side, _specli_modules, _use  # noqa: E402

from specli.bench.wer import error_counts  # noqa: E402
from specli.io.audio import load_audio, window_features  # noqa: E402
from specli.models.whisper.encoder import SEPARATE, EncoderFusions, WhisperEncoder  # noqa: E402
from specli.models.whisper.resolve import resolve_model  # noqa: E402
from specli.models.whisper.target import WhisperTarget  # noqa: E402

CLIP = REPO / "samples/en/sense_and_sensibility_01_austen_64kb-0870.wav"


def encoder_gflop(t: WhisperTarget) -> float:
    """Multiply-adds x 2 of one window: conv stem, projections, MLP, and attention's q kᵀ and p v."""
    d, a, n_mels = t.dims.d_model, t.dims.audio_ctx, t.dims.n_mels
    ffn = t.encoder.blocks[0].fc1.out_features
    layer = 2 * a * d * (4 * d + 2 * ffn) + 4 * a * a * d
    return (2 * 2 * a * d * n_mels * 3 + 2 * a * d * d * 3 + t.dims.encoder_layers * layer) / 1e9


def _old_target_class(rev: str, tmp: Path):
    """``WhisperTarget`` of revision ``rev``, imported from its own copy of ``specli``."""
    blob = subprocess.run(["git", "-C", str(REPO), "archive", rev, "specli"], check=True,
                          capture_output=True).stdout
    tarfile.open(fileobj=BytesIO(blob)).extractall(tmp, filter="data")
    mine = _specli_modules()
    _use({})
    sys.path.insert(0, str(tmp))
    try:
        from specli.models.whisper.target import WhisperTarget as Old  # the revision's module
    finally:
        sys.path.remove(str(tmp))
        _use(mine)
    return Old


def _variants(path: Path, target: WhisperTarget) -> dict[str, WhisperEncoder]:
    """The working tree's encoder with one fusion at a time (bf16), or all of them (float32)."""
    cdt, d = target.compute_dtype, target.dims
    w = {k: v.to(cdt) for k, v in load_file(str(path / "model.safetensors")).items() if k.startswith("model.encoder")}
    if cdt == torch.float32:
        picks = {"all fusions": EncoderFusions(True, True, True, True),
                 "qkv only": EncoderFusions(True, False, False, False),
                 "gelu post-op only": EncoderFusions(False, True, False, False),
                 "residual post-ops only": EncoderFusions(False, False, True, False),
                 "conv stem only": EncoderFusions(False, False, False, True)}
    else:
        picks = {"separate ops": SEPARATE, "no qkv": EncoderFusions(False, True, True, True),
                 "no gelu post-op": EncoderFusions(True, False, True, True),
                 "no residual post-ops": EncoderFusions(True, True, False, True),
                 "no conv stem": EncoderFusions(True, True, True, False)}
    return {name: WhisperEncoder(w, d.encoder_layers, d.encoder_heads, cdt, f) for name, f in picks.items()}


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref).norm() / ref.norm())


def run(old_cls, path: Path, dtype: str, threads: int, repeat: int, variants: bool) -> None:
    torch.set_num_threads(threads)
    dt = getattr(torch, dtype)
    old, new = old_cls.from_dir(path, dt), WhisperTarget.from_dir(path, dt)
    mel = window_features(load_audio(CLIP), new.dims.n_mels)  # [1, n_mels, 3000] float32
    ref = new.encode(mel) if dt == torch.float32 else WhisperTarget.from_dir(path).encode(mel)  # fp32 output
    mel = mel.to(dt)
    fns = {"before": old.encode, "after": new.encode}
    if variants:
        fns.update({k: (lambda enc: lambda m: enc(m))(e) for k, e in _variants(path, new).items()})
    outs = {name: fn(mel) for name, fn in fns.items()}  # warm-up
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(repeat):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t0, c0 = time.perf_counter(), time.process_time()
            fns[name](mel)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    gflop = encoder_gflop(new)
    bw, bc = statistics.median(wall["before"]), statistics.median(cpu["before"])
    print(f"\n{dtype}, {threads} thread(s), {repeat} interleaved repeats, {gflop:.1f} GFLOP a window; medians of "
          "wall and of process CPU time, and the fastest wall")
    print("| encoder | wall ms | vs before | fastest wall ms | vs before | CPU ms | vs before | GFLOP/s wall "
          "| GFLOP/CPU-s | rel. error vs fp32 | equal to before |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for name in fns:
        w, c, f = statistics.median(wall[name]), statistics.median(cpu[name]), min(wall[name])
        print(f"| {name} | {w * 1e3:.1f} | {bw / w:.2f}x | {f * 1e3:.1f} | {min(wall['before']) / f:.2f}x "
              f"| {c * 1e3:.1f} | {bc / c:.2f}x | {gflop / w:.0f} | {gflop / c:.0f} "
              f"| {_rel_err(outs[name], ref):.2e} | {torch.equal(outs[name], outs['before'])} |")


def _chunked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int) -> torch.Tensor:
    """``softmax(q kᵀ / sqrt(D)) v`` over ``rows`` queries at a time (bf16 products, softmax in float32 inside)."""
    q, kt = q * q.shape[-1] ** -0.5, k.transpose(-1, -2)
    return torch.cat([torch.softmax(q[:, :, i : i + rows] @ kt, -1) @ v for i in range(0, q.shape[2], rows)], 2)


def attention_variants(t: WhisperTarget, threads: int, repeat: int) -> None:
    """One encoder layer's bf16 self-attention by each candidate kernel, interleaved (CPU ms, medians)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.set_num_threads(threads)
    a, d, h = t.dims.audio_ctx, t.dims.d_model, t.dims.encoder_heads
    qkv = torch.randn(1, a, 3, h, d // h, generator=torch.Generator().manual_seed(0)).bfloat16()
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [1, H, A, D] strided, as the encoder's
    sdpa = F.scaled_dot_product_attention

    def math() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.MATH):
            return sdpa(q, k, v)

    fns = {"SDPA flash, strided views (used)": lambda: sdpa(q, k, v),
           "SDPA flash, contiguous copies": lambda: sdpa(q.contiguous(), k.contiguous(), v.contiguous()),
           "SDPA math backend": math,
           "SDPA in float32": lambda: sdpa(q.float(), k.float(), v.float()).bfloat16(),
           **{f"query chunks of {r}": (lambda r: lambda: _chunked_attention(q, k, v, r))(r) for r in (128, 256, 1500)}}
    ref = sdpa(q.float(), k.float(), v.float())
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for name, fn in fns.items():
        fn()  # warm-up
    for r in range(repeat):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            c0 = time.process_time()
            fns[name]()
            cpu[name].append(time.process_time() - c0)
    print(f"\nbf16 attention of one layer ({a} positions, {h} heads), {threads} thread(s), CPU ms, medians")
    print("| kernel | CPU ms | max abs error vs float32 |\n|---|---|---|")
    for name, fn in fns.items():
        print(f"| {name} | {statistics.median(cpu[name]) * 1e3:.1f} | {float((fn().float() - ref).abs().max()):.2g} |")


def transcripts(manifest: Path, old_root: Path, dtype: str) -> None:
    """The clips of ``manifest`` (``path<TAB>reference`` lines) through whisper-base-ar at ``dtype`` before and
    after, and float32 after: identical texts and WER against the references and against float32."""
    torch.set_num_threads(1)
    rows = [line.split("\t", 1) for line in manifest.read_text().splitlines() if line.strip()]
    files, refs = [Path(f) for f, _ in rows], [r for _, r in rows]
    texts = {name: _side(root, dt)(files)[1] for name, root, dt in
             (("before", old_root, dtype), ("after", REPO, dtype), ("float32", REPO, "float32"))}
    print(f"\n{len(files)} clips of {manifest}, whisper-base-ar, greedy, 1 thread")
    print(f"| {dtype} | texts equal to before | equal to float32 | WER vs references | WER vs float32 |")
    print("|---|---|---|---|---|")
    for name in ("before", "after"):
        hyp = texts[name]
        ref_err = sum((error_counts(r, h) for r, h in zip(refs, hyp)), error_counts("", ""))
        f32_err = sum((error_counts(r, h) for r, h in zip(texts["float32"], hyp)), error_counts("", ""))
        print(f"| {name} | {sum(a == b for a, b in zip(hyp, texts['before']))}/{len(files)} "
              f"| {sum(a == b for a, b in zip(hyp, texts['float32']))}/{len(files)} "
              f"| {100 * ref_err.wer:.2f}% | {100 * f32_err.wer:.2f}% |")
    for f, a, b in zip(files, texts["before"], texts["after"]):
        if a != b:
            print(f"{f.name}: before {a!r}\n{' ' * len(f.name)}  after  {b!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="git revision of the 'before' code")
    ap.add_argument("--model", default="whisper-base")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--variants", action="store_true", help="also one fusion at a time")
    ap.add_argument("--attention", action="store_true", help="also time the bf16 attention kernels")
    ap.add_argument("--manifest", type=Path, help="only compare transcripts of these clips (path<TAB>reference)")
    args = ap.parse_args()
    path = resolve_model(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        old_cls = _old_target_class(args.before, Path(tmp))
        if args.manifest:
            for dtype in args.dtypes.split(","):
                transcripts(args.manifest, Path(tmp), dtype)
            return
        for threads in (int(t) for t in args.threads.split(",")):
            for dtype in args.dtypes.split(","):
                run(old_cls, path, dtype, threads, args.repeat, args.variants)
            if args.attention:
                attention_variants(WhisperTarget.from_dir(path), threads, args.repeat)


if __name__ == "__main__":
    main()
