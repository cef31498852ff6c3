"""docs/layout.md names every module of the four packages, and names no module that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("gpu_fence", "webhook", "auditor", "chargeback")
GENERATED = re.compile(r"_pb2(_grpc)?\.pyi?$")


def modules_on_disk() -> set[str]:
    found = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            relative = path.relative_to(REPO / package)
            if path.name == "__init__.py" or GENERATED.search(path.name):
                if path.name == "__init__.py" and relative.parent != Path():
                    found.add(f"{package}/{relative.parent}/")  # a subpackage is named as a folder
                continue
            found.add(f"{package}/{relative}")
    return found


def modules_in_the_doc() -> set[str]:
    """Each section (``## `package/` ``) names modules and folders in its tables' first column."""
    text = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
    named = set()
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        heading = re.match(r"`(\w+)/`", section)
        if heading is None or heading.group(1) not in PACKAGES:
            continue
        for row in re.findall(r"^\| ([^|]+) \|", section, flags=re.M):
            for name in re.findall(r"`([\w/.]+)`", row):
                named.add(f"{heading.group(1)}/{name}")
    return named


def test_the_layout_page_names_every_module_and_only_real_ones():
    on_disk, in_doc = modules_on_disk(), modules_in_the_doc()
    # a subpackage's own modules may be left to its folder's row
    folders = {name for name in in_doc if name.endswith("/")}
    covered = {module for module in on_disk if any(module.startswith(folder) for folder in folders)}
    assert on_disk - covered - in_doc == set(), "modules docs/layout.md does not name"
    assert in_doc - on_disk == set(), "docs/layout.md names modules that do not exist"
