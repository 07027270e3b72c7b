"""Name prefixes that list a range of start offsets of Danube object ids.

Object ids are `data-<start>-<secs>.dnb1` with `start` unpadded (spec §4.2), so stores that
list names in byte order (S3, GCS) cannot list "every object from offset N on" with one
start-after key. They can list by name prefix, and every decimal number in a range shares one
of a few prefixes: a stream resuming near the head of a topic with a million objects lists the
few names near its offsets instead of the whole topic (issue 25's "long histories"). A prefix
also matches longer numbers (`12` lists 12345 and 1234567), so a range far below a topic's head
lists more than its own names; a range at the head, where streams resume, lists about its own.
"""

from __future__ import annotations

OBJECT_NAME_PREFIX = "data-"
# At most this many prefix listings for a range (one request each, or more pages); a range that
# needs more (numbers of many lengths, e.g. from offset 10 to 10^9) is listed whole, in pages.
MAX_PREFIXES = 64
PAGE_NAMES = 1000  # names in one page of an S3 listing


def start_offset_prefixes(first: int, last: int) -> list[str] | None:
    """Decimal prefixes that every start offset in `[first, last]` begins with, or None when
    the range needs more than `MAX_PREFIXES` of them (then listing everything is as cheap).

    The prefixes are the range's exact cover by decimal blocks, except that a block of at most
    `PAGE_NAMES` numbers at either end is listed whole: a listing returns the names in range,
    at most a page more at each end per number length, and the few shorter numbers sharing a
    prefix (the caller filters the names it gets by offset).
    """
    if first < 0 or last < first:
        raise ValueError(f"start offsets [{first}, {last}]: expected 0 <= first <= last")
    prefixes: list[str] = []
    for length in range(len(str(first)), len(str(last)) + 1):
        low = max(first, 10 ** (length - 1) if length > 1 else 0)
        high = min(last, 10 ** length - 1)
        prefixes += _cover(str(low), str(high))
        if len(prefixes) > MAX_PREFIXES or "" in prefixes:
            return None
    return prefixes


def _cover(low: str, high: str) -> list[str]:
    """Prefixes covering the numbers `[low, high]` of one length (`low <= high`)."""
    common = 0
    while common < len(low) and low[common] == high[common]:
        common += 1
    rest = len(low) - common
    if rest == 0:
        return [low]
    if 10 ** rest <= PAGE_NAMES or (low[common:] == "0" * rest and high[common:] == "9" * rest):
        return [low[:common]]
    head, lo_digit, hi_digit = low[:common], int(low[common]), int(high[common])
    below = _cover(low, head + str(lo_digit) + "9" * (rest - 1))
    middle = [head + str(d) for d in range(lo_digit + 1, hi_digit)]
    above = _cover(head + str(hi_digit) + "0" * (rest - 1), high)
    return below + middle + above
