"""scripts/voice as one tool: ``python -m scripts.voice STAGE --work DIR`` lists its stages, resolves every path from
one work directory (the layout earlier runs left on disk), parses each stage's options into what the stage's code
reads, and its cheap stages run end to end and skip what is done (no audio, no training)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the repository: scripts.voice

from scripts.voice import build  # noqa: E402
from scripts.voice.paths import COMMITTED, ENV, Layout, work_dir  # noqa: E402

VOICE = ROOT / "specli" / "voices" / "specli-en"  # the shipped voice

STAGES = ["corpus", "tokenizer", "tokens", "text-tokenizer", "lexicon", "lm", "flow", "vocoder", "assemble",
          "drafters", "roundtrip"]
QUIET = ["--nice", "0"]  # a test never lowers its own process's priority


def _run(argv: list[str]) -> int:
    return build.main([*argv, *QUIET])


def test_the_entry_point_lists_its_stages_in_build_order(capsys, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert build.main([]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == [*STAGES, "all"]
    (tmp_path / "train" / "flow").mkdir(parents=True)
    (tmp_path / "train" / "flow" / "best.pt").write_bytes(b"")
    assert build.main(["list", "--work", str(tmp_path)]) == 0
    state = {line.split()[1]: line.split()[0] for line in capsys.readouterr().out.splitlines() if len(line) > 9}
    assert state["corpus"] == "pending" and state["flow"] == "done" and state["lm"] == "pending"
    assert state["text-tokenizer"] == state["lexicon"] == "done"  # data/voice/blank is committed, with its lexicon
    assert state["assemble"] == "reruns"


def test_the_work_directory_comes_from_the_argument_else_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "env"))
    assert work_dir(None) == tmp_path / "env"
    assert work_dir(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv(ENV)
    with pytest.raises(SystemExit, match=f"--work DIR or set {ENV}"):
        work_dir(None)
    with pytest.raises(SystemExit, match="no work directory"):
        _run(["text-tokenizer"])


def test_the_layout_is_the_one_earlier_runs_left_on_disk(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    assert lay.data == tmp_path / "data" and lay.tokenizer == tmp_path / "tokenizer"
    assert lay.onnx == tmp_path / "tokenizer" / "speech_tokenizer_v3.onnx"
    assert lay.run("lm") == tmp_path / "train" / "lm" and lay.run("mix") == tmp_path / "train" / "mix"
    assert lay.drafters == tmp_path / "drafters"
    assert lay.tokens == ROOT / "data" / "voice" / "tokens" / "tokens.npz"
    assert lay.blank == ROOT / "data" / "voice" / "blank"
    assert lay.codebook() == 19683  # FSQ 3^9, from data/voice/tokenizer.json


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_parses_its_options(stage: str, tmp_path: Path) -> None:
    args = build.parser(stage).parse_args([stage, "--work", str(tmp_path)])
    assert args.stage == stage and build.layout(args).work == tmp_path and args.threads == 1
    assert args.voice == ROOT / "specli" / "voices" / "specli-en"


def test_the_corpus_stage_keeps_the_piper_voice_apart_from_the_voice_in_training(tmp_path: Path) -> None:
    args = build.parser("corpus").parse_args(["corpus", "--piper-voice", str(tmp_path / "joe.onnx"), "--limit", "2"])
    assert args.piper_voice == tmp_path / "joe.onnx" and args.voice == ROOT / "specli" / "voices" / "specli-en"
    assert (args.hours, args.heldout, args.limit, args.text_only) == (None, 300, 2, False)  # None: the whole pool
    assert args.wordnet == Path("/usr/share/wordnet") and not args.fortunes_only  # WordNet's examples follow


def test_the_flow_and_lm_stages_get_the_recipe_and_their_paths(tmp_path: Path) -> None:
    voice = tmp_path / "voice"
    voice.mkdir()
    (voice / "flow.pt").write_bytes(b"")
    lay = Layout(tmp_path / "w", voice=voice)
    from scripts.voice import flow, lm

    args = build.parser("flow").parse_args(["flow", "--run", "mix"])
    build.training_args(lay, args, "flow.pt", flow.FROM_SCRATCH, flow.FINE_TUNE)
    assert args.run == tmp_path / "w" / "train" / "mix" and args.corpus == tmp_path / "w" / "data"
    assert (args.init, args.lr, args.warmup, args.codebook) == (voice / "flow.pt", 1e-4, 100, 19683)
    assert (args.objective, args.dim, args.depth, args.heads, args.steps) == ("mix", 256, 6, 4, 8000)
    assert (args.streaming, args.prompt_prob, args.cfg_dropout) == (0.0, 0.0, 0.0)
    args = build.parser("lm").parse_args(["lm", "--lr", "2e-4"])  # no llm.pt in the voice: from scratch
    build.training_args(lay, args, "llm.pt", lm.FROM_SCRATCH, lm.FINE_TUNE)
    assert (args.init, args.lr, args.warmup, args.val_every) == (None, 2e-4, 500, 500)
    assert (args.dropout, args.token_noise, args.steps) == (0.1, 0.05, 4000)
    assert args.tokens == COMMITTED / "tokens" / "tokens.npz"
    args = build.parser("flow").parse_args(["flow", "--init", "none"])
    build.training_args(lay, args, "flow.pt", flow.FROM_SCRATCH, flow.FINE_TUNE)
    assert (args.init, args.lr, args.warmup) == (None, 3e-4, 1000)


def test_the_tokenizer_stages_hand_the_layout_to_the_tokenizer_cli(tmp_path: Path) -> None:
    from scripts.voice.tokenizer import cli

    lay = Layout(tmp_path)
    args = build.parser("tokenizer").parse_args(["tokenizer", "train", "--name", "g", "--layer", "6"])
    parsed = cli.parse_args(build.tokenizer_argv(lay, args.step))
    assert (parsed.cmd, parsed.name, parsed.layer) == ("train", "g", 6)
    assert (parsed.data, parsed.work) == (tmp_path / "data", tmp_path / "tokenizer")
    parsed = cli.parse_args(build.tokenizer_argv(lay, build.tokens_step(lay, True)))
    assert (parsed.cmd, parsed.out, parsed.allow_partial) == ("tokenize", COMMITTED / "tokens", True)
    assert parsed.onnx == lay.voice / "speech_tokenizer_v3.onnx"  # no tokenizer exported here: the voice's
    lay.tokenizer.mkdir()
    lay.onnx.write_bytes(b"exported here")
    assert cli.parse_args(build.tokenizer_argv(lay, build.tokens_step(lay, False))).onnx == lay.onnx


def test_assemble_takes_the_whole_voice_only_when_an_lm_was_trained(tmp_path: Path) -> None:
    lay = Layout(tmp_path, voice=tmp_path / "voice")
    args = build.parser("assemble").parse_args(["assemble", "--flow-steps", "1", "--cfg-rate", "0"])
    plan = build.assemble_plan(lay, args)
    assert (plan.source, plan.lm, plan.flow, plan.out) == (tmp_path / "voice", None, None, tmp_path / "voice")
    for run in ("lm", "flow"):
        lay.run(run).mkdir(parents=True)
        (lay.run(run) / "best.pt").write_bytes(b"")
    plan = build.assemble_plan(lay, args)
    assert (plan.source, plan.lm, plan.flow) == (None, lay.run("lm") / "best.pt", lay.run("flow") / "best.pt")
    voice_onnx = tmp_path / "voice" / "speech_tokenizer_v3.onnx"  # no tokenizer exported in the work directory
    assert (plan.blank, plan.onnx, plan.flow_steps, plan.cfg_rate) == (lay.blank, voice_onnx, 1, 0.0)
    args = build.parser("assemble").parse_args(["assemble", "--text-tokenizer", str(tmp_path / "blank-cmu")])
    assert build.assemble_plan(lay, args).blank == tmp_path / "blank-cmu"
    other = ["--tokens", str(tmp_path / "tok8" / "tokens.npz"), "--onnx", str(tmp_path / "tok8" / "t.onnx")]
    plan = build.assemble_plan(lay, build.parser("assemble").parse_args(["assemble", *other]))
    assert (plan.tokens, plan.onnx) == (tmp_path / "tok8" / "tokens.npz", tmp_path / "tok8" / "t.onnx")
    (lay.run("lm") / "best.pt").unlink()
    with pytest.raises(SystemExit, match="go with a trained LM"):
        build.assemble_plan(lay, build.parser("assemble").parse_args(["assemble", *other]))


def test_all_leaves_out_the_stages_done(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    assert build.pending(lay) == ["corpus", "tokenizer", "lm", "flow", "assemble"]  # tokens, blank: committed
    lay.tokenizer.mkdir()
    lay.onnx.write_bytes(b"another tokenizer")  # the committed tokens were not made by it
    assert build.pending(lay) == ["corpus", "tokens", "lm", "flow", "assemble"]


def _fortunes(root: Path, sentences: list[str]) -> tuple[Path, Path]:
    """A fortune file (strfile format) and a word list that knows every word."""
    (root / "fortunes").mkdir(exist_ok=True)
    (root / "fortunes" / "tiny").write_text("\n%\n".join(sentences) + "\n")
    words = {w.strip(".,?!'\"").lower() for s in sentences for w in s.split()}
    (root / "words").write_text("\n".join(sorted(words)) + "\n")
    return root / "fortunes", root / "words"


SENTENCES = ["The cat sat on the warm mat.", "A small dog ran home quickly.", "We like green tea in the morning.",
             "Rain fell on the quiet town.", "She read a long book about the sea.", "Birds sing when the sun rises."]


def test_text_only_corpus_writes_sentences_and_their_text_tokens_and_resumes(tmp_path: Path, capsys) -> None:
    from specli.models.cosyvoice.text import CosyVoiceTokenizer

    fortunes, words = _fortunes(tmp_path, SENTENCES)
    argv = ["corpus", "--work", str(tmp_path / "w"), "--text-only", "--fortunes", str(fortunes),
            "--wordlist", str(words), "--fortunes-only"]
    assert _run(argv) == 0
    out = tmp_path / "w" / "text"
    rows = {s: [json.loads(x) for x in (out / f"{s}.jsonl").read_text().splitlines()] for s in ("train", "heldout")}
    sha = {t: hashlib.sha1(t.encode()).hexdigest() for t in SENTENCES}
    assert sorted(r["text"] for s in rows for r in rows[s]) == sorted(SENTENCES)
    assert [r["id"] for r in rows["train"]] == sorted(sha[r["text"]][:12] for r in rows["train"])  # sha1 order
    held = ("fb", "fc", "fd", "fe", "ff")  # the fixed held-out sha1 range
    assert all(sha[r["text"]].startswith(held) == (s == "heldout") for s in rows for r in rows[s])
    tok = CosyVoiceTokenizer(COMMITTED / "blank", "cosyvoice3")
    assert all(r["tokens"] == tok.encode(r["text"]) for s in rows for r in rows[s])  # the LM's text ids
    assert not (tmp_path / "w" / "data").exists()  # no audio
    stamp = (out / "train.jsonl").stat().st_mtime_ns
    assert _run(argv) == 0  # rerun: up to date, nothing rewritten
    assert "up to date" in capsys.readouterr().err and (out / "train.jsonl").stat().st_mtime_ns == stamp
    _fortunes(tmp_path, [*SENTENCES, "The old clock struck nine at night."])
    assert _run(argv) == 0  # other sentences: rebuilt
    assert sum(len((out / f"{s}.jsonl").read_text().splitlines()) for s in ("train", "heldout")) == 7


def _wordnet(root: Path, examples: list[str], definitions: list[str] | None = None) -> Path:
    """WordNet's data files as Debian's wordnet-base lays them out: licence lines indented by two spaces, then one
    synset a line, its gloss after " | " (a definition, then quoted usage examples separated by "; ")."""
    root.mkdir()
    header = "  1 This software and database is being provided to you, the LICENSEE, by  \n"
    defs = definitions or ["a definition"] * len(examples)
    lines = [f'{i:08d} 03 n 01 thing 0 000 | {d}; "{ex}"  \n' for i, (d, ex) in enumerate(zip(defs, examples))]
    (root / "data.noun").write_text(header + "".join(lines))
    for name in ("data.verb", "data.adj", "data.adv"):
        (root / name).write_text(header + "00000001 00 v 01 be 0 000 | have the quality of being  \n")
    return root


def test_wordnet_examples_follow_the_fortunes_and_never_enter_the_held_out_set(tmp_path: Path) -> None:
    from scripts.voice.corpus import sentences, texts

    in_range = "The cook rode up the hill."  # sha1 fe28...: inside the fixed held-out range
    extra = ["the farmer sold his cow", "A clean shirt", "Rain fell on the quiet town;", "Wir gehen nach Hause",
             "the 3 boats", in_range.lower()[:-1]]
    fortunes, words = _fortunes(tmp_path, SENTENCES)
    words.write_text(words.read_text() + "farmer\nsold\nhis\ncow\nclean\nshirt\ncook\nrode\nup\nhill\nboats\n")
    wordnet = _wordnet(tmp_path / "wordnet", extra)
    alone = sentences.pool(fortunes, words, 300, None)
    sel = sentences.pool(fortunes, words, 300, wordnet)
    assert sel.heldout == alone.heldout and sel.train_pool[: len(alone.train_pool)] == alone.train_pool
    added = [text for _sha, text in sel.train_pool[len(alone.train_pool):]]
    # Capitalised and ended with a full stop; a fortune's duplicate ("Rain fell ..."), German, a digit and the
    # held-out range's sentence are left out.
    assert sorted(added) == ["A clean shirt.", "The farmer sold his cow."] and sel.extra == 2
    assert [r[0] for r in sel.train_pool[len(alone.train_pool):]] == sorted(r[0] for r in sel.train_pool[len(
        alone.train_pool):])  # sha1 order
    source = texts.Source(fortunes, words, 300, wordnet)
    assert [t for _i, t in texts.sentences("train", source)] == [t for _s, t in sel.train_pool]
    (wordnet / "data.adv").unlink()
    with pytest.raises(SystemExit, match="data.adv missing .* apt-get install -y wordnet-base"):
        sentences.pool(fortunes, words, 300, wordnet)


def test_wordnet_definitions_follow_its_examples_only_on_request(tmp_path: Path) -> None:
    from scripts.voice.corpus import sentences

    examples = ["the farmer sold his cow", "A clean shirt"]
    # Definitions (split at ";"): a new one, one equal to an example, one equal to a fortune, one too short, one with a
    # digit, and one inside the held-out range.
    definitions = ["a man who grows crops and keeps animals; a clean shirt", "rain fell on the quiet town; a cow",
                   "sold 3 times; the cook rode up the hill"]
    fortunes, words = _fortunes(tmp_path, SENTENCES)
    words.write_text(words.read_text() + "farmer\nsold\nhis\ncow\nclean\nshirt\nman\nwho\ngrows\ncrops\nand\n"
                     "keeps\nanimals\ncook\nrode\nup\nhill\ntimes\n")
    wordnet = _wordnet(tmp_path / "wordnet", [*examples, "A clean shirt"], definitions)
    plain = sentences.pool(fortunes, words, 300, wordnet)
    sel = sentences.pool(fortunes, words, 300, wordnet, glosses=True)
    assert sel.heldout == plain.heldout and sel.train_pool[: len(plain.train_pool)] == plain.train_pool
    assert [t for _s, t in sel.train_pool[len(plain.train_pool):]] == ["A man who grows crops and keeps animals."]
    assert sel.extra == plain.extra + 1
    with pytest.raises(ValueError, match="glosses need"):
        sentences.pool(fortunes, words, 300, None, glosses=True)
    argv = ["corpus", "--work", str(tmp_path / "w"), "--text-only", "--fortunes", str(fortunes), "--wordlist",
            str(words), "--wordnet", str(wordnet)]
    with pytest.raises(SystemExit, match="cannot go with --fortunes-only"):
        _run([*argv, "--glosses", "--fortunes-only"])
    assert _run([*argv, "--glosses"]) == 0
    train = [json.loads(line)["text"] for line in (tmp_path / "w" / "text" / "train.jsonl").read_text().splitlines()]
    assert train == [t for _s, t in sel.train_pool]


def test_text_tokenizer_stage_trains_once_then_skips(tmp_path: Path, capsys) -> None:
    lay = Layout(tmp_path / "w", committed=tmp_path / "committed")
    lay.data.mkdir(parents=True)
    lay.data.joinpath("train.tsv").write_text("".join(f"{i:012x}\t{s}\t1.0\n" for i, s in enumerate(SENTENCES * 5)))
    args = build.parser("text-tokenizer").parse_args(["text-tokenizer", "--vocab", "300"])
    build.BY_NAME["text-tokenizer"].run(lay, args)
    vocab = json.loads((lay.blank / "vocab.json").read_text())
    assert 256 < len(vocab) <= 300 and (lay.blank / "merges.txt").is_file()  # bytes + merges
    assert build.BY_NAME["text-tokenizer"].done(lay)
    stamp = (lay.blank / "vocab.json").stat().st_mtime_ns
    build.BY_NAME["text-tokenizer"].run(lay, args)
    assert "--force retrains it" in capsys.readouterr().err and (lay.blank / "vocab.json").stat().st_mtime_ns == stamp


def test_a_run_resumes_from_the_checkpoints_earlier_runs_wrote(tmp_path: Path) -> None:
    import torch

    from scripts.voice.common import checkpoint, restore, save

    def fresh(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(seed)
        model = torch.nn.Linear(3, 2)
        return model, torch.optim.AdamW(model.parameters())

    model, opt = fresh(0)
    old = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 250, "best": 0.5}
    save(tmp_path / "checkpoints" / "ckpt-00000250.pt", old)  # as the trainers wrote them before the move
    again, opt2 = fresh(1)
    assert restore(tmp_path, again, opt2, init=tmp_path / "ignored.pt") == (250, 0.5)
    assert torch.equal(again.weight, model.weight)
    for step in (500, 750):
        checkpoint(tmp_path, again, opt2, step, 0.4)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ckpt-00000500.pt", "ckpt-00000750.pt"]
    assert restore(tmp_path, *fresh(2), init=None) == (750, 0.4)
    init = tmp_path / "voice.pt"
    torch.save({k: v.half() for k, v in model.state_dict().items()}, init)  # a shipped voice's float16 weights
    scratch, opt3 = fresh(3)
    assert restore(tmp_path / "new", scratch, opt3, init) == (0, float("inf"))
    assert torch.equal(scratch.weight, model.weight.half().float())
    best = tmp_path / "run" / "best.pt"  # another run's best record: --init continues from its model
    save(best, {"model": again.state_dict(), "step": 750, "val": 0.4, "config": {"dim": 3}})
    follow, opt4 = fresh(4)
    assert restore(tmp_path / "next", follow, opt4, best) == (0, float("inf"))
    assert torch.equal(follow.weight, again.weight)


def test_a_weight_average_is_kept_in_checkpoints_and_resumed(tmp_path: Path) -> None:
    import torch

    from scripts.voice.common import Ema, checkpoint, restore

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ema = Ema(model, 0.75)
    start = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(4.0)
    ema.update(model)  # 0.75 * start + 0.25 * (start + 4)
    assert torch.allclose(ema.model.weight, start + 1.0) and not ema.model.weight.requires_grad
    checkpoint(tmp_path, model, opt, 10, 0.3, ema)
    again = torch.nn.Linear(3, 2)
    ema2 = Ema(again, 0.75)
    assert restore(tmp_path, again, torch.optim.SGD(again.parameters(), lr=0.1), None, ema2) == (10, 0.3)
    assert torch.equal(again.weight, model.weight) and torch.equal(ema2.model.weight, ema.model.weight)
    plain = tmp_path / "plain"
    checkpoint(plain, model, opt, 5, 0.4)  # a run that kept no average: the average starts at the weights
    third = torch.nn.Linear(3, 2)
    ema3 = Ema(third, 0.75)
    assert restore(plain, third, torch.optim.SGD(third.parameters(), lr=0.1), None, ema3) == (5, 0.4)
    assert torch.equal(ema3.model.weight, model.weight)
    with pytest.raises(ValueError, match="decay"):
        Ema(model, 1.0)


def test_a_partial_corpus_build_never_shrinks_the_committed_sentence_list(tmp_path: Path) -> None:
    from scripts.voice.corpus.piper import write_sha1_list

    path = tmp_path / "sentences.sha1"
    rows = lambda *keys: [(k, "text", 1) for k in keys]  # noqa: E731 - (sha1, text, samples) as the build has them
    assert write_sha1_list(path, rows("a"), rows("b", "c"))  # a first build writes
    assert path.read_text() == "a heldout\nb train\nc train\n"
    assert not write_sha1_list(path, rows("a"), rows("b"))  # --hours on a fresh machine: fewer sentences, kept
    assert path.read_text() == "a heldout\nb train\nc train\n"
    assert write_sha1_list(path, rows("a"), rows("b", "c", "d"))  # a larger build adds
    assert path.read_text().splitlines()[-1] == "d train"


def _tokens_file(out: Path, clips: dict[str, list[int]]) -> Path:
    """``out/tokens.npz`` written by `tokenize`'s own writer (every clip a training clip)."""
    from scripts.voice.tokenizer.data import Clip
    from scripts.voice.tokenizer.ship import write_tokens

    rows = [Clip(cid, "text", "train", 1.0) for cid in clips]
    tokens = {cid: np.array(codes, dtype=np.uint16) for cid, codes in clips.items()}
    write_tokens(out, rows, tokens, "0" * 64, out / "speech_tokenizer_v3.onnx", True, {})
    return out / "tokens.npz"


