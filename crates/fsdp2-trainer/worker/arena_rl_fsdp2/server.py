"""Rank 0's HTTP server and every rank's command loop (docs/trainer-protocol.md).

Rank 0 serves the protocol on a thread; long calls become operations, queued to rank 0's main thread,
which broadcasts each command to the other ranks over a gloo group that never times out (ranks wait for
commands as long as the loop needs), runs it on every rank with the engine, and gathers each rank's outcome:
the operation's result is rank 0's, or the most telling rank's error.
"""

import collections
import datetime
import hashlib
import hmac
import json
import os
import queue
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch.distributed as dist

from . import PROTOCOL
from .engine import Engine, init_distributed
from .errors import WorkerError, classify

MAX_BODY = 1 << 20
BODY_TIMEOUT_S = 30
KEEP_OPS = 64
LONG_CALLS = ("init", "step", "publish", "save", "load")
STATUS = {"auth": 401, "busy": 409, "protocol": 409, "batch": 400, "config": 400, "path": 403, "internal": 500, "oom": 500, "rank_lost": 500}
# When ranks disagree, the error that says most: a rank's own failure before the timeouts it caused elsewhere.
PRECEDENCE = ("oom", "batch", "config", "path", "protocol", "internal", "rank_lost")
# Failures that can strike one rank while the others wait inside collectives: the failing rank reports the
# typed error through a file in the run folder (rank 0's server answers it at once), waits FAIL_GRACE_S so
# the client can read it, and exits, which makes torchrun end every rank. Batch, config, path and protocol
# errors are found identically on every rank before any collective, so they never need this.
FATAL = ("oom", "internal", "rank_lost")
FAIL_GRACE_S = float(os.environ.get("ARENA_RL_TRAINER_FAIL_GRACE_S", "10"))
ERRORS_DIR = ".arena_rl_fsdp2"


def inside(run_dir, path):
    """`path` resolved (`..`, symbolic links) when it lies inside `run_dir`, else a `path` error."""
    if not isinstance(path, str) or not path:
        raise WorkerError("path", f"path must be a non-empty string, got {path!r}")
    root = os.path.realpath(run_dir)
    real = os.path.realpath(path)
    if os.path.commonpath([root, real]) != root:
        raise WorkerError("path", f"{path} is outside the run folder {run_dir}")
    return real


def error_dir(run_dir):
    return os.path.join(run_dir, ERRORS_DIR)


def report_fatal(run_dir, err):
    """Writes a rank's fatal error where rank 0's server finds it."""
    d = error_dir(run_dir)
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f"rank-{err.get('rank', 0)}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(err, f)
    os.replace(tmp, tmp[: -len(".tmp")])


def fatal_exit(engine, run_dir, err):
    """A fatal error on a rank of several: report it, give the client FAIL_GRACE_S to read it, then exit so
    torchrun ends the job (the others may be blocked in collectives that would otherwise wait for their
    timeout)."""
    report_fatal(run_dir, err)
    print(f"arena_rl_fsdp2: rank {err.get('rank')}, step {err.get('step')}: {err['kind']}: {err['message']}; exiting", flush=True)
    time.sleep(FAIL_GRACE_S)
    os._exit(1)


def run_command(engine, cmd, progress=None):
    """Runs one command on this rank; returns ("ok", result) or ("err", error json)."""
    call = cmd["call"]
    req = cmd["req"]
    step = req.get("step") if call == "step" else engine.steps
    try:
        if call == "init":
            res = engine.init(req, progress)
        elif call == "step":
            res = engine.step(req["kind"], req["batch"], req["step"], progress, dump_gradients=req.get("dump_gradients"))
        elif call == "publish":
            res = engine.publish(req["path"], req.get("dtype", "bf16"), progress, req.get("max_shard_bytes"))
        elif call == "save":
            res = engine.save(req["path"], progress)
        elif call == "load":
            res = engine.load(req["path"], progress)
        else:
            raise WorkerError("protocol", f"unknown call {call}")
        return ("ok", res)
    except BaseException as e:  # noqa: BLE001 - every failure becomes a typed error
        err = classify(e, rank=engine.rank, step=step)
        if engine.optimizer is not None:
            engine.optimizer.zero_grad(set_to_none=True)
        if err.kind in ("rank_lost", "internal") and call != "init":
            engine.state = "failed"
        return ("err", err.to_json())


def combine(outcomes):
    errors = [o[1] for o in outcomes if o[0] == "err"]
    if not errors:
        return outcomes[0]
    errors.sort(key=lambda e: (PRECEDENCE.index(e["kind"]) if e["kind"] in PRECEDENCE else 99, e.get("rank", 0)))
    return ("err", errors[0])


