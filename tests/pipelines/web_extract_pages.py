"""Hand-written web pages for the extract/filter tests, one per path through the funnel, and a WARC writer."""

from __future__ import annotations

import io
from pathlib import Path

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

BICYCLE = """
The first machines that we would recognise as bicycles appeared in Germany in 1817, when Karl Drais built a
wooden running machine that the rider pushed along with his feet.
It had no pedals, yet it could cover ground faster than a person walking, and for a short time it became a
fashionable toy among wealthy young men in several European cities.
Pedals arrived about fifty years later in France, where makers fixed cranks directly to the front wheel.
Because each turn of the pedals moved the bike only as far as the wheel's circumference, designers made the
front wheel larger and larger, which produced the famous high wheeler of the 1870s.
Those machines were fast but dangerous, since a rider sitting high above the road could be thrown forward by
a single stone.
The safety bicycle of the 1880s solved the problem with two wheels of equal size and a chain that drove the
rear wheel.
When pneumatic tyres were added a few years later, cycling became comfortable enough for everyday travel, and
the bicycle changed how ordinary people lived, worked and courted.
Historians often point out that the bicycle gave many women a new kind of independence, and that its
factories trained the mechanics who later built the first cars and aeroplanes.
"""

SOURDOUGH = """
Sourdough bread is leavened by a culture of wild yeasts and lactic acid bacteria rather than by a packet of
commercial yeast.
Bakers keep this culture, usually called a starter, alive by feeding it flour and water every day or two.
The yeasts produce the gas that makes the dough rise, while the bacteria produce acids that give the bread its
mild sour taste and help it stay fresh for longer.
A typical loaf begins the evening before baking, when a spoonful of active starter is mixed into a larger
batch of flour and water.
The next morning the baker adds salt, folds the dough several times over a few hours, and then shapes it into
a tight round.
After a slow final rise, often overnight in a cool room, the loaf is baked in a very hot covered pot so that
the steam trapped inside lets the crust expand before it sets.
Good sourdough has an open, glossy crumb and a crust that crackles as it cools.
It takes practice to read the dough, because temperature, flour and the age of the starter all change how
quickly it ferments.
"""

LIGHTHOUSE = """
For centuries lighthouses were the most important aid to navigation along dangerous coasts.
The earliest ones were simply fires lit on hilltops or towers, and the Pharos of Alexandria, built in the
third century before the common era, was counted among the wonders of the ancient world.
Modern lighthouses date from the eighteenth century, when engineers learned to build stone towers that could
survive storms on exposed rocks.
The invention of the Fresnel lens in 1822 made their lights far brighter, because the lens gathered light
that would otherwise be lost and bent it into a narrow horizontal beam.
Each lighthouse was given its own pattern of flashes so that sailors could tell which one they were looking
at during the night.
Keepers lived at the stations with their families, trimming wicks, polishing the lenses and recording the
weather in a logbook.
Today nearly all lights are automatic, and satellite navigation has reduced their importance, but many
towers still work and some have been turned into museums.
"""

FRENCH = """
Le pain au levain est fabriqué avec une culture de levures sauvages et de bactéries lactiques.
Les boulangers entretiennent ce levain en le nourrissant chaque jour avec de la farine et de l'eau.
La pâte fermente lentement pendant plusieurs heures, ce qui donne au pain une saveur légèrement acide et une
mie alvéolée.
On cuit ensuite la miche dans un four très chaud afin d'obtenir une croûte dorée et croustillante.
Beaucoup de familles gardent le même levain pendant des années et le partagent avec leurs voisins.
"""

GERMAN = """
Der Leuchtturm an der Küste war jahrhundertelang ein wichtiges Hilfsmittel für die Seefahrt.
Die Wärter lebten mit ihren Familien auf der Station und kümmerten sich jede Nacht um das Licht.
Heute arbeiten fast alle Leuchttürme automatisch, doch viele Türme stehen noch und sind beliebte Ausflugsziele.
Manche wurden in Museen umgewandelt, in denen man die alten Linsen und Lampen besichtigen kann.
"""

