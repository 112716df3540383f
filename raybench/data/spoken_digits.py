"""spoken-digits: an embedded, WILDS-shaped 1-D signal benchmark: the digit a synthetic voice says, across voices.

Why it exists: DABS (the domain-agnostic benchmark for self-supervised learning) is about one model across
modalities, and raybench had images and text but no signal dataset that runs offline. This one is synthesised on the
user's machine by Debian's `espeak-ng` (`apt-get install espeak-ng`; GPL-3+, /usr/share/doc/espeak-ng/copyright),
trains on a CPU in minutes, and has a genuine shift between speakers, with unlabeled speech from the target voices
for pre-training and adaptation. Only espeak-ng's own formant voices are used (language + variant, e.g. `en-us+m3`);
the `mb/` voices need mbrola and are left out.

Task: 10-way classification of a spoken English digit, "zero" .. "nine" (`WORDS`). Chance is 1/10 on every
labeled split: each is balanced by digit.

Examples: one utterance is espeak-ng's WAV (22,050 Hz, 16 bit, mono) for one word at one pitch and speed. It
is trimmed of silence, placed at a random onset in a window of `WINDOW_SAMPLES`, mixed with white noise at a
random SNR (so silence has a floor, as in a recording), and turned into a log-mel spectrogram with
`torch.stft`: `N_BANDS` triangular mel bands (F_MIN .. F_MAX Hz) by `N_FRAMES` frames, in dB below the
utterance's loudest cell, clipped at DB_RANGE dB and stored as uint8. An example is a signal of shape
(N_BANDS, N_FRAMES) = (32, 64), declared a spectrogram (`input_layout`): `dabs_transformer` cuts it into 2-D
patches of 8 bands x 8 frames, as DABS cuts its log-mel speech inputs (32 tokens).

Domains (ids index DOMAIN_NAMES; the group id equals the domain id) are voices (`SPEAKERS`):
  - `source-*`: five ordinary voices, male and female, US, British and RP accents (train, id_val, id_test,
    train_unlabeled);
  - `ood-val-klatt-*`: two voices of espeak-ng's Klatt synthesiser, another voice source and spectral
    shape (val, val_unlabeled);
  - `ood-test-whisper*`: two whispered voices, breath noise in place of a voiced source (test, test_unlabeled);
  - `extra-*`: a Caribbean, a Scottish and a creaky voice (extra_unlabeled only).
  Every voice speaks over the same grid of pitches (espeak-ng -p, PITCHES) and speeds (-s, SPEEDS, words per
  minute). Voices are named `language+variant`; espeak-ng 1.51 ignores a variant after `en-gb` (it says plain
  en-gb) and says an unknown variant in the default voice, both silently, hence `en+m3` rather than
  `en-gb+m3` (tests/test_spoken_digits.py checks that every domain sounds different).

Splits and sizes (utterances per digit and domain in SPLIT_PLAN, x 10 digits):
  train 5 x 20 x 10 = 1,000; id_val 5 x 4 x 10 = 200; id_test 200; train_unlabeled 5 x 10 x 10 = 500;
  val 2 x 10 x 10 = 200; val_unlabeled 200; test 200; test_unlabeled 2 x 15 x 10 = 300;
  extra_unlabeled 3 x 10 x 10 = 300. 3,100 utterances in all.

Disjointness, by construction: an utterance is (voice, word, pitch, speed), and espeak-ng says it the same
way every time. For each domain and digit the (pitch, speed) grid is permuted with a seeded generator and
dealt out in consecutive runs to the splits that use the domain, so no utterance is in two splits (the
random onset and noise never make one utterance count as two). ID and OOD splits share no voice.

Determinism: the dealing draws from generators seeded from a hash of the seed, the domain and the digit;
each utterance's onset and noise from a generator seeded from a hash of the seed and the utterance itself,
so the result does not depend on the order in which the thread pool finishes. The same seed, espeak-ng
build and torch build give the same bytes. The result is cached as `data_dir/spoken-digits/<key>.npz`, `key`
hashing every generation parameter (not the espeak-ng version: delete the file after upgrading it), written
atomically and rebuilt when unreadable or mis-shaped (raybench.data.cache.load_npz_or_rebuild).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from raybench.data import DATASETS
from raybench.data.base import (
    LABELED_SPLITS,
    USUAL_ALIGNMENT_PENALTIES,
    MissingSourceError,
    ShiftDataset,
    Task,
    TaskKind,
    TrainDefaults,
    Views,
    domain_split,
)
from raybench.data.cache import load_npz_or_rebuild
from raybench.metrics import accuracy, macro_f1

FORMAT_VERSION = 1
WORDS: tuple[str, ...] = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
N_CLASSES = len(WORDS)

SAMPLE_RATE = 22_050  # what espeak-ng writes
N_FFT = 512  # 23 ms analysis window
HOP = 320  # 14.5 ms between frames
N_FRAMES = 64
N_BANDS = 32
F_MIN, F_MAX = 80.0, 8_000.0
DB_RANGE = 80.0
WINDOW_SAMPLES = (N_FRAMES - 1) * HOP + N_FFT  # 0.94 s: the frames of torch.stft(center=False)
TRIM_LEVEL = 0.02  # of the peak amplitude: quieter samples at either end are silence
SNR_DB: tuple[float, float] = (20.0, 40.0)

ESPEAK_ENV = "RAYBENCH_ESPEAK_NG"
ESPEAK_PACKAGE = "espeak-ng"
WORKERS = 4  # espeak-ng processes at once: most of each one is start-up (loading its libraries and data)
TIMEOUT_S = 30.0

PITCHES: tuple[int, ...] = tuple(range(20, 81, 5))
SPEEDS: tuple[int, ...] = tuple(range(140, 241, 10))


@dataclass(frozen=True)
class Speaker:
    """One domain: an espeak-ng voice (language + variant) and the pitches and speeds it speaks at."""

    name: str
    voice: str
    pitches: tuple[int, ...] = PITCHES
    speeds: tuple[int, ...] = SPEEDS


SOURCE_SPEAKERS: tuple[Speaker, ...] = (
    Speaker("source-us-m1", "en-us+m1"),
    Speaker("source-gb-m3", "en+m3"),
    Speaker("source-rp-m2", "en-gb-x-rp+m2"),
    Speaker("source-us-f1", "en-us+f1"),
    Speaker("source-gb-f3", "en+f3"),
)
VAL_SPEAKERS: tuple[Speaker, ...] = (  # Klatt's formant synthesiser: another voice source and spectrum
    Speaker("ood-val-klatt-us", "en-us+klatt"),
    Speaker("ood-val-klatt4-gb", "en+klatt4"),
)
TEST_SPEAKERS: tuple[Speaker, ...] = (  # whispered: breath noise instead of a voiced source, no pitch
    Speaker("ood-test-whisper-us", "en-us+whisper"),
    Speaker("ood-test-whisperf-gb", "en+whisperf"),
)
EXTRA_SPEAKERS: tuple[Speaker, ...] = (
    Speaker("extra-caribbean-f2", "en-029+f2"),
    Speaker("extra-scotland-m4", "en-gb-scotland+m4"),
    Speaker("extra-croak", "en+croak"),
)
SPEAKERS: tuple[Speaker, ...] = SOURCE_SPEAKERS + VAL_SPEAKERS + TEST_SPEAKERS + EXTRA_SPEAKERS
DOMAIN_NAMES: tuple[str, ...] = tuple(s.name for s in SPEAKERS)

# split -> {domain name: utterances per digit}; a domain's splits are dealt its grid in this order
Plan = Mapping[str, Mapping[str, int]]
SPLIT_PLAN: dict[str, dict[str, int]] = {
    "train": {s.name: 20 for s in SOURCE_SPEAKERS},
    "id_val": {s.name: 4 for s in SOURCE_SPEAKERS},
    "id_test": {s.name: 4 for s in SOURCE_SPEAKERS},
    "val": {s.name: 10 for s in VAL_SPEAKERS},
    "test": {s.name: 10 for s in TEST_SPEAKERS},
    "train_unlabeled": {s.name: 10 for s in SOURCE_SPEAKERS},
    "val_unlabeled": {s.name: 10 for s in VAL_SPEAKERS},
    "test_unlabeled": {s.name: 15 for s in TEST_SPEAKERS},
    "extra_unlabeled": {s.name: 10 for s in EXTRA_SPEAKERS},
}


class SynthesisError(RuntimeError):
    """espeak-ng ran but gave no usable WAV for an utterance."""


@dataclass(frozen=True)
class Utterance:
    """One word in one voice at one pitch and speed: espeak-ng says it identically every time."""

    domain: str
    voice: str
    digit: int
    pitch: int
    speed: int

    @property
    def word(self) -> str:
        return WORDS[self.digit]


# ---------------------------------------------------------------- espeak-ng


def espeak_binary(binary: str | None = None) -> str:
    """The espeak-ng executable: `binary`, else `$RAYBENCH_ESPEAK_NG`, else `espeak-ng` on PATH; one line if absent."""
    name = binary or os.environ.get(ESPEAK_ENV) or ESPEAK_PACKAGE
    found = shutil.which(name)
    if found is None:
        raise MissingSourceError(f"spoken-digits needs {name}, the synthesiser of the Debian package {ESPEAK_PACKAGE}, "
                                 f"which is missing: apt-get install {ESPEAK_PACKAGE} (or set {ESPEAK_ENV} to its path)")
    return found


def parse_wav(data: bytes) -> np.ndarray:
    """16-bit mono PCM samples of a WAV as espeak-ng streams it to stdout.

    A streamed WAV cannot know its length when the header is written, so espeak-ng's RIFF and data sizes
    are placeholders: the data chunk is taken to run to the end of the bytes.
    """
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise SynthesisError("not a WAV file")
    at = 12
    fmt: tuple[int, ...] | None = None
    while at + 8 <= len(data):
        chunk, size = data[at:at + 4], struct.unpack("<I", data[at + 4:at + 8])[0]
        if chunk == b"fmt ":
            fmt = struct.unpack("<HHIIHH", data[at + 8:at + 24])
        elif chunk == b"data":
            if fmt is None or fmt[0] != 1 or fmt[1] != 1 or fmt[2] != SAMPLE_RATE or fmt[5] != 16:
                raise SynthesisError(f"expected 16-bit mono PCM at {SAMPLE_RATE} Hz, got format {fmt}")
            body = data[at + 8:]
            return np.frombuffer(body[:len(body) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0
        at += 8 + size + (size & 1)
    raise SynthesisError("no data chunk")


def synthesise(utterance: Utterance, binary: str) -> np.ndarray:
    """The utterance's waveform, float32 in [-1, 1], from one espeak-ng process."""
    command = [binary, "--stdout", "-v", utterance.voice, "-p", str(utterance.pitch), "-s", str(utterance.speed),
               utterance.word]
    done = subprocess.run(command, capture_output=True, timeout=TIMEOUT_S, check=False)
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()
        raise SynthesisError(f"{' '.join(command)} failed ({done.returncode}): {detail[0] if detail else ''}")
    wave = parse_wav(done.stdout)
    if not np.any(wave):
        raise SynthesisError(f"{' '.join(command)} wrote only silence (is the voice {utterance.voice!r} installed?)")
    return wave


