"""The version of gpu-fence, from the installed distribution's metadata (``pyproject.toml`` is its one source).

``--version`` of both command lines, the SARIF report's ``tool.driver.version`` and the bill's provenance say it.
"""

from __future__ import annotations

from importlib import metadata

__all__ = ["DISTRIBUTION", "package_version"]

DISTRIBUTION = "gpu-fence"


def package_version() -> str:
    """The installed version, or ``unknown`` in a source tree that was never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
