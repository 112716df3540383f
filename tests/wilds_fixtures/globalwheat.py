"""A tiny GlobalWheat-WILDS copy (labeled v1.1 and unlabeled v1.0) in the exact format `wilds` reads.

Labeled, `globalwheat_v1.1/`: the official scheme reads `official_{train,val,test}.csv` and
`fixed_train_{val,test}.csv` (the ID val / test splits), each with columns image_name, BoxesString, domain
(the session's index in wilds' 47-session list), plus `metadata_domain.csv` (`;`-separated: name, country,
location, development_stage) which must name all 47 sessions, and `images/{image_name}`.
Unlabeled, `globalwheat_unlabeled_v1.0/`: `official_{train,val,test,extra}_unlabeled.csv` (image_name,
domain: an index into the unlabeled class's 100-session list), `metadata_domain_unlabeled.csv` naming all
100 sessions, and `images/`.

BoxesString is `x_min y_min x_max y_max` per box, boxes joined by `;`, and exactly `no_box` for an image
without wheat heads. Nothing in the loader needs 1024x1024 images (only `torch.stack` in its collate needs
equal sizes), so the images are small PNGs with bright blobs where the boxes are. Sessions are chosen as in
the official split: European sessions train (and ID val / test), Asian and African ones validate, the
Australian and American ones test; each split has several sessions.
"""
from __future__ import annotations

import hashlib
import pathlib

import numpy as np
import pandas as pd
from PIL import Image

SEED = 20_210_601
LABELED, UNLABELED = "globalwheat_v1.1", "globalwheat_unlabeled_v1.0"
IMAGE_SIDE = 64
CELL = 16  # boxes sit in distinct cells of a 4x4 grid, so no two overlap
PER_SESSION = {"official_train": 6, "fixed_train_val": 3, "fixed_train_test": 3, "official_val": 6,
               "official_test": 6}
