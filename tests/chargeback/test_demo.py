"""``chargeback --demo``: the real computation over the bundled fleet, in every format, the same bill a real
Prometheus gives for the same series, and working from an installed wheel with nothing of the repository around."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from gpu_fence.chargeback.demo import SeriesSource, load_fleet
from gpu_fence.chargeback.errors import ChargebackError
from gpu_fence.chargeback.times import iso
from tests.fakes.chargeback_scenarios import run_chargeback
from tests.fakes.focus_validator import validate_focus
from tests.fakes.processes import run_captured
from tests.fakes.prometheus import PrometheusServer

REPO = Path(__file__).resolve().parents[2]
FORMATS = ("table", "csv", "json", "markdown", "html", "focus")


def demo(*extra: str) -> dict:
    result = run_chargeback("--demo", "--format", "json", *extra)
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


def groups(document: dict) -> dict[str, dict]:
    return {group["group"]: group for group in document["groups"]}


def test_the_demo_bill_is_the_method_applied_to_the_fleet():
    document = demo()
    by = groups(document)
    assert document["source"] == "the bundled demo fleet (chargeback --demo)"
    assert (document["range"]["start"], document["range"]["end"]) == ("2026-01-05T00:00:00Z", "2026-01-06T00:00:00Z")
    assert document["range"]["step_seconds"] == 60  # one day / 2000, at least a minute
    # Seven cards for a day: four H100 at 4.50, an A100 80GB at 2.20, an A100 40GB at 1.75, an L4 at 0.80.
    assert document["total_gpu_cost"] == pytest.approx(24 * (4 * 4.50 + 2.20 + 1.75 + 0.80))  # 546.00
    # genai trains on two H100 until 18:00 and keeps them: 2 × 18 h × 4.50 usage, 2 × 6 h × 4.50 reserved.
    assert by["genai"]["usage_cost"] == pytest.approx(162.00)
    assert by["genai"]["reserved_cost"] == pytest.approx(54.00)
    # The fourth H100 nobody holds: 24 h × 4.50 to the platform, under either idle policy.
    assert document["platform"]["cost"] == pytest.approx(108.00)
    # share-1, 4 replicas at 0.55/h each: carol holds hers all day (13.20), bob his outside 09-17 (8.80), alice
    # hers outside 08-18 (7.70); alice and bob split the rest of the card by memory, 10 : 6 GiB, while they use it.
    assert by["notebooks"]["reserved_cost"] == pytest.approx(13.20 + 8.80 + 7.70)
    assert by["notebooks"]["usage_cost"] == pytest.approx(15.40)
    assert by["notebooks"]["idle_cost"] == pytest.approx(7.70)  # the unheld replica, spread to its only users
    # mig-1: nlp's 2g slices at 0.50/h: the tagger's after noon and the embedder's all day are reserved.
    assert by["nlp"]["reserved_cost"] == pytest.approx(0.50 * 12 + 0.50 * 24)
    assert by["vision"]["usage_cost"] == pytest.approx(0.75 * 24)
    [overreach] = document["overreach"]
    assert (overreach["namespace"], overreach["pod"]) == ("research", "scratch")
    assert overreach["memory_gib_hours"] == pytest.approx(4 * 4)
    # 04-06 it shares the L4 with batch's 8 GiB and the host's 1 GiB: 4/13 of 2 h × 0.80 = 0.4923; 06-08 batch held
    # it idle. research pays it: the namespace that used the capacity without an allocation.
    assert overreach["cost"] == pytest.approx(0.49)
    assert by["research"]["overreach_cost"] == by["research"]["total_cost"] == pytest.approx(0.49)
    # Every row, overreach in its user's: the rows add up to the day's 546.00, the headline.
    assert document["total"]["total_cost"] == document["total_gpu_cost"] == pytest.approx(546.00)
    rows = [*(group["total_cost"] for group in document["groups"]), document["unattributed"]["cost"]]
    assert sum(Decimal(str(cost)) for cost in [*rows, document["platform"]["cost"]]) == Decimal("546.00")


def test_the_demo_follows_the_options():
    usage = groups(demo("--method", "usage", "--idle", "platform"))
    assert usage["genai"]["total_cost"] == pytest.approx(162.00)  # the reserved hours are idle under usage
    assert usage["genai"]["reserved_cost"] == 0.0
    teams = groups(demo("--by", "label:team"))
    assert teams["data-science"]["total_cost"] == pytest.approx(52.80)  # the whole A100 80GB
    assert teams["genai"]["total_cost"] == pytest.approx(216.00)
    flat = demo("--price-per-gpu-hour", "1")
    assert flat["total_gpu_cost"] == pytest.approx(7 * 24)
    assert flat["prices"] == [{"rule": "--price-per-gpu-hour", "model": model, "price_per_gpu_hour": 1.0, "cards": n}
                              for model, n in (("NVIDIA A100-SXM4-40GB", 1), ("NVIDIA A100-SXM4-80GB", 1),
                                               ("NVIDIA H100 80GB HBM3", 4), ("NVIDIA L4", 1))]  # fmt: skip
    hours = demo("--start", "2026-01-05T06:00:00Z", "--end", "2026-01-05T12:00:00Z", "--step", "5m")
    assert hours["total_gpu_cost"] == pytest.approx(546.00 / 4)


@pytest.mark.parametrize("output_format", FORMATS)
def test_every_format(output_format: str, tmp_path: Path):
    result = run_chargeback("--demo", "--format", output_format)
    assert result.code == 0, result.stderr
    assert result.stderr == ""
    if output_format == "focus":
        assert validate_focus(result.stdout, tmp_path).strip().endswith("Validation succeeded.")
    elif output_format == "csv":
        rows = list(csv.DictReader(io.StringIO(result.stdout)))
        kinds = {"group", "subtotal", "unattributed", "platform", "total", "price", "card"}
        assert {row["kind"] for row in rows} == kinds
        assert {row["source"] for row in rows} == {"the bundled demo fleet (chargeback --demo)"}
    elif output_format == "html":
        assert result.stdout.startswith("<!DOCTYPE html>") and 'id="provenance"' in result.stdout
    elif output_format == "json":
        assert json.loads(result.stdout)["total_gpu_cost"] == pytest.approx(546.00)
    else:
        assert "the bundled demo fleet" in result.stdout and "546.00" in result.stdout


def test_the_demo_refuses_a_prometheus_and_a_prometheus_bill_points_to_the_demo():
    result = run_chargeback("--demo", "--prometheus", "http://127.0.0.1:9")
    assert result.code == 2 and "leave out --prometheus" in result.stderr
    result = run_chargeback("--start", "-1h", "--price-per-gpu-hour", "1")
    assert result.code == 2 and "--prometheus URL is required" in result.stderr and "--demo" in result.stderr
    result = run_chargeback("--prometheus", "http://127.0.0.1:9", "--price-per-gpu-hour", "1")
    assert result.code == 2 and "--start is required" in result.stderr
    result = run_chargeback("--prometheus", "http://127.0.0.1:9", "--start", "-1h")
    assert result.code == 2 and "--price-per-gpu-hour N, or --prices FILE" in result.stderr


def test_the_in_process_source_refuses_what_it_cannot_evaluate():
    source = SeriesSource(load_fleet().series)
    for query in ("sum(gpu_fence_gpu_info)", 'max by (node) (gpu_fence_gpu_info{node=~"dgx.*"})', "rate(x[5m])"):
        with pytest.raises(ChargebackError, match="demo source"):
            source.query_range(query, 0, 60, 60)


@pytest.fixture(scope="module")
def demo_prometheus(tmp_path_factory: pytest.TempPathFactory):
    """A real Prometheus holding exactly the demo's series (backfilled; the day is long past, keep it)."""
    fleet = load_fleet()
    workdir = tmp_path_factory.mktemp("demo-prometheus")
    with PrometheusServer(workdir, openmetrics=fleet.openmetrics(), retention="10y") as server:
        yield server


