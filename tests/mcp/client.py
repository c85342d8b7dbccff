"""Drives toolgate's /mcp front with the official Python MCP client (package `mcp`).

Used by tests/mcp_front.rs. Reads a plan (JSON) from argv[1]:

    {"url": "...", "headers": {...}, "mode": "legacy" | "auto",
     "calls": [{"name": "...", "arguments": {...}, "meta": {...}, "progress": true}]}

connects (mode "legacy": the initialize handshake; "auto": server/discover first,
the stateless 2026-07-28 revision when the server has it), lists the tools, makes the
calls in order and prints one JSON object with what the client saw (with
"progress": true, a call passes a progress callback and its notifications are
printed as [progress, total, message] triples). A connection
that fails prints {"connect_error": {...}} instead. Exits 0 either way: the Rust test
asserts on the printed JSON.
"""

import asyncio
import json
import sys

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


def error_json(e: BaseException) -> dict:
    if isinstance(e, MCPError):
        return {"type": "MCPError", "code": e.code, "message": e.message, "data": e.data}
    if isinstance(e, BaseExceptionGroup) and e.exceptions:
        return error_json(e.exceptions[0])
    return {"type": type(e).__name__, "message": str(e)}


async def run(plan: dict) -> dict:
    out: dict = {}
    # Every HTTP answer's status and WWW-Authenticate challenge, for the tests of MCP
    # authorization (401 with resource metadata).
    out["responses"] = []

    async def seen(response) -> None:
        out["responses"].append(
            {"status": response.status_code, "www_authenticate": response.headers.get("www-authenticate")}
        )

    http = httpx2.AsyncClient(
        headers=plan["headers"], timeout=httpx2.Timeout(60.0), event_hooks={"response": [seen]}
    )
    transport = streamable_http_client(plan["url"], http_client=http)
    try:
        async with Client(transport, mode=plan.get("mode", "auto")) as client:
            out["protocol_version"] = client.protocol_version
            listed = await client.list_tools()
            out["tools"] = [
                {
                    "name": t.name,
                    "description": t.description,
                    "inputSchema": t.input_schema,
                    "outputSchema": t.output_schema,
                }
                for t in listed.tools
            ]
            calls = []
            for call in plan.get("calls", []):
                heard: list = []

                async def on_progress(progress, total, message):
                    heard.append([progress, total, message])

                try:
                    result = await client.call_tool(
                        call["name"],
                        call.get("arguments", {}),
                        progress_callback=on_progress if call.get("progress") else None,
                        meta=call.get("meta"),
                    )
                    calls.append(
                        {
                            "isError": bool(result.is_error),
                            "structuredContent": result.structured_content,
                            "text": [c.text for c in result.content if getattr(c, "type", "") == "text"],
                            "meta": result.meta,
                            "progress": heard,
                        }
                    )
                except Exception as e:  # a protocol error is a result for the test
                    calls.append({"error": error_json(e)})
            out["calls"] = calls
    except Exception as e:
        out["connect_error"] = error_json(e)
    finally:
        await http.aclose()
    return out


def main() -> None:
    plan = json.loads(sys.argv[1])
    print(json.dumps(asyncio.run(run(plan)), default=str))


if __name__ == "__main__":
    main()