UNLABELED_PER_SESSION = 4
# (name, country, location, development_stage) for every session the labeled class knows, in its order.
SESSIONS = [
    *[(f"Arvalis_{i}", "France", "Gréoux" if i % 2 else "VLB", "Post-flowering" if i < 7 else "Filling")
      for i in range(1, 13)],
    ("ETHZ_1", "Switzerland", "Eschikon", "Filling"), ("Inrae_1", "France", "Toulouse", "Filling-Ripening"),
    ("NMBU_1", "Norway", "NMBU", "Filling"), ("NMBU_2", "Norway", "NMBU", "Ripening"),
    ("Rres_1", "UK", "Rothamsted", "Filling-Ripening"), ("ULiège-GxABT_1", "Belgium", "Gembloux", "Ripening"),
    ("Utokyo_1", "Japan", "NARO-Tsukuba", "multiple"), ("Utokyo_2", "Japan", "NARO-Tsukuba", "multiple"),
    ("Utokyo_3", "Japan", "NARO-Hokkaido", "multiple"), ("Ukyoto_1", "Japan", "Kyoto", "Post-flowering"),
    ("NAU_1", "China", "Baima", "Post-flowering"), ("NAU_2", "China", "Baima", "Post-flowering"),
    ("NAU_3", "China", "Baima", "Filling"), ("ARC_1", "Sudan", "Wad Medani", "Filling"),
    *[(f"UQ_{i}", "Australia", "Gatton" if i < 7 else "Brookstead", "Filling" if i % 2 else "Post-flowering")
      for i in range(1, 12)],
    ("Terraref_1", "US", "Maricopa, AZ", "Ripening"), ("Terraref_2", "US", "Maricopa, AZ", "Filling"),
    *[(f"KSU_{i}", "US", "KSU", "Post-flowering") for i in range(1, 5)],
    *[(f"CIMMYT_{i}", "Mexico", "Ciudad Obregon", "Post-flowering") for i in range(1, 4)],
    ("Usask_1", "Canada", "Saskatchewan", "Filling-Ripening"),
]
SESSION_NAMES = [row[0] for row in SESSIONS]
SPLIT_SESSIONS = {
    "official_train": ["Arvalis_1", "Arvalis_4", "ETHZ_1", "Rres_1"],
    "official_val": ["Utokyo_1", "Ukyoto_1", "NAU_1", "ARC_1"],
    "official_test": ["UQ_1", "Terraref_1", "KSU_1", "CIMMYT_1"],
}
SPLIT_SESSIONS["fixed_train_val"] = SPLIT_SESSIONS["fixed_train_test"] = SPLIT_SESSIONS["official_train"]
# The unlabeled class's extra 53 sessions (after the 47 above), with the metadata its lists allow.
UNLABELED_SESSIONS = [
    *[(f"unlabeled_CIMMYT_PHY_{s}", "Mexico", "Ciudad Obregon", "Post-flowering") for s in (
        "9SAT_HEAT_RGB_20200415", "9SAT_HEAT_RGB_20200422", "BestPT_HEAT_RGB_20200422", "BestPT_HEAT_RGB_280420",
        "BestPT_RGO_RGB_20200319", "HIBAPIII_HEAT_RGB_20200422", "HIBAPIII_RGO_RGB_20200311",
        "HIBAPIII_RGO_RGB_20200312", "HIBAPIII_RGO_RGB_20200313", "HIBAPIII_RGO_RGB_20200503",
        "ROOTS-ANAT_HEAT_RGB_20200422", "ROOTS_ANAT_RGO_RGB_20200313", "ROOTS_ANAT_SQ_RGB_20200313")],
    ("unlabeled_KSU_17ASH_LakinFuller_KEY_PCTHEAD_20170423", "US", "KSU", "Filling"),
    ("unlabeled_KSU__16ASH_AM-PANEL_KEY_PCTHEAD_20160504", "US", "KSU", "Filling"),
    *[(f"unlabeled_RRes-Dataset{i}", "UK", "Rothamsted", "Filling") for i in range(1, 5)],
    ("unlabeled_arvalis_greoux_Session_2020-05-25_12-13-52", "France", "Gréoux", "Post-flowering"),
    ("unlabeled_arvalis_greoux_Session_2020-06-22_07-46-39", "France", "Gréoux", "Ripening"),
    ("unlabeled_arvalis_VLB_Session 2020-06-02 09-33-05_VBProb", "France", "VLB", "Filling"),
    ("unlabeled_arvalis_BIGNAN_Session 2021-06-17 13-49-26", "France", "Bignan", "Filling"),
    ("unlabeled_arvalis_ENCRAMBADE_Session 2021-05-18 07-59-37", "France", "Encrambade", "Post-flowering"),
    ("unlabeled_arvalis_ENCRAMBADE_Session 2021-06-11 07-48-21", "France", "Encrambade", "Filling"),
    ("unlabeled_arvalis_OLM_Session 2021-06-02 07-47-38", "France", "OLM", "Post-flowering"),
    ("unlabeled_arvalis_OLM_Session 2021-06-17 11-55-36", "France", "OLM", "Filling"),
    ("unlabeled_arvalis_VLB_Session 2021-05-28 07-08-58", "France", "VLB", "Post-flowering"),
    ("unlabeled_arvalis_VLB_Session 2021-06-14 08-51-33", "France", "VLB", "Filling"),
    ("unlabeled_arvalis_mons_2018", "Belgium", "Mons", "Filling"),
    *[(f"unlabeled_hokkaido_{s}", "Japan", "NARO-Hokkaido", "multiple") for s in (
        "SK_SK_2021_7_20", "SK_SK_2021_7_28", "SM_SM_2021_7_10", "Tsujino_2021_6_16", "Tsujino_2021_6_23",
        "Tsujino_2021_6_7", "Tsujino_2021_6_9", "Tsujino_2021_7_10", "Tsujino_2021_7_11", "Tsujino_2021_7_20",
        "Tsujino_2021_7_3")],
    ("unlabeled_inrae_clermont", "France", "Clermont", "Emergence"),
    *[(f"unlabeled_uliege_{s}", "Belgium", "Gembloux", "Filling") for s in (
        "6_11", "6_15", "6_16", "6_18", "6_23", "6_26", "7_13", "7_7")],
    ("unlabeled_usask_2019_08_06_sampled", "Canada", "Saskatchewan", "Filling"),
    ("unlabeled_usask_2019_08_12_sampled", "Canada", "Saskatchewan", "Ripening"),
    ("unlabeled_ETHZ_2", "Switzerland", "Eschikon", "Filling"),
]
ALL_SESSION_NAMES = SESSION_NAMES + [row[0] for row in UNLABELED_SESSIONS]
UNLABELED_SPLIT_SESSIONS = {
    "train": ["unlabeled_arvalis_mons_2018", "unlabeled_RRes-Dataset1", "unlabeled_uliege_6_11"],
    "val": ["unlabeled_hokkaido_Tsujino_2021_6_7", "unlabeled_hokkaido_SK_SK_2021_7_20", "Utokyo_1"],
    "test": ["unlabeled_CIMMYT_PHY_9SAT_HEAT_RGB_20200415", "unlabeled_usask_2019_08_06_sampled", "UQ_1"],
    "extra": ["unlabeled_inrae_clermont", "unlabeled_ETHZ_2", "unlabeled_arvalis_OLM_Session 2021-06-02 07-47-38"],
}


