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
