"""Files into documents: multi-document YAML, JSON, Lists, and errors kept per document."""

from __future__ import annotations

from pathlib import Path

from meshpilot.config.documents import parse_text, read_file


def test_multi_document_yaml_with_a_bad_document_in_the_middle() -> None:
    text = (
        "# leading comment\n"
        "kind: Service\nmetadata: {name: a, creationTimestamp: 2024-01-01T00:00:00Z}\n"
        "---\n"
        "kind: Service\nmetadata: {name: b\n"
        "---\n"
        "kind: Pod\nmetadata: {name: c}\n"
    )
    docs = parse_text(text, "f.yaml")
    assert [(d.index, d.raw is not None) for d in docs] == [(0, True), (1, False), (2, True)]
    assert docs[0].raw is not None
    assert docs[0].raw["metadata"]["creationTimestamp"] == "2024-01-01T00:00:00Z", "timestamps stay text"
    assert docs[1].error is not None
    assert "invalid YAML" in str(docs[1].error)
    assert "line 7" in str(docs[1].error), "the line is counted in the file, not the document"
    assert docs[1].where == "f.yaml[doc 1]"


def test_kind_list_items_become_documents() -> None:
    text = "apiVersion: v1\nkind: List\nitems:\n- {kind: Service}\n- 3\n- {kind: Pod}\n"
    docs = parse_text(text, "l.yaml")
    assert [(d.item, d.raw) for d in docs] == [(0, {"kind": "Service"}), (1, None), (2, {"kind": "Pod"})]
    assert docs[1].where == "l.yaml[doc 0, item 1]"


def test_empty_documents_are_skipped_and_scalars_rejected() -> None:
    docs = parse_text("---\n---\n# only a comment\n---\njust text\n", "s.yaml")
    assert len(docs) == 1
    assert docs[0].error is not None
    assert "must be an object" in str(docs[0].error)


def test_json_files(tmp_path: Path) -> None:
    good = tmp_path / "a.json"
    good.write_text('{"kind": "ServiceList", "items": [{"kind": "Service"}]}')
    assert [d.raw for d in read_file(good)] == [{"kind": "Service"}]
    bad = tmp_path / "b.json"
    bad.write_text('{"kind": ')
    [doc] = read_file(bad)
    assert doc.error is not None
    assert "invalid JSON" in str(doc.error)


def test_unreadable_and_binary_files(tmp_path: Path) -> None:
    binary = tmp_path / "x.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    [doc] = read_file(binary)
    assert "not UTF-8" in str(doc.error)
    [missing] = read_file(tmp_path / "missing.yaml")
    assert "cannot read file" in str(missing.error)
