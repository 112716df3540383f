"""The eight real WILDS 2.0 datasets, loaded through the `wilds` package (see compat.py for the patches)."""
