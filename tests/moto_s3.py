"""A real S3 server for the object-storage tests (issue #26): moto's, started
as a process on a free port and reached only through the standard AWS
environment (``AWS_ENDPOINT_URL`` and the credentials variables), as a user's
job reaches its store. Not an in-process mock: requests go over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    """moto's S3 server in its own process. Its objects live in that
    process's memory: a restart starts from an empty store."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("moto server did not answer within 30 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def env(self) -> dict[str, str]:
        """The standard AWS environment pointing at this server, nothing
        fastprof-specific. One attempt per request: an unreachable endpoint
        fails at once instead of after botocore's own retries (seconds
        each), so fastprof's backoff is what a test sees."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_MAX_ATTEMPTS": "1",
        }


def point_at(monkeypatch: pytest.MonkeyPatch, server: MotoServer) -> None:
    """This process's AWS environment pointed at ``server``."""
    import s3fs

    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    s3fs.S3FileSystem.clear_instance_cache()  # a cached filesystem would keep another test's endpoint


def new_bucket(name: str | None = None) -> str:
    """A fresh bucket; returns ``s3://<bucket>/runs``."""
    import s3fs

    name = name or f"b-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(name)
    return f"s3://{name}/runs"


@pytest.fixture(scope="module")
def moto_server() -> Iterator[MotoServer]:
    server = MotoServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_url(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket's ``s3://<bucket>/runs``, this process pointed at it."""
    point_at(monkeypatch, moto_server)
    return new_bucket()


def wait_until(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition", pause: float = 0.05) -> Any:
    """``cond()``'s first true value, polled every ``pause`` s for
    ``timeout`` s at most (an AssertionError naming ``what`` past it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(pause)
    raise AssertionError(f"timed out waiting for {what}")


def child_env(server: MotoServer, **extra: str) -> dict[str, str]:
    """A subprocess's environment: this one's, pointed at ``server``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**env, **server.env(), **extra}
