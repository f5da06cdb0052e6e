"""An agent that is an ordinary MCP client (the Python MCP SDK), as a `command` client's program.

It reads the servers mst gives it from `MST_MCP_CONFIG` (the `mcpServers` format), lists each
server's tools (after asking each endpoint without the token it was given, to show it is
refused), then makes the calls its input (stdin, JSON) names:
`{"calls": [{"server": LABEL, "tool": NAME, "arguments": {...}}]}` (a call may also say
`"bigArgument": [NAME, N]`, an argument of N bytes, `"lengthOnly": true`, to print the
result's length instead of its text, and `"repeat": N`, to make it N times, 50 at once, and
print how many calls were answered, answered with an error, or refused, with the last error's
text). It prints one JSON object
on stdout: the tools it was shown by server (name and description), each call's result
(`text`, `isError`, or `error` for a JSON-RPC error), and the HTTP status each endpoint gave
without the token.
"""

import asyncio
import json
import os
import sys

import httpx2

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def serve(label, entry, calls, seen):
    http = create_mcp_http_client(headers=entry.get("headers"))
    async with http, streamable_http_client(entry["url"], http_client=http) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            listed = await session.list_tools()
            seen["tools"][label] = [
                {"name": tool.name, "description": tool.description} for tool in listed.tools
            ]
            for call in calls:
                if call["server"] != label:
                    continue
                if "repeat" in call:
                    seen["results"].append(await flood(session, call))
                    continue
                arguments = dict(call.get("arguments", {}))
                if "bigArgument" in call:  # [NAME, N]: NAME is N bytes of "x"
                    name, size = call["bigArgument"]
                    arguments[name] = "x" * size
                try:
                    result = await session.call_tool(call["tool"], arguments)
                    text = "\n".join(c.text for c in result.content if hasattr(c, "text"))
                    if call.get("lengthOnly"):
                        text = len(text)
                    seen["results"].append(
                        {"tool": call["tool"], "text": text, "isError": bool(result.is_error)}
                    )
                except Exception as error:  # a JSON-RPC error: the server refused the call
                    seen["results"].append({"tool": call["tool"], "error": str(error)})


async def flood(session, call):
    """Makes `call` `call["repeat"]` times, 50 at once: the counts of each way it ended."""
    tally = {"tool": call["tool"], "answered": 0, "isError": 0, "refused": 0, "lastError": None}

    async def one():
        try:
            result = await session.call_tool(call["tool"], call.get("arguments", {}))
        except Exception as error:
            tally["refused"] += 1
            tally["lastError"] = str(error)
            return
        if result.is_error:
            tally["isError"] += 1
            tally["lastError"] = "\n".join(c.text for c in result.content if hasattr(c, "text"))
        else:
            tally["answered"] += 1

    left = call["repeat"]
    while left > 0:
        batch = min(left, 50)
        await asyncio.gather(*(one() for _ in range(batch)))
        left -= batch
    return tally


async def main():
    with open(os.environ["MST_MCP_CONFIG"]) as file:
        servers = json.load(file)["mcpServers"]
    calls = json.loads(sys.stdin.read() or "{}").get("calls", [])
    seen = {"tools": {}, "results": [], "withoutToken": {}}
    for label, entry in servers.items():
        # What the endpoint answers a client that does not present the trial's token.
        async with httpx2.AsyncClient() as bare:
            response = await bare.post(entry["url"], json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            seen["withoutToken"][label] = response.status_code
        await serve(label, entry, calls, seen)
    print(json.dumps(seen))


asyncio.run(main())
