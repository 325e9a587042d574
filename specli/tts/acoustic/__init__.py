"""CosyVoice acoustic stages ported natively (inference only): prompt frontend, features, HiFT vocoder.

- :mod:`specli.tts.acoustic.features`: Kaldi fbank, Whisper log-mel, 24 kHz prompt mel (torch only).
- :mod:`specli.tts.acoustic.frontend`: :class:`Frontend` (speech tokenizer + CAM++ ONNX models via
  onnxruntime, stored speakers) -> :class:`PromptInputs`.
- :mod:`specli.tts.acoustic.hift`: :func:`load_hift` -> :class:`HiFT` (``vocode(mel, generator)``).
- :mod:`specli.tts.acoustic.hifigan`: :func:`load_hifigan` -> :class:`HifiGan` (HiFi-GAN V1, 22.05 kHz; specli-en).
- :mod:`specli.tts.acoustic.spec`: :class:`AcousticSpec`, a model directory's rates and sizes from its yaml.
- :mod:`specli.tts.acoustic.checkpoint`: strict ``torch.load(weights_only=True)`` state-dict loading with
  weight-norm folding, shared by the acoustic checkpoints.
- :mod:`specli.tts.acoustic.flow`: :func:`load_flow` of ``flow.pt`` -> CosyVoice3 ``FlowCV3`` (DiT,
  :mod:`~specli.tts.acoustic.flow_cv3`) or CosyVoice2 ``FlowCV2`` (conformer + U-Net,
  :mod:`~specli.tts.acoustic.flow_cv2`); conditional flow matching in :mod:`~specli.tts.acoustic.cfm`.
- :mod:`specli.tts.acoustic.pipeline`: :class:`Vocalizer` (speech tokens -> mel -> audio for a model directory).
"""

from specli.tts.acoustic.flow import load_flow
from specli.tts.acoustic.frontend import Frontend, PromptInputs, StoredSpeaker, load_speakers
from specli.tts.acoustic.hifigan import HifiGan, load_hifigan
from specli.tts.acoustic.hift import HiFT, HiFTConfig, load_hift
from specli.tts.acoustic.spec import AcousticSpec, acoustic_spec
from specli.tts.acoustic.pipeline import VoicePrompt, Vocalizer

__all__ = ["AcousticSpec", "Frontend", "HiFT", "HiFTConfig", "HifiGan", "PromptInputs", "StoredSpeaker", "VoicePrompt",
           "Vocalizer", "acoustic_spec", "load_flow", "load_hift", "load_hifigan", "load_speakers"]
