"""The flags of ``once`` and ``run``: their defaults (one home: the settings' field defaults), what they parse to,
and the errors that stop the auditor before it starts."""

from __future__ import annotations

import socket

import pytest

from gpu_fence.auditor.cli import build_parser, main
from gpu_fence.auditor.podresources import DEFAULT_SOCKET
from gpu_fence.auditor.settings import AuditSettings, RunSettings, label_clash


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_without_flags_the_settings_are_the_documented_defaults(monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert RunSettings.from_args(parse("run")) == RunSettings(AuditSettings(node=socket.gethostname()))
    defaults = RunSettings(AuditSettings(node="n"))
    assert (defaults.interval, defaults.metrics_port, defaults.metrics_bind) == (30.0, 10400, "0.0.0.0")
    assert (defaults.unhealthy_after, defaults.event_interval, defaults.max_backoff) == (3, 60.0, 300.0)
    assert defaults.audit.pod_resources_socket == DEFAULT_SOCKET == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert defaults.audit.kai_scheduler_names == ("kai-scheduler",)
    assert defaults.audit.dra_gpu_drivers == ("gpu.nvidia.com",) and defaults.audit.allocatable_interval == 300.0


def test_help_shows_each_default_as_the_settings_hold_it(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    shown = "".join(capsys.readouterr().out.split())  # argparse wraps help text, at hyphens too
    for text in (
        "(default: 30)",
        "(default: 10400; 0 picks a free one)",
        "(default: 0.0.0.0)",
        "intervals (default: 3)",
        "minutes (default: 60)",
        "failed cycles (default: 300)",
        f"(default: {DEFAULT_SOCKET})",
        "(default: /proc; /host/proc in the DaemonSet)",
        "(default: kai-resource-reservation)",
        "(repeatable; default: kai-scheduler)",
        "every S seconds (default: 60)",
        "(repeatable; default: gpu.nvidia.com)",
        "every S seconds (default: 300)",
    ):
        assert "".join(text.split()) in shown, text


def test_flags_become_typed_settings(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "from-env")
    args = parse(
        "run",
        "--no-kubernetes",
        "--no-events",
        "--exempt-namespace",
        "gpu-operator",
        "--exempt-namespace",
        "kube-system",
        "--pod-label",
        "team",
        "--kai-scheduler-name",
        "a",
        "--kai-scheduler-name",
        "b",
        "--interval",
        "2.5",
        "--metrics-port",
        "0",
        "--dra-gpu-driver",
        "gpu.example.com",
        "--dra-gpu-driver",
        "gpu.example.com",
        "--allocatable-interval",
        "60",
    )
    settings = RunSettings.from_args(args)
    assert settings.audit.dra_gpu_drivers == ("gpu.example.com",) and settings.audit.allocatable_interval == 60
    assert settings.audit.node == "from-env" and not settings.audit.kubernetes and not settings.events
    assert settings.audit.exempt_namespaces == {"gpu-operator", "kube-system"}
    assert settings.audit.pod_label_keys == ("team",) and settings.audit.kai_scheduler_names == ("a", "b")
    assert (settings.interval, settings.metrics_port) == (2.5, 0)
    assert AuditSettings.from_args(parse("once", "--node", "given")).node == "given"  # the flag wins over $NODE_NAME


@pytest.mark.parametrize(
    "bad",
    [
        ["--interval", "0"],
        ["--interval", "soon"],
        ["--metrics-port", "70000"],
        ["--pod-relist-interval", "-1"],
        ["--allocatable-interval", "0"],
    ],
)
def test_bad_flags_are_usage_errors(bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *bad])
    assert exit_info.value.code == 2
    assert "gpu-fence-auditor run: error:" in capsys.readouterr().err


def test_pod_labels_that_become_one_metric_label_clash():
    assert label_clash(["team", "app.kubernetes.io/part-of"]) is None
    assert label_clash(["team.name", "team_name"]) == (
        "--pod-label team.name and --pod-label team_name both become the metric label label_team_name; keep one of them"
    )
    assert label_clash(["team", "team"]) is None  # the same key twice is one label


def test_pod_labels_that_become_one_metric_label_are_refused(tmp_path, capsys):
    """``a.b`` and ``a_b`` both export as ``label_a_b``: one value would silently replace the other on every pod."""
    assert (
        main(
            [
                "run",
                "--no-kubernetes",
                "--host-proc",
                str(tmp_path),
                "--pod-label",
                "team.name",
                "--pod-label",
                "team_name",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "team.name" in err and "team_name" in err and "label_team_name" in err


def test_an_auditor_interval_of_zero_is_a_usage_error_naming_the_option(capsys):
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["run", "--interval", "0"])
    assert stopped.value.code == 2
    assert "--interval: '0' must be greater than 0" in capsys.readouterr().err
