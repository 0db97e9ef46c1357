"""Presets of the benchmark suite (``preset=<name>``); a package so Hydra's pkg:// search path finds it."""
