"""Hydra config groups shipped as package data (read through importlib.resources)."""
