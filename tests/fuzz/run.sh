#!/usr/bin/env bash
# Build every fuzz target and run each for a bounded time, failing on any crash.
#
#   tests/fuzz/run.sh SECONDS [TARGET...]
#
# Each target starts from its committed seeds (tests/fuzz/corpus/<target>) and its
# dictionary (tests/fuzz/dict/<target>.dict, where there is one). New inputs go to a
# scratch corpus, so the committed seeds stay as they are; a crash leaves its input
# in tests/fuzz/artifacts/<target>/ and is printed with the command that replays it.
# Needs the nightly toolchain and cargo-fuzz (tests/setup.sh installs both).
set -euo pipefail

seconds="${1:?usage: tests/fuzz/run.sh SECONDS [TARGET...]}"
shift
fuzz_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$fuzz_dir/../.."

# Cargo.lock must already say everything (CI builds --locked; cargo-fuzz has no such
# flag, so ask cargo directly).
cargo +nightly metadata --locked --format-version 1 \
    --manifest-path "$fuzz_dir/Cargo.toml" >/dev/null

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir "$fuzz_dir")
fi

cargo +nightly fuzz build --fuzz-dir "$fuzz_dir"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
failed=()
for target in "${targets[@]}"; do
    mkdir -p "$scratch/$target"
    args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
    if [ -f "$fuzz_dir/dict/$target.dict" ]; then
        args+=(-dict="$fuzz_dir/dict/$target.dict")
    fi
    echo "fuzz: $target for ${seconds}s"
    if ! cargo +nightly fuzz run --fuzz-dir "$fuzz_dir" "$target" \
        "$scratch/$target" "$fuzz_dir/corpus/$target" -- "${args[@]}" \
        >"$scratch/$target.log" 2>&1; then
        tail -n 60 "$scratch/$target.log"
        failed+=("$target")
    else
        grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' "$scratch/$target.log" \
            | sed "s/^/  $target /"
    fi
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: crashes in: ${failed[*]} (inputs in $fuzz_dir/artifacts/)" >&2
    exit 1
fi
echo "fuzz: ${#targets[@]} targets, no crash"