# C4 drops the whole page for "lorem ipsum"; the rest is a plausible English product page.
LOREM = """
Our new garden bench is made from solid oak and finished with a natural oil that protects it from rain.
It seats three adults comfortably and comes with a ten year guarantee against rot.
The frame is assembled with stainless steel bolts, so it will not rust even after many winters outdoors.
Lorem ipsum dolor sit amet, this paragraph is still waiting for the final product description.
Delivery takes about a week, and the bench arrives flat packed with all the tools you need.
Customers who bought this bench also liked our matching table and the folding chairs from the same range.
"""

# C4 drops pages containing a curly bracket (code, templates).
CODE_TUTORIAL = """
In this short tutorial we will write a function that counts how often each word appears in a text.
The idea is to split the text on whitespace and to keep a running total for every word that we meet.
A dictionary is the natural structure for this, because it maps each word to its current count.
You can write the empty dictionary as counts = {} and then update it inside a simple loop over the words.
At the end of the loop the dictionary holds the answer, and you can sort it to find the most common words.
This approach is fast enough for books, and it is a good first exercise for anyone learning the language.
"""

# FineWeb drops pages where almost no line ends in punctuation (menus, catalogues); Gopher and C4 pass it.
CATALOGUE_LINES = [
    "Handmade ceramic coffee mug with a blue glaze and a wide handle",
    "Set of four linen napkins in a soft natural colour for the dinner table",
    "Cast iron frying pan that is seasoned and ready for the kitchen",
    "Wooden chopping board made from a single piece of walnut wood",
    "Large glass storage jar with an airtight lid for flour or sugar",
    "Stainless steel kettle for the stove with a whistle on the spout",
    "Cotton apron with two deep pockets and an adjustable neck strap",
    "Bamboo spoon and spatula set for cooking in non stick pans",
    "Enamel baking dish that goes from the oven to the table",
    "Pair of oven gloves with a heat resistant silicone grip on the palm",
    "Copper measuring cups in four sizes that hang on a ring",
    "Wicker bread basket lined with a washable cloth for the morning",
]

# Gopher repetition: the same short lines again and again (too short for trafilatura's own dedup).
REPEATED_LINES = ["Buy the best cheap shoes online today.", "Free shipping on all orders now."] * 12 + [
    "We have shoes for men, women and children in every size and colour you could want."
]

# Gopher quality: a real notice, but under 50 words.
SHORT_NOTE = """
The town library will be closed on Monday because of the public holiday.
Books that are due that day can be returned through the slot beside the main door, and no late fees will be
charged for them.
Normal opening hours resume on Tuesday morning.
"""

NAV_ONLY = """<script>document.write("loading")</script><img src="/banner.png" alt="">"""


def article(title: str, text: str, lang: str = "en") -> str:
    paras = "\n".join(f"<p>{p.strip()}</p>" for p in _sentences(text))
    return (
        f'<!DOCTYPE html><html lang="{lang}"><head><meta charset="utf-8"><title>{title}</title></head><body>'
        f'<header><a href="/">Home</a> <a href="/blog">Blog</a></header>'
        f"<article><h1>{title}</h1>\n{paras}\n</article>"
        f"<footer>Written for the Crucible tests.</footer></body></html>"
    )


def _sentences(text: str) -> list[str]:
    """Join the wrapped lines above back into one string per sentence."""
    out, cur = [], []
    for line in text.strip().splitlines():
        cur.append(line.strip())
        if line.rstrip().endswith((".", "!", "?")):
            out.append(" ".join(cur))
            cur = []
    if cur:
        out.append(" ".join(cur))
    return out


def lines_page(title: str, lines: list[str]) -> str:
    body = "\n".join(f"<p>{line}</p>" for line in lines)
    return (
        f"<!DOCTYPE html><html><head><title>{title}</title></head><body><main><h1>{title}</h1>\n{body}\n"
        f"</main></body></html>"
    )


