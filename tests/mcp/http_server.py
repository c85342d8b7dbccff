"""A small Streamable HTTP MCP server built with the official Python SDK (`mcp`).

Used by tests/mcp_adapter.rs as an upstream reached over HTTP. Binds 127.0.0.1 on a
free port, prints the port on the first stdout line, and serves until killed.
"""

import asyncio
import socket

import uvicorn
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

server = MCPServer("lab-http", version="1.0.0")


class Sum(BaseModel):
    sum: int


@server.tool(description="Adds two integers.")
def add(a: int, b: int) -> Sum:
    return Sum(sum=a + b)


def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    app = server.streamable_http_app(json_response=True)
    config = uvicorn.Config(app, log_level="warning")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
