"""Finished shards of a generation stage's work, so a killed stage resumes where it stopped.

A stage cuts its problems into fixed-size shards (`generation.shard_size`); each finished
shard is written atomically (fsynced, then renamed) into an undeclared folder beside the
stage's output folder (`.NAME.shards`), stamped with a fingerprint of the stage's settings and
inputs. A rerun reads the finished shards, makes only the missing ones and gathers all of
them in shard order; shards stamped with other settings are discarded, never merged. The
stage removes the folder once its outputs are written.

A shard's randomness depends only on (seed, shard index), never on what the process made
before it, so a resumed run equals an uninterrupted one byte for byte, and a shard made by
another process (a scatter job) equals the same shard made here.

That is how a stage spreads over jobs (`Split`): job i of n makes every shard whose index is
i modulo n and publishes them as its output folder (a part); the gathering job adopts the
parts' shards as finished ones and runs the stage, which then makes nothing and writes the
same bytes as one job would.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from reasonrl.errors import ReasonRLError
from reasonrl.io import write_text

log = logging.getLogger(__name__)

T = TypeVar("T")
Parts = dict[str, list]

# Seeds of shard i start this far from shard i-1's: beyond the offsets the stages add per
# turn, batch and search round (7919 * turn, 1009 * round), so streams do not overlap.
SEED_STRIDE = 1_000_003


def shard_seed(seed: int, index: int) -> int:
    """The seed of shard `index` of a stream seeded `seed` (shard 0 keeps `seed`)."""
    return seed + SEED_STRIDE * index


def chunks(items: Sequence[T], size: int) -> list[list[T]]:
    """`items` cut in order into lists of `size` (the last one may be shorter)."""
    return [list(items[start : start + size]) for start in range(0, len(items), size)]


def fingerprint(*parts: Any) -> str:
    """A digest of the settings and input hashes that make a shard reusable."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Split:
    """A stage's share of a job split: `part` of `count` for a part job (it makes the shards
    whose index is part modulo count), or the part jobs' folders for the gathering job."""

    part: int = 0
    count: int = 1
    parts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.part < self.count:
            raise ReasonRLError(f"--part expects I/N with 0 <= I < N, got {self.part}/{self.count}")
        if self.parts and self.count > 1:
            raise ReasonRLError("--part and --parts are exclusive: a job makes a part or gathers")

    @classmethod
    def parse(cls, part: str | None, parts: Sequence[str] | None) -> Split:
        """From the CLI's --part I/N and --parts DIR... (neither: the whole stage in one job)."""
        if part is None:
            return cls(parts=tuple(parts or ()))
        index, sep, count = part.partition("/")
        if not (sep and index.isdigit() and count.isdigit()):
            raise ReasonRLError(f"--part expects I/N (e.g. 0/4), got '{part}'")
        return cls(int(index), int(count), tuple(parts or ()))

    @property
    def is_part(self) -> bool:
        return self.count > 1


ONE_JOB = Split()  # the whole stage in one job
PART_RECORD = "part.json"  # in a part folder, beside its shards


class ShardStore:
    """The finished shards of one output folder's stage, in `.NAME.shards` beside it."""

    def __init__(self, out_dir: str | Path, stamp: str, split: Split = ONE_JOB):
        self.out = Path(out_dir)
        self.folder = self.out.parent / f".{self.out.name}.shards"
        self.stamp = stamp
        self.split = split
        self.made = self.reused = 0
        self.adopted: list[dict] = []  # the part jobs' records, for the gathering job's manifest
        self._open()
        for part in split.parts:
            self._adopt(Path(part))

    def _open(self) -> None:
        if not self.folder.exists():
            return  # made with the first shard: a stage that fails before leaves nothing
        stamp_file = self.folder / "fingerprint"
        found = stamp_file.read_text() if stamp_file.is_file() else None
        if found != self.stamp:
            log.warning("shards in %s are from other settings; starting afresh", self.folder)
            shutil.rmtree(self.folder)
            return
        for tmp in self.folder.glob(".*.tmp"):  # a write a kill interrupted
            tmp.unlink()

    def _adopt(self, part: Path) -> None:
        """Take a part job's shards as finished ones; a part made with other settings or
        inputs is an error, never merged."""
        stamp_file = part / "fingerprint"
        if not (stamp_file.is_file() and (part / PART_RECORD).is_file()):
            raise ReasonRLError(f"{part}: not a part folder (no fingerprint and {PART_RECORD})")
        if stamp_file.read_text() != self.stamp:
            raise ReasonRLError(f"{part}: part made with other settings or inputs than this stage")
        self.adopted.append(json.loads((part / PART_RECORD).read_text()))
        for path in sorted(part.glob("*.json")):
            if path.name == PART_RECORD:
                continue
            target = self.folder / path.name
            if not target.is_file():
                self._write_stamp()
                write_text(target, path.read_text(encoding="utf-8"))

    def _write_stamp(self) -> None:
        if not (self.folder / "fingerprint").is_file():
            write_text(self.folder / "fingerprint", self.stamp)

    def shard(self, key: str, make: Callable[[], Parts]) -> Parts:
        """Shard `key`'s parts (name -> rows): read when finished, else made and written.

        Either way the rows are those parsed back from the shard's JSON, so a made shard and a
        reread one are identical values.
        """
        path = self.folder / f"{key}.json"
        if path.is_file():
            self.reused += 1
            return json.loads(path.read_text(encoding="utf-8"))
        text = json.dumps(make(), ensure_ascii=False, sort_keys=True)
        self._write_stamp()
        write_text(path, text)
        self.made += 1
        return json.loads(text)

    def map(
        self,
        name: str,
        items: Sequence[T],
        size: int,
        make: Callable[[list[T], int], Parts],
    ) -> Parts:
        """Cut `items` into shards of `size`, `make(shard, index)` the missing ones, and gather
        each part's rows over the shards in order. A part job makes and gathers only its own
        shards."""
        gathered: Parts = {}
        for index, shard in enumerate(chunks(items, size)):
            if index % self.split.count != self.split.part:
                continue
            parts = self.shard(f"{name}-{index:05d}", lambda s=shard, i=index: make(s, i))
            for part, rows in parts.items():
                gathered.setdefault(part, []).extend(rows)
        return gathered

    def publish_part(self, scheduler: dict[str, str]) -> dict[str, Any]:
        """A part job's end: its shards, the fingerprint and a record of the job (which part,
        what it made, where the scheduler ran it) become its output folder."""
        self._write_stamp()  # a part with no shards of its own still names its settings
        record = {
            "part": self.split.part,
            "count": self.split.count,
            "made": self.made,
            "reused": self.reused,
            "scheduler": scheduler,
        }
        write_text(self.folder / PART_RECORD, json.dumps(record, sort_keys=True))
        if self.out.exists():
            shutil.rmtree(self.out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.folder.rename(self.out)
        log.info(
            "part %d/%d: shards: %d reused, %d made",
            self.split.part, self.split.count, self.reused, self.made,
        )  # fmt: skip
        return record

    def adopted_parts(self) -> dict[str, list[dict]]:
        """{"parts": the part jobs' records} for a gathering job's manifest, else nothing."""
        return {"parts": self.adopted} if self.adopted else {}

    def clear(self) -> None:
        """Drop the shards: call once the stage's outputs are all written."""
        log.info("shards: %d reused, %d made", self.reused, self.made)
        if self.folder.exists():
            shutil.rmtree(self.folder)
