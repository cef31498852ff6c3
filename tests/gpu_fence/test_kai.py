"""KAI's names, one home: the webhook's configuration and the auditor's settings default to them."""

from __future__ import annotations

import pytest

from gpu_fence import kai
from gpu_fence.auditor.cli import build_parser
from gpu_fence.auditor.daemon import Auditor
from gpu_fence.auditor.settings import AuditSettings
from gpu_fence.vocabulary import kai_fraction_container
from gpu_fence.webhook.config import PolicyConfig, load_config


def test_the_webhook_trusts_fractions_under_kais_default_scheduler_name():
    assert load_config(None).kai_scheduler_names == PolicyConfig().kai_scheduler_names == kai.DEFAULT_SCHEDULER_NAMES


def test_the_auditor_defaults_to_kais_scheduler_and_reservation_namespace():
    auditor = Auditor(AuditSettings.from_args(build_parser().parse_args(["once", "--node", "n1", "--no-kubernetes"])))
    assert auditor.options.kai_scheduler_names == kai.DEFAULT_SCHEDULER_NAMES
    assert auditor.options.kai_reservation_namespace == kai.DEFAULT_RESERVATION_NAMESPACE
    assert auditor.policy.kai_reservation_namespace == kai.DEFAULT_RESERVATION_NAMESPACE


def test_every_fraction_annotation_and_the_container_annotation_are_read():
    for annotation in kai.FRACTION_ANNOTATIONS:
        pod = {
            "metadata": {"annotations": {annotation: "1", kai.FRACTION_CONTAINER_ANNOTATION: "second"}},
            "spec": {"schedulerName": kai.DEFAULT_SCHEDULER_NAMES[0], "containers": [{"name": "first"}]},
        }
        assert kai_fraction_container(pod, kai.DEFAULT_SCHEDULER_NAMES) == "second"


def test_kai_s_config_map_names():
    """As KAI's config_map.go builds them: "<prefix>-<index>", "-i<index>" for an init container, "-evar" after."""
    assert kai.capabilities_config_map("p-7b2kx9q-shared-gpu", init=False, index=0) == "p-7b2kx9q-shared-gpu-0"
    assert kai.capabilities_config_map("p-7b2kx9q-shared-gpu", init=True, index=2) == "p-7b2kx9q-shared-gpu-i2"
    assert kai.direct_env_config_map("p-7b2kx9q-shared-gpu", init=True, index=2) == "p-7b2kx9q-shared-gpu-i2-evar"


@pytest.mark.parametrize(
    ("prefix", "shaped"),
    [
        ("trainer-7b2kx9q-shared-gpu", True),
        ("my.job-0-bcdfghj-shared-gpu", True),
        ("-7b2kx9q-shared-gpu", True),  # a pod with generateName and no owner has no name yet
        ("trainer-aeiou01-shared-gpu", False),  # vowels, 0 and 1 are not in rand.String's alphabet
        ("trainer-7B2KX9Q-shared-gpu", False),
        ("trainer-7b2kx9-shared-gpu", False),
        ("trainer-7b2kx9q-shared-gpu-0", False),
        ("my-gpus", False),
        ("trainer-7b2kx9q-shared-gpu\n", False),
    ],
)
def test_kai_s_generated_prefix(prefix, shaped):
    assert bool(kai.SHARED_GPU_CONFIG_MAP_PREFIX.fullmatch(prefix)) is shaped
