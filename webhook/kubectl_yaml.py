"""YAML read the way kubectl reads it, each value with the line where it starts.

kubectl sends the API server JSON: it converts each YAML document with sigs.k8s.io/yaml (``YAMLToJSON`` and
``convertToJSONableObject`` in ``yaml.go``), which decodes with go-yaml v2 (``go.yaml.in/yaml/v2`` v2.4:
``resolve.go``, ``decode.go``, ``scannerc.go``). PyYAML resolves plain scalars by other rules, and a manifest that the
check reads one way while the API server receives another gets a false verdict (``privileged: y`` is a string to
PyYAML and ``true`` to kubectl). So documents are built here from the parser's events with go-yaml v2's rules:

- **resolution** (``resolve``): ``y Y yes Yes YES on On ON true True TRUE`` are true, ``n N no No NO off Off OFF
  false False FALSE`` false, ``~ null Null NULL`` and the empty scalar null; a plain scalar that starts with a digit
  or a sign is an integer by Go's ``strconv.ParseInt(s, 0, 64)`` once every ``_`` is removed (``0x1F``, ``0o17``,
  ``0B11``, ``017`` octal), then a float if it matches go-yaml's ``yamlStyleFloat`` (``1e0``, ``1.``, ``09``);
  sexagesimal (``1:30``) and timestamps stay strings; ``.5`` is a float;
- **tags**: ``!!str`` keeps the text, ``!!int``/``!!float``/``!!bool``/``!!null``/``!!timestamp`` must resolve to
  their type (``!!float`` takes an integer), ``!!binary`` is base64-decoded, any other tag (``!foo``, the
  non-specific ``!``) keeps the text; tags on mappings and sequences change nothing;
- **merge keys** (``decode.go``, ``mapping`` and ``merge``): ``<<`` is merged where it stands, so a key written
  before it is overridden by the merged mapping and one after it overrides; of a list of merged mappings the first
  wins; duplicate keys: the last wins;
- **JSON** (``convertToJSONableObject``, then ``encoding/json``): keys become strings (``y:`` is ``"true"``, ``1:``
  is ``"1"``, a float by ``FormatFloat(f, 'g', -1, 32)``); a null key, a collection as a key and a NaN or infinite
  value are errors, as they are to kubectl; a float with an integral value arrives as a JSON integer (``1e0`` is
  ``1``) and an integer past int64 as a float;
- **limits**: nesting deeper than 10,000 flow or block levels (``max_flow_level``, ``max_indents``), an alias that
  contains itself, and go-yaml's alias expansion ratio ("document contains excessive aliasing", ``decode.go``,
  ``allowedAliasRatio``) are errors, as to kubectl; a document larger than the reader's limit is one too.

The values are plain ``dict``/``list``/``str``/``int``/``float``/``bool``/``None``; a value reached through an alias
is the same object at each path (never copied). :class:`Lines` keeps, per mapping and sequence, the line of each key
and item, so that a report points into the file.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import yaml

__all__ = [
    "MAX_DEPTH",
    "Lines",
    "Loaded",
    "YamlError",
    "load_all",
]

try:  # libyaml's parser when PyYAML was built with it; the pure-Python parser yields the same events, slower
    _Loader: type[yaml.BaseLoader] = yaml.CBaseLoader  # type: ignore[assignment]
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.BaseLoader

#: go-yaml v2's ``max_flow_level`` and ``max_indents``: flow and block nesting past this is refused.
MAX_DEPTH = 10_000

_TAG = "tag:yaml.org,2002:"
_MERGE_TAG = _TAG + "merge"
#: go-yaml v2's ``resolvableTag``: the tags whose values must resolve to that type.
_RESOLVABLE = frozenset({"str", "bool", "int", "float", "null", "timestamp"})
_INT64 = (-(2**63), 2**63)
_UINT64_MAX = 2**64 - 1

# resolve.go: the first character says what a plain scalar may be ('M': only a word of the table below).
_HINTS = {character: "D" for character in "0123456789"}
_HINTS.update({"+": "S", "-": "S", ".": "."})
_HINTS.update({character: "M" for character in "yYnNtTfFoO~"})

_WORDS: dict[str, tuple[str, Any]] = {}
for _values, _word_tag, _words in (
    (True, "bool", "y Y yes Yes YES true True TRUE on On ON"),
    (False, "bool", "n N no No NO false False FALSE off Off OFF"),
    (None, "null", "~ null Null NULL"),
    (math.nan, "float", ".nan .NaN .NAN"),
    (math.inf, "float", ".inf .Inf .INF +.inf +.Inf +.INF"),
    (-math.inf, "float", "-.inf -.Inf -.INF"),
):
    for _word in _words.split():
        _WORDS[_word] = (_word_tag, _values)

#: go-yaml v2.4's ``yamlStyleFloat``, applied once underscores are removed.
_STYLE_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
#: What Go's ``strconv.ParseFloat`` takes of a scalar that starts with a dot (underscores only between digits).
_DOT_FLOAT = re.compile(r"\.[0-9](_?[0-9])*([eE][-+]?[0-9](_?[0-9])*)?")
#: The timestamp layouts go-yaml v2 tries (``allowedTimestampFormats``), for an explicit ``!!timestamp``.
_TIMESTAMP = re.compile(
    r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}"
    r"([Tt][0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(\.[0-9]+)?(Z|[-+][0-9]{2}:[0-9]{2})"
    r"| [0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(\.[0-9]+)?)?"
)
_DIGITS = {16: frozenset("0123456789abcdefABCDEF"), 10: frozenset("0123456789"), 8: frozenset("01234567")}
_DIGITS[2] = frozenset("01")
_PREFIXES = {"0x": 16, "0X": 16, "0o": 8, "0O": 8, "0b": 2, "0B": 2}


class YamlError(Exception):
    """A document that cannot be read, or that kubectl would not read either: ``message`` says which, in one line
    without the source's name; ``line`` is 1-based, None when no line says it; ``syntax`` is set when the text is not
    YAML at all (a JSON reader may still read it)."""

    def __init__(self, line: int | None, message: str, *, syntax: bool = False) -> None:
        super().__init__(message)
        self.line = line
        self.message = message
        self.syntax = syntax


def _refused(line: int | None, problem: str) -> YamlError:
    return YamlError(line, f"kubectl cannot read it: {problem}")


class Lines:
    """Where each key of every mapping and each item of every sequence of one document starts (1-based lines)."""

    __slots__ = ("_by_id", "_literal")

    def __init__(self) -> None:
        # keyed by id(), holding the container too so that the id cannot be reused while the index lives
        self._by_id: dict[int, tuple[Any, dict[str, int] | list[int]]] = {}
        # (id of the container, key or index) of each literal block scalar (`|`): the line its text starts on
        self._literal: dict[tuple[int, str | int], int] = {}

    def add(self, container: dict[str, Any] | list[Any], lines: dict[str, int] | list[int]) -> None:
        self._by_id[id(container)] = (container, lines)

    def add_literal(self, container: dict[str, Any] | list[Any], key: str | int, text_line: int) -> None:
        self._literal[(id(container), key)] = text_line

    def of(self, container: Any) -> dict[str, int] | list[int] | None:
        """The lines of one mapping's keys or one sequence's items, None for a value this index does not hold."""
        entry = self._by_id.get(id(container))
        return None if entry is None else entry[1]

    def literal_start(self, root: Any, path: Sequence[str | int]) -> int | None:
        """For a string written as a literal block scalar (``|``), the line of its first line of text: its text's
        lines are the file's lines from there on. None for any other value."""
        if not path or self.line_of(root, path) is None:
            return None
        parent = root
        for segment in path[:-1]:
            parent = parent[segment]
        return self._literal.get((id(parent), path[-1]))

    def line_of(self, root: Any, path: Sequence[str | int]) -> int | None:
        """The line where the value at ``path`` starts below ``root`` (its key's line in a mapping, its own line in a
        sequence), or None when the path is not there or is empty."""
        value, line = root, None
        for segment in path:
            lines = self.of(value)
            if lines is None:
                return None
            if isinstance(lines, dict):
                if not isinstance(segment, str) or segment not in lines:
                    return None
            elif not isinstance(segment, int) or not 0 <= segment < len(lines):
                return None
            line = lines[segment]  # type: ignore[index]
            value = value[segment]
        return line


