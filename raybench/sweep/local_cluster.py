"""What the private local Ray of a sweep without --address would offer its trial workers, judged before anything
is written.

Such a sweep starts Ray on this machine with only what the machine has: its CPUs and GPUs as Ray detects them,
what $RAY_OVERRIDE_RESOURCES declares, and the trial drivers' own resource. A request no such node can satisfy
(`--gpus-per-worker 1` on a machine without a GPU, `--worker-resource foo=1`) used to be refused only once Ray had
started and the tracking store was written (ray_backend.check_resources, which still judges a cluster at
--address once joined). Here the same arithmetic runs on the node Ray would start, as Ray's own resolution of a
node's resources describes it, without starting anything.

Ray's resource module (not Tune, not a Ray process) is imported only for a request beyond one CPU for one worker,
which every machine offers; the sweep imports Ray moments later anyway.
"""
from __future__ import annotations

import math
import sys
from typing import Any

from raybench.sweep.errors import OptionError
from raybench.sweep.options import SweepOptions, cluster_address

HEADROOM = 1e-9  # as ray_backend.check_resources: 0.1 * 10 fits in 1


def check_local_cluster(options: SweepOptions) -> None:
    """Refuse, as one OptionError naming the flag, a request the sweep's private local Ray could never satisfy.
    Nothing is judged for a sweep that joins a cluster (--address, $RAY_ADDRESS), when this process already holds
    a Ray (a library caller's: the sweep then uses it as it is), or for one worker of at most one CPU."""
    if cluster_address(options.address) is not None or _ray_already_up() or _any_machine_offers(options):
        return
    node = local_node_resources()
    if node is None:  # Ray's resolution could not be read: the check once Ray started still runs
        return
    problem = request_problem(node, options)
    if problem is not None:
        raise OptionError(problem)


def _ray_already_up() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def _any_machine_offers(options: SweepOptions) -> bool:
    workers = options.workers_per_trial if options.executor == "train" else 1
    return (workers == 1 and options.cpus_per_worker <= 1 and options.gpus_per_worker == 0
            and not options.worker_resources and not options.trial_resources)


def local_node_resources() -> dict[str, float] | None:
    """The resources Ray would give a head node started here (ray.init without an address): CPU, GPU and every
    custom one, $RAY_OVERRIDE_RESOURCES included; None when Ray's resolution cannot be used (its private API
    moved, or the environment's override does not parse: ray.init then says so itself)."""
    try:
        from ray._private.resource_and_label_spec import ResourceAndLabelSpec

        spec = ResourceAndLabelSpec(resources={}).resolve(is_head=True)
    except Exception:  # noqa: BLE001  any failure leaves the judgement to the check once Ray started
        return None
    return {**spec.resources, "CPU": float(spec.num_cpus), "GPU": float(spec.num_gpus)}


def request_problem(node: dict[str, float], options: SweepOptions) -> str | None:
    """Why a trial of `options` could never run on the single node `node`, as one line naming the flag; None
    when it can. The arithmetic is check_resources's: the per-trial resources once, then as many worker bundles
    as the trial has workers."""
    for name, amount in options.trial_resources:
        if node.get(name, 0.0) + HEADROOM < amount:
            return (f"--trial-resource {name}: each trial holds {amount:g} {name}, but the private local Ray this "
                    f"sweep starts (no --address) has {_have(node, name)}; leave the flag out, or give the "
                    f"--address of a cluster whose nodes declare it")
    need = {"CPU": options.cpus_per_worker, "GPU": options.gpus_per_worker, **dict(options.worker_resources)}
    if options.executor == "function":
        need.update({name: need.get(name, 0.0) + amount for name, amount in options.trial_resources})
    workers = options.workers_per_trial if options.executor == "train" else 1
    fits = {kind: math.floor(node.get(kind, 0.0) / amount + HEADROOM) for kind, amount in need.items() if amount > 0}
    if min(fits.values(), default=0) >= workers:
        return None
    short = min(fits, key=lambda kind: fits[kind])
    return (f"{_flag_of(short, fits[short], options)}: each trial asks for {workers} worker(s) of "
            f"{_request_words(need)}, but the private local Ray this sweep starts (no --address) has "
            f"{_have(node, short)}; ask for less, or give the --address of a cluster that has it")


def _flag_of(kind: str, fits: int, options: SweepOptions) -> str:
    """The flag to change: the resource's own one, or --workers-per-trial when one worker would fit."""
    if fits >= 1 and options.executor == "train":
        return "--workers-per-trial"
    if kind == "CPU":
        return "--cpus-per-worker"
    if kind == "GPU":
        return "--gpus-per-worker"
    return f"--worker-resource {kind}" if kind in dict(options.worker_resources) else f"--trial-resource {kind}"


def _request_words(need: dict[str, float]) -> str:
    return " and ".join(f"{amount:g} {kind}" for kind, amount in need.items() if amount > 0 or kind == "CPU")


def _have(node: dict[str, Any], kind: str) -> str:
    """What the node has of `kind`, beside its CPUs and GPUs: `2 CPU, 0 GPU and no 'foo'`."""
    base = f"{node.get('CPU', 0):g} CPU and {node.get('GPU', 0):g} GPU"
    if kind in ("CPU", "GPU"):
        return base
    return f"{base}, and {f'{node[kind]:g} {kind}' if kind in node else f'no {kind!r} resource'}"
