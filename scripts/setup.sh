#!/usr/bin/env bash
# Installs everything `make` needs on a fresh machine: Java (for Spark), Chromium and its driver
# (the status page's browser test), ZooKeeper (the control plane's store in tests), iproute2 and iptables (the
# network-partition tests), a venv, the package.
set -euo pipefail
VENV=${VENV:-.venv}
need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)  # run as a plain process by rockstate.local.zookeeper
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)  # network namespaces: rockstate.testing.netns
command -v iptables >/dev/null 2>&1 || need_apt+=(iptables)  # ...and the links it cuts
for pkg in "$@"; do command -v "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg"); done
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# make test's tested Spark combination. uv installs the same pins in 36 s on a fresh machine where pip took 89 (an eighth
# of make test on a clean clone); pip when uv cannot be had or cannot install them
if ! { "$VENV/bin/pip" install -q uv && "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" -c constraints/test.txt -e '.[dev]'; }; then
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -c constraints/test.txt -e '.[dev]'
fi
