"""A tiny MCP server over stdio (newline-delimited JSON-RPC, no SDK): one tool, `nap`, that
sleeps NAP_SECONDS (default 1.5) before it answers. Tests use it to keep an agent busy in a tool
call between two model calls."""

import json
import os
import sys
import time

NAP = float(os.environ.get("NAP_SECONDS", "1.5"))


def reply(request_id, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    if not line.strip():
        continue
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if request_id is None:
        continue  # a notification
    if method == "initialize":
        reply(request_id, {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "slow", "version": "1"},
        })
    elif method == "tools/list":
        reply(request_id, {"tools": [{
            "name": "nap",
            "description": "Sleeps, then says so.",
            "inputSchema": {"type": "object", "properties": {}},
        }]})
    elif method == "tools/call":
        time.sleep(NAP)
        reply(request_id, {"content": [{"type": "text", "text": "rested"}], "isError": False})
    elif method == "ping":
        reply(request_id, {})
    else:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id,
                                     "error": {"code": -32601, "message": f"no method {method}"}}) + "\n")
        sys.stdout.flush()