class Worker:
    """Rank 0's view: the engine, the operations, and the queue of commands for the main thread."""

    def __init__(self, engine, run_dir, cmd_group):
        self.engine = engine
        self.run_dir = run_dir
        self.cmd_group = cmd_group
        self.lock = threading.Lock()
        self.ops = collections.OrderedDict()
        self.next_op = 1
        self.running = None
        self.queue = queue.Queue()
        self.last_step = None  # (step, sha256, result) of the last completed step
        key = os.environ.get("ARENA_RL_TRAINER_API_KEY", "")
        if not key:
            raise SystemExit("arena_rl_fsdp2: ARENA_RL_TRAINER_API_KEY is not set")
        self.key = ("Bearer " + key).encode()

    def authorised(self, header):
        return hmac.compare_digest((header or "").encode(), self.key)

    def new_op(self, kind, cmd):
        with self.lock:
            if self.running is not None:
                raise WorkerError("busy", f"operation {self.running} ({self.ops[self.running]['kind']}) is running")
            op_id = str(self.next_op)
            self.next_op += 1
            op = {"protocol": PROTOCOL, "op": op_id, "kind": kind, "state": "running", "progress": None, "result": None, "error": None}
            self.ops[op_id] = op
            if cmd is None:
                return op
            self.running = op_id
        self.queue.put((op_id, cmd))
        return op

    def finish(self, op_id, outcome):
        with self.lock:
            op = self.ops[op_id]
            if op["state"] != "running":
                return
            if outcome[0] == "ok":
                op["state"], op["result"] = "done", outcome[1]
            else:
                op["state"], op["error"] = "failed", outcome[1]
            op["progress"] = None
            if self.running == op_id:
                self.running = None
            finished = [k for k, v in self.ops.items() if v["state"] != "running"]
            for k in finished[: max(0, len(finished) - KEEP_OPS)]:
                del self.ops[k]

    def start(self, call, req):
        """Checks a long call and queues it; returns its operation."""
        e = self.engine
        with self.lock:
            if self.running is not None:
                raise WorkerError("busy", f"operation {self.running} ({self.ops[self.running]['kind']}) is running")
        if call != "init" and e.state != "ready":
            raise WorkerError("protocol", f"the worker is {e.state}: call init first" if e.state == "new" else "the worker failed; restart it and load a checkpoint")
        if call == "init" and e.state == "failed":
            raise WorkerError("protocol", "the worker failed; restart it")
        if call == "init":
            mp = req.get("model_path")
            if not isinstance(mp, str) or not os.path.isdir(mp):
                raise WorkerError("config", f"model_path {mp!r} is not a folder")
            return self.new_op("init", {"call": "init", "req": req})
        if call == "step":
            step = req.get("step")
            kind = req.get("kind")
            if kind not in ("grpo", "sft"):
                raise WorkerError("protocol", f"step kind must be grpo or sft, got {kind!r}", step=step)
            if not isinstance(step, int) or isinstance(step, bool):
                raise WorkerError("protocol", f"step must be an integer, got {step!r}")
            batch = inside(self.run_dir, req.get("batch"))
            sha = req.get("sha256")
            with self.lock:
                last = self.last_step
                completed = e.steps
            if last is not None and step == last[0] and step == completed - 1:
                if sha != last[1]:
                    raise WorkerError("protocol", f"step {step} was already trained on a batch with sha256 {last[1]}, this one has {sha}", step=step)
                op = self.new_op("step", None)
                self.finish(op["op"], ("ok", last[2]))
                return op
            if step != completed:
                raise WorkerError("protocol", f"step {step} is out of order: the worker has completed {completed} steps and expects step {completed}", step=step)
            try:
                digest = hashlib.sha256(open(batch, "rb").read()).hexdigest()
            except OSError as err:
                raise WorkerError("batch", f"cannot read batch file {batch}: {err.strerror}", step=step) from None
            if sha != digest:
                raise WorkerError("batch", f"batch file {batch} has sha256 {digest}, the call says {sha}", step=step)
            clean = {"step": step, "kind": kind, "batch": batch, "sha256": sha}
            if req.get("dump_gradients"):
                clean["dump_gradients"] = inside(self.run_dir, req["dump_gradients"])
            return self.new_op("step", {"call": "step", "req": clean})
        if call == "publish":
            dtype = req.get("dtype", "bf16")
            if dtype not in ("bf16", "f32"):
                raise WorkerError("config", f"publish dtype must be bf16 or f32, got {dtype!r}")
            clean = {"path": inside(self.run_dir, req.get("path")), "dtype": dtype}
            shard = req.get("max_shard_bytes")
            if shard is not None:
                if isinstance(shard, bool) or not isinstance(shard, int) or shard < 1:
                    raise WorkerError("config", f"publish max_shard_bytes must be a positive integer, got {shard!r}")
                clean["max_shard_bytes"] = shard
            return self.new_op("publish", {"call": "publish", "req": clean})
        if call in ("save", "load"):
            path = inside(self.run_dir, req.get("path"))
            if call == "load" and not os.path.isfile(os.path.join(path, "trainer.json")):
                raise WorkerError("path", f"{path} holds no trainer.json: not a checkpoint")
            return self.new_op(call, {"call": call, "req": {"path": path}})
        raise WorkerError("protocol", f"unknown call {call}")

    def progress_for(self, op_id):
        def progress(phase, done, total):
            with self.lock:
                self.ops[op_id]["progress"] = {"phase": phase, "done": done, "total": total}

        return progress

    def reported_errors(self):
        """Fatal errors other ranks reported through the run folder, most telling first."""
        d = error_dir(self.run_dir)
        errs = []
        try:
            names = sorted(os.listdir(d))
        except OSError:
            return []
        for name in names:
            if name.endswith(".json"):
                try:
                    errs.append(json.load(open(os.path.join(d, name))))
                except (OSError, ValueError):
                    pass
        return [combine([("err", e) for e in errs])[1]] if errs else []

    def check_reported(self):
        """Fails the running operation with a fatal error another rank reported (called by the server)."""
        if self.running is None and self.engine.state != "failed":
            return
        errs = self.reported_errors()
        if errs:
            self.engine.state = "failed"
            with self.lock:
                running = self.running
            if running is not None:
                self.finish(running, ("err", errs[0]))

    def serve_commands(self):
        """Rank 0's main loop: one command at a time, on every rank."""
        shutil.rmtree(error_dir(self.run_dir), ignore_errors=True)
        while True:
            op_id, cmd = self.queue.get()
            dist.broadcast_object_list([cmd], src=0, group=self.cmd_group)
            started = time.perf_counter()
            outcome = run_command(self.engine, cmd, self.progress_for(op_id))
            if outcome[0] == "err" and outcome[1]["kind"] in FATAL and self.engine.world > 1:
                self.engine.state = "failed"
                self.finish(op_id, outcome)
                print(summary_line(op_id, cmd, outcome, time.perf_counter() - started), flush=True)
                fatal_exit(self.engine, self.run_dir, outcome[1])
            outcomes = gather(outcome, self.engine.world, self.cmd_group)
            result = combine(outcomes)
            print(summary_line(op_id, cmd, result, time.perf_counter() - started), flush=True)
            if cmd["call"] == "step" and result[0] == "ok":
                with self.lock:
                    self.last_step = (cmd["req"]["step"], cmd["req"]["sha256"], result[1])
            if cmd["call"] in ("load", "init") and result[0] == "ok":
                with self.lock:
                    self.last_step = None
            if result[0] == "err" and result[1]["kind"] == "rank_lost":
                self.engine.state = "failed"
            self.finish(op_id, result)


