"""The HTML bill opened in Debian's headless Chromium: the DOM holds the charts and the right numbers, and the
screenshot is a real picture (decoded with zlib, no imaging library)."""

from __future__ import annotations

import html
import itertools
import json
import math
import re
import shutil
import struct
import subprocess
import zlib
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpu_fence.chargeback.times import in_words, iso
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
        self.glossary: dict[str, str] = {}  # term → meaning
        self.term: list[str] | None = None
        self.meaning: list[str] | None = None
        self.terms: list[str] = []

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
        elif tag == "dt":
            self.term = []
        elif tag == "dd":
            self.meaning = []
        elif tag == "tr" and self.table is not None:
            self.tables[self.table].append([])
        elif tag in ("td", "th") and self.table is not None:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "dt" and self.term is not None:
            self.terms.append("".join(self.term))
            self.term = None
        elif tag == "dd" and self.meaning is not None:
            self.glossary[self.terms[-1]] = "".join(self.meaning)
            self.meaning = None
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
        for collecting in (self.term, self.meaning):
            if collecting is not None:
                collecting.append(data)
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
    assert rows["batch"][column["by request"]] == "2.50"
    assert rows["batch"][column["total - by request"]] == "-1.56"
    assert rows["batch"][column["per GPU-h held"]] == "0.94"  # 0.94 for the 1 GPU-hour it held
    # 2.50 × 1/8 = 0.3125, charged to the namespace that used the GPU without an allocation, in its total.
    assert rows["sneaky"][column["used without allocation"]] == rows["sneaky"][column["total"]] == "0.31"
    assert rows["(unattributed)"][column["total"]] == "1.25"  # 2.50 × 4/8
    assert rows["(platform)"][column["total"]] == "1.00"  # the unused cheap-7 card
    assert rows["all groups"][column["total"]] == "1.25"  # 0.94 + 0.31
    assert rows["TOTAL"][column["total"]] == "3.50"  # every row: the GPU cost of the range
    assert dom.tables["overreach"][1] == ["sneaky", "miner", "main", "over", "GPU-o", "sneaky", "1.0", "0.31"]
    assert "3.50 EUR" in dom_text  # GPU cost of the range
    assert re.search(r'id="method"[^>]*>[^<]*memory', dom_text)


def test_axes_have_units_round_ticks_and_every_colour_a_legend(report: Path, tmp_path: Path):
    dom = Dom()
    dom.feed(chromium("--dump-dom", report.as_uri(), profile=tmp_path / "profile").stdout)
    texts = {text.get("id"): text["text"] for text in dom.texts["timeline"] if text.get("id")}
    assert texts["y-unit"] == "EUR per 10 min bar"  # six 10-minute intervals, one bar each
    assert texts["x-unit"].startswith("time (UTC)")
    assert dom.texts["comparison"][-1]["text"] == "cost over the whole range, EUR"
    # Time ticks on round instants inside the range (every 10 minutes of this hour), labelled by the time of day.
    window = WINDOWS["overreach"]
    ticks = [text for text in dom.texts["timeline"] if text.get("class") == "time-tick"]
    assert [text["data-time"] for text in ticks] == [iso(window.start + 600 * k) for k in range(1, 6)]
    assert all(re.fullmatch(r"\d\d:\d0", text["text"]) for text in ticks)
    positions = [float(text["x"]) for text in ticks]
    assert positions == sorted(positions) and len(set(positions)) == 5
    # Money ticks from 0 in a round step (1, 2, 2.5 or 5 times a power of ten), the top one above every bar.
    money = [
        float(text["text"].replace(",", "")) for text in dom.texts["timeline"] if text.get("class") == "money-tick"
    ]
    steps = {round(b - a, 9) for a, b in itertools.pairwise(money)}
    assert money[0] == 0 and len(steps) == 1
    [step] = steps
    assert round(step / 10 ** math.floor(math.log10(step)), 9) in (1, 2, 2.5, 5)
    # Every colour of each chart has a legend entry, in words.
    legend = dom.legends["timeline-legend"]
    for words in ("batch", "used without allocation", "unattributed", "idle capacity"):
        assert words in legend
    assert "by request" in dom.legends["comparison-legend"] and "billed here" in dom.legends["comparison-legend"]
    # Green and red in the table are explained where the column is.
    assert (
        "green below zero" in dom.glossary["total - by request"] and "red above" in dom.glossary["total - by request"]
    )


