#!/usr/bin/env bash
# The GPU program of issue 29 (point 7): the FSDP2 worker's training tokens/s and MFU at 8k and 32k packed
# tokens, in process (the engine's own step function, no server) and through arena-rl-trainer/1 driven by a
# client, for random-weight Qwen3-1.7B and Qwen3-4B shapes; peak memory at 8k against 32k; seconds to publish
# a bf16 folder. Needs only python3 with torch (2.11+) and transformers (5.17+): no pip, no network.
#
# Usage: program.sh OUT            (OUT: a folder; one JSON file per stage, a failed stage writes its error;
#                                  summary.json; program.log holds each stage's log; 8 files at most)
#   ARENA_RL_FSDP2_GPU_TINY=1      tiny shapes on the CPU, 256 and 1024 tokens (to test the program itself)
#   DRIVE=path/to/drive            drive the protocol with the Rust client (fsdp2-trainer's `drive` example,
#                                  built beforehand) instead of this folder's Python client, for Qwen3-1.7B
#   TMPDIR                         where the model folders go (about 25 GB at most)
# Bounded: the stages' limits add up to 345 s, and a stage that could not finish before 355 s is skipped.
set -u
OUT=${1:?usage: program.sh OUT}
HERE=$(cd "$(dirname "$0")" && pwd)
WORKER=$(dirname "$HERE")
PY=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/arena-fsdp2-gpu.XXXXXX")
mkdir -p "$OUT"
export PYTHONPATH=$WORKER${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ "${ARENA_RL_FSDP2_GPU_TINY:-0}" = 1 ]; then
  MODELS="tiny"; SIZES="256 1024"
else
  MODELS="qwen3-1.7b qwen3-4b"; SIZES="8192 32768"
fi
started=$(date +%s)

# run NAME SECONDS COMMAND...: stdout to OUT/NAME.json, or an error object with the log's tail.
run() {
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  if [ $(( t0 - started + limit )) -gt 355 ]; then
    printf '{"stage": "%s", "error": "skipped: the program would pass 6 minutes"}\n' "$name" > "$OUT/$name.json"
    echo "$name: skipped"
    return
  fi
  local log=$WORK/$name.log
  if timeout -k 5 "$limit" "$@" > "$OUT/$name.json" 2> "$log"; then
    echo "$name: ok ($(( $(date +%s) - t0 )) s)"
  else
    local rc=$?
    printf '{"stage": "%s", "error": "exit %s", "log_tail": %s}\n' "$name" "$rc" \
      "$(tail -c 3000 "$log" | "$PY" -c 'import json,sys; print(json.dumps(sys.stdin.read()))')" > "$OUT/$name.json"
    echo "$name: failed ($rc, $(( $(date +%s) - t0 )) s)"
  fi
  { echo "=== $name"; tail -c 20000 "$log"; } >> "$OUT/program.log"
}

"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
limits=(40 70 55 90)  # make and in-process stages of the two models
i=0
for m in $MODELS; do
  run "make-$m" "${limits[i]}" "$PY" "$HERE/bench.py" make "$m" "$WORK/$m"
  run "inprocess-$m" "${limits[i+1]}" "$PY" "$HERE/bench.py" inprocess "$WORK/$m" "$WORK/run-inproc-$m" $SIZES
  rm -rf "$WORK/run-inproc-$m"
  i=$((i + 2))
done
first=${MODELS%% *}
rm -rf "$WORK/qwen3-4b"
if [ -z "${DRIVE:-}" ]; then
  run "protocol-$first" 90 "$PY" "$HERE/bench.py" protocol "$WORK/$first" "$WORK/run-proto-$first" $SIZES
else
  for s in $SIZES; do
    mkdir -p "$WORK/run-drive-$s"
    run "drive-$first-$s" 45 env ARENA_RL_TRAINER_DEVICE=$([ "${ARENA_RL_FSDP2_GPU_TINY:-0}" = 1 ] && echo cpu) \
      "$DRIVE" --run-dir "$WORK/run-drive-$s" --model "$WORK/$first" --tokens "$s" --seq-len $((s / 4)) --steps 3 \
      --python "$PY" --max-tokens-per-mb "$s" --dtype "$([ "${ARENA_RL_FSDP2_GPU_TINY:-0}" = 1 ] && echo f32 || echo bf16)" \
      --publish --out /dev/stdout
  done
fi
"$PY" - "$OUT" <<'PYEOF' > "$OUT/summary.json"
import json, os, sys
out = sys.argv[1]
summary = {}
for f in sorted(os.listdir(out)):
    if not f.endswith(".json") or f == "summary.json":
        continue
    d = json.load(open(os.path.join(out, f)))
    name = f[:-5]
    if "error" in d:
        summary[name] = {"error": d["error"]}
    elif "sizes" in d:
        summary[name] = {str(s["tokens"]): {k: s.get(k) for k in ("tokens_per_second", "mfu", "peak_allocated_bytes", "protocol_overhead_seconds") if s.get(k) is not None} for s in d["sizes"]}
        if "publish_bf16" in d:
            summary[name]["publish_bf16_seconds"] = d["publish_bf16"]["seconds"]
            summary[name]["publish_bf16_bytes"] = d["publish_bf16"]["bytes"]
    elif "steps" in d:
        summary[name] = d
print(json.dumps(summary, indent=1))
PYEOF
cat "$OUT/summary.json"
rm -rf "$WORK"
echo "total $(( $(date +%s) - started )) s"
