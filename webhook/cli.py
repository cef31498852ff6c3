"""``gpu-fence-webhook``: one entry point, three subcommands.

Each subcommand lives in its own module, which contributes ``add_arguments(parser)`` and ``run(args) -> int``.
Those modules keep heavy imports (the ``kubernetes`` client, gunicorn) inside functions, so that building
the parser, and the ``serve`` path above all, stays fast.

Exit codes, for every subcommand (``gpu_fence.exit_status``): 0 ok, 1 rejections found (``check``), 2 could not
run (usage, unreadable input, bad configuration). Errors are one line on stderr; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpu_fence import command_line

from . import certs, check, serving

EPILOG = """\
examples:
  gpu-fence-webhook check manifests/examples/
  helm template my-chart | gpu-fence-webhook check - --format sarif > gpu-fence.sarif
  gpu-fence-webhook certs --service gpu-fence-webhook --namespace gpu-fence --out-dir ./tls
  gpu-fence-webhook serve --cert-file ./tls/tls.crt --key-file ./tls/tls.key

exit codes: 0 ok, 1 rejections found (check), 2 could not run
"""


def build_parser() -> argparse.ArgumentParser:
    return command_line.build_parser(
        "gpu-fence-webhook",
        "Admission webhook that keeps Kubernetes pods off GPUs they were not allocated.",
        EPILOG,
        [module.add_arguments for module in (serving, certs, check)],
    )


def main(argv: Sequence[str] | None = None) -> int:
    return command_line.run_subcommand(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
