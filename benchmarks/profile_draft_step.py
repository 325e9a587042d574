"""Per-token cost of one EAGLE-ASR draft step on a real target, broken down by stage.

Loads whisper-base and the shipped Speech-Draft head, decodes a ``samples/`` clip greedily (the target
step time: plain decoding's seconds per token), then from every decoded position drafts a chain of
``--draft`` tokens (no confidence stop, so every proposal drafts exactly that many) and times:

* ``input``      the step's input: fusion of the target's states (first step) or combine (later steps)
* ``block``      the decoder block (self-attention, cross-attention, MLP; the head's KV-cache write)
* ``cross``      of which the cross-attention alone (query projection, SDPA over the window, output), timed
                 in isolation on the same input
* ``projection`` output norm + the draft-vocabulary rows of the LM head (the full logits row where a
                 drafter still builds one)
* ``filter``     the shared logit filter (Whisper's rules) and the softmax / argmax / confidence read
* ``python``     the rest of ``propose`` (loop, bookkeeping, tensor creation)

per draft token, in ms, for each ``--dtypes`` of the target (the drafter picks the head's dtype: the
target's, or bfloat16 under a float32 target on a CPU with native bf16; its matrices int8 weight-only
on the CPU): the default drafter, the same with float matrices (``float head``) and, under a float32
target, the head all in float32. ``--baseline REV``
also builds the drafter of ``specli/asr/drafters/eagle.py`` at git revision ``REV`` and times both
side by side, interleaved repeat by repeat (a loaded machine slows both alike). On a machine
shared with other jobs, ``--clock cpu`` times with the process's CPU time instead of wall time (at
``--threads 1`` this is the work a step does, whatever else runs)::

    python benchmarks/profile_draft_step.py --threads 2 --baseline HEAD~1
    python benchmarks/profile_draft_step.py --threads 1 --clock cpu --baseline HEAD~1
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import soundfile as sf
import torch
import torch.nn.functional as F

from specli.io.audio import window_features
from specli.core.drafters.base import DraftRequest, ModelDraftOptions
from specli.asr.drafters.eagle_head import load_head
from specli.asr.drafters.eagle import EagleDrafter
from specli.core.greedy import greedy_decode
from specli.core.job import DecodeJob
from specli.core.logits import filter_logits
from specli.models.whisper.loader import load_whisper
from specli.models.whisper.rules import WhisperLogitRules

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("input", "block", "projection", "filter")
CLOCK = time.perf_counter  # --clock cpu: time.process_time


class Timers:
    """Wall time per stage, accumulated by wrapping the drafter's methods."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)

    def wrap(self, stage: str, fn):
        def timed(*args, **kwargs):
            t0 = CLOCK()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[stage] += CLOCK() - t0
        return timed


def baseline_module(rev: str):
    """``specli/asr/drafters/eagle.py`` as it was at git revision ``rev``, imported on its own."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:specli/asr/drafters/eagle.py"],
                         check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "eagle_baseline.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("eagle_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["eagle_baseline"] = module
    spec.loader.exec_module(module)
    return module


def instrument(drafter, timers: Timers) -> None:
    """Time the head's stages of ``drafter`` (instance attributes shadow the methods)."""
    head = drafter.head
    for name, stage in (("first_input", "input"), ("next_input", "input"), ("block", "block")):
        setattr(head, name, timers.wrap(stage, getattr(head, name)))
    name = "logits" if hasattr(drafter, "vocab") else "full_logits"  # (the baseline built the full row)
    setattr(head, name, timers.wrap("projection", getattr(head, name)))


def requests(model, state, tokens: list[int], plen: int, draft: int, rules) -> list[DraftRequest]:
    """One request per decoded position: the target's hidden state of that row, as speculation sees it."""
    target = model.target
    probe = target.start(state.audio_features)
    hidden = target.score(probe, torch.tensor([tokens[:-1]], device=target.device)).hidden
    return [DraftRequest(tokens[: j + 1], plen, draft, state, hidden.select([j]), None, True)
            for j in range(plen - 1, len(tokens) - 1)]


def run_all(drafter, reqs: list[DraftRequest], filt, timers: Timers) -> tuple[float, int]:
    """Propose from every request; (seconds, draft tokens)."""
    drafted = 0
    t0 = CLOCK()
    for req in reqs:
        req = DraftRequest(req.tokens, req.prompt_len, req.budget, req.state, req.hidden, filt, True)
        drafted += len(drafter.propose(req))
    return CLOCK() - t0, drafted


