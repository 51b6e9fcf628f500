import json, sys
import numpy as np
from safetensors.numpy import load_file
work, arch = sys.argv[1:3]
burn = [json.loads(l) for l in open(f"{work}/burn-{arch}.jsonl")]
ours = json.load(open(f"{work}/stats-{arch}-ws1.json"))
keys = ["grpo0", "grpo1", "grpo2", "sft"]
def flat(d, p=""):
    for k, v in d.items():
        if isinstance(v, dict): yield from flat(v, p + k + ".")
        else: yield p + k, v
worst = (0, None)
for b, k in zip(burn, keys):
    o = dict(flat(ours[k]["stats"])); bb = dict(flat(b))
    for name, x in bb.items():
        if name == "step": continue
        y = o.get(name)
        if x is None or y is None:
            if x != y: print("MISMATCH none", k, name, x, y)
            continue
        tol = 1e-5 * max(abs(x), abs(y)) + 1e-7
        rel = abs(x - y) / (max(abs(x), abs(y)) + 1e-30)
        if abs(x - y) > tol: print("DIFF", k, name, x, y, f"rel {rel:.2e}")
        if abs(x - y) > 1e-7: worst = max(worst, (rel, f"{k}.{name}"))
print(arch, "stats: worst rel diff (above 1e-7 abs)", worst)
wb = load_file(f"{work}/burn-{arch}/model.safetensors")
import glob
wo = {}
for f in glob.glob(f"{work}/pub-{arch}-ws1/*.safetensors"): wo.update(load_file(f))
missing = set(wb) ^ set(wo)
rels = {k: np.linalg.norm(wb[k].astype(np.float64) - wo[k]) / np.linalg.norm(wb[k].astype(np.float64)) for k in wb if k in wo}
print(arch, "weights after 4 steps: worst rel", max(rels.values()), max(rels, key=rels.get), "name mismatch", missing)
