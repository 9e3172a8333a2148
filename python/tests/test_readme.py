"""The README's Python example runs as printed (its disk file moved to a temporary directory)."""

import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")


def test_readme_python_example(tmp_path, capsys):
    if not os.path.exists(README):
        pytest.skip("not run from a source checkout")
    text = open(README).read()
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1
    code = blocks[0].replace('"/tmp/kv.cache"', repr(str(tmp_path / "kv.cache")))
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "n_prefix=6" in out and "n_host=6" in out
