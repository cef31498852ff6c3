"""CHANGELOG.md: a section per release, the coming one first, rules first in each, and every rule id in it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.version import Version

from gpu_fence.webhook.policy import RULES

REPO = Path(__file__).resolve().parents[1]


def sections() -> dict[str, str]:
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    return {part.splitlines()[0].strip(): part for part in parts}


def test_the_coming_release_comes_first_and_the_current_version_has_its_section() -> None:
    """The package version is a released section, or the coming one: newer than every release, while its
    section is still called Unreleased (the section gets its title when the release is cut)."""
    names = list(sections())
    assert names[0] == "Unreleased", "the section that collects what lands before the next release"
    version = Version(tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"])
    released = [Version(name) for name in names[1:]]
    assert version in released or version > max(released)


def test_rules_come_first_in_every_release() -> None:
    for name, body in sections().items():
        headings = re.findall(r"^### (.+)$", body, flags=re.M)
        assert headings and headings[0] == "Rules", f"{name}: the first part must be Rules"


def test_every_rule_id_of_the_policy_is_in_a_release_s_rules() -> None:
    """A rule added to the policy without a changelog entry would reach clusters unannounced."""
    rules_text = "".join(re.split(r"^### ", body, flags=re.M)[1] for body in sections().values())
    missing = [rule.id for rule in RULES if f"`{rule.id}`" not in rules_text]
    assert missing == []
