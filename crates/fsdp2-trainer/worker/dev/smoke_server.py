"""Dev smoke: start the worker under torchrun (N ranks, CPU) and drive the protocol with the Python client.
Run: python dev/smoke_server.py WORKDIR ARCH N"""
import os, subprocess, sys, time, json, shutil
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from arena_rl_fsdp2.client import Client, ProtocolError
from arena_rl_fsdp2.testing import write_batch

work, arch, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
run = f"{work}/run-{arch}-{n}"
shutil.rmtree(run, ignore_errors=True); os.makedirs(f"{run}/batches")
for f in os.listdir(work):
    if f.endswith(".safetensors") and (f.startswith("batch-") or f.startswith("sft-")):
        shutil.copy(f"{work}/{f}", f"{run}/batches/{f}")
env = dict(os.environ, ARENA_RL_TRAINER_API_KEY="k-smoke", ARENA_RL_TRAINER_DEVICE="cpu", PYTHONPATH=os.path.join(os.path.dirname(__file__), ".."))
torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
def start(nproc, port):
    return subprocess.Popen([torchrun, "--standalone", f"--nproc-per-node={nproc}", "-m", "arena_rl_fsdp2", "--listen", f"127.0.0.1:{port}", "--run-dir", run],
                            env=env, start_new_session=True)
proc = start(n, 18731)
c = Client("127.0.0.1:18731", key="k-smoke")
t0 = time.time()
print("health", c.wait_ready(proc=proc), round(time.time() - t0, 1), "s")
def expect(kind, f):
    try:
        f()
    except ProtocolError as e:
        assert e.body["kind"] == kind, e.body
        print("  refused as expected:", e.status, e.body)
        return
    raise AssertionError(f"expected {kind}")
expect("auth", lambda: Client("127.0.0.1:18731", key="wrong").hello())
print("hello", c.hello())
train = {"max_tokens_per_mb": 40, "ppo": {"use_decoupled_loss": True, "recompute_logprob": True, "kl_ctl": 0.05, "kl_estimator": "k2"}}
expect("config", lambda: c.call("init", {"model_path": f"{work}/{arch}", "train": {"max_tokens_per_mb": 0}}))
# a failed init leaves the worker new
print("init", c.call("init", {"model_path": f"{work}/{arch}", "train": train, "param_dtype": "f32", "activation_checkpointing": False, "logprob_chunk_tokens": 16, "seed": 1}))
expect("path", lambda: c.step(0, "grpo", f"{work}/batch-0.safetensors"))
expect("protocol", lambda: c.step(1, "grpo", f"{run}/batches/batch-1.safetensors"))
r0 = c.step(0, "grpo", f"{run}/batches/batch-0.safetensors")
print("step 0 loss", r0["stats"]["loss"], "grad_norm", r0["stats"]["grad_norm"])
again = c.step(0, "grpo", f"{run}/batches/batch-0.safetensors")
assert again == r0, "replay answers the stored result"
print("  replayed step 0 answered the stored result")
c.call("save", {"path": f"{run}/checkpoints/after-1/trainer"})
r1 = c.step(1, "grpo", f"{run}/batches/batch-1.safetensors")
pub = c.call("publish", {"path": f"{run}/weights/step-2", "dtype": "bf16"})
print("publish", pub, sorted(os.listdir(f"{run}/weights/step-2")))
os.killpg(proc.pid, 15); proc.wait()
# resume at world size 1 from the checkpoint after step 0; step 1 must give the same answer
proc = start(1, 18732)
c = Client("127.0.0.1:18732", key="k-smoke")
c.wait_ready(proc=proc)
c.call("init", {"model_path": f"{work}/{arch}", "train": train, "param_dtype": "f32", "logprob_chunk_tokens": 16, "seed": 1})
print("load", c.call("load", {"path": f"{run}/checkpoints/after-1/trainer"}))
r1b = c.step(1, "grpo", f"{run}/batches/batch-1.safetensors")
for k in ("loss", "grad_norm", "entropy", "ref_kl"):
    a, b = r1["stats"][k], r1b["stats"][k]
    print(f"  resumed {k}: {a} vs {b}  rel {abs(a-b)/max(abs(a),1e-30):.2e}")
os.killpg(proc.pid, 15); proc.wait()
print("smoke ok", round(time.time() - t0, 1), "s")
# init again on a ready worker replaces model, optimiser and step count
proc = start(n, 18733)
c = Client("127.0.0.1:18733", key="k-smoke")
c.wait_ready(proc=proc)
c.call("init", {"model_path": f"{work}/{arch}", "train": train, "param_dtype": "f32", "logprob_chunk_tokens": 16, "seed": 1})
a = c.step(0, "grpo", f"{run}/batches/batch-0.safetensors")
c.step(1, "grpo", f"{run}/batches/batch-1.safetensors")
c.call("init", {"model_path": f"{work}/{arch}", "train": train, "param_dtype": "f32", "logprob_chunk_tokens": 16, "seed": 1})
assert c.hello()["step"] == 0
b = c.step(0, "grpo", f"{run}/batches/batch-0.safetensors")
assert a["stats"]["loss"] == b["stats"]["loss"] and a["stats"]["grad_norm"] == b["stats"]["grad_norm"], (a, b)
print("init again: step 0 repeats exactly", b["stats"]["loss"])
os.killpg(proc.pid, 15); proc.wait()
