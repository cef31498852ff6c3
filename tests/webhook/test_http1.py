"""webhook.http1: what a request head asks for, or why it is refused; and the response head the worker writes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_fence.webhook.http1 import Head, Refusal, parse_head, response_head
from gpu_fence.webhook.reasons import BadRequestReason


def test_an_api_server_review_head_is_read_whole():
    head = parse_head(
        b"POST /validate?timeout=3s HTTP/1.1\r\nHost: gpu-fence-webhook.gpu-fence.svc:443\r\n"
        b"User-Agent: kube-apiserver-admission\r\nContent-Length: 1234\r\nAccept: application/json, */*\r\n"
        b"Content-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n"
    )
    assert isinstance(head, Head)
    assert (head.method, head.path, head.query, head.version) == ("POST", "/validate", "timeout=3s", "HTTP/1.1")
    assert head.content_length == 1234 and head.keep_alive and not head.expects_continue
    assert ("content-type", "application/json") in head.fields


@pytest.mark.parametrize(
    ("data", "keep_alive"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", True),
        (b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", False),
        (b"GET / HTTP/1.1\r\nConnection: Keep-Alive, Close\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", True),
    ],
)
def test_keep_alive_follows_the_version_and_the_connection_field(data, keep_alive):
    head = parse_head(data)
    assert isinstance(head, Head) and head.keep_alive is keep_alive


def test_the_path_is_percent_decoded_and_a_get_needs_no_length():
    head = parse_head(b"GET /a%20b/%C3%A9 HTTP/1.1\r\nExpect: 100-continue\r\n\r\n")
    assert isinstance(head, Head)
    assert head.path == "/a b/\xc3\xa9" and head.content_length == 0 and head.expects_continue


@pytest.mark.parametrize(
    ("data", "status", "reason"),
    [
        (b"GARBAGE", 400, BadRequestReason.BAD_REQUEST_LINE),
        (b"GET http://host/ HTTP/1.1", 400, BadRequestReason.BAD_REQUEST_LINE),
        (b"GET  / HTTP/1.1", 400, BadRequestReason.BAD_REQUEST_LINE),
        (b"GET / HTTP/2.0", 400, BadRequestReason.UNSUPPORTED_HTTP_VERSION),
        (b"GET / HTTP/1.1\r\n folded: x", 400, BadRequestReason.BAD_HEADER),
        (b"GET / HTTP/1.1\r\nBad Name: x", 400, BadRequestReason.BAD_HEADER),
        (b"GET / HTTP/1.1\r\nName : x", 400, BadRequestReason.BAD_HEADER),
        (b"GET / HTTP/1.1\r\nX: a\x00b", 400, BadRequestReason.BAD_HEADER),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked", 411, BadRequestReason.LENGTH_REQUIRED),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 2", 411, BadRequestReason.LENGTH_REQUIRED),
        (b"POST / HTTP/1.1", 411, BadRequestReason.LENGTH_REQUIRED),
        (b"PUT / HTTP/1.1", 411, BadRequestReason.LENGTH_REQUIRED),
        (b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3", 400, BadRequestReason.BAD_CONTENT_LENGTH),
        (b"POST / HTTP/1.1\r\nContent-Length: -2", 400, BadRequestReason.BAD_CONTENT_LENGTH),
        (b"POST / HTTP/1.1\r\nContent-Length: +2", 400, BadRequestReason.BAD_CONTENT_LENGTH),
        (b"POST / HTTP/1.1\r\nContent-Length: 2, 2", 400, BadRequestReason.BAD_CONTENT_LENGTH),
        (b"POST / HTTP/1.1\r\nContent-Length: \xd9\xa2", 400, BadRequestReason.BAD_CONTENT_LENGTH),
    ],
)
def test_ambiguous_or_malformed_heads_are_refused(data, status, reason):
    refusal = parse_head(data + b"\r\n\r\n")
    assert isinstance(refusal, Refusal) and (refusal.status, refusal.reason) == (status, reason)
    assert refusal.message


def test_repeated_equal_lengths_are_one_length():
    head = parse_head(b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n")
    assert isinstance(head, Head) and head.content_length == 2


@given(st.binary(max_size=300))
def test_no_bytes_make_the_parser_raise(data):
    assert isinstance(parse_head(data), Head | Refusal)


def test_the_response_head_carries_the_servers_framing_not_the_apps():
    data = response_head(
        "200 OK",
        [("Content-Type", "application/json"), ("Content-Length", "999"), ("Connection", "upgrade")],
        12,
        keep_alive=False,
        date="Mon, 01 Jan 2026 00:00:00 GMT",
    )
    assert data == (
        b"HTTP/1.1 200 OK\r\nDate: Mon, 01 Jan 2026 00:00:00 GMT\r\nContent-Type: application/json\r\n"
        b"Content-Length: 12\r\nConnection: close\r\n\r\n"
    )
