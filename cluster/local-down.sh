#!/usr/bin/env bash
# Stop exactly what local-up.sh started and recorded in $RAYBENCH_CLUSTER_DIR (default ./.cluster):
#  - its worker nodes first (nodes/worker-K/: recorded PIDs, then the node's own marked temp dir);
#  - the MLflow server, by its recorded process group;
#  - the Ray processes recorded in ray.pids (PID and create time, so a reused PID is never signalled),
#    and their descendants (agents, workers, job drivers): TERM, then KILL after a bounded wait;
#  - Ray's temp dir, only if it carries local-up's marker naming this state dir;
#  - with GCS fault tolerance, the GCS's Redis last (by its recorded process group), once the GCS is gone.
# Never a host-wide `ray stop`, and never a match on command lines, which would hit other people's processes.
#
#   cluster/local-down.sh                    # the worker nodes, MLflow and the head
#   cluster/local-down.sh --node worker-2    # only that worker node (the head and the others keep running)
#
# Exit status: 0 done; 2 the recorded temp dir is not marked as this cluster's, so it was left alone
# (and so was its record in the state dir: inspect it, then delete $RAYBENCH_CLUSTER_DIR/ray_temp_dir).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
bin="${RAYBENCH_BIN:-$repo/.venv/bin}"
state="$(realpath -m -- "${RAYBENCH_CLUSTER_DIR:-$repo/.cluster}")"
grace="${RAYBENCH_STOP_GRACE:-15}"   # seconds from TERM to KILL, per group (raylet, the rest, GCS)
marker_name=".raybench-cluster"

# A server local-up started with setsid (its own process group), by the PID it recorded in PID_FILE: TERM to the
# group, up to 10 s for it to go, then KILL.
stop_process_group() {
  local pid_file="$1" pid
  [ -f "$pid_file" ] || return 0
  pid="$(cat "$pid_file")"
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f -- "$pid_file"
}

stop_mlflow() { stop_process_group "$state/mlflow.pid"; }

# After the head: a Redis still holding a live GCS's tables would be pulled from under it.
stop_redis() { stop_process_group "$state/redis.pid" && rm -rf -- "$state/redis"; }

# Stop the recorded processes whose create time still matches, with all their descendants. The tree is
# listed before the first signal: once the raylet dies, its workers are re-parented and out of reach.
# In the order `ray stop` uses: raylet first (its agents and workers fate-share with it), then the rest,
# GCS last; sent together, the GCS and the autoscaler monitor ignored TERM for over 25 s here.
stop_ray() {
  local owner="$1"   # the state dir (head) or a node's dir, holding ray.pids
  [ -f "$owner/ray.pids" ] || return 0
  "$bin/python" - "$owner/ray.pids" "$grace" <<'PY' || { echo "local-down: could not stop the processes in $owner/ray.pids" >&2; return 1; }
import sys
import psutil
pid_file, grace = sys.argv[1], float(sys.argv[2])

def recorded():
    for line in open(pid_file):
        pid, created = line.split()
        try:
            proc = psutil.Process(int(pid))
            if abs(proc.create_time() - float(created)) < 0.01:  # else the PID now belongs to someone else
                yield proc
        except psutil.NoSuchProcess:
            pass

def with_descendants(procs):
    tree = {}
    for proc in procs:
        try:
            tree.update({p.pid: p for p in [proc, *proc.children(recursive=True)]})
        except psutil.NoSuchProcess:
            pass
    return list(tree.values())

def stop(procs):
    """TERM, then KILL what is left after the grace period; psutil re-checks each create time first."""
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:  # gone already, or not ours to signal
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    alive = with_descendants(alive)  # workers a dying raylet may have started meanwhile
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return psutil.wait_procs(alive, timeout=10)[1]

def bucket(proc):
    try:
        return {"raylet": 0, "gcs_server": 2}.get(proc.name(), 1)
    except psutil.NoSuchProcess:
        return 1

groups = [[], [], []]
for proc in with_descendants(recorded()):
    groups[bucket(proc)].append(proc)
left = [proc for group in groups for proc in stop(group)]
if left:
    sys.exit(f"local-down: still running after KILL: {sorted(p.pid for p in left)}")
PY
  rm -f "$owner/ray.pids"
}

# Delete Ray's temp dir only if local-up marked it for this state dir; a tampered or foreign record
# (say RAY_TEMP_DIR=/tmp) must never lead to deleting someone else's files.
remove_temp_dir() {
  local owner="$1"   # whose name the temp dir's marker must carry
  [ -f "$owner/ray_temp_dir" ] || return 0
  local ray_tmp
  ray_tmp="$(cat "$owner/ray_temp_dir")"
  if [ -e "$ray_tmp" ] || [ -L "$ray_tmp" ]; then
    if [[ "$ray_tmp" != /?* ]] || [ -L "$ray_tmp" ] || [ ! -d "$ray_tmp" ] \
       || [ "$(cat -- "$ray_tmp/$marker_name" 2>/dev/null)" != "$owner" ]; then
      echo "local-down: not deleting $ray_tmp: it carries no local-up marker naming $owner" >&2
      return 2
    fi
    rm -rf -- "$ray_tmp"
  fi
  rm -f "$owner/ray_temp_dir" "$owner/ports.env"
}

# A worker node: its processes, its temp dir, then its record (which frees its number for --add-worker).
stop_node() {
  local dir="$1" code=0
  [ -d "$dir" ] || return 0
  if stop_ray "$dir"; then remove_temp_dir "$dir" || code=$?; else code=1; fi
  (( code == 0 )) && rm -rf -- "$dir"
  return "$code"
}

case "${1:-}" in
  "") ;;
  --node)
    [[ "${2:-}" =~ ^worker-[0-9]+$ ]] && [ $# -eq 2 ] \
      || { echo "local-down: --node needs a worker node name like worker-1, not '${2:-}'" >&2; exit 2; }
    [ -d "$state/nodes/$2" ] || { echo "local-down: no worker node $2 is recorded in $state/nodes" >&2; exit 2; }
    stop_node "$state/nodes/$2" && echo "local-down: stopped $2 of $state"
    exit $? ;;
  *) echo "usage: cluster/local-down.sh [--node worker-K]" >&2; exit 2 ;;
esac

status=0
for node_dir in "$state"/nodes/worker-*; do
  [ -d "$node_dir" ] || continue
  stop_node "$node_dir" || status=$?
done
stop_mlflow
# A temp dir whose processes may still run is kept, with its record, for a second try.
if stop_ray "$state"; then remove_temp_dir "$state" || status=$?; stop_redis; else status=1; fi
(( status == 0 )) && rm -f "$state/port_base" "$state/head.env" && rmdir "$state/nodes" 2>/dev/null
(( status == 0 )) && echo "local-down: stopped what $state recorded"
exit "$status"
