# sandcell's code-context helper: runs inside a sandbox, keeps one Jupyter kernel per
# context through jupyter_client, and speaks JSON lines with the library over its stdin
# and stdout (src/code/mod.rs is the other end; the protocol is described there).
#
# Requests carry an "id"; every line answering one carries it back, so runs in several
# contexts interleave on the one pipe. Nothing but protocol lines is written to stdout.
import asyncio
import json
import os
import shutil
import sys
import tempfile
import traceback
import uuid

OUT = os.fdopen(os.dup(1), "w", buffering=1)
# Whatever a library prints lands on stderr, never in the protocol.
os.dup2(2, 1)

# Kernels talk over Unix sockets in a directory of this helper's own, not over TCP
# ports anything on the network namespace could reach; their state files go there too
# when the home directory is not writable.
RUNTIME = tempfile.mkdtemp(prefix="sandcell-kernels-")
# A socket's path has at most 107 bytes, and a sandbox's directories may lie far down
# the host's tree: the helper works in RUNTIME and names sockets relative to it, and so
# do kernels, started there and moved to their context's directory once up (in
# CHDIR's languages; any other falls back to loopback TCP, whose messages are still
# signed with a key only this helper and its kernels know).
WORKSPACE = os.getcwd()
os.chdir(RUNTIME)
os.environ["JUPYTER_RUNTIME_DIR"] = RUNTIME
if not os.access(os.path.expanduser("~"), os.W_OK):
    os.environ.setdefault("IPYTHONDIR", os.path.join(RUNTIME, "ipython"))
    os.environ.setdefault("MPLCONFIGDIR", os.path.join(RUNTIME, "matplotlib"))

KERNELS = {
    "python": ("python3", "pip install ipykernel"),
    "bash": ("bash", "pip install bash_kernel && python -m bash_kernel.install --sys-prefix"),
    "r": ("ir", "apt-get install r-cran-irkernel"),
    "javascript": ("javascript", "npm install -g ijavascript && ijsinstall"),
    "java": ("java", "install a Jupyter kernel for Java (IJava)"),
}

try:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    from jupyter_client.manager import AsyncKernelManager
except ImportError:
    print(json.dumps({"type": "fatal", "message": "jupyter_client is not installed in the sandbox: pip install jupyter-client ipykernel"}), file=OUT)
    sys.exit(3)


def send(line):
    OUT.write(json.dumps(line) + "\n")


class Context:
    def __init__(self, cid, language, cwd, kernel):
        self.id, self.language, self.cwd = cid, language, cwd
        self.manager, self.client, self.log = kernel
        self.lock = asyncio.Lock()
        self.running = None

    def describe(self):
        # Its directory as the workspace's path: where the workspace lies on the host
        # is no business of whoever asks.
        inside = os.path.relpath(self.cwd, WORKSPACE)
        cwd = "" if inside == "." else inside if not inside.startswith("..") else self.cwd
        return {"id": self.id, "language": self.language, "cwd": cwd}


CONTEXTS = {}
# The context a run naming only its language runs in, made on first use.
DEFAULTS = {}
RUNS = {}


class Refused(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind, self.message = kind, message


async def start_kernel(cid, language, cwd):
    if language not in KERNELS:
        raise Refused("unsupported", f"no language {language!r}: one of {', '.join(sorted(KERNELS))}")
    name, install = KERNELS[language]
    try:
        KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        raise Refused("unsupported", f"this sandbox has no Jupyter kernel for {language}: {install}")
    if not os.path.isdir(cwd):
        # Named as the workspace path asked for: where the workspace lies is not told.
        shown = os.path.relpath(cwd, WORKSPACE)
        raise Refused("not_found", f"no directory {shown!r} in the workspace")
    if language in CHDIR:
        manager = AsyncKernelManager(kernel_name=name, transport="ipc", ip=cid[:8])
        start_in = RUNTIME
    else:
        manager = AsyncKernelManager(kernel_name=name)
        start_in = cwd
    # What the kernel says goes to a log of its own (kept open: a restart starts the
    # kernel again with it), whose end a failed start reports.
    log_path = os.path.join(RUNTIME, cid[:8] + ".log")
    log = open(log_path, "w")
    await manager.start_kernel(cwd=start_in, stdout=log, stderr=log)
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
    except Exception:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)
        log.close()
        with open(log_path, errors="replace") as said:
            said = said.read()[-2000:].strip()
        raise Refused("backend", f"the {language} kernel did not start: {said or 'it said nothing'}")
    await enter(client, language, cwd)
    return manager, client, log


