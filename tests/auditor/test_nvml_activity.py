"""Per-process activity in the NVML adapter: NVML's utilisation samples, read through the real pynvml from the fake.

What the adapter must get right (docs/nvml.md, "Per-process utilisation"): the versioned call first and the older
one where the driver lacks it; only samples newer than the previous snapshot's; NOT_FOUND as "all idle"; nothing at
all on a MIG-enabled card; and every failure a problem or a silence, never an exception.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_fence.auditor.model import IDLE, Activity
from gpu_fence.auditor.nvml import Nvml, NvmlSnapshot
from tests.fakes.nvml import (
    FakeError,
    FakeGpu,
    FakeMig,
    FakeNvmlConfig,
    FakeNvmlCounters,
    FakeProcess,
    FakeUtilSample,
    fake_gpu_uuid,
    fake_mig_uuid,
)

pytest_plugins = ["tests.fakes.nvml.fixtures"]  # the fake_lib and open_nvml fixtures

OpenNvml = Callable[[FakeNvmlConfig], Nvml]
GPU0, GPU1, MIG10 = fake_gpu_uuid(0), fake_gpu_uuid(1), fake_mig_uuid(1, 0)
NEW_CALL, OLD_CALL = "nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"

#: A whole H100 with three processes (two sampled) beside an H100 in MIG mode with a process in its slice.
NODE = FakeNvmlConfig(
    gpus=(FakeGpu(0), FakeGpu(1, mig=True)),
    migs=(FakeMig(1, 0, gpu_instance_id=5),),
    processes=(
        FakeProcess(0, pid=11),
        FakeProcess(0, pid=12),
        FakeProcess(0, pid=13),
        FakeProcess(MIG10, pid=21),
    ),
    samples=(
        FakeUtilSample(0, pid=11, sm=40, memory=10, encoder=2, decoder=4, at=1_000),
        FakeUtilSample(0, pid=12, sm=90, memory=50, at=2_000),
        FakeUtilSample(MIG10, pid=21, sm=70, at=2_000),
    ),
)


def activity(snapshot: NvmlSnapshot) -> dict[tuple[int, str], Activity | None]:
    return {(process.pid, process.device_uuid): process.activity for process in snapshot.processes}


def test_each_process_gets_its_samples_as_shares_of_time(open_nvml: OpenNvml) -> None:
    snapshot = open_nvml(NODE).snapshot()

    found = activity(snapshot)
    assert found[(11, GPU0)] == Activity(sm=0.40, memory_controller=0.10, encoder=0.02, decoder=0.04)
    assert found[(12, GPU0)] == Activity(sm=0.90, memory_controller=0.50)
    assert found[(13, GPU0)] == IDLE  # NVML returns samples only for processes with non-zero utilisation
    assert snapshot.activity_devices == frozenset({GPU0})
    assert snapshot.problems == ()


def test_a_mig_enabled_card_is_not_asked_and_its_activity_is_unknown(fake_lib: Path, open_nvml: OpenNvml) -> None:
    """nvml.h: "On MIG-enabled GPUs, querying process utilization is not currently supported"."""
    counters = FakeNvmlCounters(fake_lib)
    nvml = open_nvml(NODE)
    counters.reset()
    snapshot = nvml.snapshot()

    assert activity(snapshot)[(21, MIG10)] is None
    assert GPU1 not in snapshot.activity_devices and MIG10 not in snapshot.activity_devices
    assert counters.calls(NEW_CALL) == 2  # pynvml's probe and read, on GPU 0 only
    assert counters.results(NEW_CALL, "NOT_SUPPORTED") == counters.calls(OLD_CALL) == 0


def test_the_next_snapshot_reads_only_samples_newer_than_the_last_one(fake_lib: Path, open_nvml: OpenNvml) -> None:
    counters = FakeNvmlCounters(fake_lib)
    nvml = open_nvml(NODE)
    nvml.snapshot()
    counters.reset()

    again = nvml.snapshot()

    assert {activity(again)[(pid, GPU0)] for pid in (11, 12, 13)} == {IDLE}  # nothing newer than 2,000 µs
    assert again.activity_devices == frozenset({GPU0})  # NOT_FOUND: sampled, and idle
    assert counters.results(NEW_CALL, "NOT_FOUND") == 1
    assert again.problems == ()


def test_live_samples_keep_coming_across_snapshots(open_nvml: OpenNvml) -> None:
    config = FakeNvmlConfig(
        gpus=(FakeGpu(0),),
        processes=(FakeProcess(0, pid=11),),
        samples=(FakeUtilSample(0, pid=11, sm=25),),
        util_period_us=20_000,
    )
    nvml = open_nvml(config)
    first = nvml.snapshot()
    time.sleep(0.05)  # past a sampling period of the fake driver: a newer sample exists
    second = nvml.snapshot()

    assert activity(first)[(11, GPU0)] == activity(second)[(11, GPU0)] == Activity(sm=0.25)


def test_several_samples_of_one_process_are_averaged(open_nvml: OpenNvml) -> None:
    config = NODE.sampling(
        FakeUtilSample(0, pid=11, sm=20, at=1_000),
        FakeUtilSample(0, pid=11, sm=60, decoder=10, at=2_000),
    )

    assert activity(open_nvml(config).snapshot())[(11, GPU0)] == Activity(sm=0.40, decoder=0.05)


def test_samples_of_pids_in_no_process_list_are_left_out(open_nvml: OpenNvml) -> None:
    config = NODE.sampling(FakeUtilSample(0, pid=99, sm=80, at=1_000), FakeUtilSample(0, pid=11, sm=10, at=1_000))
    snapshot = open_nvml(config).snapshot()

    assert {pid for pid, _ in activity(snapshot)} == {11, 12, 13, 21}
    assert activity(snapshot)[(11, GPU0)] == Activity(sm=0.10)


def test_a_driver_without_the_versioned_call_uses_the_older_one_from_then_on(
    fake_lib: Path, open_nvml: OpenNvml
) -> None:
    counters = FakeNvmlCounters(fake_lib)
    nvml = open_nvml(NODE.with_errors(FakeError(NEW_CALL, "FUNCTION_NOT_FOUND")))
    counters.reset()

    first = nvml.snapshot()
    second = nvml.snapshot()

    assert activity(first)[(12, GPU0)] == Activity(sm=0.90, memory_controller=0.50)
    assert activity(second)[(12, GPU0)] == IDLE
    assert counters.calls(NEW_CALL) == 1  # learnt once
    assert counters.results(OLD_CALL, "INSUFFICIENT_SIZE") == 1  # pynvml's probe, then its read
    assert counters.results(OLD_CALL, "SUCCESS") == 1
    assert counters.results(OLD_CALL, "NOT_FOUND") == 1
    assert first.problems == second.problems == ()


def test_a_version_mismatch_of_the_versioned_struct_uses_the_older_call(open_nvml: OpenNvml) -> None:
    snapshot = open_nvml(NODE.with_errors(FakeError(NEW_CALL, 25))).snapshot()

    assert activity(snapshot)[(11, GPU0)] == Activity(sm=0.40, memory_controller=0.10, encoder=0.02, decoder=0.04)
    assert snapshot.problems == ()


@pytest.mark.parametrize(
    "errors",
    [
        (FakeError(NEW_CALL, "NOT_SUPPORTED"),),
        (FakeError(NEW_CALL, "FUNCTION_NOT_FOUND"), FakeError(OLD_CALL, "FUNCTION_NOT_FOUND")),
    ],
    ids=["not-supported", "neither-call"],
)
def test_a_gpu_nvml_cannot_sample_is_unknown_quietly_and_not_asked_again(
    fake_lib: Path, open_nvml: OpenNvml, errors: tuple[FakeError, ...]
) -> None:
    counters = FakeNvmlCounters(fake_lib)
    nvml = open_nvml(NODE.with_errors(*errors))
    counters.reset()
    first = nvml.snapshot()
    asked = counters.calls(NEW_CALL) + counters.calls(OLD_CALL)
    second = nvml.snapshot()

    for snapshot in (first, second):
        assert snapshot.activity_devices == frozenset()
        assert {activity(snapshot)[(pid, GPU0)] for pid in (11, 12, 13)} == {None}
        assert snapshot.problems == ()
    assert counters.calls(NEW_CALL) + counters.calls(OLD_CALL) == asked  # the second snapshot asked nothing


def test_another_error_is_a_problem_for_that_snapshot_only(open_nvml: OpenNvml) -> None:
    nvml = open_nvml(NODE.with_errors(FakeError(NEW_CALL, "UNKNOWN", device=0, times=1)))

    failed = nvml.snapshot()
    recovered = nvml.snapshot()

    assert failed.activity_devices == frozenset() and activity(failed)[(11, GPU0)] is None
    assert [(problem.device, problem.reason) for problem in failed.problems] == [(GPU0, "unknown")]
    assert "per-process utilisation" in failed.problems[0].message
    assert activity(recovered)[(12, GPU0)] == Activity(sm=0.90, memory_controller=0.50)  # the cursor did not move


def test_samples_that_appear_between_pynvmls_two_calls_are_asked_again(open_nvml: OpenNvml) -> None:
    # pynvml's probe answers; its read is refused as too small once (a sample appeared in between).
    grown = FakeError(NEW_CALL, "INSUFFICIENT_SIZE", device=0, times=2)
    snapshot = open_nvml(NODE.with_errors(grown)).snapshot()

    assert activity(snapshot)[(12, GPU0)] == Activity(sm=0.90, memory_controller=0.50)
    assert snapshot.problems == ()


def test_a_sample_count_that_never_settles_is_a_problem(open_nvml: OpenNvml) -> None:
    snapshot = open_nvml(NODE.with_errors(FakeError(NEW_CALL, "INSUFFICIENT_SIZE", device=0))).snapshot()

    assert snapshot.activity_devices == frozenset()
    assert [problem.device for problem in snapshot.problems] == [GPU0]
    assert "kept changing" in snapshot.problems[0].message


def test_a_value_above_100_percent_makes_that_gpus_activity_unknown(open_nvml: OpenNvml) -> None:
    nvml = open_nvml(NODE.sampling(FakeUtilSample(0, pid=11, sm=40, at=1_000), FakeUtilSample(0, pid=12, sm=250)))

    garbage = nvml.snapshot()

    assert garbage.activity_devices == frozenset() and activity(garbage)[(11, GPU0)] is None
    assert [(problem.device, problem.reason) for problem in garbage.problems] == [(GPU0, "unknown")]
    assert "above 100%" in garbage.problems[0].message


def test_a_gpu_lost_while_sampling_drops_the_card(open_nvml: OpenNvml) -> None:
    snapshot = open_nvml(NODE.with_errors(FakeError(NEW_CALL, "GPU_IS_LOST", device=0))).snapshot()

    assert GPU0 not in {device.uuid for device in snapshot.devices}
    assert [(problem.device, problem.reason) for problem in snapshot.problems] == [(GPU0, "gpu-lost")]


def test_reopening_starts_from_the_drivers_whole_buffer(fake_lib: Path, open_nvml: OpenNvml) -> None:
    first = open_nvml(NODE)
    first.snapshot()
    first.close()

    reopened = open_nvml(NODE).snapshot()

    assert activity(reopened)[(12, GPU0)] == Activity(sm=0.90, memory_controller=0.50)
