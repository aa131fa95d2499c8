"""E2B's Code Interpreter SDK (PyPI `e2b-code-interpreter`) as its users drive it.

The Rust test `cli/tests/e2b_sdk.rs` starts sandcell-server with `--code-python`
and runs pytest here with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL pointing at it.
"""

import pytest
from e2b_code_interpreter import Sandbox


@pytest.fixture
def sandbox():
    sbx = Sandbox.create(timeout=120, envs={"FROM_CREATE": "made"})
    yield sbx
    try:
        sbx.kill()
    except Exception:
        pass


def test_cells_keep_their_state_and_answer_values(sandbox):
    first = sandbox.run_code("x = 41")
    assert first.error is None
    assert first.results == []
    second = sandbox.run_code("x + 1")
    assert second.text == "42"
    assert second.execution_count == first.execution_count + 1


def test_output_streams_to_callbacks_and_errors_are_reported(sandbox):
    seen = []
    execution = sandbox.run_code(
        "import sys\nprint('out')\nprint('err', file=sys.stderr)",
        on_stdout=lambda m: seen.append(("stdout", m.line)),
        on_stderr=lambda m: seen.append(("stderr", m.line)),
    )
    assert execution.logs.stdout == ["out\n"]
    assert execution.logs.stderr == ["err\n"]
    assert ("stdout", "out\n") in seen and ("stderr", "err\n") in seen
    failed = sandbox.run_code("1 / 0")
    assert failed.error.name == "ZeroDivisionError"
    assert "division by zero" in failed.error.value
    assert "ZeroDivisionError" in failed.error.traceback
    # The kernel lives on after the error.
    assert sandbox.run_code("2 * 21").text == "42"


def test_rich_results_arrive_in_their_formats(sandbox):
    shown = sandbox.run_code(
        "from IPython.display import HTML, Markdown, display\n"
        "display(Markdown('**m**'))\n"
        "HTML('<b>h</b>')"
    )
    markdown = [r for r in shown.results if r.markdown]
    assert markdown and markdown[0].markdown == "**m**" and not markdown[0].is_main_result
    main = [r for r in shown.results if r.is_main_result]
    assert main and main[0].html == "<b>h</b>"


def test_environment_variables_reach_the_code(sandbox):
    run = sandbox.run_code("import os; os.environ.get('PER_RUN')", envs={"PER_RUN": "yes"})
    assert run.text == "'yes'"
    assert sandbox.run_code("import os; os.environ.get('PER_RUN')").text is None
    assert sandbox.run_code("import os; os.environ.get('FROM_CREATE')").text == "'made'"


def test_other_languages_run_in_their_own_kernels(sandbox):
    bash = sandbox.run_code("echo $((6 * 7))", language="bash")
    assert "".join(bash.logs.stdout).strip() == "42"
    # A language whose kernel the sandbox lacks is refused, saying what to install.
    with pytest.raises(Exception) as refused:
        sandbox.run_code("1", language="java")
    assert "kernel" in str(refused.value)


def test_a_client_without_the_sandbox_s_token_runs_nothing(sandbox):
    """ADVERSARIAL 41: without the sandbox's access token, nothing runs."""
    import httpx

    answer = httpx.post(
        sandbox.connection_config.get_sandbox_url(sandbox.sandbox_id, sandbox.sandbox_domain, 49999)
        + "/execute",
        json={"code": "open('pwned', 'w').close()"},
        headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49999"},
    )
    assert answer.status_code == 401
    assert not sandbox.files.exists("pwned")


def test_a_tenant_streams_a_bounded_number_of_runs(sandbox):
    """ADVERSARIAL 35, FINDINGS12 H1: unread streams each hold some of the sandbox's output on the
    server, so a tenant streams at most 8 runs at once; runs whose clients left give
    their places back."""
    import asyncio
    import time

    import httpx

    url = sandbox.connection_config.get_sandbox_url(sandbox.sandbox_id, sandbox.sandbox_domain, 49999)
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": sandbox._envd_access_token}

    async def attempt():
        async with httpx.AsyncClient(timeout=60) as client:
            async def run_long():
                await client.post(url + "/execute", json={"code": "import time; time.sleep(60)"}, headers=headers)

            held = [asyncio.create_task(run_long()) for _ in range(8)]
            await asyncio.sleep(3)
            refused = await client.post(url + "/execute", json={"code": "1"}, headers=headers)
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            return refused

    refused = asyncio.run(attempt())
    assert refused.status_code == 429, refused.text
    assert "8 code runs" in refused.text
    deadline = time.time() + 60
    while True:
        try:
            assert sandbox.run_code("6 * 7").text == "42"
            break
        except Exception:
            assert time.time() < deadline
            time.sleep(0.5)