# How each language's kernel moves to its context's directory.
CHDIR = {
    "python": lambda path: f"import os as __sc_os; __sc_os.chdir({path!r}); del __sc_os",
    "bash": lambda path: "cd '" + path.replace("'", "'\\''") + "'",
    "r": lambda path: f"setwd({json.dumps(path)})",
    "javascript": lambda path: f"process.chdir({json.dumps(path)})",
    "typescript": lambda path: f"process.chdir({json.dumps(path)})",
}


async def enter(client, language, cwd):
    """Moves a kernel started in RUNTIME to its context's directory."""
    if language in CHDIR:
        await quietly(client, CHDIR[language](cwd))


def env_code(language, env):
    """Code that sets `env` for one run, and code that puts back what was there."""
    if not env:
        return None, None
    if language == "python":
        pairs = json.dumps(env)
        return (
            f"import os as __sc_os, json as __sc_json\n__sc_saved = {{k: __sc_os.environ.get(k) for k in __sc_json.loads({pairs!r})}}\n__sc_os.environ.update(__sc_json.loads({pairs!r}))",
            "for __sc_k, __sc_v in __sc_saved.items():\n    __sc_os.environ.pop(__sc_k, None) if __sc_v is None else __sc_os.environ.__setitem__(__sc_k, __sc_v)\ndel __sc_saved",
        )
    if language == "bash":
        def quote(value):
            return "'" + value.replace("'", "'\\''") + "'"
        save = "; ".join(
            f"__sc_{i}_set=${{{k}+x}}; __sc_{i}=${{{k}-}}; export {k}={quote(v)}" for i, (k, v) in enumerate(env.items())
        )
        restore = "; ".join(
            f"if [ -n \"$__sc_{i}_set\" ]; then export {k}=\"$__sc_{i}\"; else unset {k}; fi; unset __sc_{i} __sc_{i}_set"
            for i, k in enumerate(env)
        )
        return save, restore
    raise Refused("unsupported", f"per-run environment variables are not supported for {language}")


async def quietly(client, code):
    """Runs `code` in a kernel, its output discarded."""
    msg_id = client.execute(code, silent=True, store_history=False)
    while True:
        reply = await client.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return


async def execute(rid, context, code, env, timeout):
    setup, restore = env_code(context.language, env)
    async with context.lock:
        context.running = rid
        try:
            if setup:
                await quietly(context.client, setup)
            msg_id = context.client.execute(code, store_history=True, allow_stdin=False)
            try:
                await asyncio.wait_for(relay(rid, context, msg_id), timeout)
            except asyncio.TimeoutError:
                await context.manager.interrupt_kernel()
                await drain(context, msg_id)
                send({"id": rid, "type": "timeout", "message": f"the run took longer than {timeout} s and was interrupted"})
                return
            except asyncio.CancelledError:
                await context.manager.interrupt_kernel()
                await drain(context, msg_id)
                raise
            finally:
                if restore:
                    await quietly(context.client, restore)
            send({"id": rid, "type": "end"})
        finally:
            context.running = None


async def relay(rid, context, msg_id):
    while True:
        msg = await context.client.get_iopub_msg()
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "execute_input":
            send({"id": rid, "type": "execution_count", "count": content.get("execution_count")})
        elif kind == "stream":
            send({"id": rid, "type": content["name"], "text": content["text"]})
        elif kind in ("execute_result", "display_data"):
            send({"id": rid, "type": "result", "data": content.get("data", {}), "main": kind == "execute_result"})
        elif kind == "error":
            send({"id": rid, "type": "error", "name": content.get("ename", ""), "value": content.get("evalue", ""), "traceback": content.get("traceback", [])})
        elif kind == "status" and content.get("execution_state") == "idle":
            return


