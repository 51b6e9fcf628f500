#!/usr/bin/env bash
# The GPU program of issue 16: burn-cuda (the `gpu_figures` example of `trainer`) against PyTorch on the same GPU.
#
# Usage: gpu_figures.sh BIN OUT   (BIN: the stripped example, built with `--features cuda`; OUT: a directory)
# Writes one JSON file per stage and side under OUT (a stage that fails writes its error instead), plus each
# burn stage's peak GPU memory as nvidia-smi saw it; bounded to finish within 5 minutes (the stages' limits add up to 295 s).
set -u
BIN=$1
OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
MODEL=$WORK/qwen3-0.6b
mkdir -p "$OUT" "$MODEL"
export CUBECL_AUTOTUNE_LEVEL=minimal

# run NAME SECONDS COMMAND...: the command's stdout to OUT/NAME.json, or an error object; for burn stages
# also the largest memory.used nvidia-smi reported while it ran.
run() {
  local name=$1 limit=$2
  shift 2
  local log=$OUT/$name.log
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$OUT/$name.mem" 2>/dev/null &
  local smi=$!
  if timeout "$limit" "$@" > "$OUT/$name.json" 2> "$log"; then
    echo "$name: ok"
  else
    local rc=$?
    printf '{"stage": "%s", "error": "exit %s", "log_tail": %s}\n' "$name" "$rc" \
      "$(tail -c 2000 "$log" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')" > "$OUT/$name.json"
    echo "$name: failed ($rc)"
  fi
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
  printf '{"stage": "%s", "peak_gpu_mib": %s}\n' "$name" "$(sort -n "$OUT/$name.mem" | tail -1 || echo null)" \
    > "$OUT/$name.memory.json"
}

run burn_smoke 30 "$BIN" smoke
run torch_make_model 45 python3 "$HERE/gpu_peer.py" make-model "$MODEL"
run burn_logits 30 "$BIN" logits "$MODEL" "$MODEL/probe.json"
run torch_train 30 python3 "$HERE/gpu_peer.py" train "$MODEL"
run burn_train 45 "$BIN" train "$MODEL"
run torch_long 20 python3 "$HERE/gpu_peer.py" long "$MODEL"
run burn_long 30 "$BIN" long "$MODEL"
run torch_decode 25 python3 "$HERE/gpu_peer.py" decode "$MODEL"
run burn_decode 40 "$BIN" decode "$MODEL"
rm -rf "$WORK"
