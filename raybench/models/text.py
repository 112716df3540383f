"""A BERT-family encoder from a local folder as the featurizer of raw strings (civilcomments, amazon).

WILDS fine-tunes DistilBERT-base-uncased with max length 300 (civilcomments) or 512 (amazon); the
featurizer is the encoder's hidden state of the first ([CLS]) token, the head a linear layer on it (as in
WILDS' DistilBertFeaturizer + Linear). Any transformers encoder folder works (DistilBERT, BERT, MiniLM):
`spec.weights` is the folder with config.json, the weights and the tokenizer (e.g. one written by
`save_pretrained`), loaded with `local_files_only=True`; nothing is ever downloaded.

The featurizer owns its tokenizer, so inputs are lists of raw strings: each batch is tokenized with
truncation to `spec.input_shape[0]` tokens and padded to its longest string, on the device of the
encoder; the attention mask hides the padding, so a string's output does not depend on its batch.

transformers is imported when a model is built, not when raybench.models is imported.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from raybench.models.base import FeaturizerHead
from raybench.models.registry import MODELS, ModelSpec

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer.model", "vocab.json")


def check_model_folder(weights: Path | None, model: str) -> Path:
    """The local transformers folder, or a ValueError saying what to pass."""
    wanted = (f"model {model!r} needs model_weights=<folder with config.json, weights "
              f"({' or '.join(WEIGHT_FILES[:2])}) and tokenizer files>, e.g. distilbert-base-uncased "
              f"saved with save_pretrained; raybench never downloads weights")
    if weights is None:
        raise ValueError(f"{wanted}; got none")
    folder = Path(weights)
    if not folder.is_dir():
        raise ValueError(f"{wanted}; {str(folder)!r} is not a folder")
    missing = [what for what, names in (("config.json", ("config.json",)), ("weights", WEIGHT_FILES),
                                        ("tokenizer", TOKENIZER_FILES))
               if not any((folder / name).is_file() for name in names)]
    if missing:
        raise ValueError(f"{wanted}; {str(folder)!r} lacks {', '.join(missing)}")
    return folder


def prepared_attention_mask(model: Any, padding_mask: Tensor) -> Tensor | None:
    """The attention mask the transformers `model` would build from the tokenizer's (host) padding mask, built here instead.

    Given a 2-D mask, transformers checks on the device whether any token is padding, to drop the mask when none
    is (the fast attention kernels take no mask); that check makes the host wait for the GPU at every forward.
    The same check runs here on the host copy, before it moves: no padding gives no mask, as the library's own
    check would; padding gives the library's own 4-D mask for the configured attention, which it then uses as is.
    Attention implementations other than SDPA and eager are handed the 2-D mask, as before.
    """
    from transformers.masking_utils import create_bidirectional_mask

    device = model.get_input_embeddings().weight.device
    if model.config._attn_implementation not in ("sdpa", "eager"):
        return host_to(device, padding_mask)
    if padding_mask.all():
        return None
    shape_only = torch.empty(*padding_mask.shape, 0, dtype=model.dtype, device=device)  # as the embeddings' output
    return create_bidirectional_mask(model.config, shape_only, host_to(device, padding_mask),
                                     allow_is_bidirectional_skip=False)


class TextFeaturizer(nn.Module):
    """Raw strings -> the encoder's first-token hidden state, [batch, hidden_size]."""

    def __init__(self, folder: Path, max_length: int) -> None:
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        # float32 whatever the checkpoint stores: transformers 5 loads a half-precision checkpoint (common on the
        # Hub) in half precision, and the trainer's bf16 autocast expects float32 master weights (fp16 ones gave
        # a NaN loss at the second step of the GPU check)
        self.encoder = AutoModel.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
        # the tokenizer is plain (picklable) state, not a module: deepcopy copies it, state_dict skips it
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        limit = getattr(self.encoder.config, "max_position_embeddings", None)
        if limit is not None and max_length > limit:
            raise ValueError(f"max length {max_length} (input_shape[0]) exceeds the {limit} positions of {str(folder)!r}")
        self.max_length = max_length
        self.n_features = int(self.encoder.config.hidden_size)

    def tokenize(self, texts: Sequence[str]) -> dict[str, Any]:
        if isinstance(texts, str):
            raise TypeError("the text featurizer takes a batch (a list) of strings, got a single str")
        encoded = self.tokenizer(list(texts), truncation=True, max_length=self.max_length,
                                 padding="longest", return_tensors="pt")
        device = self.encoder.get_input_embeddings().weight.device
        # only what the encoder accepts (DistilBERT has no token_type_ids)
        inputs = {k: host_to(device, encoded[k]) for k in self.tokenizer.model_input_names if k in encoded}
        if "attention_mask" in inputs:
            inputs["attention_mask"] = prepared_attention_mask(self.encoder, encoded["attention_mask"])
        return inputs

    def forward(self, texts: Sequence[str]) -> Tensor:
        return self.encoder(**self.tokenize(texts)).last_hidden_state[:, 0]

    def compile_parts(self) -> list[nn.Module]:
        """The encoder alone for the `compile` setting: the tokenizer works on Python strings, which torch.compile
        cannot trace."""
        return [self.encoder]


def host_to(device: torch.device, tokens: Tensor) -> Tensor:
    """Token ids made on the host, copied to `device`: through page-locked memory to a GPU, so the copy is queued
    behind the step's work instead of waiting for it."""
    if device.type != "cuda":
        return tokens.to(device)
    return tokens.pin_memory().to(device, non_blocking=True)


@MODELS.register("distilbert")
def build_distilbert(spec: ModelSpec) -> FeaturizerHead:
    """A sequence classifier: [CLS] hidden state of the encoder in `spec.weights` -> Linear(hidden, n_outputs)."""
    folder = check_model_folder(spec.weights, "distilbert")
    if len(spec.input_shape) != 1 or spec.input_shape[0] < 2:
        raise ValueError(f"distilbert needs input_shape=(max_length,), got {spec.input_shape}")
    featurizer = TextFeaturizer(folder, max_length=int(spec.input_shape[0]))
    return FeaturizerHead(featurizer, featurizer.n_features, spec.n_outputs)