def write(root: pathlib.Path) -> None:
    """Write both folders under `root`, each with its RELEASE file."""
    rng = np.random.default_rng(SEED)
    root = pathlib.Path(root)
    _write_labeled(root / LABELED, rng)
    _write_unlabeled(root / UNLABELED, rng)


def _write_labeled(folder: pathlib.Path, rng: np.random.Generator) -> None:
    (folder / "images").mkdir(parents=True, exist_ok=True)
    for csv_name, sessions in SPLIT_SESSIONS.items():
        rows = [_labeled_image(folder, rng, session) for session in sessions for _ in range(PER_SESSION[csv_name])]
        pd.DataFrame(rows, columns=["image_name", "BoxesString", "domain"]).to_csv(folder / f"{csv_name}.csv", index=False)
    _domain_table(SESSIONS).to_csv(folder / "metadata_domain.csv", sep=";", index=False)
    (folder / "RELEASE_v1.1.txt").write_text("globalwheat v1.1 (raybench test fixture)\n")


def _write_unlabeled(folder: pathlib.Path, rng: np.random.Generator) -> None:
    (folder / "images").mkdir(parents=True, exist_ok=True)
    for split, sessions in UNLABELED_SPLIT_SESSIONS.items():
        rows = []
        for session in sessions:
            for _ in range(UNLABELED_PER_SESSION):
                name = _image_name(rng)
                _render(_boxes(rng)).save(folder / "images" / name)
                rows.append((name, ALL_SESSION_NAMES.index(session)))
        pd.DataFrame(rows, columns=["image_name", "domain"]).to_csv(
            folder / f"official_{split}_unlabeled.csv", index=False)
    _domain_table(SESSIONS + UNLABELED_SESSIONS).to_csv(folder / "metadata_domain_unlabeled.csv", sep=";", index=False)
    (folder / "RELEASE_v1.0.txt").write_text("globalwheat_unlabeled v1.0 (raybench test fixture)\n")


def _domain_table(sessions: list[tuple[str, str, str, str]]) -> pd.DataFrame:
    return pd.DataFrame(sessions, columns=["name", "country", "location", "development_stage"])


def _labeled_image(folder: pathlib.Path, rng: np.random.Generator, session: str) -> tuple[str, str, int]:
    """Render and save one image; its CSV row (name, BoxesString, session index)."""
    boxes = _boxes(rng)
    name = _image_name(rng)
    _render(boxes).save(folder / "images" / name)
    return name, box_string(boxes), SESSION_NAMES.index(session)


def _image_name(rng: np.random.Generator) -> str:
    """Real image names are hex digests with a .png suffix."""
    return hashlib.sha1(rng.bytes(16)).hexdigest() + ".png"


def _boxes(rng: np.random.Generator) -> np.ndarray:
    """0 to 4 wheat heads, each inside its own grid cell (about 1 image in 5 has none)."""
    count = int(rng.choice([0, 1, 2, 3, 4], p=[0.2, 0.2, 0.2, 0.2, 0.2]))
    cells = rng.choice((IMAGE_SIDE // CELL) ** 2, count, replace=False)
    rows, cols = np.divmod(cells, IMAGE_SIDE // CELL)
    x_min, y_min = cols * CELL + rng.integers(0, 4, count), rows * CELL + rng.integers(0, 4, count)
    width, height = rng.integers(7, 12, count), rng.integers(7, 12, count)
    return np.stack([x_min, y_min, x_min + width, y_min + height], axis=1).astype(np.int64).reshape(-1, 4)


def box_string(boxes: np.ndarray) -> str:
    """The BoxesString the loader parses: 'x_min y_min x_max y_max' joined by ';', or 'no_box'."""
    if len(boxes) == 0:
        return "no_box"
    return ";".join(" ".join(str(int(v)) for v in box) for box in boxes)


def _render(boxes: np.ndarray) -> Image.Image:
    """Dark green canopy with a bright yellow blob per box."""
    pixels = np.zeros((IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
    pixels[...] = (40, 90, 30)
    for x_min, y_min, x_max, y_max in boxes:
        pixels[y_min:y_max, x_min:x_max] = (220, 200, 90)
    return Image.fromarray(pixels, "RGB")
