// Drives toolgate's /mcp front with the official TypeScript MCP client
// (@modelcontextprotocol/sdk). Used by tests/it/mcp_front.rs. Reads a plan (JSON) from
// argv[2]:
//
//     {"url": "...", "headers": {...},
//      "calls": [{"name": "...", "arguments": {...}}]}
//
// connects, lists the tools (the SDK caches their output schemas and validates every
// structuredContent against them), makes the calls in order and prints one JSON
// object with what the client saw. An exception is recorded as {"error": ...} for the
// call (the Rust test asserts there is none). Exits 0 either way.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

function errorJson(e) {
  return { type: e?.constructor?.name ?? typeof e, code: e?.code, message: String(e?.message ?? e) };
}

async function run(plan) {
  const out = {};
  const transport = new StreamableHTTPClientTransport(new URL(plan.url), {
    requestInit: { headers: plan.headers },
  });
  const client = new Client({ name: "toolgate-test", version: "1.0.0" });
  try {
    await client.connect(transport);
    out.protocol_version = transport.protocolVersion ?? null;
    const listed = await client.listTools();
    out.tools = listed.tools.map((t) => ({ name: t.name, outputSchema: t.outputSchema ?? null }));
    out.calls = [];
    for (const call of plan.calls ?? []) {
      try {
        const result = await client.callTool({ name: call.name, arguments: call.arguments ?? {} });
        out.calls.push({
          isError: Boolean(result.isError),
          structuredContent: result.structuredContent ?? null,
          content: result.content,
          meta: result._meta ?? null,
        });
      } catch (e) {
        out.calls.push({ error: errorJson(e) });
      }
    }
  } catch (e) {
    out.connect_error = errorJson(e);
  } finally {
    await client.close().catch(() => {});
  }
  return out;
}

const plan = JSON.parse(process.argv[2]);
const out = await run(plan);
process.stdout.write(JSON.stringify(out) + "\n");
