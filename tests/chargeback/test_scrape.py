"""The whole path: ``gpu-fence-auditor run`` on a described node serves /metrics, a real Prometheus scrapes it
every second, and ``chargeback`` bills what Prometheus stored.

Timing decides how many intervals the range holds, not how they split, so the checks are ratios and sums worked
out from the node: GPU 0 is time-sliced by two pods holding 3 GiB and 1 GiB (the first keeps the SMs 60 % busy, the
second is idle), GPU 1 is used by a pod with no allocation (2 GiB) and a host process (2 GiB). At 3600/h a card costs
1 per second.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.fakes.chargeback_scenarios import run_chargeback
from tests.fakes.node_scenario import Ctr, NodeScenario, replica_holder, uuid_of
from tests.fakes.nvml import GIB
from tests.fakes.ports import PortTaken, free_port, on_a_free_port
from tests.fakes.prometheus import PrometheusServer, stop_process, wait_for

pytestmark = pytest.mark.e2e
CONSOLE_SCRIPT = Path(sys.executable).with_name("gpu-fence-auditor")


@contextlib.contextmanager
def serving(scenario: NodeScenario, tmp_path: Path) -> Iterator[str]:
    """``gpu-fence-auditor run`` on the started scenario, serving /metrics; yields its ``host:port``."""
    scenario.write_nvml()
    log_path = tmp_path / "auditor.log"

    def start(port: int) -> tuple[subprocess.Popen[bytes], int]:
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    str(CONSOLE_SCRIPT),
                    *scenario.args(
                        "run",
                        "--interval",
                        "1",
                        "--metrics-port",
                        str(port),
                        "--metrics-bind",
                        "127.0.0.1",
                        "--pod-label",
                        "team",
                        "--no-events",
                    ),
                ],
                env=scenario.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

        def exported() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"auditor exited: {log_path.read_text()[-2000:]}")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                return b"gpu_fence_container_gpu_memory_bytes{" in response.read()

        try:
            wait_for(exported, 60, "the auditor to export per-container GPU memory")
        except RuntimeError:
            stop_process(process)
            if f"cannot serve on 127.0.0.1:{port}" in log_path.read_text():
                raise PortTaken(port) from None
            raise
        return process, port

    process, port = on_a_free_port(start)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(process)


def bill(auditor: str, tmp_path: Path, pod: str) -> tuple[dict, int]:
    """Prometheus scrapes ``auditor`` every second; once every chargeback series is in and ``pod``'s memory has six
    more seconds of scrapes, ``chargeback`` bills the range by team at one card-second per second. (bill, seconds)."""
    with PrometheusServer(tmp_path / "prometheus", scrape_targets=[auditor], scrape_interval="1s") as prometheus:
        needed = (
            "gpu_fence_gpu_info",
            "gpu_fence_container_gpu_memory_bytes",
            "gpu_fence_container_allocated_gpus",
            "gpu_fence_unattributed_gpu_memory_bytes",
            "gpu_fence_pod_labels",
        )
        query = " and on() ".join(f"count({name}) > 0" for name in needed)
        wait_for(lambda: prometheus.query(query), 60, "Prometheus to scrape every chargeback series")
        start = int(time.time()) + 1  # a whole second after every series exists

        def scraped_until() -> float:
            [sample] = prometheus.query(f'max(timestamp(gpu_fence_container_gpu_memory_bytes{{pod="{pod}"}}))')
            return float(sample["value"][1]) if float(sample["value"][1]) >= start + 6 else 0.0

        end = int(wait_for(scraped_until, 60, "six more seconds of scrapes"))  # the last scrape is within lookback
        result = run_chargeback(
            "--prometheus",
            prometheus.url,
            "--start",
            str(start),
            "--end",
            str(end),
            "--step",
            "1s",
            "--by",
            "label:team",
            "--price-per-gpu-hour",
            "3600",
            "--idle",
            "platform",
            "--format",
            "json",
        )
    assert result.code == 0, result.stderr
    return json.loads(result.stdout), end - start  # instants start+1 .. end, one second each


@pytest.fixture
def auditor(tmp_path: Path):
    scenario = NodeScenario(tmp_path / "node", node="gpu-node-1", gpus=2)
    # a keeps the SMs 60 % busy; b holds its memory and runs nothing NVML samples (an idle holder for the dashboard)
    for name, team, replica, gib, busy in (("a", "alpha", 0, 3, (60, 20, 0, 0)), ("b", "beta", 1, 1, None)):
        holder = replica_holder(0, replica, gib * GIB, activity=busy)
        scenario.add_pod("ml", name, holder, labels={"team": team})
    scenario.add_pod(
        "web", "notebook", Ctr("jupyter", visible=[1], processes=[(1, 2 * GIB)], env={"NVIDIA_VISIBLE_DEVICES": "all"})
    )
    scenario.add_host_gpu_process(1, 2 * GIB)
    with scenario, serving(scenario, tmp_path) as address:
        yield address


def test_prometheus_scrapes_the_auditor_and_chargeback_bills_it(auditor: str, tmp_path: Path):
    document, seconds = bill(auditor, tmp_path, "a")
    by = {group["group"]: group for group in document["groups"]}
    assert document["total_gpu_cost"] == pytest.approx(2 * seconds)
    # GPU 0: alpha 3 GiB, beta 1 GiB → 3/4 and 1/4 of a card-second, every second.
    assert by["alpha"]["usage_cost"] == pytest.approx(0.75 * seconds)
    assert by["beta"]["usage_cost"] == pytest.approx(0.25 * seconds)
    # Each replica is billed as a whole GPU by requests: 1 per second each.
    assert by["alpha"]["request_cost"] == pytest.approx(seconds)
    assert by["beta"]["request_cost"] == pytest.approx(seconds)
    # Not billed, beside it: alpha's processes keep the SMs 60 % busy, beta's hold memory and run nothing.
    assert by["alpha"]["sm_active_gpu_hours"] == pytest.approx(0.6 * seconds / 3600, rel=0.2)
    assert by["beta"]["sm_active_gpu_hours"] == 0.0
    # GPU 1: the notebook (no allocation, no team label) and the host process hold 2 GiB each → half a card each.
    # The notebook used GPU 1 without an allocation: its group pays for it (overreach, in its total).
    assert by["(none)"]["overreach_cost"] == by["(none)"]["total_cost"] == pytest.approx(0.5 * seconds)
    assert document["unattributed"]["cost"] == pytest.approx(0.5 * seconds)
    assert document["platform"]["cost"] == pytest.approx(0.0)
    [overreach] = document["overreach"]
    assert (overreach["namespace"], overreach["pod"], overreach["node"], overreach["gpu_uuid"]) == (
        "web",
        "notebook",
        "gpu-node-1",
        uuid_of(1),
    )


# --- the Grafana dashboard, every panel against this Prometheus ----------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "manifests" / "overlays" / "prometheus"
WEBHOOK_NAME = "gpu-fence-webhook.gpu-fence.svc"
#: What Grafana puts in place of the dashboard's variables: every namespace and node ("All"), and a rate window that
#: holds several of this Prometheus' one-second scrapes.
VARIABLES = {"$cluster": ".*", "$namespace": ".*", "$node": ".*", "$__rate_interval": "10s"}
#: The cluster label the auditor's scrape job gives its series here, as a multi-cluster setup would.
CLUSTER = "gpu-cluster-1"


@pytest.fixture
def webhook(tmp_path: Path):
    """``gpu-fence-webhook serve`` over TLS with a certificate from ``certs``; yields its port and CA file."""
    program = str(Path(sys.executable).with_name("gpu-fence-webhook"))
    tls = tmp_path / "tls"
    subprocess.run(
        [program, "certs", "--service", "gpu-fence-webhook", "--namespace", "gpu-fence", "--out-dir", str(tls)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    port = free_port()
    log = (tmp_path / "webhook.log").open("wb")
    process = subprocess.Popen(
        [
            *(program, "serve", "--cert-file", str(tls / "tls.crt"), "--key-file", str(tls / "tls.key")),
            *("--bind", "127.0.0.1", "--port", str(port), "--workers", "1", "--namespace", "gpu-fence"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    context = ssl.create_default_context(cafile=str(tls / "ca.crt"))
    context.check_hostname = False  # the certificate names the Service; the test dials 127.0.0.1, verified by the CA

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"serve exited: {(tmp_path / 'webhook.log').read_text()[-2000:]}")
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", timeout=2, context=context) as response:
            return response.status == 200

    try:
        wait_for(ready, 60, "the webhook to be ready")
        yield port, tls / "ca.crt", context
    finally:
        stop_process(process)
        log.close()


def review(pod: dict) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "team-a",
                "operation": "CREATE",
                "userInfo": {"username": "tester"},
                "object": pod,
            },
        }
    ).encode()


PRIVILEGED = {
    "metadata": {"name": "sneaky"},
    "spec": {"containers": [{"name": "main", "image": "x", "securityContext": {"privileged": True}}]},
}
PLAIN = {"metadata": {"name": "plain"}, "spec": {"containers": [{"name": "main", "image": "x"}]}}


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, with Grafana's variables filled in."""
    dashboard = json.loads((MONITORING / "gpu-fence-dashboard.json").read_text(encoding="utf-8"))
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr.replace('"$1"', ""), f"{panel['title']}: a variable the test does not fill: {expr}"
            found.append((panel["title"], expr))
    return found


