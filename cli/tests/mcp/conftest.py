"""Shared set-up: `sandcell mcp` over stdio through the official Python MCP SDK.

The binary is SANDCELL_BIN; each test gets a data directory of its own.
"""

import contextlib
import json
import os
import subprocess

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def sandcell_bin():
    return os.environ["SANDCELL_BIN"]


@contextlib.asynccontextmanager
async def connect(data_dir, *extra):
    """A session with a fresh `sandcell mcp` process over `data_dir`."""
    params = StdioServerParameters(
        command=sandcell_bin(),
        args=["--data-dir", str(data_dir), "mcp", *extra],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    async with stdio_client(params) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            yield session


def text(result):
    """The text of a tool result."""
    return "".join(block.text for block in result.content if block.type == "text")


async def ok(client, tool, /, **arguments):
    """Calls a tool that must succeed; answers its text."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, f"{tool} failed: {text(result)}"
    return text(result)


async def fails(client, tool, /, **arguments):
    """Calls a tool that must fail as a tool error; answers its text."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, f"{tool} succeeded: {text(result)}"
    return text(result)


def purge_all(data_dir):
    """Purges every session under `data_dir` with the CLI, so no sandbox (overlay
    mount, cgroup, process) outlives the test; answers what is still mounted there."""
    def cli(*args):
        return subprocess.run(
            [sandcell_bin(), "--data-dir", str(data_dir), *args],
            capture_output=True,
            text=True,
            check=False,
        )

    listed = cli("list")
    for line in listed.stdout.splitlines():
        record = json.loads(line)
        cli("release", record["session"], "--tenant", record["tenant"], "--purge")
    with open("/proc/mounts") as mounts:
        return [line for line in mounts if str(data_dir) in line]


@pytest.fixture
def data_dir(tmp_path, tmp_path_factory):
    """A data directory of the test's own; every session in it is purged afterwards,
    and nothing of it may stay mounted."""
    path = tmp_path / "data"
    # Run as root, the local backend's commands (at Landlock, the CLI's default) are
    # its unprivileged sandbox owner, who must pass through every directory above
    # the backend's root: pytest makes its temporary directories 0700.
    if os.geteuid() == 0:
        top = tmp_path_factory.getbasetemp()
        for parent in [tmp_path, *tmp_path.parents]:
            parent.chmod(parent.stat().st_mode & 0o777 | 0o001)
            if parent == top:
                break
    yield path
    left = purge_all(path)
    assert not left, f"mounts left behind: {left}"
