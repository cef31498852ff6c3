"""Reading manifests for the offline ``check``: files, directories, kustomizations and stdin, with line numbers.

Documents are read one at a time as kubectl reads them (``webhook.kubectl_yaml``), so that a file of a hundred
thousand objects costs the memory of one, and each keeps, beside its data, where each key and item starts (for
reports and SARIF regions). JSON is read by the same reader; the few JSON texts YAML rejects (tabs as indentation)
fall back to a JSON reader, with their lines lost.

Nothing here knows about pods or policy. Errors are :class:`SourceError` with a one-line message that names the file
and, for text that does not parse, the line.
"""

from __future__ import annotations

import fnmatch
import io
import json
import os
import stat
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import IO, Any

from . import kustomize
from .kubectl_yaml import Lines, YamlError, load_all

#: File name endings read when a directory is given.
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")

#: The source name used for standard input, in reports as on the command line.
STDIN = "-"

#: The largest document read. By default the API server takes no request body over 3 MiB (``MaxRequestBodyBytes``,
#: k8s.io/apiserver ``pkg/server/config.go``), so no object comes near this; only a List (``kubectl get ... -o yaml``)
#: does, and a live cluster is better read with ``check --cluster``. A document read takes about twenty times its size
#: in memory (a 32 MiB List of Deployments: 0.7 GB at peak, results included).
MAX_DOCUMENT_BYTES = 64 * 2**20

#: How much of a stream is read first to tell JSON from YAML.
_HEAD_BYTES = 64 * 1024

PathSegment = str | int


class SourceError(Exception):
    """A source could not be read or parsed; the message is one line naming the file (and line)."""


@dataclass(frozen=True)
class Embedding:
    """Where the text of a manifest held in a string lies in its file: from ``line`` on, its lines one for one (a
    literal block scalar, ``|``), or all on ``line`` (any other style, whose lines are not the file's)."""

    line: int
    literal: bool

    def outer(self, inner: int) -> int:
        """The file's line for line ``inner`` (1-based) of the text."""
        return self.line + inner - 1 if self.literal else self.line


@dataclass(frozen=True)
class Document:
    """One document of a source: its data and where it starts.

    ``lines`` says where each key and item starts (None for JSON read without YAML), so that :meth:`line_of` can
    locate paths inside the document. A document read from a string inside another (an embedded manifest) has its
    ``embedding``, and every line it gives is the file's.
    """

    source: str
    line: int
    data: Any
    lines: Lines | None = None
    #: rendered by kustomize: its lines are those of the rendered stream, in no file
    rendered: bool = False
    embedding: Embedding | None = None

    def line_of(self, path: Sequence[PathSegment], default: int | None = None) -> int:
        """1-based line where ``path`` starts inside this document; ``default`` (else the document's own
        line) when the path is not there or the document has no line index."""
        found = None if self.lines is None else self.lines.line_of(self.data, path)
        if found is not None:
            return found if self.embedding is None else self.embedding.outer(found)
        return self.line if default is None else default

    def embedding_at(self, path: Sequence[PathSegment]) -> Embedding:
        """Where the text of the string at ``path`` lies in the file, for the documents read from it."""
        start = None if self.lines is None else self.lines.literal_start(self.data, path)
        if start is not None and (self.embedding is None or self.embedding.literal):
            return Embedding(start if self.embedding is None else self.embedding.outer(start), literal=True)
        return Embedding(self.line_of(path), literal=False)


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
    """What the command-line paths expand to, and every path that could not be read along the way.

    ``charts``: Helm charts met inside a walked directory, not read (their templates are not manifests);
    ``excluded``: how many files and directories ``--exclude`` left out.
    """

    sources: tuple[Source, ...]
    errors: tuple[str, ...] = ()
    charts: tuple[str, ...] = ()
    excluded: int = 0


