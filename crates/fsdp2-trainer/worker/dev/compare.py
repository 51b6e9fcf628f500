import json, sys
from safetensors.numpy import load_file
import numpy as np
work, arch, a, b = sys.argv[1:5]
worst = 0
for step in range(3):
    ga = load_file(f"{work}/grads-{arch}-{a}-{step}.safetensors"); gb = load_file(f"{work}/grads-{arch}-{b}-{step}.safetensors")
    assert ga.keys() == gb.keys()
    for k in ga:
        rel = np.linalg.norm(ga[k].astype(np.float64) - gb[k]) / max(np.linalg.norm(ga[k].astype(np.float64)), 1e-30)
        worst = max(worst, rel)
print("worst grad rel L2", worst, "params", len(ga))
sa = json.load(open(f"{work}/stats-{arch}-{a}.json")); sb = json.load(open(f"{work}/stats-{arch}-{b}.json"))
def flat(d, p=""):
    for k, v in d.items():
        if isinstance(v, dict): yield from flat(v, p + k + ".")
        else: yield p + k, v
for step in sa:
    fa = dict(flat(sa[step]["stats"])); fb = dict(flat(sb[step]["stats"]))
    for k in fa:
        if k in ("seconds", "micro_batches"): continue
        x, y = fa[k], fb[k]
        if x is None or y is None:
            assert x == y, (step, k, x, y); continue
        if abs(x - y) > 1e-5 * max(abs(x), abs(y)) + 1e-7: print("DIFF", step, k, x, y)
wa = load_file(f"{work}/pub-{arch}-{a}/model-00001-of-00001.safetensors"); wb = load_file(f"{work}/pub-{arch}-{b}/model-00001-of-00001.safetensors")
print("weights max rel", max(np.linalg.norm(wa[k]-wb[k])/np.linalg.norm(wa[k]) for k in wa), len(wa))
