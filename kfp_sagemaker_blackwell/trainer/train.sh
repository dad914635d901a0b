#!/usr/bin/env bash
# SageMaker entry point (SAGEMAKER_PROGRAM=train.sh): torchrun over this node's GPUs and the
# job's hosts, running `python -m kfp_sagemaker_blackwell.trainer`. Arguments are passed through to the trainer.
#
#   nproc per node  SM_NUM_GPUS when > 0, else TRAINER_NPROC_PER_NODE (default 1)
#   hosts           SM_HOSTS (JSON list) + SM_CURRENT_HOST, else $SM_INPUT_CONFIG_DIR/resourceconfig.json
#   --nnodes        number of hosts; --node_rank = index of the current host in the sorted hosts
#   master          MASTER_ADDR if set, else the first sorted host (single host: 127.0.0.1)
#   port            MASTER_PORT if set, else 29500
#   python          ${PYTHON:-python}
#
# SIGTERM (StopTrainingJob, spot interruption) is forwarded to the training workers only:
# they save a checkpoint and exit 0. (torchrun itself kills them TORCH_ELASTIC_SHUTDOWN_TIMEOUT
# after its own SIGTERM, 30 s by default, hence 110 here, and exits 1.) SageMaker signals the
# container's PID 1 only: the trainer image's entry point (images/trainer/entrypoint.py)
# delivers it to this script, torchrun and the workers alike. The exit status is torchrun's,
# except that a run the trainer reports as "stopped" after a checkpoint exits 0.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
PY="${PYTHON:-python}"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
config_dir="${SM_INPUT_CONFIG_DIR:-/opt/ml/input/config}"

nproc="${SM_NUM_GPUS:-0}"
if ! [[ "$nproc" =~ ^[0-9]+$ ]] || [ "$nproc" -le 0 ]; then
  nproc="${TRAINER_NPROC_PER_NODE:-1}"
fi

# "<nnodes> <node_rank> <first host>" from SM_HOSTS/SM_CURRENT_HOST or resourceconfig.json.
read -r nnodes node_rank first_host < <("$PY" - "$config_dir" <<'PYEOF'
import json, os, sys
hosts = json.loads(os.environ["SM_HOSTS"]) if os.environ.get("SM_HOSTS") else None
current = os.environ.get("SM_CURRENT_HOST")
path = os.path.join(sys.argv[1], "resourceconfig.json")
if hosts is None and os.path.isfile(path):
    rc = json.load(open(path))
    hosts, current = rc.get("hosts"), current or rc.get("current_host")
hosts = sorted(hosts or [current or "localhost"])
current = current or hosts[0]
rank = hosts.index(current) if current in hosts else 0
print(len(hosts), rank, hosts[0])
PYEOF
)
port="${MASTER_PORT:-29500}"
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT="${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-110}"

if [ "${nnodes:-1}" -le 1 ]; then
  # One host: a local rendezvous on the given (or default) port, like --standalone but
  # honouring MASTER_PORT so several local jobs can run side by side.
  launch=(--nnodes=1 --node_rank=0 --rdzv_backend=c10d --rdzv_endpoint="${MASTER_ADDR:-127.0.0.1}:$port")
else
  master="${MASTER_ADDR:-$first_host}"
  launch=(--nnodes="$nnodes" --node_rank="$node_rank" --master_addr="$master" --master_port="$port")
fi

echo "[train.sh] torchrun nproc_per_node=$nproc nnodes=${nnodes:-1} node_rank=${node_rank:-0} port=$port"
"$PY" -m torch.distributed.run --nproc_per_node="$nproc" "${launch[@]}" -m kfp_sagemaker_blackwell.trainer "$@" &
child=$!

forward_term() {
  local kids=()
  for stat in /proc/[0-9]*/stat; do
    read -r pid _ _ ppid _ < "$stat" 2>/dev/null || continue
    [ "$ppid" = "$child" ] && kids+=("$pid")
  done
  echo "[train.sh] SIGTERM: asking ${#kids[@]} worker(s) to checkpoint and stop"
  if [ "${#kids[@]}" -gt 0 ]; then kill -TERM "${kids[@]}" 2>/dev/null; else kill -TERM "$child"; fi
}
trap forward_term TERM INT

rc=0
while :; do
  wait "$child"; rc=$?
  kill -0 "$child" 2>/dev/null || break  # wait returned because of a trapped signal
done

if [ "$rc" -ne 0 ]; then
  metrics="${SM_OUTPUT_DATA_DIR:-/opt/ml/output/data}/metrics.json"
  if [ -f "$metrics" ] && "$PY" -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1])).get("status") == "stopped" else 1)' "$metrics"; then
    rc=0
  fi
fi
exit "$rc"
