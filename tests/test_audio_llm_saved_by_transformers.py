"""Audio-LLM directories as transformers >= 5 saves them (``model.save_pretrained(d); processor.save_pretrained(d)``:
the feature extractor's settings nested in ``processor_config.json``, no ``preprocessor_config.json``) load, and
`specli transcribe --model DIR --dtype float32 --temperature-increment-on-fallback 0` gives transformers'
``generate(do_sample=False)`` ids on them; the older layout (``preprocessor_config.json``) reads the same settings."""

from __future__ import annotations

import json
import shutil

import pytest
import soundfile as sf
import torch
from click.testing import CliRunner

from conftest import EN_CLIPS
from qwen2_audio_fixtures import write_tiny_qwen2_audio
from qwen3_asr_fixtures import write_tiny_qwen3_asr
from qwen3_omni_fixtures import write_tiny_qwen3_omni
from specli.cli import main
from specli.models.qwen2_audio.loader import load_qwen2_audio
from specli.models.qwen3_asr.loader import load_qwen3_asr
from specli.models.qwen3_omni.loader import load_qwen3_omni
from specli.models.speech import WindowPrompt

# family -> (tiny writer, specli loader, transformers class, its feature-mask argument, extra from_pretrained kwargs)
FAMILIES = {
    "qwen2-audio": (write_tiny_qwen2_audio, load_qwen2_audio, "Qwen2AudioForConditionalGeneration",
                    "feature_attention_mask", {}),
    "qwen3-asr": (write_tiny_qwen3_asr, load_qwen3_asr, "Qwen3ASRForConditionalGeneration", "input_features_mask", {}),
    "qwen3-omni": (write_tiny_qwen3_omni, load_qwen3_omni, "Qwen3OmniMoeForConditionalGeneration",
                   "feature_attention_mask", {"enable_audio_output": False}),
}

# family -> (seed of the tiny random model, a clip it decodes without a loop: the repetition guard would cut one)
LOOP_FREE = {"qwen2-audio": (0, 3), "qwen3-asr": (3, 3), "qwen3-omni": (1, 1)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """(name, directory written by transformers' save_pretrained)."""
    seed = LOOP_FREE[request.param][0]
    return request.param, FAMILIES[request.param][0](tmp_path_factory.mktemp(request.param) / "tiny", seed=seed)


def _hf_greedy(name, path, prompt, mel, frames, max_new):
    """transformers' own greedy continuation of ``prompt`` (the model loaded from ``path`` by transformers)."""
    import transformers

    _, _, cls, mask_arg, kwargs = FAMILIES[name]
    hf = getattr(transformers, cls).from_pretrained(str(path), dtype=torch.float32, **kwargs).eval()
    eos = hf.generation_config.eos_token_id  # the directory's generation_config.json
    hf = getattr(hf, "thinker", hf)  # Qwen3-Omni: the thinker generates text (its own config has no eos)
    ids = torch.tensor([prompt])
    mask = (torch.arange(mel.shape[2]) < frames).long()[None]
    out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), input_features=mel,
                      max_new_tokens=max_new, do_sample=False, eos_token_id=eos, **{mask_arg: mask})
    return out[0, ids.shape[1]:].tolist()


def test_transcribe_gives_generates_greedy_ids(family, tmp_path):
    name, path = family
    assert not (path / "preprocessor_config.json").exists()  # the layout transformers >= 5 writes
    assert json.loads((path / "processor_config.json").read_text())["feature_extractor"]["feature_size"] == 16
    clip = EN_CLIPS[LOOP_FREE[name][1]]
    res = CliRunner().invoke(main, ["transcribe", "--model", str(path), str(clip), "-f", "json", "-o", str(tmp_path),
                                    "--dtype", "float32", "--temperature-increment-on-fallback", "0",
                                    "--language", "en"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    record = json.loads((tmp_path / f"{clip.stem}.json").read_text())
    assert record["stats"]["trimmed_windows"] == 0
    segments = record["segments"]
    ours = [t for s in segments for t in s["tokens"]]
    model = FAMILIES[name][1](str(path), "float32")
    hooks = model.speech_hooks()
    audio, _ = sf.read(str(clip), dtype="float32")
    mel, frames = hooks.features(audio)
    job = hooks.window_job(WindowPrompt("transcribe", "en", (), (), True, (-1,), 224, frames, None))
    theirs = _hf_greedy(name, path, job.prompt, mel, frames, 224)  # the CLI's tokens per window at most
    assert len(ours) >= 10 and len(segments) == 1
    assert theirs in (ours, ours + [job.eot])  # the 224-token cap, or generate's eot


def test_the_older_layout_reads_the_same_settings(family, tmp_path):
    """A processor saved by transformers 4 (``processor_config.json`` without the nested settings) beside the
    feature extractor's own ``preprocessor_config.json``: the same features."""
    name, path = family
    old = tmp_path / "old"
    shutil.copytree(path, old)
    from transformers import AutoFeatureExtractor

    AutoFeatureExtractor.from_pretrained(str(path)).save_pretrained(str(old))  # preprocessor_config.json
    cfg = json.loads((old / "processor_config.json").read_text())
    del cfg["feature_extractor"]
    (old / "processor_config.json").write_text(json.dumps(cfg))
    load = FAMILIES[name][1]
    audio, _ = sf.read(str(EN_CLIPS[2]), dtype="float32")
    new_mel, new_frames = load(str(path), "float32").speech_hooks().features(audio)
    old_mel, old_frames = load(str(old), "float32").speech_hooks().features(audio)
    assert torch.equal(new_mel, old_mel) and new_frames == old_frames
