"""Times E2B's Python SDK against sandcell-server; run by benches/e2b_sdk.rs.

Prints one JSON object: the p50 and p90 of `commands.run("true")` in milliseconds, and
of create-to-first-command (`Sandbox.create()` then `commands.run("true")`).
"""

import json
import sys
import time

from e2b import Sandbox

rounds = int(sys.argv[1])
creates = int(sys.argv[2])


def quantiles(times):
    times = sorted(times)
    return times[len(times) // 2] * 1000, times[len(times) * 9 // 10] * 1000


sandbox = Sandbox.create(timeout=600)
for _ in range(10):
    sandbox.commands.run("true")
runs = []
for _ in range(rounds):
    started = time.perf_counter()
    sandbox.commands.run("true")
    runs.append(time.perf_counter() - started)
sandbox.kill()

ready = []
for _ in range(creates):
    started = time.perf_counter()
    fresh = Sandbox.create(timeout=60)
    fresh.commands.run("true")
    ready.append(time.perf_counter() - started)
    fresh.kill()

run_p50, run_p90 = quantiles(runs)
ready_p50, ready_p90 = quantiles(ready)
print(json.dumps({"run_p50": run_p50, "run_p90": run_p90, "ready_p50": ready_p50, "ready_p90": ready_p90}))
