"""The warnings ``validate`` returns beside the violations, which deny nothing: the rules whose switch is at
``warn`` (``gpu-env-from``, ``visible-devices-none``, ``host-ipc``) said as advice, and the one warning that is no
rule's, an NVIDIA runtime class on a pod with no GPU container (:data:`~webhook.policy.values.NVIDIA_RUNTIME_CLASS`,
which the pin neutralises)."""

from __future__ import annotations

from gpu_fence.vocabulary import VISIBLE_DEVICES_ENV

from ..config import Switch
from .pod import PodView, in_container
from .rules.privileges import HOST_IPC_FIX, shares_host_ipc
from .rules.visible_devices import env_from_gaps, none_settings
from .values import NVIDIA_RUNTIME_CLASS, RuleId, Violation, quote

#: The switch's member, bound once: CPython 3.11 reads an enum member through its class in about 60 ns (measured),
#: and these comparisons run for every pod admitted (BENCHMARKS.md, "Policy: read top to bottom").
_WARN = Switch.WARN


def advice(pod: PodView) -> list[Violation]:
    """The pod's warnings, in this order: ``gpu-env-from``, ``visible-devices-none``, ``host-ipc`` where their switch
    is at ``warn``, then the NVIDIA runtime class."""
    # Loops over lists that are nearly always empty, not generators: this runs for every pod admitted.
    warnings: list[Violation] = []
    config = pod.config
    if config.env_from_on_gpu_containers is _WARN:
        for container in env_from_gaps(pod):
            warnings.append(
                in_container(
                    RuleId.GPU_ENV_FROM,
                    container,
                    f"requests a GPU and uses envFrom, which gpu-fence cannot check for {VISIBLE_DEVICES_ENV}",
                    "set the variables with env instead of envFrom",
                )
            )
    if config.visible_devices_none is _WARN:
        for container, name in none_settings(pod):
            warnings.append(
                in_container(
                    RuleId.VISIBLE_DEVICES_NONE,
                    container,
                    f"sets {name}=none, which toolkit 1.18.0-1.18.1 (jit-cdi) read as all",
                    "use void",
                )
            )
    if config.host_ipc is _WARN and shares_host_ipc(pod):
        warnings.append(
            Violation(
                RuleId.HOST_IPC, None, "the pod shares the node's IPC namespace and /dev/shm (hostIPC)", HOST_IPC_FIX
            )
        )
    if pod.whole_pod:
        runtime_class = pod.spec.get("runtimeClassName")
        if (
            isinstance(runtime_class, str)
            and runtime_class in config.nvidia_runtime_class_set
            and not any(container.gpu or container.kai_fraction or container.claims for container in pod.containers)
        ):
            warnings.append(
                Violation(
                    NVIDIA_RUNTIME_CLASS,
                    None,
                    f"runtimeClassName {quote(runtime_class)} on a pod with no GPU container: its containers are "
                    f"pinned to {VISIBLE_DEVICES_ENV}=void",
                )
            )
    return warnings
