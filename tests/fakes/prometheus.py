"""A real Prometheus for tests: Debian's ``prometheus`` binary on a free loopback port with a temporary data dir.

Two ways to give it data:
- ``backfill``: OpenMetrics text turned into TSDB blocks by ``promtool tsdb create-blocks-from openmetrics``
  before the server starts. Backfilled samples must be older than the head block's window (use timestamps
  hours in the past) and are queried with explicit timestamps.
- ``scrape_targets``: ``host:port`` strings scraped at ``scrape_interval`` (job ``gpu-fence-auditor``);
  ``scrape_configs``: further jobs, as Prometheus' own ``scrape_configs`` entries (the webhook over TLS, say).

``rule_files`` are loaded as Prometheus' ``rule_files`` (recording and alerting rules, evaluated every second
unless a group sets its own interval).

Recording rules over backfilled data: :meth:`PrometheusServer.record` has ``promtool tsdb create-blocks-from
rules`` evaluate them against the running server over a past range, as the server itself would have at each
evaluation (the same phase: promtool offsets a group by the same hash of its name and file), then restarts the
server on those blocks.

``blocks`` copies TSDB blocks made elsewhere into the data directory before it starts.

``web_config`` starts it with ``--web.config.file`` (Prometheus' own TLS and basic-auth server settings); readiness
is then checked over HTTPS against ``ca_file`` with the ``basic_auth`` credentials given.

Readiness and scrapes are waited for by polling with a deadline, never by sleeping a fixed time.
"""

from __future__ import annotations

import base64
import http.server
import json
import shutil
import ssl
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.fakes import polling
from tests.fakes.http_listener import Listener, forward
from tests.fakes.ports import PortTaken, on_a_free_port
from tests.fakes.processes import run_captured

