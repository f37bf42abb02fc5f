"""Bits per byte and the target sums it is made of. (Over a whole validation pass against a hand
computation: tests/training/test_training_evaluate.py.)"""

import math

import pytest
import torch

from data.metrics import bits_per_byte, target_nats_and_bytes


def test_bits_per_byte_on_a_hand_computed_example():
    # 4 targets each predicted with probability 1/2 -> 4 ln 2 nats = 4 bits; over 8 bytes -> 0.5.
    assert bits_per_byte(4 * math.log(2), 8) == pytest.approx(0.5, abs=1e-12)
    assert bits_per_byte(0.0, 3) == 0.0
    with pytest.raises(ValueError, match="positive byte count"):
        bits_per_byte(1.0, 0)


# A chat reply is scored with charge_zero_byte: its <|end|> (a zero-byte id) costs nats, and the bytes
# are the text's. Text is scored without: end-of-text costs nothing.
@pytest.mark.parametrize("charge_zero_byte, charged", [(False, 0.0), (True, math.log(4))])
def test_target_sums_skip_ignored_targets_and_charge_zero_byte_ones_only_when_asked(charge_zero_byte, charged):
    token_bytes = torch.tensor([0, 1, 2, 3])  # id 0 is the end-of-text token
    logits = torch.zeros(1, 4, 4)  # uniform over 4 ids: every target costs ln 4 nats
    logits[0, 3] = torch.tensor([0.0, 0.0, math.log(3.0), 0.0])  # target 2 at p = 3/6 = 1/2
    targets = torch.tensor([[3, 0, -1, 2]])
    nats, nbytes = target_nats_and_bytes(logits, targets, token_bytes, charge_zero_byte=charge_zero_byte)
    # Scored: position 0 (id 3, 3 bytes, ln 4) and position 3 (id 2, 2 bytes, ln 2); position 1 is
    # EOT (0 bytes, ln 4 nats where charged) and position 2 is ignored (-1).
    assert nbytes.item() == 5 and nats.item() == pytest.approx(math.log(4) + math.log(2) + charged, abs=1e-6)
    assert bits_per_byte(nats.item(), nbytes.item()) == pytest.approx((3 + charged / math.log(2)) / 5, abs=1e-6)
