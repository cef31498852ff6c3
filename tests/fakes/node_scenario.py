"""THE scenario builder: describe a GPU node once, get every fake it needs, and the CLI args to audit it.

One ``NodeScenario`` sets up, under one directory:
- the fake NVML configuration (``FAKE_NVML_CONFIG``) and the compiled fake ``libnvidia-ml.so.1`` (``--nvml-lib``);
- a real gRPC PodResources server on a unix socket (``--pod-resources-socket``);
- a host /proc tree with real cgroup files, environments and ``/dev/nvidia*`` character devices (``--host-proc``);
- optionally the Kubernetes API fake with the node's pods (``--kubeconfig``).

Describe pods with ``add_pod(...)`` and ``Ctr(...)``, host GPU processes with ``add_host_gpu_process``, filler
host processes with ``host_processes=N``; then ``start()`` and ``args()``. A ``Ctr`` can also be hostile: what it
writes in its root (a spoofed namespace file, a FIFO, a symlink to a host file, a flooded ``/dev``), a lowest process
that chroots into an empty tree or unshares its mounts and re-execs with another environment, GPU processes in a
cgroup below its own named after another pod. Devices are named by GPU index (``0``),
MIG slot (``"0:3"``: GPU 0, slot 3) or a literal UUID. ``dense_node()`` builds the benchmark's node (8 GPUs × 7 MIG
slices, 110 pods × 4 containers, ~2,000 GPU processes, 30,000 host processes) and is linear in its sizes.

Making device nodes needs CAP_MKNOD (root), as the host-proc tree does.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fakes.hostproc_tree import RUNTIMES, HostProcTree, cgroup_text, flood_dev, nested_pod_cgroup
from tests.fakes.kubeapi_pods_events import FakeKubeApi, make_pod
from tests.fakes.kubeapi_resourceslices import (
    DRIVER as DRA_DRIVER,
)
from tests.fakes.kubeapi_resourceslices import (
    DraGpu,
    DraMig,
    compute_domain_slice,
    gpu_name,
    mig_name,
    nvidia_slice,
)
from tests.fakes.nvml import (
    GIB,
    FakeError,
    FakeGpu,
    FakeMig,
    FakeMpsServer,
    FakeNvmlConfig,
    FakeProcess,
    FakeUtilSample,
    build_fake_nvml,
    fake_gpu_uuid,
    fake_mig_uuid,
)
from tests.fakes.podresources_server import FakeKubelet, claim, claim_device, container, pod

NVML_BUILD_DIR = Path(__file__).parent / "nvml" / "build"
Device = int | str  # GPU index, "gpu:slot" MIG slot, or a literal GPU-/MIG- UUID


def uuid_of(device: Device) -> str:
    if isinstance(device, int):
        return fake_gpu_uuid(device)
    if ":" in device and not device.startswith(("GPU-", "MIG-")):
        gpu, slot = device.split(":")
        return fake_mig_uuid(int(gpu), int(slot))
    return device


def _stable_id(*parts: object, length: int = 64) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:length]


def _uid(*parts: object) -> str:
    h = _stable_id("uid", *parts, length=32)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass(frozen=True)
class DraRef:
    """A DRA device named literally, as the kubelet reports it (a device no slice describes, another driver's)."""

    pool: str
    device: str
    driver: str = DRA_DRIVER
    cdi: tuple[str, ...] = ()


@dataclass
class Ctr:
    """One container: what the kubelet allocated, what it can see, what it runs on the GPUs.

    ``allocated``: devices the kubelet gave it (``device_ids`` overrides the raw ids, e.g. ``GPU-x::3``).
    ``visible``: devices whose ``/dev/nvidia<minor>`` is in its root (a MIG slot shows its card), or ``"all"``.
    ``processes``: ``(device, bytes)`` per GPU process. ``env``: its environment (NVIDIA_VISIBLE_DEVICES, ...).
    ``dra``: devices it holds through one DRA claim (``claim``, default ``<name>-gpu``, in the pod's namespace;
    containers naming the same claim share it): a node device, named as the scenario's driver release names it in
    pool ``<node>``, or a :class:`DraRef`. ``share_id``: the kubelet's share id of every device of the claim.
    ``running=False``: listed by the kubelet but no process on the host (not started yet).
    ``activity``: ``(sm, memory, encoder, decoder)`` percent per GPU process, in the order of ``processes`` (fewer
    entries leave the last processes idle): live utilisation samples in the fake NVML, new every sampling period.
    ``mps``: its GPU processes are MPS clients (NVML's MPS list; where the device has an MPS server, the compute list
    too, and their samples are the server's). ``mps_server``: its first GPU process is that device's MPS server
    (``nvidia-cuda-mps-server``, which the GPU Operator's device plugin runs in its MPS control daemon pod).

    What a hostile container does: ``namespace_file`` is what it wrote in its service-account namespace file (else
    the pod's namespace); ``plant`` plants more in its root (called with the root's path); ``dev_flood`` adds that
    many entries to its ``/dev``; ``extra_processes`` runs more plain processes; ``lowest`` makes its lowest pid
    ``"chroot"`` into an empty tree or ``"unshare"`` its mounts and cover ``/dev``, and ``lowest_env`` re-exec it with
    that environment; ``nested_pod`` puts its GPU processes in a cgroup below its own named after that pod's first
    container.
    """

    name: str
    allocated: Sequence[Device] = ()
    resource: str = "nvidia.com/gpu"
    device_ids: Sequence[str] | None = None
    visible: Sequence[Device] | str = ()
    processes: Sequence[tuple[Device, int | None]] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    dra: Sequence[Device | DraRef] = ()
    claim: str | None = None
    share_id: str | None = None
    running: bool = True
    namespace_file: str | None = None
    plant: Callable[[Path], None] | None = None
    dev_flood: int = 0
    extra_processes: int = 0
    lowest: str = ""
    lowest_env: Mapping[str, str] | None = None
    nested_pod: str | None = None
    container_id: str = ""
    pids: list[int] = field(default_factory=list)
    activity: Sequence[tuple[int, int, int, int]] = ()
    mps: bool = False
    mps_server: Device | None = None

    @property
    def gpu_pids(self) -> list[int]:
        """The pids of its GPU processes, in the order of ``processes``."""
        return self.pids[1 : 1 + len(self.processes)]


def replica_holder(
    device: Device,
    replica: int,
    used_bytes: int | None,
    *,
    processes: int = 1,
    name: str = "main",
    resource: str = "nvidia.com/gpu.shared",
    activity: tuple[int, int, int, int] | None = None,
    mps: bool = False,
) -> Ctr:
    """A container holding replica ``replica`` of a shared (time-sliced or MPS) device, as NVIDIA's device plugin
    allocates it (``<uuid>::<replica>``): it sees the device, names it in ``NVIDIA_VISIBLE_DEVICES`` and runs
    ``processes`` processes of ``used_bytes`` each on it (each busy as ``activity`` says, when given; MPS clients
    with ``mps``)."""
    return Ctr(
        name,
        allocated=[device],
        device_ids=[f"{uuid_of(device)}::{replica}"],
        resource=resource,
        visible=[device],
        processes=[(device, used_bytes)] * processes,
        env={"NVIDIA_VISIBLE_DEVICES": uuid_of(device)},
        activity=[activity] * processes if activity is not None else (),
        mps=mps,
    )


@dataclass
class Pod:
    namespace: str
    name: str
    containers: list[Ctr]
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    scheduler_name: str = "default-scheduler"
    layout: str = "systemd-containerd"
    v1: bool = False
    uid: str = ""
    in_api: bool = True
    sandbox_pid: int = 0


class NodeScenario:
    def __init__(
        self,
        root: Path,
        *,
        node: str = "node-a",
        gpus: int = 2,
        mig_slots: Mapping[int, int] | None = None,
        gpu_name: str = "NVIDIA H100 80GB HBM3",
        host_processes: int = 0,
        kubernetes: bool = True,
        util_period_us: int | None = None,
        minors: Mapping[int, int] | None = None,
        dra_release: str | None = None,
        slice_versions: Sequence[str] | None = None,
    ) -> None:
        """``minors``: GPU index → minor (``/dev/nvidia<minor>``), default the index. ``dra_release``: publish the
        slices NVIDIA's DRA driver of that release publishes (``kubeapi_resourceslices.RELEASES``; None: none);
        ``slice_versions``: the resource.k8s.io versions the API serves (default all three). ``util_period_us``:
        the fake driver's sampling period for live utilisation samples."""
        self.root = Path(root)
        self.util_period_us = util_period_us
        self.node = node
        self.gpu_count = gpus
        self.mig_slots = dict(mig_slots or {})
        self.minors = {index: (minors or {}).get(index, index) for index in range(gpus)}
        self.dra_release = dra_release
        self.slice_versions = tuple(slice_versions) if slice_versions is not None else None
        self.gpu_name = gpu_name
        self.host_process_count = host_processes
        self.kubernetes = kubernetes
        self.pods: list[Pod] = []
        self.host_gpu_processes: list[tuple[int, Device, int | None]] = []
        self.host_mps_servers: set[int] = set()  # pids of host GPU processes that are MPS servers
        self.nvml_errors: list[FakeError] = []
        self._next_pid = 1000
        self.proc: HostProcTree | None = None
        self.kubelet: FakeKubelet | None = None
        self.api: FakeKubeApi | None = None
        self.library: Path | None = None

    # --- describing the node -------------------------------------------------------------------------------

    def pid(self) -> int:
        self._next_pid += 1
        return self._next_pid

    def add_pod(self, namespace: str, name: str, *containers: Ctr, **options: Any) -> Pod:
        new = Pod(namespace, name, list(containers), **options)
        new.uid = new.uid or _uid(self.node, namespace, name)
        for number, ctr in enumerate(new.containers):
            ctr.container_id = ctr.container_id or _stable_id(new.uid, ctr.name, number)
        self.pods.append(new)
        return new

    def add_host_gpu_process(self, device: Device, used_bytes: int | None = GIB, *, mps_server: bool = False) -> int:
        """A GPU process outside any pod; ``mps_server``: the device's MPS server, as ``nvidia-cuda-mps-control -d``
        run on the host starts it."""
        pid = self.pid()
        self.host_gpu_processes.append((pid, device, used_bytes))
        if mps_server:
            self.host_mps_servers.add(pid)
        return pid

    def nvml_config(self) -> FakeNvmlConfig:
        gpus = tuple(
            FakeGpu(index=i, name=self.gpu_name, mig=i in self.mig_slots, minor=self.minors[i])
            for i in range(self.gpu_count)
        )
        migs = tuple(
            FakeMig(gpu_index=g, slot=s, gpu_instance_id=7 + s, slices=1, memory_total_bytes=10 * GIB)
            for g, count in sorted(self.mig_slots.items())
            for s in range(count)
        )
        processes: list[FakeProcess] = []
        servers = [
            FakeMpsServer(uuid_of(device), pid, size)
            for pid, device, size in self.host_gpu_processes
            if pid in self.host_mps_servers
        ]
        for p in self.pods:
            for ctr in p.containers:
                for pid, (device, size) in zip(ctr.gpu_pids, ctr.processes, strict=True):
                    if ctr.mps_server is not None and pid == ctr.gpu_pids[0]:
                        servers.append(FakeMpsServer(uuid_of(ctr.mps_server), pid, size))
                    else:
                        kind = "mps" if ctr.mps else "compute"
                        processes.append(
                            FakeProcess(device=uuid_of(device), pid=pid, used_memory_bytes=size, kind=kind)
                        )
        processes += [
            FakeProcess(device=uuid_of(device), pid=pid, used_memory_bytes=size)
            for pid, device, size in self.host_gpu_processes
            if pid not in self.host_mps_servers
        ]
        samples = tuple(
            FakeUtilSample(uuid_of(device), pid, *busy)
            for p in self.pods
            for ctr in p.containers
            for pid, (device, _), busy in zip(ctr.pids[1:], ctr.processes, ctr.activity, strict=False)
        )
        return FakeNvmlConfig(
            gpus=gpus,
            migs=migs,
            processes=tuple(processes),
            errors=tuple(self.nvml_errors),
            samples=samples,
            util_period_us=self.util_period_us,
            mps_servers=tuple(servers),
        )

    def _minor(self, device: Device) -> int:
        uuid = uuid_of(device)
        for index in range(self.gpu_count):
            if uuid == fake_gpu_uuid(index) or uuid.startswith(f"MIG-{index:08x}-"):
                return self.minors[index]
        raise ValueError(f"{device!r} is no device of this node")

    # --- DRA -----------------------------------------------------------------------------------------------------

    def dra_gpus(self) -> list[DraGpu]:
        return [DraGpu(i, self.minors[i], fake_gpu_uuid(i), self.gpu_name) for i in range(self.gpu_count)]

    def dra_migs(self) -> list[DraMig]:
        cards = self.dra_gpus()
        return [
            DraMig(cards[g], fake_mig_uuid(g, s), "1g.10gb", placement_start=s)
            for g, count in sorted(self.mig_slots.items())
            for s in range(count)
        ]

    def resource_slices(self) -> list[dict[str, Any]]:
        """What the DRA drivers of this node publish: NVIDIA's GPU driver, and its compute-domain driver."""
        release = self.dra_release or "v25.12"
        return [
            nvidia_slice(self.node, self.dra_gpus(), self.dra_migs(), release=release),
            compute_domain_slice(self.node),
        ]

    def dra_name(self, device: Device) -> str:
        """The name the scenario's driver release gives ``device`` in its slice."""
        release = self.dra_release or "v25.12"
        uuid = uuid_of(device)
        for mig in self.dra_migs():
            if mig.uuid == uuid:
                return mig_name(mig, release)
        for gpu in self.dra_gpus():
            if gpu.uuid == uuid:
                return gpu_name(gpu, release)
        raise ValueError(f"{device!r} is no device of this node")

    def _claim(self, p: Pod, ctr: Ctr) -> Any:
        name = ctr.claim or f"{ctr.name}-gpu"
        claim_uid = _uid("claim", p.namespace, name)
        devices = []
        for ref in ctr.dra:
            if isinstance(ref, DraRef):
                devices.append(claim_device(ref.driver, ref.pool, ref.device, ref.cdi, ctr.share_id))
                continue
            device = self.dra_name(ref)
            cdi = [f"k8s.gpu.nvidia.com/claim={claim_uid}-{device}"]  # the driver's claim spec names (cdi.go)
            devices.append(claim_device(DRA_DRIVER, self.node, device, cdi, ctr.share_id))
        return claim(name, p.namespace, *devices)

    # --- building the fakes --------------------------------------------------------------------------------

    def start(self) -> NodeScenario:
        self.root.mkdir(parents=True, exist_ok=True)
        self.library = build_fake_nvml(NVML_BUILD_DIR)
        self.proc = HostProcTree(self.root / "proc")
        self._write_proc()
        self.write_nvml()
        self.kubelet = FakeKubelet(self.root / "pod-resources" / "kubelet.sock", self.kubelet_pods()).start()
        if self.kubernetes:
            self.api = FakeKubeApi().start()
            for p in self.pods:
                if p.in_api:
                    self.api.add_pod(self.api_pod(p))
            if self.slice_versions is not None:
                self.api.resource_slices.served = self.slice_versions
            if self.dra_release is not None:
                for published in self.resource_slices():
                    self.api.resource_slices.put(published)
            self.api.write_kubeconfig(self.root / "kubeconfig")
        return self

    def stop(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()
        if self.api is not None:
            self.api.stop()

    def __enter__(self) -> NodeScenario:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def write_nvml(self) -> Path:
        return self.nvml_config().write(self.root / "nvml.conf")

    def kubelet_pods(self) -> list[Any]:
        listed = []
        for p in self.pods:
            containers = []
            for ctr in p.containers:
                ids = list(ctr.device_ids) if ctr.device_ids is not None else [uuid_of(d) for d in ctr.allocated]
                devices = {ctr.resource: ids} if ids else {}
                claims = [self._claim(p, ctr)] if ctr.dra else []
                containers.append(container(ctr.name, devices, claims))
            listed.append(pod(p.name, p.namespace, *containers))
        return listed

    def api_pod(self, p: Pod) -> dict[str, Any]:
        return make_pod(
            p.namespace,
            p.name,
            p.uid,
            self.node,
            [(ctr.name, ctr.container_id if ctr.running else None) for ctr in p.containers],
            labels=p.labels,
            annotations=p.annotations,
            scheduler_name=p.scheduler_name,
            runtime=RUNTIMES[p.layout],
        )

    def _write_proc(self) -> None:
        assert self.proc is not None
        tree = self.proc
        minors_all = list(range(self.gpu_count))
        for p in self.pods:
            p.sandbox_pid = self.pid()  # the pause container: its own container id, no GPU, not in the pod status
            tree.add_container_process(p.sandbox_pid, p.uid, _stable_id(p.uid, "sandbox"), layout=p.layout, v1=p.v1)
            for ctr in p.containers:
                if not ctr.running:
                    continue
                minors = minors_all if ctr.visible == "all" else sorted({self._minor(d) for d in ctr.visible})
                name = f"{p.uid}-{ctr.container_id[:12]}"
                rootfs = tree.rootfs(name, gpu_minors=minors, control_nodes=bool(minors))
                secrets = rootfs / "var/run/secrets/kubernetes.io/serviceaccount"
                secrets.mkdir(parents=True)
                (secrets / "namespace").write_text(p.namespace if ctr.namespace_file is None else ctr.namespace_file)
                flood_dev(rootfs, ctr.dev_flood)
                if ctr.plant is not None:
                    ctr.plant(rootfs)
                environ = {"PATH": "/usr/bin", "HOSTNAME": p.name, **ctr.env}
                ctr.pids = [self.pid() for _ in range(1 + len(ctr.processes) + ctr.extra_processes)]
                below = self._nested(ctr.nested_pod) if ctr.nested_pod else ""
                for pid in ctr.pids:
                    lowest = pid == ctr.pids[0]
                    tree.add_container_process(
                        pid,
                        p.uid,
                        ctr.container_id,
                        rootfs=rootfs,
                        environ={**environ, **(ctr.lowest_env or {})} if lowest else environ,
                        layout=p.layout,
                        v1=p.v1,
                        below=below if pid in ctr.gpu_pids else "",
                    )
                if ctr.lowest == "chroot":
                    empty = tree.root / "_rootfs" / f"{name}-empty"
                    empty.mkdir()
                    tree.chroot(ctr.pids[0], empty)
                elif ctr.lowest == "unshare":
                    tree.unshare_mounts(ctr.pids[0], tree.rootfs(f"{name}-covered", control_nodes=False))
        for pid, _, _ in self.host_gpu_processes:
            tree.add_process(pid, cgroup="0::/system.slice/cuda-host.service\n", environ={"PATH": "/usr/bin"})
        self._write_filler(self.host_process_count)

    def _nested(self, pod_name: str) -> str:
        """A cgroup path below a container's own, named after the first container of the pod ``pod_name``."""
        victim = next(p for p in self.pods if p.name == pod_name)
        return nested_pod_cgroup(victim.uid, victim.containers[0].container_id)

    def _write_filler(self, count: int) -> None:
        """Host processes that are neither GPU users nor containers, written as cheaply as possible."""
        assert self.proc is not None
        cgroup = b"0::/system.slice/some.service\n"
        for _ in range(count):
            directory = self.proc.root / str(self.pid())
            directory.mkdir()
            (directory / "cgroup").write_bytes(cgroup)

    # --- running the auditor -------------------------------------------------------------------------------

    def args(self, command: str = "once", *extra: str, kubernetes: bool | None = None) -> list[str]:
        """CLI args that audit this node (for ``auditor.cli.main`` or after the console script's name)."""
        assert self.kubelet is not None and self.library is not None and self.proc is not None
        base = [
            command,
            "--node",
            self.node,
            "--pod-resources-socket",
            str(self.kubelet.socket_path),
            "--host-proc",
            str(self.proc.root),
            "--nvml-lib",
            str(self.library),
        ]
        use_api = self.kubernetes if kubernetes is None else kubernetes
        if use_api and self.api is not None:
            base += ["--kubeconfig", str(self.root / "kubeconfig")]
        else:
            base += ["--no-kubernetes"]
        return [*base, *extra]

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a subprocess auditor: the fake NVML's configuration file."""
        env = dict(os.environ if base is None else base)
        env["FAKE_NVML_CONFIG"] = str(self.root / "nvml.conf")
        env.pop("NODE_NAME", None)
        return env

    # --- lookups for assertions ----------------------------------------------------------------------------

    def container(self, pod_name: str, name: str) -> Ctr:
        for p in self.pods:
            if p.name == pod_name:
                for ctr in p.containers:
                    if ctr.name == name:
                        return ctr
        raise KeyError(f"{pod_name}/{name}")


def dense_node(
    root: Path,
    *,
    gpus: int = 8,
    slots: int = 7,
    pods: int = 110,
    containers_per_pod: int = 4,
    gpu_processes: int = 2000,
    host_processes: int = 30_000,
    kubernetes: bool = True,
    activity: tuple[int, int, int, int] | None = None,
    flooded_dev: int = 0,
) -> NodeScenario:
    """The benchmark's node, clean: every MIG slice shared (as replicas ``MIG-x::n``) by the pods in turn, each
    pod's first container running its share of the GPU processes, the other containers pinned to ``void``.
    ``flooded_dev``: that many more entries (character devices) in the ``/dev`` of the first pod's first sidecar.

    ``slots=0`` is the same node without MIG: whole GPUs time-sliced (replicas ``GPU-x::n``), where NVML samples
    each process's utilisation; ``activity`` (percent: SM, memory, encoder, decoder) makes every GPU process busy.
    """
    mig_slots = {g: slots for g in range(gpus)} if slots else {}
    scenario = NodeScenario(root, gpus=gpus, mig_slots=mig_slots, host_processes=host_processes, kubernetes=kubernetes)
    devices: list[Device] = [f"{g}:{s}" for g in range(gpus) for s in range(slots)] if slots else list(range(gpus))
    resource = "nvidia.com/mig-1g.10gb" if slots else "nvidia.com/gpu.shared"
    per_pod, extra = divmod(gpu_processes, pods)
    for number in range(pods):
        device = devices[number % len(devices)]
        count = per_pod + (1 if number < extra else 0)
        replica = number // len(devices)
        first = replica_holder(device, replica, 64 << 20, processes=count, resource=resource, activity=activity)
        sidecars = [Ctr(f"side{n}", env={"NVIDIA_VISIBLE_DEVICES": "void"}) for n in range(1, containers_per_pod)]
        if number == 0 and sidecars:
            sidecars[0].dev_flood = flooded_dev
        scenario.add_pod(f"team-{number % 10}", f"job-{number}", first, *sidecars, labels={"team": f"t{number % 5}"})
    return scenario


def cgroup_layouts() -> Iterable[tuple[str, bool]]:
    """Every (layout, cgroup v1?) pair the scenario tests cover."""
    for layout in ("systemd-containerd", "systemd-crio", "systemd-docker", "cgroupfs", "cgroupfs-crio"):
        for v1 in (False, True):
            yield layout, v1


__all__ = [
    "Ctr",
    "DraRef",
    "NodeScenario",
    "Pod",
    "cgroup_layouts",
    "cgroup_text",
    "dense_node",
    "replica_holder",
    "uuid_of",
]
