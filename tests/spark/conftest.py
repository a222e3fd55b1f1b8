"""One local Spark session and one 2-node rockstate cluster (real processes) for the whole folder."""

import os
import sys

import pytest

from rockstate import LocalCluster

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402

from rockstate.spark import close_clients  # noqa: E402

PARTITIONS = 8


@pytest.fixture(scope="package")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (
        SparkSession.builder.master("local[2,3]")  # a failed task is retried (up to 3 attempts)
        .appName("rockstate-test-spark")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")  # many Arrow batches per task
        # a Python worker's connection back to the JVM (Spark's transformWithStateInPandas state server): 15 s by
        # default, which a loaded machine exceeds ("Python worker failed to connect back")
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    with LocalCluster(nodes=2, partitions=PARTITIONS, root=str(tmp_path_factory.mktemp("spark-cluster"))) as c:
        yield c
        close_clients()  # the driver's cached connection, before the nodes go


@pytest.fixture
def rs(cluster):
    with cluster.connect() as handle:
        yield handle
