"""Where the Kubernetes client's configuration comes from, for every command that talks to the API.

One order for all of them (``gpu-fence-webhook check --cluster`` and ``certs``, ``gpu-fence-auditor once`` and
``run``), kubectl's: the file ``--kubeconfig`` names; else ``$KUBECONFIG`` (a file, or several joined by ``:``);
else ``~/.kube/config`` when it exists; else the in-cluster service account. ``$KUBECONFIG`` is read when a
command asks, not when the client is first imported (the client fixes its own default at import).

The ``kubernetes`` client is imported inside :func:`load_configuration` only: both command lines import this module
for every subcommand, and the webhook's ``serve`` must never load the client (a test of the real server checks it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubernetes.client import Configuration

__all__ = ["IN_CLUSTER", "ORDER", "KubeConfigError", "config_source", "load_configuration"]

#: How messages name the last source, which is not a file.
IN_CLUSTER = "the in-cluster service account"
#: The order after ``--kubeconfig``, as every ``--kubeconfig`` help text says it.
ORDER = f"$KUBECONFIG, then ~/.kube/config, then {IN_CLUSTER}"


class KubeConfigError(Exception):
    """No configuration could be loaded. ``source`` is the file tried (or :data:`IN_CLUSTER`), ``reason`` the
    client's own words; each command says them in its own error line."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason

    @property
    def in_cluster(self) -> bool:
        return self.source == IN_CLUSTER


def config_source(kubeconfig: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The kubeconfig file (or ``:``-joined files) to load, or None for the in-cluster service account."""
    if kubeconfig:
        return kubeconfig
    if environ.get("KUBECONFIG"):
        return environ["KUBECONFIG"]
    default = os.path.expanduser("~/.kube/config")
    return default if os.path.exists(default) else None


def load_configuration(kubeconfig: str | None = None) -> Configuration:
    """A fresh client ``Configuration`` from the first source of the order above; the process-wide default is
    left alone. Raises :class:`KubeConfigError` for a file that cannot be read, parsed or used, or when there is no
    service account either."""
    import yaml  # noqa: PLC0415 - loaded by the client in any case
    from kubernetes import client, config  # noqa: PLC0415 - slow to import; only the commands that call the API

    configuration = client.Configuration()
    source = config_source(kubeconfig)
    try:
        if source is not None:
            config.load_kube_config(config_file=source, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, yaml.YAMLError, OSError, ValueError, TypeError) as error:
        # one line: a YAML error spans several, and every command says this in a one-line error
        raise KubeConfigError(source or IN_CLUSTER, " ".join(str(error).split())) from error
    return configuration
