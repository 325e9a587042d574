"""Distillation of EAGLE Speech-Draft heads: on-policy data (``data``) and unrolled training (``train``)."""
