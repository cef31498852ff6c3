"""Tests import gpu-fence by the names an installed user has: ``gpu_fence`` and its ``webhook``, ``auditor`` and
``chargeback``.

The repository root is on ``sys.path`` (for ``tests.fakes`` and ``bench``), which would also make the source
folders ``webhook/``, ``auditor/`` and ``chargeback/`` importable as top-level packages that no installed user has; a
module imported under two names is two modules, with two copies of every global. This finder refuses those names, so a
test that imports one fails at once, naming the import to write instead.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

SOURCE_FOLDERS = ("webhook", "auditor", "chargeback")


class _InstalledNamesOnly:
    @staticmethod
    def find_spec(name: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name.partition(".")[0] in SOURCE_FOLDERS:
            raise ModuleNotFoundError(f"No module named {name!r}: import gpu_fence.{name}, the installed name")
        return None


sys.meta_path.insert(0, _InstalledNamesOnly)
