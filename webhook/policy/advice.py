"""The warnings that deny nothing."""

from __future__ import annotations

from gpu_fence.vocabulary import VISIBLE_DEVICES_ENV

from .pod import _in_container, _Pod
from .rules.privileges import _HOST_IPC_FIX, _host_ipc
from .rules.visible_devices import _env_from_gaps, _none_settings
from .values import _WARN, GPU_ENV_FROM, HOST_IPC, NVIDIA_RUNTIME_CLASS, VISIBLE_DEVICES_NONE, Violation, _quote


def _warnings(pod: _Pod) -> list[Violation]:
    # Loops over lists that are nearly always empty, not generators: this runs for every pod admitted.
    warnings: list[Violation] = []
    config = pod.config
    if config.env_from_on_gpu_containers is _WARN:
        for container in _env_from_gaps(pod):
            warnings.append(
                _in_container(
                    GPU_ENV_FROM,
                    container,
                    f"requests a GPU and uses envFrom, which gpu-fence cannot check for {VISIBLE_DEVICES_ENV}",
                    "set the variables with env instead of envFrom",
                )
            )
    if config.visible_devices_none is _WARN:
        for container, name in _none_settings(pod):
            warnings.append(
                _in_container(
                    VISIBLE_DEVICES_NONE,
                    container,
                    f"sets {name}=none, which toolkit 1.18.0-1.18.1 (jit-cdi) read as all",
                    "use void",
                )
            )
    if config.host_ipc is _WARN and _host_ipc(pod):
        warnings.append(
            Violation(HOST_IPC, None, "the pod shares the node's IPC namespace and /dev/shm (hostIPC)", _HOST_IPC_FIX)
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
                    f"runtimeClassName {_quote(runtime_class)} on a pod with no GPU container: its containers are "
                    f"pinned to {VISIBLE_DEVICES_ENV}=void",
                )
            )
    return warnings
