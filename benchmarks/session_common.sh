# The helpers of the one-lease GPU session drivers (benchmarks/session_v7.sh, session_v8.sh, session_v9.sh):
# sourced, never run. The driver sets SESSION (its name: the bundle's), S (the state directory),
# OUT and total (this call's seconds) first, and TORCH_BOUNDARY for torch_boundaries.
end=$(( $(date +%s) + total ))
left() { echo $(( end - $(date +%s) - ${1:-0} )); }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT" "$S"
[ -f $S/session_id ] || echo "gpu-$(date -u +%Y%m%dT%H%M%SZ)-$RANDOM" > $S/session_id
export GPU_SESSION_ID=$(cat $S/session_id)
LOG=$S/driver.log
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a $LOG; }
MEM_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -d ' ')
MEM_MIB=${MEM_MIB:-143771}
MEM_BYTES=$(( MEM_MIB * 1048576 ))
# --out names the state itself: one results file (sessions up to v19 also wrote a byte copy, small_steps_raw.json)
LFL="python3 benchmarks/trainer/like_for_like.py --stages ${LFL_STAGES:-small} --state $S/lfl_state.json --out $S/lfl_state.json --raw-log $S/small_steps_raw.log"

bundle() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv >> $S/nvidia_smi.log 2>&1
  tar -czf "$OUT/$SESSION.tgz" -C "$S" --exclude='*.tgz' --exclude='*.json.gz' --exclude=./tree . 2>/dev/null
  # the profiles' traces apart (a file comes back only under 16 MiB): as many as fit, smallest first
  rm -f "$OUT"/traces_*.tar; local n=0 size=0 f
  for f in $(cd $S && ls -Sr *.json.gz 2>/dev/null); do
    size=$(( size + $(stat -c %s $S/$f) )); [ $size -gt 15000000 ] && { n=$(( n + 1 )); size=$(stat -c %s $S/$f); }
    tar -rf "$OUT/traces_$n.tar" -C "$S" "$f"
  done
  cp $LOG "$OUT/$SESSION.log"
}

machine() {
  { date -u; nvidia-smi; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)";
    python3 -c "import transformer_engine as t; print('transformer_engine', t.__version__)" 2>&1 | tail -1;
    # the host's CPUs as the trainer sees them (session v9: no CFS quota, no throttling on the
    # lent hosts; the slow synthetic batch was PyTorch's pool after an idle GPU step)
    echo "nproc $(nproc); cpu.max $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null)";
    python3 -c "import torch; print('torch threads', torch.get_num_threads(), torch.__config__.parallel_info().splitlines()[:8])";
    grep -E "nr_throttled|throttled_usec" /sys/fs/cgroup/cpu.stat 2>/dev/null;
    echo "session $GPU_SESSION_ID"; } >> $S/machine.txt 2>&1
}

# the te stage's start: TransformerEngine importable (the script exits 3 if not), the machine
# recorded once
te_ready() {
  python3 -c "import transformer_engine as t; print('transformer_engine', t.__version__)" | tee -a $LOG || exit 3
  [ -f $S/te.machine ] || { machine; touch $S/te.machine; }
}

# step NAME CAP COMMAND...: once (a .done marker), at most CAP seconds or what is left.
step() {
  local name=$1 cap=$2; shift 2
  if [ -f $S/$name.done ]; then say "$name: done earlier"; return 0; fi
  local b; b=$(left 15); [ "$b" -gt "$cap" ] && b=$cap
  if [ "$b" -lt 40 ]; then say "$name: not enough time left ($b s)"; return 1; fi
  say "+ $* (budget $b s)"
  BUDGET=$b timeout $(( b + 60 )) "$@" >> $S/$name.log 2>&1
  local rc=$?
  if [ $rc -eq 0 ] && ! tail -5 $S/$name.log | grep -q "time budget reached"; then touch $S/$name.done; fi
  # "K ok lines" (the measure.py runs of the log so far): model_accuracy.run_times times each
  # run of a calibration file from these lines (the drift between the references)
  say "$name: rc $rc; $(grep -c '"status": "ok"' $S/$name.log) ok lines; last: $(tail -c 400 $S/$name.log | tail -2 | tr '\n' ' ')"
  return $rc
}

torch_boundaries() {
  [ -n "$TORCH_BOUNDARY" ] || return 0  # none asked for
  step boundary_torch "${1:-600}" bash -c "python3 benchmarks/memory/boundary.py --backend torch --configs '$TORCH_BOUNDARY' \
    --out $S/boundary_torch.json --gpu-memory-bytes $MEM_BYTES --time-budget \$BUDGET --run-timeout 150 --repeat 3 \
    $( [ -f $S/boundary_torch.json ] && echo --resume)"
}

small_left() { $LFL --dry-run 2>/dev/null | grep -c '^S/'; }

small_steps() {  # issue 40's table, resumable; at most $1 seconds of it in this call
  [ -f $S/small.done ] && return 0
  local b; b=$(left 15); [ "$b" -gt "$1" ] && b=$1
  [ "$b" -lt 40 ] && return 1
  say "+ small-step table (budget $b s; $(small_left) runs left)"
  timeout $(( b + 60 )) $LFL --time-budget $b >> $S/small.log 2>&1
  local n; n=$(small_left); say "small: $n runs left"; [ "$n" -eq 0 ] && touch $S/small.done
  $LFL --table $S/lfl_state.json > $S/small_table.md 2>&1
}

