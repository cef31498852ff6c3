"""Every way the command cannot make a bill ends in exit 2 and one line that says what to fix."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.chargeback_scenarios import BASE, HOUR, run_chargeback, window_args
from tests.fakes.ports import free_port


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpu-fence-auditor chargeback: error: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_unreachable_prometheus():
    url = f"http://127.0.0.1:{free_port()}"
    result = run_chargeback("--prometheus", url, *window_args("exclusive"), "--price-per-gpu-hour", "1")
    assert_one_line_error(result, "cannot reach Prometheus at", url, "refused")


@pytest.fixture
def not_prometheus() -> Iterator[str]:
    """Something that answers HTTP, but HTML, like a wrong URL pointing at a web UI would."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>hello</html>"
            self.send_response(200 if "/api/v1/" in self.path else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(timeout=10)


def test_server_that_is_not_prometheus(not_prometheus):
    result = run_chargeback("--prometheus", not_prometheus, *window_args("exclusive"), "--price-per-gpu-hour", "1")
    assert_one_line_error(result, "did not answer like a Prometheus server", "--prometheus")


@pytest.mark.e2e
def test_empty_range(prometheus):
    before = BASE - 10 * HOUR  # no samples anywhere near
    result = run_chargeback(
        "--prometheus", prometheus.url, "--start", str(before), "--end", str(before + HOUR), "--price-per-gpu-hour", "1"
    )
    assert_one_line_error(result, "no gpu_fence_gpu_info samples", "check the time range")


@pytest.mark.e2e
def test_unknown_label(prometheus):
    result = run_chargeback(
        "--prometheus",
        prometheus.url,
        *window_args("timeslice"),
        "--price-per-gpu-hour",
        "1",
        "--by",
        "label:cost-center",
    )
    assert_one_line_error(result, "label_cost_center", "--pod-label cost-center")


@pytest.mark.e2e
def test_series_scraped_without_honor_labels(prometheus):
    result = run_chargeback("--prometheus", prometheus.url, *window_args("renamed"), "--price-per-gpu-hour", "1")
    assert_one_line_error(result, "exported_namespace", "honor_labels")


@pytest.mark.e2e
def test_model_without_price(prometheus, tmp_path: Path):
    prices = tmp_path / "prices.yaml"
    prices.write_text('models:\n  "Tesla T4": 0.35\n', encoding="utf-8")
    result = run_chargeback("--prometheus", prometheus.url, *window_args("exclusive"), "--prices", str(prices))
    assert_one_line_error(result, "no price for GPU model 'NVIDIA H100 80GB HBM3'", "node 'excl'", "default:")


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        ("default: [2.5\n", ("not valid YAML", "line 2")),
        ("- 2.50\n", ("expected a mapping",)),
        ("default: cheap\n", ("default must be a number",)),
        ("default: -1\n", ("default must be a number >= 0",)),
        ("default: 1\nmodel: {}\n", ("unknown key 'model'", "allowed:")),
        ('models:\n  "NVIDIA H100 80GB HBM3": free\n', ("models.'NVIDIA H100 80GB HBM3' must be a number",)),
        ("models: [H100]\n", ("models must be a mapping",)),
        ("nodes:\n  gpu-1: true\n", ("nodes.'gpu-1' must be a number",)),
        ("currency: 3\ndefault: 1\n", ("currency must be a non-empty string",)),
        ("currency: USD\n", ("no prices",)),
        ("", ("expected a mapping",)),
    ],
)
def test_malformed_price_file(tmp_path: Path, content: str, fragments: tuple[str, ...]):
    prices = tmp_path / "prices.yaml"
    prices.write_text(content, encoding="utf-8")
    # The price file is checked before Prometheus is asked anything: no server needed.
    url = f"http://127.0.0.1:{free_port()}"
    result = run_chargeback("--prometheus", url, *window_args("exclusive"), "--prices", str(prices))
    assert_one_line_error(result, str(prices), *fragments)


def test_missing_price_file(tmp_path: Path):
    result = run_chargeback(
        "--prometheus", "http://127.0.0.1:9", *window_args("exclusive"), "--prices", str(tmp_path / "nope.yaml")
    )
    assert_one_line_error(result, "cannot read price file", "nope.yaml")


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        (["--start", "now", "--end", "-1h"], ("--start", "must be before --end")),
        (["--start", "100", "--end", "100"], ("must be before --end",)),
        (["--start", "-1h", "--step", "2h"], ("shorter than one --step",)),
        (["--start", "yesterday"], ("--start 'yesterday'", "RFC 3339")),
        (["--start", "2026-01-01T00:00:00"], ("add a time zone offset",)),
        (["--start", "-1h", "--step", "0"], ("--step '0'", "greater than zero")),
        (["--start", "-1h", "--step", "fast"], ("--step 'fast'",)),
        (["--start", "-1h", "--step", "0.0001"], ("--step '0.0001'", "at least 1 s")),
        (["--start", "-1h", "--step", "500ms"], ("--step '500ms'",)),
        (["--start", "-1h", "--by", "pod"], ("--by 'pod'", "label:KEY")),
        (["--start", "-1h", "--by", "label:"], ("--by 'label:'",)),
        (["--start", "-1h", "--by", "label:a b"], ("not a Kubernetes label key",)),
        (["--start", "-1h", "--timeout", "0"], ("--timeout 0", "greater than zero")),
    ],
)
def test_bad_times_steps_and_grouping(arguments: list[str], fragments: tuple[str, ...]):
    result = run_chargeback("--prometheus", "http://127.0.0.1:9", "--price-per-gpu-hour", "1", *arguments)
    assert_one_line_error(result, *fragments)


