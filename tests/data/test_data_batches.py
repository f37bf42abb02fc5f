import numpy as np
import pytest
import torch

from common.errors import DataError
from data.batches.text import EpochBatches, TrainBatches, iter_val_batches, train_batches
from data.prepared.token_files import token_dtype


@pytest.fixture
def tokens(tmp_path) -> np.memmap:
    """A memory-mapped uint16 token file whose value at i is i % 50000: windows are checkable."""
    path = tmp_path / "train.bin"
    (np.arange(10_000) % 50_000).astype(np.uint16).tofile(path)
    return np.memmap(path, dtype=np.uint16, mode="r")


@pytest.mark.parametrize("sampling, sampler", [("random", TrainBatches), ("epoch", EpochBatches)])
def test_the_named_sampler_gives_shapes_dtypes_and_targets_shifted_by_one(tokens, sampling, sampler):
    made = train_batches(sampling, tokens, 16, 4, seed=2, rank=1, world_size=2)
    direct = sampler(tokens, 16, 4, seed=2, rank=1, world_size=2)
    assert type(made) is sampler and torch.equal(made.next()[0], direct.next()[0])
    x, y = sampler(tokens, block_size=16, batch_size=4, seed=0).next()
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    assert x.is_contiguous() and y.is_contiguous()
    # Each row is a real window of the token array, y being x moved on by one token.
    starts = x[:, 0]
    assert torch.equal(x, starts[:, None] + torch.arange(16)) and torch.equal(y, starts[:, None] + torch.arange(1, 17))


def test_windows_reach_both_ends_and_never_run_past_the_end(tokens):
    short = tokens[:40]
    batches = TrainBatches(short, block_size=30, batch_size=64, seed=1)
    starts = torch.cat([batches.next()[0][:, 0] for _ in range(20)])
    assert starts.min() == 0 and starts.max() == len(short) - 31


def test_same_seed_same_batches_and_different_seeds_or_ranks_differ(tokens):
    def draw(seed, rank):
        b = TrainBatches(tokens, 8, 4, seed=seed, rank=rank)
        return torch.cat([b.next()[0] for _ in range(3)])

    assert torch.equal(draw(1, 0), draw(1, 0))
    assert not torch.equal(draw(1, 0), draw(2, 0))
    assert len({tuple(draw(1, rank)[:, 0].tolist()) for rank in range(4)}) == 4  # each rank its own


def test_state_dict_restores_the_exact_stream(tokens):
    batches = TrainBatches(tokens, 8, 4, seed=3, rank=1)
    batches.next()
    state = batches.state_dict()
    assert set(state) == {"generator_state"} and state["generator_state"].dtype == torch.uint8
    expected = [batches.next()[0] for _ in range(3)]
    # A fresh object (e.g. after restart) with the saved state continues identically.
    resumed = TrainBatches(tokens, 8, 4, seed=999, rank=0)
    resumed.load_state_dict({k: v.clone() for k, v in state.items()})
    assert all(torch.equal(a, resumed.next()[0]) for a in expected)


def epoch_starts(batches: EpochBatches, draws: int) -> list[np.ndarray]:
    return [batches.next()[0][:, 0].numpy() for _ in range(draws)]


def test_epoch_sampling_visits_every_window_of_a_shifted_grid_once(tokens):
    batches = EpochBatches(tokens, block_size=16, batch_size=8, seed=0)
    per_epoch = []
    for _ in range(3):
        first = batches.next()[0][:, 0].numpy()  # moves on to the next epoch if one ended
        epoch, draws = batches.epoch, len(batches._order) // 8
        starts = np.concatenate([first] + [batches.next()[0][:, 0].numpy() for _ in range(draws - 1)])
        assert batches.epoch == epoch
        offset = int(starts.min()) % 16
        # Distinct windows on one grid, spaced a block apart, all inside the array.
        assert len(set(starts.tolist())) == len(starts)
        assert np.all(starts % 16 == offset) and starts.max() + 16 <= len(tokens) - 1
        # All of that epoch's windows but the few (< one batch) left at its end.
        assert (len(tokens) - 1 - offset) // 16 - len(starts) < 8
        assert not np.all(np.diff(starts) > 0)  # shuffled, not in order
        per_epoch.append((offset, starts))
    # Each epoch moves the grid (seed 0 happens to give three different offsets).
    assert len({offset for offset, _ in per_epoch}) == 3


