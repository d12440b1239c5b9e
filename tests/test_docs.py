"""The README is the landing page and docs/ the reference: every docs page is linked from the README, every
relative link in either resolves, and the README's examples are jobs the service accepts."""
from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _links(path):
    return [m.group(1) for m in LINK.finditer(path.read_text()) if not m.group(1).startswith(("http://", "https://"))]


def test_every_docs_page_is_linked_from_the_readme_and_links_back():
    readme = set(_links(REPO / "README.md"))
    pages = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))
    assert pages and [p for p in pages if p not in readme] == []
    for p in pages:
        assert "../README.md" in _links(REPO / p), p


@pytest.mark.parametrize("doc",
                         ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))])
def test_every_relative_link_resolves(doc):
    base = (REPO / doc).parent
    missing = [link for link in _links(REPO / doc) if not (base / link).exists()]
    assert missing == [], f"{doc}: links to nothing: {missing}"


def test_the_readmes_ten_line_job_is_a_job_the_api_accepts(client):
    text = (REPO / "README.md").read_text()
    body = text[text.index("-d '{") + 4: text.index("}}'") + 2]
    r = client.post("/v1/jobs", json=json.loads(body))
    assert r.status_code == 201, r.text
