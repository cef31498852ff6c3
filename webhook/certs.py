"""The ``certs`` subcommand: a private CA and a serving certificate for the webhook Service, without cert-manager.

Two modes:

* ``--out-dir DIR`` writes ``ca.crt``, ``tls.crt`` and ``tls.key`` (keys 0600) for local use and tests. The CA key
  is not written: nothing else can ever be signed by that CA.
* ``--secret NAME --patch-webhooks CONFIG...`` runs in the cluster (a Job, or an init container): it keeps a
  ``kubernetes.io/tls`` Secret (``tls.crt``, ``tls.key``, ``ca.crt``, ``ca.key``) and every webhook's
  ``clientConfig.caBundle`` in step. It is a reconcile loop: a re-run with everything valid writes nothing.

Order of writes when the CA rotates (the failure mode kubevirt#5289 and cert-controller#13 describe): the new CA
is stored, the bundle of new + still-valid old CAs is published in every ``caBundle``, and only then is a serving
certificate signed by the new CA written. Old CAs stay in the bundle until they expire, so replicas that still
serve the old leaf (the kubelet refreshes mounted Secrets lazily) stay trusted.

Keys are ECDSA P-256: fast handshakes and small certificates, accepted by every supported API server.
The ``kubernetes`` client is imported inside functions only: ``serve`` imports this module through the CLI.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpu_fence.command_line import positive
from gpu_fence.exit_status import ExitStatus
from gpu_fence.kubeconfig import ORDER as KUBECONFIG_ORDER
from gpu_fence.kubeconfig import KubeConfigError, load_configuration

#: A Kubernetes object as the API's JSON decodes (the client is asked for raw responses: no model classes).
KubeObject = dict[str, Any]

_positive_int = positive(int, "whole number of days", least="at least 1")

DEFAULT_DAYS = 365
DEFAULT_CA_DAYS = 3650
DEFAULT_RENEW_BEFORE_DAYS = 30
#: Tolerates clock skew between the machine that signs and the API servers that verify.
BACKDATE = dt.timedelta(minutes=5)

EXAMPLES = """\
examples:
  gpu-fence-webhook certs --service gpu-fence-webhook --namespace gpu-fence --out-dir ./tls
  gpu-fence-webhook certs --service gpu-fence-webhook --namespace gpu-fence \\
      --secret gpu-fence-webhook-tls \\
      --patch-webhooks mutating/gpu-fence-mutating validating/gpu-fence-validating
  (a CONFIG is mutating/NAME or validating/NAME, as the manifests pass it; a plain NAME is looked up as
  both kinds, which needs RBAC on both)
