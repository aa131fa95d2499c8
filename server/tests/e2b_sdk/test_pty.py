"""pty.*: a terminal: create, type at it, resize it, kill it."""

import threading
import time

from e2b import PtySize
from e2b.sandbox.commands.command_handle import CommandExitException


def wait_for(predicate, seconds=5):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_pty_echoes_resizes_and_dies(sandbox):
    output = bytearray()
    ended = []
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=30)

    def read():
        try:
            terminal.wait(on_pty=lambda data: output.extend(data))
        except CommandExitException as killed:
            ended.append(killed.exit_code)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sandbox.pty.send_stdin(terminal.pid, b"stty size; echo marker-$((40+2))\n")
    assert wait_for(lambda: b"marker-42" in output), bytes(output)
    assert b"24 80" in output
    sandbox.pty.resize(terminal.pid, PtySize(rows=40, cols=120))
    sandbox.pty.send_stdin(terminal.pid, b"stty size\n")
    assert wait_for(lambda: b"40 120" in output), bytes(output)
    assert sandbox.pty.kill(terminal.pid) is True
    reader.join(timeout=5)
    assert not reader.is_alive()
    # Killed by a signal: envd reports no exit code of its own.
    assert ended == [-1]
    assert terminal.pid not in [p.pid for p in sandbox.commands.list()] or wait_for(
        lambda: terminal.pid not in [p.pid for p in sandbox.commands.list()]
    )
