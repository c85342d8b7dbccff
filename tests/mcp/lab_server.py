"""A hand-written stdio MCP server (standard library only) that misbehaves on purpose.

Used by tests/mcp_adapter.rs to drive the MCP adapter's supervision. Usage:

    lab_server.py STATE_DIR [crash-first | hang-handshake]

Every start appends a line to STATE_DIR/starts and writes its pid to STATE_DIR/pid.
`crash-first`: the first start exits at once with a message on stderr.
`hang-handshake`: never answers `initialize`.
`crash-first-call`: the first start exits in the middle of its first `tools/call`.
Tools: `echo` (structured result), `fail` (an error result), `crash` (the process
exits during the call), `hang` (never answers).
"""

import json
import os
import sys
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
]


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    message = json.loads(line)
    method = message.get("method")
    if "id" not in message:
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
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": f"unknown tool {name}"}})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "method not found"}})