"""


class CertsError(Exception):
    """A certificate or cluster operation that cannot proceed; the message says what to fix."""


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate (for a CA: possibly a bundle, current CA first) and the PEM private key of its first cert."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def key(self) -> ec.EllipticCurvePrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise CertsError("expected an EC private key")
        return key


# -- pure certificate work -----------------------------------------------------------------------------------------


def service_dns_names(service: str, namespace: str) -> tuple[str, ...]:
    """The names the API server may use for a Service: it verifies ``<svc>.<ns>.svc``; the others help humans."""
    return (service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local")


def new_ca(*, common_name: str, now: dt.datetime, days: int) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(_cert_pem(cert), _key_pem(key))


def new_serving_cert(ca: KeyPair, dns_names: Sequence[str], *, now: dt.datetime, days: int) -> KeyPair:
    """A leaf for ``dns_names`` signed by ``ca``; it never outlives the CA (a leaf past its CA is not trusted)."""
    ca_cert, ca_key = ca.cert, ca.key
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name) for name in dns_names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(_cert_pem(cert), _key_pem(key))


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """digitalSignature for both (an ECDSA key signs, it never enciphers); certificate and CRL signing for the CA."""
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=ca,
        crl_sign=ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


def load_bundle(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem) if pem.strip() else []
    except ValueError:
        return []


def bundle_pem(certs: Iterable[x509.Certificate]) -> bytes:
    return b"".join(_cert_pem(cert) for cert in certs)


def key_matches(cert: x509.Certificate, key_pem: bytes) -> bool:
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return False
    return _public_bytes(key.public_key()) == _public_bytes(cert.public_key())


def current_ca(bundle: bytes, key_pem: bytes, *, now: dt.datetime, renew_before: dt.timedelta) -> KeyPair | None:
    """The CA of a stored bundle that holds ``key_pem`` and stays valid past ``renew_before``; None → rotate."""
    for cert in load_bundle(bundle):
        if key_matches(cert, key_pem) and _is_ca(cert) and cert.not_valid_after_utc - renew_before > now:
            return KeyPair(_cert_pem(cert), key_pem)
    return None


def serving_is_good(
    serving: KeyPair, ca: KeyPair, dns_names: Sequence[str], *, now: dt.datetime, renew_before: dt.timedelta
) -> bool:
    """True when the stored leaf can keep serving: signed by the current CA, right names, key, and lifetime."""
    try:
        cert = serving.cert
    except ValueError:
        return False
    if not key_matches(cert, serving.key_pem):
        return False
    try:
        cert.verify_directly_issued_by(ca.cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    try:
        names = set(
            cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        )
    except x509.ExtensionNotFound:
        return False
    return set(dns_names) <= names and cert.not_valid_before_utc <= now < cert.not_valid_after_utc - renew_before


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _public_bytes(public_key: PublicKeyTypes) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


# -- local files ---------------------------------------------------------------------------------------------------


def write_atomically(path: Path, data: bytes, mode: int) -> None:
    """Write beside, then rename: a reader (``serve``'s reloader) never sees half a file."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(descriptor, mode)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_out_dir(out_dir: Path, ca: KeyPair, serving: KeyPair) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(out_dir / "ca.crt", ca.cert_pem, 0o644)
    # key before certificate: a reloader that sees the new certificate finds its key already in place
    write_atomically(out_dir / "tls.key", serving.key_pem, 0o600)
    write_atomically(out_dir / "tls.crt", serving.cert_pem, 0o644)


# -- in-cluster reconcile ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WebhookRef:
    kind: str  # "mutating" or "validating"; "" = look up both
    name: str


def parse_webhook_ref(text: str) -> WebhookRef:
    kind, slash, name = text.rpartition("/")
    aliases = {
        "": "",
        "mutating": "mutating",
        "mutatingwebhookconfiguration": "mutating",
        "validating": "validating",
        "validatingwebhookconfiguration": "validating",
    }
    if not name or kind.lower() not in aliases or (slash and not kind):
        raise CertsError(f"--patch-webhooks {text!r}: expected NAME, mutating/NAME or validating/NAME")
    return WebhookRef(aliases[kind.lower()], name)


@dataclass(frozen=True)
class Cluster:
    """The few API calls the reconcile needs, over plain dicts (an adapter around the kubernetes client)."""

    core: Any
    admission: Any

    def read_secret(self, namespace: str, name: str) -> KubeObject | None:
        return self._call(
            f"read Secret {namespace}/{name}", self.core.read_namespaced_secret, name, namespace, missing_ok=True
        )

    def create_secret(self, namespace: str, body: KubeObject) -> None:
        self._call(
            f"create Secret {namespace}/{body['metadata']['name']}", self.core.create_namespaced_secret, namespace, body
        )

    def replace_secret(self, namespace: str, body: KubeObject) -> None:
        self._call(
            f"replace Secret {namespace}/{body['metadata']['name']}",
            self.core.replace_namespaced_secret,
            body["metadata"]["name"],
            namespace,
            body,
        )

    def read_webhooks(self, kind: str, name: str) -> KubeObject | None:
        method = getattr(self.admission, f"read_{kind}_webhook_configuration")
        return self._call(f"read {kind} webhook configuration {name}", method, name, missing_ok=True)

    def patch_webhooks(self, kind: str, name: str, operations: list[KubeObject]) -> None:
        method = getattr(self.admission, f"patch_{kind}_webhook_configuration")
        self._call(
            f"patch {kind} webhook configuration {name}",
            method,
            name,
            operations,
            _content_type="application/json-patch+json",
        )

    @staticmethod
    def _call(what: str, method: Any, *args: Any, missing_ok: bool = False, **kwargs: Any) -> KubeObject | None:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415 - keeps serve free of the client
        from urllib3.exceptions import HTTPError  # noqa: PLC0415

        try:
            response = method(*args, _preload_content=False, **kwargs)
        except ApiException as error:
            if missing_ok and error.status == 404:
                return None
            hint = {
                401: "the credentials were refused",
                403: "grant the service account this verb on this resource (see manifests RBAC)",
                404: "create it first (apply the manifests), or fix the name",
                409: "it changed meanwhile (another run?); run again",
                422: "the API server rejected the object",
            }.get(error.status or 0, "")
            raise CertsError(f"{what}: HTTP {error.status} {error.reason}" + (f": {hint}" if hint else "")) from None
        except (HTTPError, OSError) as error:
            raise CertsError(f"{what}: cannot reach the API server: {error}") from None
        data = response.data
        return orjson.loads(data) if data else {}


def connect(kubeconfig: str | None) -> Cluster:
    from kubernetes import client  # noqa: PLC0415 - only certs talks to the API

    try:
        api_client = client.ApiClient(load_configuration(kubeconfig))
    except KubeConfigError as error:
        raise CertsError(
            f"no Kubernetes credentials: {error.reason} (run in a pod with a service account, or pass --kubeconfig)"
        ) from None
    return Cluster(client.CoreV1Api(api_client), client.AdmissionregistrationV1Api(api_client))


def reconcile(
    cluster: Cluster,
    *,
    namespace: str,
    secret_name: str,
    webhook_refs: Sequence[WebhookRef],
    dns_names: Sequence[str],
    now: dt.datetime,
    days: int = DEFAULT_DAYS,
    ca_days: int = DEFAULT_CA_DAYS,
    renew_before: dt.timedelta = dt.timedelta(days=DEFAULT_RENEW_BEFORE_DAYS),
) -> list[str]:
    """Bring the Secret and every caBundle to a valid state; returns what was changed (empty: nothing)."""
    actions: list[str] = []
    targets = _resolve_webhooks(cluster, webhook_refs)
    secret = cluster.read_secret(namespace, secret_name)
    data = _decode(secret)

    # 1. the CA: keep it while valid; otherwise rotate, keeping still-valid old CAs in the bundle
    stored_bundle = data.get("ca.crt", b"")
    ca = current_ca(stored_bundle, data.get("ca.key", b""), now=now, renew_before=renew_before)
    bundle = stored_bundle
    if ca is None:
        ca = new_ca(common_name=f"gpu-fence-webhook-ca.{namespace}", now=now, days=ca_days)
        kept = [cert for cert in load_bundle(stored_bundle) if cert.not_valid_after_utc > now and _is_ca(cert)]
        bundle = ca.cert_pem + bundle_pem(kept)
        data.update({"ca.crt": bundle, "ca.key": ca.key_pem})
        actions.append("ca-rotated" if secret is not None else "ca-created")
        if secret is not None:  # store the new CA before anything depends on it
            secret = _write_secret(cluster, namespace, secret_name, secret, data)
    else:
        # prune CAs that have expired; they can no longer vouch for any leaf
        live = [cert for cert in load_bundle(stored_bundle) if cert.not_valid_after_utc > now]
        if bundle_pem(live) != bundle_pem(load_bundle(stored_bundle)):
            bundle = bundle_pem(live)
            data["ca.crt"] = bundle
            secret = _write_secret(cluster, namespace, secret_name, secret, data)
            actions.append("expired-ca-pruned")

    # 2. publish the bundle in every webhook before any leaf signed by a new CA is served
    encoded = base64.b64encode(bundle).decode("ascii")
    for kind, name, configuration in targets:
        operations = []
        for index, webhook in enumerate(configuration.get("webhooks") or []):
            if (webhook.get("clientConfig") or {}).get("caBundle") != encoded:
                operations.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook.get("name")})
                operations.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded})
        if operations:
            cluster.patch_webhooks(kind, name, operations)
            actions.append(f"patched {kind}/{name}")

    # 3. the serving certificate, signed by the current CA
    serving = KeyPair(data.get("tls.crt", b""), data.get("tls.key", b""))
    if not serving_is_good(serving, ca, dns_names, now=now, renew_before=renew_before):
        serving = new_serving_cert(ca, dns_names, now=now, days=days)
        data.update({"tls.crt": serving.cert_pem, "tls.key": serving.key_pem})
        _write_secret(cluster, namespace, secret_name, secret, data)
        actions.append("serving-cert-issued")
    return actions