@pytest.mark.e2e
@pytest.mark.parametrize(
    "extra",
    [
        (),
        ("--method", "usage", "--idle", "platform"),
        ("--by", "label:team", "--step", "7m"),
        ("--start", "2026-01-05T05:30:00Z", "--end", "2026-01-05T08:30:00Z", "--step", "90s"),
    ],
)
def test_the_demo_source_gives_the_bill_a_real_prometheus_gives(demo_prometheus, tmp_path: Path, extra):
    fleet = load_fleet()
    prices = tmp_path / "prices.yaml"
    prices.write_text(json.dumps(json.loads((REPO / "chargeback/demo_fleet.json").read_text())["prices"]))
    in_process = demo("--prices", str(prices), *extra)
    window = ("--start", iso(fleet.start), "--end", iso(fleet.end))
    result = run_chargeback(
        "--prometheus", demo_prometheus.url, *window, "--prices", str(prices), "--format", "json", *extra
    )
    assert result.code == 0, result.stderr
    served = json.loads(result.stdout)
    for document in (in_process, served):
        del document["generated_at"], document["source"]
    assert in_process == served


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this tree, installed into a directory of its own (no editable link to the sources)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target",
         str(target), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return target


@pytest.mark.e2e
@pytest.mark.parametrize("output_format", FORMATS)
def test_the_demo_works_from_an_installed_wheel(installed: Path, tmp_path: Path, output_format: str):
    # -I: no current directory, no PYTHONPATH, no user site; the dependencies come from this environment's site.
    program = (
        "import sys; sys.path.insert(0, sys.argv[1]); import gpu_fence; from gpu_fence.auditor.cli import main;"
        "print(gpu_fence.__file__, file=sys.stderr); sys.exit(main(['chargeback', '--demo', '--format', sys.argv[2]]))"
    )
    done = run_captured([sys.executable, "-I", "-c", program, str(installed), output_format], timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == str(installed / "gpu_fence" / "__init__.py")  # not the source tree
    if output_format == "json":
        document = json.loads(done.stdout)
        assert document["total_gpu_cost"] == pytest.approx(546.00)
        reference = demo()
        for item in (document, reference):
            del item["generated_at"]
        assert document == reference
    assert "546.00" in done.stdout or output_format in ("csv", "focus", "json")


def test_the_bill_is_made_with_the_cyclic_collector_paused(monkeypatch):
    import gc

    from gpu_fence.chargeback import make

    seen = []
    make_bill = make.make_bill

    def watched(*arguments, **options):
        seen.append(gc.isenabled())
        return make_bill(*arguments, **options)

    monkeypatch.setattr(make, "make_bill", watched)
    assert run_chargeback("--demo", "--format", "json").code == 0
    assert seen == [False] and gc.isenabled()
