"""Request framing, pure: where a request ends however its bytes arrive, what is left to gunicorn's parser, and the
decoded chunked body equal to what gunicorn's own chunked reader makes of the same bytes."""

from __future__ import annotations

from gunicorn.config import Config
from gunicorn.http import RequestParser
from hypothesis import given
from hypothesis import strategies as st

from gpu_fence.webhook.framing import MAX_CHUNK_LINE, Frame, FrameKind, RequestReader

HEAD = b"POST /validate HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n"
MAX_HEAD, MAX_BODY = 4096, 1000


def read(data: bytes, *, splits: list[int] = (), eof: bool = False) -> Frame | None:
    """Feed ``data`` in pieces cut at ``splits``, as reads would deliver it; the frame, or None if not whole."""
    reader = RequestReader(max_head=MAX_HEAD, max_body=MAX_BODY)
    buffer = bytearray()
    last = 0
    for cut in [*sorted(set(splits)), len(data)]:
        buffer += data[last:cut]
        last = cut
        frame = reader.advance(buffer)
        if frame is not None:
            return frame
    return reader.advance(buffer, eof=True) if eof else None


def with_length(body: bytes, *extra: bytes) -> bytes:
    return HEAD + b"Content-Length: %d\r\n" % len(body) + b"".join(extra) + b"\r\n" + body


def chunked(chunks: list[bytes], trailers: bytes = b"", extension: bytes = b"") -> bytes:
    encoded = b"".join(b"%x%s\r\n%s\r\n" % (len(chunk), extension, chunk) for chunk in chunks if chunk)
    return HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + encoded + b"0\r\n" + trailers + b"\r\n"


def test_a_request_with_a_length_is_whole_at_its_last_byte_and_what_follows_is_the_next_one():
    request = with_length(b'{"kind":"AdmissionReview"}')
    assert read(request[:-1]) is None
    frame = read(request + b"GET /healthz HTTP/1.1\r\n")
    assert frame.kind is FrameKind.COMPLETE and frame.body == b'{"kind":"AdmissionReview"}'
    assert frame.head == request[: request.index(b"\r\n\r\n") + 4] and frame.consumed == len(request)
    assert not frame.close


@given(st.binary(max_size=MAX_BODY), st.lists(st.integers(min_value=0, max_value=2000), max_size=8))
def test_the_frame_does_not_depend_on_how_the_bytes_arrive(body, splits):
    request = with_length(body)
    assert read(request, splits=splits) == read(request)


def test_a_request_without_a_body_is_whole_with_its_head():
    frame = read(b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n")
    assert frame.kind is FrameKind.COMPLETE and frame.body == b""


def test_the_client_ending_its_side():
    assert read(b"", eof=True).kind is FrameKind.CLOSED
    assert read(HEAD, eof=True).kind is FrameKind.CLOSED  # no whole head: nothing to answer
    frame = read(with_length(b"0123456789")[:-4], eof=True)
    assert frame.kind is FrameKind.TRUNCATED and frame.body == b"012345" and frame.close


def test_a_head_over_the_limit():
    frame = read(HEAD + b"X-Padding: " + b"a" * MAX_HEAD + b"\r\n\r\n")
    assert frame.kind is FrameKind.HEAD_TOO_LARGE and frame.close
    assert read(HEAD + b"X-Padding: " + b"a" * (MAX_HEAD - len(HEAD) - 20)) is None  # not yet


def test_a_body_over_the_limit_is_not_read():
    frame = read(HEAD + b"Content-Length: 5000000\r\n\r\n" + b"x" * 10)
    assert frame.kind is FrameKind.OVERSIZED and frame.body == b"" and frame.close and frame.discard == 5_000_000


def test_framing_gunicorn_must_refuse_goes_on_as_the_head_alone():
    for fields in (
        b"Content-Length: 2\r\nContent-Length: 2\r\n",
        b"Content-Length: +2\r\n",
        b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: gzip\r\n",
        b"Transfer-Encoding: chunked, chunked\r\n",
    ):
        frame = read(HEAD + fields + b"\r\nab")
        assert frame.kind is FrameKind.HEAD_ONLY and frame.close and frame.body == b"", fields
        # and gunicorn's parser refuses the head, so that an answer (400, 501) says why
        try:
            next(RequestParser(Config(), [frame.head], ("127.0.0.1", 1)))
        except Exception as error:
            assert type(error).__name__ in {"InvalidHeader", "UnsupportedTransferCoding"}
        else:
            raise AssertionError(f"gunicorn accepted {fields!r}")


def test_expect_100_continue_is_seen_once_the_head_is_read():
    reader = RequestReader(max_head=MAX_HEAD, max_body=MAX_BODY)
    assert reader.advance(bytearray(with_length(b"abc", b"Expect: 100-continue\r\n")[:-3])) is None
    assert reader.expects_continue and reader.body_length == 3
    no_body = RequestReader(max_head=MAX_HEAD, max_body=MAX_BODY)
    no_body.advance(bytearray(HEAD + b"Expect: 100-continue\r\nContent-Length: 0\r\n\r\n"))
    assert not no_body.expects_continue


def gunicorn_body(request: bytes) -> bytes:
    """What gunicorn's own parser and chunked reader make of the request's body."""
    req = next(RequestParser(Config(), [request], ("127.0.0.1", 1)))
    return req.body.read()


@given(
    st.lists(st.binary(max_size=300), max_size=6),
    st.sampled_from([b"", b"Trailer-Field: 1\r\n", b"A: b\r\nC: d\r\n"]),
    st.sampled_from([b"", b";name=value", b' ;q="x"']),
    st.lists(st.integers(min_value=0, max_value=3000), max_size=6),
)
def test_a_chunked_body_is_decoded_as_gunicorn_decodes_it(chunks, trailers, extension, splits):
    request = chunked(chunks, trailers, extension)
    frame = read(request + b"NEXT", splits=splits)
    assert frame.kind is FrameKind.COMPLETE and not frame.close
    assert frame.body == b"".join(chunks) == gunicorn_body(request)
    assert frame.consumed == len(request)


def test_a_chunked_body_over_the_limit_goes_on_cut_at_one_byte_past_it():
    frame = read(chunked([b"x" * 600, b"y" * 600]))
    assert frame.kind is FrameKind.COMPLETE and frame.close and len(frame.body) == MAX_BODY + 1


def test_bad_chunking_is_answered_by_the_worker():
    head = HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
    for body in (b"zz\r\nab\r\n0\r\n\r\n", b"2\r\nabX\r\n0\r\n\r\n", b"1" * (MAX_CHUNK_LINE + 10)):
        assert read(head + body).kind is FrameKind.BAD_CHUNKING, body
    assert read(head + b"5\r\nab", eof=True).kind is FrameKind.BAD_CHUNKING  # ended before its last chunk
    assert read(head + b"5\r\nab") is None
