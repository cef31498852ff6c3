"""YAML read as kubectl reads it (``webhook.kubectl_yaml``), checked against kubectl itself.

``kubectl label --local -f FILE -o json`` reads a manifest the way ``kubectl apply`` does (sigs.k8s.io/yaml over
go-yaml v2) and prints the JSON it would send, without a cluster: the oracle for every reading below. kubectl is a
test dependency (installed in CI, as for the kustomization tests).
"""

from __future__ import annotations

import io
import json
import math
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_fence.webhook import kubectl_yaml
from gpu_fence.webhook.kubectl_yaml import MAX_DEPTH, YamlError, load_all, resolve

LIMIT = 2**26


def kubectl() -> str:
    path = shutil.which("kubectl")
    assert path, "kubectl is needed: it is the reference these tests compare with"
    return path


def as_kubectl_sends(path: Path) -> tuple[int, Any, str]:
    """kubectl's own reading of a one-document manifest: exit status, the object as JSON, stderr."""
    done = subprocess.run(
        [kubectl(), "label", "--local", "-f", str(path), "-o", "json", "gpu-fence.io/probe=1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, json.loads(done.stdout) if done.returncode == 0 else None, done.stderr


def load(text: str) -> list[Any]:
    return [document.data for document in load_all(io.BytesIO(text.encode()), max_document_bytes=LIMIT)]


def load_one(text: str) -> Any:
    [data] = load(text)
    return data


def thing(spec_lines: list[str]) -> str:
    """A custom resource kubectl reads without its schema, holding ``spec_lines`` under ``spec``."""
    return "apiVersion: example.com/v1\nkind: Thing\nmetadata:\n  name: probe\nspec:\n" + "".join(
        f"  {line}\n" for line in spec_lines
    )


def same_json(ours: Any, theirs: Any) -> bool:
    """Equal as JSON documents; numbers compared as numbers (kubectl prints a float past 2**53 in its shortest form)."""
    if isinstance(ours, bool) or isinstance(theirs, bool):
        return ours is theirs
    if isinstance(ours, int | float) and isinstance(theirs, int | float):
        return float(ours) == float(theirs)
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return ours.keys() == theirs.keys() and all(same_json(ours[key], theirs[key]) for key in ours)
    if isinstance(ours, list) and isinstance(theirs, list):
        return len(ours) == len(theirs) and all(map(same_json, ours, theirs))
    return bool(ours == theirs and type(ours) is type(theirs))


# --- plain scalars: resolution, as values and as keys, against kubectl -------------------------------------------


def words(text: str) -> list[str]:
    return text.split()


CURATED = [
    # booleans (y/Y/n/N are go-yaml v2's, not PyYAML's), and words that are not booleans
    *words("y Y yes Yes YES n N no No NO on On ON off Off OFF true True TRUE false False FALSE"),
    *words("yEs tRUE oN nO Yes! yy o f t"),
    # null
    *words("~ null Null NULL nULL"),
    # integers: bases, underscores, signs, leading zeros, past int64
    *words("0 00 017 018 09 0o17 0O17 0x1F 0X1f 0x_1F 0b101 0B11 -0b101 +0x10 1_000 1__0 1_ -1_000 +1 -0"),
    *words("9223372036854775807 9223372036854775808 18446744073709551615 18446744073709551616"),
    *words("-9223372036854775808"),
    *words("-9223372036854775809 123456789012345678901234567890 0x8000000000000000 -0x8000000000000000"),
    # floats: go-yaml's yamlStyleFloat (1e0 and 1. are numbers), the dot branch, what stays a string
    *words("1e0 1E3 1e+0 1.5e+3 1.5e3 0.1 0.1_5 1. 0. 1_0.5 .5 .5e3 ._5 .5_5 +.5 -.5 1e400 1e-400 0x1p3 1e 1e+"),
    # sexagesimal and timestamps stay strings
    *words("1:30 190:20:30 12:30:00 2024-01-02 2001-12-14T21:59:43.10-05:00 2024-1-2"),
    # quantities as written in resource requests
    *words("1000m 1Gi 100Mi 1e3m 0.5 2 500M"),
    # odd ones
    *words("NaN nan Infinity inf +inf -- +- 0x 0o 0b 1a a1 << ="),
]


def generated(count: int, seed: int) -> list[str]:
    """Number-like scalars from the characters go-yaml's resolution turns on."""
    rng = random.Random(seed)
    alphabet = "0123456789_.eExXoObB+-"
    found: list[str] = []
    while len(found) < count:
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7)))
        if text.startswith("-") and (len(text) == 1 or text[1] in " -"):
            continue  # a block sequence entry, not a scalar
        found.append(text)
    return found


def readable(text: str) -> bool:
    """Leaves out the scalars kubectl refuses outright (NaN and infinities cannot be JSON): tested on their own."""
    tag, value = resolve(text)
    return not (tag == "float" and not math.isfinite(value))


