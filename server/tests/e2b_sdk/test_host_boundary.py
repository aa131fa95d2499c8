"""ADVERSARIAL 36 through the SDK: loader variables a client sets at create, on a
command, a background command and a terminal reach the sandboxed program only, never
a helper the server starts on the host.

`e2b_sdk.rs` builds the payload on the host (SANDCELL_ADV36_PAYLOAD): a shared object
whose constructor, wherever it is loaded, leaves a file named after the program in
SANDCELL_ADV36_MARKERS. Each variable names both the copy the sandbox wrote and the
host's own copy (where a sandbox that learnt its host path would point them).
"""

import os

from e2b import PtySize, Sandbox

PAYLOAD = os.environ.get("SANDCELL_ADV36_PAYLOAD", "")
MARKERS = os.environ.get("SANDCELL_ADV36_MARKERS", "")


def loader_envs(preload, home):
    return {
        "LD_PRELOAD": preload,
        "LD_AUDIT": preload,
        "LD_LIBRARY_PATH": f"{home}/adv36",
        "GCONV_PATH": f"{home}/adv36",
        "BASH_ENV": f"{home}/adv36/env.sh",
    }


def ran_on_host():
    return sorted(os.listdir(MARKERS))


def test_loader_variables_reach_no_host_helper(run_id):
    assert PAYLOAD and MARKERS, "e2b_sdk.rs passes the payload"
    with open(PAYLOAD, "rb") as built:
        payload = built.read()
    sbx = Sandbox.create(
        timeout=120,
        metadata={"run": run_id},
        envs=loader_envs(PAYLOAD, "/home/user"),
    )
    try:
        home = sbx.commands.run("pwd").stdout.strip()
        sbx.files.write("adv36/payload.so", payload)
        sbx.files.write("adv36/env.sh", f"touch {MARKERS}/bash_env\n")
        # The sandbox cannot write the host's directory itself.
        probe = sbx.commands.run(f"touch {MARKERS}/direct 2>&1; echo $?")
        assert probe.stdout.strip().splitlines()[-1] != "0", probe.stdout
        for preload in (f"{home}/adv36/payload.so", PAYLOAD):
            envs = loader_envs(preload, home)
            out = sbx.commands.run('echo "$LD_PRELOAD"', envs=envs)
            assert out.stdout.strip().splitlines()[-1] == preload, out
            handle = sbx.commands.run('echo "$BASH_ENV"', envs=envs, background=True)
            assert handle.wait().stdout.strip().splitlines()[-1] == envs["BASH_ENV"]
            terminal = sbx.pty.create(PtySize(rows=24, cols=80), envs=envs, timeout=30)
            sbx.pty.send_stdin(terminal.pid, b"exit 0\n")
            terminal.wait()
            assert ran_on_host() == [], f"ADVERSARIAL 36 with LD_PRELOAD={preload}"
    finally:
        sbx.kill()
    assert ran_on_host() == [], "ADVERSARIAL 36 at create"
