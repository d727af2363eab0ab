"""`report.html`: the report's markdown sections as one self-contained page, plus a sample browser.

Self-contained: figures are inlined as base64 PNG, the style and the small filtering script are inline, and nothing
is fetched from a network. The markdown comes from the same section functions as report.md; `markdown_to_html`
converts exactly the subset they write (headings, paragraphs, `- ` lists, pipe tables, fenced code, images, links,
inline code, bold and italics), escaping every piece of run text.
"""

from __future__ import annotations

import html
import re

from rlhf.report.contract import RunData
from rlhf.report.format import fmt, model_label, order_models
from rlhf.report.samples import PromptSamples, score_key, score_spread, side_by_side

FENCE = re.compile(r"(`{3,})\w*")
HEADING = re.compile(r"(#{1,6}) (.*)")
TABLE_RULE = re.compile(r"\|(?::?-{3,}:?\|)+")
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
ESCAPED = re.compile(r"\\([\\`*_|\[\]()#!<>.-])")
BOLD = re.compile(r"\*\*(.+?)\*\*")
ITALIC_STAR = re.compile(r"(?<![\w*])\*(?![\s*])(.+?)(?<![\s*])\*(?![\w*])")
ITALIC_UNDERSCORE = re.compile(r"(?<!\w)_(?!\s)(.+?)(?<!\s)_(?!\w)")
ALIGN = {"l": "left", "r": "right", "c": "center"}


