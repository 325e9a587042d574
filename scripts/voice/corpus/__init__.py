"""The corpus stage: fortune sentences spoken by piper (piper.py), or as text only (texts.py)."""
