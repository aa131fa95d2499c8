"""The same tools over streamable HTTP on sandcell-server (`/mcp`), each tenant with
its own token and its own sessions."""

import base64
import contextlib
import os

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from conftest import fails, ok

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def url():
    return os.environ["SANDCELL_MCP_URL"]


@contextlib.asynccontextmanager
async def connect(token):
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with streamable_http_client(url(), http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                yield session


async def purge(session):
    """Destroys every session the caller has, so the server keeps no sandbox."""
    listed = await ok(session, "list_sessions")
    for line in listed.splitlines():
        if line.startswith("{"):
            name = line.split('"session":"')[1].split('"')[0]
            await ok(session, "release", session=name, mode="destroy")


@pytest.fixture
async def first():
    async with connect(os.environ["SANDCELL_MCP_TOKEN_A"]) as session:
        yield session
        await purge(session)


@pytest.fixture
async def second():
    async with connect(os.environ["SANDCELL_MCP_TOKEN_B"]) as session:
        yield session
        await purge(session)


async def test_the_tools_answer_over_http(first):
    names = {t.name for t in (await first.list_tools()).tools}
    assert {"run_command", "read_file", "write_file", "release"} <= names
    await ok(first, "write_file", session="web", path="app.py", content="print(6 * 7)\n")
    out = await ok(first, "run_command", session="web", command="cat app.py; echo ok")
    assert "exit code: 0" in out and "print(6 * 7)" in out
    assert "invalid input" in await fails(first, "read_file", session="web", path="../../etc/passwd")


async def test_each_tenant_sees_only_its_own_sessions(first, second):
    """ADVERSARIAL 31 on MCP: tenant B neither lists nor reaches tenant A's session."""
    await ok(first, "write_file", session="mine", path="secret.txt", content="first's")
    assert '"session":"mine"' in await ok(first, "list_sessions")
    assert '"session":"mine"' not in await ok(second, "list_sessions")
    # The same name under the other tenant is another session, without the file.
    assert "not found" in await fails(second, "read_file", session="mine", path="secret.txt")
    assert await ok(first, "read_file", session="mine", path="secret.txt") == "first's"


async def test_a_wrong_token_is_refused():
    with pytest.raises(BaseException):
        async with connect("not-a-tenant-token") as session:
            await session.list_tools()


async def test_a_tenants_live_sandboxes_are_bounded(first, second):
    # The server runs with --mcp-max-sandboxes 2.
    await ok(first, "run_command", session="one", command="true")
    await ok(first, "run_command", session="two", command="true")
    refused = await fails(first, "run_command", session="three", command="true")
    assert "limit" in refused, refused
    # Another tenant has its own allowance.
    await ok(second, "run_command", session="three", command="true")
    # Releasing one makes room.
    await ok(first, "release", session="one", mode="destroy")
    await ok(first, "run_command", session="three", command="true")


async def test_loader_variables_reach_no_host_helper(first):
    """ADVERSARIAL 36 on MCP: `run_command`'s `env` reaches the command only. The
    payload (built on the host by mcp_stdio.rs) leaves a file named after any program
    that loads it in SANDCELL_ADV36_MARKERS; the server runs at namespaces, where every
    command passes through helpers on the host."""
    host_payload = os.environ["SANDCELL_ADV36_PAYLOAD"]
    markers = os.environ["SANDCELL_ADV36_MARKERS"]
    with open(host_payload, "rb") as built:
        payload = base64.b64encode(built.read()).decode()
    await ok(first, "write_file", session="adv", path="adv36/payload.so", content=payload, encoding="base64")
    await ok(first, "write_file", session="adv", path="adv36/env.sh", content=f"touch {markers}/bash_env\n")
    home = (await ok(first, "run_command", session="adv", command="pwd")).split("\n")
    home = next(line for line in home if line.startswith("/"))
    for preload in (f"{home}/adv36/payload.so", host_payload):
        env = {
            "LD_PRELOAD": preload,
            "LD_AUDIT": preload,
            "LD_LIBRARY_PATH": f"{home}/adv36",
            "GCONV_PATH": f"{home}/adv36",
            "BASH_ENV": f"{home}/adv36/env.sh",
        }
        out = await ok(first, "run_command", session="adv", command='echo "seen:$LD_PRELOAD"', env=env)
        assert f"seen:{preload}" in out, out
        assert sorted(os.listdir(markers)) == [], f"ADVERSARIAL 36 with LD_PRELOAD={preload}"
