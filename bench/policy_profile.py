"""Where the time of one 10-container review goes: JSON parse, reading the pod, each rule, serialising.

A breakdown, not a benchmark: each step is timed alone with ``timeit`` (best of 5, one core) on the same typical
pod ``bench.policy_bench`` uses, so the steps of ``/validate`` can be compared with each other and with the
parse floor. A rule is timed as ``validate`` runs it, after the rules before it (where two rules share a pass
over the pod, the first pays for it). Run: ``python -m bench.policy_profile [--containers N]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import timeit
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from bench import machine, reviews


def best_microseconds(function: Callable[[], Any], number: int) -> float:
    return min(timeit.repeat(function, number=number, repeat=5)) / number * 1e6


def breakdown(containers: int, number: int) -> list[tuple[str, float]]:
    """(step, µs) for the steps of a ``/validate`` review of the pinned pod, in the order the server runs them."""
    from gpu_fence.webhook import policy
    from gpu_fence.webhook.config import load_config
    from gpu_fence.webhook.policy.pod import Passes, read_pod
    from gpu_fence.webhook.review import Endpoint, parse, review

    config = load_config(None)
    body = reviews.validate_body(containers)
    document = orjson.loads(body)
    pod = document["request"]["object"]
    view = read_pod(pod, config, None)
    outcome = review(document, Endpoint.VALIDATE, config, policy)
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("orjson.loads (body)", lambda: orjson.loads(body)),
        ("review.parse (envelope)", lambda: parse(document)),
        ("policy.pod.read_pod", lambda: read_pod(pod, config, None)),
    ]
    timed = [(label, best_microseconds(function, number)) for label, function in steps]
    # Each rule as validate runs it: some rules share a pass over the pod (the capabilities added, the hostPath
    # volumes, the device annotations, the MIG and IMEX variables, the values read as none), which the first of
    # them makes and the others read. So each is timed with the pod's shared state as the rules before it leave
    # it, restored before every call; the restore's own cost is measured and taken off.
    passes = view.passes
    names = [field.name for field in dataclasses.fields(Passes)]
    for rule in policy.RULES:
        state = {name: getattr(passes, name) for name in names}

        def restore(state: dict[str, Any] = state) -> None:
            for name, value in state.items():
                setattr(passes, name, value)

        def run(check: Callable[[Any], Any] = rule.check, restore: Callable[[], None] = restore) -> Any:
            restore()
            return check(view)

        cost = best_microseconds(run, number) - best_microseconds(restore, number)
        timed.append((f"rule {rule.id}", max(cost, 0.05)))
        restore()
        rule.check(view)
    tail: list[tuple[str, Callable[[], Any]]] = [
        ("policy.validate (all of the above but parse)", lambda: policy.validate(pod, config)),
        ("review.review (/validate, parsed body)", lambda: review(document, Endpoint.VALIDATE, config, policy)),
        ("orjson.dumps (response)", lambda: orjson.dumps(outcome.response)),
    ]
    return timed + [(label, best_microseconds(function, number)) for label, function in tail]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.policy_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--containers", type=int, default=10, help="containers of the typical pod (default: 10)")
    parser.add_argument("--number", type=int, default=2000, help="calls per timing (default: 2000)")
    args = parser.parse_args(argv)
    if args.containers < 1 or args.number < 1:
        parser.error("--containers and --number must be at least 1")
    machine.pin_to_one_core()
    sys.stdout.write("| step | µs |\n|---|---:|\n")
    for label, microseconds in breakdown(args.containers, args.number):
        sys.stdout.write(f"| {label} | {microseconds:.1f} |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