# the cgroup's throttling and the VM's steal time (/proc/stat's 8th cpu field, in USER_HZ ticks:
# a Firecracker guest's vCPUs may wait for the host's cores while the pool's threads spin)
cpu_stat() { say "cpu.stat $1: $(grep -E 'nr_throttled|throttled_usec' /sys/fs/cgroup/cpu.stat 2>/dev/null | tr '\n' ' ')steal $(awk '/^cpu /{print $9}' /proc/stat)"; }
# The torch backend's profiles (PROFILE_TORCH_SHAPES) plain, with --data-prefetch and with
# PyTorch's pool of one host thread per core, in one lease so that their idle ms compare like for
# like. Since session v9 "plain" is the trainer's one host thread per GPU process (session v8 and
# v9 ran plain with the pool, and v9 a third set with OMP_NUM_THREADS=1 in $S/omp1).
torch_profiles() {  # the steps' parameter costs (optimizer, FSDP copies, loss) without TE
  cpu_stat "before the torch profiles"
  step profile_torch 200 bash -c "python3 benchmarks/trainer/profile_step.py --backend torch \
    --shapes $PROFILE_TORCH_SHAPES --precisions bf16 --iters 4 --time-budget \$BUDGET --out-dir $S"
  # the same steps with --data-prefetch (the GPU's waits for the host's batch, session v8's first
  # profiles): in the same lease as the plain ones, so the idle ms compare like for like
  step profile_torch_prefetch 200 bash -c "python3 benchmarks/trainer/profile_step.py --backend torch \
    --shapes $PROFILE_TORCH_SHAPES --precisions bf16 --iters 4 --trainer-flags=--data-prefetch \
    --time-budget \$BUDGET --out-dir $S/prefetch"
  # and with the pool (what a one-GPU run had before session v9): the host's 4-20 ms batch on
  # this GPU's host, against the plain runs' one thread
  step profile_torch_pool 200 env OMP_NUM_THREADS=$(nproc) bash -c "python3 benchmarks/trainer/profile_step.py \
    --backend torch --shapes $PROFILE_TORCH_SHAPES --precisions bf16 --iters 4 \
    --time-budget \$BUDGET --out-dir $S/pool"
  cpu_stat "after the torch profiles"
}

# a measure.py split (benchmarks/throughput/measure.py), resumed from its own earlier partial file
MT="python3 benchmarks/throughput/measure.py --max-predicted-gib $(( MEM_MIB * 9 / 10240 ))"
mstep() {  # name split cap [more measure.py flags]
  local name=$1 split=$2 cap=$3 more=${4:-} prev=""
  [ -f $S/$name.json ] && cp $S/$name.json $S/$name.prev.json && prev="--resume $S/$name.prev.json"
  step "$name" "$cap" bash -c "$MT --split $split --out $S/$name.json --raw-log $S/${name}_raw.log --time-budget \$BUDGET $prev $more"
}

# The torch-backend boundaries in the background (the bg stage), from a copy of the tree, while
# TransformerEngine is carried and built: the te stage waits for them or stops them.
# BG_TORCH_SET=1 runs the torch set (measure.py --split torch, no TE needed) first, in the same
# background job: the GPU is otherwise idle while the wheel's parts are carried.
start_background_boundaries() {
  if [ -f $S/bg.started ]; then say "bg: already started"; bundle; return 0; fi
  machine
  local jobs=""
  [ "${BG_TORCH_SET:-0}" = 1 ] && [ ! -f $S/torch.done ] && jobs="mstep torch torch ${BG_TORCH_SET_S:-150}; "
  [ -n "$TORCH_BOUNDARY" ] && jobs="${jobs}torch_boundaries 600; "
  if [ -z "$jobs" ]; then say "bg: nothing asked for (no torch set, no torch boundaries)"; bundle; return 0; fi
  rm -rf $S/tree && mkdir -p $S/tree
  tar --exclude=./.git --exclude=./.te -cf - . | (cd $S/tree && tar -xf -)
  touch $S/bg.started
  end=$(( $(date +%s) + ${BG_BUDGET:-600} ))
  export -f step say left torch_boundaries mstep; export S LOG end TORCH_BOUNDARY MEM_BYTES MT
  (cd $S/tree && PYTHONPATH=$S/tree setsid bash -c "$jobs echo \$? > $S/bg.rc" < /dev/null > $S/bg.out 2>&1 &)
  sleep 3; say "bg: started: $jobs(session $GPU_SESSION_ID, GPU memory $MEM_MIB MiB)"; bundle
}

# one job on the GPU while timing: let the background boundaries end (at most BG_WAIT s), or stop them
wait_background() {
  if [ -f $S/bg.started ] && [ ! -f $S/bg.rc ]; then  # one job on the GPU while timing: let it end
    say "waiting for the background job (torch set, torch boundaries; at most ${BG_WAIT:-300} s)"
    for _ in $(seq $(( ${BG_WAIT:-300} / 5 ))); do [ -f $S/bg.rc ] && break; sleep 5; done
    if [ ! -f $S/bg.rc ]; then
      say "stopping the background job (the te stage resumes it)"
      pkill -f "boundary.py --backend torch"; pkill -f "boundary.py --one"  # the run in flight too
      pkill -f "measure.py .*--split torch"  # the torch set (BG_TORCH_SET): resumed by the te stage
      for _ in $(seq 20); do pgrep -f "boundary.py|measure.py .*--split torch" > /dev/null || break; sleep 1; done
    else say "background job: rc $(cat $S/bg.rc)"; fi
  fi
}
