"""CosyVoice2/3 LMs: official checkpoint layout, safe yaml, layouts, and token-for-token agreement
with a plain transcription of the upstream decoding procedure (``cosyvoice/llm/llm.py``)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from cosyvoice_fixtures import write_checkpoint
from specli.core.sampling import SamplerOptions
from specli.tts.synthesis import (SynthesisInputError, SynthesisOptions, SynthesisRequest, Synthesizer,
                                      prepare)
from specli.models.cosyvoice.lm import load_cosyvoice, resolve_cosyvoice
from specli.models.cosyvoice.layout import SpeechLMSpec, merged_layout, vllm_layout
from specli.models.cosyvoice.text import CV3_DEFAULT_PROMPT, special_tokens
from specli.models.cosyvoice.yaml import Tagged, read_hyperpyyaml
from specli.errors import ModelLoadError

S = 6561


# ---------------------------------------------------------------------------------------------
# The upstream procedure, transcribed plainly (Qwen2LM / CosyVoice3LM .inference + inference_wrapper
# without vLLM, sampling_ids with ignore_eos = i < min_len), with transformers' Qwen2 fed inputs_embeds.
# ``choose(logp, out_tokens)`` stands for the sampler; the tests pass argmax.
# ---------------------------------------------------------------------------------------------
def upstream_inference(ckpt: Path, kind: str, text: list[int], prompt_text: list[int],
                       prompt_speech: list[int], choose, steps: int | None = None) -> list[int]:
    sd = torch.load(ckpt / "llm.pt", weights_only=True)
    qwen = Qwen2ForCausalLM(Qwen2Config.from_pretrained(ckpt / "CosyVoice-BlankEN")).eval()
    qwen.load_state_dict({k[len("llm.model."):]: v for k, v in sd.items() if k.startswith("llm.model.")})
    speech_embedding = sd["speech_embedding.weight"]
    llm_decoder = torch.nn.Linear(speech_embedding.shape[1], speech_embedding.shape[0], bias=kind == "cosyvoice2")
    llm_decoder.weight.data = sd["llm_decoder.weight"]
    if kind == "cosyvoice2":  # Qwen2LM
        llm_decoder.bias.data = sd["llm_decoder.bias"]
        sos_emb, task_id_emb = sd["llm_embedding.weight"][0], sd["llm_embedding.weight"][1]
        stop_token_ids = [S + i for i in range(3)]
    else:  # CosyVoice3LM: sos = S, eos = S + 1, task_id = S + 2
        sos_emb, task_id_emb = speech_embedding[S], speech_embedding[S + 2]
        stop_token_ids = [S + i for i in range(200)]
    with torch.inference_mode():
        text_emb = qwen.model.embed_tokens(torch.tensor([prompt_text + text]))
        prompt_speech_token_emb = speech_embedding[torch.tensor(prompt_speech, dtype=torch.long)].unsqueeze(0)
        lm_input = torch.cat([sos_emb.reshape(1, 1, -1), text_emb, task_id_emb.reshape(1, 1, -1),
                              prompt_speech_token_emb], 1)
        min_len, max_len = int(len(text) * 2), int(len(text) * 20)
        out_tokens: list[int] = []
        cache = None
        for i in range(max_len if steps is None else min(steps, max_len)):
            outs = qwen(inputs_embeds=lm_input, **{_CACHE_KW: cache}, use_cache=True, output_hidden_states=True)
            cache = _cache_of(outs)
            logp = llm_decoder(outs.hidden_states[-1][:, -1]).log_softmax(dim=-1)[0]
            if i < min_len:  # sampling_ids(ignore_eos=True): score[speech_token_size] = -inf
                logp[S] = -float("inf")
            top_ids = choose(logp, out_tokens)
            if top_ids in stop_token_ids:
                break
            out_tokens.append(top_ids)
            lm_input = speech_embedding[top_ids].reshape(1, 1, -1)
    return out_tokens


# transformers 5 renamed past_key_values to cache (the old name is deprecated)
_CACHE_KW = "cache" if "cache" in inspect.signature(Qwen2ForCausalLM.forward).parameters else "past_key_values"


def _cache_of(outs):
    return outs["cache"] if "cache" in outs else outs["past_key_values"]


def _argmax(logp, _out):
    return int(logp.argmax())


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("cosyvoice")
    out = {}
    for kind in ("cosyvoice2", "cosyvoice3"):
        for boost in (None, S, S + 1, S + 2):
            out[kind, boost] = write_checkpoint(root / f"{kind}-{boost}", kind, seed=7, boost=boost)
    return out


def _greedy(model, request):
    synth = Synthesizer(model, SynthesisOptions(sampler=SamplerOptions("greedy")))
    return synth.synthesize(request)


REQUESTS = [
    ("Hello there.", "", ()),
    ("the weather", "A short prompt.", (5, 17, 6000, 3)),
]


@pytest.mark.parametrize("kind", ["cosyvoice2", "cosyvoice3"])
@pytest.mark.parametrize("boost", [None, S, S + 1, S + 2])
def test_greedy_equals_upstream_procedure(ckpts, kind, boost):
    model = load_cosyvoice(str(ckpts[kind, boost]))
    for text, ptext, pspeech in REQUESTS:
        if kind == "cosyvoice3":
            ptext = CV3_DEFAULT_PROMPT if not ptext else ptext + "<|endofprompt|>"
        res = _greedy(model, SynthesisRequest("u", text, ptext, pspeech))
        tok = model.tokenizer
        ref = upstream_inference(ckpts[kind, boost], kind, tok.encode(text), tok.encode(ptext) if ptext else [],
                                 list(pspeech), _argmax)
        assert res.tokens == ref
        assert (res.min_len, res.max_len) == (2 * len(tok.encode(text)), 20 * len(tok.encode(text)))
        if boost == S:  # id S masked below min: CV2 (eos) and CV3 (sos, a stop id) both stop at exactly min
            assert len(res.tokens) == res.min_len and res.finished
        if boost == S + 1:  # CV2: S+1 is a stop id, not masked; CV3: the real eos stays allowed (the quirk)
            assert res.tokens == [] and res.finished


def test_layout_of_the_input(ckpts):
    m2 = load_cosyvoice(str(ckpts["cosyvoice2", None]))
    prep = prepare(m2, SynthesisRequest("x", "ab", "c", (1, 2)))
    base = S + 3 + 2
    assert prep.prompt == [S + 3, base + ord("c"), base + ord("a"), base + ord("b"), S + 4, 1, 2]
    m3 = load_cosyvoice(str(ckpts["cosyvoice3", None]))
    prep = prepare(m3, SynthesisRequest("x", "ab"))
    assert prep.prompt[0] == S and prep.prompt[-1] == S + 2 and prep.text_tokens == 2
    assert (prep.min_len, prep.max_len) == (4, 40)
    # embeddings of those ids are the rows the upstream code concatenates
    sd = torch.load(ckpts["cosyvoice2", None] / "llm.pt", weights_only=True)
    emb = m2.lm.embed(torch.tensor([[S + 3, S + 4, base + 7, 9]]))[0]
    assert torch.equal(emb[0], sd["llm_embedding.weight"][0]) and torch.equal(emb[1], sd["llm_embedding.weight"][1])
    assert torch.equal(emb[2], sd["llm.model.model.embed_tokens.weight"][7])
    assert torch.equal(emb[3], sd["speech_embedding.weight"][9])


def test_bad_requests(ckpts):
    m3 = load_cosyvoice(str(ckpts["cosyvoice3", None]))
    with pytest.raises(SynthesisInputError, match="empty"):
        prepare(m3, SynthesisRequest("x", "   "))
    with pytest.raises(SynthesisInputError, match="endofprompt"):
        prepare(m3, SynthesisRequest("x", "hi", "a prompt without the marker"))
    with pytest.raises(SynthesisInputError, match="too long"):
        prepare(m3, SynthesisRequest("x", "word " * 60))
    with pytest.raises(SynthesisInputError, match="prompt speech"):
        prepare(m3, SynthesisRequest("x", "hi", "", (S,)))


def test_a_line_too_long_is_cut_into_pieces_each_tokenized_once(ckpts, monkeypatch):
    """The pieces of a line too long for the model are each prepared as alone, and no piece text is tokenized twice
    (the fit checks' preparations are the pieces')."""

    m3 = load_cosyvoice(str(ckpts["cosyvoice3", None]))
    text = " ".join(f"Sentence number {i} has a few words in it." for i in range(12))
    encoded: list[str] = []
    encode = m3.tokenizer.encode
    monkeypatch.setattr(m3.tokenizer, "encode", lambda t: encoded.append(t) or encode(t))
    pieces = Synthesizer(m3, SynthesisOptions(split=True)).pieces(SynthesisRequest("x", text))
    said = [t for t in encoded if t != CV3_DEFAULT_PROMPT]
    assert len(said) == len(set(said)) and text in said
    assert len(pieces) > 1 and " ".join(r.text for r, _ in pieces) == text
    for r, prep in pieces:
        assert r.id.startswith("x#") and prep == prepare(m3, SynthesisRequest("y", r.text))


def test_spec_numbers_per_kind():
    cv2, cv3 = SpeechLMSpec("cosyvoice2"), SpeechLMSpec("cosyvoice3")
    assert (cv2.speech_rows, cv2.eos, cv2.fill, list(cv2.stop_ids), cv2.head_bias) == (6564, 6561, 6563,
                                                                                       [6561, 6562, 6563], True)
    assert (cv3.speech_rows, cv3.eos, cv3.fill, cv3.head_bias) == (6761, 6562, 6564, False)
    assert cv3.stop_ids == range(6561, 6761) and cv2.min_length_mask_id == cv3.min_length_mask_id == 6561
    assert cv2.lengths(7) == (14, 140)


def test_vocab_layout_maps_round_trip():
    cv2 = SpeechLMSpec("cosyvoice2")
    v = vllm_layout(cv2, pad_to=64)
    assert v.size == 6592 and v.from_native([0, 6561]) == [0, 6561] and v.to_native([6563]) == [6563]
    with pytest.raises(ValueError):
        v.to_native([6564])  # padding row
    m = merged_layout(cv2, text_vocab=151665)
    assert m.from_native([0, 6560, 6561]) == [151665, 158225, 158226]
    assert (m.sos, m.task) == (151665 + 6564, 151665 + 6565) and m.size % 128 == 0
    assert m.to_native(m.from_native(list(range(0, 6564, 97)))) == list(range(0, 6564, 97))
    with pytest.raises(ValueError):
        m.to_native([42])  # a text row
    cv3 = merged_layout(SpeechLMSpec("cosyvoice3"), text_vocab=1000, pad_to=1)
    assert (cv3.sos, cv3.task, cv3.size) == (1000 + S, 1000 + S + 2, 1000 + 6761)
    probs = torch.arange(float(m.size))[None]
    assert torch.equal(probs[:, m.native_index()][0, :3], torch.tensor([151665.0, 151666.0, 151667.0]))


def test_safe_yaml_never_runs_tags(tmp_path, ckpts):
    cfg = read_hyperpyyaml(ckpts["cosyvoice3", None] / "cosyvoice3.yaml")
    assert isinstance(cfg["llm"], Tagged) and cfg["llm"].target == "cosyvoice.llm.llm.CosyVoice3LM"
    assert cfg["llm"].get("llm_input_size") == 32  # !ref resolved
    assert cfg["flow"].get("decoder").get("estimator").get("static_chunk_size") == 8  # !ref arithmetic
    assert cfg["__set_seed1"] == Tagged("apply", "random.seed", [1986])  # recorded, not called
    bad = tmp_path / "bad.yaml"
    marker = tmp_path / "ran"
    bad.write_text(f"x: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ValueError):
        read_hyperpyyaml(bad)
    bad.write_text("x: !ref <y> + __import__('os').getpid()\ny: 1\n")
    with pytest.raises(ValueError):
        read_hyperpyyaml(bad)
    assert not marker.exists()


def test_special_tokens_order_and_ids(ckpts):
    assert special_tokens("cosyvoice2")[:3] == ["<|im_start|>", "<|im_end|>", "<|endofprompt|>"]
    assert len(special_tokens("cosyvoice2")) == 19 and special_tokens("cosyvoice3")[19] == "<|endofsystem|>"
    m = load_cosyvoice(str(ckpts["cosyvoice3", None]))
    # as in Qwen (151643 + 3 -> 151646): 260 byte-level/merge ids, then <|endoftext|>, <|im_start|>,
    # <|im_end|>; the added list's <|im_start|>/<|im_end|> exist already, so <|endofprompt|> comes next
    assert m.tokenizer.endofprompt == 263
    assert len(m.tokenizer) == 263 + len(special_tokens("cosyvoice3")) - 2


def test_resolution_offline(tmp_path, monkeypatch, ckpts):
    monkeypatch.setenv("SPECLI_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ModelLoadError, match="llm.pt, cosyvoice3.yaml") as err:
        resolve_cosyvoice("cosyvoice3")
    assert "never downloads" in str(err.value) and "models/cosyvoice3" in str(err.value)
    snap = tmp_path / "hub" / "models--FunAudioLLM--CosyVoice2-0.5B" / "snapshots" / "abc"
    write_checkpoint(snap, "cosyvoice2")
    assert resolve_cosyvoice("cosyvoice2") == snap
    (snap / "llm.pt").unlink()
    with pytest.raises(ModelLoadError, match="lacks llm.pt"):
        resolve_cosyvoice("cosyvoice2")
    with pytest.raises(ModelLoadError, match="missing llm.pt"):
        resolve_cosyvoice(str(snap))
    with pytest.raises(ModelLoadError, match="neither"):
        resolve_cosyvoice(str(tmp_path / "nope"))


def test_checkpoint_shape_errors(tmp_path):
    d = write_checkpoint(tmp_path / "cv2", "cosyvoice2")
    sd = torch.load(d / "llm.pt", weights_only=True)
    del sd["llm_decoder.bias"]
    torch.save(sd, d / "llm.pt")
    with pytest.raises(ModelLoadError, match="llm_decoder.bias"):
        load_cosyvoice(str(d))


def test_cosyvoice_lm_tree_scoring_equals_chains(ckpts):
    from specli.core.tree import tree_inputs

    lm = load_cosyvoice(str(ckpts["cosyvoice2", None])).lm
    prompt = torch.tensor([lm.layout.prompt([70, 71, 72], [], [9])])
    parents, toks = [-1, 0, -1, 2], [11, 12, 13, 14]
    s = lm.start(32)
    lm.score(s, prompt)
    mask, pos = tree_inputs(parents, s.length)
    tree = lm.score(s, torch.tensor([[5, *toks]]), positions=pos, tree_mask=mask).logits[0]
    for node, path in {1: [0, 1], 3: [2, 3]}.items():
        c = lm.start(32)
        lm.score(c, prompt)
        chain = lm.score(c, torch.tensor([[5, *[toks[i] for i in path]]])).logits[0]
        assert torch.allclose(tree[node + 1], chain[-1], atol=1e-4, rtol=0)


def test_cv3_default_prompt_only_when_no_marker(ckpts):
    m3 = load_cosyvoice(str(ckpts["cosyvoice3", None]))
    tok = m3.tokenizer
    plain = prepare(m3, SynthesisRequest("x", "hi"))
    assert plain.prompt[1:-1] == [m3.lm.layout.text_base + t for t in tok.encode(CV3_DEFAULT_PROMPT + "hi")]
    inline = prepare(m3, SynthesisRequest("x", "Be calm.<|endofprompt|>hi"))  # cross-lingual style: counted
    assert inline.prompt[1:-1] == [m3.lm.layout.text_base + t for t in tok.encode("Be calm.<|endofprompt|>hi")]
    assert inline.text_tokens == len(tok.encode("Be calm.<|endofprompt|>hi"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cosyvoice2", "cosyvoice3"])
def test_real_checkpoint_matches_upstream_procedure(name):
    """Real weights when present offline ($SPECLI_MODELS_DIR or the HF cache); skipped otherwise."""
    try:
        path = resolve_cosyvoice(name)
    except ModelLoadError:
        pytest.skip(f"{name} weights are not available offline")
    model = load_cosyvoice(name)
    text = "Hello."
    ptext = CV3_DEFAULT_PROMPT if name == "cosyvoice3" else ""
    res = _greedy(model, SynthesisRequest("u", text, ptext))
    tok = model.tokenizer
    ref = upstream_inference(path, name, tok.encode(text), tok.encode(ptext) if ptext else [], [], _argmax, steps=24)
    assert res.tokens[:24] == ref[:24]
