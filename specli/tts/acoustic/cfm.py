"""Conditional flow matching shared by the CosyVoice2/3 flow stages (inference only).

A port of upstream's ``CausalConditionalCFM`` (``cosyvoice/flow/flow_matching.py``):

- the start point is a **fixed** noise buffer, ``randn([1, 80, 15000])`` drawn right after seeding
  torch with 0 (upstream ``set_all_random_seed(0)``), sliced to the mel length; so the noise of a mel
  frame depends on its position only (what keeps streaming chunks consistent, and makes the flow stage
  deterministic whatever the run seed);
- ``n_timesteps`` (10) Euler steps over ``t = 1 - cos(pi/2 * linspace(0, 1, n + 1))`` (cosine schedule);
- classifier-free guidance: the estimator runs on a batch of two, the second row with ``mu``, speaker and
  prompt condition zeroed, and ``v = (1 + w) v_cond - w v_uncond`` with ``w = 0.7``.

Also here: upstream's CosyVoice3 rule that drops silent speech tokens after 5 in a row before the flow
stage (``CosyVoice3Model.llm_job``; the LLM context keeps them), and small yaml helpers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from specli.models.cosyvoice.yaml import whole_number

__all__ = ["CFMSettings", "SILENT_TOKENS_CV3", "attention_mask", "chunk_attention_mask", "drop_silent_runs",
           "fixed_noise", "solve_cfm", "timestep_sinusoid", "yaml_args"]

NOISE_FRAMES = 50 * 300  # upstream's buffer: 300 s of 50 Hz mel frames
NOISE_SEED = 0  # upstream: set_all_random_seed(0) right before drawing the buffer
# FSQ codes upstream's CosyVoice3Model treats as silence / breath (cosyvoice/cli/model.py)
SILENT_TOKENS_CV3 = frozenset({1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323})
MAX_SILENT_RUN = 5  # silent tokens kept in a row; later ones are dropped (CosyVoice3 only)

_noise_cache: dict[int, torch.Tensor] = {}


class Estimator(Protocol):
    """The velocity estimator a CFM solve calls (the UNet, CosyVoice 2; the DiT, CosyVoice 3)."""

    row_segments: bool  # takes ``segments``: several utterances in one padded batch (TokenFlow.inference_rows)

    def __call__(self, *args: torch.Tensor, **kwargs: object) -> torch.Tensor:
        """``(x [2, 80, T], mask [2, 1, T], mu [2, C, T], t [2], spks [2, 80], cond [2, 80, T]) -> [2, 80, T]``."""


@dataclass(frozen=True)
class CFMSettings:
    """The ``cfm_params`` of the yaml that inference reads."""

    n_timesteps: int = 10  # Euler steps (upstream passes 10 from flow.inference; a voice's yaml may set its own)
    inference_cfg_rate: float = 0.7  # classifier-free guidance weight w
    t_scheduler: Literal["cosine", "linear"] = "cosine"  # cosine: t = 1 - cos(pi t / 2); linear: t as is
    mel_bins: int = 80  # channels of the noise / output mel

    def __post_init__(self) -> None:
        if self.n_timesteps < 1:
            raise ValueError("n_timesteps must be >= 1")
        if self.inference_cfg_rate < 0:
            raise ValueError("inference_cfg_rate must be >= 0")
        if self.t_scheduler not in ("cosine", "linear"):
            raise ValueError(f"t_scheduler {self.t_scheduler!r} is not supported (cosine, linear)")
        if self.mel_bins != 80:
            raise ValueError("the fixed noise buffer has 80 channels; mel_bins must be 80")

    @classmethod
    def from_yaml(cls, decoder: Any) -> CFMSettings:
        """From the flow's ``decoder: !new:...CausalConditionalCFM`` node (defaults where absent)."""
        params = yaml_args(yaml_args(decoder).get("cfm_params"))
        content = params.get("content", params)
        content = content if isinstance(content, dict) else {}
        solver = content.get("solver", "euler")
        if solver != "euler":
            raise ValueError(f"cfm solver {solver!r} is not supported (euler)")
        # n_timesteps is specli's own optional key (upstream's flow.inference passes 10 and never reads it): a voice
        # trained to decode in fewer steps says so in its yaml; official yamls lack it and keep 10
        return cls(n_timesteps=whole_number(content.get("n_timesteps", 10), "cfm_params n_timesteps"),
                   inference_cfg_rate=float(content.get("inference_cfg_rate", 0.7)),
                   t_scheduler=content.get("t_scheduler", "cosine"))


def yaml_args(node: Any) -> dict[str, Any]:
    """The keyword arguments of a HyperPyYAML ``!new:`` node (a plain dict passes through; else empty)."""
    value = getattr(node, "value", node)
    return dict(value) if isinstance(value, dict) else {}


