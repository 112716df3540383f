"""SSL verification (SwAV on digits-shift, masked LM on text-shift) through the one trainer and its stage cache.

    python benchmarks/ssl_check.py --part swav  --out results/ssl_swav.json
    python benchmarks/ssl_check.py --part mlm   --out results/ssl_mlm.json

`swav`: (1) `swav` fine-tuning runs (which pre-train once through the stage cache, then fine-tune with ERM+aug)
against `erm` with `augment=true`, the same fine-tuning settings and budget, over seeds; (2) a frozen-feature
linear probe on OOD test: the cached SwAV featurizer against a randomly initialised one.
`mlm`: (1) the masked-token loss on held-out target text (text-shift `test`, never pre-trained on) before and
after the masked-LM stage, with the same masks; (2) fine-tuning from the adapted encoder against the original.
Runs in one thread; every number printed is also written to --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raybench.checkpoints import load_state_dict_into
from raybench.data import load_dataset
from raybench.models import ModelSpec, build_model
from raybench.trainer import Callback, TrainConfig, Trainer
from raybench.trainer.stages import StageCache


class StageLog(Callback):
    def __init__(self) -> None:
        self.reports = []

    def on_stage(self, report) -> None:
        self.reports.append(report)


def run(dataset, flat: dict) -> tuple[dict, list]:
    log = StageLog()
    started = time.perf_counter()
    result = Trainer(TrainConfig.from_flat(flat), callbacks=[log], dataset=dataset).fit()
    metrics = {k: v for k, v in result.best_metrics.items() if k.startswith(("test/", "val/", "id_test/"))}
    metrics["seconds"] = time.perf_counter() - started
    return metrics, log.reports


def mean_std(values: list[float]) -> str:
    return f"{100 * statistics.mean(values):.1f} ± {100 * (statistics.stdev(values) if len(values) > 1 else 0):.1f}"


@torch.no_grad()
def features(featurizer, split, views, batch: int = 512) -> np.ndarray:
    featurizer.eval()
    return torch.cat([featurizer(views.plain(split.x[i:i + batch])) for i in range(0, len(split), batch)]).numpy()


def linear_probe(featurizer, dataset) -> dict[str, float]:
    """Logistic regression on standardised frozen features of `train`; accuracy on val (OOD) and test (OOD)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    train = dataset.split("train")
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=1.0))
    probe.fit(features(featurizer, train, dataset.views), train.y.numpy())
    return {name: float(probe.score(features(featurizer, dataset.split(name), dataset.views), dataset.split(name).y.numpy()))
            for name in ("id_test", "val", "test")}


def swav_part(args) -> dict:
    dataset = load_dataset("digits-shift", args.data_dir, 0)
    cache = str(Path(args.out).with_suffix("") ) + "-stages"
    base = {"dataset": "digits-shift", "device": "cpu", "stage_cache": cache, "data_dir": args.data_dir,
            "epochs": args.epochs, "patience": 4}
    out: dict = {"settings": {**base, "seeds": args.seeds}}
    runs: dict[str, list] = {"swav": [], "erm_aug": []}
    key = None
    for seed in range(args.seeds):
        metrics, reports = run(dataset, {**base, "algorithm": "swav", "seed": seed})
        (report,) = reports
        key = report.key
        runs["swav"].append({**metrics, "pretrain_cached": report.cached, "pretrain_key": report.key,
                             "pretrain_seconds": report.seconds, "pretrain_history": report.history})
        print("swav", seed, {k: round(v, 4) for k, v in metrics.items() if not isinstance(v, list)}, "cached", report.cached, flush=True)
        metrics, _ = run(dataset, {**base, "algorithm": "erm", "augment": True, "seed": seed})
        runs["erm_aug"].append(metrics)
        print("erm_aug", seed, {k: round(v, 4) for k, v in metrics.items()}, flush=True)
    out["runs"] = runs
    out["table"] = {name: {m: mean_std([r[m] for r in rs]) for m in ("test/acc", "val/acc", "id_test/acc")}
                    for name, rs in runs.items()}
    out["pretrainings"] = sum(not r["pretrain_cached"] for r in runs["swav"])
    entry = StageCache(Path(cache)).get_or_make(key, lambda: (_ for _ in ()).throw(RuntimeError("no cached stage")))
    spec = ModelSpec(dataset.input_shape, dataset.task.n_outputs, layout=dataset.input_layout)
    pretrained = load_state_dict_into(build_model("lenet", spec), entry.state).featurizer
    probes = {"swav": linear_probe(pretrained, dataset)}
    random_probes = []
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        random_probes.append(linear_probe(build_model("lenet", spec).featurizer, dataset))
    probes["random_init"] = {k: mean_std([p[k] for p in random_probes]) for k in random_probes[0]}
    out["linear_probe"] = probes
    print(json.dumps({"table": out["table"], "linear_probe": probes, "pretrainings": out["pretrainings"]}, indent=1), flush=True)
    return out


def text_shift(args):
    from raybench.data.text_shift import minilm_folder

    dataset = load_dataset("text-shift", args.data_dir, 0)
    # text-shift is raw text: the "text" capability until the dataset declares it itself
    return dataclasses.replace(dataset, capabilities=dataset.capabilities | {"text"}), str(minilm_folder())