def _resolve_webhooks(cluster: Cluster, refs: Sequence[WebhookRef]) -> list[tuple[str, str, KubeObject]]:
    found = []
    for ref in refs:
        kinds = [ref.kind] if ref.kind else ["mutating", "validating"]
        hits = [(kind, ref.name, config) for kind in kinds if (config := cluster.read_webhooks(kind, ref.name))]
        if not hits:
            where = " or ".join(f"{kind}webhookconfiguration" for kind in kinds)
            raise CertsError(f"--patch-webhooks: no {where} named {ref.name!r}; apply the manifests first")
        found.extend(hits)
    return found


def _decode(secret: KubeObject | None) -> dict[str, bytes]:
    if not secret:
        return {}
    raw = secret.get("data") or {}
    decoded = {}
    for key, value in raw.items():
        try:
            decoded[key] = base64.b64decode(value or "")
        except ValueError:
            decoded[key] = b""
    return decoded


def _write_secret(
    cluster: Cluster, namespace: str, name: str, current: KubeObject | None, data: dict[str, bytes]
) -> KubeObject:
    encoded = {key: base64.b64encode(value).decode("ascii") for key, value in sorted(data.items())}
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {"app.kubernetes.io/managed-by": "gpu-fence-webhook-certs"},
    }
    body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "metadata": metadata, "data": encoded}
    if current is None:
        cluster.create_secret(namespace, body)
    else:
        old = current.get("metadata") or {}
        if old.get("resourceVersion"):
            metadata["resourceVersion"] = old["resourceVersion"]  # optimistic concurrency: 409 if changed meanwhile
        metadata["labels"] = {**(old.get("labels") or {}), **metadata["labels"]}
        if current.get("type") not in (None, "kubernetes.io/tls"):
            raise CertsError(
                f"Secret {namespace}/{name} has type {current.get('type')!r}, not kubernetes.io/tls; "
                "delete it or choose another --secret"
            )
        cluster.replace_secret(namespace, body)
    return cluster.read_secret(namespace, name) or body


