"""The command lines in the manifests parse with the real CLIs, as the container runtime would pass them."""

from __future__ import annotations

import re
from typing import Any

import pytest

from .conftest import KUSTOMIZATIONS, pod_spec, render, workloads

#: Values the kubelet substitutes for $(VAR) references to these env entries, for the parser's sake.
EXPANSIONS = {"POD_NAMESPACE": "gpu-fence", "NODE_NAME": "gpu-node-1"}


def expand(arg: str, env: dict[str, Any]) -> str:
    """Kubernetes $(VAR) expansion of args: only variables the container defines are substituted."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in env, f"$({name}) refers to no env entry of the container"
        return EXPANSIONS.get(name, "value")

    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", substitute, arg)


def command_lines() -> list[tuple[str, str, list[str]]]:
    found = []
    for target in KUSTOMIZATIONS:
        for workload in workloads(render(target)):
            for container in pod_spec(workload)["containers"]:
                env = {e["name"]: e for e in container.get("env", [])}
                argv = [expand(a, env) for a in [*container["command"], *container.get("args", [])]]
                found.append((f"{target}:{workload['kind']}/{workload['metadata']['name']}", argv[0], argv[1:]))
    return found


@pytest.mark.parametrize(("where", "program", "argv"), command_lines(), ids=[c[0] for c in command_lines()])
def test_manifest_command_lines_parse_with_the_real_cli(where: str, program: str, argv: list[str]) -> None:
    if program == "gpu-fence-webhook":
        from gpu_fence.webhook.cli import build_parser
    elif program == "gpu-fence-auditor":
        from gpu_fence.auditor.cli import build_parser
    else:
        pytest.fail(f"{where}: unknown entry point {program!r}")
    args = build_parser().parse_args(argv)
    assert callable(args.run)
    if args.command == "serve":
        assert (args.cert_file, args.key_file, args.port) == ("/tls/tls.crt", "/tls/tls.key", 8443)
    if args.command == "run":
        assert (args.host_proc, args.metrics_port, args.node) == ("/host/proc", 10400, "gpu-node-1")
        assert "gpu-fence" in args.exempt_namespace
    if args.command == "certs":
        assert args.namespace == "gpu-fence" and args.secret == "gpu-fence-webhook-tls"


def test_every_workload_runs_one_of_the_two_entry_points() -> None:
    programs = {program for _, program, _ in command_lines()}
    assert programs == {"gpu-fence-webhook", "gpu-fence-auditor"}


def test_certs_help_example_names_the_webhook_configurations_the_manifests_ship() -> None:
    # A copy-pasted example that names configurations which do not exist fails with 404 in the cluster.
    import shlex

    from gpu_fence.webhook.certs import EXAMPLES
    from gpu_fence.webhook.cli import build_parser

    text = EXAMPLES.replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if "--patch-webhooks" in line]
    argv = shlex.split(line.strip())
    assert argv[0] == "gpu-fence-webhook"
    args = build_parser().parse_args(argv[1:])
    kinds = {"MutatingWebhookConfiguration": "mutating", "ValidatingWebhookConfiguration": "validating"}
    shipped = {f"{kinds[o['kind']]}/{o['metadata']['name']}" for o in render("base") if o["kind"] in kinds}
    assert set(args.patch_webhooks) == shipped
    (certs_job,) = [w for w in workloads(render("base")) if w["kind"] == "Job"]
    assert args.secret in pod_spec(certs_job)["containers"][0]["args"]
