"""The shard store: finished shards are reused, interrupted writes and stale shards are not,
and shards gather in order."""

import json
import os

from reasonrl.shards import ShardStore, chunks, shard_seed


def counting(calls: list):
    def make(part: list[int], index: int) -> dict[str, list]:
        calls.append(index)
        return {"squares": [x * x for x in part], "index": [index]}

    return make


def test_shards_gather_in_order_and_a_rerun_makes_only_missing_ones(tmp_path):
    calls: list[int] = []
    store = ShardStore(tmp_path / "out", "stamp")
    made = store.map("p", list(range(7)), 3, counting(calls))
    assert made == {"squares": [x * x for x in range(7)], "index": [0, 1, 2]}
    assert calls == [0, 1, 2]
    (store.folder / "p-00001.json").unlink()  # as if killed while making shard 1

    again = ShardStore(tmp_path / "out", "stamp")
    assert again.map("p", list(range(7)), 3, counting(calls)) == made
    assert calls == [0, 1, 2, 1]
    assert (again.reused, again.made) == (2, 1)


def test_a_half_written_shard_is_ignored_and_removed(tmp_path):
    store = ShardStore(tmp_path / "out", "stamp")
    store.map("p", [1, 2], 1, counting([]))
    (store.folder / "p-00001.json").unlink()
    partial = store.folder / ".p-00001.json.x1y2.tmp"
    partial.write_text('{"squares": [')  # what a kill mid-write leaves

    calls: list[int] = []
    made = ShardStore(tmp_path / "out", "stamp").map("p", [1, 2], 1, counting(calls))
    assert calls == [1] and made["squares"] == [1, 4]
    assert not partial.exists()


def test_shards_of_other_settings_are_discarded_not_merged(tmp_path):
    ShardStore(tmp_path / "out", "old settings").map("p", [1, 2, 3], 1, counting([]))
    calls: list[int] = []
    store = ShardStore(tmp_path / "out", "new settings")
    store.map("p", [1, 2, 3], 1, counting(calls))
    assert calls == [0, 1, 2] and store.reused == 0
    assert (store.folder / "fingerprint").read_text() == "new settings"


def test_a_shard_is_returned_as_read_back_from_disk(tmp_path):
    store = ShardStore(tmp_path / "out", "stamp")
    made = store.shard("one", lambda: {"rows": [{"pair": (1, 2)}]})
    assert made == {"rows": [{"pair": [1, 2]}]}  # the tuple a rerun would read as a list
    assert json.loads((store.folder / "one.json").read_text()) == made


def test_clear_removes_the_folder_and_a_store_without_shards_leaves_nothing(tmp_path):
    ShardStore(tmp_path / "out", "stamp")
    assert os.listdir(tmp_path) == []  # a stage that fails before its first shard
    store = ShardStore(tmp_path / "out", "stamp")
    store.map("p", [1], 1, counting([]))
    assert store.folder == tmp_path / ".out.shards" and store.folder.is_dir()
    store.clear()
    assert not store.folder.exists()
    assert os.listdir(tmp_path) == []


def test_shard_seeds_depend_only_on_seed_and_index():
    assert shard_seed(5, 0) == 5  # a one-shard run samples as an unsharded one did
    seeds = {shard_seed(5, i) for i in range(100)}
    assert len(seeds) == 100
    assert shard_seed(5, 3) - shard_seed(5, 2) > 7919 * 64  # beyond per-turn seed offsets


def test_chunks_cut_in_order():
    assert chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert chunks([], 3) == []
