"""Qwen2-Audio (``Qwen2AudioForConditionalGeneration``) as a transcription target: transformers' audio tower
and projector encode each 30-s window; a lean static-cache Qwen2 decoder (:mod:`specli.models.qwen2`) scores."""