def shipped_rules_every_second(directory: Path) -> Path:
    """rules.yaml as shipped, with time scaled down so that a test sees its results: each group evaluated every
    second and the hourly subqueries stepped by the second instead of the minute. The expressions are otherwise
    the shipped ones."""
    rules = yaml.safe_load((MONITORING / "rules.yaml").read_text(encoding="utf-8"))
    for group in rules["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            rule["expr"] = rule["expr"].replace(":1m]", ":1s]")
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    return path


def test_every_dashboard_query_parses_and_returns_data(auditor: str, webhook, tmp_path: Path):
    """Both deployables scraped, the shipped rules loaded: each panel's query and each variable's values come back
    non-empty. A query that does not parse is an HTTP 400 from Prometheus and fails here at once."""
    port, ca_file, context = webhook
    webhook_job = {
        "job_name": "gpu-fence-webhook",
        "scheme": "https",
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "tls_config": {"ca_file": str(ca_file), "server_name": WEBHOOK_NAME},
        "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
    }
    queries = dashboard_queries()
    assert len(queries) >= 20

    def send_traffic() -> None:
        for path, body in (("/validate", review(PRIVILEGED)), ("/mutate", review(PLAIN)), ("/validate", b"{")):
            request = urllib.request.Request(
                f"https://127.0.0.1:{port}{path}", data=body, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=5, context=context) as response:
                    response.read()
            except urllib.error.HTTPError as error:  # the bad request's 400 is the point of sending it
                assert error.code == 400, error

    auditor_job = {
        "job_name": "gpu-fence-auditor",
        "honor_labels": True,
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "static_configs": [{"targets": [auditor]}],
        "relabel_configs": [{"target_label": "cluster", "replacement": CLUSTER}],
    }
    with PrometheusServer(
        tmp_path / "prometheus",
        scrape_interval="1s",
        scrape_configs=[auditor_job, webhook_job],
        rule_files=[shipped_rules_every_second(tmp_path)],
    ) as prometheus:
        empty: list[str] = []

        def every_panel_has_data() -> bool:
            send_traffic()
            empty.clear()
            for title, expr in queries:
                try:
                    if not prometheus.query(expr):
                        empty.append(f"{title}: {expr}")
                except urllib.error.HTTPError as error:
                    if error.code == 400:  # Prometheus' answer to a query that does not parse
                        raise AssertionError(f"{title}: the query does not parse: {expr}\n{error.read()!r}") from None
                    raise
            return not empty

        try:
            wait_for(every_panel_has_data, 120, "every dashboard panel to return data", interval=1.0)
        except TimeoutError:
            pytest.fail("dashboard queries that returned nothing:\n" + "\n".join(empty))
        dashboard = json.loads((MONITORING / "gpu-fence-dashboard.json").read_text(encoding="utf-8"))
        for variable in dashboard["templating"]["list"]:
            if variable["type"] != "query":
                continue
            query = variable["query"]["query"].replace("$cluster", CLUSTER)
            match = re.fullmatch(r"label_values\((\w+(?:\{[^}]*\})?), (\w+)\)", query)
            assert match, variable["query"]
            assert prometheus.label_values(match.group(2), match.group(1)), variable["name"]
        # the cluster variable lists the cluster, and a panel set to another cluster shows nothing of this one
        assert prometheus.label_values("cluster", "gpu_fence_gpu_info") == [CLUSTER]
        [template] = [
            t["expr"] for p in dashboard["panels"] if p["title"] == "GPU memory per container" for t in p["targets"]
        ]
        for cluster, found in ((CLUSTER, True), ("another-cluster", False)):
            chosen = template.replace("$cluster", cluster).replace("$namespace", ".*").replace("$node", ".*")
            assert bool(prometheus.query(chosen)) is found, cluster
        # the dcgm-exporter names: UUID is the physical GPU, modelName the card, on the per-container table
        [per_container] = [expr for title, expr in queries if title == "GPU memory per container"]
        rows = prometheus.query(per_container)
        assert {row["metric"]["UUID"] for row in rows} == {uuid_of(0), uuid_of(1)}
        assert all(row["metric"].get("modelName") for row in rows)
        assert {row["metric"]["Hostname"] for row in rows} == {"gpu-node-1"}
        # activity: what NVML sampled, per container, and the idle holder found as one
        [sm_panel] = [expr for title, expr in queries if title == "SM activity per container"]
        sm = {row["metric"]["pod"]: float(row["value"][1]) for row in prometheus.query(sm_panel)}
        assert sm["a"] == pytest.approx(0.6) and sm["b"] == 0.0
        [idle_panel] = [expr for title, expr in queries if title == "Held GPUs without SM activity, last hour"]
        assert {row["metric"]["pod"] for row in prometheus.query(idle_panel)} == {"b"}