def test_bad_url_and_negative_flat_price():
    result = run_chargeback("--prometheus", "prometheus:9090", *window_args("exclusive"), "--price-per-gpu-hour", "1")
    assert_one_line_error(result, "expected an http:// or https:// URL")
    result = run_chargeback(
        "--prometheus", "http://127.0.0.1:9", *window_args("exclusive"), "--price-per-gpu-hour", "-2"
    )
    assert_one_line_error(result, "--price-per-gpu-hour must be a number >= 0")


def test_unwritable_output(tmp_path: Path, prometheus):
    result = run_chargeback(
        "--prometheus",
        prometheus.url,
        *window_args("exclusive"),
        "--price-per-gpu-hour",
        "1",
        "--output",
        str(tmp_path / "missing-dir" / "bill.csv"),
    )
    assert_one_line_error(result, "cannot write --output")


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        ("basic_auth: [finance]\n", ("basic_auth must be a mapping",)),
        ("basic_auth: {username: a, password: b, password_file: c}\n", ("at most one of basic_auth.password",)),
        ("basic_auth: {user: a}\n", ("unknown key 'basic_auth.user'", "allowed here:")),
        ("basic_auth: {username: a, password_file: missing}\n", ("cannot read basic_auth.password_file",)),
        ("authorization: {type: Basic, credentials: x}\n", ('cannot be "Basic"', "basic_auth")),
        ("authorization: {type: Bearer}\n", ("needs credentials or credentials_file",)),
        ("authorization: {credentials: x}\nbasic_auth: {username: a}\n", ("at most one of basic_auth, authorization",)),
        ("bearer_token: x\nbearer_token_file: y\n", ("at most one of bearer_token and bearer_token_file",)),
        ("oauth2: {client_id: a}\n", ("oauth2 is not supported by chargeback",)),
        ("proxy_url: http://proxy:3128\n", ("proxy_url is not supported",)),
        ("authorization: {credentials_ref: vault}\n", ("authorization.credentials_ref is not supported",)),
        ("tls_config: {cert: PEM}\n", ("needs both a certificate and a key",)),
        ("tls_config: {cert_file: client.pem, key_file: key.pem}\n", ("cannot read tls_config.cert_file",)),
        ("tls_config: {ca: not a certificate}\n", ("not a PEM certificate bundle",)),
        ("tls_config: {min_version: TLS9}\n", ("tls_config.min_version 'TLS9'", "TLS12")),
        ("tls_config: {insecure_skip_verify: maybe}\n", ("insecure_skip_verify must be true or false",)),
        ("http_headers: {Authorization: {values: [x]}}\n", ("setting header 'Authorization' is not allowed",)),
        ("http_headers: {X-Scope-OrgID: [tenant]}\n", ("http_headers.X-Scope-OrgID must be a mapping",)),
        ("http_headers: {X-Scope-OrgID: {values: tenant}}\n", ("values must be a list of strings",)),
        ("http_headers: {X-Scope-OrgID: {files: [missing]}}\n", ("cannot read http_headers.X-Scope-OrgID.files",)),
        ("follow_redirects: sometimes\n", ("follow_redirects must be true or false",)),
        ("basic_auth: {username: [a\n", ("not valid YAML", "line")),
        ("- basic_auth\n", ("the file must be a mapping",)),
    ],
)
def test_malformed_http_config(tmp_path: Path, content: str, fragments: tuple[str, ...]):
    config = tmp_path / "http.yaml"
    config.write_text(content, encoding="utf-8")
    # The HTTP client configuration is read before Prometheus is asked anything: no server needed.
    result = run_chargeback(
        "--prometheus", f"http://127.0.0.1:{free_port()}", *window_args("exclusive"), "--price-per-gpu-hour", "1",
        "--http-config", str(config),
    )  # fmt: skip
    assert_one_line_error(result, f"--http-config {config}", *fragments)


def test_missing_http_config(tmp_path: Path):
    result = run_chargeback(
        "--prometheus", "http://127.0.0.1:9", *window_args("exclusive"), "--price-per-gpu-hour", "1",
        "--http-config", str(tmp_path / "nope.yaml"),
    )  # fmt: skip
    assert_one_line_error(result, "cannot read --http-config", "nope.yaml")