def synthesise_all(utterances: Sequence[Utterance], binary: str, workers: int = WORKERS) -> list[np.ndarray]:
    """Every waveform, in the order given: a small pool of threads, each waiting on its own espeak-ng process."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda u: synthesise(u, binary), utterances))


# ---------------------------------------------------------------- signal processing


def rng_for(seed: int, *parts: Any) -> np.random.Generator:
    """A generator private to (seed, parts), independent of global RNG and of the order of other draws."""
    digest = hashlib.sha256(json.dumps([seed, *parts]).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def trim_silence(wave: np.ndarray) -> np.ndarray:
    """The wave from its first to its last sample above TRIM_LEVEL of its peak: espeak-ng pads words with silence."""
    loud = np.flatnonzero(np.abs(wave) > TRIM_LEVEL * np.abs(wave).max())
    return wave[loud[0]:loud[-1] + 1]


def place_in_window(wave: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The trimmed word at a random onset in a window of WINDOW_SAMPLES, plus white noise at a random SNR.

    The onset varies so that position is not a cue; the noise gives silence a floor, as in a recording, so the
    dB scale below the loudest cell means the same for every voice. A word longer than the window keeps its start.
    """
    word = trim_silence(wave)[:WINDOW_SAMPLES]
    window = np.zeros(WINDOW_SAMPLES, dtype=np.float64)
    onset = int(rng.integers(0, WINDOW_SAMPLES - len(word) + 1))
    window[onset:onset + len(word)] = word
    snr = rng.uniform(*SNR_DB)
    rms = math.sqrt(float(np.mean(word.astype(np.float64) ** 2)))
    window += rng.standard_normal(WINDOW_SAMPLES) * rms * 10 ** (-snr / 20)
    return window.astype(np.float32)


