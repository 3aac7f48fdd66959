"""The broker's allocator settings take effect (glibc): large blocks come from the heap."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import ctypes, sys
    from hpbroker.broker.memory import tune_allocator

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    if sys.argv[1] == "tuned":
        assert tune_allocator()
    before = libc.mallinfo2().hblks
    block = libc.malloc(4 << 20)
    print(libc.mallinfo2().hblks - before)
    libc.free(block)
""")


@pytest.mark.parametrize(("mode", "mmapped_blocks"), [("default", "1"), ("tuned", "0")])
def test_a_4_mib_block_is_mmapped_only_without_the_broker_settings(mode, mmapped_blocks):
    result = subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == mmapped_blocks
