"""docs/policy.md is tested against the code: one section per rule id, in RULES order, and each section's
examples really trigger (first YAML block) and clear (second YAML block) its rule. The two rules whose default is
a warning are triggered under the setting their section names, and warn under the defaults. A rule that only a pod
UPDATE breaks has three blocks: the pod as created, the update that triggers it, and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpu_fence.webhook.config import PolicyConfig, Switch
from gpu_fence.webhook.policy import RULES, UPDATE_RULES, evaluate, validate, validate_update
from tests.fakes.pods import apply_patch, assert_valid_pod

DOC = Path(__file__).resolve().parents[2] / "docs" / "policy.md"
SECTION = re.compile(r"^## `([a-z-]+)`\n(.*?)(?=^## |\Z)", re.MULTILINE | re.DOTALL)
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
CONFIG = PolicyConfig()
#: The setting under which a warn-by-default rule denies, as its section says ("with `key: reject`").
REJECTING = {
    "visible-devices-none": ("visible_devices_none", PolicyConfig(visible_devices_none=Switch.REJECT)),
    "gpu-env-from": ("env_from_on_gpu_containers", PolicyConfig(env_from_on_gpu_containers=Switch.REJECT)),
}


def sections() -> dict[str, str]:
    return {match.group(1): match.group(2) for match in SECTION.finditer(DOC.read_text(encoding="utf-8"))}


def blocks(rule_id: str) -> list[dict]:
    return [yaml.safe_load(block) for block in YAML_BLOCK.findall(sections()[rule_id])]


def examples(rule_id: str) -> tuple[dict, dict]:
    found = blocks(rule_id)
    if rule_id in UPDATE_RULES:
        assert len(found) == 3, f"section {rule_id} needs the pod as created, a triggering update and a fix"
        return found[1], found[2]
    assert len(found) == 2, f"section {rule_id} needs a triggering example and a fix"
    return found[0], found[1]


def test_one_section_per_rule_in_table_order():
    assert list(sections()) == [rule.id for rule in RULES]


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.id)
def test_section_names_the_vectors(rule):
    text = sections()[rule.id]
    for vector in rule.vectors:
        assert re.search(rf"\b{vector}\b", text), f"{rule.id}: vector {vector} not mentioned"


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.id)
def test_example_triggers_its_rule(rule):
    trigger, _ = examples(rule.id)
    assert_valid_pod(trigger)
    config = CONFIG
    if rule.id in REJECTING:
        key, config = REJECTING[rule.id]
        assert f"`{key}: reject`" in sections()[rule.id]
        warned = evaluate(trigger, CONFIG, namespace="default")
        assert warned.verdict in ("allowed", "mutated") and len(warned.validation.warnings) == 1
    if rule.id in UPDATE_RULES:
        created = blocks(rule.id)[0]
        assert_valid_pod(created)
        assert evaluate(created, config, namespace="default").validation.violations == ()
        assert validate_update(trigger, created, config).rule_ids == (rule.id,)
        assert validate_update(created, created, config).violations == ()
        return
    assert rule.id in validate(trigger, config).rule_ids
    decision = evaluate(trigger, config, namespace="default")
    if rule.id == "unpinned-container":  # admission pins it; the rule is the backstop when mutation did not run
        assert decision.verdict == "mutated"
    else:
        assert decision.verdict == "rejected" and decision.validation.rule_ids == (rule.id,)


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.id)
def test_fix_clears_its_rule(rule):
    _, fixed = examples(rule.id)
    assert_valid_pod(fixed)
    config = REJECTING.get(rule.id, (None, CONFIG))[1]
    decision = evaluate(fixed, config, namespace="default")
    assert decision.verdict in ("allowed", "mutated")
    assert validate(apply_patch(fixed, decision.mutation.patch), config).violations == ()
    assert decision.validation.warnings == ()
