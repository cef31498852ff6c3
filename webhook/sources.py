"""Reading manifests for the offline ``check``: files, directories, kustomizations and stdin, with line numbers.

YAML is composed into nodes first (libyaml's C parser when present) and each node is then constructed into
plain Python data; the node tree is kept beside the data so that a path inside a document can be turned
into the line where it starts (for reports and SARIF regions) without a slower line-tracking loader.

Nothing here knows about pods or policy. Errors are :class:`SourceError` with a one-line message that
names the file and, for YAML that does not parse, the line.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import IO, Any

import yaml

from . import kustomize

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
    #: rendered by kustomize: its lines are those of the rendered stream, in no file
    rendered: bool = False

    def line_of(self, path: Sequence[PathSegment], default: int | None = None) -> int:
        """1-based line where ``path`` starts inside this document; ``default`` (else the document's own
        line) when the path is not there or the document has no node tree."""
        found = None if self.node is None else line_of(self.node, path)
        if found is not None:
            return found
        return self.line if default is None else default


class SourceKind(Enum):
    """How a source is read."""

    FILE = "file"
    STDIN = "stdin"
    #: a directory holding a kustomization, rendered by ``kubectl kustomize`` (``webhook.kustomize``)
    KUSTOMIZATION = "kustomization"


@dataclass(frozen=True)
class Source:
    """One thing to read: a file, stdin, or a kustomization directory to render."""

    path: str
    kind: SourceKind = SourceKind.FILE


@dataclass(frozen=True)
class Sources:
    """What the command-line paths expand to, and every path that could not be read along the way."""

    sources: tuple[Source, ...]
    errors: tuple[str, ...] = ()


def find_sources(paths: Iterable[str]) -> Sources:
    """Turn command-line paths into the sources to read, in a stable order, with every problem found.

    Directories are walked recursively (sorted, symlinked directories not followed) for
    :data:`MANIFEST_SUFFIXES`; a directory holding a kustomization is one source, rendered, and is not walked
    into (its files are kustomize's inputs); a Helm chart is an error that says how to render it; a directory
    that cannot be listed is an error, never a silent gap. Files named explicitly are read whatever their name
    (``<(helm template ...)`` is a pipe); ``-`` is stdin.
    """
    sources: list[Source] = []
    errors: list[str] = []
    for path in paths:
        if path == STDIN:
            sources.append(Source(STDIN, SourceKind.STDIN))
            continue
        try:
            is_directory = stat.S_ISDIR(os.stat(path).st_mode)
        except FileNotFoundError:
            errors.append(f"{path}: no such file or directory")
            continue
        except OSError as error:
            errors.append(f"{path}: cannot read: {error.strerror or error}")
            continue
        if is_directory:
            _walk(path, sources, errors)
        else:
            sources.append(Source(path))
    return Sources(tuple(sources), tuple(errors))


def _walk(directory: str, sources: list[Source], errors: list[str]) -> None:
    def unreadable(error: OSError) -> None:
        errors.append(f"{error.filename}: cannot read directory: {error.strerror or error}")

    for root, dirs, files in os.walk(directory, onerror=unreadable):
        dirs.sort()
        names = set(files)
        if kustomize.is_kustomization(names):
            sources.append(Source(root, SourceKind.KUSTOMIZATION))
            dirs.clear()
            continue
        if kustomize.is_helm_chart(names):
            errors.append(kustomize.helm_chart_message(root))
            dirs.clear()
            continue
        for name in sorted(files):
            if not name.endswith(MANIFEST_SUFFIXES):
                continue
            path = os.path.join(root, name)
            try:
                regular = stat.S_ISREG(os.stat(path).st_mode)
            except OSError as error:
                errors.append(f"{path}: cannot read: {error.strerror or error}")
                continue
            if regular:
                sources.append(Source(path))
            else:  # a FIFO or device node would block or never end; name it rather than hang or skip it
                errors.append(f"{path}: not a regular file (name it explicitly to read it)")


def read_source(source: Source, stdin: IO[bytes] | None = None) -> list[Document]:
    """Read every document of one source."""
    if source.kind is SourceKind.KUSTOMIZATION:
        try:
            return parse_documents(kustomize.render(source.path), source.path, rendered=True)
        except kustomize.KustomizeError as error:
            raise SourceError(str(error)) from None
    try:
        if source.kind is SourceKind.STDIN:
            raw = (stdin if stdin is not None else sys.stdin.buffer).read()
        else:
            with open(source.path, "rb") as handle:
                raw = handle.read()
    except OSError as error:
        raise SourceError(f"{source.path}: cannot read: {error.strerror or error}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise SourceError(f"{source.path}: not UTF-8 text (byte {error.start})") from None
    return parse_documents(text, source.path)


def parse_documents(text: str, source: str, *, rendered: bool = False) -> list[Document]:
    """Parse a YAML (or JSON) stream into documents with their starting lines.

    JSON is read by the YAML parser too (it keeps line numbers); the few JSON texts YAML 1.1 rejects (tabs
    as indentation, for example) fall back to the JSON parser, with every object reported at line 1.
    """
    try:
        return _parse_yaml(text, source, rendered)
    except yaml.YAMLError as error:
        if source.endswith(".json") or text.lstrip().startswith(("{", "[")):
            try:
                data = json.loads(text)
            except ValueError:
                pass
            else:
                return [Document(source, 1, data, rendered=rendered)]
        raise SourceError(_describe_yaml_error(source, error)) from None
    except RecursionError:
        raise SourceError(f"{source}: YAML nested too deeply to read") from None


def _parse_yaml(text: str, source: str, rendered: bool) -> list[Document]:
    documents: list[Document] = []
    loader = _Loader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            data = loader.construct_document(node)
            if data is None:
                continue  # an empty document (`---` with nothing after it), common in `helm template` output
            documents.append(Document(source, node.start_mark.line + 1, data, node, rendered))
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
