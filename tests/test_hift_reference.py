"""specli's HiFT vocoder against a readable transcription of upstream's computation (``hift_reference``).

Tiny random checkpoints of both kinds in upstream's key layout (``acoustic_fixtures``), tuned so that every
branch runs: F0 straddles the 10 Hz voicing threshold, and the +-0.99 clamp bites. Both sides get the same
mel and the same random numbers: the noise is what specli draws from the caller's generator (one-second
blocks, rebuilt here independently of specli), and the transcription gets a random nonzero initial
harmonic phase, which specli does not draw (its docstring: no effect on the output; this proves it).

What is compared, in pipeline order, so that a failure names its stage:
- F0 per frame;
- the harmonics + noise excitation and the merged source, given the same F0 (the run's, and a designed
  track: unvoiced, exactly at the threshold, speech range, above the harmonics' wrap-around);
- each generator module (conv_pre, ups, source_downs, source_resblocks, resblocks, conv_post) on the very
  input specli gave it ("forward by forward": no accumulated error);
- the end-to-end trace of every stage and the waveform.

Tolerances (float32, CPU, 1 or 2 threads: both sides run the same kernels at the same thread count):
- F0: CosyVoice3 runs the predictor in float64, as upstream (weights folded in float64 too): 1e-9 Hz
  (float64 round-off is ~1e-14 Hz here; folding in float32 first gave 2e-8), and the float32 F0 the sine
  source gets must be equal to the bit. CosyVoice2 runs it in float32, where specli's weight-norm fold
  (``g * v / ||v||``) and upstream's ``torch._weight_norm`` round some weights one ulp apart: rtol 5e-7
  (a few ulps; observed 1 ulp on 4 of 202 frames).
- Why F0 to the bit matters: the sine phase is ``cumsum(F0 / 24000) * 2 pi * 480`` in float32 (~1e4-1e5 rad
  for speech), so one ulp of F0 in one frame moves every later phase by up to ~1e-3 rad and the audio by
  ~1e-4. CosyVoice3's end-to-end comparison is therefore fully independent (its float64 F0 rounds to the
  same float32), while CosyVoice2's takes specli's F0 (teacher forcing; its F0 is compared on its own).
- Sine excitation and source, given the same F0: 1e-6 abs (values within +-0.4 and +-1; the same float32
  operations in the same order: observed equal to the bit).
- Modules on the same input: 1e-5 abs (activations up to ~11; weights folded one ulp apart; observed 5e-6).
- End-to-end stages: 2e-5 abs (module errors accumulated over ~25 layers; observed <= 6e-6).
- Waveform: 5e-6 abs (samples in [-0.99, 0.99]; observed <= 1.2e-6).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path

import hift_reference as ref
import pytest
import torch
from acoustic_fixtures import official_hift_state, tiny_hift_config
from torch import nn
from torch.utils.hooks import RemovableHandle

from specli.tts.acoustic.hift import HiFT, HiFTConfig, load_hift

NOISE_BLOCK = 24000  # specli draws its source noise in one-second blocks of this many samples
F0_TOL_CV3_HZ = 1e-9
F0_RTOL_CV2 = 5e-7
SOURCE_TOL = 1e-6
MODULE_TOL = 1e-5
STAGE_TOL = 2e-5
AUDIO_TOL = 5e-6
LOUDER = {"cosyvoice2": 0.3, "cosyvoice3": 1.3}  # added to conv_post's log-magnitude bias

# (kind, mel frames, finalize, batch): 9 frames = one noise block; 101 frames = 48480 samples = 3 blocks;
# streaming 60 frames: F0 of 57 frames, 27360 samples, 2 blocks
CASES = [("cosyvoice2", 9, True, 1), ("cosyvoice2", 101, True, 2), ("cosyvoice3", 9, True, 1),
         ("cosyvoice3", 101, True, 2), ("cosyvoice3", 12, False, 1), ("cosyvoice3", 60, False, 1)]
CASE_IDS = [f"{k[-1]}-{t}{'' if f else '-stream'}-b{b}" for k, t, f, b in CASES]


def _mel(frames: int, batch: int = 1) -> torch.Tensor:  # [B, 80, T], rows independent of T (prefixes)
    rows = [torch.randn(1, 80, 130, generator=torch.Generator().manual_seed(11 + b)) - 3.0 for b in range(batch)]
    return torch.cat(rows)[:, :, :frames]


@lru_cache(maxsize=None)
def _tuned_state(kind: str, style: str) -> tuple[HiFTConfig, dict[str, torch.Tensor]]:
    cfg = tiny_hift_config(kind)
    state = official_hift_state(cfg, style)  # type: ignore[arg-type]
    probe = dict(state, **{"f0_predictor.classifier.bias": torch.tensor([1000.0])})  # no abs folding
    pre = ref.f0_predictor(ref.UpstreamWeights(probe), _mel(130).double(), cfg.causal) - 1000.0  # [1, T]
    median = float(pre[:, 4:-4].median())  # the edge frames (zero padding) are outliers
    state["f0_predictor.classifier.bias"] = torch.tensor([10.0 - median])  # F0 straddles the 10 Hz threshold
    bins = cfg.n_fft // 2 + 1
    state["conv_post.bias"] = state["conv_post.bias"].clone()
    state["conv_post.bias"][:bins] += LOUDER[kind]
    return cfg, state


def tuned_state(kind: str, style: str) -> tuple[HiFTConfig, dict[str, torch.Tensor]]:
    """A tiny random ``hift.pt`` state (upstream layout) whose F0 on ``_mel(130)`` is ~10 +- 0.5 Hz, half
    the frames on either side of the voicing threshold, and whose audio exceeds the clamp in places."""
    cfg, state = _tuned_state(kind, style)
    return cfg, dict(state)


def specli_noise(seed: int, batch: int, samples: int, width: int, gaussian: bool) -> torch.Tensor:
    """The source noise specli's ``vocode(..., torch.Generator().manual_seed(seed))`` uses: [batch, 24000,
    width] blocks (CV2 ``randn``, CV3 ``rand``) drawn one after another, concatenated in time, cut."""
    gen = torch.Generator().manual_seed(seed)
    draw = torch.randn if gaussian else torch.rand
    blocks = [draw(batch, NOISE_BLOCK, width, generator=gen) for _ in range(-(-samples // NOISE_BLOCK))]
    return torch.cat(blocks, dim=1)[:, :samples]  # [B, L, H]


def _module_names(cfg: HiFTConfig) -> list[str]:
    """specli's generator modules in pipeline order (upstream's names)."""
    names = ["conv_pre"]
    kernels = len(cfg.resblock_kernel_sizes)
    for i in range(len(cfg.upsample_rates)):
        names += [f"ups.{i}", f"source_downs.{i}", f"source_resblocks.{i}"]
        names += [f"resblocks.{i * kernels + j}" for j in range(kernels)]
    return names + ["conv_post"]


@dataclass
class Run:
    """One specli ``vocode`` with every stage's input and output captured, and what the reference needs."""

    cfg: HiFTConfig
    args: ref.UpstreamHiFTArgs
    weights: ref.UpstreamWeights
    mel: torch.Tensor  # [B, 80, T]
    finalize: bool
    noise: torch.Tensor  # [B, T' * 480, H]
    rand_ini: torch.Tensor  # [B, H]
    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]