def test_epoch_sampling_splits_each_draw_between_ranks(tokens):
    single = EpochBatches(tokens, 8, 6, seed=5)
    ranks = [EpochBatches(tokens, 8, 2, seed=5, rank=r, world_size=3) for r in range(3)]
    # Three ranks of 2 together draw exactly what one process drawing 6 at a time draws,
    # across the epoch boundary too.
    for _ in range(len(single._order) // 6 + 5):
        together = np.concatenate([r.next()[0][:, 0].numpy() for r in ranks])
        assert np.array_equal(together, single.next()[0][:, 0].numpy())
    assert single.epoch == 1 and all(r.epoch == 1 for r in ranks)


def test_epoch_sampling_state_restores_the_exact_stream(tokens):
    batches = EpochBatches(tokens, 16, 8, seed=3)
    epoch_starts(batches, 100)  # into the second epoch (78 draws each)
    state = batches.state_dict()
    assert state["epoch"] == 1
    expected = epoch_starts(batches, 80)  # and on into the third
    resumed = EpochBatches(tokens, 16, 8, seed=3)
    resumed.load_state_dict(dict(state))
    assert all(np.array_equal(a, b) for a, b in zip(expected, epoch_starts(resumed, 80)))
    other_seed = EpochBatches(tokens, 16, 8, seed=4)
    assert not np.array_equal(epoch_starts(other_seed, 1)[0], epoch_starts(EpochBatches(tokens, 16, 8, seed=3), 1)[0])


@pytest.mark.parametrize("make, error, fragment", [
    (lambda t: EpochBatches(t[:100], block_size=16, batch_size=8, seed=0), DataError, "train.sampling=random"),
    (lambda t: TrainBatches(t[:16], block_size=16, batch_size=2, seed=0), DataError, "fewer than one block"),
    (lambda t: next(iter_val_batches(t[:10], block_size=16, batch_size=2)), DataError, "validation split has 10 tokens"),
    (lambda t: EpochBatches(t, 16, 8, seed=0, rank=2, world_size=2), ValueError, "rank"),
    (lambda t: train_batches("sequential", t, 16, 4, seed=0), ValueError, "sampling"),
], ids=["epoch-under-one-batch", "under-one-block", "validation-under-one-block", "rank-past-world", "no-such-sampler"])
def test_too_few_tokens_or_a_bad_sampler_is_refused(tokens, make, error, fragment):
    with pytest.raises(error, match=fragment):
        make(tokens)


def test_one_batch_of_windows_and_one_block_and_a_token_are_enough(tokens):
    EpochBatches(tokens[:200], block_size=16, batch_size=8, seed=0).next()
    TrainBatches(tokens[:17], block_size=16, batch_size=2, seed=0).next()


def test_full_validation_pass_covers_every_window_once(tokens):
    block = 64
    batches = list(iter_val_batches(tokens, block, batch_size=7))
    x, y = (torch.cat([b[i] for b in batches]) for i in (0, 1))
    n_windows = (len(tokens) - 1) // block
    assert x.shape == (n_windows, block)
    assert [len(b[0]) for b in batches[:-1]] == [7] * (len(batches) - 1)
    # Non-overlapping and in order: every target position 1 .. n_windows*block exactly once.
    assert torch.equal(y.flatten(), torch.arange(1, n_windows * block + 1))
    again = torch.cat([b[0] for b in iter_val_batches(tokens, block, batch_size=7)])
    assert torch.equal(x, again)


def test_validation_subset_is_fixed_and_spread_over_the_array(tokens):
    subset = list(iter_val_batches(tokens, 64, batch_size=4, max_batches=3))
    assert len(subset) == 3 and all(b[0].shape == (4, 64) for b in subset)
    starts = torch.cat([b[0][:, 0] for b in subset])
    assert len(set(starts.tolist())) == 12
    assert starts.min() == 0 and starts.max() > len(tokens) * 0.9  # first and last windows
    assert all(s % 64 == 0 for s in starts.tolist())  # the same windows as the full pass
    again = torch.cat([b[0][:, 0] for b in iter_val_batches(tokens, 64, batch_size=4, max_batches=3)])
    assert torch.equal(starts, again)
    # Asking for more than there is gives the full pass.
    many = list(iter_val_batches(tokens[:300], 64, batch_size=4, max_batches=100))
    assert sum(len(b[0]) for b in many) == (300 - 1) // 64


def test_token_dtype_widens_only_when_ids_do_not_fit():
    assert (token_dtype(65_536), token_dtype(65_537)) == (np.uint16, np.uint32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_arrive_on_the_device(tokens):
    x, y = TrainBatches(tokens, 16, 4, seed=0, device="cuda").next()
    assert x.is_cuda and y.is_cuda
    cpu_x, _ = TrainBatches(tokens, 16, 4, seed=0).next()
    assert torch.equal(x.cpu(), cpu_x)
    vx, _ = next(iter_val_batches(tokens, 16, 4, device="cuda"))
    assert vx.is_cuda
