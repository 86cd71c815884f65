#!/usr/bin/env python3
"""A bounded schemathesis run against `deepinfer serve`'s own /openapi.json.

usage: run_schemathesis.py DEEPINFER_BINARY [MAX_EXAMPLES]
Starts the server on a free loopback port with a short context (--max-model-len 96, so a request
without max_tokens stays short), fuzzes every operation MAX_EXAMPLES times (default 8) with the
checks that a server must pass (no 5xx, documented status codes, content types and response
schemas), then stops it with SIGTERM and requires exit 0.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import ServerProcess  # noqa: E402


def main():
    binary = sys.argv[1]
    examples = sys.argv[2] if len(sys.argv) > 2 else "8"
    server = ServerProcess(binary, "--max-model-len", "96")
    try:
        rc = subprocess.call([sys.executable, "-m", "schemathesis.cli", "run", server.url + "/openapi.json",
                              "--phases", "fuzzing", "--max-examples", examples, "--seed", "1",
                              "--request-timeout", "60",
                              "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                              "response_schema_conformance"],
                             cwd=tempfile.mkdtemp(prefix="schemathesis-"))  # its .schemathesis/ stays out of the tree
    finally:
        code = server.stop()
    if code != 0:
        print("server exit code", code, "".join(server.log[-20:]))
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
