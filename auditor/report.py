"""The ``once`` report in three formats: ``text`` (people), ``json`` (a contract, see docs/auditor.md), ``junit`` (CI).

Pure rendering of a snapshot and its audit result; the caller writes the string where it belongs.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from .model import (
    ActivityUnknown,
    AuditResult,
    ClaimedDevice,
    ContainerRef,
    DraResolution,
    Finding,
    NodeSnapshot,
    Row,
)

FORMATS = ("text", "json", "junit")
#: Why a container's activity on a device is unknown, in the words of the junit output (docs/metrics.md).
_UNKNOWN_ACTIVITY = {
    ActivityUnknown.MIG: "NVML does not sample MIG devices",
    ActivityUnknown.MPS: "MPS clients on the GPU: NVML reports their work under the MPS server's pid",
    ActivityUnknown.NOT_SUPPORTED: "the driver does not report per-process utilisation",
    ActivityUnknown.ERROR: "NVML could not be read whole this cycle",
}


def rfc3339(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render(fmt: str, snapshot: NodeSnapshot, result: AuditResult) -> str:
    if fmt == "json":
        return json.dumps(to_json(snapshot, result), indent=2) + "\n"
    if fmt == "junit":
        return to_junit(snapshot, result)
    if fmt == "text":
        return to_text(snapshot, result)
    raise ValueError(f"unknown report format {fmt!r}; use one of {', '.join(FORMATS)}")


def physical_gpu_count(snapshot: NodeSnapshot) -> int:
    return sum(1 for gpu in snapshot.gpus if not gpu.is_mig)


def to_json(snapshot: NodeSnapshot, result: AuditResult) -> dict[str, Any]:
    """The JSON report. The keys of the contract are fixed; the extra keys here may grow."""
    return {
        "node": snapshot.node,
        "time": rfc3339(snapshot.time),
        "summary": {
            "containers": len(result.rows),
            "gpus": physical_gpu_count(snapshot),
            "findings": len(result.findings),
            "devices": len(snapshot.gpus),
            "identity": snapshot.identity_source.value,
            "dra_slices": snapshot.dra_slices.value,
        },
        "containers": [_row_json(row) for row in result.rows],
        "findings": [_finding_json(finding) for finding in result.findings],
        "unattributed_memory_bytes": dict(result.unattributed_memory_bytes),
        "gpus": [
            {
                "uuid": gpu.uuid,
                "index": gpu.index,
                "minor": gpu.minor,
                "model": gpu.model,
                "memory_total_bytes": gpu.memory_total_bytes,
                "parent_uuid": gpu.parent_uuid,
                "mig_profile": gpu.profile or None,
            }
            for gpu in snapshot.gpus
        ],
        "offered_replicas": None if snapshot.offered_replicas is None else dict(snapshot.offered_replicas),
        "notes": list(snapshot.notes),
    }


def _row_json(row: Row) -> dict[str, Any]:
    return {
        **_ref_json(row.ref),
        "allocated": list(row.allocated),
        "visible": None if row.visible is None else list(row.visible),
        "used": list(row.used),
        "memory_bytes": dict(row.memory_bytes),
        "allocation_counts": dict(row.allocation_counts),
        "exempt": row.exempt,
        "identity": row.identity.value,
        "labels": dict(row.labels),
        "unknown_memory_processes": dict(row.unknown_memory_processes),
        "gpu_activity": {
            uuid: {
                "sm": busy.sm,
                "memory_controller": busy.memory_controller,
                "encoder": busy.encoder,
                "decoder": busy.decoder,
            }
            for uuid, busy in row.activity
        },
        "gpu_activity_unknown": {uuid: why.value for uuid, why in row.activity_unknown},
        "unconfirmed_allocations": list(row.unconfirmed_allocations),
        "claims": _claims(row),
        "incomplete": [limit.value for limit in row.view_limits],
        "nested_pod_uids": list(row.nested_pod_uids),
        "dra_devices": [_claimed_json(device) for device in row.dra_devices],
    }


def _claims(row: Row) -> dict[str, str | None] | None:
    """What a container known by uid says it is: shown as its claim, never used as its names."""
    if row.claimed_namespace is None and row.claimed_pod is None:
        return None
    return {"namespace": row.claimed_namespace, "pod": row.claimed_pod}


def _claimed_json(device: ClaimedDevice) -> dict[str, Any]:
    return asdict(device) | {"cdi_devices": list(device.cdi_devices), "resolution": device.resolution.value}


def _finding_json(finding: Finding) -> dict[str, Any]:
    ref = finding.ref
    return {
        "kind": finding.kind.value,
        "namespace": ref.namespace,
        "pod": ref.pod,
        "container": ref.container,
        "gpu": finding.gpu,
        "pid": finding.pid,
        "memory_bytes": finding.memory_bytes,
        "message": finding.message,
        "pod_uid": ref.pod_uid,
        "container_id": ref.container_id,
    }


def _ref_json(ref: ContainerRef) -> dict[str, str | None]:
    return {
        "namespace": ref.namespace,
        "pod": ref.pod,
        "pod_uid": ref.pod_uid,
        "container": ref.container,
        "container_id": ref.container_id,
    }


def _short(uuids: tuple[str, ...] | None) -> str:
    if uuids is None:
        return "?"
    return ",".join(uuid[:12] for uuid in uuids) or "-"


def _memory_text(row: Row) -> str:
    """The row's memory, saying "unknown" instead of 0 for processes NVML gave no size for."""
    unknown = sum(count for _, count in row.unknown_memory_processes)
    memory = sum(size for _, size in row.memory_bytes)
    if unknown and not memory:
        return "unknown"
    text = f"{memory / 2**20:.0f} MiB"
    if unknown:
        text += f" + {unknown} process{'es' if unknown > 1 else ''} unknown"
    return text