# -- CLI -----------------------------------------------------------------------------------------------------------


def add_arguments(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "certs",
        help="create the webhook's CA and serving certificate (files, or a Secret + caBundle in the cluster)",
        description="Create a private CA and a serving certificate for the webhook Service.",
        epilog=EXAMPLES,
    )
    parser.add_argument("--service", required=True, help="the webhook Service name")
    parser.add_argument("--namespace", required=True, help="the namespace of the Service (and of --secret)")
    parser.add_argument("--days", type=_positive_int, default=DEFAULT_DAYS, help="serving certificate lifetime")
    parser.add_argument("--ca-days", type=_positive_int, default=DEFAULT_CA_DAYS, help="CA lifetime")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--out-dir", type=Path, help="write ca.crt, tls.crt, tls.key here")
    target.add_argument("--secret", help="keep this kubernetes.io/tls Secret (in --namespace) up to date")
    parser.add_argument(
        "--patch-webhooks",
        nargs="+",
        default=[],
        metavar="CONFIG",
        help="webhook configurations whose caBundle to keep in step (NAME, mutating/NAME, "
        "validating/NAME); with --secret",
    )
    parser.add_argument(
        "--renew-before",
        type=_positive_int,
        default=DEFAULT_RENEW_BEFORE_DAYS,
        metavar="DAYS",
        help="with --secret: renew certificates that expire within this many days",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help=f"with --secret: kubeconfig file (default: {KUBECONFIG_ORDER})",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> ExitStatus:
    now = dt.datetime.now(dt.UTC)
    names = service_dns_names(args.service, args.namespace)
    if args.days > args.ca_days:
        raise CertsError(f"--days {args.days} exceeds --ca-days {args.ca_days}; a leaf cannot outlive its CA")
    if args.out_dir is not None:
        if args.patch_webhooks:
            raise CertsError("--patch-webhooks needs --secret (it updates the cluster)")
        ca = new_ca(common_name=f"gpu-fence-webhook-ca.{args.namespace}", now=now, days=args.ca_days)
        serving = new_serving_cert(ca, names, now=now, days=args.days)
        try:
            write_out_dir(args.out_dir, ca, serving)
        except OSError as error:
            raise CertsError(f"cannot write to --out-dir {args.out_dir}: {error.strerror}") from None
        print(f"wrote {args.out_dir}/ca.crt, tls.crt, tls.key for {', '.join(names)}")
        return ExitStatus.SUCCESS
    if args.renew_before >= args.days:
        raise CertsError(f"--renew-before {args.renew_before} must be shorter than --days {args.days}")
    refs = [parse_webhook_ref(text) for text in args.patch_webhooks]
    actions = reconcile(
        connect(args.kubeconfig),
        namespace=args.namespace,
        secret_name=args.secret,
        webhook_refs=refs,
        dns_names=names,
        now=now,
        days=args.days,
        ca_days=args.ca_days,
        renew_before=dt.timedelta(days=args.renew_before),
    )
    print(
        f"Secret {args.namespace}/{args.secret}: " + (", ".join(actions) if actions else "up to date, no change"),
        file=sys.stdout,
    )
    return ExitStatus.SUCCESS
