"""The AuT audio encoder's bookkeeping, shared by Qwen3-ASR and the Qwen3-Omni thinker (transformers runs the
encoder itself).

AuT cuts a window's log-mel into chunks of ``2 * n_window`` frames (100: one second); three stride-2
convolutions turn a full chunk into 13 positions, and only the positions of real frames are kept, packed over
the batch. :func:`unpack` spreads them back into ``[B, A, hidden]`` rows, each window's first
``audio_positions(frames)`` rows real (as the processors count the ``<|audio_pad|>`` tokens).
:func:`processor_features` computes a window's features as the processors do (``padding=True``: the window
alone, not padded to 30 s first), then zero-pads them to the 30-s frame count (frames the encoder masks).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from specli.io.audio import SAMPLE_RATE

N_FRAMES = 3000  # mel frames of a 30-s window


def _conv_length(frames: int) -> int:
    """Positions after the three (kernel 3, stride 2, padding 1) convolutions; zero stays zero."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1 if frames > 0 else 0
    return frames


def audio_positions(frames: int, n_window: int = 50) -> int:
    """Audio embeddings of ``frames`` real mel frames (transformers' ``_get_feat_extract_output_lengths``: full
    chunks of ``2 * n_window`` frames, 13 positions each at the default, then the last partial chunk)."""
    chunk = 2 * n_window
    return (frames // chunk) * _conv_length(chunk) + _conv_length(frames % chunk)


def unpack(packed: torch.Tensor, frames: Sequence[int], n_window: int, total_frames: int) -> torch.Tensor:
    """``packed [sum of real positions, hidden]`` (rows one after another) -> ``[B, A, hidden]``, ``A`` the
    positions of ``total_frames`` frames; each row's positions past its own are zero."""
    counts = [audio_positions(f, n_window) for f in frames]
    out = packed.new_zeros(len(counts), audio_positions(total_frames, n_window), packed.shape[-1])
    for row, part in enumerate(packed.split(counts)):
        out[row, : part.shape[0]] = part
    return out


def processor_features(extractor, audio: np.ndarray) -> tuple[torch.Tensor, int]:
    """The processor's log-mel of one window (``padding=True``), zero-padded to ``[1, n_mels, 3000]``, and its
    real frames (the feature extractor's attention mask)."""
    out = extractor(np.asarray(audio, dtype=np.float32), sampling_rate=SAMPLE_RATE, padding=True,
                    return_attention_mask=True, return_tensors="pt")
    mel, frames = out["input_features"].float(), int(out["attention_mask"].sum())
    return torch.nn.functional.pad(mel, (0, N_FRAMES - mel.shape[2])), min(frames, N_FRAMES)
