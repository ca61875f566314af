#!/usr/bin/env bash
# The whole test suite: what CI runs (via .ci/run) and what a developer runs.
# It installs whatever the tests need on a fresh machine, then runs vet, the
# race-enabled tests, and a short pass of every fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME="${FUZZTIME:-10s}"

echo "== go vet"
go vet ./...

echo "== go test -race"
go test -race -count=1 -timeout 20m ./...

echo "== fuzz (${FUZZTIME} each)"
# Every Fuzz* target in the tree, run briefly: they also run their seed
# corpora as plain tests above.
grep -rl --include='*_test.go' '^func Fuzz' . | while read -r file; do
  pkg="./$(dirname "${file#./}")"
  grep -o '^func Fuzz[A-Za-z0-9_]*' "$file" | sed 's/^func //' | while read -r target; do
    echo "-- $pkg $target"
    go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" "$pkg"
  done
done

echo "== all tests passed"
