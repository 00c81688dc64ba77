"""``meshpilot validate -f FILE...``: check config files offline, as the loader and ``/validate`` would.

Each object goes through ``decode_object``, the same decoding and validation
the config directory loader applies, so a file that passes here is one
``meshpilot discovery`` accepts whole.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from meshpilot.config.decode import decode_object, identify
from meshpilot.config.documents import Document, read_file
from meshpilot.config.errors import ConfigError, ValidationError
from meshpilot.config.file_source import config_files


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "validate",
        help="check config files offline (exit 1 if any object is invalid)",
        description="Decode and validate every object in the given YAML/JSON files (directories are "
        "searched for *.yaml, *.yml and *.json) with the checks the config loader and the /validate "
        "webhook apply. Problems are printed with file and object; warnings do not fail.",
    )
    p.add_argument(
        "-f", "--filename", dest="files", type=Path, action="extend", nargs="+", required=True, metavar="FILE"
    )
    p.add_argument(
        "--namespace", "-n", default="default", help="namespace of objects that name none (default default)"
    )
    # -f may be repeated, each taking several files.
    p.set_defaults(run=lambda args: run(args.files, args.namespace, sys.stdout, sys.stderr))


def _expand(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out += config_files(path)
        else:
            out.append(path)
    return out


def _label(doc: Document) -> str:
    if doc.raw is None:
        return doc.where
    kind, namespace, name = identify(doc.raw)
    return f"{doc.where} {kind or '?'} {namespace or 'default'}/{name or '?'}"


def run(files: list[Path], namespace: str, out: TextIO, err: TextIO) -> int:
    """Check ``files``; print problems to ``err`` and a summary to ``out``; 1 if any is invalid."""
    checked = invalid = 0
    for path in _expand(files):
        if not path.exists():
            print(f"{path}: no such file", file=err)
            invalid += 1
            continue
        for doc in read_file(path):
            checked += 1
            label = _label(doc)
            if doc.error is not None or doc.raw is None:
                print(f"{label}: error: {doc.error}", file=err)
                invalid += 1
                continue
            try:
                result = decode_object(doc.raw, default_namespace=namespace)
            except ValidationError as e:
                for message in e.errors:
                    print(f"{label}: error: {message}", file=err)
                invalid += 1
                continue
            except ConfigError as e:
                print(f"{label}: error: {e}", file=err)
                invalid += 1
                continue
            for warning in result.warnings:
                print(f"{label}: warning: {warning}", file=err)
    print(f"{checked} objects checked, {invalid} invalid", file=out)
    return 1 if invalid else 0
