"""The rules, one function per rule id (named after it), each registered beside its code
(``webhook.policy.registry``) and grouped by what it judges:

* ``visible_devices``: the pin, and what sets the visible devices (``unpinned-container``, ``visible-devices-env``,
  ``visible-devices-none``, ``gpu-env-from``);
* ``privileges``: what reaches the node from a container or the pod's namespaces (``privileged``, the capabilities,
  ``host-process``, ``host-pid``, ``host-ipc``);
* ``volumes``: mounts and volumes (``device-list-mount``, the hostPath rules, ``volume-type``);
* ``device_annotations``: annotations that ask the runtime for devices (``cdi-annotation``, ``runtime-annotation``);
* ``device_env``: the toolkit's other device variables (``mig-control-env``, ``imex-channels-env``,
  ``gated-device-env``);
* ``allocation``: the allocation itself (``bound-gpu-pod``, ``kai-annotation-update``).

:data:`RULES` is the table, in ``RuleId``'s order (docs/policy.md's).
"""

from __future__ import annotations

from ..registry import Rule, table
from . import allocation, device_annotations, device_env, privileges, visible_devices, volumes  # noqa: F401 - registers them

RULES: tuple[Rule, ...] = table()
#: The rules only a plain pod UPDATE can break (``validate_update``): ``validate`` has no old object to compare with.
UPDATE_RULES = frozenset(rule.id for rule in RULES if rule.update_only)
