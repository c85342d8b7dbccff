#!/usr/bin/env python3
"""A stand-in for the court's filing service, for the demo and the tests.

Standard-library Python only. It serves, on 127.0.0.1:

  POST /filings            one-phase filing: {"filing_id", "status": "filed"}
  POST /filings/prepare    two-phase prepare: {"filing_id", "status": "prepared",
                           "commit_token"}; the filing waits for its commit
  POST /filings/commit     {"commit_token"}: prepared -> committed (a repeat of a
                           committed token answers the same; a rolled-back one 409)
  POST /filings/rollback   {"commit_token"}: prepared -> rolled_back (a repeat
                           answers the same; a committed one 409)
  GET  /filings            every filing: [{"filing_id", "status", "call_id", ...}]
  GET  /filings/<id>       one filing
  POST /control            test hooks: {"fail_next": "commit"|"rollback", "count": N,
                           "status": 503} makes the next N such requests fail;
                           {"hold_next": "commit"|"rollback"} makes the next such
                           request wait, before it takes effect, until
                           {"release": "commit"|"rollback"}
  GET  /control            {"held": {"commit": N, "rollback": N}}: requests waiting

Usage: court.py [--port 8799]. With --port 0 it picks a free port. It prints
"court listening on http://127.0.0.1:PORT" once it accepts connections.
The two-phase contract it implements is the one docs/policy.md gives (Two-phase
tools): a commit or rollback of one token is idempotent; the other phase of a decided
token is refused with 409.
"""

import argparse
import json
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 1024 * 1024

LOCK = threading.Lock()
FILINGS = {}  # filing_id -> record
BY_TOKEN = {}  # commit_token -> filing_id
FAILURES = {"commit": [0, 503], "rollback": [0, 503]}
HOLD_NEXT = {"commit": False, "rollback": False}  # the next request of the phase waits
HELD = {"commit": 0, "rollback": 0}  # requests waiting now
RELEASE = {"commit": threading.Event(), "rollback": threading.Event()}


class Handler(BaseHTTPRequestHandler):
    server_version = "court-standin/1"

    def log_message(self, fmt, *args):  # quiet: the tests read stdout
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return None
        raw = self.rfile.read(length) if length else b"{}"
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def do_GET(self):
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        with LOCK:
            if parts == ["control"]:
                return self.answer(200, {"held": dict(HELD)})
            if parts == ["filings"]:
                return self.answer(200, {"filings": list(FILINGS.values())})
            if len(parts) == 2 and parts[0] == "filings" and parts[1] in FILINGS:
                return self.answer(200, FILINGS[parts[1]])
        self.answer(404, {"error": "not found"})

    def do_POST(self):
        body = self.body()
        if body is None:
            return self.answer(400, {"error": "the body must be one JSON object"})
        path = self.path.split("?")[0].rstrip("/")
        call_id = self.headers.get("x-toolgate-call-id", "")
        phase = path.rsplit("/", 1)[1]
        if path in ("/filings/commit", "/filings/rollback"):
            self.wait_if_held(phase)
        with LOCK:
            if path == "/filings":
                filing_id = "f-" + secrets.token_hex(8)
                FILINGS[filing_id] = {"filing_id": filing_id, "status": "filed",
                                      "call_id": call_id, "request": body}
                return self.answer(200, {"filing_id": filing_id, "status": "filed"})
            if path == "/filings/prepare":
                filing_id = "f-" + secrets.token_hex(8)
                token = "ct-" + secrets.token_hex(24)
                FILINGS[filing_id] = {"filing_id": filing_id, "status": "prepared",
                                      "call_id": call_id, "request": body,
                                      "commits": 0, "rollbacks": 0}
                BY_TOKEN[token] = filing_id
                return self.answer(200, {"filing_id": filing_id, "status": "prepared",
                                         "commit_token": token})
            if path in ("/filings/commit", "/filings/rollback"):
                phase = path.rsplit("/", 1)[1]
                failing = FAILURES[phase]
                if failing[0] > 0:
                    failing[0] -= 1
                    return self.answer(failing[1], {"error": "injected failure"})
                filing_id = BY_TOKEN.get(body.get("commit_token"))
                if filing_id is None:
                    return self.answer(404, {"error": "unknown commit token"})
                record = FILINGS[filing_id]
                done, other = ("committed", "rolled_back") if phase == "commit" \
                    else ("rolled_back", "committed")
                record["commits" if phase == "commit" else "rollbacks"] += 1
                if record["status"] == other:
                    return self.answer(409, {"error": f"the filing is already {other}"})
                record["status"] = done
                return self.answer(200, {"filing_id": filing_id, "status": done})
            if path == "/control":
                if body.get("hold_next") in HOLD_NEXT:
                    RELEASE[body["hold_next"]].clear()
                    HOLD_NEXT[body["hold_next"]] = True
                    return self.answer(200, {"ok": True})
                if body.get("release") in RELEASE:
                    RELEASE[body["release"]].set()
                    return self.answer(200, {"ok": True})
                phase = body.get("fail_next")
                if phase not in FAILURES:
                    return self.answer(400, {"error": "fail_next must be commit or rollback"})
                FAILURES[phase] = [int(body.get("count", 1)), int(body.get("status", 503))]
                return self.answer(200, {"ok": True})
        self.answer(404, {"error": "not found"})

    def wait_if_held(self, phase):
        """Waits (outside the lock) for a release when this request was to be held."""
        with LOCK:
            held = HOLD_NEXT[phase]
            HOLD_NEXT[phase] = False
            if held:
                HELD[phase] += 1
        if held:
            RELEASE[phase].wait()
            with LOCK:
                HELD[phase] -= 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8799)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"court listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