def fixed_noise(frames: int, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """``[1, 80, frames]`` of upstream's fixed noise buffer (frames <= 15000)."""
    if frames > NOISE_FRAMES:
        raise ValueError(f"{frames} mel frames exceed the flow's fixed noise buffer ({NOISE_FRAMES} frames, 300 s)")
    if NOISE_SEED not in _noise_cache:
        gen = torch.Generator(device="cpu").manual_seed(NOISE_SEED)
        _noise_cache[NOISE_SEED] = torch.randn(1, 80, NOISE_FRAMES, generator=gen, device="cpu")
    return _noise_cache[NOISE_SEED][:, :, :frames].to(device=device, dtype=dtype)


def time_span(settings: CFMSettings, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """The ``n + 1`` times of the Euler solver, float like upstream's ``linspace`` (+ cosine warp)."""
    span = torch.linspace(0, 1, settings.n_timesteps + 1, device=device, dtype=dtype)
    if settings.t_scheduler == "cosine":
        span = 1 - torch.cos(span * 0.5 * math.pi)
    return span


@torch.inference_mode()
def solve_cfm(estimator: Estimator, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor,
              settings: CFMSettings, lengths: Sequence[int] | None = None, **estimator_kwargs: Any) -> torch.Tensor:
    """Mel ``[N, 80, T]`` from ``mu [N, C, T]``, ``mask [N, 1, T]``, ``spks [N, 80]``, ``cond [N, 80, T]``.

    Upstream's ``solve_euler`` step for step: the same float operations in the same order (``t`` is
    advanced by ``dt`` and the next ``dt`` is ``t_span[k + 1] - t``), CFG on a batch of two an utterance
    (rows ``[cond 0, uncond 0, cond 1, ...]``). Several utterances (``N > 1``, padded to ``T``) need
    ``lengths``, their frames, which the estimator gets as ``segments`` (row-segment estimators only,
    :class:`specli.tts.acoustic.flow_cv3.DiT`); every utterance starts from the same fixed noise.
    """
    n, frames = mu.shape[0], mu.shape[2]
    if n > 1 and lengths is None:
        raise ValueError("several utterances need their lengths")
    x = fixed_noise(frames, mu.device, mu.dtype).expand(n, -1, -1)
    span = time_span(settings, mu.device, mu.dtype)
    t, dt = span[0].reshape(1), span[1] - span[0]
    guided = settings.inference_cfg_rate > 0
    per = 2 if guided else 1  # estimator rows an utterance
    rows = per * n
    x_in = x.new_zeros(rows, x.shape[1], frames)
    mu_in = mu.new_zeros(rows, *mu.shape[1:])
    spks_in = spks.new_zeros(rows, spks.shape[1])
    cond_in = cond.new_zeros(rows, *cond.shape[1:])
    mask_in = mask.repeat_interleave(per, dim=0).to(mu.dtype)
    mu_in[::per], spks_in[::per], cond_in[::per] = mu, spks, cond
    if lengths is not None:
        estimator_kwargs["segments"] = tuple((per, int(length)) for length in lengths)
    for step in range(1, len(span)):
        for k in range(per):
            x_in[k::per] = x
        t_in = t.expand(rows)
        velocity = estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in, **estimator_kwargs)
        if guided:
            w = settings.inference_cfg_rate
            velocity = (1.0 + w) * velocity[::2] - w * velocity[1::2]
        x = x + dt * velocity
        t = t + dt
        if step < len(span) - 1:
            dt = span[step + 1] - t
    return x.float()


def timestep_sinusoid(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Matcha / F5 ``SinusoidalPosEmb``: ``[sin | cos](1000 t * 10000^(-k / (dim/2 - 1)))``, ``[B] -> [B, dim]``."""
    half = dim // 2
    scale = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, device=t.device).float() * -scale)
    arg = 1000 * t[:, None].float() * freqs[None]
    return torch.cat([arg.sin(), arg.cos()], dim=-1).to(t.dtype)


def chunk_attention_mask(keys: torch.Tensor, chunk: int) -> torch.Tensor:
    """``[B, 1, T, T]`` bool: query i sees the unpadded keys before the end of its ``chunk``-frame chunk
    (upstream ``add_optional_chunk_mask`` with a static chunk; ``chunk <= 0``: every unpadded key)."""
    keys = keys.bool()  # [B, 1, T]
    n = keys.shape[2]
    if chunk <= 0:
        return keys.expand(-1, n, -1)[:, None]
    pos = torch.arange(n, device=keys.device)
    chunk_end = (pos // chunk + 1) * chunk
    return (keys & (pos[None, :] < chunk_end[:, None])[None])[:, None]


def attention_mask(keys: torch.Tensor, chunk: int) -> torch.Tensor | None:
    """:func:`chunk_attention_mask`, or None when every key is visible to every query (no chunks, no padding):
    the same attention, through scaled_dot_product_attention's fused kernels instead of a [T, T] mask."""
    if chunk <= 0 and bool(keys.bool().all()):
        return None
    return chunk_attention_mask(keys, chunk)


def drop_silent_runs(tokens: Sequence[int], silent: frozenset[int] = SILENT_TOKENS_CV3,
                     max_run: int = MAX_SILENT_RUN) -> list[int]:
    """Upstream's CosyVoice3 filter: keep at most ``max_run`` silent tokens in a row, drop the rest."""
    out, run = [], 0
    for tok in tokens:
        if tok in silent:
            run += 1
            if run > max_run:
                continue
        else:
            run = 0
        out.append(int(tok))
    return out
