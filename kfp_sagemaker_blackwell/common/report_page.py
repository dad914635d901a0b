"""The look both HTML reports share (the precision sweep's and batch tuning's), declared once:
a forwarded report should read as one product, whichever step wrote it."""

from __future__ import annotations

CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;
color:#222;max-width:1100px}table{border-collapse:collapse;margin:12px 0;font-size:14px}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}.pass{background:#e6f4ea;color:#137333;font-weight:600}
.fail{background:#fce8e6;color:#a50e0e;font-weight:600}.note{color:#555;font-size:13px}
.no{background:#fff4e5;color:#8a4b00;font-weight:600}td.num{text-align:right}
.partial{background:#fff4e5;border:1px solid #f0a020;padding:8px 12px;margin:12px 0}
.caveat{background:#fff4e5;border-left:4px solid #f0a020;padding:8px 12px;margin:12px 0}
.recommendation{font-size:17px;padding:8px 12px;background:#eef3fd;border-left:4px solid #1a73e8}
img{max-width:100%;display:block;margin:8px 0 4px}figure{margin:0 0 20px}
figcaption.source{color:#555;font-size:13px;font-style:italic}
table.run-context caption{text-align:left;font-weight:600;padding-bottom:4px}
table.run-context th{width:12em}"""


def head(title: str) -> str:
    """The page's opening: doctype, charset, title, the shared style."""
    import html

    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{CSS}</style></head><body>")
