"""A reward an untrained model's replies already differ on, so its advantages are not all zero."""

from __future__ import annotations


def e_share(prompt: str, completion: str, row: dict) -> float:
    """The share of the reply's characters that are the letter e."""
    return completion.count("e") / max(len(completion), 1)
