"""bincode 2 `config::standard()` primitives (spec §2.2).

Little-endian, variable-length integers, no header, no type tags: a struct is its fields back
to back. Writers always choose the shortest varint form so Python output is byte-identical
to the broker's; readers accept longer forms but refuse markers too wide for the target type.
"""

from __future__ import annotations

import struct
from typing import Callable, TypeVar

from danube_core.errors import PayloadDecodeError

T = TypeVar("T")

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

_MARKER_U16 = 0xFB
_MARKER_U32 = 0xFC
_MARKER_U64 = 0xFD
_MARKER_U128 = 0xFE
_SINGLE_BYTE_MAX = 250
_U64_MAX = (1 << 64) - 1

# marker -> (struct, value width in bits); the width decides which target types accept it.
_WIDE_FORMS = {
    _MARKER_U16: (_U16, 16),
    _MARKER_U32: (_U32, 32),
    _MARKER_U64: (_U64, 64),
}


def encode_varint(n: int) -> bytes:
    """Encode an unsigned integer (u16/u32/u64) as a bincode varint, shortest form."""
    if n < 0 or n > _U64_MAX:
        raise ValueError(f"varint value {n} is outside the u64 range 0..2^64-1")
    if n <= _SINGLE_BYTE_MAX:
        return bytes((n,))
    if n <= 0xFFFF:
        return b"\xfb" + _U16.pack(n)
    if n <= 0xFFFFFFFF:
        return b"\xfc" + _U32.pack(n)
    return b"\xfd" + _U64.pack(n)


class BincodeWriter:
    """Accumulates bincode-encoded values; `getvalue()` returns the bytes."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def varint(self, n: int) -> None:
        """u16/u32/u64/usize."""
        self._parts.append(encode_varint(n))

    def u8(self, n: int) -> None:
        """One raw byte (u8 is never a varint)."""
        if not 0 <= n <= 0xFF:
            raise ValueError(f"u8 value {n} is outside 0..255")
        self._parts.append(bytes((n,)))

    def bool(self, value: bool) -> None:
        self._parts.append(b"\x01" if value else b"\x00")

    def string(self, value: str) -> None:
        """String/PathBuf: varint byte length + UTF-8."""
        self.bytes_(value.encode("utf-8"))

    def bytes_(self, value: bytes | bytearray | memoryview) -> None:
        """Vec<u8>: varint length + raw bytes (bytes >= 251 are not expanded, spec §2.3)."""
        self._parts.append(encode_varint(len(value)))
        self._parts.append(bytes(value))

    def option(self, value: T | None, write_fn: Callable[[T], None]) -> None:
        """Option<T>: `00` for None, `01` + T for Some."""
        if value is None:
            self._parts.append(b"\x00")
        else:
            self._parts.append(b"\x01")
            write_fn(value)

    def string_map(self, mapping: dict[str, str]) -> None:
        """HashMap<String,String> in the dict's own order (the caller decides the order)."""
        self.varint(len(mapping))
        for key, value in mapping.items():
            self.string(key)
            self.string(value)

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


class BincodeReader:
    """Reads bincode values from `buf` starting at `pos`; `pos` advances as values are read.

    Every failure raises PayloadDecodeError naming the field and the byte position, so a
    corrupt payload can be located in its file.
    """

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0) -> None:
        self.buf = memoryview(buf).cast("B") if not isinstance(buf, bytes) else buf
        self.pos = pos

    def _fail(self, what: str, field: str, pos: int) -> PayloadDecodeError:
        label = f" ({field})" if field else ""
        return PayloadDecodeError(f"bincode decode failed at byte {pos}{label}: {what}")

    def _take(self, n: int, field: str) -> bytes | memoryview:
        start = self.pos
        end = start + n
        if end > len(self.buf):
            raise self._fail(
                f"need {n} bytes, only {len(self.buf) - start} left", field, start
            )
        self.pos = end
        return self.buf[start:end]

    def varint(self, max_bits: int = 64, field: str = "") -> int:
        """Read a varint for a target type of `max_bits` (16, 32 or 64)."""
        start = self.pos
        first = self._take(1, field)[0]
        if first <= _SINGLE_BYTE_MAX:
            return first
        form = _WIDE_FORMS.get(first)
        if form is None:
            kind = "u128 marker 0xfe" if first == _MARKER_U128 else f"invalid marker 0x{first:02x}"
            raise self._fail(f"{kind} for a u{max_bits}", field, start)
        codec, bits = form
        if bits > max_bits:
            raise self._fail(
                f"marker 0x{first:02x} (u{bits}) is too wide for a u{max_bits}", field, start
            )
        return codec.unpack(self._take(codec.size, field))[0]

    def u8(self, field: str = "") -> int:
        return self._take(1, field)[0]

    def bool(self, field: str = "") -> bool:
        start = self.pos
        value = self._take(1, field)[0]
        if value > 1:
            raise self._fail(f"invalid bool byte 0x{value:02x} (expected 00 or 01)", field, start)
        return value == 1

    def bytes_(self, field: str = "") -> bytes:
        length = self.varint(64, field)
        return bytes(self._take(length, field))

    def string(self, field: str = "") -> str:
        start = self.pos
        length = self.varint(64, field)
        data_pos = self.pos
        raw = self._take(length, field)
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._fail(
                f"invalid UTF-8 in string of {length} bytes starting at byte {data_pos}: {exc.reason}",
                field,
                start,
            ) from exc

    def option(self, read_fn: Callable[[], T], field: str = "") -> T | None:
        start = self.pos
        tag = self._take(1, field)[0]
        if tag == 0:
            return None
        if tag == 1:
            return read_fn()
        raise self._fail(f"invalid Option tag 0x{tag:02x} (expected 00 or 01)", field, start)

    def string_map(self, field: str = "") -> dict[str, str]:
        """HashMap<String,String>; the dict keeps the order found in the bytes."""
        count = self.varint(64, field)
        result: dict[str, str] = {}
        for _ in range(count):
            key = self.string(f"{field} key" if field else "map key")
            result[key] = self.string(f"{field}[{key!r}]" if field else f"map[{key!r}]")
        return result
