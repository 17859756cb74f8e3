"""Artifact I/O: atomic writes, JSONL with per-line errors, schema validation."""

from __future__ import annotations

import contextlib
import csv
import importlib.resources
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from reasonrl.errors import ReasonRLError


def current_umask() -> int:
    """The process's umask, read without setting it (os.umask sets it: a race with threads)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: str | os.PathLike) -> None:
    """Give a file, or a folder and everything in it, the modes a plain open or mkdir would
    have given them: mkstemp (0600), mkdtemp (0700) and safetensors (0600) do not follow the
    umask, and colleagues are meant to read a run's outputs as the umask intends."""
    mask = current_umask()
    path = Path(path)
    for entry in [path, *path.rglob("*")] if path.is_dir() else [path]:
        if not entry.is_symlink():
            os.chmod(entry, (0o777 if entry.is_dir() else 0o666) & ~mask)


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file or folder entry to disk: a rename is durable only once both the renamed
    data and the folder holding the new name have reached the disk (else a power cut can leave
    a finished-looking name with empty contents)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str | os.PathLike) -> None:
    """fsync every file and folder under `path` (itself included), before it is renamed."""
    path = Path(path)
    for entry in [*path.rglob("*"), path] if path.is_dir() else [path]:
        if not entry.is_symlink():
            fsync_path(entry)


def replace_durably(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Rename `source` (a finished file or folder) over `target`: its data is on disk before
    the rename, and the rename is on disk before this returns."""
    fsync_tree(source)
    os.replace(source, target)
    fsync_path(Path(target).parent)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it over `path` only on success.

    A killed job therefore never leaves a file that looks finished, and the data is fsynced
    before the rename (the folder after it), so neither does a power cut. Only a regular file is
    ever replaced: renaming over a device or a folder (say /dev/null, as root) would destroy it.
    """
    path = Path(path)
    if path.exists() and not path.is_file():
        raise ReasonRLError(f"{path}: exists and is not a regular file; not overwriting it")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    follow_umask(tmp_path)
    try:
        yield tmp_path
        replace_durably(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReasonRLError(f"{path}: file not found") from None
    except json.JSONDecodeError as err:
        raise ReasonRLError(f"{path}:{err.lineno}: malformed JSON: {err.msg}") from None


@cache
def load_schema(name: str) -> dict:
    """Load the package's `schemas/<name>.schema.yaml` (package data: any install finds it)."""
    resource = importlib.resources.files("reasonrl") / "schemas" / f"{name}.schema.yaml"
    return yaml.safe_load(resource.read_text(encoding="utf-8"))


def _validator(schema_name: str) -> jsonschema.protocols.Validator:
    schema = load_schema(schema_name)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


def _first_error(validator: jsonschema.protocols.Validator, row: Any) -> str | None:
    error = jsonschema.exceptions.best_match(validator.iter_errors(row))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "<row>"
    return f"{where}: {error.message}"


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict], schema: str | None = None) -> int:
    """Write rows atomically as JSONL, validating each against `schema` first."""
    validator = _validator(schema) if schema else None
    count = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            if validator is not None:
                problem = _first_error(validator, row)
                if problem:
                    raise ReasonRLError(
                        f"{path}: row {count + 1} breaks schema {schema}: {problem}"
                    )
            fh.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
            count += 1
    return count


def iter_jsonl(path: str | os.PathLike, schema: str | None = None) -> Iterator[dict]:
    """Yield the rows of a JSONL file; a bad line raises an error naming file and line."""
    path = Path(path)
    validator = _validator(schema) if schema else None
    if not path.is_file():
        raise ReasonRLError(f"{path}: file not found")
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ReasonRLError(f"{path}:{lineno}: malformed JSON: {err.msg}") from None
            if not isinstance(row, dict):
                raise ReasonRLError(f"{path}:{lineno}: expected a JSON object per line")
            if validator is not None:
                problem = _first_error(validator, row)
                if problem:
                    raise ReasonRLError(f"{path}:{lineno}: breaks schema {schema}: {problem}")
            yield row


def read_jsonl(path: str | os.PathLike, schema: str | None = None) -> list[dict]:
    return list(iter_jsonl(path, schema))


def write_csv(path: str | os.PathLike, rows: list[dict]) -> None:
    """Write a list of flat dicts as CSV (columns in first-seen order)."""
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
