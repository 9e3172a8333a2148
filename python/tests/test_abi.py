"""The cffi declarations match the C header: every struct's size and every
field's offset, compiled against the headers the package carries (needs a C
compiler; skipped without one)."""

import os
import shutil
import subprocess

import pytest

import kvtier
from kvtier._lib import ffi

STRUCTS = ["kvt_key", "kvt_config", "kvt_segment", "kvt_layout", "kvt_lookup_result", "kvt_model_desc",
           "kvt_link", "kvt_hw_desc", "kvt_plan", "kvt_acquire_info", "kvt_stats", "kvt_piece", "kvt_batch"]


def _include_dir():
    inc = os.path.join(os.path.dirname(kvtier.LIBRARY_PATH), "include")
    return inc if os.path.exists(os.path.join(inc, "kvtier", "kvtier.h")) else None


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_struct_layouts_match_the_header(tmp_path):
    inc = _include_dir()
    if inc is None:
        pytest.skip("the library at %s has no headers beside it" % kvtier.LIBRARY_PATH)
    lines = ["#include <kvtier/kvtier.h>", "#include <stddef.h>", "#include <stdio.h>", "int main(void) {"]
    expected = []
    for s in STRUCTS:
        lines.append('  printf("%%s %%zu\\n", "%s", sizeof(%s));' % (s, s))
        expected.append("%s %d" % (s, ffi.sizeof(s)))
        for name, field in ffi.typeof(s).fields:
            lines.append('  printf("%%s %%zu\\n", "%s.%s", offsetof(%s, %s));' % (s, name, s, name))
            expected.append("%s.%s %d" % (s, name, field.offset))
    lines += ["  return 0;", "}"]
    src, exe = tmp_path / "abi.c", tmp_path / "abi"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run(["cc", "-std=c11", "-I", inc, str(src), "-o", str(exe)], check=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")[:-1]
    assert got == expected


def _header_fields(inc):
    """{struct: [field, ...]} from the typedef'd structs of kvtier.h and cost.h."""
    import re
    out = {}
    for h in ("kvtier.h", "cost.h"):
        text = open(os.path.join(inc, "kvtier", h)).read()
        text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
        text = re.sub(r"//[^\n]*", "", text)
        for name, body in re.findall(r"typedef struct (\w+) \{(.*?)\} \1;", text, flags=re.S):
            fields = []
            for decl in body.split(";"):
                decl = re.sub(r"\[[^\]]*\]", "", decl).strip()
                if not decl:
                    continue
                parts = decl.split(",")
                fields.append(parts[0].split()[-1].lstrip("*"))
                fields += [p.strip().lstrip("*") for p in parts[1:]]
            out[name] = fields
    return out


def test_every_header_field_is_declared():
    inc = _include_dir()
    if inc is None:
        pytest.skip("the library at %s has no headers beside it" % kvtier.LIBRARY_PATH)
    header = _header_fields(inc)
    assert set(header) == set(STRUCTS)
    for s in STRUCTS:
        assert [name for name, _ in ffi.typeof(s).fields] == header[s], s


def test_every_function_and_error_code_is_bound():
    import re
    inc = _include_dir()
    if inc is None:
        pytest.skip("the library at %s has no headers beside it" % kvtier.LIBRARY_PATH)
    from kvtier._cdef import CDEF, ERRORS
    declared = set(re.findall(r"\b(kvt_\w+)\(", CDEF))
    for h in ("kvtier.h", "cost.h"):  # backend.h is the C backend interface, not bound
        text = open(os.path.join(inc, "kvtier", h)).read()
        for fn in re.findall(r"KVT_API [^;(]*?\b(kvt_\w+)\(", text):
            assert fn in declared, fn
            assert hasattr(kvtier.lib, fn), fn
    text = open(os.path.join(inc, "kvtier", "kvtier.h")).read()
    codes = dict(re.findall(r"XX\(KVT_(E\w+), (-\d+),", text))
    assert codes and {k: int(v) for k, v in codes.items()} == ERRORS
