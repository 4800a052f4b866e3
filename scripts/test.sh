#!/usr/bin/env bash
# Sets up (scripts/setup.sh), builds, and runs every test: unit (CPU), backend (skips without a
# GPU), reference-fixture, tokenizer/template comparisons against the npm references, and e2e.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
BUILD_DIR=${MT_BUILD_DIR:-build}
mkdir -p out
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${MT_TEST_JOBS:-2}" --timeout 1800 \
  2>&1 | tee out/test.log
echo "test: log in $(pwd)/out/test.log"