def summary_line(op_id, cmd, result, seconds):
    """One log line per operation on rank 0's standard output."""
    head = f"arena_rl_fsdp2: op {op_id} {cmd['call']}"
    if cmd["call"] == "step":
        head += f" {cmd['req']['kind']} step {cmd['req']['step']}"
    if result[0] == "err":
        e = result[1]
        return f"{head} failed after {seconds:.2f} s: rank {e.get('rank')}: {e['kind']}: {e['message']}"
    if cmd["call"] == "step":
        st = result[1]["stats"]
        return (
            f"{head} done in {seconds:.2f} s: loss {st['loss']:.6g} grad_norm {st['grad_norm']:.4g} lr {st['lr']:.3g} "
            f"tokens {st['tokens']} forward_tokens {st['forward_tokens']} ({st['forward_tokens'] / max(seconds, 1e-9):.0f}/s)"
        )
    return f"{head} done in {seconds:.2f} s"


def gather(outcome, world, group):
    if world == 1:
        return [outcome]
    out = [None] * world if dist.get_rank() == 0 else None
    dist.gather_object(outcome, out, dst=0, group=group)
    return out


def follow_commands(engine, cmd_group, run_dir):
    """The main loop of ranks other than 0."""
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=cmd_group)
        cmd = box[0]
        if cmd is None or cmd.get("call") == "exit":
            return
        outcome = run_command(engine, cmd)
        if outcome[0] == "err" and outcome[1]["kind"] in FATAL:
            fatal_exit(engine, run_dir, outcome[1])
        gather(outcome, engine.world, cmd_group)