def _sm_cells(row: Row) -> list[str]:
    """The row's SM activity per device it uses or holds, in UUID order: a share of time, or why it is unknown."""
    cells = {uuid: f"{busy.sm:.2f}" for uuid, busy in row.activity}
    cells.update((uuid, f"unknown ({why.value})") for uuid, why in row.activity_unknown)
    return [cells[uuid] for uuid in sorted(cells)]


def to_text(snapshot: NodeSnapshot, result: AuditResult) -> str:
    lines = [
        f"node {snapshot.node} at {rfc3339(snapshot.time)}: {len(result.rows)} containers, "
        f"{physical_gpu_count(snapshot)} GPUs ({len(snapshot.gpus)} devices), {len(result.findings)} findings "
        f"[identity: {snapshot.identity_source.value}]",
    ]
    lines.extend(f"note: {note}" for note in snapshot.notes)
    gpu_rows = [row for row in result.rows if row.allocated or row.used or row.visible]
    if gpu_rows:
        lines.append("")
        lines.append(f"{'CONTAINER':<48} {'ALLOCATED':<26} {'VISIBLE':<26} {'USED':<26} {'SM':<14} MEMORY")
        for row in gpu_rows:
            flag = " (exempt)" if row.exempt else ""
            if row.claimed_namespace or row.claimed_pod:
                flag += f" (claims {row.claimed_namespace or '?'}/{row.claimed_pod or '?'})"
            lines.append(
                f"{row.ref.describe()[:48]:<48} "
                f"{_short(row.allocated)[:26]:<26} {_short(row.visible)[:26]:<26} {_short(row.used)[:26]:<26} "
                f"{','.join(_sm_cells(row)) or '-':<14} {_memory_text(row)}{flag}"
            )
    unresolved = [
        (row, device)
        for row in result.rows
        for device in row.dra_devices
        if device.resolution is not DraResolution.RESOLVED
    ]
    if unresolved:
        lines.append("")
    for row, device in unresolved:
        cdi = f" (CDI {', '.join(device.cdi_devices)})" if device.cdi_devices and device.device else ""
        lines.append(
            f"unresolved DRA device: {row.ref.describe()}: {device.describe()}{cdi}: {device.resolution.value}"
        )
    lines.append("")
    if not result.findings:
        lines.append("no findings: every container sees and uses only the GPUs it was allocated")
    for finding in result.findings:
        lines.append(f"{finding.kind.value}: {finding.ref.describe()}: {finding.message}")
    return "\n".join(lines) + "\n"


def to_junit(snapshot: NodeSnapshot, result: AuditResult) -> str:
    """One test case per container (failures = its findings) plus one for processes outside any container."""
    suite = ET.Element(
        "testsuite",
        name=f"gpu-fence-auditor {snapshot.node}",
        timestamp=rfc3339(snapshot.time),
        tests=str(len(result.rows) + 1),
    )
    by_container: dict[ContainerRef, list[Finding]] = {}
    unattributed: list[Finding] = []
    for finding in result.findings:
        ref = finding.ref
        if ref.namespace is None and ref.container_id is None and ref.pod_uid is None:
            unattributed.append(finding)
        else:
            by_container.setdefault(ref, []).append(finding)
    failures = 0
    for row in result.rows:
        ref = row.ref
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"{snapshot.node}.{ref.namespace}.{ref.pod}",
            name=str(ref.container if ref.container is not None else ref.container_id),
        )
        for finding in by_container.pop(ref, []):
            failures += 1
            failure = ET.SubElement(case, "failure", type=finding.kind.value, message=finding.message)
            failure.text = finding.message
        activity = [f"SM activity on {uuid}: {busy.sm:.2f}" for uuid, busy in row.activity]
        activity += [f"SM activity on {uuid}: unknown ({_UNKNOWN_ACTIVITY[why]})" for uuid, why in row.activity_unknown]
        if activity:
            ET.SubElement(case, "system-out").text = "\n".join(sorted(activity))
    leftovers = unattributed + [f for findings in by_container.values() for f in findings]
    case = ET.SubElement(suite, "testcase", classname=f"{snapshot.node}.host", name="unattributed-processes")
    for finding in leftovers:
        failures += 1
        failure = ET.SubElement(case, "failure", type=finding.kind.value, message=finding.message)
        failure.text = finding.message
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
