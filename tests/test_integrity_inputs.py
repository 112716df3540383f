"""Integrity first: inputs that used to crash or be silently accepted now fail (or heal) with one line naming them."""
from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from raybench.data import digits_shift as ds
from raybench.data.cache import load_npz_or_rebuild
from raybench.sweep.space import SpaceError, load_space
from raybench.trainer import ConfigError, TrainConfig

# ----- search-space files ------------------------------------------------------------------------
BAD_SPACES = [
    ("algorithm: erm\nfixed:\n  lr: .inf\n", "fixed.lr", "inf", "a finite positive number"),
    ("algorithm: erm\nfixed:\n  weight_decay: .nan\n", "fixed.weight_decay", "nan", "a finite number >= 0"),
    ("algorithm: dann\nfixed:\n  penalty: .inf\n", "fixed.penalty", "inf", "a finite number"),
    ("algorithm: dann\nsearch:\n  classifier_lr: {distribution: choice, values: [0.1, .nan]}\n",
     "search.classifier_lr.values[1]", "nan", "a finite number"),
    ("algorithm: erm\nsearch:\n  lr: {distribution: choice, values: [true, 0.1]}\n",
     "search.lr.values[0]", "True", "float (true/false is not a number)"),
    ("algorithm: dann\nsearch:\n  unlabeled_ratio: {distribution: choice, values: [3, true]}\n",
     "search.unlabeled_ratio.values[1]", "True", "int (true/false is not a number)"),
    ("algorithm: dann\nfixed:\n  penalty: false\n", "fixed.penalty", "False", "float (true/false is not a number)"),
    ("algorithm: erm\ndatasets:\n  digit-shift:\n    fixed: {patience: 2}\n",
     "datasets.digit-shift", "'digit-shift'", "a dataset name: one of amazon, camelyon17"),
    ("algorithm: erm\nalgorithm: dann\n", "line 2", "'algorithm'", "each key once per mapping (first on line 1)"),
    ("algorithm: erm\nfixed:\n  lr: 0.1\n  patience: 2\n  lr: 0.2\n", "line 5", "'lr'",
     "each key once per mapping (first on line 3)"),
    ("algorithm: erm\nsearch:\n  lr: {distribution: lr, distribution: choice}\n", "line 3", "'distribution'",
     "each key once per mapping (first on line 3)"),
]


def space_error(path: Path, text: str) -> str:
    """The one-line SpaceError that loading `text` as the space file `path` ends in."""
    path.write_text(text)
    with pytest.raises(SpaceError) as info:
        load_space(str(path))
    return str(info.value)


@pytest.mark.parametrize("text, key, value, expected", BAD_SPACES, ids=[f"{b[1]}-{b[2]}" for b in BAD_SPACES])
def test_bad_space_value_is_one_line_naming_it(text, key, value, expected, tmp_path):
    path = tmp_path / "bad.yaml"
    message = space_error(path, text)
    assert message.startswith(f"{path}: {key}: expected {expected}")
    assert message.endswith(f", got {value}") and "\n" not in message


def alias_bomb(levels: int, key: str = "description") -> str:
    """A space file whose `key` expands to 9^levels strings: each level is nine aliases of the one before."""
    lines = ["algorithm: erm", "a0: &a0 [" + ", ".join(['"lol"'] * 9) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines + [f"{key}: *a{levels - 1}"]) + "\n"


@pytest.mark.parametrize("text, size", [(alias_bomb(7), "got "), ("algorithm: erm\na: &a [1, *a]\n", "endless")])
def test_an_alias_bomb_is_refused_at_load_in_one_short_line(text, size, tmp_path):
    """A 9-level bomb (9^9 strings) once took 141 s and 19 GB before a gigabytes-long error; its size is now
    counted on the parsed graph, before any value is built (a 7-level one here: 4.8 million strings, so the
    test ends even when the bound is broken), and a recursive alias counts as endless."""
    path = tmp_path / "bomb.yaml"
    message = space_error(path, text)
    assert message.startswith(f"{path}: file: expected at most 20,000 values once its aliases are expanded")
    assert size in message and "\n" not in message and len(message) < 400
    got = message.rpartition("got ")[2]
    assert got.startswith("'endless") or int(got) > 2 * 9 ** 7  # the last level holds 9^7 strings, reached twice


def test_an_alias_that_stays_small_still_loads(tmp_path):
    """Aliases themselves are fine (raybench/search_spaces/erm.yaml shares one override between two datasets)."""
    path = tmp_path / "shared.yaml"
    path.write_text("algorithm: erm\ndatasets:\n  spuco-digits: &same {fixed: {patience: 2}}\n"
                    "  spuco-fashion: *same\n")
    assert load_space(str(path)).algorithm == "erm"


