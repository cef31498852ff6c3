"""The HTML bill opened in Debian's headless Chromium: the DOM holds the charts and the right numbers, and the
screenshot is a real picture (decoded with zlib, no imaging library)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpu_fence.auditor.chargeback.compute import IDLE, OVERREACH, UNATTRIBUTED
from gpu_fence.auditor.chargeback.times import iso
from tests.fakes.chargeback_scenarios import PRICES_YAML, WINDOWS, run_chargeback, window_args

pytestmark = pytest.mark.e2e

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium(*arguments: str, profile: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "chromium is not installed (apt-get install chromium; CI's .ci/run does)"
    return subprocess.run(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *arguments],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )


class Dom(HTMLParser):
    """Collects what the assertions need: svg shapes by chart, and table cells by table id and row."""

    def __init__(self) -> None:
        super().__init__()
        self.svg: str | None = None
        self.shapes: dict[str, list[dict[str, str]]] = {}
        self.table: str | None = None
        self.tables: dict[str, list[list[str]]] = {}
        self.cell: list[str] | None = None
        self.external: list[str] = []
        self.texts: dict[str, list[dict[str, str]]] = {}  # svg id → its <text> elements (attributes and "text")
        self.text: dict[str, str] | None = None
        self.legends: dict[str, str] = {}
        self.legend: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {key: value or "" for key, value in attrs}
        for key in ("src", "href"):
            if attributes.get(key) and not attributes[key].startswith("#"):
                self.external.append(f"{tag} {key}={attributes[key]}")
        if tag in ("script", "link", "img", "iframe"):
            self.external.append(tag)
        if tag == "svg":
            self.svg = attributes.get("id", "")
            self.shapes[self.svg] = []
            self.texts[self.svg] = []
        elif tag == "text" and self.svg is not None:
            self.text = {**attributes, "text": ""}
            self.texts[self.svg].append(self.text)
        elif tag == "div" and "legend" in attributes.get("class", ""):
            self.legend = attributes.get("id", "")
            self.legends[self.legend] = ""
        elif tag in ("rect", "path") and self.svg is not None:
            self.shapes[self.svg].append({"tag": tag, **attributes})
        elif tag == "table":
            self.table = attributes.get("id", "")
            self.tables[self.table] = []
        elif tag == "tr" and self.table is not None:
            self.tables[self.table].append([])
        elif tag in ("td", "th") and self.table is not None:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "text":
            self.text = None
        elif tag == "div":
            self.legend = None
        if tag == "svg":
            self.svg = None
        elif tag == "table":
            self.table = None
        elif tag in ("td", "th") and self.cell is not None and self.table is not None:
            self.tables[self.table][-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)
        if self.text is not None:
            self.text["text"] += data
        if self.legend is not None:
            self.legends[self.legend] += data


def png_pixels(data: bytes) -> tuple[int, int, list[bytearray]]:
    """Decode an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes) into rows of raw bytes."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, chunks = 8, []
    width = height = depth = colour = interlace = 0
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        body = data[position + 8 : position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * bpp
    previous, rows, offset = bytearray(stride), [], 0
    for _ in range(height):
        kind, line = raw[offset], bytearray(raw[offset + 1 : offset + 1 + stride])
        offset += 1 + stride
        if kind == 1:
            for x in range(bpp, stride):
                line[x] = (line[x] + line[x - bpp]) & 0xFF
        elif kind == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous, strict=True))
        elif kind == 3:
            for x in range(stride):
                left = line[x - bpp] if x >= bpp else 0
                line[x] = (line[x] + ((left + previous[x]) >> 1)) & 0xFF
        elif kind == 4:
            for x in range(stride):
                a = line[x - bpp] if x >= bpp else 0
                b, c = previous[x], (previous[x - bpp] if x >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(line)
        previous = line
    return width, bpp, rows


@pytest.fixture(scope="module")
def report(prometheus, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("html")
    prices = directory / "prices.yaml"
    prices.write_text(PRICES_YAML, encoding="utf-8")
    output = directory / "bill.html"
    result = run_chargeback(
        "--prometheus",
        prometheus.url,
        *window_args("overreach"),
        "--prices",
        str(prices),
        "--idle",
        "platform",
        "--format",
        "html",
        "--output",
        str(output),
    )
    assert result.code == 0, result.stderr
    return output


def test_dom_has_charts_and_the_right_numbers(report: Path, tmp_path: Path):
    dom_text = chromium("--dump-dom", report.as_uri(), profile=tmp_path / "profile").stdout
    dom = Dom()
    dom.feed(dom_text)
    assert dom.external == []  # nothing fetched from anywhere: no scripts, stylesheets, images or links
    timeline = dom.shapes["timeline"]
    layers = {shape["data-layer"] for shape in timeline if shape["tag"] == "rect"}
    # Six 10-minute bars, each stacking batch, overreach and unattributed; the unused card is idle.
    assert layers == {"batch", "(overreach)", "(unattributed)", "(idle)"}
    assert sum(1 for shape in timeline if shape["tag"] == "rect") == 6 * 4
    assert any(shape["tag"] == "path" for shape in timeline)
    comparison = dom.shapes["comparison"]
    assert {(shape["data-group"], shape["data-kind"]) for shape in comparison} >= {
        ("batch", "request"),
        ("batch", "billed"),
    }

    rows = {row[0]: row for row in dom.tables["groups"][1:]}
    header = dom.tables["groups"][0]
    column = {title: index for index, title in enumerate(header)}
    # batch: 2.50 × 3/8 = 0.9375 → 0.94; requested 1 GPU-hour × 2.50 = 2.50; difference −1.56.
    assert rows["batch"][column["total"]] == "0.94"
    assert rows["batch"][column["request cost"]] == "2.50"
    assert rows["batch"][column["total - request"]] == "-1.56"
    assert rows["sneaky"][column["overreach (apart)"]] == "0.31"  # 2.50 × 1/8
    assert rows["(unattributed)"][column["total"]] == "1.25"  # 2.50 × 4/8
    assert rows["(platform)"][column["total"]] == "1.00"  # the unused cheap-7 card
    assert rows["TOTAL"][column["total"]] == "3.19"  # 3.50 − 0.3125 overreach, kept apart
    assert dom.tables["overreach"][1] == ["sneaky", "miner", "main", "over", "GPU-o", "1.0", "0.31"]
    assert "3.50 EUR" in dom_text  # GPU cost of the range
    assert re.search(r'id="method"[^>]*>[^<]*memory', dom_text)


def test_axes_have_units_time_labels_and_the_signs_a_legend(report: Path, tmp_path: Path):
    dom = Dom()
    dom.feed(chromium("--dump-dom", report.as_uri(), profile=tmp_path / "profile").stdout)
    texts = {text.get("id"): text["text"] for text in dom.texts["timeline"] if text.get("id")}
    assert texts["y-unit"] == "EUR per 10 min bar"  # six 10-minute intervals, one bar each
    assert texts["x-unit"].startswith("time (UTC)")
    assert dom.texts["comparison"][-1]["text"] == "cost over the whole range, EUR"
    # The range's own start and end at the ends of the axis, and the quarter, half and three-quarter instants
    # between them, left to right.
    window = WINDOWS["overreach"]
    ticks = [text for text in dom.texts["timeline"] if text.get("class") == "time-tick"]
    assert [text["text"] for text in ticks] == [iso(window.start + 900 * k) for k in (1, 2, 3)]
    ends = [
        text for text in dom.texts["timeline"] if text.get("text-anchor") in ("start", "end") and "T" in text["text"]
    ]
    assert [text["text"] for text in ends] == [iso(window.start), iso(window.end)]
    positions = [float(text["x"]) for text in (ends[0], *ticks, ends[1])]
    assert positions == sorted(positions) and len(set(positions)) == 5
    signs = dom.legends["signs-legend"]
    assert "below zero" in signs and "above zero" in signs and "does not apply" in signs
    assert all(layer in dom.legends["timeline-legend"] for layer in ("batch", OVERREACH, UNATTRIBUTED, IDLE))


def test_report_says_how_it_was_made(report: Path, tmp_path: Path, prometheus):
    dom = Dom()
    dom.feed(chromium("--dump-dom", report.as_uri(), profile=tmp_path / "profile").stdout)
    facts = dict(dom.tables["provenance"][1:])
    window = WINDOWS["overreach"]
    assert facts["source"] == prometheus.url
    assert facts["range"] == f"{iso(window.start)} .. {iso(window.end)}"
    assert facts["step"] == "600 s (10 min)"
    assert (facts["method"], facts["idle capacity"], facts["grouped by"], facts["currency"]) == (
        "holder",
        "platform",
        "namespace",
        "EUR",
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ by gpu-fence \S+", facts["generated"])
    # The price list as applied: the T4 matched no model, so default priced GPU-o; cheap-7 matched nodes."cheap-*".
    assert dom.tables["prices"][1:] == [
        ["default", "Tesla T4", "2.50", "1"],
        ["nodes.'cheap-*'", "Tesla T4", "1.00", "1"],
    ]
    cards = {row[1]: row for row in dom.tables["cards"][1:]}
    assert cards["GPU-o"] == ["over", "GPU-o", "Tesla T4", "2.50", "1.00", "2.50", "0.00"]
    assert cards["GPU-idle"] == ["cheap-7", "GPU-idle", "Tesla T4", "1.00", "1.00", "1.00", "1.00"]


def test_screenshot_is_not_blank(report: Path, tmp_path: Path):
    shot = tmp_path / "shot.png"
    chromium(f"--screenshot={shot}", "--window-size=1280,2000", report.as_uri(), profile=tmp_path / "profile")
    width, bpp, rows = png_pixels(shot.read_bytes())
    assert width == 1280 and len(rows) == 2000
    luminance = [
        (row[x] * 299 + row[x + 1] * 587 + row[x + 2] * 114) / 1000
        for row in rows[::4]
        for x in range(0, width * bpp, 4 * bpp)
    ]
    mean = sum(luminance) / len(luminance)
    variance = sum((value - mean) ** 2 for value in luminance) / len(luminance)
    assert variance > 100, f"the page looks blank (mean {mean:.0f}, variance {variance:.1f})"
    # The overreach layer is drawn in red (#d62728): the chart was painted, not just the text.
    red = sum(1 for row in rows[::2] for x in range(0, width * bpp, bpp) if row[x : x + 3] == b"\xd6\x27\x28")
    assert red > 50
