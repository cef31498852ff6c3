"""The rules, one function per rule id, in the rule table's order."""

from __future__ import annotations

from collections.abc import Callable

from ..pod import _Pod
from ..values import RULES, UPDATE_RULES, Rule, Violation
from .allocation import bound_gpu_pod, kai_annotation_update
from .annotations import cdi_annotation, runtime_annotation
from .device_env import gated_device_env, imex_channels_env, mig_control_env
from .privileges import added_capability, host_ipc, host_pid, host_process, privileged, sys_admin_capability
from .visible_devices import gpu_env_from, unpinned_container, visible_devices_env, visible_devices_none
from .volumes import device_list_mount, host_device_path, host_path, volume_type

RULE_CHECKS: tuple[tuple[Rule, Callable[[_Pod], list[Violation]]], ...] = tuple(
    zip(
        RULES,
        (
            unpinned_container,
            visible_devices_env,
            visible_devices_none,
            gpu_env_from,
            privileged,
            sys_admin_capability,
            added_capability,
            host_pid,
            device_list_mount,
            cdi_annotation,
            runtime_annotation,
            host_device_path,
            host_path,
            mig_control_env,
            imex_channels_env,
            bound_gpu_pod,
            kai_annotation_update,
            gated_device_env,
            volume_type,
            host_process,
            host_ipc,
        ),
        strict=True,
    )
)


_CHECKS = tuple(check for rule, check in RULE_CHECKS if rule.id not in UPDATE_RULES)
