"""Hydra configs shipped with the package (``pkg://sample_fast.configs``)."""
