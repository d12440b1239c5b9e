#!/usr/bin/env bash
# The GPU check for the first GPU host: every part of the GPU path a CPU cannot run, in one go, under 8
# minutes on one H200 (each part has its own time limit), nothing downloaded. Run from anywhere:
#
#     bench/gpu_check.sh            # PYTHON=... picks the interpreter (default python3)
#
# Needs the project installed as the GPU image installs it (compose's worker-gpu image, or
#   pip install torch==2.14.0 && pip install -c constraints-gpu.txt -e ".[vllm]"): vLLM 0.33 and CUDA.
#   1. rlvr doctor: the job's device is cuda:0, vLLM is installed, `engine: auto` would pick it;
#   2. bench/gpu_step.py at a shape that fits (Qwen2.5-0.5B shape, 4 prompts x 8, 128 new tokens; it
#      estimates its memory first): our sampler vs generate, micro-batched updates, 3 GRPO steps through
#      the trainer with a KL reference on the GPU;
#   3. bench/gpu_vllm.py: 3 GRPO steps on `engine: vllm` with sleep on, then off (each in a process of its
#      own: vLLM's sleep allocator and parallel state are per process), then 2 on `engine: auto`. Each
#      asserts a weight push after every step, log-probs within sqrt(eps(bf16)) of the trainer's, the
#      spec's settings in vLLM's config, vLLM on the job's GPU, and that held-out accuracy moved.
# Logs: $GPU_CHECK_LOG (default /tmp/gpu-check). Exit 0 only if every part passed. Last line: key=value
# figures (tokens/s and peak GPU memory of each part) and ok=0|1.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG=${GPU_CHECK_LOG:-/tmp/gpu-check}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p "$LOG"
t_start=$(date +%s)
failed=()
summary=()

# last_kv LOG KEY PREFIX: KEY=value from the log's last key=value line, as PREFIX_KEY=value
last_kv() { grep -E '(^| )[a-z_]+=' "$1" | tail -1 | tr ' ' '\n' | grep -E "^$2=" | sed "s/^/$3_/"; }

part() {  # part NAME LIMIT_S COMMAND...: run it, log it, keep its figures
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  echo "== $name (at most $limit s)"
  if timeout "$limit" "$@" >"$LOG/$name.log" 2>&1; then
    echo "   ok in $(( $(date +%s) - t0 )) s"
    grep -E '^(arch=|device=|engine=)' "$LOG/$name.log" | sed 's/^/   /'
  else
    echo "   FAILED ($?) in $(( $(date +%s) - t0 )) s; the end of $LOG/$name.log:"
    grep -v -E 'WARNING|INFO' "$LOG/$name.log" | tail -15 | sed 's/^/   | /'
    failed+=("$name")
  fi
}

if ! "$PY" -c "import torch, vllm; assert torch.cuda.is_available(), 'no CUDA device'; \
print('torch', torch.__version__, 'vllm', vllm.__version__, torch.cuda.get_device_name())"; then
  echo "gpu_check: needs CUDA and vLLM in $PY (see the top of bench/gpu_check.sh)"
  echo "ok=0 reason=no_cuda_or_vllm"
  exit 1
fi

part doctor 90 "$PY" -c "
import json, subprocess, sys
out = subprocess.run([sys.executable, '-m', 'service.cli', 'doctor', '--json'], capture_output=True, text=True)
r = json.loads(out.stdout.strip().splitlines()[-1])
print(json.dumps({k: r[k] for k in ('device', 'engine', 'vllm_installed', 'torch', 'cuda_build', 'cuda_devices')}))
bad = [k for k, want in (('device', 'cuda:0'), ('engine', 'vllm'), ('vllm_installed', True)) if r[k] != want]
print('device=' + r['device'] + ' engine=' + r['engine'] + ' ok=' + str(int(not bad)))
sys.exit(1 if bad else 0)"

part gpu_step 240 "$PY" bench/gpu_step.py --arch qwen2.5-0.5b --prompts 4 --group 8 --max-new-tokens 128
summary+=("$(last_kv "$LOG/gpu_step.log" tokens_per_s gpu_step)" "$(last_kv "$LOG/gpu_step.log" peak_mem_gb gpu_step)")
summary+=("$(grep -E '^arch=' "$LOG/gpu_step.log" | tr ' ' '\n' | grep -E '^(rollout_tok_s|estimate_gib|peak_gib)=' \
  | sed 's/^/gpu_step_/' | tr '\n' ' ')")

for run in "vllm on 3" "vllm off 3" "auto on 2"; do
  set -- $run
  name="${1}_sleep_${2}"
  part "$name" 150 "$PY" bench/gpu_vllm.py --engine "$1" --sleep "$2" --steps "$3"
  summary+=("$(last_kv "$LOG/$name.log" tokens_per_s "$name")" "$(last_kv "$LOG/$name.log" peak_mem_gb "$name")")
done

gpu=$("$PY" -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))" 2>/dev/null)
echo "failed: ${failed[*]:-none}"
echo "gpu=$gpu ${summary[*]} failed=$(IFS=,; echo "${failed[*]:-none}") wall_s=$(( $(date +%s) - t_start )) \
ok=$(( ${#failed[@]} == 0 ))"
[ ${#failed[@]} -eq 0 ]