def test_dra_holders_are_billed_as_device_plugin_holders_are(tmp_path: Path):
    """NVIDIA's DRA driver names GPUs by minor, and here minors are not indices: GPU 0 is ``gpu-2``, GPU 1 ``gpu-0``,
    GPU 2 ``gpu-1``. alpha holds GPU 0 through a claim and puts no memory on it; beta holds GPU 1 and uses 3 GiB;
    gamma holds GPU 2 (1 GiB) and also uses 1 GiB on beta's GPU 1, which its claim does not give it."""
    scenario = NodeScenario(
        tmp_path / "node", node="gpu-node-1", gpus=3, minors={0: 2, 1: 0, 2: 1}, dra_release="v25.12"
    )
    scenario.add_pod("ml", "holder", Ctr("main", dra=[0], visible=[0]), labels={"team": "alpha"})
    scenario.add_pod("ml", "user", Ctr("main", dra=[1], visible=[1], processes=[(1, 3 * GIB)]), labels={"team": "beta"})
    greedy = Ctr("main", dra=[2], visible=[2, 1], processes=[(2, GIB), (1, GIB)])
    scenario.add_pod("ml", "greedy", greedy, labels={"team": "gamma"})
    with scenario, serving(scenario, tmp_path) as address:
        document, seconds = bill(address, tmp_path, "user")
    by = {group["group"]: group for group in document["groups"]}
    assert document["total_gpu_cost"] == pytest.approx(3 * seconds)
    # what a claim blocks, its holder pays: GPU 0 all of it, reserved and unused
    assert by["alpha"]["reserved_cost"] == pytest.approx(seconds) and by["alpha"]["usage_cost"] == pytest.approx(0)
    assert by["alpha"]["request_cost"] == pytest.approx(seconds)
    # GPU 1 by memory: beta 3 GiB of its own, gamma's 1 GiB is overreach, in gamma's total
    assert by["beta"]["usage_cost"] == pytest.approx(0.75 * seconds)
    assert by["gamma"]["usage_cost"] == pytest.approx(seconds)  # GPU 2, its own
    assert by["gamma"]["overreach_cost"] == pytest.approx(0.25 * seconds)
    [overreach] = document["overreach"]
    assert (overreach["pod"], overreach["gpu_uuid"]) == ("greedy", uuid_of(1))
    assert document["platform"]["cost"] == pytest.approx(0.0) and document["unattributed"]["cost"] == pytest.approx(0)
