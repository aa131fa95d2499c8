"""The control plane: create, list, info, timeouts, pause and resume, kill, errors."""

import time

import pytest
from e2b import Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import AuthenticationException, NotFoundException, SandboxException


def test_create_carries_metadata_and_envs(sandbox, run_id):
    info = sandbox.get_info()
    assert info.sandbox_id == sandbox.sandbox_id
    assert info.metadata == {"run": run_id}
    assert info.template_id == "base"
    assert info.state == SandboxState.RUNNING
    assert sandbox.commands.run("echo $FROM_CREATE").stdout == "yes\n"
    assert sandbox.is_running()


def test_list_filters_by_metadata_and_state(sandbox, run_id):
    other = Sandbox.create(timeout=60, metadata={"run": run_id + "-other"})
    try:
        found = Sandbox.list(query=SandboxQuery(metadata={"run": run_id})).next_items()
        assert [s.sandbox_id for s in found] == [sandbox.sandbox_id]
        assert found[0].metadata == {"run": run_id}
        paused = Sandbox.list(
            query=SandboxQuery(metadata={"run": run_id}, state=[SandboxState.PAUSED])
        ).next_items()
        assert paused == []
    finally:
        other.kill()


def test_list_pages(run_id):
    made = [Sandbox.create(timeout=60, metadata={"page": run_id}) for _ in range(3)]
    try:
        pages = Sandbox.list(query=SandboxQuery(metadata={"page": run_id}), limit=2)
        first = pages.next_items()
        assert len(first) == 2 and pages.has_next
        second = pages.next_items()
        assert len(second) == 1 and not pages.has_next
        ids = {s.sandbox_id for s in first + second}
        assert ids == {s.sandbox_id for s in made}
    finally:
        for s in made:
            s.kill()


def test_metadata_with_awkward_characters_filters_exactly(run_id):
    awkward = {"user name": "a&b=c%d", "run": run_id}
    sbx = Sandbox.create(timeout=60, metadata=awkward)
    try:
        found = Sandbox.list(query=SandboxQuery(metadata=awkward)).next_items()
        assert [s.sandbox_id for s in found] == [sbx.sandbox_id]
        assert found[0].metadata == awkward
    finally:
        sbx.kill()


def test_set_timeout_moves_the_end(sandbox):
    sandbox.set_timeout(600)
    end = sandbox.get_info().end_at.timestamp()
    assert 590 < end - time.time() < 610


def test_a_sandbox_whose_time_is_up_is_killed(run_id):
    sbx = Sandbox.create(timeout=1, metadata={"run": run_id})
    deadline = time.time() + 15
    while time.time() < deadline and sbx.is_running():
        time.sleep(0.5)
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id)


def test_pause_then_connect_resumes_with_the_workspace(sandbox):
    sandbox.files.write("kept.txt", "still here")
    assert sandbox.pause() is True
    assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED
    assert sandbox.pause() is False
    resumed = Sandbox.connect(sandbox.sandbox_id, timeout=120)
    assert resumed.get_info().state == SandboxState.RUNNING
    assert resumed.files.read("kept.txt") == "still here"
    assert resumed.commands.run("cat kept.txt").stdout == "still here"


def test_kill_ends_the_sandbox(run_id):
    sbx = Sandbox.create(timeout=60, metadata={"run": run_id})
    assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id) is False
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id)


def test_metrics_report_memory_and_disk(sandbox):
    sandbox.files.write("blob.bin", b"x" * 100_000)
    metrics = sandbox.get_metrics()
    assert len(metrics) >= 1
    assert metrics[-1].disk_used >= 100_000
    assert metrics[-1].cpu_count >= 1


def test_unknown_sandbox_is_not_found():
    with pytest.raises(NotFoundException):
        Sandbox.connect("no-such-sandbox")
    with pytest.raises(NotFoundException):
        Sandbox.get_info("no-such-sandbox")


def test_wrong_key_is_an_authentication_error(api_key):
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "0" * 40)
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="e2b_" + "0" * 40).next_items()


def test_another_tenants_sandbox_is_not_found(sandbox):
    with pytest.raises((NotFoundException, AuthenticationException)):
        Sandbox.connect(sandbox.sandbox_id, api_key="e2b_" + "1" * 40)


def test_a_filter_on_the_servers_labels_cannot_list_another_tenants(sandbox, run_id):
    """ADVERSARIAL 39: a `metadata` filter naming the server's tenant label once
    replaced the caller's scope; it is refused, and the caller's own filters stay
    within its sandboxes, and a create cannot set the server's labels."""
    other = "e2b_" + "1" * 40
    steal = SandboxQuery(metadata={"sandcell.server.tenant": "first"})
    with pytest.raises(SandboxException) as refused:
        Sandbox.list(query=steal, api_key=other).next_items()
    assert "reserved" in str(refused.value)
    mine = SandboxQuery(metadata={"run": run_id})
    assert Sandbox.list(query=mine, api_key=other).next_items() == []
    listed = Sandbox.list(query=mine).next_items()
    assert [s.sandbox_id for s in listed] == [sandbox.sandbox_id]
    with pytest.raises(SandboxException):
        Sandbox.create(timeout=30, metadata={"sandcell.server.tenant": "second"})