JOB = "gpu-fence-auditor"


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed: apt-get install prometheus (CI's .ci/run does)")
    return path


def backfill(openmetrics: str, data_dir: Path) -> None:
    """Write ``openmetrics`` (must end with ``# EOF``) as TSDB blocks into ``data_dir``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    source = data_dir.parent / "backfill.om"
    source.write_text(openmetrics if openmetrics.endswith("# EOF\n") else openmetrics + "# EOF\n", encoding="utf-8")
    result = run_captured(
        [binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(data_dir)], timeout=120
    )
    if result.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {result.stderr.strip() or result.stdout.strip()}")


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not ended within 20 s: a server started by a test, stopped by it."""
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


class ProcessExited(RuntimeError):
    """The server process ended while we waited for it: stop polling at once."""


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """``tests.fakes.polling.wait_for`` as this module's callers call it (the timeout before what is waited for), and a
    wait that runs out raising ``TimeoutError``, which they catch to say what was missing. Connection errors and
    not-yet-valid answers mean "not yet"; anything else (such as :class:`ProcessExited`) ends the wait at once."""
    try:
        return polling.wait_for(check, what, timeout=timeout, interval=interval)
    except polling.TimedOut as timed_out:
        raise TimeoutError(str(timed_out)) from None


@dataclass(eq=False)
class PrometheusServer:
    """A real Prometheus in ``workdir``: backfilled with ``openmetrics`` or given TSDB ``blocks``, scraping
    ``scrape_targets`` (and any ``scrape_configs``), evaluating ``rule_files``; served behind ``web_config``."""

    workdir: Path
    openmetrics: str | None = None
    scrape_targets: Sequence[str] = ()
    scrape_interval: str = "1s"
    _: KW_ONLY
    retention: str = "30d"
    web_config: dict[str, Any] | None = None
    ca_file: Path | None = None
    basic_auth: tuple[str, str] | None = None
    scrape_configs: Sequence[dict[str, Any]] = ()
    rule_files: Sequence[Path] = ()
    blocks: Path | None = None
    flags: Sequence[str] = ()
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    port: int = field(default=0, init=False)

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def url(self) -> str:
        scheme = "https" if self.web_config and "tls_server_config" in self.web_config else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def _config(self) -> Path:
        config: dict[str, Any] = {"global": {"scrape_interval": self.scrape_interval, "evaluation_interval": "1s"}}
        jobs = list(self.scrape_configs)
        if self.scrape_targets:
            jobs.insert(
                0,
                {
                    "job_name": JOB,
                    "scrape_interval": self.scrape_interval,
                    "scrape_timeout": self.scrape_interval,
                    "static_configs": [{"targets": list(self.scrape_targets)}],
                },
            )
        if jobs:
            config["scrape_configs"] = jobs
        if self.rule_files:
            config["rule_files"] = [str(path) for path in self.rule_files]
        path = self.workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return path

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.openmetrics is not None:
            backfill(self.openmetrics, self.data_dir)
        if self.blocks is not None:  # TSDB blocks made elsewhere, such as another server's recorded rules
            for block in self.blocks.iterdir():
                shutil.copytree(block, self.data_dir / block.name, dirs_exist_ok=True)
            self.blocks = None
        config = self._config()
        extra = []
        if self.web_config is not None:
            web = self.workdir / "web.yml"
            web.write_text(yaml.safe_dump(self.web_config), encoding="utf-8")
            extra.append(f"--web.config.file={web}")
        log_path = self.workdir / "prometheus.log"

        def start(port: int) -> PrometheusServer:
            self.port = port
            with log_path.open("wb") as log:
                self.process = subprocess.Popen(
                    [
                        binary("prometheus"),
                        f"--config.file={config}",
                        f"--storage.tsdb.path={self.data_dir}",
                        f"--web.listen-address=127.0.0.1:{self.port}",
                        f"--storage.tsdb.retention.time={self.retention}",
                        "--log.level=warn",
                        *extra,
                        *self.flags,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            try:
                wait_for(self._ready, timeout, f"Prometheus on {self.url} to be ready")
            except ProcessExited:
                self.stop()
                # retried on another port; a configuration it refuses exits every time, and its log is raised below
                raise PortTaken(port) from None
            except TimeoutError:
                self.stop()
                raise RuntimeError(f"Prometheus never became ready:\n{log_path.read_text()[-2000:]}") from None
            return self

        try:
            return on_a_free_port(start)
        except PortTaken:
            raise RuntimeError(f"Prometheus did not start:\n{log_path.read_text()[-2000:]}") from None

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise ProcessExited(f"prometheus exited with {self.process.returncode}")
        request = urllib.request.Request(f"{self.url}/-/ready")
        if self.basic_auth is not None:
            token = base64.b64encode(":".join(self.basic_auth).encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        context = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else None
        if context is not None:
            context.check_hostname = False  # the server certificate names localhost; we dial 127.0.0.1
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return response.status == 200

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query; returns ``data.result``."""
        parameters = {"query": promql}
        if at is not None:
            parameters["time"] = str(at)
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode(parameters)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            document = json.load(response)
        if document.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {document}")
        return document["data"]["result"]

    def record(self, rules_yaml: str, ranges: Sequence[tuple[int, int]], timeout: float = 600.0) -> None:
        """Backfill what the recording rules of ``rules_yaml`` record over each (start, end) of ``ranges``.

        The rules file is always ``rules.yaml`` in its own directory, so the group's evaluation phase (a hash of
        its name and file) is the same in every run. A gap between ranges is time the rules did not record.
        """
        directory = self.workdir / "rules"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "rules.yaml").write_text(rules_yaml, encoding="utf-8")
        output = self.workdir / "rule-blocks"
        for start, end in ranges:
            result = run_captured(
                [
                    binary("promtool"),
                    "tsdb",
                    "create-blocks-from",
                    "rules",
                    "--quiet",
                    f"--url={self.url}",
                    f"--start={start}",
                    f"--end={end}",
                    f"--output-dir={output}",
                    "rules.yaml",
                ],
                timeout=timeout,
                cwd=directory,
            )
            if result.returncode != 0:
                raise RuntimeError(f"promtool rules backfill failed: {result.stderr.strip()[-2000:]}")
        self.stop()
        self.openmetrics, self.blocks = None, output  # the raw series are in the data directory already
        self.start()

    @property
    def recorded_blocks(self) -> Path:
        """Where :meth:`record` left the blocks it made (``blocks=`` for another server with the same series)."""
        return self.workdir / "rule-blocks"

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query; returns ``data.result``."""
        parameters = {"query": promql, "start": str(start), "end": str(end), "step": str(step)}
        body = urllib.parse.urlencode(parameters).encode()
        with urllib.request.urlopen(f"{self.url}/api/v1/query_range", data=body, timeout=60) as response:
            document = json.load(response)
        if document.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {document}")
        return document["data"]["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        """The values of ``label`` on the series ``match`` selects (Grafana's ``label_values(match, label)``)."""
        parameters = urllib.parse.urlencode({"match[]": match})
        with urllib.request.urlopen(f"{self.url}/api/v1/label/{label}/values?{parameters}", timeout=10) as response:
            document = json.load(response)
        if document.get("status") != "success":
            raise RuntimeError(f"label values of {label} for {match!r} failed: {document}")
        return document["data"]

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class SlowProxy(Listener):
    """A Prometheus that answers slowly: every request is held ``delay`` seconds, then forwarded to ``upstream``.
    For what a long bill does (its progress line) without a long bill."""

    def __init__(self, upstream: str, delay: float) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                time.sleep(delay)  # the point of this fake: a slow answer
                forward(self, upstream)

            def do_POST(self) -> None:
                form = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                time.sleep(delay)
                forward(self, upstream, form)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)
