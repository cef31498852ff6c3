"""The rules of the toolkit's device variables other than the visible devices: MIG control, IMEX channels and the
gated node devices (NVSwitch, GPUDirect Storage, InfiniBand, GDRCopy). The pod sets none of them: what a
container gets is the allocation's to say.

The three rules read one pass over the containers' watched env (:func:`~webhook.policy.pod.device_variables`).
"""

from __future__ import annotations

from collections.abc import Collection

from gpu_fence.vocabulary import GATED_DEVICE_ENVS, IMEX_CHANNELS_ENV

from ..pod import MIG_CONTROL_NAMES, PodView, device_variables, in_container
from ..registry import rule
from ..values import RuleId, Violation


@rule(RuleId.MIG_CONTROL_ENV, "NVIDIA_MIG_CONFIG_DEVICES or NVIDIA_MIG_MONITOR_DEVICES set", vectors=("V14",))
def mig_control_env(pod: PodView) -> list[Violation]:
    return _env_variable_violations(
        pod, RuleId.MIG_CONTROL_ENV, MIG_CONTROL_NAMES, "which controls MIG on the whole GPU"
    )


@rule(RuleId.IMEX_CHANNELS, "NVIDIA_IMEX_CHANNELS set in the pod, an IMEX channel request of its own", vectors=("V21",))
def imex_channels_env(pod: PodView) -> list[Violation]:
    return _env_variable_violations(
        pod,
        RuleId.IMEX_CHANNELS,
        (IMEX_CHANNELS_ENV,),
        "an IMEX channel request that no allocation made (the device plugin or DRA driver sets it)",
    )


def _env_variable_violations(pod: PodView, rule_id: RuleId, names: Collection[str], why: str) -> list[Violation]:
    settings = device_variables(pod)
    if not settings:
        return []
    return [
        in_container(rule_id, container, f"sets {name}, {why}", f"remove {name}")
        for container, name in settings
        if name in names
    ]


@rule(
    RuleId.GATED_DEVICE_ENV,
    "NVIDIA_NVSWITCH, NVIDIA_GDS, NVIDIA_MOFED or NVIDIA_GDRCOPY set in the pod: requests for node devices "
    "(NVSwitch, GPUDirect Storage, InfiniBand, GDRCopy) that no allocation made",
    vectors=("V27",),
)
def gated_device_env(pod: PodView) -> list[Violation]:
    settings = device_variables(pod)
    if not settings:
        return []
    return [
        in_container(
            RuleId.GATED_DEVICE_ENV,
            container,
            f"sets {name}, which asks the NVIDIA toolkit for {GATED_DEVICE_ENVS[name]}, devices no allocation chose",
            f"remove {name} ({_GATED_WAY_OUT.get(name, _NVSWITCH_WAY_OUT)})",
        )
        for container, name in settings
        if name in GATED_DEVICE_ENVS
    ]


#: Where each gated device comes from legitimately: the NVIDIA device plugin sets three of the variables itself on
#: the containers it allocates GPUs to, where the cluster enables them (k8s-device-plugin
#: ``internal/plugin/server.go``).
_GATED_WAY_OUT = {
    "NVIDIA_GDS": "the device plugin sets it with its GPUs where gds-enabled is on",
    "NVIDIA_MOFED": "the device plugin sets it with its GPUs where mofed-enabled is on",
    "NVIDIA_GDRCOPY": "the device plugin sets it with its GPUs where gdrcopy-enabled is on",
}
_NVSWITCH_WAY_OUT = "NVSwitch devices are the fabric manager's, a node service"