def test_a_long_bad_value_is_quoted_short(tmp_path):
    message = space_error(tmp_path / "long.yaml", "algorithm: " + "x" * 100_000 + "\n")
    assert "... (100,002 characters)" in message and len(message) < 1_000 and "\n" not in message


def test_unknown_override_dataset_lists_the_known_ones(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("algorithm: erm\ndatasets:\n  cifar10: {}\n")
    with pytest.raises(SpaceError, match=r"datasets\.cifar10: expected a dataset name: one of .*digits-shift.*spuco-digits"):
        load_space(str(path))


def test_non_utf8_space_file_names_the_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("algorithm: erm\n# learning rate \u00e0 la WILDS\nfixed: {patience: 2}\n".encode("latin-1"))
    with pytest.raises(SpaceError) as info:
        load_space(str(path))
    assert str(info.value) == f"{path}: line 2: expected UTF-8 text, got b'\\xe0'"


def test_merge_keys_may_still_override_what_they_merge(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("algorithm: erm\nfixed: &base {patience: 2, grad_accum: 2}\n"
                    "datasets:\n  digits-shift:\n    fixed:\n      <<: *base\n      patience: 3\n")
    space = load_space(str(path))
    assert space.datasets["digits-shift"]["fixed"] == {"patience": 3, "grad_accum": 2}


def test_duplicate_key_exits_2_on_the_command_line(tmp_path, capsys, monkeypatch):
    from raybench.cli import main

    path = tmp_path / "dup.yaml"
    path.write_text("algorithm: erm\nfixed:\n  lr: 0.1\n  lr: 0.01\n")
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(path), "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"raybench: error: {path}: line 4: expected each key once per mapping (first on line 3), got 'lr'"


# ----- TrainConfig ------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["lr", "weight_decay", "momentum", "grad_clip"])
@pytest.mark.parametrize("text", ["inf", "nan"])
def test_non_finite_trainer_float_is_refused(key, text):
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_flat({key: text})
    assert info.value.key == key
    assert str(info.value).startswith(f"{key}: expected a finite ") and str(info.value).endswith(f", got {text}")


def test_lr_inf_message():
    with pytest.raises(ConfigError, match=r"^lr: expected a finite positive number, got inf$"):
        TrainConfig.from_flat({"lr": "inf"})


@pytest.mark.parametrize("algorithm, key", [("dann", "penalty"), ("dann", "classifier_lr"),
                                            ("fixmatch", "threshold"), ("dfr", "reference_lr")])
def test_non_finite_hyperparameter_is_refused(algorithm, key):
    with pytest.raises(ConfigError, match=rf"^{key}: expected a finite number, got -?inf$"):
        TrainConfig.from_flat({"algorithm": algorithm, key: "-inf"})


@pytest.mark.parametrize("key, kind", [("lr", "float"), ("unlabeled_ratio", "int"), ("penalty", "float")])
def test_boolean_where_a_number_belongs_is_refused(key, kind):
    with pytest.raises(ConfigError, match=rf"^{key}: expected {kind} \(true/false is not a number\), got True$"):
        TrainConfig.from_flat({"algorithm": "dann", key: True})


def test_boolean_hyperparameter_still_takes_booleans():
    assert TrainConfig.from_flat({"algorithm": "dann", "augment": True}).hparams == {"augment": True}


def test_malformed_cuda_device_is_refused():
    with pytest.raises(ConfigError, match=r"^device: expected auto, cpu or cuda\[:N\], got 'cudax'$"):
        TrainConfig.from_flat({"device": "cudax"})


def test_missing_gpu_is_refused_by_the_device_check_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = TrainConfig.from_flat({"device": "cuda"})  # validate alone: a sweep driver may have no GPU
    with pytest.raises(ConfigError) as info:
        config.check_device_available()
    assert str(info.value) == ("device: expected a CUDA GPU for 'cuda', got none on this machine "
                               "(torch.cuda.is_available() is False)")


def test_gpu_index_beyond_the_count_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    TrainConfig.from_flat({"device": "cuda:1"}).check_device_available()
    with pytest.raises(ConfigError, match=r"^device: expected a GPU index below 2 \(2 CUDA devices here\), got 'cuda:2'$"):
        TrainConfig.from_flat({"device": "cuda:2"}).check_device_available()


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_cpu_and_auto_need_no_gpu(device, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("cuda queried for a CPU device"))
    TrainConfig.from_flat({"device": device}).check_device_available()


# ----- dataset caches ---------------------------------------------------------------------------
def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def empty(path: Path) -> None:
    path.write_bytes(b"")


def wrong_shape(path: Path) -> None:
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    arrays["train.x"] = arrays["train.x"][:, :, :8, :8]
    np.savez(path, **arrays)


def missing_key(path: Path) -> None:
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files if name != "test.y"}
    np.savez(path, **arrays)


SMALL_PLAN = {split: (pool, {domain: 7 for domain in counts}) for split, (pool, counts) in ds.SPLIT_PLAN.items()}


@pytest.fixture
def small_digits(monkeypatch) -> dict[str, np.ndarray]:
    """digits-shift at 7 images per (split, domain): the real generator and layout, in well under a second."""
    monkeypatch.setattr(ds, "SPLIT_PLAN", SMALL_PLAN)
    return ds.generate(0)


@pytest.mark.parametrize("corrupt", [truncate, empty, wrong_shape, missing_key])
def test_corrupted_digits_cache_is_rebuilt_with_one_line(corrupt, small_digits, tmp_path, capsys):
    path = tmp_path / "digits-shift" / "cache.npz"
    ds.load_or_generate(path, 0)
    corrupt(path)
    rebuilt = ds.load_or_generate(path, 0)
    err = capsys.readouterr().err
    assert err.startswith(f"raybench: rebuilding corrupted cache {path}: ") and err.count("\n") == 1
    assert rebuilt.keys() == small_digits.keys()
    assert all(np.array_equal(rebuilt[k], small_digits[k]) for k in small_digits)
    again = ds.load_or_generate(path, 0)  # the rebuilt file is sound: no second rebuild
    assert capsys.readouterr().err == "" and all(np.array_equal(again[k], small_digits[k]) for k in small_digits)


def test_sound_cache_is_read_not_regenerated(tmp_path, capsys):
    path = tmp_path / "c.npz"
    calls = []

    def generate() -> dict[str, np.ndarray]:
        calls.append(1)
        return {"x": np.arange(6, dtype=np.uint8).reshape(2, 3), "y": np.zeros(2, dtype=np.int64)}

    expected = {"x": (None, 3), "y": (None,)}
    first = load_npz_or_rebuild(path, expected, generate, dtypes={"x": np.uint8})
    second = load_npz_or_rebuild(path, expected, generate, dtypes={"x": np.uint8})
    assert len(calls) == 1 and np.array_equal(first["x"], second["x"]) and capsys.readouterr().err == ""
    np.savez(path, x=np.arange(6, dtype=np.float32).reshape(2, 3), y=np.zeros(2, dtype=np.int64))
    load_npz_or_rebuild(path, expected, generate, dtypes={"x": np.uint8})
    assert len(calls) == 2 and "x has dtype float32, expected uint8" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.tmp"))  # atomic write leaves no temp file behind


def test_generator_that_breaks_the_layout_is_a_bug_not_a_cache(tmp_path):
    with pytest.raises(ValueError, match=r"c\.npz: generated arrays do not match .*missing array\(s\) y"):
        load_npz_or_rebuild(tmp_path / "c.npz", {"x": (2,), "y": (2,)}, lambda: {"x": np.zeros(2)})
    assert not (tmp_path / "c.npz").exists()


# ----- `raybench data prepare` without network --------------------------------------------------
REASON = "[Errno -3] Temporary failure in name resolution"


@pytest.fixture
def no_network(monkeypatch):
    """urlopen fails as it does offline; any other socket use fails the test rather than reach the network."""
    def offline(*args, **kwargs):
        raise urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution"))

    def no_socket(*args, **kwargs):
        raise AssertionError("a test tried to open a network connection")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setattr(socket.socket, "connect", no_socket)


def test_prepare_without_network_names_the_download_not_metadata(no_network, tmp_path):
    from raybench.data.wilds.files import DownloadError, prepare

    with pytest.raises(DownloadError) as info:
        prepare("camelyon17", tmp_path, unlabeled=False)
    message = str(info.value)
    assert message.startswith("cannot download https://") and message.endswith(f": {REASON}")
    assert "metadata.csv" not in message and "\n" not in message


def test_data_prepare_last_line_is_the_network_error(no_network, tmp_path, capsys):
    from raybench.cli import main

    assert main(["data", "prepare", "camelyon17", "--root", str(tmp_path), "--labeled-only"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("raybench: error: data prepare camelyon17: cannot download https://")
    assert f": {REASON};" in last and "metadata.csv" not in last


def test_prepare_reports_a_urllib_error_that_escapes_wilds(monkeypatch, tmp_path):
    """ogb (molpcba) lets urlopen's error through; the message is still the network reason."""
    import wilds

    from raybench.data.wilds.files import DownloadError, prepare

    def failing(*args, **kwargs):
        try:
            raise urllib.error.URLError("Connection refused")
        except urllib.error.URLError as err:
            raise RuntimeError("could not fetch the dataset") from err

    monkeypatch.setattr(wilds, "get_dataset", failing)
    with pytest.raises(DownloadError, match=r"^cannot download: Connection refused$"):
        prepare("ogb-molpcba", tmp_path, unlabeled=False)