def _capture(model: HiFT, names: list[str], inputs: dict[str, torch.Tensor],
             outputs: dict[str, torch.Tensor]) -> list[RemovableHandle]:
    """Record each named submodule's first input and its output on every forward."""

    def hook(name: str, _module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        inputs[name], outputs[name] = args[0].clone(), out.clone()

    return [model.get_submodule(n).register_forward_hook(partial(hook, n)) for n in names]


def make_run(tmp: Path, kind: str, frames: int, finalize: bool, batch: int) -> Run:
    cfg, state = tuned_state(kind, "old" if kind == "cosyvoice2" else "param")
    path = tmp / f"{kind}.pt"
    torch.save({f"generator.{k}": v for k, v in state.items()}, path)  # as shipped: with the prefix
    model = load_hift(path, cfg)
    inputs: dict[str, torch.Tensor] = {}
    outputs: dict[str, torch.Tensor] = {}
    handles = _capture(model, ["f0_predictor", "m_source", "m_source.l_linear", *_module_names(cfg)], inputs, outputs)
    mel = _mel(frames, batch)
    outputs["audio"] = model.vocode(mel, torch.Generator().manual_seed(5), finalize=finalize)
    for handle in handles:
        handle.remove()
    f0_frames = outputs["f0_predictor"].shape[1]
    noise = specli_noise(5, batch, f0_frames * cfg.samples_per_frame, cfg.nb_harmonics + 1, not cfg.causal)
    rand_ini = torch.rand(batch, cfg.nb_harmonics + 1, generator=torch.Generator().manual_seed(99))
    rand_ini[:, 0] = 0  # upstream: "no noise for fundamental component"
    return Run(cfg, ref.UpstreamHiFTArgs(causal=cfg.causal), ref.UpstreamWeights(state), mel, finalize, noise,
               rand_ini, inputs, outputs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Run]:
    cache: dict[tuple, Run] = {}

    def get(kind: str, frames: int, finalize: bool, batch: int) -> Run:
        key = (kind, frames, finalize, batch)
        if key not in cache:
            cache[key] = make_run(tmp_path_factory.mktemp("hift"), *key)
        return cache[key]

    return get


def _close(name: str, actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float = 0.0) -> None:
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, msg=lambda m: f"stage {name}: {m}")


