"""The report formats: the JSON contract's keys, readable text, JUnit that a CI parser accepts."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from gpu_fence.auditor.audit import audit
from gpu_fence.auditor.model import (
    Activity,
    ActivityUnknown,
    ClaimedDevice,
    Container,
    DraResolution,
    Gpu,
    GpuProcess,
    NodeSnapshot,
    SliceState,
)
from gpu_fence.auditor.report import render

G0 = "GPU-00000000-aaaa-bbbb-cccc-000000000000"
G1 = "GPU-11111111-aaaa-bbbb-cccc-111111111111"
SNAPSHOT = NodeSnapshot(
    "node-a",
    1_780_000_000.0,
    (Gpu(G0, 0, 0, "H100", 80 << 30), Gpu(G1, 1, 1, "H100", 80 << 30)),
    (
        Container("ml", "train", "main", "uid-1", "c1", allocated=(G0,), visible=frozenset({G0})),
        Container("web", "cuda", "app", "uid-2", "c2", visible=frozenset({G0, G1})),
    ),
    (
        GpuProcess(10, G0, 1 << 30, "uid-1", "c1"),
        GpuProcess(11, G1, 2 << 30, "uid-2", "c2"),
        GpuProcess(12, G1, 5 << 20, None, None),
    ),
    notes=("kubernetes API unreachable: names from the last list",),
)
RESULT = audit(SNAPSHOT)


def test_json_report_keeps_the_contract_keys():
    report = json.loads(render("json", SNAPSHOT, RESULT))
    assert report["node"] == "node-a" and report["time"] == "2026-05-28T20:26:40Z"
    assert report["summary"] == report["summary"] | {"containers": 2, "gpus": 2, "findings": len(RESULT.findings)}
    contract = {
        "namespace",
        "pod",
        "pod_uid",
        "container",
        "container_id",
        "allocated",
        "visible",
        "used",
        "memory_bytes",
    }
    for row in report["containers"]:
        assert contract <= row.keys()
    train = next(r for r in report["containers"] if r["pod"] == "train")
    assert train["allocated"] == [G0] and train["used"] == [G0] and train["memory_bytes"] == {G0: 1 << 30}
    for finding in report["findings"]:
        assert {"kind", "namespace", "pod", "container", "gpu", "pid", "memory_bytes", "message"} <= finding.keys()
    kinds = sorted(f["kind"] for f in report["findings"])
    assert kinds == ["unattributed-process", "used-unallocated", "visible-unallocated", "visible-unallocated"]
    host = next(f for f in report["findings"] if f["kind"] == "unattributed-process")
    assert host["namespace"] is None and host["pid"] == 12 and host["memory_bytes"] == 5 << 20


def test_text_report_names_findings_notes_and_identity():
    text = render("text", SNAPSHOT, RESULT)
    assert "node node-a" in text and "identity: kubernetes" in text
    assert "note: kubernetes API unreachable" in text
    assert "used-unallocated: web/cuda/app: process 11" in text
    assert "unattributed-process: (no container): process 12" in text


def test_text_report_says_clean_when_clean():
    clean = NodeSnapshot("n", 0.0, SNAPSHOT.gpus, SNAPSHOT.containers[:1], SNAPSHOT.processes[:1])
    assert "no findings" in render("text", clean, audit(clean))


def test_junit_has_one_case_per_container_and_a_failure_per_finding():
    root = ET.fromstring(render("junit", SNAPSHOT, RESULT))
    assert root.tag == "testsuite" and root.get("tests") == "3"
    assert root.get("failures") == str(len(RESULT.findings))
    cases = {case.get("name"): case for case in root.iter("testcase")}
    assert cases["main"].find("failure") is None
    assert {f.get("type") for f in cases["app"].iter("failure")} == {"used-unallocated", "visible-unallocated"}
    assert [f.get("type") for f in cases["unattributed-processes"].iter("failure")] == ["unattributed-process"]


def test_unknown_format_is_a_clear_error():
    with pytest.raises(ValueError, match="use one of text, json, junit"):
        render("yaml", SNAPSHOT, RESULT)


UNKNOWN = NodeSnapshot(
    "node-a",
    1_780_000_000.0,
    SNAPSHOT.gpus,
    (
        Container("ml", "blind", "main", "uid-3", "c3", allocated=(G0,)),
        Container("ml", "half", "main", "uid-4", "c4", allocated=(G1,)),
    ),
    (
        GpuProcess(20, G0, None, "uid-3", "c3"),
        GpuProcess(21, G1, 2 << 20, "uid-4", "c4"),
        GpuProcess(22, G1, None, "uid-4", "c4"),
    ),
)


def test_json_report_counts_processes_of_unknown_memory_beside_the_contract_keys():
    report = json.loads(render("json", UNKNOWN, audit(UNKNOWN)))
    rows = {row["pod"]: row for row in report["containers"]}
    assert rows["blind"]["memory_bytes"] == {G0: 0} and rows["blind"]["unknown_memory_processes"] == {G0: 1}
    assert rows["half"]["memory_bytes"] == {G1: 2 << 20} and rows["half"]["unknown_memory_processes"] == {G1: 1}
    train = json.loads(render("json", SNAPSHOT, RESULT))["containers"][0]
    assert train["unknown_memory_processes"] == {}


def test_text_report_says_unknown_rather_than_zero_memory():
    lines = render("text", UNKNOWN, audit(UNKNOWN)).splitlines()
    blind = next(line for line in lines if line.startswith("ml/blind/main"))
    half = next(line for line in lines if line.startswith("ml/half/main"))
    assert blind.endswith("unknown") and "0 MiB" not in blind
    assert half.endswith("2 MiB + 1 process unknown")


#: A busy container on a time-sliced GPU, and a busy MPS client on a GPU whose activity is unknown (MPS).
MPS = NodeSnapshot(
    "node-a",
    1_780_000_000.0,
    SNAPSHOT.gpus,
    (
        Container("ml", "sliced", "main", "uid-5", "c5", allocated=(G0,)),
        Container("ml", "client", "main", "uid-6", "c6", allocated=(G1,)),
    ),
    (
        GpuProcess(30, G0, 1 << 30, "uid-5", "c5", activity=Activity(sm=0.62)),
        GpuProcess(31, G1, 1 << 30, "uid-6", "c6"),
    ),
    activity_devices=frozenset({G0}),
    activity_unknown=((G1, ActivityUnknown.MPS),),
)


def test_every_format_says_unknown_where_activity_is_unknown_and_keeps_the_number_elsewhere():
    result = audit(MPS)
    rows = {row["pod"]: row for row in json.loads(render("json", MPS, result))["containers"]}
    assert rows["sliced"]["gpu_activity"][G0]["sm"] == 0.62 and rows["sliced"]["gpu_activity_unknown"] == {}
    assert rows["client"]["gpu_activity"] == {} and rows["client"]["gpu_activity_unknown"] == {G1: "mps"}

    lines = render("text", MPS, result).splitlines()
    header = next(line for line in lines if line.startswith("CONTAINER"))
    sliced = next(line for line in lines if line.startswith("ml/sliced/main"))
    client = next(line for line in lines if line.startswith("ml/client/main"))
    column = header.index("SM ")
    assert sliced[column:].startswith("0.62 ") and client[column:].startswith("unknown (mps) ")

    cases = {case.get("classname"): case for case in ET.fromstring(render("junit", MPS, result)).iter("testcase")}
    assert cases["node-a.ml.sliced"].findtext("system-out") == f"SM activity on {G0}: 0.62"
    assert cases["node-a.ml.client"].findtext("system-out") == (
        f"SM activity on {G1}: unknown (MPS clients on the GPU: NVML reports their work under the MPS server's pid)"
    )


def test_dra_devices_are_reported_with_their_claim_names_and_resolution():
    cdi = ("k8s.gpu.nvidia.com/claim=4b1e-gpu-1",)
    held = ClaimedDevice("ml", "gpus", "gpu.nvidia.com", "node-a", "gpu-1", cdi, DraResolution.RESOLVED, G1, "s-2")
    lost = ClaimedDevice("ml", "gpus", "gpu.nvidia.com", "node-a", "gpu-9", (), DraResolution.NO_SLICE)
    snapshot = NodeSnapshot(
        "node-a",
        0.0,
        SNAPSHOT.gpus,
        (Container("ml", "dra", "main", "uid-3", "c3", allocated=(G1,), dra_devices=(held, lost)),),
        (),
        dra_slices=SliceState.STALE,
        offered_replicas=((G0, 4),),
    )
    result = audit(snapshot)
    report = json.loads(render("json", snapshot, result))
    assert report["summary"]["dra_slices"] == "stale" and report["offered_replicas"] == {G0: 4}
    (row,) = report["containers"]
    assert row["allocated"] == [G1]
    assert row["dra_devices"] == [
        {
            "claim_namespace": "ml",
            "claim_name": "gpus",
            "driver": "gpu.nvidia.com",
            "pool": "node-a",
            "device": "gpu-1",
            "cdi_devices": list(cdi),
            "share_id": "s-2",
            "uuid": G1,
            "resolution": "resolved",
        },
        {
            "claim_namespace": "ml",
            "claim_name": "gpus",
            "driver": "gpu.nvidia.com",
            "pool": "node-a",
            "device": "gpu-9",
            "cdi_devices": [],
            "share_id": None,
            "uuid": None,
            "resolution": "no-slice",
        },
    ]
    text = render("text", snapshot, result)
    assert "unresolved DRA device: ml/dra/main: claim ml/gpus: gpu.nvidia.com/node-a/gpu-9: no-slice" in text
    assert "gpu-1: resolved" not in text and "unresolved DRA device" in text.split("\n\n")[-2]
    assert json.loads(render("json", SNAPSHOT, RESULT))["offered_replicas"] is None
