"""Reading a pod dict: its containers by id, its labels, its KAI GPU groups."""

from __future__ import annotations

from gpu_fence.auditor.pods import kai_gpu_groups
from tests.fakes.kubeapi_pods_events import make_pod


def test_kai_groups_from_single_and_multi_fraction_labels():
    single = make_pod("a", "p", "u", "n", [], labels={"runai-gpu-group": "g1"})
    multi = make_pod("a", "p", "u", "n", [], labels={"runai-gpu-group/g2": "g2", "runai-gpu-group/g3": "g3"})
    assert kai_gpu_groups(single) == {"g1"} and kai_gpu_groups(multi) == {"g2", "g3"}
    assert kai_gpu_groups(make_pod("a", "p", "u", "n", [])) == frozenset()
