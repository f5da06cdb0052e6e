"""The agent of `cargo xtask bench tools`: N calls of server-everything's `echo`, timed, either
straight to the server (`direct`: the agent starts it over stdio, as an agent without mst
would; `http`: the agent starts it as a streamable-HTTP server on a free loopback port),
or through mst's tool proxy (`proxied`: the servers `MST_MCP_CONFIG` names). Prints one JSON
object: `calls`, `seconds`, and the per-call `p50Ms` and `p95Ms`."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def calls(session, n):
    await session.initialize()
    took = []
    started = time.perf_counter()
    for i in range(n):
        before = time.perf_counter()
        await session.call_tool("echo", {"message": f"call {i}"})
        took.append((time.perf_counter() - before) * 1000)
    seconds = time.perf_counter() - started
    took.sort()
    return {
        "calls": n,
        "seconds": seconds,
        "p50Ms": took[len(took) // 2],
        "p95Ms": took[int(len(took) * 0.95)],
    }


async def main(mode, n):
    if mode == "direct":
        server = StdioServerParameters(command="mcp-server-everything", args=["stdio"])
        async with stdio_client(server) as (read, write):
            async with ClientSession(read, write) as session:
                return await calls(session, n)
    if mode == "http":
        return await over_http(n)
    with open(os.environ["MST_MCP_CONFIG"]) as file:
        entry = json.load(file)["mcpServers"]["everything"]
    return await http_calls(entry["url"], entry["headers"], n)


async def http_calls(url, headers, n):
    http = create_mcp_http_client(headers=headers)
    async with http, streamable_http_client(url, http_client=http) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            return await calls(session, n)


async def over_http(n):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, PORT=str(port))
    server = subprocess.Popen(
        ["mcp-server-everything", "streamableHttp"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        return await http_calls(f"http://127.0.0.1:{port}/mcp", {}, n)
    finally:
        server.kill()


print(json.dumps(asyncio.run(main(sys.argv[1], int(sys.argv[2])))))
