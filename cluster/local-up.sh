#!/usr/bin/env bash
# Start a local Ray head (dashboard on 127.0.0.1) and an MLflow server (127.0.0.1, SQLite, local artifacts),
# and return only once the head accepts a submitted job. Everything it starts is recorded under
# $RAYBENCH_CLUSTER_DIR (default ./.cluster) so that cluster/local-down.sh stops exactly that.
#
#   cluster/local-up.sh                             # ports 24000-24199
#   RAYBENCH_PORT_BASE=24200 cluster/local-up.sh    # a second cluster on the same host
#   cluster/local-up.sh --print-ports               # print the port plan and exit; starts nothing
#   RAYBENCH_WORKER_NODES=1 cluster/local-up.sh     # the head plus one worker node
#   cluster/local-up.sh --add-worker                # one more worker node for the running head
#   RAYBENCH_GCS_FT=1 cluster/local-up.sh           # the head's GCS keeps its state in a Redis it starts
#   cluster/local-up.sh --restart-head              # start a dead head again (GCS fault tolerance on)
#
# Head restart (GCS fault tolerance). With RAYBENCH_GCS_FT=1 local-up also starts Debian's redis-server
# (127.0.0.1:RAYBENCH_REDIS_PORT, in memory, its data under the state dir) and starts the head with
# RAY_REDIS_ADDRESS pointing at it, so the GCS writes its tables (nodes, actors, placement groups, jobs)
# there. If the head's Ray processes die, `--restart-head` starts them again on the same ports; the GCS
# reloads its tables from Redis, and worker nodes, actors on them and drivers off the head that waited
# reconnect. They wait RAY_gcs_rpc_server_reconnect_timeout_s (Ray's default 60 s; set it in the
# environment of local-up, --add-worker and the driver to wait longer), and exit after that. A driver on
# the head dies with it; `raybench sweep ... --resume` then completes the sweep. On one machine a driver
# joins the head's node unless RAYBENCH_NODE_TEMP_DIR names the temp dir of the node it should join
# (--add-worker prints it). KubeRay: docs/how-to/cluster.md, "The head restarted" (gcsFaultToleranceOptions).
#
# Worker nodes. A worker node is `ray start --address` on the head's GCS: its own raylet, object store,
# agents and temp dir, so on one machine it fails the way a second machine would (kill its recorded PIDs
# and the node is gone, workers, object store and all). Node K (1, 2, ...) takes the port block
# RAYBENCH_PORT_BASE + 200*K (`--print-ports --add-worker` shows it), so a cluster with W worker nodes
# spans (W+1) blocks of 200: give a second cluster a base that far away. Each node offers
# RAYBENCH_WORKER_CPUS CPUs (default 1) and the custom resource raybench_worker (as many as its CPUs;
# RAYBENCH_WORKER_RESOURCES, a JSON object, replaces it), and carries the node label raybench.node=worker-K
# (the head: raybench.node=head). `raybench sweep --worker-resource raybench_worker=1` places every trial
# worker on a worker node, and each trial's record names the node it ran on. Its state is
# $RAYBENCH_CLUSTER_DIR/nodes/worker-K/ (ports.env, ray.pids, ray_temp_dir); local-down stops it too,
# or alone with `local-down.sh --node worker-K`.
#
# Ports. Every port is chosen here, none is left to Ray's defaults (52365, 44217, 44227, 10001, random
# worker ports...), so that another Ray on the host cannot take one of ours. They form one block of 200
# from RAYBENCH_PORT_BASE (default 24000: clear of Ray's defaults, of Ray's default worker ports
# 10002-19999 and of Linux's ephemeral range); clusters whose bases are 200 or more apart never collide.
# Each port can be overridden on its own:
#   +0   RAY_PORT                              GCS (what `ray start --address` and `ray status` dial)
#   +1   DASHBOARD_PORT                        dashboard and job API (http://127.0.0.1:PORT)
#   +2   RAYBENCH_DASHBOARD_AGENT_LISTEN_PORT  dashboard agent, HTTP (the job agent)
#   +3   RAYBENCH_DASHBOARD_AGENT_GRPC_PORT    dashboard agent, gRPC
#   +4   RAYBENCH_RUNTIME_ENV_AGENT_PORT       runtime-env agent
#   +5   RAYBENCH_METRICS_EXPORT_PORT          Prometheus metrics of the node
#   +6   RAYBENCH_NODE_MANAGER_PORT            raylet
#   +7   RAYBENCH_OBJECT_MANAGER_PORT          object manager
#   +8   RAYBENCH_CLIENT_SERVER_PORT           Ray client server (ray://); never within 10002-19999
#   +9   DASHBOARD_METRIC_PORT                 dashboard's own metrics (Ray reads this variable itself)
#   +10  AUTOSCALER_METRIC_PORT                autoscaler monitor's metrics (Ray reads this variable itself)
#   +11  MLFLOW_PORT                           MLflow server
#   +12  RAYBENCH_REDIS_PORT                   Redis of the GCS (only with RAYBENCH_GCS_FT=1)
#   +20..+199  RAYBENCH_MIN_WORKER_PORT..RAYBENCH_MAX_WORKER_PORT   Ray worker processes
# Other settings: RAY_NUM_CPUS (default: all cores), RAY_TRIAL_DRIVERS (default 8), RAYBENCH_BIN (the
# venv's bin), RAYBENCH_START_TIMEOUT (seconds to wait for the job agent and for MLflow, default 180),
# RAYBENCH_MLFLOW_WORKERS (the MLflow server's worker processes, default 1: each one imports MLflow and
# holds its own database connections, and a local cluster's drivers log through one easily; MLflow's
# own default is 4).
#
# Temp dir. Ray keeps its sockets, logs and session files in a temp dir. By default local-up creates a
# fresh one (/tmp/rb-XXXXXX: UNIX socket paths must stay short) and marks it with a file naming the
# state dir; local-down deletes only a folder that carries that mark. RAY_TEMP_DIR may name another
# one, but only a new or empty folder (or one this state dir marked): anything else is refused.
#
# Exit status: 0 up and accepting jobs (or the worker node joined); 2 refused before starting anything (bad setting, busy port,
# unsafe temp dir, a cluster already recorded); 1 something failed to start (what did start is stopped
# again and Ray's logs are kept under the state dir).
#
# Note: only the dashboard and MLflow honour 127.0.0.1; Ray's GCS, raylet and agents listen on all
# interfaces (Ray 2.60), so the head enables Ray's token auth unless RAY_AUTH_MODE says otherwise.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
bin="${RAYBENCH_BIN:-$repo/.venv/bin}"
state="$(realpath -m -- "${RAYBENCH_CLUSTER_DIR:-$repo/.cluster}")"
cpus="${RAY_NUM_CPUS:-$(nproc)}"
drivers="${RAY_TRIAL_DRIVERS:-8}"
start_timeout="${RAYBENCH_START_TIMEOUT:-180}"
marker_name=".raybench-cluster"   # inside the temp dir; its content is the state dir that owns it
max_temp_dir_len=40               # Ray adds ~65 characters below it for socket paths (limit 107)

