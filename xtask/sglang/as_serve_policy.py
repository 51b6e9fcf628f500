"""An `SGLANG_LAUNCHER` for tests: checks SGLang's arguments with SGLang's parser, then serves the policy with
`arena-rl serve-policy`, the project's implementation of SGLang's HTTP contract, on CPU-only clusters.

`SGLANG_LAUNCHER="$ARENA_RL_PY_SGLANG $AREAL_DIR/xtask/sglang/as_serve_policy.py"` makes `train.sbatch`'s
policy-server step run this instead of SGLang. It parses its arguments with `prepare_server_args` (exit 2 with
SGLang's usage error on any argument SGLang would refuse), records what it received (`check_args.py`'s JSON)
in `$ARENA_RL_SGLANG_RECORD_DIR/<host>-<port>.json` when that variable is set, and replaces itself with
`$ARENA_RL_BIN serve-policy` serving the same model on the same address: `--model-path`, `--host`, `--port`,
`--context-length` and `--incremental-streaming-output` carry over; `--device cpu` and `--dtype` map to
serve-policy's device and dtype (`auto` is f32 on the CPU, bf16 on a GPU); weight updates load from under
`$AREAL_FILEROOT`. serve-policy has no tensor, pipeline or data parallelism, so any size but 1 is refused. The
API key stays where the step put it, in `ARENA_RL_POLICY_API_KEY`, which serve-policy reads.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check_args  # noqa: E402


def refuse(message):
    sys.stderr.write(f"as_serve_policy: {message}\n")
    sys.exit(2)


def main():
    argv = sys.argv[1:]
    if any(a == "--api-key" or a.startswith("--api-key=") for a in argv):
        refuse("--api-key is on the command line; the key belongs in ARENA_RL_POLICY_API_KEY")
    server_args = check_args.parse(argv)
    record = check_args.describe(argv, server_args)
    sizes = {k: record[k] for k in ("tp_size", "pp_size", "dp_size")}
    if any(v != 1 for v in sizes.values()):
        refuse(f"serve-policy has no tensor, pipeline or data parallelism, got {sizes}")
    folder = os.environ.get("ARENA_RL_SGLANG_RECORD_DIR")
    if folder:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{record['host']}-{record['port']}.json")
        with open(f"{path}.tmp", "w") as f:
            json.dump(record, f, sort_keys=True)
        os.replace(f"{path}.tmp", path)
    binary = os.environ.get("ARENA_RL_BIN") or refuse("ARENA_RL_BIN is not set")
    root = os.environ.get("AREAL_FILEROOT") or refuse("AREAL_FILEROOT is not set")
    device = "cpu" if record["device"] == "cpu" else "cuda"
    dtype = {"bfloat16": "bf16", "float32": "f32", "float": "f32"}.get(record["dtype"])
    if dtype is None and record["dtype"] != "auto":
        refuse(f"serve-policy serves f32 or bf16 weights, got --dtype {record['dtype']}")
    dtype = dtype or ("f32" if device == "cpu" else "bf16")
    args = [
        binary,
        "serve-policy",
        "--model",
        record["model_path"],
        "--host",
        record["host"],
        "--port",
        str(record["port"]),
        "--device",
        device,
        "--dtype",
        dtype,
        "--weights-root",
        root,
    ]
    if record["context_length"] is not None:
        args += ["--context-length", str(record["context_length"])]
    if record["incremental_streaming_output"]:
        args.append("--incremental-streaming-output")
    sys.stdout.flush()
    os.execv(binary, args)


if __name__ == "__main__":
    main()