def hz_to_mel(hz: Tensor) -> Tensor:
    return 2595.0 * torch.log10(1.0 + hz / 700.0)


def mel_to_hz(mel: Tensor) -> Tensor:
    return 700.0 * (10 ** (mel / 2595.0) - 1.0)


@cache
def mel_filterbank() -> Tensor:
    """(N_BANDS, N_FFT // 2 + 1) triangular filters evenly spaced in mel between F_MIN and F_MAX (HTK's mel scale)."""
    edges = mel_to_hz(torch.linspace(float(hz_to_mel(torch.tensor(F_MIN))), float(hz_to_mel(torch.tensor(F_MAX))),
                                     N_BANDS + 2, dtype=torch.float64))
    bins = torch.linspace(0, SAMPLE_RATE / 2, N_FFT // 2 + 1, dtype=torch.float64)
    low, centre, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising, falling = (bins - low) / (centre - low), (high - bins) / (high - centre)
    return torch.clamp(torch.minimum(rising, falling), min=0.0).float()


def log_mel(windows: Tensor) -> Tensor:
    """uint8 (N, N_BANDS, N_FRAMES) spectrograms of float (N, WINDOW_SAMPLES) windows: dB below each one's
    loudest cell, clipped at DB_RANGE and scaled to 0..255 (so loudness, which espeak-ng fixes, is no cue)."""
    spectrum = torch.stft(windows, n_fft=N_FFT, hop_length=HOP, window=torch.hann_window(N_FFT), center=False,
                          return_complex=True)
    power = mel_filterbank() @ spectrum.abs().square()
    db = 10.0 * torch.log10(power.clamp_min(1e-12))
    db = (db - db.amax(dim=(1, 2), keepdim=True)).clamp(min=-DB_RANGE)
    return ((db + DB_RANGE) * (255.0 / DB_RANGE)).round().to(torch.uint8)


# ---------------------------------------------------------------- the split plan


def deal_utterances(plan: Plan, seed: int) -> dict[str, list[Utterance]]:
    """Each split's utterances: per domain and digit, the (pitch, speed) grid, permuted, is dealt out to the
    splits in plan order, so no utterance is in two splits. Within a split: by domain, then digit."""
    dealt: dict[str, list[Utterance]] = {split: [] for split in plan}
    for speaker in SPEAKERS:
        users = [(split, counts[speaker.name]) for split, counts in plan.items() if counts.get(speaker.name)]
        grid = [(p, s) for p in speaker.pitches for s in speaker.speeds]
        needed = sum(n for _, n in users)
        if needed > len(grid):
            raise ValueError(f"spoken-digits: domain {speaker.name!r} needs {needed} utterances per digit, its "
                             f"grid of pitches and speeds has {len(grid)}")
        for digit in range(N_CLASSES):
            order = rng_for(seed, "deal", speaker.name, digit).permutation(len(grid))
            at = 0
            for split, n in users:
                for p, s in (grid[i] for i in order[at:at + n]):
                    dealt[split].append(Utterance(speaker.name, speaker.voice, digit, int(p), int(s)))
                at += n
    order_of = {s.name: i for i, s in enumerate(SPEAKERS)}
    return {split: sorted(us, key=lambda u: (order_of[u.domain], u.digit, u.pitch, u.speed))
            for split, us in dealt.items()}


def split_size(plan: Plan, split: str) -> int:
    return sum(plan[split].values()) * N_CLASSES


# ---------------------------------------------------------------- generation and cache


def render(utterances: Sequence[Utterance], waves: Sequence[np.ndarray], seed: int) -> np.ndarray:
    """uint8 (N, N_BANDS, N_FRAMES) spectrograms; each utterance's onset and noise from its own generator."""
    if not utterances:
        return np.zeros((0, N_BANDS, N_FRAMES), dtype=np.uint8)
    windows = [place_in_window(w, rng_for(seed, "render", asdict(u))) for u, w in zip(utterances, waves)]
    return log_mel(torch.from_numpy(np.stack(windows))).numpy()


def generate(seed: int, plan: Plan = SPLIT_PLAN, binary: str | None = None,
             workers: int = WORKERS) -> dict[str, np.ndarray]:
    """All splits of `plan` as flat arrays `<split>.x` (uint8 spectrograms), `.domain`, `.pitch`, `.speed` and,
    when labeled, `.y`; pitch and speed identify an utterance (with its domain and digit)."""
    found = espeak_binary(binary)
    dealt = deal_utterances(plan, seed)
    everything = [u for split in plan for u in dealt[split]]
    waves = synthesise_all(everything, found, workers)
    x = render(everything, waves, seed)
    arrays: dict[str, np.ndarray] = {}
    at = 0
    for split in plan:
        us = dealt[split]
        arrays[f"{split}.x"] = x[at:at + len(us)]
        arrays[f"{split}.domain"] = np.array([DOMAIN_NAMES.index(u.domain) for u in us], dtype=np.int64)
        arrays[f"{split}.pitch"] = np.array([u.pitch for u in us], dtype=np.int64)
        arrays[f"{split}.speed"] = np.array([u.speed for u in us], dtype=np.int64)
        if split in LABELED_SPLITS:
            arrays[f"{split}.y"] = np.array([u.digit for u in us], dtype=np.int64)
        at += len(us)
    return arrays


def expected_layout(plan: Plan = SPLIT_PLAN) -> tuple[dict[str, tuple[int, ...]], dict[str, type]]:
    """The cache's array names, shapes and dtypes, from `plan`: anything else is a corrupted cache."""
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, type] = {}
    for split in plan:
        n = split_size(plan, split)
        shapes[f"{split}.x"], dtypes[f"{split}.x"] = (n, N_BANDS, N_FRAMES), np.uint8
        for field in ("domain", "pitch", "speed") + (("y",) if split in LABELED_SPLITS else ()):
            shapes[f"{split}.{field}"], dtypes[f"{split}.{field}"] = (n,), np.int64
    return shapes, dtypes


