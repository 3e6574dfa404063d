"""A warm ``grow`` for the tests (docs/testing.md): the make recipes run ``$(GROW)``, set to this file, a client
that has a server fork the command, and `tests.ranks.Rank` asks the server for its ranks (`fork`). The server
imported torch, Hydra and grow once (one thread that never ran an operator), then the report's packages
(its ``.bare`` copy, forked before those, serves the tests of what the core imports); the forked command gets the
client's stdin, stdout, stderr, working directory and environment, and the client exits with its status and
passes on SIGTERM, SIGINT and SIGHUP. A grow command then costs a fork, not an interpreter's 5-6 s of imports.

    python tests/growd.py --serve <socket>      the server (`socket_path` starts one per test process)
    GROWD_SOCKET=<socket> python tests/growd.py <grow arguments>

``GROWD=0`` turns the server off: every command, rank and snippet then starts as a real interpreter (`enabled`),
slower by an interpreter's start-up each, for a platform without fork or Unix sockets, or to rule the server out.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

HEADER = 8  # bytes of the request's length, sent with the three descriptors
# The cyclic collector's thresholds in the tests' processes (conftest.py's, the server's and its forks): at Python's
# 700 allocations it ran ~30,000 times in make test, mostly full passes over torch's and Hydra's long-lived objects.
GC_THRESHOLD = (20_000, 10, 10)


def fork(path: str, request: dict, fds: list[int]) -> tuple[socket.socket, int]:
    """Ask the server at ``path`` to fork ``request`` (argv, cwd, env; dump: `tests.ranks.worker`'s) with ``fds``
    as its descriptors 0, 1 and 2: (the connection, which ends with a line of the exit status, -n for signal n;
    the forked pid)."""
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(path)
    body = json.dumps(request).encode()
    socket.send_fds(conn, [len(body).to_bytes(HEADER, "big") + body], fds)
    line = b""
    while not line.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            raise RuntimeError(f"tests/growd.py at {path} did not fork {request['argv']}")
        line += chunk
    return conn, int(line)


def client(argv: list[str]) -> int:
    """``grow <argv>`` forked by the server at $GROWD_SOCKET; its exit status (128 + n for signal n). With
    $GROWD_DUMP the command records its parameters there (`tests.ranks.worker`: torchrun's ranks)."""
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "dump": os.environ.get("GROWD_DUMP")}
    conn, pid = fork(os.environ["GROWD_SOCKET"], request, [0, 1, 2])
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda n, _frame: os.kill(pid, n))
    status = conn.makefile("r").readline()
    if not status:
        return 1
    code = int(status)
    return code if code >= 0 else 128 - code


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, HEADER, 3)
    size, body = int.from_bytes(head, "big"), b""
    while len(body) < size:
        body += conn.recv(size - len(body))
    return json.loads(body), fds


def _run(request: dict, fds: list[int]) -> None:
    """In the forked child: the client's descriptors as 0, 1 and 2, then `tests.ranks.as_process` of ``grow
    <argv>``, or of the Python source ``code`` as ``python -c`` would run it."""
    from tests.ranks import as_process, worker

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own descriptor, for its lifetime
    code = request.get("code")
    sys.argv = ["-c"] if code else ["grow", *request["argv"]]
    main = ((lambda: exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})) if code
            else (lambda: worker(request.get("dump"), request["argv"])))
    os._exit(as_process(main, request["cwd"], request["env"]))


def _serve_one(conn: socket.socket) -> None:
    """In a forked copy of the server: fork the command, tell the client its pid, wait, tell its status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    request, fds = _receive(conn)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run(request, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    os._exit(0)


def serve(path: str) -> None:
    """Import what a grow command imports (`tests.ranks.PRELOAD`), fork the bare server (``<path>.bare``: no more
    than that, for the tests of what the core imports), import the report's packages (`EXTRAS`, which
    most forked commands would each import again), then serve ``path``."""
    import gc
    import importlib

    from tests.ranks import EXTRAS, PRELOAD

    gc.set_threshold(*GC_THRESHOLD)
    for name in PRELOAD:
        importlib.import_module(name)
    bare = _bind(path + ".bare")  # before ``path``: a client that finds ``path`` finds both
    if os.fork() == 0:
        _listen(bare)
    bare.close()
    for name in EXTRAS:
        importlib.import_module(name)
    _listen(_bind(path))


def _bind(path: str) -> socket.socket:
    """A listening socket at ``path``, which appears only once it accepts connections."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(path + ".tmp")
    server.listen(16)
    os.rename(path + ".tmp", path)
    return server


def _listen(server: socket.socket) -> None:
    """Fork one copy per connection to ``server`` until the parent is gone; exits."""
    parent = os.getppid()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the copies are reaped as they end
    server.settimeout(1.0)
    while os.getppid() == parent:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        if os.fork() == 0:
            server.close()
            _serve_one(conn)
        conn.close()
    os._exit(0)


def enabled() -> bool:
    """Whether the tests fork their processes from the warm server (``GROWD`` unset or not ``0``)."""
    return os.environ.get("GROWD", "1") != "0"


_SERVER: dict[int, str] = {}  # this process's server socket, by pid (a fork starts its own)


def socket_path() -> str:
    """The socket of this test process's server, started on first use (the server ends with the process)."""
    import subprocess
    import tempfile
    import time
    from pathlib import Path

    if os.getpid() in _SERVER:
        return _SERVER[os.getpid()]
    root = Path(__file__).resolve().parent.parent
    path = os.path.join(tempfile.mkdtemp(prefix="growd-"), "socket")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    server = subprocess.Popen([sys.executable, __file__, "--serve", path], cwd=root, env=env)
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"tests/growd.py --serve {path} did not start (exit {server.poll()})")
        time.sleep(0.05)
    _SERVER[os.getpid()] = path
    return path


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        serve(sys.argv[2])
    else:
        sys.exit(client(sys.argv[1:]))