worker_cpus="${RAYBENCH_WORKER_CPUS:-1}"
gcs_ft="${RAYBENCH_GCS_FT:-0}"
mlflow_workers="${RAYBENCH_MLFLOW_WORKERS:-1}"
worker_nodes="${RAYBENCH_WORKER_NODES:-0}"

refuse() { echo "local-up: $*" >&2; exit 2; }

# The port plan: name=port lines, in the order of the table above.
plan_ports() {
  local base="${RAYBENCH_PORT_BASE:-24000}"
  [[ "$base" =~ ^[0-9]+$ ]] || refuse "RAYBENCH_PORT_BASE must be a number, not '$base'"
  ports=(
    "RAY_PORT=${RAY_PORT:-$((base + 0))}"
    "DASHBOARD_PORT=${DASHBOARD_PORT:-$((base + 1))}"
    "RAYBENCH_DASHBOARD_AGENT_LISTEN_PORT=${RAYBENCH_DASHBOARD_AGENT_LISTEN_PORT:-$((base + 2))}"
    "RAYBENCH_DASHBOARD_AGENT_GRPC_PORT=${RAYBENCH_DASHBOARD_AGENT_GRPC_PORT:-$((base + 3))}"
    "RAYBENCH_RUNTIME_ENV_AGENT_PORT=${RAYBENCH_RUNTIME_ENV_AGENT_PORT:-$((base + 4))}"
    "RAYBENCH_METRICS_EXPORT_PORT=${RAYBENCH_METRICS_EXPORT_PORT:-$((base + 5))}"
    "RAYBENCH_NODE_MANAGER_PORT=${RAYBENCH_NODE_MANAGER_PORT:-$((base + 6))}"
    "RAYBENCH_OBJECT_MANAGER_PORT=${RAYBENCH_OBJECT_MANAGER_PORT:-$((base + 7))}"
    "RAYBENCH_CLIENT_SERVER_PORT=${RAYBENCH_CLIENT_SERVER_PORT:-$((base + 8))}"
    "DASHBOARD_METRIC_PORT=${DASHBOARD_METRIC_PORT:-$((base + 9))}"
    "AUTOSCALER_METRIC_PORT=${AUTOSCALER_METRIC_PORT:-$((base + 10))}"
    "MLFLOW_PORT=${MLFLOW_PORT:-$((base + 11))}"
    "RAYBENCH_REDIS_PORT=${RAYBENCH_REDIS_PORT:-$((base + 12))}"
    "RAYBENCH_MIN_WORKER_PORT=${RAYBENCH_MIN_WORKER_PORT:-$((base + 20))}"
    "RAYBENCH_MAX_WORKER_PORT=${RAYBENCH_MAX_WORKER_PORT:-$((base + 199))}"
  )
  local entry
  for entry in "${ports[@]}"; do
    [[ "${entry#*=}" =~ ^[0-9]+$ ]] || refuse "${entry%%=*} must be a number, not '${entry#*=}'"
    declare -g "${entry%%=*}=${entry#*=}"
  done
}

