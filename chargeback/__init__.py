"""``gpu-fence-auditor chargeback``: a GPU bill per namespace or team label from the auditor's metrics.

The command (``cli``) parses its flags into one frozen ``Settings`` (``settings``) and makes the bill from it
(``make``): from Prometheus (``prometheus``, with ``httpconfig`` for TLS and credentials) it reads either the
chargeback recording rules' series (``rules`` writes the rules, ``recorded`` sums what they recorded) or the
auditor's raw series in bounded chunks (``raw``, each instant's ``samples``), or the bundled sample fleet
(``demo``); it prices cards (``prices``), splits their cost (``ledger``, pure, into a ``bill``) and writes a table,
CSV, JSON, markdown (``render``), FOCUS rows (``focus``) or a self-contained HTML report (``html``), each saying
how it was made (``provenance``). The method is in ``docs/chargeback.md``; a long bill shows its progress on a
terminal (``progress``).

The package imports nothing of the auditor: what both read of the auditor's series is in
``gpu_fence.metric_names``. The auditor's command line registers :func:`add_arguments`; the bill's making
(``make``) is imported when a chargeback runs, not by the auditor's other subcommands.
"""

from __future__ import annotations

from .cli import add_arguments, run
from .settings import Settings, settings_from

__all__ = ["Settings", "add_arguments", "run", "settings_from"]
