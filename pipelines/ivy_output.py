"""Ivy's dependency resolution output on spark-submit's stderr, kept only when it matters.

`spark-submit --packages` resolves the jars with Ivy on every run and prints about 100 lines
(settings, each module found, the resolution report table), the same ones on every run once
the jars are cached. Spark writes them to `System.err` itself (`MavenUtils`' print stream,
Ivy's own message logger), not through log4j, so no logger level or Spark setting silences
them. `spark-submit.sh` therefore pipes Spark's stderr through this filter:

    spark-submit ... 2> >(python -m pipelines.ivy_output >&2)

It holds back Ivy's block, from its first line (`:: loading settings ::` or `Ivy Default
Cache set to:`) to its last (`N artifacts copied, M already retrieved`), and prints it only if
a jar was downloaded or something failed (`worth_showing`). A line that is not Ivy's inside
the block (the exception of a failed resolution) or the end of the stream releases the held
lines first, so nothing about a failure is lost. Every other line passes at once.
"""

from __future__ import annotations

import io
import re
import sys
from typing import Iterable, Iterator, TextIO

BLOCK_STARTS = (":: loading settings ::", "Ivy Default Cache set to:")
BLOCK_END = re.compile(r"^\s*\d+ artifacts copied, \d+ already retrieved")
# Lines Ivy or Spark's resolver prints between the start and the end of the block.
IVY_LINE = re.compile(
    r"^(::|\s|Ivy Default Cache set to:|The jars for the packages stored in:|downloading |You probably access )"
    r"|added as a (dependency|remote repository)"
)
# Words of a block that must be shown: a download, or a problem Ivy reports.
SHOWN_WHEN = re.compile(r"^downloading |FAILED|UNRESOLVED|NOT FOUND|ERROR|WARN")


def worth_showing(block: list[str]) -> bool:
    """Whether a complete Ivy block downloaded a jar or reports a problem."""
    return any(SHOWN_WHEN.search(line) for line in block)


def filter_lines(lines: Iterable[str]) -> Iterator[str]:
    """`lines` without the Ivy blocks that only found cached jars."""
    block: list[str] | None = None
    for line in lines:
        if block is None:
            if line.startswith(BLOCK_STARTS):
                block = [line]
            else:
                yield line
            continue
        if not IVY_LINE.search(line):
            yield from block  # resolution did not finish as usual: show all of it
            block = None
            yield line
            continue
        block.append(line)
        if BLOCK_END.match(line):
            if worth_showing(block):
                yield from block
            block = None
    if block is not None:
        yield from block


def main(source: TextIO = sys.stdin, sink: TextIO = sys.stdout) -> int:
    """Copy `source` to `sink` through `filter_lines`, a line at a time (Spark's output must
    appear as it happens, not when the buffer fills)."""
    for line in filter_lines(source):
        sink.write(line)
        sink.flush()
    return 0


if __name__ == "__main__":
    # Bytes that are not UTF-8 (a JVM with another default charset) pass through unchanged
    # instead of ending the filter, and with it everything Spark prints after them.
    for stream in (sys.stdin, sys.stdout):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="surrogateescape")
    sys.exit(main())