# --- the transcription on its own ------------------------------------------------------------------------


# scipy.signal.get_window("hann", 16, fftbins=True).astype(np.float32) (scipy 1.17.1), printed with repr
SCIPY_HANN_16 = [0.0, 0.03806023299694061, 0.1464466154575348, 0.30865827202796936, 0.5, 0.6913416981697083,
                 0.8535534143447876, 0.9619397521018982, 1.0, 0.9619397521018982, 0.8535534143447876,
                 0.6913416981697083, 0.5, 0.30865827202796936, 0.1464466154575348, 0.03806023299694061]


def test_reference_window_is_scipys() -> None:
    assert torch.equal(ref.hann_window(16), torch.tensor(SCIPY_HANN_16))


def test_specli_window_is_upstreams() -> None:
    """Bit for bit (torch.hann_window in float32 is one ulp off scipy's in places, below the STFT tolerance)."""
    assert torch.equal(HiFT(tiny_hift_config("cosyvoice3")).stft_window, torch.tensor(SCIPY_HANN_16))


@pytest.mark.parametrize("kind", ["cosyvoice2", "cosyvoice3"])
def test_random_initial_phase_has_no_effect(kind: str) -> None:
    """Upstream adds ``rand_ini`` to the first *sample*'s phase increment, then resamples the increments to
    the frame rate linearly (x 1/480), which reads samples 480 t + 239 and 240 only: sample 0 is never read."""
    cfg, state = tuned_state(kind, "param")
    args, weights = ref.UpstreamHiFTArgs(causal=cfg.causal), ref.UpstreamWeights(state)
    f0 = torch.linspace(0.0, 300.0, 130)[None]  # [1, T]: unvoiced and voiced frames
    noise = specli_noise(1, 1, 130 * 480, 9, gaussian=not cfg.causal)
    zero = ref.source_from_f0(weights, f0, noise, torch.zeros(1, 9), args)
    rand_ini = torch.rand(1, 9, generator=torch.Generator().manual_seed(3)) * 0.9 + 0.05
    rand_ini[:, 0] = 0
    assert torch.equal(ref.source_from_f0(weights, f0, noise, rand_ini, args), zero)


# --- specli vs the transcription -----------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "frames", "finalize", "batch"), CASES, ids=CASE_IDS)
def test_f0_per_frame(runs: Callable[..., Run], kind: str, frames: int, finalize: bool, batch: int) -> None:
    run = runs(kind, frames, finalize, batch)
    mel = run.mel.double() if run.cfg.causal else run.mel
    expected = ref.f0_predictor(run.weights, mel, run.cfg.causal, finalize)  # [B, T']
    actual = run.outputs["f0_predictor"]
    if run.cfg.causal:
        assert actual.dtype == torch.float64
        _close("f0_predictor", actual, expected, atol=F0_TOL_CV3_HZ)
        assert torch.equal(actual.float(), expected.float()), "CV3 F0 after the cast to float32 differs"
    else:
        _close("f0_predictor", actual, expected, atol=0.0, rtol=F0_RTOL_CV2)
    if frames == 101:  # the tuned checkpoint exercises both sides of the voicing threshold
        assert bool((expected < 10).any()) and bool((expected > 10).any())


@pytest.mark.parametrize(("kind", "frames", "finalize", "batch"), CASES, ids=CASE_IDS)
def test_source_given_f0(runs: Callable[..., Run], kind: str, frames: int, finalize: bool, batch: int) -> None:
    """SineGen2 + SourceModuleHnNSF on specli's F0, with the noise specli drew and a random initial phase."""
    run = runs(kind, frames, finalize, batch)
    trace: ref.Trace = {}
    f0 = run.outputs["f0_predictor"].float()  # what both feed the source (CV3: float64 -> float32)
    ref.source_from_f0(run.weights, f0, run.noise, run.rand_ini, run.args, trace)
    _close("excitation", run.inputs["m_source.l_linear"], trace["sine_waves"], atol=SOURCE_TOL)
    _close("m_source", run.outputs["m_source"], trace["m_source"], atol=SOURCE_TOL)