# A worker node's port plan (the head's must exist: it is read from $state/ports.env when the head runs):
# block RAYBENCH_PORT_BASE + 200*K, laid out as the head's; a worker node has no GCS, dashboard, client
# server or MLflow, so those lines are absent.
plan_worker_ports() {
  local k="$1" base="${RAYBENCH_PORT_BASE:-24000}"
  [[ "$base" =~ ^[0-9]+$ ]] || refuse "RAYBENCH_PORT_BASE must be a number, not '$base'"
  base=$((base + 200 * k))
  worker_ports=(
    "RAYBENCH_DASHBOARD_AGENT_LISTEN_PORT=$((base + 2))"
    "RAYBENCH_DASHBOARD_AGENT_GRPC_PORT=$((base + 3))"
    "RAYBENCH_RUNTIME_ENV_AGENT_PORT=$((base + 4))"
    "RAYBENCH_METRICS_EXPORT_PORT=$((base + 5))"
    "RAYBENCH_NODE_MANAGER_PORT=$((base + 6))"
    "RAYBENCH_OBJECT_MANAGER_PORT=$((base + 7))"
    "RAYBENCH_MIN_WORKER_PORT=$((base + 20))"
    "RAYBENCH_MAX_WORKER_PORT=$((base + 199))"
  )
  (( base + 199 <= 65535 )) || refuse "worker node $k's port block $base-$((base + 199)) goes past 65535; lower RAYBENCH_PORT_BASE"
}

# Ports must be valid, distinct, and outside the worker range; the client server also outside Ray's
# default worker range, where the workers of any other Ray on the host bind.
validate_ports() {
  local entry name port seen=" "
  (( RAYBENCH_MIN_WORKER_PORT >= 1024 && RAYBENCH_MIN_WORKER_PORT < RAYBENCH_MAX_WORKER_PORT
     && RAYBENCH_MAX_WORKER_PORT <= 65535 )) \
    || refuse "worker ports $RAYBENCH_MIN_WORKER_PORT-$RAYBENCH_MAX_WORKER_PORT are not a range within 1024-65535"
  for entry in "${ports[@]:0:13}"; do
    name="${entry%%=*}" port="${entry#*=}"
    (( port >= 1024 && port <= 65535 )) || refuse "$name=$port is outside 1024-65535"
    [[ "$seen" != *" $port "* ]] || refuse "$name=$port is used twice in the port plan"
    seen+="$port "
    (( port < RAYBENCH_MIN_WORKER_PORT || port > RAYBENCH_MAX_WORKER_PORT )) \
      || refuse "$name=$port lies in the worker port range $RAYBENCH_MIN_WORKER_PORT-$RAYBENCH_MAX_WORKER_PORT"
  done
  (( RAYBENCH_CLIENT_SERVER_PORT < 10002 || RAYBENCH_CLIENT_SERVER_PORT > 19999 )) \
    || refuse "RAYBENCH_CLIENT_SERVER_PORT=$RAYBENCH_CLIENT_SERVER_PORT collides with Ray's default worker ports 10002-19999"
}

# Refuse before starting anything if another process holds one of our ports: Ray would otherwise start
# half a cluster (a busy agent port only shows up later, as "No available agent to submit job").
check_ports_free() {
  "$bin/python" - "$@" <<'PY' || exit 2
import socket, sys
plan = dict(arg.split("=", 1) for arg in sys.argv[1:])
fixed = [(name, int(port)) for name, port in plan.items() if not name.endswith("_WORKER_PORT")]
lo, hi = int(plan.get("RAYBENCH_MIN_WORKER_PORT", 1)), int(plan.get("RAYBENCH_MAX_WORKER_PORT", 0))
workers = [(f"worker port range {lo}-{hi}", port) for port in range(lo, hi + 1)]  # none when not given
for name, port in fixed + workers:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT, not a listener
        try:
            s.bind(("0.0.0.0", port))  # Ray's GCS and raylet bind all interfaces
        except OSError:
            sys.exit(f"local-up: port {port} ({name}) is already in use; choose another RAYBENCH_PORT_BASE")
PY
}

