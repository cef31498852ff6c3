"""``gpu-fence-webhook serve``, unchanged, plus a bench-only no-op endpoint and a choice of gunicorn worker class.

Run as ``python -m bench.server [--worker-class serve|gthread|sync] serve --cert-file ... --key-file ...``: the
arguments after the options are the real CLI's, handed to ``webhook.cli.main``. What is changed, in this process
only and never in the product:

* ``POST /noop`` answers a fixed allowed AdmissionReview after reading the body, from a three-line WSGI app
  mounted in front of the real Flask app. Everything else (gunicorn settings, TLS context and certificate store,
  workers, logging, metrics directory) is the real ``serve``, so ``/noop`` is the floor of the same server stack:
  what the throughput target's "no-op endpoint" means.
* ``--worker-class gthread`` swaps serve's own worker (``webhook.worker``) for gunicorn's threaded worker, what
  ``serve`` ran before it had its own: the same threads, keep-alive and TLS context, a thread per connection.
  ``--worker-class sync`` swaps it for gunicorn's ``sync`` worker, with one thread, since gunicorn silently turns
  ``sync`` with threads into ``gthread``. ``serve`` (the default) changes nothing.
* ``--no-gc-freeze`` leaves out the ``gc.freeze()`` that ``serve`` runs in the master just before each worker
  forks (its ``pre_fork`` hook; workers still turn their collector on), to measure what the freeze does to the
  tail: the server as it was before ``serve`` adopted it.

The hooks wrap ``create_app`` as ``webhook.serving`` imports it, and ``webhook.serving.gunicorn_application``, which
``serve`` calls with the gunicorn settings it builds; ``tests/bench`` starts this server so that a change there shows
up at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

NOOP_PATH = "/noop"
NOOP_RESPONSE = (
    b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",'
    b'"response":{"uid":"00000000-0000-4000-8000-000000000000","allowed":true}}'
)
WORKER_CLASSES = ("serve", "gthread", "sync")


def noop_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Read the request body (the transport cost stays), answer a fixed allowed review."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length:
        environ["wsgi.input"].read(length)
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(NOOP_RESPONSE)))])
    return [NOOP_RESPONSE]


def with_noop(app: Callable[..., Any]) -> Callable[..., Any]:
    """``app`` with ``/noop`` answered in front of it; one string comparison per request for the rest."""

    def dispatch(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == NOOP_PATH:
            return noop_app(environ, start_response)
        return app(environ, start_response)

    return dispatch


def install(worker_class: str, *, gc_freeze: bool = True, cert_file: str = "", key_file: str = "") -> None:
    """Hook the no-op endpoint and the worker class (``serve``: serve's own) into ``webhook.serving``; without
    ``gc_freeze``, no freeze."""
    from gpu_fence.webhook import app as app_module
    from gpu_fence.webhook import serving

    create_app = app_module.create_app

    def create_app_with_noop(*args: Any, **kwargs: Any) -> Any:
        return with_noop(create_app(*args, **kwargs))

    app_module.create_app = create_app_with_noop  # type: ignore[assignment]
    gunicorn_application = serving.gunicorn_application

    def gunicorn_with_worker_class(app: Any, options: dict[str, Any]) -> Any:
        options = dict(options)
        if worker_class != "serve":
            # gunicorn's workers speak TLS when told of a certificate, with the context serve's worker uses
            context = options["worker_class"].tls_context
            options.update(certfile=cert_file, keyfile=key_file, ssl_context=lambda conf, factory: context())
            options["worker_class"] = worker_class
        if worker_class == "sync":
            options["threads"] = 1
        if not gc_freeze:
            options["pre_fork"] = lambda server, worker: None
        return gunicorn_application(app, options)

    serving.gunicorn_application = gunicorn_with_worker_class


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker-class", choices=WORKER_CLASSES, default="serve")
    parser.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="no gc.freeze() in the master before each fork (serve freezes)",
    )
    args, rest = parser.parse_known_args(argv)
    if not rest or rest[0] != "serve":
        parser.error("give the serve command and its arguments, e.g. serve --cert-file F --key-file F")
    files = {name: rest[rest.index(f"--{name.replace('_', '-')}") + 1] for name in ("cert_file", "key_file")}
    install(args.worker_class, gc_freeze=args.gc_freeze, **files)
    from gpu_fence.webhook.cli import main as webhook_main

    return webhook_main(rest)


if __name__ == "__main__":
    sys.exit(main())