def find_sources(paths: Iterable[str], excludes: Sequence[str] = ()) -> Sources:
    """Turn command-line paths into the sources to read, in a stable order, with every problem found.

    Directories are walked recursively (sorted, symlinked directories not followed) for
    :data:`MANIFEST_SUFFIXES`; a directory holding a kustomization is one source, rendered, and is not walked
    into (its files are kustomize's inputs); a Helm chart met in a walk is set aside in ``charts`` and not walked
    into, one named on the command line is an error that says how to render it; a directory that cannot be listed
    is an error, never a silent gap. Files named explicitly are read whatever their name (``<(helm template ...)``
    is a pipe); ``-`` is stdin. A path that matches an ``excludes`` glob (:func:`is_excluded`) is not read, named or
    met in a walk. A file or kustomization reached twice (named twice, or named and met in a walk) is read once.
    """
    found = _Found(tuple(_normalise(pattern) for pattern in excludes))
    for path in paths:
        if path == STDIN:
            found.sources.append(Source(STDIN, SourceKind.STDIN))
            continue
        if found.exclude(path):
            continue
        try:
            status = os.stat(path)
        except FileNotFoundError:
            found.errors.append(f"{path}: no such file or directory")
            continue
        except OSError as error:
            found.errors.append(f"{path}: cannot read: {error.strerror or error}")
            continue
        if not stat.S_ISDIR(status.st_mode):
            found.add(Source(path), status)
            continue
        try:
            names = set(os.listdir(path))
        except OSError as error:
            found.errors.append(f"{path}: cannot read directory: {error.strerror or error}")
            continue
        if not kustomize.is_kustomization(names) and kustomize.is_helm_chart(names):
            found.errors.append(kustomize.helm_chart_message(path))
            continue
        _walk(path, found)
    return Sources(tuple(found.sources), tuple(found.errors), tuple(found.charts), found.excluded)


class _Found:
    """What :func:`find_sources` gathers as it goes."""

    def __init__(self, excludes: tuple[str, ...]) -> None:
        self.excludes = excludes
        self.sources: list[Source] = []
        self.errors: list[str] = []
        self.charts: list[str] = []
        self.excluded = 0
        self._seen: set[tuple[int, int]] = set()

    def exclude(self, path: str) -> bool:
        if self.excludes and is_excluded(path, self.excludes):
            self.excluded += 1
            return True
        return False

    def add(self, source: Source, status: os.stat_result) -> None:
        identity = (status.st_dev, status.st_ino)  # the same file by another name, a link, a bind mount: read once
        if identity not in self._seen:
            self._seen.add(identity)
            self.sources.append(source)


def _normalise(path: str) -> str:
    return os.path.normpath(path) if path else path


def is_excluded(path: str, excludes: Sequence[str]) -> bool:
    """True when an ``--exclude`` glob matches ``path`` or a directory above it: a glob without ``/`` matches one
    name (a file's or a directory's); one with ``/`` matches the path up to some name, whole or from after a ``/``
    (``*`` matches across ``/``). Paths are compared normalised (``./a/b/`` is ``a/b``), and so are the globs
    :func:`find_sources` is given."""
    names = _normalise(path).split(os.sep)
    prefixes = [os.sep.join(names[: count + 1]) for count in range(len(names))]
    for pattern in excludes:
        if "/" not in pattern:
            if any(fnmatch.fnmatchcase(name, pattern) for name in names):
                return True
        elif any(
            fnmatch.fnmatchcase(prefix, pattern) or fnmatch.fnmatchcase(prefix, f"*/{pattern}") for prefix in prefixes
        ):
            return True
    return False


def _walk(directory: str, found: _Found) -> None:
    def unreadable(error: OSError) -> None:
        found.errors.append(f"{error.filename}: cannot read directory: {error.strerror or error}")

    for root, dirs, files in os.walk(directory, onerror=unreadable):
        dirs[:] = sorted(name for name in dirs if not found.exclude(os.path.join(root, name)))
        names = set(files)
        if kustomize.is_kustomization(names):
            try:
                found.add(Source(root, SourceKind.KUSTOMIZATION), os.stat(root))
            except OSError as error:
                found.errors.append(f"{root}: cannot read: {error.strerror or error}")
            dirs.clear()
            continue
        if kustomize.is_helm_chart(names):
            found.charts.append(root)
            dirs.clear()
            continue
        for name in sorted(files):
            if not name.endswith(MANIFEST_SUFFIXES):
                continue
            path = os.path.join(root, name)
            if found.exclude(path):
                continue
            try:
                status = os.stat(path)
            except OSError as error:
                found.errors.append(f"{path}: cannot read: {error.strerror or error}")
                continue
            if stat.S_ISREG(status.st_mode):
                found.add(Source(path), status)
            else:  # a FIFO or device node would block or never end; name it rather than hang or skip it
                found.errors.append(f"{path}: not a regular file (name it explicitly to read it)")