def test_report_says_how_it_was_made(report: Path, tmp_path: Path, prometheus):
    dom = Dom()
    dom.feed(chromium("--dump-dom", report.as_uri(), profile=tmp_path / "profile").stdout)
    facts = dict(dom.tables["provenance"][1:])
    window = WINDOWS["overreach"]
    assert facts["source"] == prometheus.url
    assert facts["range"] == f"{in_words(window.start, window.end)} ({iso(window.start)} .. {iso(window.end)})"
    assert facts["resolution"] == "600 s (10 min)"
    assert (facts["method"], facts["idle capacity"], facts["grouped by"], facts["currency"]) == (
        "holder: holders pay what they hold",
        "platform: charged to the platform row",
        "namespace",
        "EUR",
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ by gpu-fence \S+", facts["generated"])
    # The price list as applied, by GPU model: the T4 matched no model, so the default priced GPU-o; cheap-7
    # matched the node pattern cheap-*.
    assert dom.tables["prices"] == [
        ["GPU model", "price per GPU-hour", "cards", "priced by"],
        ["Tesla T4", "2.50", "1", "the default price"],
        ["Tesla T4", "1.00", "1", "nodes named cheap-*"],
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


def test_the_page_reads_as_a_statement(report: Path, tmp_path: Path):
    """What a finance reader checks first: the headline is the TOTAL row, the cards under it add up to it, the range
    is in words, every column has data and a line in the glossary, words sit left and figures right, and nothing is
    named as the configuration names it."""
    page = chromium("--dump-dom", report.as_uri(), profile=tmp_path / "profile").stdout
    dom = Dom()
    dom.feed(page)
    window = WINDOWS["overreach"]
    words = in_words(window.start, window.end)
    assert re.search(rf"<h1>GPU bill, {re.escape(words)}</h1>", page)
    cards = dict(re.findall(r'<div class="card[^"]*" data-key="([a-z]+)">[^<]*<b>([0-9.,]+) EUR</b>', page))
    header, *body = dom.tables["groups"]
    column = {title: index for index, title in enumerate(header)}
    rows = {row[0]: row for row in body}
    assert cards["total"] == rows["TOTAL"][column["total"]] == "3.50"
    assert (cards["groups"], cards["unattributed"], cards["platform"]) == ("1.25", "1.25", "1.00")
    assert sum(Decimal(cards[key]) for key in ("groups", "unattributed", "platform")) == Decimal(cards["total"])
    # Every column shown has a figure somewhere and a glossary entry; the rows have theirs too.
    for title, index in column.items():
        assert title in dom.glossary, title
        assert any(row[index] not in ("–", "0.00") for row in body), f"column {title!r} has no data"
    assert {"all groups", "(unattributed)", "(platform)", "TOTAL"} <= dom.glossary.keys()
    assert "SM-active GPU-h (not billed)" not in column  # nowhere sampled in this window: left out
    # Words left, figures right, in every table.
    figures = re.findall(r'<td class="num[^"]*" data-key="[a-z_]+">([^<]*)<', page)
    assert figures and all(re.fullmatch(r"–|-?[0-9][0-9,]*(\.[0-9]+)?", text) for text in figures), figures
    assert all(
        re.search(rf'data-key="{key}"', page) and f'class="text" data-key="{key}"' in page
        for key in ("namespace", "pod", "container", "node", "gpu")
    )
    assert "models.'" not in page and "nodes.'" not in page  # prices by model, in words


def measured(report: Path, tmp_path: Path, width: int, media: str) -> dict:
    """The page laid out ``width`` CSS pixels wide, with its print styles applied on screen when ``media`` is
    ``print``: the widths of the page, its tables and charts, and how rows and table heads break across pages,
    read back by a script added to a copy of the page."""
    page = report.read_text(encoding="utf-8")
    if media == "print":
        page = page.replace("@media print", "@media all")
    script = """<pre id="measured" style="white-space: pre-wrap"></pre><script>
const found = {page: document.documentElement.scrollWidth, tables: {}, charts: [], rows: [], heads: []};
for (const table of document.querySelectorAll("table")) found.tables[table.id] = table.getBoundingClientRect().width;
for (const chart of document.querySelectorAll("svg")) found.charts.push(chart.getBoundingClientRect().width);
for (const row of document.querySelectorAll("tr")) found.rows.push(getComputedStyle(row).breakInside);
for (const head of document.querySelectorAll("thead")) found.heads.push(getComputedStyle(head).display);
document.getElementById("measured").textContent = JSON.stringify(found);
</script></body>"""
    copy = tmp_path / f"measured-{width}-{media}.html"
    copy.write_text(page.replace("</body>", script), encoding="utf-8")
    dom = chromium(
        "--hide-scrollbars", f"--window-size={width},1000", "--dump-dom", copy.as_uri(), profile=tmp_path / "profile"
    ).stdout
    found = re.search(r'<pre id="measured"[^>]*>([^<]+)</pre>', dom)
    assert found, "the measuring script did not run"
    return json.loads(html.unescape(found.group(1)))


# A4 less 12 mm margins each side (the page's @page rule) is 186 mm: 703 CSS pixels at 96 per inch. Letter is
# wider (191.9 mm), so what fits A4 fits both.
A4_WIDTH_PX = 703


def test_printed_every_table_and_chart_fits_the_page_and_no_row_is_cut(report: Path, tmp_path: Path):
    printed = measured(report, tmp_path, A4_WIDTH_PX, "print")
    assert printed["page"] <= A4_WIDTH_PX, printed
    assert printed["tables"] and all(width <= A4_WIDTH_PX for width in printed["tables"].values()), printed
    assert printed["charts"] and all(width <= A4_WIDTH_PX for width in printed["charts"]), printed
    assert set(printed["rows"]) == {"avoid"}  # a row never splits across two pages
    assert set(printed["heads"]) == {"table-header-group"}  # a table's head repeats on every page it spans
    # On a screen, the rows break freely and the page is as wide as the window, no wider.
    screen = measured(report, tmp_path, 1280, "screen")
    assert screen["page"] <= 1280 and set(screen["rows"]) == {"auto"}


def test_it_prints_to_pdf(report: Path, tmp_path: Path):
    pdf = tmp_path / "bill.pdf"
    chromium("--no-pdf-header-footer", f"--print-to-pdf={pdf}", report.as_uri(), profile=tmp_path / "profile")
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF-") and b"%%EOF" in data[-1024:]
    assert len(re.findall(rb"/Type\s*/Page\b", data)) >= 2  # the bill takes more than one page