def slug(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens ("Judge: `gold`" -> "judge-gold")."""
    return re.sub(r"[^\w\- ]", "", text.lower()).strip().replace(" ", "-")


def inline(text: str, images: dict[str, str]) -> str:
    """One line of markdown as escaped HTML: code spans, backslash escapes, links, bold, italics, `<br>` breaks.

    A link to a figure in `images` (path -> data URI) becomes a fold-out inline image, so the page needs no file
    beside it."""
    kept: list[str] = []

    def keep(piece: str) -> str:
        kept.append(piece)
        return f"\x00{len(kept) - 1}\x00"

    text = CODE_SPAN.sub(lambda m: keep(f"<code>{html.escape(m.group(2).strip())}</code>"), text)
    text = ESCAPED.sub(lambda m: keep(html.escape(m.group(1))), text)
    text = html.escape(text).replace("&lt;br&gt;", "<br>")

    def link(m: re.Match) -> str:
        label, target = m.group(1), html.unescape(m.group(2))
        if target in images:
            return keep(
                f'<details class="figure-link"><summary>{label}</summary>'
                f'<img src="{images[target]}" alt="{label}"></details>'
            )
        return f'<a href="{html.escape(target)}">{label}</a>'

    text = LINK.sub(link, text)
    text = BOLD.sub(r"<strong>\1</strong>", text)
    text = ITALIC_STAR.sub(r"<em>\1</em>", text)
    text = ITALIC_UNDERSCORE.sub(r"<em>\1</em>", text)
    return re.sub("\x00(\\d+)\x00", lambda m: kept[int(m.group(1))], text)


def table_cells(line: str) -> list[str]:
    """The cells of one pipe-table line, escapes kept for `inline` (a `\\|` is text, not a border)."""
    cells, cell, i = [], "", line.index("|") + 1
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            cell += line[i : i + 2]
            i += 2
            continue
        if line[i] == "|":
            cells.append(cell.strip())
            cell = ""
        else:
            cell += line[i]
        i += 1
    return cells


def table_html(lines: list[str], images: dict[str, str]) -> str:
    aligns = [
        "c" if c.startswith(":") and c.endswith(":") else "r" if c.endswith(":") else "l" for c in table_cells(lines[1])
    ]

    def row(line: str, tag: str) -> str:
        cells = table_cells(line)
        return (
            "<tr>"
            + "".join(
                f'<{tag} style="text-align:{ALIGN[a]}">{inline(c, images)}</{tag}>' for c, a in zip(cells, aligns)
            )
            + "</tr>"
        )

    body = "".join(row(line, "td") for line in lines[2:])
    return f'<div class="table"><table><thead>{row(lines[0], "th")}</thead><tbody>{body}</tbody></table></div>'


def markdown_to_html(text: str, images: dict[str, str], anchors: dict[str, int] | None = None) -> str:
    """The report's markdown as HTML. `images`: figure path (as report.md links it) -> data URI; `anchors`: heading
    slugs used so far on the page (updated), so repeated headings get GitHub's `-1`, `-2` suffixes."""
    anchors = anchors if anchors is not None else {}
    lines, out, i = text.split("\n"), [], 0

    def starts_block(k: int) -> bool:
        line = lines[k]
        return (
            not line.strip()
            or bool(FENCE.fullmatch(line) or HEADING.fullmatch(line) or IMAGE.fullmatch(line))
            or line.startswith("- ")
            or (line.startswith("|") and k + 1 < len(lines) and bool(TABLE_RULE.fullmatch(lines[k + 1])))
        )

    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif fence := FENCE.fullmatch(line):
            end = next((k for k in range(i + 1, len(lines)) if lines[k] == fence.group(1)), len(lines))
            out.append(f"<pre><code>{html.escape(chr(10).join(lines[i + 1 : end]))}</code></pre>")
            i = end + 1
        elif heading := HEADING.fullmatch(line):
            level, title = len(heading.group(1)), heading.group(2)
            anchor = slug(re.sub(r"[`*]", "", title))
            count = anchors.get(anchor, 0)
            anchors[anchor] = count + 1
            anchor = f"{anchor}-{count}" if count else anchor
            out.append(f'<h{level} id="{anchor}">{inline(title, images)}</h{level}>')
            i += 1
        elif image := IMAGE.fullmatch(line):
            alt, src = image.group(1), images.get(image.group(2), image.group(2))
            out.append(f'<figure><img src="{html.escape(src)}" alt="{html.escape(alt)}"></figure>')
            i += 1
        elif line.startswith("|") and i + 1 < len(lines) and TABLE_RULE.fullmatch(lines[i + 1]):
            end = next((k for k in range(i, len(lines)) if not lines[k].startswith("|")), len(lines))
            out.append(table_html(lines[i:end], images))
            i = end
        elif line.startswith("- "):
            end = next((k for k in range(i, len(lines)) if not lines[k].startswith("- ")), len(lines))
            out.append("<ul>" + "".join(f"<li>{inline(item[2:], images)}</li>" for item in lines[i:end]) + "</ul>")
            i = end
        else:
            end = next((k for k in range(i + 1, len(lines)) if starts_block(k)), len(lines))
            out.append(f"<p>{inline(' '.join(lines[i:end]), images)}</p>")
            i = end
    return "\n".join(out)


def sample_browser(samples: list[PromptSamples], key: str) -> str:
    """Every evaluation prompt with every model's answer and score, as `.sample` blocks whose rows carry
    `data-model` and `data-score` and whose block carries `data-family` and `data-disagrees` (the answers' scores
    differ), with the controls the page's script filters them by."""
    scored = "gold score" if key == "gold_score" else "reward-model score"
    names = order_models(name for s in samples for name in s.answers)
    families = sorted({s.family for s in samples if s.family})
    blocks = []
    for number, sample in enumerate(samples, 1):
        rows = "".join(
            f'<tr data-model="{html.escape(name)}" data-score="{fmt(row.get(key))}">'
            f"<td>{html.escape(model_label(name))}</td><td>{html.escape(str(row.get('response', '')))}</td>"
            f'<td class="num">{fmt(row.get(key))}</td>'
            + ('<td class="num">' + fmt(row.get("reward")) + "</td>" if key == "gold_score" else "")
            + "</tr>"
            for name, row in sample.answers.items()
        )
        blocks.append(
            f'<div class="sample" data-family="{html.escape(sample.family or "")}" '
            f'data-disagrees="{int(score_spread(sample, key) > 0)}">'
            f'<div class="meta">prompt {number}'
            + (f" · {html.escape(sample.family)}" if sample.family else "")
            + "</div>"
            f"<pre><code>{html.escape(sample.prompt.strip())}</code></pre>"
            f'<table><thead><tr><th>model</th><th>response</th><th class="num">{scored}</th>'
            + ('<th class="num">RM reward</th>' if key == "gold_score" else "")
            + f"</tr></thead><tbody>{rows}</tbody></table></div>"
        )
    family_filter = (
        '<label>family <select id="sb-family"><option value="">all</option>'
        + "".join(f'<option value="{html.escape(f)}">{html.escape(f)}</option>' for f in families)
        + "</select></label>"
        if families
        else ""
    )
    model_filter = "".join(
        f'<label><input type="checkbox" value="{html.escape(n)}" checked> {html.escape(model_label(n))}</label>'
        for n in names
    )
    return (
        '<h2 id="sample-browser">Sample browser</h2>\n'
        f"<p>All {len(samples)} evaluation prompts with every model's answer and its {scored}. Filter by prompt "
        f"family and by method; the toggle keeps the prompts where the methods shown disagree on {scored} "
        "(their answers score differently).</p>\n"
        f'<div class="controls">{family_filter}<span class="models">{model_filter}</span>'
        f'<label><input type="checkbox" id="sb-disagree" checked> disagree on {scored}</label>'
        '<span id="sb-count"></span></div>\n<div id="samples">' + "\n".join(blocks) + "</div>"
    )


STYLE = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1f2328;background:#fff;margin:0}
main{max-width:1100px;margin:0 auto;padding:1.5rem 2rem 4rem}
h1{font-size:1.9rem;border-bottom:1px solid #d0d7de;padding-bottom:.3rem}
h2{font-size:1.45rem;border-bottom:1px solid #d0d7de;padding-bottom:.25rem;margin-top:2.2rem}
h3{font-size:1.15rem;margin-top:1.6rem}h4{font-size:1rem}
nav{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:.5rem 1rem;font-size:.9rem;
  display:flex;flex-wrap:wrap;gap:.2rem 1rem}
nav a{white-space:nowrap}
a{color:#0969da;text-decoration:none}a:hover{text-decoration:underline}
code{font:.85em ui-monospace,SFMono-Regular,Menlo,monospace;background:#eff1f3;padding:.1em .3em;border-radius:4px}
pre{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:.6rem .8rem;overflow-x:auto}
pre code{background:none;padding:0}
.table{overflow-x:auto;margin:.8rem 0}
table{border-collapse:collapse;font-size:.88rem}
th,td{border:1px solid #d0d7de;padding:.3rem .6rem;vertical-align:top}
thead th{background:#f6f8fa}tbody tr:nth-child(even){background:#fafbfc}
td.num,th.num{text-align:right;white-space:nowrap}
figure{margin:1rem 0}img{max-width:100%;height:auto;border:1px solid #eaeef2}
details.figure-link{display:inline-block;vertical-align:top}details.figure-link img{display:block;max-width:1000px}
.controls{position:sticky;top:0;background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:.5rem .8rem;
  display:flex;flex-wrap:wrap;gap:.4rem 1.2rem;align-items:center;z-index:1}
.controls .models label{margin-right:.6rem}#sb-count{color:#57606a;margin-left:auto}
.sample{border-left:4px solid #0969da;padding:.2rem 0 .2rem .8rem;margin:1.2rem 0}
.sample pre{margin:.3rem 0}.sample table{width:100%}.sample td:first-child{width:7rem}.sample .num{width:6rem}
.sample .meta{color:#57606a;font-size:.85rem}[hidden]{display:none!important}
"""

SCRIPT = """
(function () {
  var family = document.getElementById("sb-family"), disagree = document.getElementById("sb-disagree");
  var boxes = Array.prototype.slice.call(document.querySelectorAll(".controls .models input"));
  var samples = Array.prototype.slice.call(document.querySelectorAll(".sample"));
  function update() {
    var shown = {}, visible = 0;
    boxes.forEach(function (box) { shown[box.value] = box.checked; });
    samples.forEach(function (sample) {
      var scores = {}, distinct = 0, rows = 0;
      sample.querySelectorAll("tr[data-model]").forEach(function (row) {
        row.hidden = !shown[row.dataset.model];
        if (row.hidden) return;
        rows += 1;
        if (row.dataset.score !== "n/a" && !scores[row.dataset.score]) { scores[row.dataset.score] = 1; distinct += 1; }
      });
      sample.hidden = !rows || (family && family.value && sample.dataset.family !== family.value) ||
        (disagree.checked && distinct < 2);
      if (!sample.hidden) visible += 1;
    });
    document.getElementById("sb-count").textContent = visible + " of " + samples.length + " prompts shown";
  }
  boxes.concat([family, disagree]).forEach(function (el) { if (el) el.addEventListener("change", update); });
  update();
})();
"""


def render_html(sections: list[tuple[str, str]], data: RunData, images: dict[str, str]) -> str:
    """The whole page: every section of `render_sections`, then the sample browser (last: its hundreds of prompts
    would push the suites and timing a page-length down), a contents bar of the top-level sections, inline style
    and script. `images`: figure path as report.md links it -> data URI."""
    anchors: dict[str, int] = {}
    samples = side_by_side(data.responses, data.prompt_families)
    parts = [markdown_to_html(text, images, anchors) for _, text in sections]
    if samples:
        parts.append(sample_browser(samples, score_key(samples)))
    body = "\n".join(parts)
    contents = re.findall(r'<h2 id="([^"]+)">(.*?)</h2>', body)
    nav = "<nav>" + "".join(f'<a href="#{anchor}">{title}</a>' for anchor, title in contents) + "</nav>"
    head, _, rest = body.partition("\n")  # the intro's title first, then the contents bar
    title = "RLHF run report" + (f": preset {data.preset}" if data.preset else "")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n"
        f"<body><main>\n{head}\n{nav}\n{rest}\n</main><script>{SCRIPT}</script></body></html>\n"
    )
