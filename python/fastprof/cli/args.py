"""The CLI's argument types: what each numeric flag accepts, checked when the
command line is parsed. A bad value (letters, nan, inf, a negative count, a
number too big for what it feeds: 1e308 seconds overflow a thread join, a
20-digit rank a Rust ``u32``) is one line naming the flag and what it takes,
exit 2, before anything runs: never a traceback from deep inside, nor a
value that is silently taken (``--wait nan`` waited for nothing)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any, NoReturn

from fastprof._core import ConfigError
from fastprof.profiler.options import _BY_NAME as PROFILER
from fastprof.recording.options import BY_NAME, _parsed
from fastprof.storage.urls import check_location, check_store_url

__all__ = ["Parser", "integer", "location", "option", "plain", "seconds", "url"]


class Parser(argparse.ArgumentParser):
    """argparse's parser with its error as one line (argparse prints the
    usage first): the flag, what is wrong, where the help is. Exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def integer(lo: int, hi: int, what: str = "an integer") -> Callable[[str], int]:
    """An argparse type: a whole number from ``lo`` to ``hi``."""

    def parse(text: str) -> int:
        try:
            v = int(text.strip(), 10)
        except ValueError:
            v = None
        if v is None or not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {what} from {lo} to {hi}")
        return v

    return parse


def seconds(lo: float, hi: float, *, above: bool = False, what: str = "seconds") -> Callable[[str], float]:
    """An argparse type: a finite number of seconds from ``lo`` (excluded
    when ``above``) to ``hi``."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and (v > lo if above else v >= lo) and v <= hi):
            low = f"> {lo:g}" if above else f">= {lo:g}"
            raise argparse.ArgumentTypeError(f"{text!r}: expected {what} {low}, at most {hi:.0f}")
        return v

    return parse


def option(name: str) -> Callable[[str], Any]:
    """An argparse type for a flag that sets a recorder or Profiler option:
    the options table's own parse and check (the same rule as the option's
    ``FASTPROF_*`` variable), its own ``expected ...`` sentence."""
    opt = BY_NAME[name] if name in BY_NAME else PROFILER[name]

    def parse(text: str) -> Any:
        ok, v = _parsed(opt, text)
        if not ok:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {opt.expect}")
        return v

    return parse


def location(text: str) -> str:
    """An argparse type for a flag or argument that names a place (a local
    path or a storage URL): a URL that names no place (``s3://`` with no
    bucket, ``foo://x``: a scheme nobody serves) or a local path that is a
    URL with a slash lost (``s3:/b``) is refused as the command line is
    parsed, before anything is created or run."""
    try:
        check_location(text, "")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).strip()) from None
    return text


def url(text: str) -> str:
    """An argparse type for an argument that must be a storage URL."""
    try:
        return check_store_url(text, "")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).strip()) from None


_ROLE = re.compile(r"``(.+?)``", re.S)


def plain(text: str | None) -> str | None:
    """A module docstring as help text: without its reST markup (``x``)."""
    return None if text is None else _ROLE.sub(r"\1", text)
