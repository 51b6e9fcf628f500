"""A small Python client of `arena-rl-trainer/1` (the real client is the Rust crate `fsdp2-trainer`): for
development, the smoke check and the GPU program."""

import hashlib
import http.client
import json
import os
import time

from . import PROTOCOL


class ProtocolError(Exception):
    def __init__(self, status, body):
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


class Client:
    def __init__(self, address, key=None, poll_s=0.05):
        self.host, _, port = address.rpartition(":")
        self.port = int(port)
        self.key = key if key is not None else os.environ["ARENA_RL_TRAINER_API_KEY"]
        self.poll_s = poll_s

    def request(self, method, path, body=None, key=True):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {self.key}"
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        text = r.read()
        conn.close()
        out = json.loads(text) if text else None
        if r.status >= 400:
            raise ProtocolError(r.status, out)
        return r.status, out

    def wait_ready(self, timeout_s=300, proc=None):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the worker exited with {proc.returncode}")
            try:
                return self.request("GET", "/v1/health", key=False)[1]
            except OSError:
                time.sleep(0.2)
        raise TimeoutError("the worker did not answer")

    def hello(self):
        return self.request("GET", "/v1/hello")[1]

    def start(self, call, body):
        body = dict(body, protocol=PROTOCOL)
        return self.request("POST", f"/v1/{call}", body)[1]["op"]

    def wait(self, op):
        while True:
            _, o = self.request("GET", f"/v1/ops/{op}")
            if o["state"] == "done":
                return o["result"]
            if o["state"] == "failed":
                raise ProtocolError(500, o["error"])
            time.sleep(self.poll_s)

    def call(self, call, body):
        return self.wait(self.start(call, body))

    def step(self, step, kind, batch, **extra):
        sha = hashlib.sha256(open(batch, "rb").read()).hexdigest()
        return self.call("step", dict({"step": step, "kind": kind, "batch": batch, "sha256": sha}, **extra))
