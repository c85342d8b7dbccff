"""A hand-written Streamable HTTP MCP server (standard library only) that floods the
client with requests on the stream it opens with GET.

Used by tests/it/mcp_adapter.rs. Usage: flood_http_server.py STATE_DIR COUNT. Binds
127.0.0.1 on a free port and prints the port on the first stdout line. Every
`initialize` appends a line to STATE_DIR/sessions. Tools: `echo` (structured result)
and `arm` (answers; then each GET stream, open or opened later, writes COUNT `ping`
requests as fast as it can and writes STATE_DIR/flood-done, or STATE_DIR/get-closed if
the client closed the stream first). Answers the client POSTs are accepted (202).
"""

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

state = sys.argv[1]
count = int(sys.argv[2])
armed = threading.Event()


def mark(name, text=""):
    with open(os.path.join(state, name), "a") as f:
        f.write(text + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, message, status=200):
        body = json.dumps(message).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Mcp-Session-Id", "flood-session")
        self.end_headers()
        self.wfile.write(body)

    def accepted(self):
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_DELETE(self):
        self.accepted()

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        armed.wait()
        try:
            batch = 1000
            for first in range(0, count, batch):
                events = "".join(
                    "data: " + json.dumps({"jsonrpc": "2.0", "id": f"g{k}", "method": "ping"}) + "\n\n"
                    for k in range(first, min(first + batch, count)))
                self.wfile.write(events.encode())
                self.wfile.flush()
            mark("flood-done", str(count))
            # Hold the stream open until the client goes away.
            while True:
                armed.wait(3600)
                self.wfile.write(b": idle\n\n")
                self.wfile.flush()
        except OSError:
            mark("get-closed")

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        message = json.loads(self.rfile.read(length))
        method = message.get("method")
        rid = message.get("id")
        if method is None or method.startswith("notifications/"):
            return self.accepted()
        if method == "initialize":
            mark("sessions")
            return self.answer({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "flood-http", "version": "1.0.0"}}})
        if method == "tools/list":
            return self.answer({"jsonrpc": "2.0", "id": rid, "result": {"tools": [
                {"name": "echo", "inputSchema": {"type": "object"}},
                {"name": "arm", "inputSchema": {"type": "object"}}]}})
        if method == "tools/call":
            name = message["params"]["name"]
            if name == "arm":
                armed.set()
            out = {"tool": name}
            return self.answer({"jsonrpc": "2.0", "id": rid, "result": {
                "content": [{"type": "text", "text": json.dumps(out)}], "structuredContent": out}})
        return self.answer({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}})


ThreadingHTTPServer.daemon_threads = True
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
