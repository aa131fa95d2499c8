"""commands.*: run, callbacks, env, cwd, timeouts, background processes, stdin."""

import time

import pytest
from e2b.exceptions import (
    InvalidArgumentException,
    NotFoundException,
    SandboxException,
    TimeoutException,
)
from e2b.sandbox.commands.command_handle import CommandExitException


def test_run_reports_output_and_exit_code(sandbox):
    result = sandbox.commands.run("echo out; echo err >&2")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 0)
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo partial; exit 3")
    assert failed.value.exit_code == 3
    assert failed.value.stdout == "partial\n"


def test_callbacks_see_each_stream(sandbox):
    out, err = [], []
    sandbox.commands.run(
        "for i in 1 2 3; do echo o$i; echo e$i >&2; done",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert "".join(out) == "o1\no2\no3\n"
    assert "".join(err) == "e1\ne2\ne3\n"


def test_env_and_cwd(sandbox):
    sandbox.files.make_dir("sub/dir")
    result = sandbox.commands.run("echo $GREETING; pwd", envs={"GREETING": "hi"}, cwd="/home/user/sub/dir")
    lines = result.stdout.splitlines()
    assert lines[0] == "hi"
    assert lines[1].endswith("sub/dir")
    assert sandbox.commands.run("pwd", cwd="sub").stdout.strip().endswith("sub")


def test_commands_start_in_the_home(sandbox):
    sandbox.files.write("marker.txt", "m")
    assert sandbox.commands.run("cat marker.txt").stdout == "m"


def test_timeout_raises_and_ends_the_command(sandbox):
    started = time.time()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)
    assert time.time() - started < 10

    def sleeping():
        return any("sleep 30" in " ".join([p.cmd] + p.args) for p in sandbox.commands.list())

    deadline = time.time() + 5
    while sleeping() and time.time() < deadline:
        time.sleep(0.1)
    assert not sleeping()


def test_background_wait_and_kill(sandbox):
    handle = sandbox.commands.run("echo started; sleep 0.3; echo done", background=True)
    result = handle.wait()
    assert result.stdout == "started\ndone\n"
    sleeper = sandbox.commands.run("sleep 60", background=True)
    pids = [p.pid for p in sandbox.commands.list()]
    assert sleeper.pid in pids
    assert sleeper.kill() is True
    with pytest.raises(CommandExitException):
        sleeper.wait()
    deadline = time.time() + 5
    while sleeper.pid in [p.pid for p in sandbox.commands.list()] and time.time() < deadline:
        time.sleep(0.1)
    assert sleeper.pid not in [p.pid for p in sandbox.commands.list()]
    assert sandbox.commands.kill(sleeper.pid) is False


def test_send_stdin_reaches_the_command(sandbox):
    handle = sandbox.commands.run("read line; echo got:$line", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "hello\n")
    assert handle.wait().stdout == "got:hello\n"


def test_close_stdin_ends_input(sandbox):
    handle = sandbox.commands.run("cat", background=True, stdin=True)
    handle.send_stdin("abc")
    handle.close_stdin()
    assert handle.wait().stdout == "abc"


def test_without_stdin_a_command_reads_end_of_file(sandbox):
    assert sandbox.commands.run("cat; echo eof").stdout == "eof\n"


def test_connect_follows_a_running_command(sandbox):
    handle = sandbox.commands.run("sleep 0.5; echo later", background=True)
    again = sandbox.commands.connect(handle.pid)
    assert again.wait().stdout == "later\n"


def test_list_shows_command_and_args(sandbox):
    handle = sandbox.commands.run("sleep 30", background=True)
    try:
        listed = {p.pid: p for p in sandbox.commands.list()}
        assert handle.pid in listed
        assert listed[handle.pid].cmd == "/bin/bash"
        assert listed[handle.pid].args[-1] == "sleep 30"
    finally:
        handle.kill()


def test_unknown_pid(sandbox):
    assert sandbox.commands.kill(999999) is False
    with pytest.raises(SandboxException):
        sandbox.commands.connect(999999)


def test_a_bad_working_directory_is_a_typed_error(sandbox):
    with pytest.raises(InvalidArgumentException):
        sandbox.commands.run("true", cwd="/etc")
    with pytest.raises(NotFoundException):
        sandbox.commands.run("true", cwd="missing-dir")
