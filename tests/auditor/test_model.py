"""The auditor's values: the one place a MIG device takes its card's numbers, and a snapshot's degraded sources."""

from __future__ import annotations

from gpu_fence.auditor.model import FailureReason, Gpu, IdentitySource, NodeSnapshot

CARD = Gpu("GPU-card", 3, 7, "NVIDIA H100 80GB HBM3", 80 << 30, mig_enabled=True)


def slice_of(card: Gpu, **overrides: object) -> Gpu:
    fields: dict = {
        "mig_index": 2,
        "gpu_instance_id": 9,
        "compute_instance_id": 0,
        "memory_total_bytes": 10 << 30,
        "profile": "1g.10gb",
        "share": 1 / 7,
    }
    return card.mig_device("MIG-slice", **{**fields, **overrides})


def test_a_mig_device_takes_its_cards_index_and_minor():
    """``NVIDIA_VISIBLE_DEVICES`` indexes and ``/dev/nvidia<minor>`` name cards, never slices."""
    mig = slice_of(CARD)
    assert (mig.index, mig.minor, mig.parent_uuid) == (3, 7, "GPU-card") and mig.is_mig
    assert (mig.mig_index, mig.gpu_instance_id, mig.compute_instance_id) == (2, 9, 0)
    assert (mig.profile, mig.share, mig.memory_total_bytes) == ("1g.10gb", 1 / 7, 10 << 30)
    assert not mig.mig_enabled  # MIG mode is the card's; the slice is where the compute runs
    assert mig.model == CARD.model  # unless NVML names the slice otherwise
    assert slice_of(CARD, model="H100").model == "H100"
    without_minor = Gpu("GPU-other", 1, None, "H100", mig_enabled=True)
    assert slice_of(without_minor).minor is None  # a platform without minor numbers: none for its slices either


def test_a_degraded_source_is_kept_once_with_each_note():
    snapshot = NodeSnapshot("n", 0.0, (CARD,), (), (), IdentitySource.FALLBACK, ("NVML: GPU-card: lost",))
    once = snapshot.with_degraded(FailureReason.KUBERNETES_API, "Kubernetes API unavailable: 503")
    twice = once.with_degraded(FailureReason.KUBERNETES_API, "Kubernetes API unavailable: again")
    assert snapshot.degraded == frozenset()  # frozen: the original is untouched
    assert twice.degraded == {FailureReason.KUBERNETES_API}
    assert twice.notes == (
        "NVML: GPU-card: lost",
        "Kubernetes API unavailable: 503",
        "Kubernetes API unavailable: again",
    )
    assert twice.identity_source is IdentitySource.FALLBACK and twice.gpus == (CARD,)


def test_failure_reasons_are_the_metric_labels_in_their_exported_order():
    assert [reason.value for reason in FailureReason] == ["kubelet", "nvml", "kubernetes-api", "proc", "internal"]
    assert [source.value for source in IdentitySource] == ["kubernetes", "kubernetes-stale", "fallback"]
