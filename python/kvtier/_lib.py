"""Loads libkvtier through cffi's ABI mode (no compiler needed at install).

cffi releases the GIL around every call into the library, so threads of the
same process run Python while one of them waits in kvt_request_wait,
kvt_job_wait, kvt_drain or a blocking kvt_acquire.
"""

import glob
import os

import cffi

from ._cdef import CDEF

ffi = cffi.FFI()
ffi.cdef(CDEF)


def _find_library():
    # KVTIER_LIBRARY points at another build of the library (a sanitizer or
    # debug build); by default the copy carried in the wheel is used.
    env = os.environ.get("KVTIER_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for pattern in ("libkvtier.so.*", "libkvtier.so", "lib/libkvtier.so.*", "lib64/libkvtier.so.*"):
        found = sorted(glob.glob(os.path.join(here, pattern)), key=len)
        if found:
            return found[0]
    raise OSError(
        "kvtier: libkvtier.so is not in the package directory %s; reinstall the "
        "package or set KVTIER_LIBRARY to the library's path" % here
    )


LIBRARY_PATH = _find_library()
lib = ffi.dlopen(LIBRARY_PATH)
