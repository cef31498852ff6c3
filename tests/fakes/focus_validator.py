"""Run the FinOps ``focus-validator`` (PyPI, release 1.0.0) over ``--format focus`` output, as a finance team would.

That release's "1.0" rule set (``focus_validator/rules/version_sets/1.0``) still names four columns by their
display names, where FOCUS 1.0 as ratified (FOCUS_Spec tag ``v1.0``, ``specification/columns/*.md``, "Column ID")
uses ``ProviderName``, ``PublisherName``, ``InvoiceIssuerName`` and ``ResourceId``, and one rule
(``SkuPriceId_Nullable``) still reads ``ChargeType``, the column 1.0 replaced by ``ChargeCategory``. The copy the
validator reads renames those four columns and adds ``ChargeType`` as a copy of ``ChargeCategory``; every value
is the one chargeback wrote, and every rule of the set runs. The release also reads its ISO 4217 list from the
relative path ``focus_validator/utils/currency_codes.csv``, so it is run from the directory that holds the package.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import shutil
import sys
from pathlib import Path

from tests.fakes.processes import run_captured

RELEASE_NAMES = {
    "ProviderName": "Provider",
    "PublisherName": "Publisher",
    "InvoiceIssuerName": "InvoiceIssuer",
    "ResourceId": "ResourceID",
}
FOCUS_VERSION = "1.0"


def as_release_reads_it(focus_csv: str) -> str:
    rows = list(csv.DictReader(io.StringIO(focus_csv)))
    assert rows, "no FOCUS rows to validate"
    out = io.StringIO()
    names = [RELEASE_NAMES.get(name, name) for name in rows[0]] + ["ChargeType"]
    writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        renamed = {RELEASE_NAMES.get(name, name): value for name, value in row.items()}
        writer.writerow({**renamed, "ChargeType": row["ChargeCategory"]})
    return out.getvalue()


def _site_of(package: str) -> Path:
    """The directory holding ``package``, found without importing it (it pulls in pandas and pandera)."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin, f"{package} is not installed: pip install -e '.[test]'"
    return Path(spec.origin).resolve().parents[1]


def validate_focus(focus_csv: str, workdir: Path) -> str:
    """The validator's report; it ends in "Validation succeeded." or lists every rule that failed."""
    data = workdir / "focus-for-validator.csv"
    data.write_text(as_release_reads_it(focus_csv), encoding="utf-8")
    script = shutil.which("focus-validator") or str(Path(sys.executable).with_name("focus-validator"))
    done = run_captured(
        [script, "--data-file", str(data), "--validate-version", FOCUS_VERSION],
        timeout=300,
        cwd=_site_of("focus_validator"),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
