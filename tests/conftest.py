"""Suite-wide: the longest modules start first.

``make test`` runs the suite on two workers (``pytest -n 2 --dist loadfile``), each module on one
worker. A long module started last would leave the other worker idle at the end, so the known long
ones are queued first; every other module keeps its place. The Spark modules stay next to each other
so a worker starts its Spark session once.

fsspec runs its async filesystems (s3fs) on one event-loop thread per process, started by the first
one made and never stopped: it is started here, before any test, so that a leak check (``no_leaks``)
taken before it and checked after a test that made an S3 storage does not count it as that test's.

Spark's JVMs here (each Spark session's driver, the Spark Connect servers, and those of the processes a test starts)
JIT-compile with the first tier only: they run seconds, not hours, and the optimizing compiler was ~40 % of their
CPU (tests/spark/test_conformance.py alone: the driver's 58 -> 34 CPU seconds, 75 -> 69 s), on 2 cores that
make test keeps busy. bench/ runs Spark as it comes.
"""

import os

import fsspec.asyn

os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")  # read by bin/spark-submit when it starts a JVM

LONGEST_FIRST = (
    "tests/test_demo.py",
    "tests/chaos/",
    "tests/test_readme.py",
    "tests/zookeeper/test_coordinators.py",
    "tests/test_soak.py",
    "tests/spark/",
    "tests/test_keys_spark.py",
)


def _rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return next((i for i, prefix in enumerate(LONGEST_FIRST) if path.startswith(prefix)), len(LONGEST_FIRST))


def pytest_collection_modifyitems(items):
    items.sort(key=_rank)  # stable: the order within a rank is the collection order


def pytest_sessionstart(session):
    fsspec.asyn.get_loop()
