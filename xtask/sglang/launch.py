"""Starts an SGLang server for `train.sbatch`'s policy-server step without its API key on any command line.

`cargo xtask submit` renders `python3 $AREAL_DIR/xtask/sglang/launch.py <SGLang's arguments>` (the default
`SGLANG_LAUNCHER`, docs/slurm.md). SGLang takes its key only as `--api-key`, which every process on the node
could read in /proc/<pid>/cmdline, so this launcher reads the key from `ARENA_RL_POLICY_API_KEY`, removes it
from the environment, and runs SGLang's own entry point (`python -m sglang.launch_server`, or the module named
by `ARENA_RL_SGLANG_ENTRY`) in a forked child whose `sys.argv` gets `--api-key KEY` in memory: the child's
command line stays this launcher's.

SGLang logs its resolved arguments, the key among them, at start; the child's stdout and stderr therefore go
through this process, which replaces the key with `[redacted]` before writing them out. Signals that stop a
Slurm step (SIGTERM, SIGINT, SIGHUP) are passed on to the child, and the launcher exits with the child's
status (128 + N when a signal N ended it).
"""

import os
import runpy
import signal
import sys

KEY_ENV = "ARENA_RL_POLICY_API_KEY"
ENTRY_ENV = "ARENA_RL_SGLANG_ENTRY"
DEFAULT_ENTRY = "sglang.launch_server"
REDACTED = b"[redacted]"


def refuse(message: str) -> "NoReturn":  # noqa: F821
    sys.stderr.write(f"sglang launcher: {message}\n")
    sys.exit(2)


def main() -> None:
    args = sys.argv[1:]
    if any(a == "--api-key" or a.startswith("--api-key=") for a in args):
        refuse(f"--api-key must not be on the command line; the launcher reads the key from {KEY_ENV}")
    key = os.environ.pop(KEY_ENV, "")
    if not key:
        refuse(f"{KEY_ENV} is not set; a policy server on every interface needs a key")
    entry = os.environ.get(ENTRY_ENV) or DEFAULT_ENTRY
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        os.close(write_end)
        sys.argv = [entry, *args, "--api-key", key]
        code = 0
        try:
            runpy.run_module(entry, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                sys.stderr.write(f"{e.code}\n")
        except BaseException:  # noqa: B036 - the child reports whatever ended it, then exits
            import traceback

            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.close(write_end)

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    secret = key.encode()
    out = sys.stdout.buffer
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        pending = b""
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                break
            pending += chunk
            # Write whole lines only, so that a key split across two reads is still found.
            cut = pending.rfind(b"\n") + 1
            if cut:
                out.write(pending[:cut].replace(secret, REDACTED))
                out.flush()
                pending = pending[cut:]
            elif len(pending) > 1 << 20:
                keep = max(len(secret) - 1, 1)
                out.write(pending[:-keep].replace(secret, REDACTED))
                out.flush()
                pending = pending[-keep:]
        out.write(pending.replace(secret, REDACTED))
        out.flush()
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    sys.exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    main()
