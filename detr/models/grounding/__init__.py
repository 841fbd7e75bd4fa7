"""Grounding DINO and MM-Grounding-DINO: open-vocabulary detection from a text prompt (see model.py)."""
