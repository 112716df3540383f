"""Sweeps: search spaces, the Ray backend (Tune + Optuna + Train), selection, replicates and results."""
