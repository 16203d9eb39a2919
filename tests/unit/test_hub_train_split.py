"""How ``hub train`` splits reviewed samples into a training and a held-out set."""

from __future__ import annotations

import hashlib
import itertools

from edgeagent.commands.hub.train import split_reviewed


def rows(count: int, start: int = 0) -> list[dict]:
    return [{"device_id": "cam-1", "sample_id": f"s{i:05d}"} for i in range(start, start + count)]


def ids(chosen: list[dict]) -> set[str]:
    return {r["sample_id"] for r in chosen}


def test_a_sample_keeps_its_side_as_more_are_reviewed() -> None:
    train, heldout = split_reviewed(rows(400), 20)
    more_train, more_heldout = split_reviewed(rows(800), 20)
    assert ids(heldout) <= ids(more_heldout) and ids(train) <= ids(more_train)
    assert 0.12 < len(more_heldout) / 800 < 0.28  # the hash spreads them as the share says


def test_the_split_does_not_depend_on_the_order_rows_arrive_in() -> None:
    forward = split_reviewed(rows(50), 20)
    backward = split_reviewed(rows(50)[::-1], 20)
    assert [ids(side) for side in forward] == [ids(side) for side in backward]


def hash_key(row: dict) -> int:
    """The documented split key, computed here independently of the code under test."""
    digest = hashlib.sha256(f"{row['device_id']}/{row['sample_id']}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 10_000


def test_twelve_samples_the_hash_puts_all_in_training_still_give_a_held_out_one() -> None:
    windows = [rows(12, start) for start in range(0, 6_000, 12)]
    all_training = [w for w in windows if min(map(hash_key, w)) >= 2_000][:3]
    assert all_training, "no window of 12 ids all over the line: search a wider range"
    for window in all_training:
        train, heldout = split_reviewed(window, 20)
        assert len(train) == 11 and len(heldout) == 1
        assert hash_key(heldout[0]) == min(map(hash_key, window))  # the nearest the line
        assert split_reviewed(window[::-1], 20)[1] == heldout  # the same one every run


def test_a_large_share_never_leaves_training_empty() -> None:
    train, heldout = split_reviewed(rows(3), 99.9)
    assert len(train) >= 1 and len(heldout) >= 1 and len(train) + len(heldout) == 3


def test_every_sample_is_on_exactly_one_side() -> None:
    for count, percent in itertools.product([0, 1, 2, 5, 37], [1.0, 20.0, 50.0, 99.0]):
        train, heldout = split_reviewed(rows(count), percent)
        assert sorted(ids(train) | ids(heldout)) == sorted(ids(rows(count)))
        assert not ids(train) & ids(heldout)
        if count >= 2:
            assert train and heldout
