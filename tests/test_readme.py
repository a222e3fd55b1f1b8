"""The README's Python examples run exactly as written."""

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2


def test_every_readme_example_runs(tmp_path):
    for i, block in enumerate(BLOCKS):
        script = tmp_path / f"example{i}.py"
        script.write_text(block)
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert result.returncode == 0, f"README example {i} failed:\n{block}\n{result.stderr[-3000:]}"
