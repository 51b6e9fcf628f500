"""Parses SGLang server arguments with SGLang's own parser, for tests and test launchers.

`python check_args.py ARGS...` runs `sglang.srt.server_args.prepare_server_args(ARGS)`, the function
`python -m sglang.launch_server` itself calls, and prints one JSON object: the arguments as given, the fields
`train.sbatch` sets as SGLang read them, whether an API key was given (never the key: its SHA-256), and this
process's command line as the kernel reports it (`/proc/self/cmdline`), the pids of every process whose command
line holds the key (there should be none), and the GPUs it was given (`CUDA_VISIBLE_DEVICES`). An argument SGLang does not know, or
a value it refuses, ends it with SGLang's own usage error and exit status 2.

With `ARENA_RL_SGLANG_RECORD=FILE` the object is also written to FILE. Run as the launcher's entry module
(`ARENA_RL_SGLANG_ENTRY=check_args`, this folder on `PYTHONPATH`) it sees what SGLang would see, `--api-key`
included, and prints the parsed arguments' repr to stderr as SGLang's start-up log does, so a test can check
that the launcher keeps the key out of the log. Needs the `sglang` package (the `ARENA_RL_PY_SGLANG` venv).
"""

import hashlib
import json
import os
import sys

FIELDS = (
    "model_path",
    "host",
    "port",
    "tp_size",
    "pp_size",
    "dp_size",
    "context_length",
    "dtype",
    "device",
    "weight_version",
    "incremental_streaming_output",
)


def parse(argv):
    """The arguments as SGLang reads them (`ServerArgs`), or SystemExit(2) with SGLang's usage error."""
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(list(argv))


def cmdlines_holding(secret):
    """The pids whose command line (`/proc/<pid>/cmdline`) holds `secret`."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if secret.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


def describe(argv, server_args):
    key = server_args.api_key
    try:
        with open("/proc/self/cmdline", "rb") as f:
            cmdline = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        cmdline = None
    return {
        "argv": [a for a in argv],
        **{name: getattr(server_args, name) for name in FIELDS},
        "api_key_set": key is not None,
        "api_key_sha256": hashlib.sha256(key.encode()).hexdigest() if key else None,
        "cmdline": cmdline,
        "cmdlines_holding_the_key": cmdlines_holding(key) if key else [],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "key_in_environment": "ARENA_RL_POLICY_API_KEY" in os.environ,
        "sglang_return_original_logprob": os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB"),
    }


def main():
    argv = sys.argv[1:]
    server_args = parse(argv)
    record = describe(argv, server_args)
    if record["api_key_set"]:
        # The key given never goes into the record's argv, only its hash.
        record["argv"] = ["[api key]" if a == server_args.api_key else a for a in argv]
    sys.stderr.write(f"server_args={server_args!r}\n")
    text = json.dumps(record, sort_keys=True)
    out = os.environ.get("ARENA_RL_SGLANG_RECORD")
    if out:
        tmp = f"{out}.tmp"
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, out)
    print(text, flush=True)


if __name__ == "__main__":
    main()