def generation_params(seed: int, plan: Plan = SPLIT_PLAN) -> dict[str, Any]:
    """Everything the bytes depend on besides espeak-ng and torch; its hash names the cache file."""
    return {
        "format": FORMAT_VERSION, "seed": seed, "words": WORDS, "sample_rate": SAMPLE_RATE, "n_fft": N_FFT,
        "hop": HOP, "frames": N_FRAMES, "bands": N_BANDS, "f_range": [F_MIN, F_MAX], "db_range": DB_RANGE,
        "trim": TRIM_LEVEL, "snr_db": SNR_DB, "speakers": [asdict(s) for s in SPEAKERS],
        "plan": [[split, sorted(counts.items())] for split, counts in plan.items()],
    }


def cache_key(seed: int, plan: Plan = SPLIT_PLAN) -> str:
    return hashlib.sha256(json.dumps(generation_params(seed, plan), sort_keys=True).encode()).hexdigest()[:16]


def cache_path(data_dir: Path, seed: int, plan: Plan = SPLIT_PLAN) -> Path:
    return Path(data_dir) / "spoken-digits" / f"{cache_key(seed, plan)}.npz"


def load_or_generate(path: Path, seed: int, plan: Plan = SPLIT_PLAN,
                     binary: str | None = None) -> dict[str, np.ndarray]:
    """The cached arrays at `path`; a missing, truncated or mis-shaped cache is (re)generated and saved."""
    shapes, dtypes = expected_layout(plan)
    return load_npz_or_rebuild(path, shapes, lambda: generate(seed, plan, binary), dtypes=dtypes)