def test_the_tokens_stage_is_pending_while_the_corpus_has_clips_the_tokens_lack(tmp_path: Path) -> None:
    """A finished corpus larger than the committed tokens (a build with more hours) leaves `tokens` to do; a corpus
    they cover, or none, does not."""
    import json

    lay = Layout(tmp_path, voice=tmp_path / "voice", committed=tmp_path / "committed")
    _tokens_file(lay.committed / "tokens", {"a": [1, 2], "b": [3]})
    lay.data.mkdir()

    def corpus(train: list[str]) -> None:
        (lay.data / "heldout.tsv").write_text("a\tHeld out.\t1.0\n", encoding="utf-8")
        (lay.data / "train.tsv").write_text("".join(f"{c}\tText.\t1.0\n" for c in train), encoding="utf-8")
        man = {"selection": {"limit": None}, "counts": {"train": len(train), "heldout": 1}}
        (lay.data / "manifest.json").write_text(json.dumps(man), encoding="utf-8")

    assert build._tokens_done(lay)  # no corpus here: the committed tokens stand
    corpus(["b"])
    assert build._tokens_done(lay)
    corpus(["b", "c"])
    assert not build._tokens_done(lay) and "tokens" in build.pending(lay)


def test_another_tokenizers_codes_start_from_the_rows_they_co_occur_with(tmp_path: Path) -> None:
    import torch

    from scripts.voice.tokenizer.tokens import cooccurrence

    old = _tokens_file(tmp_path / "old", {"a": [0, 0, 1, 2], "b": [2, 1]})
    new = _tokens_file(tmp_path / "new", {"a": [3, 3, 0, 0], "b": [1, 0]})  # 0 <- old 1, 2, 1; 3 <- old 0, 0
    counts = cooccurrence(old, new, 3, 5).toarray()
    assert counts[0].tolist() == [0, 2, 1] and counts[3].tolist() == [2, 0, 0] and counts[1].tolist() == [0, 0, 1]
    voice = tmp_path / "voice"
    voice.mkdir()
    rows = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
    decoder = torch.cat([rows, torch.full((2, 2), 7.0)])  # an LM's table: 2 rows past the codebook (sos, eos)
    torch.save({"input_embedding.weight": rows.half(), "llm_decoder.weight": decoder.half(),
                "other.weight": torch.ones(2).half()}, voice / "flow.pt")
    lay = Layout(tmp_path / "w", voice=voice)
    from scripts.voice import flow

    args = build.parser("flow").parse_args(["flow", "--run", "t8", "--tokens", str(new), "--codebook", "5",
                                            "--remap-from", str(old)])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Layout, "codebook", lambda self: 3)
        build.training_args(lay, args, "flow.pt", flow.FROM_SCRATCH, flow.FINE_TUNE)
    assert args.init == tmp_path / "w" / "train" / "t8" / "init.pt" and args.codebook == 5 and args.lr == 1e-4
    state = torch.load(args.init, weights_only=True)
    emb = state["input_embedding.weight"]
    assert emb.shape == (5, 2) and torch.allclose(emb[0], torch.tensor([0.0, 5 / 3])) and emb[3].tolist() == [1.0, 0.0]
    assert emb[1].tolist() == [0.0, 3.0] and torch.allclose(emb[2], rows.mean(0))  # code 2 never seen: the mean
    assert state["llm_decoder.weight"].shape == (7, 2) and state["llm_decoder.weight"][5:].eq(7.0).all()
    assert state["other.weight"].eq(1.0).all()
    bad = _tokens_file(tmp_path / "bad", {"a": [0, 0, 1], "b": [1, 0]})
    with pytest.raises(SystemExit, match="1 of 2 clips have another token count"):
        cooccurrence(old, bad, 3, 5)
    many = {f"c{i:03d}": [i % 3, 2] for i in range(150)}  # one clip of 151 a token longer (piper on another CPU)
    old_many = _tokens_file(tmp_path / "old-many", {**many, "a": [0, 0, 1, 2]})
    new_many = _tokens_file(tmp_path / "new-many", {**{k: [1, 4] for k in many}, "a": [3, 3, 0, 0, 0]})
    counts = cooccurrence(old_many, new_many, 3, 5).toarray()
    assert counts[1].tolist() == [50, 50, 50] and counts[4].tolist() == [0, 0, 150]
    assert counts[0].sum() == counts[3].sum() == 0  # "a" left out, not read at shifted positions
    args = build.parser("flow").parse_args(["flow", "--tokens", str(new)])
    with pytest.raises(SystemExit, match="go together"):
        build.training_args(lay, args, "flow.pt", flow.FROM_SCRATCH, flow.FINE_TUNE)