# (url, content type, status, body, expected fate: (stage, step, reason) or ("kept",))
PAGES: list[tuple[str, str, int, bytes, tuple]] = [
    (
        "http://site.test/bicycle",
        "text/html",
        200,
        article("A short history of the bicycle", BICYCLE).encode(),
        ("kept",),
    ),
    (
        "http://site.test/sourdough",
        "text/html; charset=utf-8",
        200,
        article("How sourdough bread is made", SOURDOUGH).encode(),
        ("kept",),
    ),
    ("http://site.test/lighthouse", "text/html", 200, article("Lighthouses", LIGHTHOUSE).encode(), ("kept",)),
    (
        "http://site.test/fr/levain",
        "text/html",
        200,
        article("Le pain au levain", FRENCH, "fr").encode(),
        ("extract", "language", "other_language"),
    ),
    (
        "http://site.test/de/leuchtturm",
        "text/html",
        200,
        article("Der Leuchtturm", GERMAN, "de").encode(),
        ("extract", "language", "other_language"),
    ),
    (
        "http://site.test/nav",
        "text/html",
        200,
        f"<html><body>{NAV_ONLY}</body></html>".encode(),
        ("extract", "extract", "no_text_extracted"),
    ),
    (
        "http://site.test/tiny",
        "text/html",
        200,
        article("Note", "Closed today.").encode(),
        ("extract", "min_length", "too_short"),
    ),
    (
        "http://site.test/garbage.bin",
        "application/octet-stream",
        200,
        bytes(range(256)) * 8,
        ("extract", "read", "non_html"),
    ),
    (
        "http://site.test/missing",
        "text/html",
        404,
        b"<html><body><p>Not found</p></body></html>",
        ("extract", "read", "http_status_404"),
    ),
    (
        "http://site.test/shoes",
        "text/html",
        200,
        lines_page("Cheap shoes", REPEATED_LINES).encode(),
        ("filter", "gopher_repetition", "dup_line_frac"),
    ),
    (
        "http://site.test/closed",
        "text/html",
        200,
        article("Holiday closing", SHORT_NOTE).encode(),
        ("filter", "gopher_quality", "gopher_short_doc"),
    ),
    (
        "http://site.test/bench",
        "text/html",
        200,
        article("Oak garden bench", LOREM).encode(),
        ("filter", "c4_quality", "lorem_ipsum"),
    ),
    (
        "http://site.test/wordcount",
        "text/html",
        200,
        article("Counting words", CODE_TUTORIAL).encode(),
        ("filter", "c4_quality", "curly_bracket"),
    ),
    (
        "http://site.test/kitchen",
        "text/html",
        200,
        lines_page("Kitchen shop", CATALOGUE_LINES).encode(),
        ("filter", "fineweb_quality", "line_punct_ratio"),
    ),
]


def write_warc(path: Path, pages=PAGES, with_requests: bool = True) -> Path:
    """A gzipped WARC with a request + response record per page (responses carry no payload-type header,
    like many crawlers' output)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        writer = WARCWriter(fh, gzip=True)
        for i, (url, ctype, status, body, _) in enumerate(pages):
            date = f"2026-01-01T00:00:{i:02d}Z"
            if with_requests:
                req_headers = StatusAndHeaders(
                    "GET / HTTP/1.1", [("Host", "site.test")], is_http_request=True
                )
                writer.write_record(
                    writer.create_warc_record(
                        url, "request", http_headers=req_headers, warc_headers_dict={"WARC-Date": date}
                    )
                )
            reason = {200: "OK", 404: "Not Found"}[status]
            http = StatusAndHeaders(f"{status} {reason}", [("Content-Type", ctype)], protocol="HTTP/1.1")
            record = writer.create_warc_record(
                url,
                "response",
                payload=io.BytesIO(body),
                http_headers=http,
                warc_headers_dict={
                    "WARC-Date": date,
                    "WARC-Record-ID": f"<urn:uuid:00000000-0000-0000-0000-{i:012d}>",
                },
            )
            writer.write_record(record)
    return path