# ---------------------------------------------------------------- views


def normalise(x: Tensor) -> Tensor:
    """uint8 dB codes -> floats in [-1, 1] (-1: DB_RANGE below the loudest cell)."""
    return x.float().div(127.5).sub(1.0)


def random_time_shift(x: Tensor, max_shift: int) -> Tensor:
    """Per-example shift along time by up to `max_shift` frames, the edge frames repeated into the gap."""
    n, _, t = x.shape
    shift = torch.randint(-max_shift, max_shift + 1, (n, 1, 1), device=x.device)
    columns = (torch.arange(t, device=x.device).view(1, 1, t) - shift).clamp(0, t - 1)
    return x.gather(2, columns.expand_as(x))


def random_masks(x: Tensor, dim: int, count: int, width: int) -> Tensor:
    """SpecAugment's masks: `count` bands of up to `width` rows (dim 1) or frames (dim 2) per example, set to the
    example's mean."""
    n, size = x.shape[0], x.shape[dim]
    index = torch.arange(size, device=x.device).view(1, size)
    masked = torch.zeros(n, size, dtype=torch.bool, device=x.device)
    for _ in range(count):
        w = torch.randint(0, width + 1, (n, 1), device=x.device)
        start = (torch.rand(n, 1, device=x.device) * (size - w + 1)).long()
        masked |= (index >= start) & (index < start + w)
    shape = (n, size, 1) if dim == 1 else (n, 1, size)
    return torch.where(masked.view(shape), x.mean(dim=(1, 2), keepdim=True), x)


