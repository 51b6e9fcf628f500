"""arena-rl's Weights & Biases sidecar: logs a run through the official `wandb` SDK.

arena-rl starts it as `python -u wandb_sidecar.py STEP_FILE` and writes one JSON object per line to its stdin:

  {"type": "init", "id": ..., "project": ..., "entity": ..., "name": ..., "group": ..., "tags": [...],
   "mode": "online" | "offline", "dir": ..., "config": {...}}
  {"type": "log", "step": 3, "metrics": {"rollout/reward": 0.5, ...}}
  {"type": "image", "key": "reward_curve", "path": "/.../reward_curve.png"}
  {"type": "summary", "summary": {...}}
  {"type": "finish"}

Each logged step's number is written to STEP_FILE (through a rename) once `wandb` took it, so that a resumed
arena-rl run replays only the steps W&B never got.
The run is resumed by id (`resume="allow"`), so a resumed arena-rl run continues the same W&B run.
When stdin closes without "finish" (arena-rl was killed), the run is finished with exit code 1, which flushes
what was logged. Either way the process then stops `wandb-core` and exits at once, skipping the interpreter's
slow teardown of wandb's modules.
The sidecar runs at the idle scheduling priority (Linux's SCHED_IDLE, its `wandb-core` too; nice 19 where that
is refused), so that it takes only the CPU the training leaves: a training process whose threads work in
lockstep on every core is not held up by it. On a node whose every core stays busy it runs in the gaps, and
arena-rl's bounded queue holds what it has not taken yet.
Credentials come only from the environment (`WANDB_API_KEY`); nothing here prints or stores one.
"""

import json
import os
import sys


def write_step(path, step):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, path)


def lower_priority():
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(19)
        except OSError:
            pass


def main():
    step_file = sys.argv[1]
    # A background helper: when the training wants every core, it gets them first (wandb-core inherits this).
    lower_priority()
    import wandb

    run = None
    for line in sys.stdin:
        msg = json.loads(line)
        kind = msg["type"]
        if kind == "init":
            settings = wandb.Settings(
                console="off",
                silent=True,
                x_disable_stats=True,
                disable_git=True,
                disable_code=True,
                save_code=False,
                x_save_requirements=False,
            )
            run = wandb.init(
                id=msg["id"],
                resume="allow",
                project=msg["project"],
                entity=msg.get("entity") or None,
                name=msg["name"],
                group=msg["group"],
                tags=msg["tags"] or None,
                mode=msg["mode"],
                dir=msg["dir"],
                config=msg["config"],
                settings=settings,
            )
        elif kind == "log":
            run.log(msg["metrics"], step=msg["step"])
            write_step(step_file, msg["step"])
        elif kind == "image":
            run.summary[msg["key"]] = wandb.Image(msg["path"])
        elif kind == "summary":
            run.summary.update(msg["summary"])
        elif kind == "finish":
            run.finish()
            return done(wandb)
    if run is not None:
        run.finish(exit_code=1)
    return done(wandb)


def done(wandb):
    """Ends the process once the run is finished and `wandb-core` stopped: the interpreter's own teardown of
    wandb's modules takes longer than the run's whole finish (about 0.3 s against 0.02 s), and arena-rl waits for
    this process to exit before it does."""
    wandb.teardown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
