"""The engine's own step function with no server, for benches against the protocol:

  python -m arena_rl_fsdp2.inprocess --model DIR --init INIT.json --batch FILE [--batch FILE ...] \
      [--repeat N] --out OUT.json

`INIT.json` is an `init` request body (docs/trainer-protocol.md); each batch file is trained in turn
(`--repeat` times over), whatever step its metadata names. Under torchrun every rank runs it; rank 0 writes
OUT.json: `{"init_seconds", "world_size", "steps": [{"seconds", "forward_tokens", "stats"}], "max_rss_bytes"}`
(`seconds` is the wall time of `Engine.step`, batch reading included, as a protocol step's worker time is;
`max_rss_bytes` is rank 0's peak resident memory, to set against a protocol worker's)."""

import argparse
import json
import resource
import time


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m arena_rl_fsdp2.inprocess")
    ap.add_argument("--model", required=True)
    ap.add_argument("--init", required=True, help="an init request body as JSON (its model_path is replaced)")
    ap.add_argument("--batch", action="append", required=True)
    ap.add_argument("--kind", default=None, help="grpo or sft (default: each batch's own)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from safetensors import safe_open

    from .engine import Engine

    t = time.perf_counter()
    eng = Engine()
    req = json.load(open(args.init))
    req["model_path"] = args.model
    eng.init(req)
    out = {"init_seconds": time.perf_counter() - t, "world_size": eng.world, "steps": []}
    for _ in range(args.repeat):
        for path in args.batch:
            with safe_open(path, framework="numpy") as f:
                kind = args.kind or f.metadata()["kind"]
            t = time.perf_counter()
            r = eng.step(kind, path, None)
            out["steps"].append({"seconds": time.perf_counter() - t, "forward_tokens": r["stats"]["forward_tokens"], "stats": r["stats"]})
    out["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if eng.rank == 0:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
