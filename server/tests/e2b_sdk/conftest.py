"""Fixtures for driving sandcell-server through E2B's own Python SDK.

The Rust test `e2b_sdk.rs` starts the server and runs pytest here with E2B_API_KEY,
E2B_API_URL and E2B_SANDBOX_URL pointing at it.
"""

import os
import uuid

import pytest
from e2b import Sandbox


@pytest.fixture
def run_id():
    """A value unique to one test, to find its sandboxes by metadata."""
    return uuid.uuid4().hex


@pytest.fixture
def sandbox(run_id):
    sbx = Sandbox.create(timeout=120, metadata={"run": run_id}, envs={"FROM_CREATE": "yes"})
    yield sbx
    try:
        sbx.kill()
    except Exception:
        pass


@pytest.fixture
def api_key():
    return os.environ["E2B_API_KEY"]
