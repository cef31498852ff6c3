"""Reading manifests for the offline ``check``: files, directories and stdin, with line numbers.

YAML is composed into nodes first (libyaml's C parser when present) and each node is then constructed into
plain Python data; the node tree is kept beside the data so that a path inside a document can be turned
into the line where it starts (for reports and SARIF regions) without a slower line-tracking loader.

Nothing here knows about pods or policy. Errors are :class:`SourceError` with a one-line message that
names the file and, for YAML that does not parse, the line.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import yaml

try:  # libyaml is an optional part of PyYAML; the pure-Python loader reads the same documents, slower.
    _Loader: type[yaml.SafeLoader] = yaml.CSafeLoader  # type: ignore[assignment]
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader

#: File name endings read when a directory is given.
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")

#: The source name used for standard input, in reports as on the command line.
STDIN = "-"

PathSegment = str | int


class SourceError(Exception):
    """A source could not be read or parsed; the message is one line naming the file (and line)."""


@dataclass(frozen=True)
class Document:
    """One document of a source: its constructed data and where it starts.

    ``node`` is the composed YAML node the data was built from (None for JSON read without YAML), kept so
    that :func:`line_of` can locate paths inside the document.
    """

    source: str
    line: int
    data: Any
    node: yaml.Node | None = None

    def line_of(self, path: Sequence[PathSegment], default: int | None = None) -> int:
        """1-based line where ``path`` starts inside this document; ``default`` (else the document's own
        line) when the path is not there or the document has no node tree."""
        found = None if self.node is None else line_of(self.node, path)
        if found is not None:
            return found
        return self.line if default is None else default


def expand_paths(paths: Iterable[str]) -> list[str]:
    """Turn command-line paths into the list of sources to read, in a stable order.

    Directories are walked recursively (sorted, symlinked directories not followed) for
    :data:`MANIFEST_SUFFIXES`; files named explicitly are read whatever their name; ``-`` is stdin.
    """
    sources: list[str] = []
    for path in paths:
        if path == STDIN:
            sources.append(STDIN)
        elif os.path.isdir(path):
            sources.extend(_walk(path))
        elif os.path.exists(path):
            sources.append(path)
        else:
            raise SourceError(f"{path}: no such file or directory")
    return sources


def _walk(directory: str) -> Iterator[str]:
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(MANIFEST_SUFFIXES):
                yield os.path.join(root, name)


def read_source(source: str, stdin: IO[bytes] | None = None) -> list[Document]:
    """Read every document of one source (a file path, or ``-`` for stdin)."""
    try:
        if source == STDIN:
            raw = (stdin if stdin is not None else sys.stdin.buffer).read()
        else:
            with open(source, "rb") as handle:
                raw = handle.read()
    except OSError as error:
        raise SourceError(f"{source}: cannot read: {error.strerror or error}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise SourceError(f"{source}: not UTF-8 text (byte {error.start})") from None
    return parse_documents(text, source)


def parse_documents(text: str, source: str) -> list[Document]:
    """Parse a YAML (or JSON) stream into documents with their starting lines.

    JSON is read by the YAML parser too (it keeps line numbers); the few JSON texts YAML 1.1 rejects (tabs
    as indentation, for example) fall back to the JSON parser, with every object reported at line 1.
    """
    try:
        return _parse_yaml(text, source)
    except yaml.YAMLError as error:
        if source.endswith(".json") or text.lstrip().startswith(("{", "[")):
            try:
                data = json.loads(text)
            except ValueError:
                pass
            else:
                return [Document(source, 1, data)]
        raise SourceError(_describe_yaml_error(source, error)) from None
    except RecursionError:
        raise SourceError(f"{source}: YAML nested too deeply to read") from None


def _parse_yaml(text: str, source: str) -> list[Document]:
    documents: list[Document] = []
    loader = _Loader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            data = loader.construct_document(node)
            if data is None:
                continue  # an empty document (`---` with nothing after it), common in `helm template` output
            documents.append(Document(source, node.start_mark.line + 1, data, node))
    finally:
        loader.dispose()
    return documents


def _describe_yaml_error(source: str, error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or getattr(error, "context", None) or str(error).splitlines()[0]
    if mark is not None:
        return f"{source}:{mark.line + 1}: YAML does not parse: {problem}"
    return f"{source}: YAML does not parse: {problem}"


def line_of(node: yaml.Node, path: Sequence[PathSegment]) -> int | None:
    """1-based line where the value at ``path`` starts in a composed YAML node tree, or None if absent.

    For a mapping entry this is the line of its key (``template:``), which is where a reader looks; for a
    list item, the line of the item. Of duplicate keys the last wins, as in the constructed data.
    """
    current = node
    line = node.start_mark.line
    for segment in path:
        if isinstance(segment, int):
            if not isinstance(current, yaml.SequenceNode) or not 0 <= segment < len(current.value):
                return None
            current = current.value[segment]
            line = current.start_mark.line
        else:
            if not isinstance(current, yaml.MappingNode):
                return None
            match = None
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode) and key.value == segment:
                    match = key, value
            if match is None:
                return None
            line = match[0].start_mark.line
            current = match[1]
    return line + 1
