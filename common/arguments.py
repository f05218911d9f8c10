"""The scripts' command-line parser: argparse's, reading options before, after and between the
positional arguments, as argparse users expect of any command.

Two things plain argparse gets wrong: positionals after an option are taken only up to the first
option (`eval.py RUN1 --json RUN2` fails), which `parse_intermixed_args` fixes; and an option whose
values are optional or many (`heads.py --ablate [zero|mean]`, `--circuit [PROMPT ...]`, `prepare.py
--data-files F ...`) takes the positional after it as its value (`heads.py --ablate out/run`: "the
following arguments are required: out_dir"). Where a parse fails so, `ScriptParser` gives the last
such values back to the positionals, one at a time, and parses again: a command line that parsed
before parses the same, and one that failed because of the order now parses as its reader meant.
Where no order parses, the error is the first one, as argparse words it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

OPTIONAL_VALUES = ("?", "*", "+")  # the nargs of options that take a varying number of values


class _Failed(Exception):
    """A parse that failed, while another order may still parse."""


class ScriptParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose parse_args takes options in any order around the
    positionals."""

    _trying = False

    def error(self, message: str):
        if self._trying:
            raise _Failed(message)
        super().error(message)

    def parse_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        try:
            return self._parse(argv, namespace)
        except _Failed as first:
            for order in self._orders(argv):
                try:
                    return self._parse(order, namespace)
                except _Failed:
                    continue
            self.error(str(first))

    def _parse(self, argv: list[str], namespace) -> argparse.Namespace:
        self._trying = True
        try:
            return self.parse_intermixed_args(argv, namespace)
        finally:
            self._trying = False

    def _orders(self, argv: list[str]) -> Iterator[list[str]]:
        """`argv` with the last values of an option that takes a varying number of them given back
        to the positionals (the option and the values it keeps moved to the end), the last option
        first, one value more at a time."""
        takes = {
            s: a.nargs
            for a in self._actions
            if a.nargs in OPTIONAL_VALUES
            for s in a.option_strings
        }
        end = argv.index("--") if "--" in argv else len(argv)
        for i in reversed(range(end)):
            if argv[i] not in takes:
                continue
            k = i + 1
            while k < end and not argv[k].startswith("-") and (takes[argv[i]] != "?" or k == i + 1):
                k += 1
            values = argv[i + 1 : k]
            least = 1 if takes[argv[i]] == "+" else 0
            for kept in reversed(range(least, len(values))):
                yield [
                    *argv[:i],
                    *values[kept:],
                    *argv[k:end],
                    argv[i],
                    *values[:kept],
                    *argv[end:],
                ]
