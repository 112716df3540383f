#!/usr/bin/env bash
# The Debian packages the test suite needs, installed when missing: `make test` runs this first, so a fresh
# machine's `make test` runs every test instead of failing those whose package is absent.
#   spuco-fashion reads Fashion-MNIST (dataset-fashion-mnist); text-shift reads WordNet and GCIDE (wordnet-base,
#   dict-gcide); spoken-digits synthesises speech with espeak-ng; the MLflow UI test drives chromium; the
#   head-restart test keeps the GCS's tables in redis-server.
# A package already installed is left alone: nothing is updated or installed when none is missing. Through sudo
# when not root. `scripts/system-packages.sh --list` prints the names (tests/helpers/system_packages.py reads them).
set -euo pipefail
PACKAGES=(dataset-fashion-mnist wordnet-base dict-gcide espeak-ng chromium redis-server)

if [ "${1:-}" = "--list" ]; then
  printf '%s\n' "${PACKAGES[@]}"
  exit 0
fi
if ! command -v dpkg > /dev/null || ! command -v apt-get > /dev/null; then
  echo "system-packages.sh: not a Debian system (no dpkg/apt-get): install ${PACKAGES[*]} yourself; the tests" \
       "that need one fail naming it" >&2
  exit 0
fi
MISSING=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2> /dev/null | grep -q 'install ok installed' || MISSING+=("$package")
done
if [ ${#MISSING[@]} -eq 0 ]; then
  echo "system-packages.sh: the tests' Debian packages are installed (${PACKAGES[*]})"
  exit 0
fi
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo > /dev/null || { echo "system-packages.sh: ${MISSING[*]} missing, and not root without sudo:" \
                                        "run apt-get install ${MISSING[*]} as root" >&2; exit 1; }
  SUDO=(sudo)
fi
echo "system-packages.sh: installing the tests' missing Debian packages: ${SUDO[*]} apt-get install ${MISSING[*]}"
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${MISSING[@]}"
