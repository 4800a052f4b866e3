#!/usr/bin/env bash
# Installs moetrain's dependencies (Debian packages, npm reference tools) idempotently, then
# configures and builds into build/. Safe to run again: installed packages are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

DEB_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libfmt-dev libpcre2-dev libutf8proc-dev
  libopenblas-dev libgtest-dev zlib1g-dev
  python3
  dict-freedict-eng-deu fortunes-min
)

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm: NodeSource's nodejs bundles npm and conflicts with Debian's npm package, so
# install them only when the commands are missing.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: Debian packages present"
fi

# npm reference tools for tokenizer and chat-template tests (tests/reference/node/package.json).
if [ -f tests/reference/node/package.json ]; then
  if [ ! -d tests/reference/node/node_modules ] || [ tests/reference/node/package.json -nt tests/reference/node/node_modules ]; then
    echo "setup: installing npm reference packages"
    (cd tests/reference/node && npm install --no-audit --no-fund --loglevel=error && touch node_modules)
  else
    echo "setup: npm reference packages present"
  fi
fi

BUILD_DIR=${MT_BUILD_DIR:-build}
CMAKE_ARGS=(-G Ninja -DCMAKE_BUILD_TYPE=${MT_BUILD_TYPE:-Release})
[ -n "${MT_CUDA:-}" ] && CMAKE_ARGS+=(-DMT_CUDA=${MT_CUDA})
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" "${CMAKE_ARGS[@]}"
fi
JOBS=${MT_JOBS:-$(nproc)}
cmake --build "$BUILD_DIR" -j "$JOBS"
echo "setup: built $ROOT/$BUILD_DIR/moetrain"
