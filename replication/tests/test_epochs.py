from pathlib import Path

import pytest

from metaq.replication.epochs import Epoch, EpochHistory, divergence


def test_a_slave_that_follows_the_same_epochs_has_not_diverged() -> None:
    history = [Epoch(1, 0), Epoch(2, 300)]

    assert divergence(history, 350, history, 800) == 350


def test_an_old_masters_tail_past_the_new_epochs_start_is_cut() -> None:
    # The old master of epoch 1 wrote up to 500; the new master took over at 300.
    assert divergence([Epoch(1, 0)], 500, [Epoch(1, 0), Epoch(2, 300)], 800) == 300


def test_an_epoch_the_master_never_saw_is_cut_where_the_shared_epoch_ends() -> None:
    # We became master of epoch 2 at 200 and wrote to 400; the group's master went from
    # epoch 1 straight to 3 (our epoch 2 reached nobody), taking over at 250.
    mine = [Epoch(1, 0), Epoch(2, 200)]
    master = [Epoch(1, 0), Epoch(3, 250)]

    assert divergence(mine, 400, master, 900) == 200


def test_data_from_before_any_election_counts_as_epoch_zero() -> None:
    assert divergence([], 500, [Epoch(1, 300)], 800) == 300
    assert divergence([], 200, [Epoch(1, 300)], 800) == 200


def test_an_empty_log_never_diverges() -> None:
    assert divergence([], 0, [Epoch(4, 1000)], 2000) == 0


def test_history_survives_a_restart_and_refuses_going_backwards(tmp_path: Path) -> None:
    path = tmp_path / "epochs.json"
    history = EpochHistory(path)
    history.begin(1, 0)
    history.adopt([Epoch(1, 0), Epoch(2, 100), Epoch(3, 900)], end_offset=500)

    again = EpochHistory(path)

    assert again.entries == [Epoch(1, 0), Epoch(2, 100)]
    with pytest.raises(ValueError, match="must grow"):
        again.begin(1, 600)


def test_truncate_drops_epochs_left_without_data_and_trim_keeps_a_fresh_masters(
    tmp_path: Path,
) -> None:
    history = EpochHistory(tmp_path / "epochs.json", [Epoch(1, 0), Epoch(2, 100), Epoch(3, 400)])

    history.trim_to(400)
    assert history.entries[-1] == Epoch(3, 400)
    history.truncate(100)
    assert EpochHistory(tmp_path / "epochs.json").entries == [Epoch(1, 0)]


def test_an_unreadable_history_says_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "epochs.json"
    path.write_text("{not json")

    with pytest.raises(ValueError, match="delete it together with the broker's data"):
        EpochHistory(path)