def test_the_drafters_stage_trains_each_drafter_on_the_voice_with_its_draft_vocabulary(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    from scripts.voice import drafters

    calls = []
    monkeypatch.setattr(drafters, "_specli", lambda threads, *args: calls.append((threads, args)))
    args = build.parser("drafters").parse_args(["drafters", "--step", "train", "--drafters", "dflash,dspark"])
    drafters.run(tmp_path, tmp_path / "voice", args)
    assert [c[1][c[1].index("--drafter") + 1] for c in calls] == ["dflash", "dspark"]
    for _threads, argv in calls:
        assert argv[:2] == ("distill", "train") and argv[argv.index("--model") + 1] == str(tmp_path / "voice")
        assert argv[argv.index("--draft-vocab") + 1] == str(drafters.DRAFT_VOCAB)
        assert argv[-1] == str(tmp_path / "data-greedy" / "train")
    args = build.parser("drafters").parse_args(["drafters", "--step", "train", "--draft-vocab", "0"])
    calls.clear()
    drafters.run(tmp_path, tmp_path / "voice", args)
    assert all(argv[argv.index("--draft-vocab") + 1] == "0" for _t, argv in calls)


def test_clips_spoken_on_another_machine_stand_in_through_their_committed_tokens(tmp_path: Path) -> None:
    """`corpus --spoken TOKENS` counts a tokens file's training clips as made (their recorded lengths, no wav, no
    piper), and `tokenize` on a corpus that lists fewer clips keeps the committed ones, so neither shrinks the
    committed tokens a fresh machine continues from."""
    from scripts.voice.corpus.piper import SAMPLE_RATE, Store, synthesise
    from scripts.voice.tokenizer.data import Clip
    from scripts.voice.tokenizer.ship import committed_tokens, kept_clips, write_tokens
    from scripts.voice.tokenizer.tokens import spoken_seconds

    out = tmp_path / "tokens"
    clips = [Clip("h" * 12, "Held.", "heldout", 0.75), Clip("a" * 12, "A.", "train", 1.25),
             Clip("b" * 12, "B.", "train", 0.5)]
    codes = {"h" * 12: [7], "a" * 12: [1, 2], "b" * 12: [3]}
    write_tokens(out, clips, {k: np.array(v, np.uint16) for k, v in codes.items()}, "0" * 64, out / "x.onnx", True, {})
    path = out / "tokens.npz"
    assert spoken_seconds(path) == {"a" * 12: 1.25, "b" * 12: 0.5}  # the held-out set is always spoken here
    assert spoken_seconds(path, "heldout") == {"h" * 12: 0.75}

    store = Store.open(tmp_path / "data", {"piper": "test"})
    store.spoken = {cid: round(sec * SAMPLE_RATE) for cid, sec in spoken_seconds(path).items()}
    items = [("a" * 40, "A."), ("b" * 40, "B.")]  # sha1 keys; clip ids are their first 12 digits
    used, prog = synthesise(None, store, items, "train", target_s=1.0)  # no piper: nothing to synthesise
    assert used == [("a" * 40, "A.", round(1.25 * SAMPLE_RATE))] and prog.made_seconds == 0.0  # 1 s reached
    assert store.existing("c" * 40) is None and not store.journal  # neither spoken nor made

    kept = committed_tokens(path, "0" * 64)
    listed = [clips[1]]  # a partial build that lists only one of them
    extra = kept_clips(path, kept, listed)
    assert [(c.id, c.split, c.seconds) for c in extra] == [("h" * 12, "heldout", 0.75), ("b" * 12, "train", 0.5)]
    write_tokens(out, listed + extra, kept, "0" * 64, out / "x.onnx", False, {})
    assert {cid: v.tolist() for cid, v in committed_tokens(path, "0" * 64).items()} == codes
    with np.load(path) as z:
        assert "seconds" in z.files
        np.savez(tmp_path / "old.npz", **{k: z[k] for k in z.files if k != "seconds"})
    with pytest.raises(SystemExit, match="records no clip lengths"):
        spoken_seconds(tmp_path / "old.npz")


def test_the_committed_tokens_come_from_the_shipped_tokenizer() -> None:
    """data/voice/tokenizer.json and data/voice/tokens/: the record and the corpus's codes of the speech tokenizer
    specli-en ships (3^9), agreeing with the voice's ONNX file, so `tokenize` keeps them and a fresh machine
    continues from them."""
    from specli.io.digest import file_sha256
    from specli.tts.acoustic.frontend import SpeechTokenizer

    onnx = VOICE / "speech_tokenizer_v3.onnx"
    record = json.loads((COMMITTED / "tokenizer.json").read_text(encoding="utf-8"))
    sha = file_sha256(onnx)
    assert record["onnx"]["sha256"] == sha and record["fsq"]["codebook"] == 19683
    SpeechTokenizer(onnx)  # the frontend's signature check
    with np.load(COMMITTED / "tokens" / "tokens.npz") as z:
        assert str(z["onnx_sha256"]) == sha and int(z["tokens"].max()) < 19683
        assert len(z["ids"]) == len(z["seconds"]) == len(z["offsets"]) - 1 and int(z["split"].sum()) == 300
        # one token per 1,024 samples of the zero-padded clip (lengths to the millisecond: train.tsv's)
        excess = np.diff(z["offsets"]) - z["seconds"] * 22050 / 1024
        assert excess.min() > -0.02 and excess.max() < 1.02


def test_the_shipped_lm_starts_the_next_stage_of_its_lineage() -> None:
    """specli-en's llm.pt, where a later LM stage starts (`lm`'s default `--init`): float16 weights that load, keys
    strict, into the training module over the shipped tokenizer's 19,683 codes."""
    import torch

    from scripts.voice.common import init_weights
    from scripts.voice.lm import SHAPE, new_model

    path = VOICE / "llm.pt"
    floats = [v for v in torch.load(path, weights_only=True).values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float16 for v in floats)
    model = new_model(COMMITTED / "blank", 19683, SHAPE, 0.0)
    model.load_state_dict(init_weights(path))  # strict: every key, every shape


def test_the_shipped_flow_loads_and_grows_into_the_next_stage() -> None:
    """specli-en's flow.pt, the 6-block flow (`x3p9`): float16 official keys that load, strict, into the flow over
    the 19,683 codes, and grow to the 12 blocks a next stage trains (`flow --depth 12`) computing the same function
    at the start."""
    import torch

    from scripts.voice.common import init_weights
    from scripts.voice.flow import dit_depth, flow_config, grown
    from specli.tts.acoustic.flow_cv3 import FlowCV3

    path = VOICE / "flow.pt"
    floats = [v for v in torch.load(path, weights_only=True).values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float16 for v in floats)
    state = init_weights(path)
    assert dit_depth(state) == 6
    six, twelve = (FlowCV3(flow_config(19683, 256, depth, 4, 256)).eval() for depth in (6, 12))
    six.load_state_dict(state)  # strict: every key, every shape
    twelve.load_state_dict(grown(state, 12))
    gen = torch.Generator().manual_seed(0)
    x, mu = torch.randn(1, 80, 40, generator=gen), torch.randn(1, 80, 40, generator=gen)  # [batch, mel, frames]
    mask, t, spks, cond = torch.ones(1, 1, 40), torch.tensor([0.0]), torch.zeros(1, 80), torch.zeros(1, 80, 40)
    with torch.no_grad():
        a, b = (m.decoder.estimator(x, mask, mu, t, spks, cond) for m in (six, twelve))
    assert torch.allclose(a, b, atol=1e-5)