# The path that names this cluster's temp dir, without creating anything yet.
choose_temp_dir() {
  if [ -z "${RAY_TEMP_DIR:-}" ]; then
    ray_tmp=""   # created fresh by claim_temp_dir
    return
  fi
  [ ! -L "$RAY_TEMP_DIR" ] || refuse "RAY_TEMP_DIR=$RAY_TEMP_DIR is a symlink; give a real, new or empty folder"
  ray_tmp="$(realpath -m -- "$RAY_TEMP_DIR")"
  (( ${#ray_tmp} <= max_temp_dir_len )) \
    || refuse "RAY_TEMP_DIR=$ray_tmp is longer than $max_temp_dir_len characters (Ray's socket paths must stay short)"
  [ -d "$(dirname -- "$ray_tmp")" ] || refuse "RAY_TEMP_DIR=$ray_tmp: its parent folder does not exist"
  # local-down deletes the temp dir as a whole: it must neither be nor hold the state dir (mlflow.db...).
  [[ "$state/" != "$ray_tmp/"* && "$ray_tmp/" != "$state/"* ]] \
    || refuse "RAY_TEMP_DIR=$ray_tmp must lie outside the state dir $state, and not contain it"
  if [ -e "$ray_tmp" ]; then
    [ -d "$ray_tmp" ] || refuse "RAY_TEMP_DIR=$ray_tmp is not a folder"
    [ -z "$(ls -A -- "$ray_tmp")" ] || [ "$(cat -- "$ray_tmp/$marker_name" 2>/dev/null)" = "$state" ] \
      || refuse "RAY_TEMP_DIR=$ray_tmp is not empty and was not created by local-up for $state; refusing to use it"
  fi
}

# Create (or adopt the empty) temp dir and mark it as ours, naming the state dir.
claim_temp_dir() {
  if [ -z "$ray_tmp" ]; then
    ray_tmp="$(mktemp -d /tmp/rb-XXXXXX)"
  elif [ ! -d "$ray_tmp" ]; then
    mkdir -- "$ray_tmp"
  fi
  printf '%s\n' "$state" > "$ray_tmp/$marker_name"
  printf '%s\n' "$ray_tmp" > "$state/ray_temp_dir"
}

# On failure after something started: keep Ray's logs, stop what started, say where to look.
fail() {
  trap - ERR INT TERM
  local logs="$state/ray-logs"
  # Interrupted before the PIDs were recorded: record them now, or local-down could not stop them.
  [ -s "$state/ray.pids" ] || [ -z "${started_at:-}" ] || record_ray_pids "$ray_tmp" "$started_at" "$state/ray.pids" "${ports[@]}" || true
  if [ -d "$ray_tmp/session_latest/logs" ]; then
    rm -rf -- "$logs" && cp -rL -- "$ray_tmp/session_latest/logs" "$logs" 2>/dev/null || true
  fi
  "$here/local-down.sh" > "$state/local-down.log" 2>&1 || true
  echo "local-up: $*" >&2
  exit 1
}

# Token auth needs a token before `ray start`. Without one configured (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH
# or ~/.ray/auth_token), make the default one, as Ray's own ray.init() does for a new local cluster.
ensure_auth_token() {
  [ "$RAY_AUTH_MODE" = token ] || return 0
  [ -n "${RAY_AUTH_TOKEN:-}" ] || [ -n "${RAY_AUTH_TOKEN_PATH:-}" ] || [ -s "$HOME/.ray/auth_token" ] || \
    "$bin/ray" get-auth-token --generate > /dev/null 2>> "$state/ray-start.log" \
    || fail "could not generate a Ray auth token (ray get-auth-token --generate); see $state/ray-start.log"
}

# The ports every node (head or worker) takes from its own port plan, as `ray start` flags; and no log monitor:
# it streams every worker's output to drivers that ask for it, and every raybench driver sets
# log_to_driver=False (a trial's output stays in its node's session logs, which `ray job logs` and the
# dashboard read without it).
node_port_flags() {
  node_flags=(
    --include-log-monitor=false
    --dashboard-agent-listen-port="$RAYBENCH_DASHBOARD_AGENT_LISTEN_PORT"
    --dashboard-agent-grpc-port="$RAYBENCH_DASHBOARD_AGENT_GRPC_PORT"
    --runtime-env-agent-port="$RAYBENCH_RUNTIME_ENV_AGENT_PORT"
    --metrics-export-port="$RAYBENCH_METRICS_EXPORT_PORT"
    --node-manager-port="$RAYBENCH_NODE_MANAGER_PORT"
    --object-manager-port="$RAYBENCH_OBJECT_MANAGER_PORT"
    --min-worker-port="$RAYBENCH_MIN_WORKER_PORT" --max-worker-port="$RAYBENCH_MAX_WORKER_PORT"
  )
}

start_ray() {
  node_port_flags
  local redis=()
  [ "$gcs_ft" = 1 ] && redis=("RAY_REDIS_ADDRESS=127.0.0.1:$RAYBENCH_REDIS_PORT")
  env "${redis[@]}" "$bin/ray" start --head --node-ip-address=127.0.0.1 \
    --port="$RAY_PORT" \
    --dashboard-host=127.0.0.1 --dashboard-port="$DASHBOARD_PORT" \
    "${node_flags[@]}" --ray-client-server-port="$RAYBENCH_CLIENT_SERVER_PORT" \
    --num-cpus="$cpus" --resources="{\"trial_driver\": $drivers}" --labels="raybench.node=head" \
    --temp-dir="$ray_tmp" --disable-usage-stats >> "$state/ray-start.log" 2>&1
}

# Record "pid create_time" of every process a node started (`record_ray_pids TEMP_DIR SINCE FILE PORT_PLAN...`),
# so that local-down stops exactly these (the create time tells a reused PID apart). Ours: started after
# SINCE and either naming the node's temp dir on the command line (GCS, raylet, dashboard, monitors) or
# listening on one of its ports (the Ray client server names neither), plus their descendants (agents, workers).
record_ray_pids() {
  local tmp="$1" since="$2" out="$3"
  shift 3
  "$bin/python" - "$tmp" "$since" "$@" > "$out" <<'PY'
import os, re, sys
import psutil
tmp, since = sys.argv[1], float(sys.argv[2]) - 1.0  # create times are rounded to the clock tick
plan = dict(arg.split("=", 1) for arg in sys.argv[3:])
not_ray = ("RAYBENCH_REDIS_PORT", "MLFLOW_PORT")  # started and stopped on their own (redis.pid, mlflow.pid)
ours_ports = {int(p) for n, p in plan.items() if not n.endswith("_WORKER_PORT") and n not in not_ray}

names = re.compile(r"(?:^|[=:,\s'\"])" + re.escape(tmp) + r"(?:/|$|[:,\s'\"])")  # the dir, not /tmp/rb-abc

def names_temp_dir(cmdline):
    return any(names.search(arg) for arg in cmdline)

listeners = {c.pid for c in psutil.net_connections("inet")
             if c.pid and c.status == psutil.CONN_LISTEN and c.laddr.port in ours_ports}
found = {}
for proc in psutil.process_iter(["cmdline", "create_time"]):
    if proc.pid == os.getpid() or proc.info["create_time"] is None or proc.info["create_time"] < since:
        continue
    if names_temp_dir(proc.info["cmdline"] or []) or proc.pid in listeners:
        try:
            for p in [proc, *proc.children(recursive=True)]:
                found[p.pid] = p.create_time()
        except psutil.NoSuchProcess:
            continue
for pid, created in sorted(found.items()):
    print(pid, repr(created))
PY
}

start_mlflow() {
  # setsid: the server and its workers form one process group, which local-down.sh stops as a whole.
  # MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false: no job runner (MLflow's GenAI scorers, which raybench never
  # submits): it is six Huey consumer processes that each import MLflow and poll while the cluster is up.
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}" setsid "$bin/mlflow" server --host 127.0.0.1 --port "$MLFLOW_PORT" --workers "$mlflow_workers" \
    --backend-store-uri "sqlite:///$state/mlflow.db" --artifacts-destination "$state/mlflow-artifacts" \
    > "$state/mlflow.log" 2>&1 < /dev/null &
  echo $! > "$state/mlflow.pid"
}

# GCS fault tolerance: a Redis of the cluster's own, bound to 127.0.0.1, in memory (it outlives the head,
# not the machine), in its own process group so that local-down stops it by its recorded PID.
check_gcs_ft_setting() {
  [[ "$gcs_ft" =~ ^[01]$ ]] || refuse "RAYBENCH_GCS_FT must be 0 or 1, not '$gcs_ft'"
  [ "$gcs_ft" = 0 ] || command -v redis-server > /dev/null \
    || refuse "RAYBENCH_GCS_FT=1 needs redis-server (Debian package redis-server), which is not on PATH"
}

start_redis() {
  mkdir -p "$state/redis"
  setsid redis-server --bind 127.0.0.1 --port "$RAYBENCH_REDIS_PORT" --protected-mode yes --dir "$state/redis" \
    --save "" --appendonly no --daemonize no > "$state/redis.log" 2>&1 < /dev/null &
  echo $! > "$state/redis.pid"
  local deadline=$((SECONDS + start_timeout))
  while (( SECONDS < deadline )); do
    [ "$(redis-cli -h 127.0.0.1 -p "$RAYBENCH_REDIS_PORT" ping 2>/dev/null)" = PONG ] && return 0
    kill -0 "$(cat "$state/redis.pid")" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}

# --restart-head: the head's Ray processes are gone (a crash, a kill, a reboot of its pod) but its record,
# its Redis and its temp dir are not. Start the head again with the settings and ports it had; the GCS
# reloads the cluster's state from Redis. MLflow is started again only if it is gone too.
restart_head() {
  [ -f "$state/ray_temp_dir" ] && [ -f "$state/head.env" ] \
    || refuse "no head is recorded in $state; start one with cluster/local-up.sh"
  # shellcheck disable=SC1091
  source "$state/head.env"
  [ "$gcs_ft" = 1 ] \
    || refuse "the head in $state was started without GCS fault tolerance (RAYBENCH_GCS_FT=1): a restarted head would start an empty cluster; stop it with local-down.sh and start again"
  kill -0 "$(cat "$state/redis.pid" 2>/dev/null)" 2>/dev/null \
    || refuse "the GCS's Redis recorded in $state/redis.pid is not running: the cluster's state is lost; stop it with local-down.sh and start again"
  local entry
  while IFS= read -r entry; do declare -g "${entry%%=*}=${entry#*=}"; done < "$state/ports.env"
  mapfile -t ports < "$state/ports.env"
  ray_tmp="$(cat "$state/ray_temp_dir")"
  [ "$(cat -- "$ray_tmp/$marker_name" 2>/dev/null)" = "$state" ] \
    || refuse "the recorded temp dir $ray_tmp is not marked as this cluster's; refusing to start a head in it"
  "$bin/python" - "$state/ray.pids" <<'PY' || refuse "the head recorded in $state is still running; stop it first (cluster/local-down.sh stops the whole cluster)"
import os, sys
import psutil
lines = open(sys.argv[1]).read().split("\n") if os.path.exists(sys.argv[1]) else []
for pid, created in (line.split() for line in lines if line.strip()):
    try:
        proc = psutil.Process(int(pid))
        if abs(proc.create_time() - float(created)) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
            sys.exit(1)
    except psutil.NoSuchProcess:
        pass
PY
  # The head's own ports must be free again. Not its worker port range: drivers that joined the head's node
  # hold ports there, and Ray's workers take whichever are free.
  check_ports_free $(grep -v -e _WORKER_PORT= -e ^MLFLOW_PORT= -e ^RAYBENCH_REDIS_PORT= "$state/ports.env")
  # `ray start --head` refuses a GCS address that the temp dir names and any process on the host still
  # dials: the surviving worker nodes do. The dead head's record of its address goes.
  rm -f -- "$ray_tmp/ray_current_cluster"
  set -E
  trap 'echo "local-up: the head did not restart (line $LINENO); see $state/ray-start.log" >&2; exit 1' ERR
  export RAY_USAGE_STATS_ENABLED=0 MLFLOW_DISABLE_TELEMETRY=true RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
  export DASHBOARD_METRIC_PORT AUTOSCALER_METRIC_PORT PATH="$bin:$PATH"
  started_at="$(date +%s.%N)"
  local ray_ok=1
  start_ray || ray_ok=0
  record_ray_pids "$ray_tmp" "$started_at" "$state/ray.pids" "${ports[@]}"
  (( ray_ok )) || { echo "local-up: ray start failed; see $state/ray-start.log" >&2; exit 1; }
  kill -0 "$(cat "$state/mlflow.pid" 2>/dev/null)" 2>/dev/null || { start_mlflow; wait_for_mlflow; }
  wait_for_job_agent || { echo "local-up: the restarted head accepted no job within ${start_timeout}s; see $state/ray-ready.log" >&2; exit 1; }
  echo "Head restarted: GCS 127.0.0.1:$RAY_PORT reloaded from Redis 127.0.0.1:$RAYBENCH_REDIS_PORT; dashboard http://127.0.0.1:$DASHBOARD_PORT"
}

# The dashboard answers before the head's job agent takes jobs ("No available agent to submit job"),
# so readiness is a real job: submit `true` through the job API until one SUCCEEDS, within the deadline.
wait_for_job_agent() {
  "$bin/python" - "http://127.0.0.1:$DASHBOARD_PORT" "$start_timeout" > "$state/ray-ready.log" 2>&1 <<'PY'
import sys, time
from ray.job_submission import JobStatus, JobSubmissionClient
address, start = sys.argv[1], time.monotonic()
deadline = start + float(sys.argv[2])
log = lambda line: print(f"[{time.monotonic() - start:5.1f}s] {line}", flush=True)
while time.monotonic() < deadline:
    try:
        client = JobSubmissionClient(address)
        job = client.submit_job(entrypoint="true", metadata={"raybench": "local-up readiness probe"})
        while not (status := client.get_job_status(job)).is_terminal() and time.monotonic() < deadline:
            time.sleep(0.5)
        if status == JobStatus.SUCCEEDED:
            log(f"probe job {job} succeeded")
            sys.exit(0)
        log(f"probe job {job}: {status}: {client.get_job_info(job).message}")
    except Exception as error:  # the dashboard or the agent is still starting
        log(f"not ready: {type(error).__name__}: {error}")
    time.sleep(1)
sys.exit(1)
PY
}

wait_for_mlflow() {
  local deadline=$((SECONDS + start_timeout))
  while (( SECONDS < deadline )); do
    curl -fsS "http://127.0.0.1:$MLFLOW_PORT/health" > /dev/null 2>&1 && return 0
    kill -0 "$(cat "$state/mlflow.pid")" 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}

# ----- worker nodes ------------------------------------------------------------------------------------
# A worker node's own failure path: keep its logs, stop what it started (local-down --node), say where to look.
fail_node() {
  trap - ERR INT TERM
  [ -s "$node_state/ray.pids" ] || [ -z "${node_started_at:-}" ] \
    || record_ray_pids "$node_tmp" "$node_started_at" "$node_state/ray.pids" "${worker_ports[@]}" || true
  local logs="$state/$node-logs"
  if [ -d "$node_tmp/session_latest/logs" ]; then
    rm -rf -- "$logs" && cp -rL -- "$node_tmp/session_latest/logs" "$logs" 2>/dev/null || true
  fi
  "$here/local-down.sh" --node "$node" > "$state/$node-down.log" 2>&1 || true
  echo "local-up: $node: $*" >&2
  exit 1
}

# Returns once the GCS lists the node as alive under its label, within the start timeout.
wait_for_node() {
  "$bin/python" - "127.0.0.1:$RAY_PORT" "$node" "$start_timeout" >> "$node_state/ray-start.log" 2>&1 <<'PY'
import logging, sys, time
import ray
address, node, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
logging.getLogger("ray").setLevel(logging.ERROR)
ray.init(address=address, log_to_driver=False, configure_logging=False)
deadline = time.monotonic() + timeout
while time.monotonic() < deadline:
    if any(n["Alive"] and n.get("Labels", {}).get("raybench.node") == node for n in ray.nodes()):
        print(f"{node} joined the cluster at {address}")
        sys.exit(0)
    time.sleep(0.5)
sys.exit(f"{node} did not join the cluster at {address} within {timeout:g}s")
PY
}

# Claim the lowest free node number: mkdir is atomic, so two --add-worker at once never share one.
claim_node_number() {
  mkdir -p "$state/nodes"
  local k=1
  until mkdir -- "$state/nodes/worker-$k" 2>/dev/null; do k=$((k + 1)); done
  echo "$k"
}

next_node_number() {
  local k=1
  while [ -e "$state/nodes/worker-$k" ]; do k=$((k + 1)); done
  echo "$k"
}

check_worker_settings() {
  [[ "$worker_cpus" =~ ^[0-9]+$ ]] && (( worker_cpus >= 1 )) \
    || refuse "RAYBENCH_WORKER_CPUS must be a whole number >= 1, not '$worker_cpus'"
  [[ "$worker_nodes" =~ ^[0-9]+$ ]] || refuse "RAYBENCH_WORKER_NODES must be a whole number, not '$worker_nodes'"
  worker_resources="{\"raybench_worker\": $worker_cpus}"
  [ -z "${RAYBENCH_WORKER_RESOURCES:-}" ] || worker_resources="$RAYBENCH_WORKER_RESOURCES"
  "$bin/python" -c 'import json, sys
value = json.loads(sys.argv[1])
assert isinstance(value, dict) and all(isinstance(v, (int, float)) and v >= 0 for v in value.values())' \
    "$worker_resources" 2> /dev/null \
    || refuse "RAYBENCH_WORKER_RESOURCES must be a JSON object of resource amounts, like {\"raybench_worker\": 1}, not '$worker_resources'"
}

start_worker_node() {
  node_port_flags
  "$bin/ray" start --address="127.0.0.1:$RAY_PORT" --node-ip-address=127.0.0.1 "${node_flags[@]}" \
    --num-cpus="$worker_cpus" --resources="$worker_resources" --labels="raybench.node=$node" \
    --temp-dir="$node_tmp" --disable-usage-stats >> "$node_state/ray-start.log" 2>&1
}

# --add-worker: one more worker node for the head recorded in $state.
add_worker_node() {
  [ -f "$state/ray_temp_dir" ] && [ -f "$state/port_base" ] \
    || refuse "no running head is recorded in $state; start one with cluster/local-up.sh first"
  RAYBENCH_PORT_BASE="$(cat "$state/port_base")"
  RAY_PORT="$(sed -n 's/^RAY_PORT=//p' "$state/ports.env")"
  check_worker_settings
  local k
  k="$(next_node_number)"
  plan_worker_ports "$k"
  check_ports_free "${worker_ports[@]}"
  k="$(claim_node_number)"
  plan_worker_ports "$k"
  node="worker-$k" node_state="$state/nodes/worker-$k"
  local entry
  for entry in "${worker_ports[@]}"; do declare -g "${entry%%=*}=${entry#*=}"; done
  node_tmp="$(mktemp -d /tmp/rb-XXXXXX)"
  printf '%s\n' "$node_state" > "$node_tmp/$marker_name"
  printf '%s\n' "$node_tmp" > "$node_state/ray_temp_dir"
  printf '%s\n' "${worker_ports[@]}" > "$node_state/ports.env"
  set -E
  trap 'fail_node "unexpected error at line $LINENO of $0"' ERR
  trap 'fail_node "interrupted; stopped what had started"' INT TERM
  export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
  node_started_at="$(date +%s.%N)"
  local ray_ok=1
  start_worker_node || ray_ok=0
  record_ray_pids "$node_tmp" "$node_started_at" "$node_state/ray.pids" "${worker_ports[@]}" \
    || fail_node "could not record the Ray processes of $node_tmp"
  (( ray_ok )) || fail_node "ray start failed; see $node_state/ray-start.log"
  wait_for_node || fail_node "did not join within ${start_timeout}s; see $node_state/ray-start.log"
  echo "Worker node:    $node ($worker_cpus CPU, resources $worker_resources, label raybench.node=$node; temp dir $node_tmp)"
  echo "A driver on it: RAYBENCH_NODE_TEMP_DIR=$node_tmp raybench sweep ... --address 127.0.0.1:$RAY_PORT"
  echo "Stop it alone:  RAYBENCH_CLUSTER_DIR=$state cluster/local-down.sh --node $node"
}

# ----- main ---------------------------------------------------------------------------------------------
usage="usage: cluster/local-up.sh [--print-ports | --add-worker | --restart-head]   (settings come from the environment; see the top of $0)"
case "${1:-}" in
  "" | --print-ports) ;;
  --add-worker) add_worker_node; exit 0 ;;
  --restart-head) [ $# -eq 1 ] || refuse "$usage"; restart_head; exit 0 ;;
  *) refuse "$usage" ;;
