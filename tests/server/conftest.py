"""Starts the real `deepinfer serve` binary on loopback (a free port) with the embedded tiny model.

The binary comes from --deepinfer (CTest passes it) or DEEPINFER_BIN.
"""
import contextlib
import os
import re
import signal
import subprocess
import time

import httpx
import pytest


def pytest_addoption(parser):
    parser.addoption("--deepinfer", default=os.environ.get("DEEPINFER_BIN", "build/ci/app/deepinfer"))


class ServerProcess:
    def __init__(self, binary, *args):
        self.proc = subprocess.Popen([binary, "serve", "--port", "0", "--threads", "1", *args],
                                     stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + 60
        self.port = None
        while time.time() < deadline and self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("server exited: " + "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
        self.url = f"http://127.0.0.1:{self.port}"
        # The rest of stderr is drained by a thread so the server never blocks on the pipe.
        import threading
        threading.Thread(target=self._drain, daemon=True).start()
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server not healthy in time")

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def binary(pytestconfig):
    return pytestconfig.getoption("--deepinfer")


@pytest.fixture(scope="session")
def server(binary):
    # Without speculation (the default would draft with the embedded model's MTP layer):
    # these tests check one token per step; test_spec_decode_metrics starts the default.
    s = ServerProcess(binary, "--num-speculative-tokens", "0")
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture(scope="session")
def model_name(server):
    return httpx.get(server.url + "/v1/models").json()["data"][0]["id"]


@pytest.fixture()
def client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@contextlib.contextmanager
def server_starter(binary):
    """start(*args) -> ServerProcess; every server started is stopped at the end."""
    started = []

    def start(*args):
        s = ServerProcess(binary, *args)
        started.append(s)
        return s

    try:
        yield start
    finally:
        for s in started:
            s.stop()


@pytest.fixture()
def start_server(binary):
    with server_starter(binary) as start:
        yield start


@pytest.fixture(scope="module")
def start_module_server(binary):
    """As start_server, for servers a whole test module shares."""
    with server_starter(binary) as start:
        yield start