def make_handler(worker):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "arena-rl-fsdp2"

        def log_message(self, fmt, *args):  # quiet: the client logs what matters
            pass

        def answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def fail(self, err):
            self.answer(STATUS.get(err.kind, 500), dict(err.to_json(), protocol=PROTOCOL))

        def route(self, method):
            path = self.path.split("?", 1)[0]
            worker.check_reported()
            if method == "GET" and path == "/v1/health":
                e = worker.engine
                return self.answer(200, {"protocol": PROTOCOL, "ok": e.state != "failed", "world_size": e.world, "state": e.state, "op": worker.running})
            if not worker.authorised(self.headers.get("Authorization")):
                self.close_connection = True
                raise WorkerError("auth", "missing or wrong bearer key")
            if method == "GET":
                if path == "/v1/hello":
                    return self.answer(200, worker.engine.hello())
                if path.startswith("/v1/ops/"):
                    with worker.lock:
                        op = worker.ops.get(path[len("/v1/ops/") :])
                        op = json.loads(json.dumps(op)) if op else None
                    if op is None:
                        return self.answer(404, {"protocol": PROTOCOL, "kind": "protocol", "message": f"no operation {path[len('/v1/ops/'):]}"})
                    return self.answer(200, op)
                raise WorkerError("protocol", f"no route GET {path}")
            call = path[len("/v1/") :] if path.startswith("/v1/") else None
            if call not in LONG_CALLS:
                raise WorkerError("protocol", f"no route POST {path}")
            req = self.read_body()
            op = worker.start(call, req)
            return self.answer(202, {"protocol": PROTOCOL, "op": op["op"]})

        def read_body(self):
            try:
                n = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                raise WorkerError("protocol", "content-length is not a number") from None
            if n > MAX_BODY:
                self.close_connection = True
                raise WorkerError("protocol", f"request body of {n} bytes is over the limit of {MAX_BODY}")
            self.connection.settimeout(BODY_TIMEOUT_S)
            try:
                raw = self.rfile.read(n)
                req = json.loads(raw or b"{}")
            except (OSError, ValueError) as e:
                self.close_connection = True
                raise WorkerError("protocol", f"cannot read the request body: {e}") from None
            finally:
                self.connection.settimeout(None)
            if not isinstance(req, dict):
                raise WorkerError("protocol", "the request body must be a json object")
            if req.get("protocol") != PROTOCOL:
                raise WorkerError("protocol", f"the request speaks {req.get('protocol')!r}, the worker speaks {PROTOCOL}")
            return req

        def handle_method(self, method):
            try:
                self.route(method)
            except WorkerError as e:
                self.fail(e)
            except Exception as e:  # noqa: BLE001
                self.fail(classify(e))

        def do_GET(self):
            self.handle_method("GET")

        def do_POST(self):
            self.handle_method("POST")

    return Handler


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(prog="python -m arena_rl_fsdp2", description="The FSDP2 trainer worker of arena-rl (arena-rl-trainer/1).")
    ap.add_argument("--listen", required=True, help="HOST:PORT rank 0 serves the protocol on")
    ap.add_argument("--run-dir", required=True, help="the run's folder; every path a call names must lie inside it")
    ap.add_argument(
        "--address-file",
        help="where rank 0 writes the HOST:PORT it listens on once bound (under a temporary name, then renamed); "
        "with port 0 in --listen the system picks a free port, so no other process can take it first",
    )
    args = ap.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    device = init_distributed()
    cmd_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=3650))
    obj_group = dist.new_group(backend="gloo")
    engine = Engine(device, obj_group=obj_group)
    if engine.rank != 0:
        follow_commands(engine, cmd_group, os.path.realpath(args.run_dir))
        return
    worker = Worker(engine, os.path.realpath(args.run_dir), cmd_group)
    server = ThreadingHTTPServer((host.strip("[]") or "127.0.0.1", int(port)), make_handler(worker))
    server.daemon_threads = True
    address = f"{host}:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    if args.address_file:
        tmp = f"{args.address_file}.tmp"
        with open(tmp, "w") as f:
            f.write(address)
        os.replace(tmp, args.address_file)
    print(f"arena_rl_fsdp2: listening on {address}, world size {engine.world}, device {device}", flush=True)
    try:
        worker.serve_commands()
    finally:
        server.shutdown()
        time.sleep(0)
