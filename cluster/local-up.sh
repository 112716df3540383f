#!/usr/bin/env bash
# Start a local Ray head (dashboard on 127.0.0.1) and an MLflow server (127.0.0.1, SQLite, local artifacts).
# Everything it starts is recorded under $RAYBENCH_CLUSTER_DIR so that local-down.sh stops exactly that.
#
#   cluster/local-up.sh                 # ports: Ray 6379, dashboard 8265, MLflow 5000
#   RAY_PORT=6380 DASHBOARD_PORT=8266 MLFLOW_PORT=5001 cluster/local-up.sh
#
# Note: only the dashboard honours 127.0.0.1; Ray's GCS and raylet listen on all interfaces (Ray 2.60).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
bin="${RAYBENCH_BIN:-$repo/.venv/bin}"
state="${RAYBENCH_CLUSTER_DIR:-$repo/.cluster}"
ray_port="${RAY_PORT:-6379}"
dashboard_port="${DASHBOARD_PORT:-8265}"
mlflow_port="${MLFLOW_PORT:-5000}"
cpus="${RAY_NUM_CPUS:-$(nproc)}"
drivers="${RAY_TRIAL_DRIVERS:-8}"
# Ray's temp dir holds UNIX sockets, whose paths must stay short: keep it under /tmp, named by the state dir.
ray_tmp="${RAY_TEMP_DIR:-/tmp/raybench-$(echo -n "$state" | sha1sum | cut -c1-10)}"

mkdir -p "$state/mlflow-artifacts"
if [ -f "$state/ray_temp_dir" ]; then
  echo "local-up: a cluster recorded in $state is still up; run cluster/local-down.sh first" >&2
  exit 1
fi
echo "$ray_tmp" > "$state/ray_temp_dir"
export RAY_USAGE_STATS_ENABLED=0 MLFLOW_DISABLE_TELEMETRY=true
export PATH="$bin:$PATH"   # submitted jobs inherit the head's PATH, so `raybench` resolves to this install

"$bin/ray" start --head --node-ip-address=127.0.0.1 --port="$ray_port" \
  --dashboard-host=127.0.0.1 --dashboard-port="$dashboard_port" \
  --num-cpus="$cpus" --resources="{\"trial_driver\": $drivers}" \
  --temp-dir="$ray_tmp" --disable-usage-stats > "$state/ray-start.log" 2>&1 \
  || { cat "$state/ray-start.log" >&2; exit 1; }

# setsid: the server and its workers form one process group, which local-down.sh stops as a whole.
setsid "$bin/mlflow" server --host 127.0.0.1 --port "$mlflow_port" \
  --backend-store-uri "sqlite:///$state/mlflow.db" --artifacts-destination "$state/mlflow-artifacts" \
  > "$state/mlflow.log" 2>&1 < /dev/null &
echo $! > "$state/mlflow.pid"

for _ in $(seq 1 120); do
  if curl -fsS "http://127.0.0.1:$mlflow_port/health" > /dev/null 2>&1; then break; fi
  sleep 0.5
done
curl -fsS "http://127.0.0.1:$mlflow_port/health" > /dev/null || { echo "local-up: MLflow did not start; see $state/mlflow.log" >&2; exit 1; }

cat <<MSG
Ray dashboard:  http://127.0.0.1:$dashboard_port   (ray job submit --address http://127.0.0.1:$dashboard_port ...)
MLflow:         http://127.0.0.1:$mlflow_port      (raybench sweep ... --tracking-uri http://127.0.0.1:$mlflow_port)
Stop both:      cluster/local-down.sh
MSG
