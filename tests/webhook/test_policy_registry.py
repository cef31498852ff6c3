"""The rule table is what the rule modules register: one function per rule id, named after it, in ``RuleId``'s order
(docs/policy.md's, tested in test_policy_docs.py), each in the module of what it judges; ``validate`` runs every rule
but the update-only ones, and a rule id cannot be registered twice."""

from __future__ import annotations

import pytest

from gpu_fence.webhook.config import PolicyConfig, Switch
from gpu_fence.webhook.policy import RULES, UPDATE_RULES, Reach, RuleId, validate
from gpu_fence.webhook.policy.registry import rule
from tests.fakes.pods import container, env, gpu_container, pod


def test_every_rule_id_has_one_function_named_after_it_in_the_table_order():
    assert [entry.id for entry in RULES] == list(RuleId)
    assert [entry.check.__name__ for entry in RULES] == [rule_id.value.replace("-", "_") for rule_id in RuleId]
    assert len({entry.check for entry in RULES}) == len(RULES)
    assert all(entry.check.__module__.startswith("gpu_fence.webhook.policy.rules.") for entry in RULES)


def test_only_kai_annotation_update_waits_for_an_update():
    assert set(UPDATE_RULES) == {RuleId.KAI_ANNOTATION_UPDATE}


def test_a_rule_id_cannot_be_registered_twice():
    with pytest.raises(ValueError, match="privileged is registered twice"):
        rule(RuleId.PRIVILEGED, "again", vectors=("V6",), reach=Reach.NODE)(lambda pod: [])
    assert [entry.id for entry in RULES].count(RuleId.PRIVILEGED) == 1


def test_validate_runs_the_rules_in_table_order():
    """A pod that breaks four rules of four modules gets their violations in the table's order."""
    config = PolicyConfig(visible_devices_none=Switch.REJECT)
    document = pod(
        gpu_container("gpu", env=[env("NVIDIA_MIG_CONFIG_DEVICES", "all")]),
        container("app", env=[env("NVIDIA_VISIBLE_DEVICES", "none")], securityContext={"privileged": True}),
        hostPID=True,
    )
    found = [violation.rule for violation in validate(document, config).violations]
    assert found == [RuleId.VISIBLE_DEVICES_NONE, RuleId.PRIVILEGED, RuleId.HOST_PID, RuleId.MIG_CONTROL_ENV]
