"""The offline ``check`` over one large file of Deployments: wall time, CPU time and peak RSS of the whole command.

A CI job that checks a rendered repository reads one stream of thousands of objects (``helm template`` of a large
chart, a directory of rendered manifests concatenated). The file here is ``--deployments`` documents (68,000 by
default, about 50 MB), each a Deployment with a GPU container and a CPU sidecar (labels, env, ports, resources, a
volume): the sidecar is pinned, so every pod spec is judged ``mutated`` and the report has one result per
Deployment.

Each run is a child process, ``gpu-fence-webhook check FILE --format json --output /dev/null``, timed on the wall
clock, with its CPU time and peak RSS from ``wait4`` (``ru_utime + ru_stime``, ``ru_maxrss``): the whole command as
a CI job runs it, the report rendered. On a shared machine the CPU time is the steadier figure. ``--baseline DIR``
runs another version installed in DIR (``pip install --no-deps --target DIR <checkout>``) beside this tree,
interleaved in every round, so that a change is measured before and after on the same machine in the same minutes.
Medians over ``--rounds``.

Run: ``python -m bench.check_bench`` (``--help``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import machine
from .results import publish

DEFAULT_DEPLOYMENTS = 68_000

#: One Deployment; ``{index}`` makes every name distinct. About 800 bytes.
DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: inference-{index}
  namespace: team-{team}
  labels: {{app: inference-{index}}}
spec:
  replicas: 2
  selector:
    matchLabels: {{app: inference-{index}}}
  template:
    metadata:
      labels: {{app: inference-{index}}}
    spec:
      containers:
        - name: server
          image: nvcr.io/nvidia/tritonserver:24.05-py3
          args: [--model-repository=/models]
          env: [{{name: MODEL_NAME, value: model-{index}}}]
          ports: [{{containerPort: 8000, name: http}}]
          resources:
            limits: {{nvidia.com/gpu: 1, memory: 16Gi}}
          volumeMounts: [{{name: models, mountPath: /models}}]
        - name: metrics
          image: prom/statsd-exporter:v0.26.0
          resources: {{limits: {{cpu: 100m}}}}
      volumes: [{{name: models, emptyDir: {{}}}}]
---
"""

#: The child: which gpu_fence to import is decided by the path it is given (empty: this checkout).
CHILD = """\
import sys
if sys.argv[1]:
    sys.path.insert(0, sys.argv[1])
from gpu_fence.webhook.cli import main
sys.exit(main(["check", sys.argv[2], "--format", "json", "--output", "/dev/null"]))
"""


def write_deployments(path: Path, count: int) -> int:
    """Write ``count`` Deployments to ``path`` as one YAML stream; return its size in bytes."""
    with path.open("w", encoding="utf-8") as handle:
        for index in range(count):
            handle.write(DEPLOYMENT.format(index=index, team=index % 50))
    return path.stat().st_size


def run_once(path: Path, baseline: str | None) -> dict[str, float]:
    """One ``check`` of ``path`` in a child process: its wall time, peak RSS and exit status."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, baseline or "", str(path)],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    errors = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    if process.returncode not in (0, 1):
        raise RuntimeError(f"check exited {process.returncode}: {errors.decode(errors='replace').strip()}")
    cpu = usage.ru_utime + usage.ru_stime
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": usage.ru_maxrss / 1024, "exit": process.returncode}


def run(deployments: int, rounds: int, baseline: str | None, directory: Path) -> dict[str, Any]:
    path = directory / "deployments.yaml"
    size = write_deployments(path, deployments)
    versions = [None, baseline] if baseline else [None]
    samples: dict[str | None, list[dict[str, float]]] = {version: [] for version in versions}
    for _ in range(rounds):
        for version in versions:
            samples[version].append(run_once(path, version))

    def summary(runs: list[dict[str, float]]) -> dict[str, Any]:
        return {
            "wall_s": statistics.median(run["wall_s"] for run in runs),
            "cpu_s": statistics.median(run["cpu_s"] for run in runs),
            "peak_rss_mb": statistics.median(run["peak_rss_mb"] for run in runs),
            "runs": runs,
        }

    report: dict[str, Any] = {
        "deployments": deployments,
        "file_mb": size / 2**20,
        "rounds": rounds,
        "load_average": os.getloadavg(),
        "this_tree": summary(samples[None]),
    }
    if baseline:
        report["baseline"] = {"site": baseline, **summary(samples[baseline])}
    return report


def markdown(report: dict[str, Any]) -> str:
    mine = report["this_tree"]
    lines = [
        f"check over {report['deployments']:,} Deployments in one file ({report['file_mb']:.1f} MB), "
        f"medians of {report['rounds']} rounds; load average {report['load_average'][0]:.2f} at the end",
        "",
        "| version | wall s | CPU s | peak RSS MB |",
        "|---|---|---|---|",
    ]

    def row(name: str, figures: dict[str, Any]) -> str:
        return f"| {name} | {figures['wall_s']:.1f} | {figures['cpu_s']:.1f} | {figures['peak_rss_mb']:.0f} |"

    if "baseline" in report:
        lines.append(row(f"baseline ({report['baseline']['site']})", report["baseline"]))
    lines.append(row("this tree", mine))
    if "baseline" in report:
        theirs = report["baseline"]
        ratios = {key: mine[key] / theirs[key] for key in ("wall_s", "cpu_s", "peak_rss_mb")}
        lines.append(
            f"| ratio (this tree / baseline) | {ratios['wall_s']:.2f} | {ratios['cpu_s']:.2f} | "
            f"{ratios['peak_rss_mb']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.check_bench",
        description="gpu-fence-webhook check over one large generated file: wall time and peak RSS.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--deployments", type=int, default=DEFAULT_DEPLOYMENTS, help="Deployments in the file")
    parser.add_argument("--rounds", type=int, default=3, help="runs per version")
    parser.add_argument("--baseline", metavar="DIR", help="another gpu_fence installed in DIR, run beside this tree")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpu-fence-check-bench-") as directory:
        report = run(args.deployments, args.rounds, args.baseline, Path(directory))
    report["machine"] = machine.describe()
    publish(report, markdown(report), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
