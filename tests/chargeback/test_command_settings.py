"""The command's flags become one frozen, typed ``Settings``; a bad value is one ChargebackError naming the flag."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from gpu_fence import chargeback
from gpu_fence.chargeback.bill import IdlePolicy, Method
from gpu_fence.chargeback.errors import ChargebackError
from gpu_fence.chargeback.settings import Format, SeriesChoice, Settings, settings_from

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
COMPARED_AS_FOCUS = ("--format", "focus", "--compare-device-metrics")


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-fence-auditor")
    chargeback.add_arguments(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["chargeback", *argv])


def test_the_flags_become_typed_values() -> None:
    settings = settings_from(
        parsed(
            "--prometheus", "http://prometheus:9090", "--start", "-1d", "--end", "2026-01-01T00:00:00Z",
            "--step", "5m", "--by", "label: team ", "--prices", "prices.yaml", "--method", "usage", "--idle",
            "platform", "--series", "raw", "--format", "focus", "--output", "bill.csv", "--timeout", "60",
        ),
        NOW,
    )  # fmt: skip
    assert settings == Settings(
        now=NOW,
        rules=False,
        demo=False,
        prometheus="http://prometheus:9090",
        http_config=None,
        start=NOW - 86400,
        end=NOW,
        step=300.0,
        step_given="5m",
        by="label:team",
        price_per_gpu_hour=None,
        prices=Path("prices.yaml"),
        cost_centres=None,
        method=Method.USAGE,
        idle=IdlePolicy.PLATFORM,
        series=SeriesChoice.RAW,
        compare_device_metrics=False,
        format=Format.FOCUS,
        output=Path("bill.csv"),
        timeout=60.0,
        quiet=False,
        pod_labels=(),
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.step = 60.0  # type: ignore[misc]


def test_the_defaults_are_the_enums_defaults() -> None:
    settings = settings_from(parsed("--demo"), NOW)
    assert (settings.method, settings.idle, settings.series, settings.format) == (
        Method.HOLDER,
        IdlePolicy.PROPORTIONAL,
        SeriesChoice.AUTO,
        Format.TABLE,
    )
    assert (settings.start, settings.end, settings.step, settings.by) == (None, None, None, "namespace")


def test_rules_take_their_interval_and_pod_labels() -> None:
    settings = settings_from(parsed("--rules", "--step", "1m", "--pod-label", "team", "--pod-label", "app"), NOW)
    assert (settings.rules, settings.step, settings.pod_labels) == (True, 60.0, ("team", "app"))
    assert settings_from(parsed("--rules"), NOW).pod_labels == ("team",)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--start", "-1h"], "--prometheus URL is required"),
        (["--prometheus", "http://p:9090"], "--start is required"),
        (["--prometheus", "http://p:9090", "--start", "-1h"], "give prices"),
        (["--demo", "--prometheus", "http://p:9090"], "--demo bills the bundled sample fleet"),
        (["--demo", "--compare-device-metrics"], "the demo fleet has none"),
        (["--demo", "--step", "0.5s"], "--step '0.5s': must be at least 1 s"),
        (["--demo", "--by", "label:a b"], "'a b' is not a Kubernetes label key"),
        (["--demo", "--end", "soon"], "--end 'soon'"),
        (
            ["--prometheus", "http://p:9090", "--start", "-1h", "--price-per-gpu-hour", "1", "--timeout", "nan"],
            "--timeout nan: must be a number of seconds greater than zero",
        ),
        (
            ["--prometheus", "http://p:9090", "--start", "-1h", "--price-per-gpu-hour", "1", *COMPARED_AS_FOCUS],
            "--compare-device-metrics with --format focus",
        ),
        (["--rules", "--step", "0.5s"], "the rules' interval must be at least 1 s"),
        (["--rules", "--pod-label", "a b"], "--pod-label 'a b': not a Kubernetes label key"),
        (["--rules", "--pod-label", "a.b", "--pod-label", "a/b"], "two keys become the same Prometheus label name"),
    ],
)
def test_a_bad_value_is_one_error_naming_its_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ChargebackError) as raised:
        settings_from(parsed(*argv), NOW)
    assert message in str(raised.value)
