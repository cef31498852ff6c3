"""``gpu-fence-webhook check`` over files, directories and stdin, in process through ``webhook.cli.main``.

The examples' verdicts are in ``test_check_examples.py``, live pods in ``test_check_cluster.py``, and the
real console script in a subprocess in ``test_check_cli.py``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_fence.webhook import check, cli, sources
from tests.fakes.check_reports import where_and_verdict

HERE = Path(__file__).parent
DATA = HERE / "data" / "check"

GPU_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: gpu
spec:
  containers:
    - name: main
      image: nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04
      resources:
        limits:
          nvidia.com/gpu: 1
"""

CPU_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: cpu
spec:
  containers:
    - name: main
      image: nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04
"""

BYPASS_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: bypass
  namespace: team-a
spec:
  containers:
    - name: main
      image: nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04
      env:
        - name: NVIDIA_VISIBLE_DEVICES
          value: all
"""


def run_check(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    *args: str,
    stdin: bytes | None = None,
) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = cli.main(["check", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def check_json(capsys: Any, monkeypatch: Any, *args: str, stdin: bytes | None = None) -> tuple[int, dict[str, Any]]:
    code, out, err = run_check(capsys, monkeypatch, "--format", "json", *args, stdin=stdin)
    assert err == ""
    return code, json.loads(out)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --- exit codes and verdicts ----------------------------------------------------------------------------------


def test_nothing_rejected_exits_0(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    path = write(tmp_path, "pods.yaml", GPU_POD + "---\n" + CPU_POD)
    code, report = check_json(capsys, monkeypatch, str(path))
    assert code == 0
    assert report["summary"] == {"pod_specs": 2, "allowed": 1, "mutated": 1, "rejected": 0, "exempt": 0, "skipped": 0}
    gpu, cpu = report["results"]
    assert (gpu["name"], gpu["verdict"], gpu["pinned"], gpu["line"]) == ("gpu", "allowed", [], 1)
    assert (cpu["name"], cpu["verdict"], cpu["pinned"], cpu["line"]) == ("cpu", "mutated", ["main"], 13)


def test_a_rejection_exits_1_and_names_rule_and_container(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    path = write(tmp_path, "bypass.yaml", BYPASS_POD)
    code, report = check_json(capsys, monkeypatch, str(path))
    assert code == 1
    [result] = report["results"]
    assert result["verdict"] == "rejected"
    assert result["namespace"] == "team-a"
    assert [(v["rule"], v["container"]) for v in result["violations"]] == [("visible-devices-env", "main")]
    assert "NVIDIA_VISIBLE_DEVICES" in result["violations"][0]["message"]


def test_json_contract_fields_and_types(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    path = write(tmp_path, "bypass.yaml", BYPASS_POD)
    _, report = check_json(capsys, monkeypatch, str(path))
    assert set(report) == {"summary", "results"}
    assert set(report["summary"]) == {"pod_specs", "allowed", "mutated", "rejected", "exempt", "skipped"}
    [result] = report["results"]
    contract = {"source", "line", "kind", "namespace", "name", "path", "verdict", "pinned", "violations"}
    assert contract <= set(result)
    assert result["source"] == str(path)
    assert (result["line"], result["kind"], result["name"], result["path"]) == (1, "Pod", "bypass", "")
    assert set(result["violations"][0]) == {"rule", "container", "message"}


# --- inputs: stdin, directories, multi-document streams, Lists, skipped documents ----------------------------

HELM_STREAM = """\
# Source: chart/templates/values.yaml
replicaCount: 1
---
# Source: chart/templates/list.yaml
apiVersion: v1
kind: PodList
items:
  - apiVersion: v1
    kind: Pod
    metadata: {name: listed-gpu}
    spec:
      containers: [{name: a, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]
  - apiVersion: v1
    kind: Pod
    metadata: {name: listed-bypass, namespace: other}
    spec:
      containers:
        - name: a
          image: x
          securityContext: {privileged: true}
  - just: a value
---
---
apiVersion: batch/v1
kind: Job
metadata:
  name: job
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: work, image: nvcr.io/nvidia/pytorch:24.05-py3}]
"""


def test_stdin_stream_with_lists_skipped_and_empty_documents(capsys: Any, monkeypatch: Any) -> None:
    code, report = check_json(capsys, monkeypatch, "-", "--namespace", "ml", stdin=HELM_STREAM.encode())
    assert code == 1
    # the values document and the List item that is no object are skipped; the empty document is not counted
    assert report["summary"]["skipped"] == 2
    assert where_and_verdict(report) == [
        ("-", 8, "Pod", "ml", "listed-gpu", "", "allowed"),
        ("-", 13, "Pod", "other", "listed-bypass", "", "rejected"),
        ("-", 24, "Job", "ml", "job", "spec.template", "mutated"),
    ]


def test_directories_are_read_recursively_for_yaml_yml_and_json(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    write(tmp_path, "a/pod.yaml", GPU_POD)
    write(tmp_path, "a/b/pod.yml", CPU_POD)
    pod_json = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "from-json"},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    write(tmp_path, "c/pod.json", json.dumps(pod_json, indent=2))
    write(tmp_path, "c/notes.txt", "apiVersion: v1\nkind: Pod\n")  # not a manifest suffix: not read
    write(tmp_path, "c/values.yaml", "replicas: 2\n")  # not a Kubernetes object: skipped and counted
    code, report = check_json(capsys, monkeypatch, str(tmp_path))
    assert code == 0
    assert [Path(r["source"]).relative_to(tmp_path).as_posix() for r in report["results"]] == [
        "a/pod.yaml",
        "a/b/pod.yml",
        "c/pod.json",
    ]
    assert report["summary"]["skipped"] == 1


def test_exclude_leaves_out_files_and_directories_by_name_or_path(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    write(tmp_path, "deploy/app.yaml", GPU_POD)
    write(tmp_path, "deploy/legacy/old.yaml", BYPASS_POD)
    write(tmp_path, "deploy/render.tmpl.yaml", BYPASS_POD)
    write(tmp_path, "other/legacy.yaml", BYPASS_POD)
    helm_chart(tmp_path / "charts" / "app")
    deploy = str(tmp_path / "deploy")
    for excludes in (["legacy", "*.tmpl.yaml"], ["deploy/legacy", "deploy/*.tmpl.yaml"], ["*/legacy/*", "*tmpl*"]):
        flags = [flag for pattern in excludes for flag in ("--exclude", pattern)]
        code, out, err = run_check(capsys, monkeypatch, "--format", "json", deploy, *flags)
        assert (code, err) == (0, ""), excludes
        assert [result["name"] for result in json.loads(out)["results"]] == ["gpu"]
    # a chart excluded is not mentioned; a file named explicitly is excluded too (a pre-commit hook names files)
    code, out, err = run_check(capsys, monkeypatch, str(tmp_path), "--exclude", "charts", "--exclude", "legacy*")
    assert code == 1 and err == ""
    assert "render.tmpl.yaml" in out and "legacy" not in out
    code, out, err = run_check(capsys, monkeypatch, str(tmp_path / "other/legacy.yaml"), "--exclude", "legacy.yaml")
    assert (code, out) == (2, "")
    assert "no pod spec found in nothing (no documents), 1 excluded: " in err


def test_a_path_given_twice_is_checked_once(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    pod = write(tmp_path, "deploy/gpu.yaml", GPU_POD)
    (tmp_path / "link.yaml").symlink_to(pod)
    named = [str(pod), str(tmp_path / "deploy"), str(tmp_path / "deploy" / ".." / "deploy" / "gpu.yaml")]
    code, report = check_json(capsys, monkeypatch, *named, str(tmp_path / "link.yaml"), str(tmp_path))
    assert code == 0
    assert [(result["source"], result["name"]) for result in report["results"]] == [(str(pod), "gpu")]


def test_a_document_past_the_size_limit_is_an_error_naming_the_source(
    capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sources, "MAX_DOCUMENT_BYTES", 2**20)
    huge = GPU_POD + "---\n" + "apiVersion: v1\nkind: ConfigMap\ndata:\n" + "  k: v\n" * 200_000
    code, out, err = run_check(capsys, monkeypatch, "-", stdin=huge.encode())
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "gpu-fence-webhook check: error: -: a document is larger than 1 MiB, which no single object is (a List that "
        "large: check the live pods with --cluster, or split it)"
    ]


def test_a_stream_of_json_objects_is_read_as_kubectl_reads_it(capsys: Any, monkeypatch: Any) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}, "spec": {"containers": [{"name": "c"}]}}
    stream = json.dumps(pod, indent="\t") + "\n" + json.dumps({**pod, "metadata": {"name": "b"}}) + "\n"
    code, report = check_json(capsys, monkeypatch, "-", stdin=stream.encode())
    assert code == 0
    assert [(result["name"], result["line"]) for result in report["results"]] == [("a", 1), ("b", 15)]


# --- no false green: reading nothing, or less than asked, never passes ---------------------------------------------


NOTHING_FOUND = "or pass --allow-empty if no pod spec is expected"


@pytest.mark.parametrize(
    ("files", "read"),
    [
        ({"empty.yaml": ""}, "1 file (no documents)"),
        ({"values.yaml": "replicas: 2\n", "ci.yml": "on: push\n"}, "2 files (2 documents, 2 not Kubernetes objects)"),
        ({"config.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"}, "1 file (1 document)"),
        ({}, "nothing (no documents)"),
    ],
)
def test_no_pod_spec_found_exits_2_saying_what_was_read(
    files: dict[str, str], read: str, tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    for name, text in files.items():
        write(tmp_path, name, text)
    code, out, err = run_check(capsys, monkeypatch, str(tmp_path))
    assert (code, out) == (2, "")
    [line] = err.splitlines()
    assert line.startswith(f"gpu-fence-webhook check: error: no pod spec found in {read}: check the paths")
    assert NOTHING_FOUND in line


def test_empty_stdin_exits_2(capsys: Any, monkeypatch: Any) -> None:
    code, out, err = run_check(capsys, monkeypatch, "-", stdin=b"")
    assert (code, out) == (2, "")
    assert "no pod spec found in stdin (no documents)" in err


def test_allow_empty_passes_an_empty_input_and_still_reports(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    write(tmp_path, "values.yaml", "replicas: 2\n")
    code, report = check_json(capsys, monkeypatch, str(tmp_path), "--allow-empty")
    assert code == 0
    assert report["summary"] == {"pod_specs": 0, "allowed": 0, "mutated": 0, "rejected": 0, "exempt": 0, "skipped": 1}


def test_every_missing_path_is_listed_in_one_run(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    good = write(tmp_path, "gpu.yaml", GPU_POD)
    code, out, err = run_check(capsys, monkeypatch, str(tmp_path / "one.yaml"), str(good), str(tmp_path / "two"))
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"gpu-fence-webhook check: error: {tmp_path / 'one.yaml'}: no such file or directory",
        f"gpu-fence-webhook check: error: {tmp_path / 'two'}: no such file or directory",
    ]


def test_a_fifo_in_a_walked_directory_is_named_not_read(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    write(tmp_path, "gpu.yaml", GPU_POD)
    os.mkfifo(tmp_path / "pipe.yaml")  # opening it would block until a writer came
    code, out, err = run_check(capsys, monkeypatch, str(tmp_path))
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"gpu-fence-webhook check: error: {tmp_path / 'pipe.yaml'}: not a regular file (name it explicitly to read it)"
    ]


def helm_chart(directory: Path) -> Path:
    write(directory, "Chart.yaml", "apiVersion: v2\nname: app\nversion: 0.1.0\n")
    write(directory, "templates/deployment.yaml", "{{- if .Values.enabled }}\nkind: Deployment\n{{- end }}\n")
    return directory


def test_a_helm_chart_in_a_tree_is_named_and_skipped(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    write(tmp_path, "deploy/pod.yaml", GPU_POD)
    chart = helm_chart(tmp_path / "charts" / "app")
    code, out, err = run_check(capsys, monkeypatch, "--format", "json", str(tmp_path))
    assert code == 0
    assert [result["name"] for result in json.loads(out)["results"]] == ["gpu"]
    assert err.splitlines() == [
        f"gpu-fence-webhook check: warning: {chart}: a Helm chart, not checked: its templates are not manifests; "
        f"render it: helm template {chart} | gpu-fence-webhook check -"
    ]


def test_a_tree_holding_only_a_helm_chart_still_finds_nothing(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    helm_chart(tmp_path / "charts" / "app")
    code, out, err = run_check(capsys, monkeypatch, str(tmp_path))
    assert (code, out) == (2, "")
    assert err.splitlines()[-1].startswith(
        "gpu-fence-webhook check: error: no pod spec found in nothing (no documents), 1 Helm chart not rendered: "
    )


def test_a_helm_chart_named_on_the_command_line_says_render_it_first(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    chart = helm_chart(tmp_path / "app")
    code, out, err = run_check(capsys, monkeypatch, str(chart))
    assert (code, out) == (2, "")
    [line] = err.splitlines()
    assert line == (
        f"gpu-fence-webhook check: error: {chart}: a Helm chart (Chart.yaml): its templates are not manifests; "
        f"render it first: helm template {chart} | gpu-fence-webhook check -"
    )


def test_several_paths_and_stdin_together(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    path = write(tmp_path, "gpu.yaml", GPU_POD)
    _, report = check_json(capsys, monkeypatch, str(path), "-", stdin=CPU_POD.encode())
    assert [(r["source"], r["name"]) for r in report["results"]] == [(str(path), "gpu"), ("-", "cpu")]


def test_namespace_of_objects_without_one_and_config_exemptions(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    pods = write(tmp_path, "pods.yaml", BYPASS_POD + "---\n" + CPU_POD)
    config = write(tmp_path, "config.yaml", "exempt_namespaces: [sandbox]\n")
    code, report = check_json(capsys, monkeypatch, str(pods), "--namespace", "sandbox", "--config", str(config))
    assert code == 1  # the bypass pod names its own namespace, team-a, which is not exempt
    assert [(r["namespace"], r["verdict"]) for r in report["results"]] == [
        ("team-a", "rejected"),
        ("sandbox", "exempt"),
    ]
    code, report = check_json(capsys, monkeypatch, str(pods))
    assert [r["namespace"] for r in report["results"]] == ["team-a", "default"]


# --- custom resources from real projects ---------------------------------------------------------------------


def test_real_custom_resources_with_embedded_templates(capsys: Any, monkeypatch: Any) -> None:
    code, report = check_json(capsys, monkeypatch, str(DATA))
    assert code == 0
    rows = [(Path(r["source"]).name, r["kind"], r["path"], r["verdict"], r["pinned"]) for r in report["results"]]
    assert rows == [
        (
            "kserve-huggingfaceserver-multinode.yaml",
            "ClusterServingRuntime",
            "",
            "mutated",
            ["kserve-container"],
        ),
        (  # the worker pods' spec, beside the fields of the first pod spec
            "kserve-huggingfaceserver-multinode.yaml",
            "ClusterServingRuntime",
            "spec.workerSpec",
            "mutated",
            ["worker-container"],
        ),
        (
            "rayservice-llm-serve.yaml",
            "RayService",
            "spec.rayClusterConfig.headGroupSpec.template",
            "mutated",
            ["ray-head"],
        ),
        (
            "rayservice-llm-serve.yaml",
            "RayService",
            "spec.rayClusterConfig.workerGroupSpecs[0].template",
            "allowed",
            [],
        ),
        (
            "trainingruntime-torchtune.yaml",
            "ClusterTrainingRuntime",
            "spec.template.spec.replicatedJobs[0].template.spec.template",
            "mutated",
            ["dataset-initializer"],
        ),
        (
            "trainingruntime-torchtune.yaml",
            "ClusterTrainingRuntime",
            "spec.template.spec.replicatedJobs[1].template.spec.template",
            "mutated",
            ["model-initializer"],
        ),
        (
            "trainingruntime-torchtune.yaml",
            "ClusterTrainingRuntime",
            "spec.template.spec.replicatedJobs[2].template.spec.template",
            "allowed",
            [],
        ),
        ("volcano-mindspore.yaml", "Job", "spec.tasks[0].template", "mutated", ["mpimaster"]),
        ("volcano-mindspore.yaml", "Job", "spec.tasks[1].template", "allowed", []),
    ]
    # The TrainJob names only an image and resourcesPerNode (no pod spec); the Helm values file is skipped.
    assert report["summary"]["skipped"] == 1
    text = (DATA / "trainingruntime-torchtune.yaml").read_text().splitlines()
    assert text[report["results"][4]["line"] - 1].startswith("apiVersion:")


# --- unreadable input and usage errors: exit 2, one line each ------------------------------------------------


def test_unparseable_yaml_exits_2_naming_file_and_line(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    good = write(tmp_path, "good.yaml", GPU_POD)
    bad = write(tmp_path, "bad.yaml", GPU_POD + "---\nmetadata: {name: [oops\n")
    code, out, err = run_check(capsys, monkeypatch, str(good), str(bad))
    assert code == 2
    assert out == ""  # no partial report
    assert err.splitlines() == [
        f"gpu-fence-webhook check: error: {bad}:14: YAML does not parse: did not find expected ',' or ']'"
    ]


def test_every_unreadable_source_is_reported(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    write(tmp_path, "a.yaml", "a: [\n")
    (tmp_path / "b.yaml").write_bytes(b"kind: \xff\xfe\n")
    code, _, err = run_check(capsys, monkeypatch, str(tmp_path))
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 2
    assert f"{tmp_path / 'a.yaml'}:2: YAML does not parse" in lines[0]
    assert f"{tmp_path / 'b.yaml'}: not UTF-8 text" in lines[1]


def test_stdin_parse_error_is_named_dash(capsys: Any, monkeypatch: Any) -> None:
    code, _, err = run_check(capsys, monkeypatch, "-", stdin=b"a: 1\n b: 2\n")
    assert code == 2
    assert "error: -:2: YAML does not parse: mapping values are not allowed" in err


def test_missing_file_exits_2(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    missing = tmp_path / "nope.yaml"
    code, out, err = run_check(capsys, monkeypatch, str(missing))
    assert (code, out) == (2, "")
    assert err.strip() == f"gpu-fence-webhook check: error: {missing}: no such file or directory"


def test_alias_bomb_of_templates_exits_2(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    lines = ["apiVersion: v1", "kind: ConfigMap", "a: &a [{spec: {containers: [{name: c}]}}]"]
    previous = "a"
    for name in "bcdefghijklmnopqrstu":
        lines.append(f"{name}: &{name} [*{previous}, *{previous}]")
        previous = name
    bomb = write(tmp_path, "bomb.yaml", "\n".join(lines) + "\n")
    code, _, err = run_check(capsys, monkeypatch, str(bomb))
    assert code == 2  # kubectl refuses it too (tests/webhook/test_kubectl_yaml.py)
    assert f"{bomb}:11: kubectl cannot read it: document contains excessive aliasing" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "nothing to check"),
        (["--cluster", "x.yaml"], "either PATH arguments or --cluster"),
        (["x.yaml", "--kubeconfig", "k"], "--kubeconfig applies only with --cluster"),
        (["-", "-"], "stdin (-) can be read only once"),
        (["x.yaml", "--namespace", "Team A"], "--namespace 'Team A' is not a namespace name"),
        (["--cluster", "--namespace", "a/b"], "--namespace 'a/b' is not a namespace name"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str, capsys: Any, monkeypatch: Any) -> None:
    code, out, err = run_check(capsys, monkeypatch, *args)
    assert (code, out) == (2, "")
    assert message in err
    assert len(err.splitlines()) == 1


def test_unknown_format_is_a_usage_error(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["check", "--format", "yaml", "x.yaml"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'yaml'" in capsys.readouterr().err


def test_bad_config_exits_2_naming_the_key(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    pods = write(tmp_path, "pod.yaml", GPU_POD)
    config = write(tmp_path, "config.yaml", "exempt_namespace: [x]\n")
    code, out, err = run_check(capsys, monkeypatch, str(pods), "--config", str(config))
    assert (code, out) == (2, "")
    assert "exempt_namespace: unknown configuration key (did you mean 'exempt_namespaces'?)" in err


# --- output -------------------------------------------------------------------------------------------------


def test_output_file(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    pods = write(tmp_path, "pod.yaml", BYPASS_POD)
    target = tmp_path / "report.json"
    code, out, err = run_check(capsys, monkeypatch, str(pods), "--format", "json", "--output", str(target))
    assert (code, out, err) == (1, "", "")
    assert json.loads(target.read_text())["summary"]["rejected"] == 1


def test_unwritable_output_exits_2(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    pods = write(tmp_path, "pod.yaml", GPU_POD)
    target = tmp_path / "missing-dir" / "report.txt"
    code, _, err = run_check(capsys, monkeypatch, str(pods), "--output", str(target))
    assert code == 2
    assert f"{target}: cannot write the report" in err


def test_text_report_groups_by_file_without_colour_off_a_tty(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    first = write(tmp_path, "first.yaml", BYPASS_POD + "---\n" + CPU_POD)
    second = write(tmp_path, "second.yaml", GPU_POD)
    code, out, _ = run_check(capsys, monkeypatch, str(first), str(second))
    assert code == 1
    assert "\x1b[" not in out
    lines = out.splitlines()
    assert lines.count(str(first)) == 1 and lines.count(str(second)) == 1
    assert lines.index(str(first)) < lines.index(str(second))
    assert "  rejected  Pod team-a/bypass (line 1)" in lines
    assert (
        '            line 8: visible-devices-env: container "main" sets NVIDIA_VISIBLE_DEVICES="all" but '
        "requests no GPU; request nvidia.com/gpu, or remove NVIDIA_VISIBLE_DEVICES" in lines
    )
    assert "            pinned NVIDIA_VISIBLE_DEVICES=void on: main" in lines
    assert lines[-1] == "3 pod specs: 1 allowed, 1 mutated, 1 rejected, 0 exempt"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_text_is_coloured_on_a_tty_unless_no_color(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pods = write(tmp_path, "pod.yaml", BYPASS_POD)
    args = cli.build_parser().parse_args(["check", str(pods)])
    monkeypatch.delenv("NO_COLOR", raising=False)
    terminal = _Terminal()
    assert args.run(args, stdout=terminal) == 1
    assert "\x1b[1;31mrejected" in terminal.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    plain = _Terminal()
    args.run(args, stdout=plain)
    assert "\x1b[" not in plain.getvalue()


# --- Argo Workflows: pods assembled from container/script templates -----------------------------------------

ARGO_WORKFLOW = """\
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata:
  generateName: finetune-
spec:
  entrypoint: main
  podMetadata:
    labels: {team: ml}
  templates:
    - name: main
      steps:
        - - {name: prep, template: prep}
    - name: prep
      container:
        image: nvcr.io/nvidia/pytorch:24.05-py3
        command: [python, prep.py]
    - name: train
      metadata:
        annotations:
          nvidia.cdi.k8s.io/pod: nvidia.com/gpu=all
      script:
        image: nvcr.io/nvidia/pytorch:24.05-py3
        source: import torch
        env:
          - {name: NVIDIA_VISIBLE_DEVICES, value: all}
      sidecars:
        - name: logger
          image: busybox
"""


def test_argo_workflow_templates_are_checked_as_pods(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    path = write(tmp_path, "workflow.yaml", ARGO_WORKFLOW)
    code, report = check_json(capsys, monkeypatch, str(path))
    assert code == 1
    rows = [
        (r["name"], r["path"], r["verdict"], r["pinned"], sorted((v["rule"], v["container"]) for v in r["violations"]))
        for r in report["results"]
    ]
    assert rows == [
        ("finetune-*", "spec.templates[1]", "mutated", ["main"], []),
        (
            "finetune-*",
            "spec.templates[2]",
            "rejected",
            ["logger"],
            [("cdi-annotation", None), ("visible-devices-env", "main")],
        ),
    ]
    code, out, _ = run_check(capsys, monkeypatch, str(path), "--format", "sarif")
    lines = {
        r["ruleId"]: r["locations"][0]["physicalLocation"]["region"]["startLine"]
        for r in json.loads(out)["runs"][0]["results"]
    }
    text = ARGO_WORKFLOW.splitlines()
    assert text[lines["visible-devices-env"] - 1].strip() == "script:"
    assert text[lines["cdi-annotation"] - 1].strip() == "annotations:"


STAY_ADMITTED = """\
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata:
  name: vllm
spec:
  leaderWorkerTemplate:
    size: 4
    leaderTemplate:
      spec:
        containers:
          - name: leader
            image: vllm/vllm-openai:v0.8.5
    workerTemplate:
      spec:
        containers:
          - name: worker
            image: vllm/vllm-openai:v0.8.5
            resources:
              limits:
                nvidia.com/gpu: "1000m"
---
apiVersion: batch/v1
kind: Job
metadata:
  name: quantity-in-exponent-form
spec:
  template:
    spec:
      restartPolicy: Never
      hostUsers: false
      containers:
        - name: main
          image: nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04
          resources:
            limits:
              nvidia.com/gpu: 1e0
---
apiVersion: v1
kind: Pod
metadata:
  name: trainer
spec:
  shareProcessNamespace: true
  initContainers:
    - name: log-shipper
      image: fluent/fluent-bit:3.0
      restartPolicy: Always
  containers:
    - name: trainer
      image: nvcr.io/nvidia/pytorch:24.05-py3
      resources:
        limits:
          nvidia.com/gpu: 8
---
apiVersion: v1
kind: Pod
metadata:
  name: fraction
  annotations:
    gpu-fraction: "0.5"
    runai/shared-gpu-configmap: fraction-7b2kx9q-shared-gpu
spec:
  schedulerName: kai-scheduler
  containers:
    - name: gpu-workload
      image: nvcr.io/nvidia/pytorch:24.05-py3
      env:
        - name: NVIDIA_VISIBLE_DEVICES
          valueFrom:
            configMapKeyRef:
              name: fraction-7b2kx9q-shared-gpu-0
              key: NVIDIA_VISIBLE_DEVICES
"""


def test_the_workloads_the_round_3_rules_must_keep_admitting(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """A LeaderWorkerSet's CPU leader and GPU workers (1000m), a GPU quantity written 1e0 with hostUsers: false, a
    trainer with a native sidecar and a shared process namespace, a KAI fraction pod in KAI's shape: none rejected."""
    path = write(tmp_path, "stay.yaml", STAY_ADMITTED)
    code, report = check_json(capsys, monkeypatch, str(path))
    assert code == 0
    assert [(r["name"], r["path"], r["verdict"], r["pinned"]) for r in report["results"]] == [
        ("vllm", "spec.leaderWorkerTemplate.leaderTemplate", "mutated", ["leader"]),
        ("vllm", "spec.leaderWorkerTemplate.workerTemplate", "allowed", []),
        ("quantity-in-exponent-form", "spec.template", "allowed", []),
        ("trainer", "", "mutated", ["log-shipper"]),
        ("fraction", "", "allowed", []),
    ]


# --- manifests held in strings: Argo Workflows resource templates ----------------------------------------------

ARGO_RESOURCES = """\
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata:
  generateName: train-
  namespace: ml
spec:
  entrypoint: main
  templates:
    - name: launch
      resource:
        action: create
        manifest: |
          apiVersion: v1
          kind: Pod
          metadata:
            generateName: trainer-
          spec:
            containers:
              - name: trainer
                image: nvcr.io/nvidia/pytorch:24.05-py3
                securityContext: {privileged: y}
    - name: job
      resource:
        action: apply
        manifest: |
          apiVersion: batch/v1
          kind: Job
          metadata: {name: prep, namespace: data}
          spec:
            template:
              spec:
                containers: [{name: prep, image: busybox}]
          ---
          apiVersion: v1
          kind: ConfigMap
          metadata: {name: settings}
    - name: steps
      steps:
        - - name: inline
            inline:
              resource:
                action: create
                manifest: "apiVersion: v1\\nkind: Pod\\nmetadata: {name: quoted}\\nspec:\\n  hostPID: true\\n\\
                  \\  containers: [{name: a, image: x}]\\n"
    - name: templated
      resource:
        action: create
        manifest: |
          apiVersion: v1
          kind: Pod
          metadata: {name: p}
          spec:
            containers: [{name: a, image: {{inputs.parameters.image}}}]
    - name: scale
      resource:
        action: patch
        manifest: |
          spec: {replicas: 0}
    - name: cleanup
      resource:
        action: delete
        manifest: |
          apiVersion: v1
          kind: Pod
          metadata: {name: gone}
"""


def test_argo_resource_manifests_are_checked_as_the_objects_they_create(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    path = write(tmp_path, "workflow.yaml", ARGO_RESOURCES)
    code, out, err = run_check(capsys, monkeypatch, "--format", "json", str(path))
    assert code == 1
    report = json.loads(out)
    rows = [
        (r["kind"], r["name"], r["namespace"], r["path"], r["verdict"], [v["rule"] for v in r["violations"]])
        for r in report["results"]
    ]
    assert rows == [
        ("Workflow", "train-*", "ml", "spec.templates[0].resource.manifest", "rejected", ["privileged"]),
        ("Workflow", "train-*", "data", "spec.templates[1].resource.manifest#1 > spec.template", "mutated", []),
        (
            "Workflow",
            "train-*",
            "ml",
            "spec.templates[2].steps[0][0].inline.resource.manifest",
            "rejected",
            ["host-pid"],
        ),
    ]
    # the ConfigMap is no pod spec; the templated manifest does not parse: skipped, and said
    assert report["summary"]["skipped"] == 1
    text = ARGO_RESOURCES.splitlines()
    templated = text.index("            containers: [{name: a, image: {{inputs.parameters.image}}}]") + 1
    patch = text.index("          spec: {replicas: 0}")  # the line of `manifest: |` above it
    assert err.splitlines() == [
        f"gpu-fence-webhook check: warning: {path}:{templated}: kubectl cannot read it: a mapping is used as a "
        "mapping key; the manifest of spec.templates[3].resource.manifest is not checked (Argo substitutes {{...}} "
        "parameters only when it runs: quote them)",
        f"gpu-fence-webhook check: warning: {path}:{patch}: spec.templates[4].resource.manifest is a patch "
        "(action: patch), not checked: check the object it patches",
    ]
    # lines point into the literal block; a quoted string's objects are all on its line
    code, out, _ = run_check(capsys, monkeypatch, str(path), "--format", "sarif")
    located = [
        (r["ruleId"], r["locations"][0]["physicalLocation"]["region"]["startLine"])
        for r in json.loads(out)["runs"][0]["results"]
    ]
    assert located == [
        ("privileged", text.index("              - name: trainer") + 1),
        ("host-pid", next(n for n, line in enumerate(text, 1) if 'manifest: "apiVersion' in line)),
    ]


def test_every_option_of_check_is_documented_in_its_options_table() -> None:
    [check] = [
        choice
        for action in cli.build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, choice in action.choices.items()
        if name == "check"
    ]
    text = (HERE.parents[1] / "docs" / "check.md").read_text()
    table = text[text.index("| option | meaning |") : text.index("## Exit codes")]
    synopsis = text[text.index("gpu-fence-webhook check PATH...") : text.index("| option | meaning |")]
    longs = [
        max(action.option_strings, key=len)
        for action in check._actions
        if action.option_strings and action.dest not in ("help", "debug")
    ]
    assert longs
    for option in longs:
        assert f"| `{option}" in table, option
        assert option in synopsis, option


def workflow_creating(manifest: str, name: str) -> str:
    """A Workflow whose one resource template creates ``manifest``, as JSON (a YAML text too)."""
    template = {"name": "t", "resource": {"action": "create", "manifest": manifest}}
    return json.dumps(
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": name},
            "spec": {"templates": [template]},
        }
    )


def test_manifests_in_strings_are_followed_four_deep(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    text = BYPASS_POD
    for level in range(5):
        text = workflow_creating(text, f"w{level}")
        if level == 3:
            four_deep = write(tmp_path, "four.yaml", text)
    five_deep = write(tmp_path, "five.yaml", text)
    code, out, err = run_check(capsys, monkeypatch, "--format", "json", str(four_deep))
    assert (code, err) == (1, "")
    [result] = json.loads(out)["results"]
    assert result["path"] == " > ".join(["spec.templates[0].resource.manifest"] * 4)
    assert (result["kind"], result["name"], result["namespace"]) == ("Workflow", "w3", "team-a")
    code, out, err = run_check(capsys, monkeypatch, "--format", "json", "--allow-empty", str(five_deep))
    assert code == 0
    assert json.loads(out)["summary"]["skipped"] == 1
    assert err.splitlines() == [
        f"gpu-fence-webhook check: warning: {five_deep}:1: "
        + " > ".join(["spec.templates[0].resource.manifest"] * 5)
        + " not checked: manifests held in strings more than 4 deep"
    ]


def test_one_manifest_string_repeated_through_aliases_is_read_within_a_budget(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    monkeypatch.setattr(check, "MAX_DOCUMENT_BYTES", 1000)
    lines = [
        "apiVersion: argoproj.io/v1alpha1",
        "kind: Workflow",
        "metadata: {name: w}",
        "spec:",
        "  templates:",
        f"    - {{name: t0, resource: {{action: create, manifest: &m {json.dumps(BYPASS_POD)}}}}}",
        *(f"    - {{name: t{n}, resource: {{action: create, manifest: *m}}}}" for n in range(1, 6)),
    ]
    path = write(tmp_path, "aliases.yaml", "\n".join(lines) + "\n")
    code, out, err = run_check(capsys, monkeypatch, "--format", "json", str(path))
    assert code == 1
    report = json.loads(out)
    read = len(report["results"])
    assert read == 1000 // len(BYPASS_POD)
    assert report["summary"]["skipped"] == 6 - read
    assert len(err.splitlines()) == 6 - read
    assert err.splitlines()[-1].endswith(
        "spec.templates[5].resource.manifest not checked: the manifests held in strings of one document pass "
        "0.000953674 MiB in all"
    )


KSERVE_MULTINODE = """\
apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata:
  name: llama
  namespace: serving
spec:
  predictor:
    containers:
      - name: kserve-container
        image: vllm/vllm-openai:v0.8.5
        resources:
          limits: {nvidia.com/gpu: 1}
    workerSpec:
      tensorParallelSize: 1
      pipelineParallelSize: 2
      containers:
        - name: worker-container
          image: vllm/vllm-openai:v0.8.5
          securityContext: {privileged: true}
"""


def test_a_pod_spec_beside_another_is_reported_at_its_own_path_and_lines(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    path = write(tmp_path, "isvc.yaml", KSERVE_MULTINODE)
    code, report = check_json(capsys, monkeypatch, str(path))
    assert code == 1
    assert [(r["path"], r["verdict"]) for r in report["results"]] == [
        ("spec.predictor", "allowed"),
        ("spec.predictor.workerSpec", "rejected"),
    ]
    code, out, _ = run_check(capsys, monkeypatch, str(path), "--format", "sarif")
    [result] = json.loads(out)["runs"][0]["results"]
    text = KSERVE_MULTINODE.splitlines()
    assert text[result["locations"][0]["physicalLocation"]["region"]["startLine"] - 1].strip() == (
        "- name: worker-container"
    )
    assert result["locations"][0]["logicalLocations"][0]["fullyQualifiedName"] == (
        "InferenceService/serving/llama/spec.predictor.workerSpec"
    )


def test_a_broken_manifest_in_a_string_is_named_without_a_guess(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    workflow = workflow_creating("apiVersion: v1\nkind: [Pod\n", "w")
    path = write(tmp_path, "broken.yaml", workflow + "\n---\n" + GPU_POD)
    code, out, err = run_check(capsys, monkeypatch, "--format", "json", str(path))
    assert code == 0
    assert json.loads(out)["summary"]["skipped"] == 1
    assert err.splitlines() == [
        f"gpu-fence-webhook check: warning: {path}:1: YAML does not parse: did not find expected ',' or ']'; the "
        "manifest of spec.templates[0].resource.manifest is not checked"
    ]