def both_readings(path: Path, spec_lines: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``spec`` of a custom resource holding ``spec_lines``, as check reads it and as kubectl sends it."""
    path.write_text(thing(spec_lines))
    code, sent, stderr = as_kubectl_sends(path)
    assert code == 0, stderr
    return load_one(path.read_text())["spec"], sent["spec"]


def test_every_plain_scalar_is_read_as_kubectl_reads_it(tmp_path: Path) -> None:
    scalars = [text for text in dict.fromkeys(CURATED + generated(400, seed=22)) if readable(text)]
    ours, theirs = both_readings(tmp_path / "values.yaml", [f"v{index}: {text}" for index, text in enumerate(scalars)])
    differ = [
        (text, ours[f"v{index}"], theirs[f"v{index}"])
        for index, text in enumerate(scalars)
        if not same_json(ours[f"v{index}"], theirs[f"v{index}"])
    ]
    assert differ == []


def test_every_plain_scalar_key_becomes_the_json_key_kubectl_makes(tmp_path: Path) -> None:
    def key_ok(text: str) -> bool:
        tag, value = resolve(text)
        refused = tag == "null" or (tag == "int" and value >= 2**63)  # kubectl refuses those keys (below)
        return not refused and text != "<<"  # `<<` is a merge

    scalars = [text for text in dict.fromkeys(CURATED + generated(200, seed=23)) if key_ok(text)]
    ours, theirs = both_readings(
        tmp_path / "keys.yaml", [f"k{index}: {{{text}: v}}" for index, text in enumerate(scalars)]
    )
    differ = [
        (text, list(ours[f"k{index}"]), list(theirs[f"k{index}"]))
        for index, text in enumerate(scalars)
        if ours[f"k{index}"] != theirs[f"k{index}"]
    ]
    assert differ == []


TAGS_AND_MERGES = [
    "t1: !!str y",
    "t2: !foo y",
    "t3: ! y",
    "t4: ! 1",
    't5: !!bool "yes"',
    "t6: !!timestamp 2024-01-01",
    "t7: !!float 1",
    '!!str t8: !!int "0x10"',
    "t9: !!binary aGVsbG8=",
    "t10: !!set {a, b}",
    "t11: !bar {q: y}",
    "t12: !!omap [{a: 1}]",
    "t13: !!null ''",
    "t14: !!python/object:os.system x",  # a tag is never a constructor: the text
    "base: &base {privileged: true, x: 1}",
    "base2: &base2 {privileged: false, y: 2}",
    "m1: {privileged: false, <<: *base}",
    "m2: {<<: *base, privileged: false}",
    "m3: {<<: [*base2, *base]}",
    "m4: {<<: [*base, *base2]}",
    "m5: {'<<': *base}",
    "m6: {<<: {inline: y}, inline: n}",
    "m7: {!!merge '<<': *base}",
    "m8: {<<: &merged [*base2, *base]}",
    "m9: *merged",
    "d1: {privileged: true, privileged: false}",
    "q1: 'y'",
    'q2: "on"',
    "a1: &num 0x10",
    "a2: {*num : sixteen}",
    "s1: |\n    line\n    y",
    "s2: >-\n    folded\n    y",
]


def test_tags_merge_keys_duplicates_and_quoting_as_kubectl_reads_them(tmp_path: Path) -> None:
    ours, theirs = both_readings(tmp_path / "tags.yaml", TAGS_AND_MERGES)
    assert same_json(ours, theirs), (ours, theirs)
    # what matters to a verdict, spelled out: a key before `<<` is overridden, the first merged mapping wins
    assert ours["m1"]["privileged"] is True and ours["m2"]["privileged"] is False
    assert ours["m3"]["privileged"] is False and ours["m4"]["privileged"] is True
    assert ours["t3"] == "y" and ours["t4"] == "1" and ours["t2"] == "y"


@pytest.mark.parametrize(
    ("spec_line", "ours", "kubectls"),
    [
        ("a: .inf", "json: unsupported value: +Inf", "json: unsupported value: +Inf"),
        ("a: -.Inf", "json: unsupported value: -Inf", "json: unsupported value: -Inf"),
        ("a: .nan", "json: unsupported value: NaN", "json: unsupported value: NaN"),
        ("a: {~: x}", "unsupported map key of type: null", "unsupported map key of type: %!s(<nil>)"),
        ("a: {9223372036854775808: x}", "unsupported map key of type: uint64", "unsupported map key of type: uint64"),
        ("a: {[x]: y}", "a sequence is used as a mapping key", "invalid map key"),
        ("a: &loop [*loop]", "anchor 'loop' value contains itself", "anchor 'loop' value contains itself"),
        ("a: {<<: [x]}", "map merge requires map or sequence of maps", "map merge requires map or sequence of maps"),
        ("a: {<<: 1}", "map merge requires map or sequence of maps", "map merge requires map or sequence of maps"),
        ("a: !!int 1.5", "cannot decode !!float `1.5` as a !!int", "cannot decode !!float `1.5` as a !!int"),
        ("a: !!binary '%%%'", "!!binary value contains invalid base64 data", "!!binary value contains invalid base64"),
    ],
)
def test_what_kubectl_refuses_is_refused_with_its_reason(
    tmp_path: Path, spec_line: str, ours: str, kubectls: str
) -> None:
    path = tmp_path / "refused.yaml"
    path.write_text(thing([spec_line]))
    code, _, stderr = as_kubectl_sends(path)
    assert code != 0
    assert kubectls in stderr
    with pytest.raises(YamlError) as raised:
        load(path.read_text())
    assert raised.value.message.startswith(f"kubectl cannot read it: {ours}")
    assert raised.value.line == 6  # the line of `spec`'s entry


def test_an_alias_bomb_is_refused_like_kubectl_and_moderate_aliasing_is_not(tmp_path: Path) -> None:
    def doubled(levels: int) -> str:
        lines = ["a: &a [x]"]
        previous = "a"
        for level in range(levels):
            lines.append(f"l{level}: &l{level} [*{previous}, *{previous}]")
            previous = f"l{level}"
        return thing(lines)

    bomb, fine = tmp_path / "bomb.yaml", tmp_path / "fine.yaml"
    bomb.write_text(doubled(20))  # 2**20 values from 22 lines
    fine.write_text(doubled(5))  # 32 values: within go-yaml's ratio
    assert "document contains excessive aliasing" in as_kubectl_sends(bomb)[2]
    with pytest.raises(YamlError, match=r"^kubectl cannot read it: document contains excessive aliasing$"):
        load(bomb.read_text())
    code, sent, stderr = as_kubectl_sends(fine)
    assert code == 0, stderr
    assert same_json(load_one(fine.read_text())["spec"], sent["spec"])


@pytest.mark.parametrize("opening", ["[", "{a: ", "- "])
def test_deep_nesting_is_refused_not_a_crash(opening: str) -> None:
    # PyYAML's composer recurses in C and crashed the process at about 100,000 levels; libyaml (as PyYAML 6.0.4
    # bundles it) stops at 1,000 levels, go-yaml at 10,000
    text = opening * 200_000 + "x"
    with pytest.raises(YamlError, match=r"exceeded max(imum nesting)? depth"):
        load(text)


@pytest.mark.parametrize("opening", ["{a: ", "- "])  # (`[` alone is slow in PyYAML's pure-Python scanner)
def test_nesting_past_go_yamls_limit_is_refused_by_the_pure_python_parser_too(
    opening: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubectl_yaml, "_Loader", yaml.BaseLoader)  # no nesting limit of its own
    with pytest.raises(YamlError, match=f"^kubectl cannot read it: exceeded max depth of {MAX_DEPTH}$"):
        load(opening * (MAX_DEPTH + 1) + "x")


def test_nesting_as_deep_as_manifests_go_is_read() -> None:
    depth = 1000
    data = load_one("[" * depth + "1" + "]" * depth)
    for _ in range(depth):
        [data] = data
    assert data == 1


def test_a_document_past_the_size_limit_is_refused() -> None:
    text = "a: 1\n---\nb: [" + "1, " * 200_000 + "]\n"
    stream = load_all(io.BytesIO(text.encode()), max_document_bytes=100_000)
    assert next(stream).data == {"a": 1}
    with pytest.raises(YamlError, match=r"larger than 0\.0953674 MiB"):
        next(stream)


def test_documents_are_read_one_at_a_time() -> None:
    class Counting(io.BytesIO):
        def __init__(self, data: bytes) -> None:
            super().__init__(data)
            self.consumed = 0

        def read(self, size: int | None = -1) -> bytes:
            chunk = super().read(size)
            self.consumed += len(chunk)
            return chunk

    stream = Counting(("apiVersion: v1\nkind: ConfigMap\ndata: {a: b}\n---\n" * 200_000).encode())  # 8.4 MB
    documents = load_all(stream, max_document_bytes=LIMIT)
    assert next(documents).data["data"] == {"a": "b"}
    assert stream.consumed < 100_000  # the first document came before the stream was read


# --- lines ----------------------------------------------------------------------------------------------------


def test_lines_of_keys_items_merges_and_literal_blocks() -> None:
    text = """\
base: &base
  image: x
  privileged: true
spec:
  containers:
    - name: a
      <<: *base
    - name: b
  manifest: |
    apiVersion: v1
    kind: Pod
  folded: >
    text
"""
    [document] = load_all(io.BytesIO(text.encode()), max_document_bytes=LIMIT)
    lines, data = document.lines, document.data
    assert document.line == 1
    assert lines.line_of(data, ("spec", "containers", 1)) == 8
    assert lines.line_of(data, ("spec", "containers", 0, "name")) == 6
    assert lines.line_of(data, ("spec", "containers", 0, "privileged")) == 3  # where the merged key is written
    assert lines.line_of(data, ("spec", "containers", 2)) is None
    assert lines.line_of(data, ("spec", "nope")) is None
    assert lines.line_of(data, ()) is None
    assert lines.literal_start(data, ("spec", "manifest")) == 10
    assert lines.literal_start(data, ("spec", "folded")) is None
