"""A hand-written stdio MCP server (standard library only) that misbehaves on purpose.

Used by tests/mcp_adapter.rs to drive the MCP adapter's supervision. Usage:

    lab_server.py STATE_DIR [crash-first | hang-handshake]

Every start appends a line to STATE_DIR/starts and writes its pid to STATE_DIR/pid.
`crash-first`: the first start exits at once with a message on stderr.
`hang-handshake`: never answers `initialize`.
`crash-first-call`: the first start exits in the middle of its first `tools/call`.
Tools: `echo` (structured result), `fail` (an error result), `crash` (the process
exits during the call), `hang` (never answers), `probe` (tries to read the file
`read` and to connect to 127.0.0.1 on port `connect`; says what happened), and three that run beside the
message loop (so the server keeps reading while they run): `slow` (appends its
request id to STATE_DIR/calls, then answers once STATE_DIR/go exists or after
`seconds`; with a progressToken it first reports one progress step, "started"; a
`notifications/cancelled` for it is written to STATE_DIR/cancelled as
`<request id> <unix time>` and stops it), `progress` (three progress notifications
for the request's progressToken, then a result), `flood` (`count` progress
notifications as fast as it can write them, then a result). Two stop reading their
input and write `count` `ping` requests instead, then write STATE_DIR/flood-done and
hang: `ping_flood` after answering its call, `ping_flood_in_call` without answering.
"""

import json
import os
import socket
import sys
import threading
import time

state = sys.argv[1]
mode = sys.argv[2] if len(sys.argv) > 2 else ""

with open(os.path.join(state, "starts"), "a") as f:
    f.write("start\n")
with open(os.path.join(state, "starts")) as f:
    starts = len(f.readlines())
with open(os.path.join(state, "pid"), "w") as f:
    f.write(str(os.getpid()))

if mode == "crash-first" and starts == 1:
    sys.stderr.write("lab server: refusing to start (start 1)\n")
    sys.stderr.flush()
    sys.exit(3)

OBJECT = {"type": "object"}
TOOLS = [
    {"name": "echo", "description": "Echoes `text`.", "inputSchema": OBJECT,
     "outputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}},
    {"name": "fail", "description": "Always fails.", "inputSchema": OBJECT},
    {"name": "crash", "description": "Exits mid-call.", "inputSchema": OBJECT},
    {"name": "hang", "description": "Never answers.", "inputSchema": OBJECT},
    {"name": "probe", "description": "Reads `read`, connects to port `connect`.", "inputSchema": OBJECT},
    {"name": "slow", "description": "Answers when told to.", "inputSchema": OBJECT},
    {"name": "progress", "description": "Reports three steps.", "inputSchema": OBJECT},
    {"name": "flood", "description": "Floods progress.", "inputSchema": OBJECT},
    {"name": "ping_flood", "description": "Answers, then floods requests.", "inputSchema": OBJECT},
    {"name": "ping_flood_in_call", "description": "Floods requests.", "inputSchema": OBJECT},
]

write_lock = threading.Lock()
stopped = {}  # request id (as JSON) -> threading.Event


def send(message):
    with write_lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def result(rid, out):
    send({"jsonrpc": "2.0", "id": rid, "result": {
        "content": [{"type": "text", "text": json.dumps(out)}], "structuredContent": out}})


def slow(rid, args, stop, token):
    with open(os.path.join(state, "calls"), "a") as f:
        f.write(json.dumps(rid) + "\n")
    if token is not None:
        send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {
            "progressToken": token, "progress": 0, "message": "started"}})
    deadline = time.time() + float(args.get("seconds", 30))
    while time.time() < deadline and not stop.is_set():
        if os.path.exists(os.path.join(state, "go")):
            result(rid, {"text": "done", "start": starts})
            return
        stop.wait(0.01)


def progress(rid, token, args):
    for step in (1, 2, 3):
        if token is not None:
            send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {
                "progressToken": token, "progress": step, "total": 3, "message": f"step {step}"}})
        time.sleep(0.02)
    result(rid, {"text": "three steps", "start": starts})


def flood(rid, token, args):
    for step in range(int(args.get("count", 10000))):
        if token is not None:
            send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {
                "progressToken": token, "progress": step, "message": "x" * 100}})
    result(rid, {"text": "flooded", "start": starts})


def ping_flood(count):
    # Runs on the message loop: nothing more is read while the requests are written.
    batch = 10000
    for first in range(0, count, batch):
        lines = "".join(json.dumps({"jsonrpc": "2.0", "id": f"r{k}", "method": "ping"}) + "\n"
                        for k in range(first, min(first + batch, count)))
        with write_lock:
            sys.stdout.write(lines)
            sys.stdout.flush()
    with open(os.path.join(state, "flood-done"), "w") as f:
        f.write(str(count))
    time.sleep(3600)


for line in sys.stdin:
    message = json.loads(line)
    method = message.get("method")
    if "id" not in message:
        if method == "notifications/cancelled":
            cancelled = json.dumps((message.get("params") or {}).get("requestId"))
            with open(os.path.join(state, "cancelled"), "a") as f:
                f.write(f"{cancelled} {time.time()}\n")
            if cancelled in stopped:
                stopped[cancelled].set()
        continue  # a notification
    rid = message["id"]
    if method == "initialize":
        if mode == "hang-handshake":
            time.sleep(3600)
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "lab-stdio", "version": "1.0.0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        name = message["params"]["name"]
        args = message["params"].get("arguments") or {}
        if mode == "crash-first-call" and starts == 1:
            sys.stderr.write("lab server: crashing in the first call\n")
            sys.stderr.flush()
            os._exit(5)
        if name == "echo":
            out = {"text": args.get("text", ""), "start": starts}
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "content": [{"type": "text", "text": json.dumps(out)}], "structuredContent": out}})
        elif name == "fail":
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "content": [{"type": "text", "text": "the archive is closed today"}], "isError": True}})
        elif name == "crash":
            sys.stderr.write("lab server: crashing mid-call\n")
            sys.stderr.flush()
            os._exit(4)
        elif name == "hang":
            time.sleep(3600)
        elif name == "probe":
            # What a hostile server would try: read a file, connect to a port.
            out = {}
            if "read" in args:
                try:
                    with open(args["read"], "rb") as f:
                        f.read(16)
                    out["read"] = "ok"
                except OSError as e:
                    out["read"] = f"denied: {e.strerror}"
            if "connect" in args:
                try:
                    socket.create_connection(("127.0.0.1", int(args["connect"])), timeout=2).close()
                    out["connect"] = "ok"
                except OSError as e:
                    out["connect"] = f"denied: {e.strerror or e}"
            result(rid, out)
        elif name == "ping_flood":
            result(rid, {"text": "flooding", "start": starts})
            ping_flood(int(args.get("count", 100000)))
        elif name == "ping_flood_in_call":
            ping_flood(int(args.get("count", 100000)))
        elif name in ("slow", "progress", "flood"):
            token = ((message["params"].get("_meta") or {}).get("progressToken"))
            stop = stopped.setdefault(json.dumps(rid), threading.Event())
            work = {"slow": lambda: slow(rid, args, stop, token),
                    "progress": lambda: progress(rid, token, args),
                    "flood": lambda: flood(rid, token, args)}[name]
            threading.Thread(target=work, daemon=True).start()
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": f"unknown tool {name}"}})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "method not found"}})
