"""Every tool of `sandcell mcp`, called as an agent would."""

import base64
import os
import subprocess
import uuid

import anyio
import pytest

from conftest import connect, fails, ok, text

pytestmark = pytest.mark.anyio

TOOLS = {
    "run_command",
    "run_code",
    "read_file",
    "write_file",
    "edit_file",
    "list_directory",
    "glob",
    "grep",
    "snapshot",
    "restore_snapshot",
    "list_sessions",
    "release",
}


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_the_tools_are_listed_with_descriptions_and_schemas(data_dir):
    async with connect(data_dir) as session:
        listed = (await session.list_tools()).tools
        assert {t.name for t in listed} == TOOLS
        for tool in listed:
            assert len(tool.description) > 40, tool.name
            schema = tool.input_schema
            assert schema["type"] == "object", tool.name
            if tool.name != "list_sessions":
                assert "session" in schema["required"], tool.name
                assert schema["properties"]["session"].get("description"), tool.name
        run = next(t for t in listed if t.name == "run_command")
        assert set(run.input_schema["required"]) == {"session", "command"}
        assert {"cwd", "env", "timeout_secs"} <= set(run.input_schema["properties"])


async def test_run_command_reports_exit_code_output_env_and_cwd(data_dir):
    async with connect(data_dir) as session:
        out = await ok(
            session,
            "run_command",
            session="s",
            command="echo out; echo err >&2; exit 3",
        )
        assert "exit code: 3" in out
        assert "--- stdout ---\nout\n" in out
        assert "--- stderr ---\nerr\n" in out
        await ok(session, "write_file", session="s", path="sub/x.txt", content="here")
        out = await ok(
            session,
            "run_command",
            session="s",
            command='cat x.txt; echo " $GREETING"',
            cwd="sub",
            env={"GREETING": "hello"},
        )
        assert "exit code: 0" in out
        assert "here hello" in out


async def test_long_output_is_truncated_with_a_marker(data_dir):
    """ADVERSARIAL 20: output past the cap is cut, with a marker, not held whole."""
    async with connect(data_dir) as session:
        out = await ok(
            session,
            "run_command",
            session="s",
            command="i=0; while [ $i -lt 20000 ]; do echo line-$i; i=$((i+1)); done",
        )
        assert "line-0\n" in out
        assert "line-19999" in out
        assert "truncated" in out
        assert len(out) < 40_000


async def test_a_runaway_command_times_out_and_leaves_no_process(data_dir):
    """ADVERSARIAL 18: a grandchild holding stdout open ends with the timeout."""
    marker = f"sandcell-mcp-runaway-{uuid.uuid4().hex}"
    async with connect(data_dir) as session:
        out = await fails(
            session,
            "run_command",
            session="s",
            command=f"sleep 1000 & sleep 1000; echo {marker}",
            timeout_secs=1,
        )
        assert "timed out after 1 s" in out
        listed = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True)
        assert marker not in listed.stdout


async def test_a_long_command_reports_progress(data_dir):
    updates = []

    async def on_progress(progress, total, message):
        updates.append((progress, message))

    async with connect(data_dir) as session:
        result = await session.call_tool(
            "run_command",
            {"session": "s", "command": "sleep 2.5; echo done"},
            progress_callback=on_progress,
        )
        assert not result.is_error, text(result)
        assert "done" in text(result)
    assert updates, "no progress notification arrived"
    assert "running for" in updates[0][1]


async def test_files_text_base64_ranges_and_edits(data_dir):
    async with connect(data_dir) as session:
        await ok(session, "write_file", session="f", path="a/b.txt", content="hello world\n")
        assert await ok(session, "read_file", session="f", path="a/b.txt") == "hello world\n"
        part = await ok(session, "read_file", session="f", path="a/b.txt", offset=6, length=5)
        assert part.endswith("\nworld")
        assert "bytes 6..11 of 12" in part
        blob = bytes(range(256))
        await ok(
            session,
            "write_file",
            session="f",
            path="bin.dat",
            content=base64.b64encode(blob).decode(),
            encoding="base64",
        )
        back = await ok(session, "read_file", session="f", path="bin.dat", encoding="base64")
        assert base64.b64decode(back) == blob
        assert "not UTF-8" in await fails(session, "read_file", session="f", path="bin.dat")

        assert "edited" in await ok(
            session, "edit_file", session="f", path="a/b.txt", old_text="world", new_text="there"
        )
        assert await ok(session, "read_file", session="f", path="a/b.txt") == "hello there\n"
        assert "not found" in await fails(
            session, "edit_file", session="f", path="a/b.txt", old_text="absent", new_text="x"
        )
        await ok(session, "write_file", session="f", path="twice.txt", content="x x")
        assert "occurs 2 times" in await fails(
            session, "edit_file", session="f", path="twice.txt", old_text="x", new_text="y"
        )
        assert "created" in await ok(
            session, "edit_file", session="f", path="new.txt", old_text="", new_text="fresh"
        )


