"""Makes gated calls of the demo's case_lookup, one at a time (docs/perf/instructions.sh).

    python3 calls.py <port> <calls> [--open-run]
"""
import http.client
import json
import sys

port, calls = int(sys.argv[1]), int(sys.argv[2])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)


def post(path, body, token):
    headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
    conn.request("POST", path, body=json.dumps(body), headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


if "--open-run" in sys.argv:
    status, body = post("/v1/runs", {"run_id": "run-perf", "scope": {"case_id": "C-1001"}}, "demo-admin")
    if status != 201:
        sys.exit(f"opening the run failed: {status} {body[:200]!r}")
call = {
    "role_id": "research_agent",
    "run_id": "run-perf",
    "lane_id": "research",
    "tool_name": "case_lookup",
    "arguments": {},
    "scope": {"case_id": "C-1001"},
}
failed = 0
for _ in range(calls):
    status, body = post("/v1/tool-calls", call, "demo-research_agent")
    failed += status != 200
if failed:
    sys.exit(f"{failed} of {calls} calls failed")
print(f"{calls} calls, all answered 200")
