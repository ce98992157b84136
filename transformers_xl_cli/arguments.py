"""argparse types shared by the subcommands: a bad value is refused with a message that says what was expected."""

import argparse
import math


def _number(kind, accept, expected: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


positive_int = _number(int, lambda value: value >= 1, "a positive integer")
non_negative_int = _number(int, lambda value: value >= 0, "a non-negative integer")
positive_float = _number(float, lambda value: 0 < value < math.inf, "a positive number")


def memory_lengths(text: str) -> list[int]:
    """`--memory-lengths 0,32,64`: distinct non-negative integers, comma-separated; returned in increasing order."""
    pieces = [piece.strip() for piece in text.split(",")]
    if not all(piece.isdigit() and piece.isascii() for piece in pieces):
        raise argparse.ArgumentTypeError(f"expected comma-separated non-negative integers (e.g. 0,64,128), got {text!r}")
    lengths = [int(piece) for piece in pieces]
    if len(set(lengths)) < len(lengths):
        raise argparse.ArgumentTypeError(f"expected distinct memory lengths, got {text!r}")
    return sorted(lengths)
