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
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

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


class ShardStore:
    """The finished shards of one output folder's stage, in `.NAME.shards` beside it."""

    def __init__(self, out_dir: str | Path, stamp: str):
        out = Path(out_dir)
        self.folder = out.parent / f".{out.name}.shards"
        self.stamp = stamp
        self.made = self.reused = 0
        self._open()

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
        if not (self.folder / "fingerprint").is_file():
            write_text(self.folder / "fingerprint", self.stamp)
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
        each part's rows over the shards in order."""
        gathered: Parts = {}
        for index, shard in enumerate(chunks(items, size)):
            parts = self.shard(f"{name}-{index:05d}", lambda s=shard, i=index: make(s, i))
            for part, rows in parts.items():
                gathered.setdefault(part, []).extend(rows)
        return gathered

    def clear(self) -> None:
        """Drop the shards: call once the stage's outputs are all written."""
        log.info("shards: %d reused, %d made", self.reused, self.made)
        if self.folder.exists():
            shutil.rmtree(self.folder)