@torch.no_grad()
def held_out_masked_loss(algorithm, texts: list[str], seed: int = 0, batch: int = 32) -> float:
    """Mean masked-token cross-entropy of a pretext-phase `mlm` over `texts`, masks drawn from `seed` (the same
    for every model compared)."""
    from raybench.algorithms.mlm import masked_batch

    featurizer, mlm = algorithm.model.featurizer, algorithm.masked_lm.eval()
    torch.manual_seed(seed)
    total, count = 0.0, 0
    for i in range(0, len(texts), batch):
        encoded = masked_batch(texts[i:i + batch], featurizer.tokenizer, algorithm.collator, featurizer.max_length)
        logits = mlm(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).logits
        masked = encoded["labels"] != -100
        total += float(torch.nn.functional.cross_entropy(logits[masked], encoded["labels"][masked], reduction="sum"))
        count += int(masked.sum())
    return total / count


class LastState(Callback):
    """Keeps the whole pretext algorithm's state (encoder and MLM head) after the last epoch."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def on_epoch_end(self, report) -> None:
        report.write_checkpoint(self.directory)


def pretext_on(dataset, base: dict, split: str, steps: int, directory: Path):
    """A masked-LM pretext run (the stage's settings) on `split`, returned as its algorithm with the final weights."""
    from raybench.algorithms import ALGORITHMS, AlgorithmContext, build_algorithm

    flat = {**base, "algorithm": "mlm", "phase": "pretext", "epochs": 1, "max_steps_per_epoch": max(steps, 1),
            "batch_size": 32, "lr": 1e-4, "optimizer": "adamw", "weight_decay": 0.0, "unlabeled_split": split}
    trainer = Trainer(TrainConfig.from_flat(flat), callbacks=[LastState(directory)], dataset=dataset)
    if steps:
        trainer.fit()
    context = AlgorithmContext(dataset.task, dataset.views, dataset.n_domains, 1, dataset.n_groups)
    algorithm = build_algorithm("mlm", trainer.new_model(), trainer.config.hparams, context)
    if steps:
        state = torch.load(directory / "state.pt", map_location="cpu", weights_only=True)
        algorithm.load_state_dict(state["algorithm"])
    assert isinstance(algorithm, ALGORITHMS.get("mlm"))
    return algorithm


def mlm_part(args) -> dict:
    dataset, folder = text_shift(args)
    cache = str(Path(args.out).with_suffix("")) + "-stages"
    base = {"dataset": "text-shift", "device": "cpu", "stage_cache": cache, "data_dir": args.data_dir,
            "model_weights": folder}
    out: dict = {"settings": {**base, "pretrain_steps": args.pretrain_steps, "seeds": args.seeds,
                              "fine_tune_epochs": args.epochs, "fine_tune_steps_per_epoch": args.text_steps}}
    held_out = list(dataset.split("test").x[: args.held_out])
    # The MiniLM package has no MLM head (it starts fresh), so "before" trains the same head for the same steps
    # on source text: the difference to "target" is what adapting to the target's text did.
    losses = {}
    for name, split, steps in (("no_pretraining_fresh_head", "test_unlabeled", 0),
                               ("source_text", "train_unlabeled", args.pretrain_steps),
                               ("target_text", "test_unlabeled", args.pretrain_steps)):
        torch.manual_seed(0)
        algorithm = pretext_on(dataset, base, split, steps, Path(cache) / f"held-out-{name}")
        losses[name] = held_out_masked_loss(algorithm, held_out)
        print("held-out target masked loss", name, round(losses[name], 4), flush=True)
    out["held_out_masked_loss"] = losses
    fine = {**base, "epochs": args.epochs, "max_steps_per_epoch": args.text_steps}
    runs: dict[str, list] = {"mlm": [], "erm": []}
    for seed in range(args.seeds):
        metrics, reports = run(dataset, {**fine, "algorithm": "mlm", "seed": seed, "pretrain_steps": args.pretrain_steps})
        (report,) = reports
        runs["mlm"].append({**metrics, "pretrain_cached": report.cached, "pretrain_history": report.history})
        print("mlm", seed, {k: round(v, 4) for k, v in metrics.items()}, "cached", report.cached, flush=True)
        metrics, _ = run(dataset, {**fine, "algorithm": "erm", "seed": seed})
        runs["erm"].append(metrics)
        print("erm", seed, {k: round(v, 4) for k, v in metrics.items()}, flush=True)
    out["runs"] = runs
    out["table"] = {name: {m: mean_std([r[m] for r in rs]) for m in ("test/acc", "val/acc", "id_test/acc") if m in rs[0]}
                    for name, rs in runs.items()}
    print(json.dumps({"held_out_masked_loss": losses, "table": out["table"]}, indent=1), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("swav", "mlm"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10, help="fine-tuning epochs (both arms)")
    parser.add_argument("--text-steps", type=int, default=40, help="mlm: fine-tuning steps per epoch")
    parser.add_argument("--pretrain-steps", type=int, default=20, help="mlm: masked-LM steps")
    parser.add_argument("--held-out", type=int, default=256, help="mlm: held-out target texts scored")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {"swav": swav_part, "mlm": mlm_part}[args.part](args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
