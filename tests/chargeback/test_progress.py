"""The progress line of a long bill: ``chargeback: N/M queries`` on stderr, only on a terminal, only once the bill
has run for a while, never with ``--quiet``. The command runs as a child process with its stderr on a real pty
(or a pipe), against a Prometheus that answers slowly."""

from __future__ import annotations

import http.server
import io
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_fence.chargeback.progress import AFTER, Progress
from gpu_fence.chargeback.settings import default_timeout
from tests.fakes.chargeback_scenarios import run_chargeback, window_args
from tests.fakes.http_listener import Listener, answer_json
from tests.fakes.processes import run_captured
from tests.fakes.prometheus import SlowProxy

CONSOLE_SCRIPT = Path(sys.executable).with_name("gpu-fence-auditor")
DELAY = 0.4  # seconds per query: a recorded bill of one window asks about 14, so it runs past AFTER


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_line_waits_counts_and_clears():
    clock, stream = Clock(), io.StringIO()
    progress = Progress(stream, enabled=True, after=2.0, clock=clock)
    progress.expect(10)
    progress.advance()
    assert stream.getvalue() == ""  # a bill that answers at once prints nothing
    clock.now += 2.5
    progress.advance()
    assert stream.getvalue() == "\r\x1b[Kchargeback: 2/10 queries"
    progress.advance(9)  # more queries than expected: the total follows
    assert stream.getvalue().endswith("chargeback: 11/11 queries")
    progress.finish()
    assert stream.getvalue().endswith("\r\x1b[K")


def test_off_the_line_stays_silent():
    clock, stream = Clock(), io.StringIO()
    progress = Progress(stream, enabled=False, after=0.0, clock=clock)
    progress.advance()
    progress.finish()
    assert stream.getvalue() == ""
    assert Progress.for_terminal(io.StringIO(), quiet=False).enabled is False  # not a terminal


@pytest.fixture(scope="module")
def slow(prometheus):
    with SlowProxy(prometheus.url, DELAY) as proxy:
        yield proxy


def run_bill(slow, prices_file: Path, *extra: str, terminal: bool) -> tuple[int, str, str]:
    """The command's exit code, stdout and stderr, with stderr a pty (as in a shell) or a pipe."""
    arguments = [str(CONSOLE_SCRIPT), "chargeback", "--prometheus", slow.url, "--prices", str(prices_file)]
    arguments += [*window_args("timeslice", "auto")[:4], *extra]  # no --step: the rules' series, ~14 queries
    if not terminal:
        done = run_captured(arguments, timeout=120)
        return done.returncode, done.stdout, done.stderr
    leader, follower = pty.openpty()
    with subprocess.Popen(arguments, stdout=subprocess.PIPE, stderr=follower) as process:
        os.close(follower)
        chunks = []
        while True:
            ready, _, _ = select.select([leader], [], [], 120)
            if not ready:
                process.kill()
                raise AssertionError("the command wrote nothing to its terminal for 120 s")
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            chunks.append(chunk)
        stdout = process.stdout.read().decode() if process.stdout else ""
        code = process.wait(timeout=60)
    os.close(leader)
    return code, stdout, b"".join(chunks).decode()


@pytest.mark.parametrize(
    "series",
    [[], ["--series", "raw", "--step", "2m"]],  # the rules' series; the raw series in two chunks of instants
    ids=["recorded", "raw"],
)
def test_a_long_bill_shows_its_queries_on_a_terminal(slow, prices_file, series: list[str]):
    code, stdout, stderr = run_bill(slow, prices_file, *series, terminal=True)
    assert code == 0 and "GPU chargeback" in stdout
    shown = [part for part in stderr.split("\r\x1b[K") if part]
    assert shown, "no progress line on the terminal"
    done, total = shown[-1].removeprefix("chargeback: ").removesuffix(" queries").split("/")
    assert shown[-1].startswith("chargeback: ") and int(done) == int(total) > 0
    assert stderr.endswith("\r\x1b[K")  # cleared before the shell prompt comes back
    # The line appears only once the bill has run AFTER seconds: the first queries went by unannounced.
    assert int(shown[0].removeprefix("chargeback: ").split("/")[0]) > 1 + int(AFTER / DELAY) - 2


def test_quiet_or_not_a_terminal_prints_no_progress(slow, prices_file):
    code, stdout, stderr = run_bill(slow, prices_file, "--quiet", terminal=True)
    assert code == 0 and "GPU chargeback" in stdout and stderr == ""
    code, stdout, stderr = run_bill(slow, prices_file, terminal=False)
    assert code == 0 and "GPU chargeback" in stdout and stderr == ""


def test_a_prometheus_slower_than_the_timeout_is_one_line_that_names_the_knob(slow, prices_file):
    code, stdout, stderr = run_bill(slow, prices_file, "--timeout", str(DELAY / 4), terminal=False)
    assert code == 2 and stdout == ""
    [line] = stderr.splitlines()
    assert f"did not answer within {DELAY / 4:g} s" in line and "Traceback" not in stderr
    # What to raise, exactly: this --timeout doubled, and the server's own limit if it stops the query first.
    assert f"pass --timeout {DELAY / 2:g}" in line and "Prometheus: --query.timeout, 2m by default" in line


def test_the_default_timeout_grows_with_the_range():
    assert default_timeout(3600) == pytest.approx(30 + 10 / 24)
    assert default_timeout(86400) == 40.0
    assert default_timeout(30 * 86400) == 330.0  # a month
    assert default_timeout(400 * 86400) == 900.0  # at most


def test_a_query_the_server_stopped_at_its_own_limit_says_which_limit(prices_file):
    """Prometheus answers a query past its --query.timeout with HTTP 503 and "query timed out in <stage>"
    (promql/engine.go, ErrQueryTimeout; web/api/v1 maps it to 503): the line names the server's knob."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            error = {"status": "error", "errorType": "timeout", "error": "query timed out in expression evaluation"}
            answer_json(self, 503, error)

        def log_message(self, *args: object) -> None:
            pass

    with Listener(Handler) as server:
        result = run_chargeback("--prometheus", server.url, *window_args("exclusive"), "--prices", str(prices_file))
    assert result.code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "HTTP 503" in result.stderr and "query timed out in expression evaluation" in result.stderr
    assert "raise it (Prometheus: --query.timeout, 2m by default; Thanos Query: --query.timeout" in result.stderr