async def drain(context, msg_id):
    """Waits (a little) for an interrupted run's kernel to go idle."""
    try:
        await asyncio.wait_for(relay_quiet(context, msg_id), 10)
    except asyncio.TimeoutError:
        pass


async def relay_quiet(context, msg_id):
    while True:
        msg = await context.client.get_iopub_msg()
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
            return


async def handle(request):
    rid, op = request.get("id"), request.get("op")
    try:
        if op == "create":
            context = await create(request.get("language") or "python", request.get("cwd"))
            send({"id": rid, "type": "context", "context": context.describe()})
        elif op == "list":
            send({"id": rid, "type": "contexts", "contexts": [c.describe() for c in CONTEXTS.values()]})
        elif op == "restart":
            context = find(request)
            async with context.lock:
                await context.manager.restart_kernel(now=True)
                await context.client.wait_for_ready(timeout=60)
                await enter(context.client, context.language, context.cwd)
            send({"id": rid, "type": "ok"})
        elif op == "remove":
            context = CONTEXTS.pop(request.get("context"), None)
            if context is None:
                raise Refused("not_found", f"no context {request.get('context')!r}")
            await stop(context)
            send({"id": rid, "type": "ok"})
        elif op == "execute":
            context = await find_or_default(request)
            env = request.get("env") or {}
            if not all(isinstance(k, str) and k.isidentifier() and isinstance(v, str) for k, v in env.items()):
                raise Refused("invalid_input", "environment variable names must be identifiers and their values strings")
            await execute(rid, context, request.get("code", ""), env, request.get("timeout"))
        elif op == "interrupt":
            task = RUNS.get(request.get("run"))
            if task is not None:
                task.cancel()
        else:
            raise Refused("unsupported", f"unknown operation {op!r}")
    except Refused as refused:
        send({"id": rid, "type": "failed", "kind": refused.kind, "message": refused.message})
    except asyncio.CancelledError:
        send({"id": rid, "type": "failed", "kind": "cancelled", "message": "interrupted"})
    except Exception as error:
        where = traceback.extract_tb(error.__traceback__)[-1]
        send({"id": rid, "type": "failed", "kind": "backend", "message": f"{type(error).__name__}: {error} (at {os.path.basename(where.filename)}:{where.lineno}, {where.name})"})
    finally:
        RUNS.pop(rid, None)


async def create(language, cwd):
    cwd = os.path.normpath(os.path.join(WORKSPACE, cwd or ""))
    cid = uuid.uuid4().hex
    context = Context(cid, language, cwd, await start_kernel(cid, language, cwd))
    CONTEXTS[cid] = context
    return context


async def default_context(language):
    made = DEFAULTS.get(language)
    if made is None:
        made = DEFAULTS[language] = asyncio.ensure_future(create(language, None))
    try:
        context = await asyncio.shield(made)
    except BaseException:
        DEFAULTS.pop(language, None)
        raise
    if context.id not in CONTEXTS:
        # Removed since: the next run makes another.
        DEFAULTS.pop(language, None)
        return await default_context(language)
    return context


async def find_or_default(request):
    if request.get("context") is None:
        return await default_context(request.get("language") or "python")
    return find(request)


async def stop(context):
    context.client.stop_channels()
    await context.manager.shutdown_kernel(now=True)
    context.log.close()


def find(request):
    context = CONTEXTS.get(request.get("context"))
    if context is None:
        raise Refused("not_found", f"no context {request.get('context')!r}")
    return context


async def main():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    send({"type": "ready"})
    while True:
        line = await reader.readline()
        if not line:
            break
        try:
            request = json.loads(line)
        except ValueError:
            continue
        task = asyncio.ensure_future(handle(request))
        if request.get("op") == "execute":
            RUNS[request.get("id")] = task
    for context in list(CONTEXTS.values()):
        await stop(context)
    shutil.rmtree(RUNTIME, ignore_errors=True)


asyncio.run(main())
