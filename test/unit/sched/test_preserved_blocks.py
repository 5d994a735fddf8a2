"""The admission pass's map of blocks held by preserved pauses: computed on first read, reused by
the walk until the pass changes the engine, and never answering with a value from after that."""

import pytest

from timelyllm_ros.core.sched.preserved_blocks import PreservedBlocks


def _map(held):
    asked = []

    def blocks_of(key):
        asked.append(key)
        return held[key]
    paused = {key: ("rid-" + key, "preserve") for key in held}
    return PreservedBlocks(paused, blocks_of), asked, paused


def test_reads_only_what_is_asked_and_each_once():
    blocks, asked, _ = _map({"a": 3, "b": 0, "c": 5})
    assert "c" in blocks and blocks["c"] == 5 and blocks.get("c") == 5
    assert asked == ["c"]
    assert "b" not in blocks and "x" not in blocks  # holds nothing / not paused
    with pytest.raises(KeyError):
        blocks["b"]
    assert blocks.current("c") == 5 and asked == ["c", "b"]
    # As a mapping it is the dict the pass used to build: only pauses that hold blocks.
    assert dict(blocks) == {"a": 3, "c": 5} and len(blocks) == 2 and bool(blocks)
    assert asked == ["c", "b", "a"]


def test_empty_when_no_pause_holds_blocks():
    blocks, _, _ = _map({"a": 0})
    assert not blocks and dict(blocks) == {}


def test_after_the_pass_changes_the_engine_the_walk_asks_again():
    held = {"a": 3, "b": 4}
    blocks, asked, paused = _map(held)
    assert blocks["a"] == 3
    blocks.seal()
    held["a"] = 0  # the engine revoked it while admitting another generation
    # The pass's value stays what the policy read; the walk gets the engine's answer now.
    assert blocks["a"] == 3
    assert blocks.current("a") == 0 and blocks.current("a") == 0
    del paused["b"]
    assert blocks.current("b") == 0
    assert asked == ["a", "a", "a"]


def test_a_value_not_read_before_the_engine_changed_is_refused():
    blocks, _, _ = _map({"a": 3, "b": 4})
    blocks.seal()
    with pytest.raises(RuntimeError, match="preserved_blocks\\['a'\\]: read .* in begin_pass"):
        blocks["a"]


def test_held_at_gives_the_candidates_positions_from_the_paused_ones():
    held = {"a": 3, "b": 0, "c": 5, "d": 7}
    asked = []

    def blocks_of(key):
        asked.append(key)
        return held[key]
    paused = {key: ("rid-" + key, "preserve") for key in held}
    # "d" is paused but not a candidate of this pass (not eligible yet): not in the answer.
    positions = {"a": 4, "b": 0, "c": 1}
    blocks = PreservedBlocks(paused, blocks_of, positions.get)
    assert blocks.held_at() == [(1, 5), (4, 3)]
    assert sorted(asked) == ["a", "b", "c", "d"]
    assert blocks["c"] == 5 and sorted(asked) == ["a", "b", "c", "d"]  # read once
    blocks.seal()
    with pytest.raises(RuntimeError, match="held_at: read it in begin_pass"):
        blocks.held_at()
    with pytest.raises(RuntimeError, match="without the candidates' positions"):
        PreservedBlocks(paused, blocks_of).held_at()
    assert PreservedBlocks.empty().held_at() == [] and not PreservedBlocks.empty()


def test_held_at_from_one_read_of_every_pause_gives_the_same_and_asks_no_key():
    held = {"a": 3, "b": 0, "c": 5, "d": 7}
    asked, bulk = [], []

    def blocks_of(key):
        asked.append(key)
        return held[key]

    def all_blocks():
        bulk.append(1)
        return {key: value for key, value in held.items() if value}
    paused = {key: ("rid-" + key, "preserve") for key in held}
    positions = {"a": 4, "b": 0, "c": 1}
    blocks = PreservedBlocks(paused, blocks_of, positions.get, all_blocks)
    assert blocks.held_at() == [(1, 5), (4, 3)] and bulk == [1] and asked == []
    # The walk then reads the pass's values without asking again; after a change, the engine.
    assert blocks["c"] == 5 and "b" not in blocks and blocks.current("d") == 7 and asked == []
    blocks.seal()
    held["c"] = 0
    assert blocks["c"] == 5 and blocks.current("c") == 0 and asked == ["c"]
    assert dict(blocks) == {"a": 3, "c": 5, "d": 7} and bulk == [1]