@dataclass(frozen=True)
class SignalViews:
    """plain: normalised; weak: + a random time shift; strong: + SpecAugment's frequency and time masks
    (Park et al., 2019), the audio counterpart of RandAugment + Cutout that FixMatch-style methods use on speech."""

    max_shift: int = 6
    freq_masks: int = 2
    freq_width: int = 4
    time_masks: int = 2
    time_width: int = 8

    def plain(self, x: Tensor) -> Tensor:
        return normalise(x)

    def weak(self, x: Tensor) -> Tensor:
        return normalise(random_time_shift(x, self.max_shift))

    def strong(self, x: Tensor) -> Tensor:
        x = self.weak(x)
        x = random_masks(x, 1, self.freq_masks, self.freq_width)
        return random_masks(x, 2, self.time_masks, self.time_width)

    def as_views(self) -> Views:
        return Views(plain=self.plain, weak=self.weak, strong=self.strong)


# ---------------------------------------------------------------- the dataset


def accuracy_metric(outputs: Tensor, y: Tensor, group: Tensor) -> float:
    return accuracy(outputs, y)


def macro_f1_metric(outputs: Tensor, y: Tensor, group: Tensor) -> float:
    return macro_f1(outputs, y, n_classes=N_CLASSES)


def load_spoken_digits(data_dir: Path, seed: int, plan: Plan = SPLIT_PLAN,
                       binary: str | None = None) -> ShiftDataset:
    """The dataset from its cache under `data_dir`, synthesised with espeak-ng if needed (`plan`: smaller builds)."""
    arrays = load_or_generate(cache_path(data_dir, seed, plan), seed, plan, binary)
    splits = {name: domain_split(name, arrays) for name in plan}
    return ShiftDataset(
        name="spoken-digits",
        task=Task(TaskKind.CLASSIFICATION, N_CLASSES),
        splits=splits,
        metrics={"acc": accuracy_metric, "macro_f1": macro_f1_metric},
        selection_metric="val/acc",
        # TrainDefaults' own: Adam at lr 1e-3, no weight decay, batch 64, 10 epochs, k = 3 from test_unlabeled.
        defaults=TrainDefaults(model="dabs_transformer_small", algorithm_hparams=USUAL_ALIGNMENT_PENALTIES),
        views=SignalViews().as_views(),
        domain_names=DOMAIN_NAMES,
        input_shape=(N_BANDS, N_FRAMES),
        input_layout="spectrogram",
        description="Spoken digits (espeak-ng) as log-mel spectrograms: 5 source voices; OOD: held-out accents "
                    "(val), whispered and creaky voices (test).",
        info={name: str(len(split)) for name, split in splits.items()},
    )


@DATASETS.register("spoken-digits")
def build_spoken_digits(data_dir: Path, seed: int) -> ShiftDataset:
    """Spoken digits across espeak-ng voices (needs Debian espeak-ng)."""
    return load_spoken_digits(data_dir, seed)
