"""ELF facts the gates and the build checks share, read as the dynamic loader reads them."""

from __future__ import annotations

from elftools.elf.elffile import ELFFile

ELF_MAGIC = b"\x7fELF"


class ElfReadError(ValueError):
    """A shared object's structure cannot be read (the message says what and why)."""


def dt_needed(elf: ELFFile) -> list[str]:
    """The shared libraries `elf` names in DT_NEEDED, from its PT_DYNAMIC segment (what the loader
    reads; section headers can be stripped or renamed). ElfReadError when the segment cannot be
    read."""
    try:
        return [
            tag.needed
            for segment in elf.iter_segments()
            if segment["p_type"] == "PT_DYNAMIC"
            for tag in segment.iter_tags("DT_NEEDED")
        ]
    except Exception as error:  # pyelftools raises whatever a malformed segment makes it hit
        raise ElfReadError(
            f"DT_NEEDED: expected a readable dynamic segment; got {error!r}"
        ) from None
