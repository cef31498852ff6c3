"""``gpu-fence-auditor``: one entry point with the subcommands ``once``, ``run`` and ``chargeback``.

Each subcommand module contributes ``add_arguments(subparsers)`` (which sets ``run`` as the default
function) and keeps heavy imports (NVML, gRPC, the ``kubernetes`` client) inside functions.

Exit codes: 0 clean, 1 findings (``once``), 2 could not audit / could not run, with the reason on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpu_fence import command_line
from gpu_fence.chargeback import add_arguments as add_chargeback_arguments

from . import daemon

EPILOG = """\
examples:
  gpu-fence-auditor once --format json
  gpu-fence-auditor run --interval 30 --metrics-port 10400
  gpu-fence-auditor chargeback --prometheus http://prometheus:9090 --start -30d --end now --by label:team

exit codes: 0 clean, 1 findings (once), 2 could not audit / could not run
"""


def build_parser() -> argparse.ArgumentParser:
    return command_line.build_parser(
        "gpu-fence-auditor",
        "Audit GPU visibility and usage of every container on this node against its kubelet allocation.",
        EPILOG,
        [daemon.add_arguments, add_chargeback_arguments],
    )


def main(argv: Sequence[str] | None = None) -> int:
    return command_line.run_subcommand(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
