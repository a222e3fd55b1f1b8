#!/usr/bin/env bash
# make spark-matrix: the Spark tests on every supported Spark line, each in its own venv (.venv-spark-X.Y) with that
# line's tested combination (constraints/spark-X.Y.txt), one line after another; a table line per version at the end.
# The tests: tests/spark (shapes, exactly-once through a node kill, the conformance suite on Spark >= 4.0, bulk load,
# the data source on Spark >= 4.0) with the real-cluster ones (a standalone master and two workers, and Spark
# Connect, in a second pytest run as make test runs them), and tests/test_keys_spark.py. SPARK_LINES="4.2 4.3" picks lines; PYTEST_ARGS adds pytest arguments.
# Exit status: 0 only if every line passed.
set -uo pipefail
cd "$(dirname "$0")/.."
LINES=${SPARK_LINES:-"3.5 4.0 4.1 4.2 4.3"}
LOGS=${SPARK_MATRIX_LOGS:-${TMPDIR:-/tmp}/rockstate-spark-matrix}
mkdir -p "$LOGS"
rows=()
status=0
for line in $LINES; do
  venv=.venv-spark-$line
  constraints=constraints/spark-$line.txt
  log=$LOGS/spark-$line.log
  [ -f "$constraints" ] || { echo "no $constraints: not a supported line" >&2; exit 2; }
  if [ ! -f "$venv/.installed" ] || [ "$constraints" -nt "$venv/.installed" ] || [ pyproject.toml -nt "$venv/.installed" ]; then
    echo "== Spark $line: installing into $venv ($constraints)"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    if "$venv/bin/pip" install -q -c "$constraints" -e '.[spark]' 'pytest>=8' 'pytest-timeout>=2.3' >"$LOGS/install-$line.log" 2>&1; then
      touch "$venv/.installed"
    else
      echo "   install failed: $LOGS/install-$line.log"; rows+=("$(printf '%-6s %-8s %-8s %-8s %-8s %-64s %6s  %s' "$line" - - - - "install failed" - FAIL)"); status=1; continue
    fi
  fi
  versions=$("$venv/bin/python" -c 'import pyspark, pandas, pyarrow, numpy; print(pyspark.__version__, pandas.__version__, pyarrow.__version__, numpy.__version__)')
  echo "== Spark $line ($versions): tests, log in $log"
  start=$(date +%s)
  # two runs, as make test does: the real-cluster tests start their own Spark (getOrCreate would hand them the
  # local session the other tests share)
  export PYSPARK_PYTHON=$PWD/$venv/bin/python SPARK_LOCAL_IP=127.0.0.1
  "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/spark tests/test_keys_spark.py ${PYTEST_ARGS:-} >"$log" 2>&1
  rc=$?
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -m spark_cluster tests/spark/test_spark_cluster.py ${PYTEST_ARGS:-} >>"$log" 2>&1
  rc2=$?
  took=$(( $(date +%s) - start ))
  summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$log" | sed -E 's/^=+ //; s/, [0-9]+ warnings?//; s/ in [0-9.]+s.*$//; s/ =+$//' | paste -sd+ | sed 's/+/ + /g')
  verdict=PASS; [ $rc -eq 0 ] && [ $rc2 -eq 0 ] || { verdict=FAIL; status=1; }
  read -r spark pandas arrow numpy <<<"$versions"
  rows+=("$(printf '%-6s %-8s %-8s %-8s %-8s %-64s %5ss  %s' "$line" "$spark" "$pandas" "$arrow" "$numpy" "${summary:-no summary, see log}" "$took" "$verdict")")
  echo "   ${rows[-1]}"
done
echo
printf '%-6s %-8s %-8s %-8s %-8s %-64s %6s  %s\n' line pyspark pandas pyarrow numpy tests time result
for row in "${rows[@]}"; do echo "$row"; done
exit $status
