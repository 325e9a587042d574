"""The Qwen3-Omni thinker (``Qwen3OmniMoeForConditionalGeneration`` loaded with ``enable_audio_output=False``: the
talker is never built) as a transcription target: transformers' AuT audio encoder encodes each 30-s window; the
lean static-cache decoder (:mod:`specli.models.qwen2`, Qwen3 blocks with sparse MoE MLPs) scores, with 1-D
RoPE at position + the row's M-RoPE offset."""