@dataclass(frozen=True)
class Loaded:
    """One document: its data as the API server would receive it, the line where it starts, and its lines."""

    line: int
    data: Any
    lines: Lines


class DocumentTooLarge(Exception):
    """Raised by the reader inside the parser when one document passes the size limit."""


class Readable(Protocol):
    """What :func:`load_all` reads from: a binary stream's ``read`` (a file, stdin, a stream whose head was read)."""

    def read(self, size: int, /) -> bytes: ...


class _Reader:
    """The stream the parser reads, counting what it hands over so that one document cannot grow without bound.

    The parser reads ahead in chunks, so the count since a document began can include the tail of the one before:
    the limit is approximate by one chunk, never exceeded by more."""

    def __init__(self, stream: Readable, limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self.consumed = 0
        self.document_start = 0

    def read(self, size: int) -> bytes:
        chunk = self._stream.read(size)
        self.consumed += len(chunk)
        if self.consumed - self.document_start > self._limit:
            raise DocumentTooLarge
        return chunk


def load_all(stream: Readable, *, max_document_bytes: int) -> Iterator[Loaded]:
    """Each non-empty document of a YAML (or JSON) stream, read as kubectl reads it, one at a time.

    Raises :class:`YamlError` for YAML that does not parse and for documents kubectl would refuse; a document that
    passes ``max_document_bytes`` is refused too, so that memory stays bounded by one document.
    """
    reader = _Reader(stream, max_document_bytes)
    loader = _Loader(reader)  # type: ignore[arg-type]
    try:
        while True:
            try:
                event = loader.get_event()  # type: ignore[no-untyped-call]  # unannotated in types-PyYAML
                if event is None or isinstance(event, yaml.StreamEndEvent):
                    return
                if not isinstance(event, yaml.DocumentStartEvent):
                    continue
                reader.document_start = reader.consumed
                document = _Document(loader)
                data, line = document.build()
            except DocumentTooLarge:
                raise YamlError(
                    None,
                    f"a document is larger than {max_document_bytes / 2**20:g} MiB, which no single object is "
                    "(a List that large: check the live pods with --cluster, or split it)",
                ) from None
            except yaml.MarkedYAMLError as error:
                mark = error.problem_mark or error.context_mark
                problem = error.problem or error.context or str(error).splitlines()[0]
                at = None if mark is None else mark.line + 1
                raise YamlError(at, f"YAML does not parse: {problem}", syntax=True) from None
            except yaml.reader.ReaderError as error:
                raise YamlError(None, f"not UTF-8 text (byte {error.position})") from None
            if data is not None:
                yield Loaded(line, data, document.lines)
    finally:
        loader.dispose()


# --- building one document -------------------------------------------------------------------------------------

_EXPECT_KEY = object()  # a mapping frame's key before its next key is read
_MERGE = object()  # a mapping frame's key while the value of `<<` is read


class _Mapping:
    __slots__ = ("anchor", "data", "flow", "key", "key_line", "line", "lines", "start")

    def __init__(self, anchor: str | None, flow: bool, start: int, line: int) -> None:
        self.data: dict[str, Any] = {}
        self.lines: dict[str, int] = {}
        self.anchor = anchor
        self.flow = flow
        self.start = start  # the decode count when it began: what re-decoding it through an alias costs
        self.line = line
        self.key: Any = _EXPECT_KEY
        self.key_line = 0


class _Sequence:
    __slots__ = ("anchor", "data", "flow", "line", "lines", "merge_into", "start")

    def __init__(self, anchor: str | None, flow: bool, start: int, line: int, merge_into: _Mapping | None) -> None:
        self.data: list[Any] = []
        self.lines: list[int] = []
        self.anchor = anchor
        self.flow = flow
        self.start = start
        self.line = line
        self.merge_into = merge_into  # set for the list of mappings a `<<` merges


@dataclass(frozen=True)
class _Anchor:
    value: Any  # a scalar's resolved value (not yet made JSON: it may be used as a key) or a built collection
    cost: int  # the decodes go-yaml repeats each time an alias expands it
    collection: bool


class _Document:
    """The state of one document while its events are read: the open collections, anchors, go-yaml's counters."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self.lines = Lines()
        self._stack: list[_Mapping | _Sequence] = []
        self._anchors: dict[str, _Anchor] = {}
        self._open: set[str] = set()  # anchors of collections still being read: an alias to one contains itself
        self._decodes = 1  # go-yaml counts the document node too
        self._aliased = 0
        self._depth = {True: 0, False: 0}  # open flow and block collections

    def build(self) -> tuple[Any, int]:
        """Read events up to the document's end; its data and the line where its content starts."""
        get_event = self._loader.get_event
        root: tuple[Any, int] = (None, 1)
        while True:
            event = get_event()
            kind = type(event)
            if kind is yaml.DocumentEndEvent:
                return root
            if kind is yaml.ScalarEvent:
                done = self._scalar(event, event.start_mark.line + 1)
            elif kind is yaml.AliasEvent:
                done = self._alias(event, event.start_mark.line + 1)
            elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                self._start(event, kind is yaml.MappingStartEvent, event.start_mark.line + 1)
                continue
            else:  # the end of a mapping or sequence
                done = self._end()
            if done is not None:
                root = done

    # Each handler returns (value, line) when it completed a value at the top level (the stack is empty), else None.

    def _count(self, line: int, decodes: int, aliased: int = 0) -> None:
        self._decodes += decodes
        self._aliased += aliased
        # decode.go's check, made at every decode there; the same ratio, the same thresholds
        if self._aliased > 100 and self._decodes > 1000 and self._aliased / self._decodes > _allowed(self._decodes):
            raise _refused(line, "document contains excessive aliasing")

    def _scalar(self, event: yaml.ScalarEvent, line: int) -> tuple[Any, int] | None:
        top = self._stack[-1] if self._stack else None
        if (
            type(top) is _Mapping
            and top.key is _EXPECT_KEY
            and event.value == "<<"
            and (event.implicit[0] or event.tag == _MERGE_TAG)
        ):
            top.key, top.key_line = _MERGE, line  # go-yaml does not decode (nor count) a merge key
            return None
        self._count(line, 1)
        raw = _scalar_value(event, line)
        if event.anchor is not None:
            self._anchors[event.anchor] = _Anchor(raw, 1, collection=False)
        if event.style == "|" and self._stack:  # the text starts on the line after the `|` header
            self._note_literal(self._stack[-1], line + 1)
        return self._place(raw, line, scalar=True)

    def _note_literal(self, top: _Mapping | _Sequence, text_line: int) -> None:
        if isinstance(top, _Mapping):
            if isinstance(top.key, str):
                self.lines.add_literal(top.data, top.key, text_line)
        elif top.merge_into is None:
            self.lines.add_literal(top.data, len(top.data), text_line)

    def _alias(self, event: yaml.AliasEvent, line: int) -> tuple[Any, int] | None:
        name = event.anchor or ""  # an alias always names its anchor
        if name in self._open:
            raise _refused(line, f"anchor '{name}' value contains itself")
        anchor = self._anchors.get(name)
        if anchor is None:
            raise YamlError(line, f"YAML does not parse: found undefined alias '{name}'", syntax=True)
        self._count(line, 1 + anchor.cost, anchor.cost)
        return self._place(anchor.value, line, scalar=not anchor.collection)

    def _start(self, event: Any, mapping: bool, line: int) -> None:
        top = self._stack[-1] if self._stack else None
        if type(top) is _Mapping and top.key is _EXPECT_KEY:
            raise _refused(line, f"a {'mapping' if mapping else 'sequence'} is used as a mapping key")
        flow = bool(event.flow_style)
        self._depth[flow] += 1
        if self._depth[flow] > MAX_DEPTH:
            raise _refused(line, f"exceeded max depth of {MAX_DEPTH}")
        merge_list = not mapping and type(top) is _Mapping and top.key is _MERGE
        if not merge_list:  # go-yaml decodes a merged list's items, never the list itself
            self._count(line, 1)
        if event.anchor is not None:
            self._open.add(event.anchor)
        start = self._decodes - (0 if merge_list else 1)
        frame: _Mapping | _Sequence
        if mapping:
            frame = _Mapping(event.anchor, flow, start, line)
        else:
            frame = _Sequence(event.anchor, flow, start, line, top if merge_list else None)  # type: ignore[arg-type]
        self._stack.append(frame)

    def _end(self) -> tuple[Any, int] | None:
        frame = self._stack.pop()
        self._depth[frame.flow] -= 1
        self.lines.add(frame.data, frame.lines)
        if frame.anchor is not None:
            self._open.discard(frame.anchor)
            self._anchors[frame.anchor] = _Anchor(frame.data, self._decodes - frame.start, collection=True)
        if isinstance(frame, _Sequence) and frame.merge_into is not None:
            target = frame.merge_into
            for merged in reversed(frame.data):  # the earlier mappings take precedence
                _merge(target, merged, self._lines_of(merged))
            target.key = _EXPECT_KEY
            return None
        return self._place(frame.data, frame.line)

    def _place(self, value: Any, line: int, *, scalar: bool = False) -> tuple[Any, int] | None:
        """Put a completed value where it belongs: a key, a mapping's value, a merge, a sequence's item, the root."""
        if not self._stack:
            return (_json_value(value, line) if scalar else value), line
        top = self._stack[-1]
        if isinstance(top, _Mapping):
            if top.key is _EXPECT_KEY:
                if not scalar:
                    raise _refused(line, "a mapping or sequence is used as a mapping key")
                top.key, top.key_line = _json_key(value, line), line
            elif top.key is _MERGE:
                if not isinstance(value, dict) or scalar:
                    raise _refused(line, "map merge requires map or sequence of maps as the value")
                _merge(top, value, self._lines_of(value))
                top.key = _EXPECT_KEY
            else:
                top.data[top.key] = _json_value(value, line) if scalar else value
                top.lines[top.key] = top.key_line
                top.key = _EXPECT_KEY
            return None
        if top.merge_into is not None and (not isinstance(value, dict) or scalar):
            raise _refused(line, "map merge requires map or sequence of maps as the value")
        top.data.append(_json_value(value, line) if scalar else value)
        top.lines.append(line)
        return None

    def _lines_of(self, mapping: dict[str, Any]) -> dict[str, int]:
        lines = self.lines.of(mapping)
        return lines if isinstance(lines, dict) else {}


def _merge(target: _Mapping, merged: dict[str, Any], merged_lines: dict[str, int]) -> None:
    for key, value in merged.items():
        target.data[key] = value
        target.lines[key] = merged_lines.get(key, target.key_line)


def _allowed(decodes: int) -> float:
    """go-yaml v2's ``allowedAliasRatio``: the share of decodes that may come from alias expansion."""
    if decodes <= 400_000:
        return 0.99
    if decodes >= 4_000_000:
        return 0.10
    return 0.99 - 0.89 * (decodes - 400_000) / 3_600_000


# --- scalars ---------------------------------------------------------------------------------------------------


def _scalar_value(event: yaml.ScalarEvent, line: int) -> Any:
    """A scalar as go-yaml v2 decodes it into ``interface{}`` (before the JSON conversion)."""
    tag = event.tag
    if tag is None:
        return resolve(event.value)[1] if event.implicit[0] else event.value  # a quoted scalar is a string
    if not tag.startswith(_TAG):
        return event.value  # a local tag (`!foo`) or the non-specific `!`: go-yaml keeps the text
    short = tag[len(_TAG) :]
    if short == "binary":
        try:
            data = base64.b64decode(event.value.replace("\n", "").replace("\r", ""), validate=True)
        except (binascii.Error, ValueError):
            raise _refused(line, "!!binary value contains invalid base64 data") from None
        return data.decode("utf-8", "replace")  # encoding/json writes invalid UTF-8 as U+FFFD
    if short not in _RESOLVABLE or short == "str":
        return event.value
    if short == "timestamp" and _TIMESTAMP.fullmatch(event.value):
        return event.value  # decoded into interface{}, a timestamp stays its text
    resolved_tag, value = resolve(event.value)
    if resolved_tag == short:
        return value
    if short == "float" and resolved_tag == "int":
        return float(value)
    raise _refused(line, f"cannot decode !!{resolved_tag} `{event.value}` as a !!{short}")


def resolve(text: str) -> tuple[str, Any]:
    """go-yaml v2's ``resolve`` of an untagged plain scalar: its tag (``str``, ``bool``, ``int``, ``float``,
    ``null``) and value. Timestamps are left as ``str``: decoded into ``interface{}`` they stay their text."""
    if not text:
        return "null", None
    hint = _HINTS.get(text[0])
    if hint is None:
        return "str", text
    word = _WORDS.get(text)
    if word is not None:
        return word
    if hint == "M":
        return "str", text
    if hint == ".":
        if _DOT_FLOAT.fullmatch(text):
            return "float", float(text.replace("_", ""))
        return "str", text
    plain = text.replace("_", "")
    number = _go_int(plain)
    if number is not None:
        return "int", number
    if _STYLE_FLOAT.fullmatch(plain):
        value = float(plain)
        if not math.isinf(value):  # strconv.ParseFloat fails on overflow, and the scalar stays a string
            return "float", value
    return "str", text


def _go_int(text: str) -> int | None:
    """Go's ``strconv.ParseInt(text, 0, 64)``, then ``ParseUint(text, 0, 64)``, as go-yaml v2 tries them."""
    signed = text[:1] in ("+", "-")
    body = text[1:] if signed else text
    base = _PREFIXES.get(body[:2])
    if base is not None:
        digits = body[2:]
    elif len(body) > 1 and body[0] == "0":
        base, digits = 8, body[1:]
    else:
        base, digits = 10, body
    if not digits or not _DIGITS[base].issuperset(digits):
        return None
    number = int(digits, base)
    if text[:1] == "-":
        number = -number
    if _INT64[0] <= number < _INT64[1] or (not signed and number <= _UINT64_MAX):
        return number
    return None


def _json_value(value: Any, line: int) -> Any:
    """A decoded scalar as the API server reads it back from kubectl's JSON."""
    if type(value) is float:
        if not math.isfinite(value):
            raise _refused(line, f"json: unsupported value: {_go_float_name(value)} (JSON has no such number)")
        if value.is_integer() and _INT64[0] <= value < _INT64[1]:
            return int(value)  # encoding/json writes 1e0 as 1: an integer to whoever reads it
        return value
    if type(value) is int and not _INT64[0] <= value < _INT64[1]:
        return float(value)  # past int64, a JSON number is read back as a float
    return value


def _json_key(value: Any, line: int) -> str:
    """A decoded scalar key as sigs.k8s.io/yaml turns it into a JSON object key."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if _INT64[0] <= value < _INT64[1]:
            return str(value)
        raise _refused(line, f"unsupported map key of type: uint64, key: {value}")
    if isinstance(value, float):
        return _go_float32(value)
    raise _refused(line, "unsupported map key of type: null (a mapping key is empty or null)")


def _go_float_name(value: float) -> str:
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def _go_float32(value: float) -> str:
    """``strconv.FormatFloat(value, 'g', -1, 32)`` with go-yaml's names for the infinities and NaN."""
    if math.isnan(value):
        return ".nan"
    try:
        single = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        single = math.copysign(math.inf, value)
    if math.isinf(single):
        return ".inf" if single > 0 else "-.inf"
    text = "0e+00"
    for precision in range(9):  # the shortest decimal that reads back as the same float32
        text = f"{abs(single):.{precision}e}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == abs(single):
            break
    mantissa, exponent_text = text.split("e")
    digits, exponent = mantissa.replace(".", "").rstrip("0") or "0", int(exponent_text)
    sign = "-" if math.copysign(1.0, single) < 0 else ""
    if exponent < -4 or exponent >= 6:  # %e when shortest, as Go decides for 'g'
        fraction = f".{digits[1:]}" if len(digits) > 1 else ""
        return f"{sign}{digits[0]}{fraction}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    if exponent < 0:
        return f"{sign}0.{'0' * (-exponent - 1)}{digits}"
    whole, fraction = digits[: exponent + 1].ljust(exponent + 1, "0"), digits[exponent + 1 :]
    return f"{sign}{whole}{'.' + fraction if fraction else ''}"