esac
[ $# -le 1 ] || refuse "$usage"
plan_ports
validate_ports
check_worker_settings
check_gcs_ft_setting
[[ "$mlflow_workers" =~ ^[0-9]+$ ]] && (( mlflow_workers >= 1 )) \
  || refuse "RAYBENCH_MLFLOW_WORKERS must be a whole number >= 1, not '$mlflow_workers'"
if [ "${1:-}" = "--print-ports" ]; then
  printf '%s\n' "${ports[@]}"
  for k in $(seq 1 "$worker_nodes"); do
    plan_worker_ports "$k"
    printf "WORKER_${k}_%s\n" "${worker_ports[@]}"
  done
  exit 0
fi
[ ! -f "$state/ray_temp_dir" ] \
  || refuse "a cluster recorded in $state is still up; run cluster/local-down.sh first"
choose_temp_dir
check_ports_free "${ports[@]}"
for k in $(seq 1 "$worker_nodes"); do
  plan_worker_ports "$k"
  check_ports_free "${worker_ports[@]}"
done

mkdir -p "$state/mlflow-artifacts"
rm -f -- "$state/ray.pids" "$state/ray-start.log" "$state/ray-ready.log" "$state/local-down.log"
rm -rf -- "$state/ray-logs"
claim_temp_dir
# From here on, any unexpected error stops what was started instead of leaving half a cluster behind.
set -E
trap 'fail "unexpected error at line $LINENO of $0"' ERR
trap 'fail "interrupted; stopped what had started"' INT TERM
printf '%s\n' "${ports[@]}" > "$state/ports.env"
printf '%s\n' "${RAYBENCH_PORT_BASE:-24000}" > "$state/port_base"
printf 'cpus=%q\ndrivers=%q\ngcs_ft=%q\n' "$cpus" "$drivers" "$gcs_ft" > "$state/head.env"   # what --restart-head starts again

# Submitted jobs inherit the head's environment: PATH so that `raybench` resolves to this install.
# Token auth, because the GCS and raylet listen on all interfaces (RAY_AUTH_MODE=disabled opts out).
export RAY_USAGE_STATS_ENABLED=0 MLFLOW_DISABLE_TELEMETRY=true RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
export DASHBOARD_METRIC_PORT AUTOSCALER_METRIC_PORT   # Ray has no flags for these two
export PATH="$bin:$PATH"

ensure_auth_token
if [ "$gcs_ft" = 1 ]; then
  start_redis || fail "redis-server did not start on 127.0.0.1:$RAYBENCH_REDIS_PORT; see $state/redis.log"
fi
# MLflow first: its server takes longer to answer than Ray (imports, the store's migrations) and needs
# nothing from Ray, so it starts while Ray does. It is recorded in mlflow.pid, not in ray.pids.
start_mlflow
started_at="$(date +%s.%N)"
ray_ok=1
start_ray || ray_ok=0
record_ray_pids "$ray_tmp" "$started_at" "$state/ray.pids" "${ports[@]}" || fail "could not record the Ray processes of $ray_tmp"
(( ray_ok )) || fail "ray start failed; see $state/ray-start.log"
wait_for_job_agent \
  || fail "the head accepted no job within ${start_timeout}s; see $state/ray-ready.log and $state/ray-logs/dashboard_agent.log"
wait_for_mlflow || fail "MLflow did not start within ${start_timeout}s; see $state/mlflow.log"
for k in $(seq 1 "$worker_nodes"); do
  "$0" --add-worker || fail "worker node $k did not start (see above)"
done

cat <<MSG
Ray dashboard:  http://127.0.0.1:$DASHBOARD_PORT   (RAY_AUTH_MODE=$RAY_AUTH_MODE ray job submit --address http://127.0.0.1:$DASHBOARD_PORT ...)
MLflow:         http://127.0.0.1:$MLFLOW_PORT   (raybench sweep ... --tracking-uri http://127.0.0.1:$MLFLOW_PORT)
Ray GCS:        127.0.0.1:$RAY_PORT   (raybench sweep ... --address 127.0.0.1:$RAY_PORT; worker nodes: $worker_nodes)
Ray temp dir:   $ray_tmp   (ports: $state/ports.env)
GCS state:      $([ "$gcs_ft" = 1 ] && echo "Redis 127.0.0.1:$RAYBENCH_REDIS_PORT (a dead head: cluster/local-up.sh --restart-head)" || echo "in the head's memory (RAYBENCH_GCS_FT=1 keeps it in Redis)")
Stop all:       RAYBENCH_CLUSTER_DIR=$state cluster/local-down.sh
MSG
