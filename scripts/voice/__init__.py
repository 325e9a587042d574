"""specli-en's build: ``python -m scripts.voice STAGE --work DIR`` (build.py), modules grouped by stage."""
