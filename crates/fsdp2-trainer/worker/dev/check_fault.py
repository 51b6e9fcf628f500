"""Dev check: an out-of-memory error on one rank mid-step (ARENA_RL_TRAINER_FAULT=oom:RANK:STEP) fails the
operation at once with a typed error naming the rank and step, and torchrun ends after the grace period.
Run from the worker folder: python dev/check_fault.py oom:1:1 (needs /tmp/w29 from dev/make_fixtures.py)."""
import os, sys, subprocess, time, shutil
sys.path.insert(0, '.')
from arena_rl_fsdp2.client import Client, ProtocolError
run = "/tmp/w29/fault"; shutil.rmtree(run, ignore_errors=True); os.makedirs(run)
for i in range(2): shutil.copy(f"/tmp/w29/batch-{i}.safetensors", run)
env = dict(os.environ, ARENA_RL_TRAINER_API_KEY="k", ARENA_RL_TRAINER_DEVICE="cpu", ARENA_RL_TRAINER_FAULT=sys.argv[1], PYTHONPATH=".")
p = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "arena_rl_fsdp2", "--listen", "127.0.0.1:18756", "--run-dir", run], env=env, start_new_session=True, stdout=open(f"{run}/../fault.log", "w"), stderr=subprocess.STDOUT)
c = Client("127.0.0.1:18756", key="k"); c.wait_ready(proc=p)
c.call("init", {"model_path": "/tmp/w29/qwen3", "train": {"max_tokens_per_mb": 40}, "param_dtype": "f32"})
c.step(0, "grpo", f"{run}/batch-0.safetensors")
t = time.time()
try:
    c.step(1, "grpo", f"{run}/batch-1.safetensors"); print("no error?!")
except ProtocolError as e:
    print(f"step 1 failed after {time.time() - t:.1f} s:", e.body)
print("health:", c.request("GET", "/v1/health", key=False)[1])
p.wait(60); print(f"torchrun exited {p.returncode} after {time.time() - t:.1f} s")
