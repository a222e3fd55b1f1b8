"""The README's Python examples run exactly as written."""

import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_example_runs(tmp_path, i):
    script = tmp_path / f"example{i}.py"
    script.write_text(BLOCKS[i])
    # the timeout only catches a hang: a Spark example takes ~15 s alone, several times that on a busy machine
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert result.returncode == 0, f"README example {i} failed:\n{BLOCKS[i]}\n{result.stderr[-3000:]}"
