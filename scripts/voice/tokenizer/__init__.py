"""The tokenizer and tokens stages: whisper-base encoder + FSQ as one ONNX file (cli.py), the corpus's tokens."""