async def test_listing_glob_and_grep(data_dir):
    async with connect(data_dir) as session:
        await ok(session, "write_file", session="g", path="src/main.rs", content="fn main() {}\n")
        await ok(session, "write_file", session="g", path="src/lib.rs", content="pub fn x() {}\n")
        await ok(session, "write_file", session="g", path="README", content="fn in readme\n")
        listing = await ok(session, "list_directory", session="g")
        assert "src/\n" in listing
        assert "README\t13 bytes" in listing
        assert (await ok(session, "list_directory", session="g", path="src")).count("\n") == 2
        found = await ok(session, "glob", session="g", pattern="src/*.rs")
        assert found.split() == ["src/lib.rs", "src/main.rs"]
        assert "(no match)" in await ok(session, "glob", session="g", pattern="*.py")
        hits = await ok(session, "grep", session="g", pattern=r"^pub fn", path="src")
        assert hits == "src/lib.rs:1: pub fn x() {}\n"
        assert "invalid" in await fails(session, "grep", session="g", pattern="(")


async def test_snapshot_restore_sessions_and_release(data_dir):
    async with connect(data_dir) as session:
        await ok(session, "write_file", session="snap", path="state.txt", content="v1")
        taken = await ok(session, "snapshot", session="snap")
        snapshot_id = taken.split()[1]
        await ok(session, "write_file", session="snap", path="state.txt", content="v2")
        await ok(session, "restore_snapshot", session="snap", snapshot_id=snapshot_id)
        assert await ok(session, "read_file", session="snap", path="state.txt") == "v1"
        assert "not found" in (
            await fails(session, "restore_snapshot", session="snap", snapshot_id="nope")
        ).lower()

        sessions = await ok(session, "list_sessions")
        assert '"session":"snap"' in sessions
        await ok(session, "release", session="snap", mode="suspend")
        assert '"status":"suspended"' in await ok(session, "list_sessions")
        # The next call restores it from its snapshot.
        assert await ok(session, "read_file", session="snap", path="state.txt") == "v1"
        await ok(session, "release", session="snap", mode="destroy")
        missing = await fails(session, "snapshot", session="never-made")
        assert missing.startswith("not found:") and "does not exist" in missing, missing


async def test_sessions_outlive_the_server_process(data_dir):
    async with connect(data_dir) as session:
        await ok(session, "write_file", session="kept", path="notes.md", content="remember")
    # A new `sandcell mcp` process: the same session, its files found again.
    async with connect(data_dir) as session:
        assert await ok(session, "read_file", session="kept", path="notes.md") == "remember"
        out = await ok(session, "run_command", session="kept", command="cat notes.md")
        assert "remember" in out


async def test_hostile_input_is_refused_or_bounded(data_dir):
    async with connect(data_dir) as session:
        for bad in ["../outside.txt", "/etc/passwd", "a/../../x"]:
            message = await fails(session, "read_file", session="h", path=bad)
            assert "invalid input" in message, message
            await fails(session, "write_file", session="h", path=bad, content="x")
        huge = "x" * (11 << 20)
        assert "limit" in await fails(session, "write_file", session="h", path="big", content=huge)
        assert "invalid input" in await fails(session, "run_command", session="../x", command="true")
        # Arguments of the wrong shape are errors the model can read, not crashes.
        message = await fails(session, "read_file", session="h")
        assert "path" in message
        # An unknown tool is the protocol's error; the server goes on.
        with pytest.raises(Exception):
            await session.call_tool("teleport", {})
        assert "exit code: 0" in await ok(session, "run_command", session="h", command="true")
