"""A stand-in SGLang worker for probing a router: it answers `/v1/loads` with the snapshot in a JSON
file (rewritten by the test between polls), answers every completion at once with one token, and
answers the discovery calls a router makes (health, models, server info). Stdlib only.

    python fake_loads_worker.py PORT SNAPSHOT.json [HOLD_S]

HOLD_S (default 0) is how long it holds every completion before answering, so a router counts it in
flight that long; the router fixture's "warm up" request is answered at once (else a tie sent it to a
held worker 2 times in 3, and the fixture's 10 s retries ran out of time)."""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SNAPSHOT = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("snapshot.json")
HOLD_S = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
COMPLETION = {"id": "fake", "object": "text_completion", "created": 0, "model": "simulated",
              "choices": [{"index": 0, "text": "a", "finish_reason": "length", "logprobs": None}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def answer(self, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path
        if path.startswith("/v1/loads"):
            snap = {**json.loads(SNAPSHOT.read_text()), "timestamp": time.time(), "dp_rank": 0}
            return self.answer({"timestamp": "", "dp_rank_count": 1, "loads": [snap]})
        if path.startswith("/v1/models"):
            model = {"id": "simulated", "object": "model", "owned_by": "kvadmit", "created": 0}
            return self.answer({"object": "list", "data": [model]})
        if "server_info" in path or "model_info" in path:
            return self.answer({"model_path": "simulated", "served_model_name": "simulated", "dp_size": 1,
                                "is_generation": True})  # fmt: skip
        return self.answer({})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if b'"warm up"' not in body:
            time.sleep(HOLD_S)
        self.answer(COMPLETION)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