def cross_ms(drafter, d: int, repeats: int = 200) -> float:
    """The head's cross-attention alone on one query row (ms)."""
    head, cross = drafter.head, drafter._cross
    x = torch.randn(1, 1, d, device=cross[0].device).to(head.ln_cross.weight.dtype)
    b, h = 1, head.cfg.heads

    attend = getattr(sys.modules[type(head).__module__], "cross_attention", F.scaled_dot_product_attention)

    def once() -> torch.Tensor:
        cq = head.cross_q(head.ln_cross(x)).view(b, 1, h, d // h).transpose(1, 2)
        return head.cross_out(attend(cq, *cross).transpose(1, 2).reshape(b, 1, d))

    with torch.inference_mode():
        once()
        t0 = CLOCK()
        for _ in range(repeats):
            once()
    return (CLOCK() - t0) / repeats * 1000


def profile(dtype: str, args, baseline) -> list[tuple[str, dict]]:
    model = load_whisper(args.model, dtype)
    target, sp = model.target, model.special
    audio, rate = sf.read(args.clip, dtype="float32")
    mel = window_features(audio, target.dims.n_mels)
    state = target.start(target.encode(mel), features=mel)
    prompt = sp.prompt("en", "transcribe", False)
    rules = WhisperLogitRules.for_model(sp)
    job = DecodeJob(tuple(prompt), rules, sp.eot, args.max_new)
    greedy_decode(target, target.start(state.audio_features), job)  # warm-up
    t0 = CLOCK()
    ar = greedy_decode(target, target.start(state.audio_features), job)
    step_ms = (CLOCK() - t0) / ar.stats.target_forwards * 1000  # plain decoding's cost per target step
    tokens = prompt + ar.tokens
    reqs = requests(model, state, tokens, len(prompt), args.draft, rules)
    filt_timers: dict[str, Timers] = {}
    variants = [("now", EagleDrafter(load_head(args.head, target), ModelDraftOptions())),
                ("now, float head", EagleDrafter(load_head(args.head, target), ModelDraftOptions(), int8=False))]
    if dtype == "float32":  # the drafter's default picks bfloat16 on a CPU with native bf16: time float32 too
        variants.append(("now, fp32 head", EagleDrafter(load_head(args.head, target), ModelDraftOptions(),
                                                        torch.float32, int8=False)))
    if baseline is not None:
        variants.append(("baseline", baseline.EagleDrafter(baseline.load_head(args.head, target),
                                                            ModelDraftOptions())))
    totals = {name: [] for name, _ in variants}
    for name, drafter in variants:
        timers = filt_timers[name] = Timers()
        drafter.start(state, prompt)
        instrument(drafter, timers)
    for rep in range(args.repeats + 1):  # interleaved; the first round warms up and is dropped
        for name, drafter in variants:
            timers = filt_timers[name]
            filt = timers.wrap("filter", lambda x, p, **kw: filter_logits(x, p, rules, **kw))
            before = dict(timers.seconds)
            seconds, drafted = run_all(drafter, reqs, filt, timers)
            if rep == 0:
                timers.seconds = before
                continue
            totals[name].append((seconds, drafted))
    rows = []
    for name, drafter in variants:
        runs = totals[name]
        drafted = sum(n for _, n in runs)
        per_tok = [s / n * 1000 for s, n in runs]
        stage = {k: v / drafted * 1000 for k, v in filt_timers[name].seconds.items()}
        total = statistics.median(per_tok)
        stage["python"] = max(sum(s for s, _ in runs) / drafted * 1000 - sum(stage.values()), 0.0)
        stage["cross"] = cross_ms(drafter, target.dims.d_model)
        head_dtype = str(drafter.head.ln_rec.weight.dtype).removeprefix("torch.")
        rows.append((f"{dtype} {name} ({head_dtype})", {"draft_ms": total, **stage, "target_step_ms": step_ms,
                                         "draft/step": total / step_ms,
                                         "tokens": drafted // len(runs)}))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="whisper-base")
    ap.add_argument("--head", default="whisper-base-eagle")
    ap.add_argument("--clip", default=str(ROOT / "samples/en/sense_and_sensibility_01_austen_64kb-0870.wav"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--draft", type=int, default=8, help="draft tokens per proposal")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", metavar="REV", help="also time eagle.py at this git revision, interleaved")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall time, or process CPU time")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    baseline = baseline_module(args.baseline) if args.baseline else None
    cols = ("draft_ms", *STAGES, "python", "cross", "target_step_ms", "draft/step", "tokens")
    print(f"per draft token, ms ({args.threads} threads, {args.clock} clock; cross = cross-attention alone, "
          "inside block)")
    print(f"{'target, drafter (head)':38s}" + "".join(f"{c:>15s}" for c in cols))
    for dtype in args.dtypes:
        for label, row in profile(dtype, args, baseline):
            print(f"{label:38s}" + "".join(f"{row[c]:15.3f}" if c != "tokens" else f"{row[c]:15d}"
                                           for c in cols), flush=True)


if __name__ == "__main__":
    main()
