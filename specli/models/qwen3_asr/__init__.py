"""Qwen3-ASR (``Qwen3ASRForConditionalGeneration``, the ``-hf`` checkpoints) as a transcription target:
transformers' AuT audio encoder and projector encode each 30-s window; the lean static-cache decoder
(:mod:`specli.models.qwen2`, Qwen3 blocks) scores."""
