"""Reading a shared library's dynamic section and symbols (64-bit little-endian ELF), without
binutils."""
from __future__ import annotations

import struct
from pathlib import Path

_SHT_DYNSYM, _SHT_DYNAMIC = 11, 6

# opbridge's C ABI (opbridge/c_abi.h): what every library built on opbridge exports.
C_ABI = frozenset({"OpbridgeDescribeOps", "OpbridgeCheckCall", "OpbridgeRunHost", "OpbridgeDeclarationErrors",
                   "OpbridgeAbiLayout"})


def _sections(data: bytes) -> list[tuple]:
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "expected a 64-bit little-endian ELF"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, align, entsize)
    return [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]


def _string(data: bytes, at: int) -> str:
    return data[at:data.index(b"\0", at)].decode()


def needed(path: str | Path) -> list[str]:
    """The DT_NEEDED entries: the libraries the dynamic loader loads with this one."""
    data = Path(path).read_bytes()
    sections = _sections(data)
    out = []
    for _name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if sh_type != _SHT_DYNAMIC:
            continue
        strtab = sections[link][4]
        for off in range(offset, offset + size, entsize or 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == 0:
                break
            if tag == 1:
                out.append(_string(data, strtab + val))
    return out


def exported(path: str | Path) -> set[str]:
    """The symbols the library defines for other binaries: defined, global or weak, visible
    (what `nm -D --defined-only` lists, less hidden and local ones)."""
    data = Path(path).read_bytes()
    sections = _sections(data)
    out = set()
    for _name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if sh_type != _SHT_DYNSYM:
            continue
        strtab = sections[link][4]
        for off in range(offset, offset + size, entsize or 24):
            st_name, st_info, st_other, st_shndx = struct.unpack_from("<IBBH", data, off)
            if st_shndx == 0 or (st_info >> 4) not in (1, 2) or (st_other & 3) not in (0, 3):
                continue  # undefined, local, or hidden/internal
            out.add(_string(data, strtab + st_name))
    return out