def _f0_track() -> torch.Tensor:
    """[2, 130] F0 (Hz): unvoiced; around and exactly at the 10 Hz threshold (``f0 > 10`` is unvoiced at
    10.0); the speech range; above 2667 Hz, where the 9th harmonic's increment ``f0 * 9 / 24000`` wraps
    (upstream's ``% 1``). The second row is the first reversed."""
    row = torch.cat([torch.zeros(5), torch.linspace(5.0, 15.0, 21), torch.full((4,), 10.0),
                     torch.linspace(80.0, 400.0, 60), torch.tensor([3000.0, 5000.0, 11999.0]),
                     torch.linspace(400.0, 60.0, 32), torch.zeros(5)])
    return torch.stack([row, row.flip(0)])


@pytest.mark.parametrize("kind", ["cosyvoice2", "cosyvoice3"])
def test_source_on_a_designed_f0_track(tmp_path: Path, kind: str) -> None:
    """specli's ``m_source`` and upstream's SineGen2 + SourceModuleHnNSF on the same F0 track (3 noise blocks)."""
    cfg, state = tuned_state(kind, "param")
    torch.save(state, tmp_path / "hift.pt")
    model = load_hift(tmp_path / "hift.pt", cfg)
    inputs: dict[str, torch.Tensor] = {}
    outputs: dict[str, torch.Tensor] = {}
    _capture(model, ["m_source.l_linear"], inputs, outputs)
    f0 = _f0_track()
    with torch.no_grad():
        source = model.m_source(f0, torch.Generator().manual_seed(7))  # [2, 1, 130 * 480]
    noise = specli_noise(7, 2, 130 * 480, cfg.nb_harmonics + 1, gaussian=not cfg.causal)
    rand_ini = torch.rand(2, cfg.nb_harmonics + 1, generator=torch.Generator().manual_seed(8))
    rand_ini[:, 0] = 0
    trace: ref.Trace = {}
    args = ref.UpstreamHiFTArgs(causal=cfg.causal)
    ref.source_from_f0(ref.UpstreamWeights(state), f0, noise, rand_ini, args, trace)
    _close("excitation", inputs["m_source.l_linear"], trace["sine_waves"], atol=SOURCE_TOL)
    _close("m_source", source, trace["m_source"], atol=SOURCE_TOL)


@pytest.mark.parametrize(("kind", "frames", "finalize", "batch"), CASES, ids=CASE_IDS)
def test_modules_forward_by_forward(runs: Callable[..., Run], kind: str, frames: int, finalize: bool,
                                    batch: int) -> None:
    """Each generator module of specli against upstream's, on the input specli gave it."""
    run = runs(kind, frames, finalize, batch)
    for name in _module_names(run.cfg):
        expected = ref.forward_module(run.weights, name, run.inputs[name], run.args, finalize)
        _close(name, run.outputs[name], expected, atol=MODULE_TOL)


@pytest.mark.parametrize(("kind", "frames", "finalize", "batch"), CASES, ids=CASE_IDS)
def test_end_to_end(runs: Callable[..., Run], kind: str, frames: int, finalize: bool, batch: int) -> None:
    """The whole inference, every stage in pipeline order, then the waveform (see the module docstring for
    why CosyVoice2's later stages run on specli's F0)."""
    run = runs(kind, frames, finalize, batch)
    trace: ref.Trace = {}
    f0 = None if run.cfg.causal else run.outputs["f0_predictor"]
    audio, _ = ref.inference(run.weights, run.mel, run.noise, run.rand_ini, run.args, finalize, trace, f0=f0)
    expected_len = (frames if finalize else frames - run.cfg.held_back_frames) * run.cfg.samples_per_frame
    assert audio.shape == run.outputs["audio"].shape == (batch, expected_len)
    if run.cfg.causal:
        assert torch.equal(run.outputs["f0_predictor"].float(), trace["f0_predictor"].float())
    _close("excitation", run.inputs["m_source.l_linear"], trace["sine_waves"], atol=SOURCE_TOL)
    _close("m_source", run.outputs["m_source"], trace["m_source"], atol=SOURCE_TOL)
    _close("s_stft", run.inputs["source_downs.0"], trace["s_stft"], atol=STAGE_TOL)
    for name in _module_names(run.cfg):
        _close(name, run.outputs[name], trace[name], atol=STAGE_TOL)
    _close("audio", run.outputs["audio"], audio, atol=AUDIO_TOL)
    clipped = float((audio.abs() >= run.args.audio_limit).float().mean())
    assert 0.0 < clipped < 0.5, f"the clamp should bite on some samples (clipped fraction {clipped})"
