"""How a pod is read: what every rule reads, computed once per call."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

from gpu_fence.vocabulary import (
    CONTAINER_FIELDS,
    GATED_DEVICE_ENVS,
    IMEX_CHANNELS_ENV,
    MIG_CONTROL_ENVS,
    VISIBLE_DEVICES_ENV,
    has_resource_claims,
    kai_fraction_container,
    requests_device_plugin_gpu,
)

from ..config import PolicyConfig
from .values import UNPINNED_CONTAINER, Violation, _quote

# --------------------------------------------------------------------------------------------------------------
# Reading a pod


class _Container(NamedTuple):
    field: str
    index: int
    name: str  # the container's name, or "field[index]" when it has none
    body: Mapping[str, Any]
    #: A device-plugin GPU request: the plugin sets NVIDIA_VISIBLE_DEVICES from the allocation, so the container is
    #: not pinned and must not set the variable (nor an alias) itself.
    gpu: bool
    #: KAI's fraction container of a pod that KAI binds: pinned to void like the others (KAI's webhook replaces the
    #: pin with its reference), aliases left alone (one would override KAI's value), KAI's reference accepted.
    kai_fraction: bool
    claims: bool  # lists DRA claims: pinned all the same (see the module docstring), but counts as getting a device
    #: ``(name, entry)`` for each readable env entry whose name a rule reads (``NVIDIA_VISIBLE_DEVICES``, its
    #: configured aliases, the MIG and IMEX variables; see :func:`_watched_env_names`); the others (most of a
    #: typical env) no rule looks at, so they are dropped once here instead of skipped by every rule. Duplicates
    #: are all kept: the kubelet keeps the last, but every one of them is judged, so no ordering trick can hide a
    #: value.
    env: list[tuple[str, Mapping[str, Any]]]
    env_readable: bool  # False when ``env`` is present but not a list: nothing can be appended to it
    pins: tuple[str, ...]  # the env names the container must carry (pinned to void by ``mutate``), in pin order


class _Pod(NamedTuple):
    """What every rule reads, computed once per call (the hot path reads each container once)."""

    metadata: Mapping[str, Any]
    spec: Mapping[str, Any]
    containers: tuple[_Container, ...]  # the containers under judgement (only the selected ones with ``only``)
    unreadable: tuple[Violation, ...]  # container lists or entries that are not what the API allows
    config: PolicyConfig
    whole_pod: bool  # False when judging only some ephemeral containers: pod-level rules were judged at CREATE
    #: What two rules read alike (the capabilities added, the hostPath volumes), worked out once by the first.
    memo: dict[str, Any]


def _mapping(value: Any) -> Mapping[str, Any]:
    # JSON and YAML decoders produce dicts; testing the concrete type keeps the hot path off the ABC machinery.
    return value if isinstance(value, dict) else _EMPTY


_EMPTY: Mapping[str, Any] = {}


def _in_container(rule: str, container: _Container, what: str, fix: str) -> Violation:
    """A violation by one container: what is wrong names the container first, quoted and clipped, as people read
    it."""
    return Violation(rule, container.name, f"container {_quote(container.name)} {what}", fix)


def _kai_fraction_name(pod: Mapping[str, Any], config: PolicyConfig) -> str | None:
    """KAI's fraction container, when the fraction annotations can be trusted: under a configured KAI scheduler
    and with no ``spec.nodeName`` at creation. A pod created bound to a node never meets KAI's scheduler or binder,
    so nothing would ever fill the ConfigMap its reference names, and the pod author's own ConfigMap of that name
    would be read instead."""
    spec = _mapping(pod.get("spec"))
    # The scheduler first: nearly every pod names another (or none), and this runs for every pod admitted. Anything
    # but a string could not name a scheduler anyway (and is not hashable).
    scheduler = spec.get("schedulerName")
    if not isinstance(scheduler, str) or scheduler not in config.kai_scheduler_set:
        return None
    node = spec.get("nodeName")
    if node is not None and node != "":  # _bound_at_creation, inline: once per pod admitted
        return None
    return kai_fraction_container(pod, config.kai_scheduler_set)


def _bound_at_creation(spec: Mapping[str, Any]) -> bool:
    node = spec.get("nodeName")
    return node is not None and node != ""


def _read_pod(pod: Any, config: PolicyConfig, only: Collection[str] | None) -> _Pod:
    # The hot path of every review: JSON input, so concrete ``dict``/``list`` checks (not the ``Mapping`` ABC), and
    # no text is formatted unless something is wrong.
    if not isinstance(pod, dict):
        problem = Violation(
            UNPINNED_CONTAINER,
            None,
            "the object is not a Pod (not a JSON object), so no container can be pinned",
            "submit a Pod manifest",
        )
        return _Pod({}, {}, (), (problem,), config, only is None, {})
    spec = pod.get("spec")
    unreadable: list[Violation] = []
    if not isinstance(spec, dict):
        unreadable.append(
            Violation(
                UNPINNED_CONTAINER,
                None,
                "the pod has no readable spec, so no container can be pinned",
                "give the Pod a spec object",
            )
        )
        spec = {}
    kai_name = _kai_fraction_name(pod, config)
    watched = _watched_env_names(config)
    resources = config.gpu_resource_set
    pin_names = config.pin_names
    fields = CONTAINER_FIELDS if only is None else ("ephemeralContainers",)
    containers: list[_Container] = []
    for field in fields:
        entries = spec.get(field)
        if entries is None:
            continue
        if not isinstance(entries, list):
            unreadable.append(
                Violation(
                    UNPINNED_CONTAINER,
                    None,
                    f"spec.{field} is not a list, so its containers cannot be pinned",
                    f"make spec.{field} a list of containers",
                )
            )
            continue
        ephemeral = field == "ephemeralContainers"
        for index, body in enumerate(entries):
            if not isinstance(body, dict):
                label = f"{field}[{index}]"
                unreadable.append(
                    Violation(
                        UNPINNED_CONTAINER,
                        label,
                        f"spec.{label} is not an object, so it cannot be pinned",
                        "make it a container object",
                    )
                )
                continue
            name = body.get("name")
            named = isinstance(name, str)
            if only is not None and (not named or name not in only):
                continue
            # Ephemeral containers can hold no resources and are never KAI's fraction container. Claims matter only
            # on a container that is not the device plugin's (where they decide a message and a warning).
            if ephemeral:
                gpu = fraction = claims = False
                pins = pin_names
            elif requests_device_plugin_gpu(body, resources):
                gpu, fraction, claims = True, False, False
                pins = ()
            else:
                gpu = False
                fraction = kai_name is not None and name == kai_name
                claims = "claims" in _mapping(body.get("resources")) and has_resource_claims(body)
                pins = _KAI_PINS if fraction else pin_names
            env = body.get("env")
            if isinstance(env, list):
                readable, watched_env = True, _watched_env(env, watched)
            else:
                readable, watched_env = env is None, []
            containers.append(
                _Container(
                    field,
                    index,
                    name if named and name else f"{field}[{index}]",
                    body,
                    gpu,
                    fraction,
                    claims,
                    watched_env,
                    readable,
                    pins,
                )
            )
    return _Pod(_mapping(pod.get("metadata")), spec, tuple(containers), tuple(unreadable), config, only is None, {})


_KAI_PINS = (VISIBLE_DEVICES_ENV,)


def _watched_env_names(config: PolicyConfig) -> frozenset[str]:
    """Every env name some rule reads: the visible-devices names (``NVIDIA_VISIBLE_DEVICES`` and the configured
    aliases), the MIG control variables, the IMEX channels and the gated device requests. A rule that reads another
    env name must be added here."""
    return config.visible_devices_names | _OTHER_WATCHED_NAMES


_MIG_CONTROL_NAMES = frozenset(MIG_CONTROL_ENVS)
_OTHER_WATCHED_NAMES = _MIG_CONTROL_NAMES | {IMEX_CHANNELS_ENV} | GATED_DEVICE_ENVS.keys()


def _watched_env(env: list[Any], watched: frozenset[str]) -> list[tuple[str, Mapping[str, Any]]]:
    # The usual env, every entry an object with a name, in one comprehension: any other JSON value fails the
    # subscript, and a name found in ``watched`` (strings only) is a string. An entry that is no object, has no
    # name or an unhashable one raises, and the whole list takes the careful loop instead.
    try:
        return [(entry["name"], entry) for entry in env if entry["name"] in watched]
    except (TypeError, KeyError):
        pass
    found: list[tuple[str, Mapping[str, Any]]] = []
    for entry in env:
        if isinstance(entry, dict):
            name = entry.get("name")
            if isinstance(name, str) and name in watched:  # the str test first: a list name is unhashable
                found.append((name, entry))
    return found


def _missing_pins(container: _Container) -> tuple[str, ...]:
    """The pin names the container has no env entry for (whatever the entries' values: validation judges them).

    A loop and no new object in the usual case (one pin, present, found after one or two entries): this runs for
    every container admitted."""
    pins = container.pins
    if len(pins) == 1:
        pin = pins[0]
        for name, _ in container.env:
            if name == pin:
                return ()
        return pins
    present = {name for name, _ in container.env}
    return tuple(pin for pin in pins if pin not in present)
