"""specli: offline batch speech transcription, translation and synthesis with lossless speculative decoding."""

__version__ = "0.1.0"
