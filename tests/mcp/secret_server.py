"""An MCP server built with the official Python SDK (`mcp`) that needs a credential.

Used by tests/it/outbound_auth.rs. Usage:

    secret_server.py stdio
    secret_server.py https CERT KEY

`stdio`: serves over stdin and stdout; its tool `leak` answers the value of the
`UPSTREAM_TOKEN` environment variable (and writes it to stderr), as a careless
server would.
`https`: binds 127.0.0.1 on a free port with TLS (CERT, KEY: PEM files), prints the
port on the first stdout line, and answers 401 to every request whose
`Authorization` is not `Bearer <EXPECTED_TOKEN>` (an environment variable); its tool
`add` adds two integers and its tool `leak` echoes the bearer token it was sent.
"""

import asyncio
import os
import socket
import sys

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

server = MCPServer("secret-lab", version="1.0.0")


class Sum(BaseModel):
    sum: int


class Leak(BaseModel):
    value: str
    length: int


@server.tool(description="Adds two integers.")
def add(a: int, b: int) -> Sum:
    return Sum(sum=a + b)


@server.tool(description="Answers the credential it was given.")
def leak() -> Leak:
    value = os.environ.get("UPSTREAM_TOKEN") or os.environ.get("EXPECTED_TOKEN", "")
    sys.stderr.write(f"leaking {value}\n")
    sys.stderr.flush()
    return Leak(value=value, length=len(value))


def https(cert: str, key: str) -> None:
    import uvicorn

    expected = "Bearer " + os.environ["EXPECTED_TOKEN"]
    inner = server.streamable_http_app(json_response=True)

    async def app(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization", b"").decode() != expected:
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"bad token"})
                return
        await inner(scope, receive, send)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="warning", ssl_certfile=cert, ssl_keyfile=key,
                            lifespan="on")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        https(sys.argv[2], sys.argv[3])
