#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60) and prints libFuzzer's summary lines.
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Findings, if any, are
# left in fuzz/artifacts/<target>/ with a command to reproduce them.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-60}
for target in pem_bundle secret shared_store seal_envelope; do
    mkdir -p "corpus/$target"
    echo "==> $target, ${seconds}s"
    cargo +nightly fuzz run "$target" "corpus/$target" -- -max_total_time="$seconds" \
        2>&1 | grep -E "^#[0-9]+ *DONE|^Done|ERROR|SUMMARY|panicked|stat::" || true
done
