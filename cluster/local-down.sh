#!/usr/bin/env bash
# Stop exactly what local-up.sh started: the MLflow server's process group and the Ray processes of
# its own temp dir. Never a host-wide `ray stop`, which would kill every Ray on the machine.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
state="${RAYBENCH_CLUSTER_DIR:-$(dirname "$here")/.cluster}"

if [ -f "$state/mlflow.pid" ]; then
  pid="$(cat "$state/mlflow.pid")"
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$state/mlflow.pid"
fi

if [ -f "$state/ray_temp_dir" ]; then
  ray_tmp="$(cat "$state/ray_temp_dir")"
  # Every process of that head (GCS, raylet, dashboard, workers) names its session dir on its command line.
  pkill -TERM -f -- "$ray_tmp" 2>/dev/null || true
  for _ in $(seq 1 40); do pgrep -f -- "$ray_tmp" > /dev/null || break; sleep 0.25; done
  pkill -KILL -f -- "$ray_tmp" 2>/dev/null || true
  rm -rf -- "$ray_tmp"
  rm -f "$state/ray_temp_dir"
fi
echo "local-down: stopped what $state recorded"
