"""The supported Spark range: importing the operator on another PySpark fails with a typed error naming it."""

import subprocess
import sys

import pytest

from rockstate.errors import RockstateError
from rockstate.spark import SPARK_VERSION, SUPPORTED_RANGE, UnsupportedSparkError
from rockstate.spark.version import check


@pytest.mark.parametrize("version", ["3.5.0", "3.5.9", "4.0.1", "4.1.4", "4.2.1", "4.3.0", "4.3.1.dev0"])
def test_supported_versions_pass(version):
    assert (3, 5) <= check(version) <= (4, 3)


@pytest.mark.parametrize("version", ["2.4.8", "3.4.4", "4.4.0", "5.0.0", "nonsense"])
def test_other_versions_are_refused_naming_the_range(version):
    with pytest.raises(UnsupportedSparkError) as caught:
        check(version)
    assert SUPPORTED_RANGE in str(caught.value) and isinstance(caught.value, (ImportError, RockstateError))


def test_importing_the_operator_on_an_unsupported_spark_fails_clearly():
    code = ("import pyspark; pyspark.__version__ = '3.4.4'\n"
            "try:\n    import rockstate.spark\n"
            "except ImportError as e:\n    print(type(e).__name__, '|', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith("UnsupportedSparkError |") and "3.5 through 4.3" in out and "3.4.4" in out, out


def test_the_installed_spark_is_supported():
    assert (3, 5) <= SPARK_VERSION <= (4, 3)
