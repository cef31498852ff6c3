"""``/proc/<pid>/cgroup`` text in every layout (v1/v2, systemd/cgroupfs, containerd/CRI-O/docker) → pod + container."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_fence.auditor.cgroups import CONTAINERD, CRIO, DOCKER, CgroupIdentity, parse_cgroup, parse_cgroup_path

UID = "8f1e2c3d-4b5a-4c6d-9e8f-0a1b2c3d4e5f"
UID_ = UID.replace("-", "_")
CID = "0123456789abcdef" * 4
OTHER = "fedcba9876543210" * 4
OUTER = "11111111-1111-4111-8111-111111111111"
OUTER_ = OUTER.replace("-", "_")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        # systemd driver
        (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
            CgroupIdentity(UID, CID, CONTAINERD),
        ),
        (f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope", CgroupIdentity(UID, CID, CONTAINERD)),
        (
            f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{CID}.scope",
            CgroupIdentity(UID, CID, CRIO),
        ),
        (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope",
            CgroupIdentity(UID, CID, DOCKER),
        ),
        # cgroupfs driver
        (f"/kubepods/burstable/pod{UID}/{CID}", CgroupIdentity(UID, CID, None)),
        (f"/kubepods/pod{UID}/{CID}", CgroupIdentity(UID, CID, None)),
        (f"/kubepods/besteffort/pod{UID}/crio-{CID}", CgroupIdentity(UID, CID, CRIO)),
        # not anchored at /kubepods: kind, custom cgroup roots, a reader in a private cgroup namespace
        (
            f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
            f"kubelet-kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
            CgroupIdentity(UID, CID, CONTAINERD),
        ),
        (f"/../../kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope", CgroupIdentity(UID, CID, CONTAINERD)),
        (f"/custom-root/kubepods/pod{UID}/{CID}", CgroupIdentity(UID, CID, None)),
        # a container that made sub-cgroups of its own (systemd inside, nested runtimes)
        (
            f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope/init.scope",
            CgroupIdentity(UID, CID, CONTAINERD),
        ),
        # a path that names two pods: the outer one, which the kubelet made, wins; the inner one is kept to report
        (
            f"/kubepods/pod{OUTER}/{OTHER}/kubepods/pod{UID}/{CID}",
            CgroupIdentity(OUTER, OTHER, None, nested_pod_uid=UID),
        ),
        (
            f"/kubepods.slice/kubepods-pod{OUTER_}.slice/cri-containerd-{OTHER}.scope/"
            f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
            CgroupIdentity(OUTER, OTHER, CONTAINERD, nested_pod_uid=UID),
        ),
        (f"/kubepods/pod{OUTER}/pod{UID}/{CID}", CgroupIdentity(OUTER, None, None, nested_pod_uid=UID)),
        # the container naming its own pod again is no second pod
        (f"/kubepods/pod{UID}/{CID}/pod{UID}", CgroupIdentity(UID, CID, None)),
        # a process in the pod cgroup itself, or under an unknown child
        (f"/kubepods.slice/kubepods-pod{UID_}.slice", CgroupIdentity(UID, None, None)),
        (f"/kubepods/besteffort/pod{UID}/", CgroupIdentity(UID, None, None)),
        (f"/kubepods/besteffort/pod{UID}/container123", CgroupIdentity(UID, None, None)),
        # runtimes started with another --cgroup-parent prefix (cadvisor's ".+-<id>.scope")
        (f"/kubepods.slice/kubepods-pod{UID_}.slice/containerd-{CID}.scope", CgroupIdentity(UID, CID, None)),
        # static pods: the uid is a 32-hex config hash
        (
            f"/kubepods.slice/kubepods-pod{'a' * 32}.slice/cri-containerd-{CID}.scope",
            CgroupIdentity("a" * 32, CID, CONTAINERD),
        ),
    ],
)
def test_every_layout(path: str, expected: CgroupIdentity) -> None:
    assert parse_cgroup_path(path) == expected
    assert parse_cgroup(f"0::{path}\n") == expected


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/system.slice/docker.service",
        "/system.slice/containerd.service",
        f"/system.slice/docker-{CID}.scope",  # a docker container outside Kubernetes
        "/kubepods/pod123/container",  # uid too short (dcgm-exporter's negative vector)
        "/kubepods.slice/kubepods-burstable.slice",
        f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope",  # CRI-O's monitor, not a container
        f"/kubepods/pod{UID.upper()}/{CID}",
        f"/kubepods/pods{UID}/{CID}",
        f"/user.slice/user-1000.slice/session-2.scope/pod{UID}x",
        # pod-like names where the kubelet never puts a pod: made by something outside Kubernetes
        f"/system.slice/foo.service/pod{UID}/{CID}",
        f"/system.slice/docker-{OTHER}.scope/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
        f"/kubepods.slice/other-pod{UID_}.slice/cri-containerd-{CID}.scope",
        f"/kubepods/burstable/x-pod{UID}/{CID}",
    ],
)
def test_outside_pods_and_runtime_helpers_give_none(path: str) -> None:
    assert parse_cgroup_path(path) is None
    assert parse_cgroup(f"0::{path}\n") is None


def test_v1_prefers_a_real_controller_over_name_systemd() -> None:
    text = "\n".join(
        [
            "12:name=systemd:/kubepods/pod00000000-0000-0000-0000-000000000000/" + OTHER,
            f"11:memory:/kubepods/burstable/pod{UID}/{CID}",
            f"10:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}",
            f"9:pids:/kubepods/burstable/pod{UID}/{CID}",
            "1:net_cls,net_prio:/",
            "0::/",
        ]
    )
    assert parse_cgroup(text) == CgroupIdentity(UID, CID, None)


def test_v1_never_mixes_hierarchies_and_prefers_a_line_that_names_the_container() -> None:
    text = f"5:devices:/kubepods/pod{UID}\n4:memory:/kubepods/pod{UID}/{CID}\n"
    assert parse_cgroup(text) == CgroupIdentity(UID, CID, None)


def test_hybrid_host_reads_the_v1_controllers() -> None:
    text = (
        f"1:name=systemd:/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope\n"
        f"4:memory:/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope\n"
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope\n"
    )
    assert parse_cgroup(text) == CgroupIdentity(UID, CID, DOCKER)


@pytest.mark.parametrize("text", ["", "\n\n", "garbage", "0:/no-path-field", "::", "0::", "zombie\n"])
def test_empty_or_malformed_files_give_none(text: str) -> None:
    assert parse_cgroup(text) is None


# --- properties: generated uids and ids in every layout round-trip to the same identity ------------------------------

SYSTEMD_QOS = "/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid_}.slice"
LAYOUTS = {
    "systemd-containerd": (SYSTEMD_QOS + "/cri-containerd-{cid}.scope", CONTAINERD),
    "systemd-guaranteed": ("/kubepods.slice/kubepods-pod{uid_}.slice/cri-containerd-{cid}.scope", CONTAINERD),
    "systemd-crio": (SYSTEMD_QOS + "/crio-{cid}.scope", CRIO),
    "systemd-docker": (SYSTEMD_QOS + "/docker-{cid}.scope", DOCKER),
    "cgroupfs": ("/kubepods/{qos}/pod{uid}/{cid}", None),
    "cgroupfs-guaranteed": ("/kubepods/pod{uid}/{cid}", None),
    "cgroupfs-crio": ("/kubepods/{qos}/pod{uid}/crio-{cid}", CRIO),
    "kind": (
        "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-{qos}.slice/"
        "kubelet-kubepods-{qos}-pod{uid_}.slice/cri-containerd-{cid}.scope",
        CONTAINERD,
    ),
    "cgroup-namespace": ("/../../kubepods-{qos}-pod{uid_}.slice/crio-{cid}.scope", CRIO),
}
container_ids = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
prefixes = st.sampled_from(["", "/../..", "/custom.slice", "/a/b/c"])


@given(
    uid=st.uuids().map(str),
    cid=container_ids,
    layout=st.sampled_from(sorted(LAYOUTS)),
    qos=st.sampled_from(["burstable", "besteffort"]),
    prefix=prefixes,
    v1=st.booleans(),
)
def test_generated_identities_round_trip(  # noqa: PLR0917 - hypothesis passes each drawn value by name
    uid: str, cid: str, layout: str, qos: str, prefix: str, v1: bool
) -> None:
    template, runtime = LAYOUTS[layout]
    path = prefix + template.format(uid=uid, uid_=uid.replace("-", "_"), cid=cid, qos=qos)
    if v1:
        text = f"12:name=systemd:/\n11:pids:{path}\n4:memory:{path}\n2:cpu,cpuacct:{path}\n1:net_cls:/\n"
    else:
        text = f"0::{path}\n"
    assert parse_cgroup(text) == CgroupIdentity(uid, cid, runtime)


@given(
    outer=st.uuids().map(str),
    inner=st.uuids().map(str),
    cid=container_ids,
    layout=st.sampled_from(sorted(LAYOUTS)),
    nested=st.sampled_from(sorted(LAYOUTS)),
    qos=st.sampled_from(["burstable", "besteffort"]),
    between=st.sampled_from(["", "/init.scope", "/a/b"]),
)
def test_a_nested_pod_never_takes_the_process_from_its_container(  # noqa: PLR0917 - hypothesis passes them by name
    outer: str, inner: str, cid: str, layout: str, nested: str, qos: str, between: str
) -> None:
    """Whatever a container names the cgroups it makes below its own, the process stays in that container."""
    template, runtime = LAYOUTS[layout]
    inner_template, _ = LAYOUTS[nested]
    path = template.format(uid=outer, uid_=outer.replace("-", "_"), cid=cid, qos=qos) + between
    path += inner_template.format(uid=inner, uid_=inner.replace("-", "_"), cid=OTHER, qos=qos)
    found = parse_cgroup(f"0::{path}\n")
    assert found == CgroupIdentity(outer, cid, runtime, nested_pod_uid=inner if inner != outer else None)


@given(st.text(max_size=300))
def test_arbitrary_text_never_raises(text: str) -> None:
    result = parse_cgroup(text)
    assert result is None or isinstance(result, CgroupIdentity)