def read_source(source: Source, stdin: IO[bytes] | None = None) -> Iterator[Document]:
    """Every document of one source, one at a time; raises :class:`SourceError` (possibly after some documents)."""
    if source.kind is SourceKind.KUSTOMIZATION:
        try:
            rendered = kustomize.render(source.path)
        except kustomize.KustomizeError as error:
            raise SourceError(str(error)) from None
        yield from _read(io.BytesIO(rendered.encode("utf-8")), source.path, rendered=True)
        return
    if source.kind is SourceKind.STDIN:
        yield from _read(stdin if stdin is not None else sys.stdin.buffer, source.path)
        return
    try:
        handle = open(source.path, "rb")  # noqa: SIM115 - closed below, after the generator's last document
    except OSError as error:
        raise SourceError(f"{source.path}: cannot read: {error.strerror or error}") from None
    with handle:
        yield from _read(handle, source.path)


def parse_documents(
    text: str, source: str, *, rendered: bool = False, embedding: Embedding | None = None
) -> list[Document]:
    """Every document of a YAML (or JSON) text, read as kubectl reads it; ``embedding`` places a text held in a string
    of another document (its lines become the file's)."""
    return list(_read(io.BytesIO(text.encode("utf-8")), source, rendered=rendered, embedding=embedding))


def _read(
    handle: IO[bytes], source: str, *, rendered: bool = False, embedding: Embedding | None = None
) -> Iterator[Document]:
    try:
        head = handle.read(_HEAD_BYTES)
        if _may_be_json(head, source):  # read whole: a JSON text YAML rejects is read again by a JSON reader
            whole = head + handle.read(MAX_DOCUMENT_BYTES + 1 - len(head))
            yield from _read_whole(whole, source, rendered, embedding)
            return
        loaded = load_all(_Prefixed(head, handle), max_document_bytes=MAX_DOCUMENT_BYTES)
        for document in loaded:
            yield _document(
                source, document.line, document.data, document.lines, rendered=rendered, embedding=embedding
            )
    except YamlError as error:
        raise SourceError(_describe(source, error, embedding)) from None
    except OSError as error:
        raise SourceError(f"{source}: cannot read: {error.strerror or error}") from None


def _document(
    source: str, line: int, data: Any, lines: Lines | None, *, rendered: bool, embedding: Embedding | None
) -> Document:
    outer = line if embedding is None else embedding.outer(line)
    return Document(source, outer, data, lines, rendered, embedding)


def _may_be_json(head: bytes, source: str) -> bool:
    return source.endswith(".json") or head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith((b"{", b"["))


def _read_whole(data: bytes, source: str, rendered: bool, embedding: Embedding | None) -> Iterator[Document]:
    if len(data) > MAX_DOCUMENT_BYTES:
        raise SourceError(f"{source}: larger than {MAX_DOCUMENT_BYTES // 2**20} MiB, which no single object is")
    try:
        documents = list(load_all(io.BytesIO(data), max_document_bytes=MAX_DOCUMENT_BYTES))
    except YamlError as error:
        if not error.syntax:
            raise
        yield from _read_json(data, source, error, rendered, embedding)
        return
    for document in documents:
        yield _document(source, document.line, document.data, document.lines, rendered=rendered, embedding=embedding)


def _read_json(
    data: bytes, source: str, yaml_error: YamlError, rendered: bool, embedding: Embedding | None
) -> Iterator[Document]:
    """A stream of JSON values (kubectl reads several in a row), each at the line where it starts."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise SourceError(f"{source}: not UTF-8 text (byte {error.start})") from None
    decoder = json.JSONDecoder()
    documents: list[Document] = []
    position = _skip_space(text, 0)
    try:
        while position < len(text):
            value, end = decoder.raw_decode(text, position)
            line = text.count("\n", 0, position) + 1
            documents.append(_document(source, line, value, None, rendered=rendered, embedding=embedding))
            position = _skip_space(text, end)
    except (ValueError, RecursionError):
        raise yaml_error from None  # neither YAML nor JSON: the YAML reader's account says where
    yield from documents


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


class _Prefixed:
    """A stream whose first bytes were read already."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self._head = head
        self._rest = rest

    def read(self, size: int) -> bytes:
        if self._head:
            chunk, self._head = self._head[:size], self._head[size:]
            return chunk
        return self._rest.read(size)


def _describe(source: str, error: YamlError, embedding: Embedding | None) -> str:
    if error.line is None:
        return f"{source}: {error.message}"
    line = error.line if embedding is None else embedding.outer(error.line)
    return f"{source}:{line}: {error.message}"
