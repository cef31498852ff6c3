"""The benchmarks' small parts without a server: request bytes, the no-op WSGI app and its dispatcher, and the
errors that name what to fix (a missing tool, no root for the fake node, bad load parameters)."""

from __future__ import annotations

import io
import json
import os
from typing import Any

import pytest

from bench import auditor_bench, https_bench, loadgen
from bench.results import publish
from bench.server import NOOP_RESPONSE, noop_app, with_noop

TARGET = loadgen.Target("127.0.0.1", 8443, "gpu-fence-webhook.gpu-fence.svc", "ca.crt")


def test_request_bytes_carry_the_body_and_point_at_the_uid() -> None:
    body = b'{"request":{"uid":"' + loadgen.UID_PLACEHOLDER + b'"}}'
    request, at = loadgen.request_bytes(TARGET, "/mutate", body, keep_alive=True)
    head, _, sent = request.partition(b"\r\n\r\n")
    assert sent == body
    assert head.startswith(b"POST /mutate HTTP/1.1\r\n")
    assert b"Content-Length: %d" % len(body) in head and b"Connection: keep-alive" in head
    assert b"Host: gpu-fence-webhook.gpu-fence.svc:8443" in head
    assert request[at : at + 36] == loadgen.UID_PLACEHOLDER
    closing, none = loadgen.request_bytes(TARGET, "/noop", b"{}", keep_alive=False)
    assert b"Connection: close" in closing and none == -1


@pytest.mark.parametrize(("rate", "seconds", "connections"), [(0, 1, 1), (10, 0, 1), (10, 1, 0)])
def test_open_loop_refuses_parameters_that_measure_nothing(rate: float, seconds: float, connections: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        loadgen.open_loop(TARGET, "/noop", b"{}", rate=rate, seconds=seconds, connections=connections)


def call(app: Any, path: str, body: bytes) -> tuple[str, bytes]:
    started: list[str] = []
    environ = {
        "PATH_INFO": path,
        "REQUEST_METHOD": "POST",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
    }
    answer = b"".join(app(environ, lambda status, headers: started.append(status)))
    return started[0], answer


def test_noop_reads_the_body_and_answers_the_fixed_review() -> None:
    stream = io.BytesIO(b"x" * 100)
    environ = {"PATH_INFO": "/noop", "CONTENT_LENGTH": "100", "wsgi.input": stream}
    assert b"".join(noop_app(environ, lambda status, headers: None)) == NOOP_RESPONSE
    assert stream.tell() == 100  # the transport cost of the body stays in the floor


def test_the_dispatcher_sends_everything_but_noop_to_the_app() -> None:
    seen: list[str] = []

    def app(environ: dict, start_response: Any) -> list[bytes]:
        seen.append(environ["PATH_INFO"])
        start_response("200 OK", [])
        return [b"real"]

    dispatch = with_noop(app)
    assert call(dispatch, "/noop", b"{}") == ("200 OK", NOOP_RESPONSE)
    assert call(dispatch, "/mutate", b"{}") == ("200 OK", b"real")
    assert seen == ["/mutate"]


def test_a_missing_tool_is_named_with_its_package() -> None:
    with pytest.raises(https_bench.BenchError, match="no-such-load-tool is not installed"):
        https_bench.tool("no-such-load-tool")


def test_the_auditor_benchmark_says_it_needs_root(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert auditor_bench.main(["--scales", "1", "--fraction", "0.01"]) == 2
    assert "needs root" in capsys.readouterr().err


def test_publish_makes_the_folder_of_its_json_file(tmp_path, capsys):
    target = tmp_path / "results" / "run.json"  # bench/results/ is git-ignored, so a fresh clone lacks it
    publish({"figure": 1.5}, "| a |\n", str(target))
    assert json.loads(target.read_text()) == {"figure": 1.5}
    assert capsys.readouterr().out == "| a |\n"
