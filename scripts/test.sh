#!/usr/bin/env bash
# The whole test suite: what CI runs (via .ci/run) and what a developer runs.
# It installs whatever the tests need on a fresh machine, then runs vet, the
# race-enabled tests, and a short pass of every fuzz target, and ends with
# one summary line: "tests: N passed, N failed, N skipped".
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME="${FUZZTIME:-10s}"
# The full output of go test (and of a failing fuzz target): kept when the
# run fails, its path printed; removed after a passing run.
log="$(mktemp "${TMPDIR:-/tmp}/mcpgate-test.XXXXXX")"
log_shown=""
work="$(mktemp -d)"
pgdir=""
cleanup() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ -s "$log" ]; then
    [ -n "$log_shown" ] || echo "full log: $log"
  else
    rm -f "$log"
  fi
  rm -rf "$work"
  if [ -n "$pgdir" ]; then stop_postgres; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM # so that cleanup runs on Ctrl-C and kill too

echo "== npm ci (testdata/npm: the MCP TypeScript SDK client and server-everything used by internal/e2e and internal/hub)"
if { ! command -v node || ! command -v npm; } >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "-- installing Node.js and npm from Debian's packages"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "error: node and npm (Node.js 20 or later) are required: internal/e2e runs the official MCP" >&2
  echo "TypeScript SDK and @modelcontextprotocol/server-everything, installed from testdata/npm/package-lock.json" >&2
  exit 1
fi
npm ci --prefix testdata/npm --no-audit --no-fund --loglevel=error

echo "== mosquitto (internal/gateway's external-broker tests run a real one)"
if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "-- installing mosquitto from Debian's packages"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto >/dev/null
  # The tests start their own on free ports; a system broker left on 1883
  # would keep `mcpgate serve`'s embedded one from starting.
  { systemctl disable --now mosquitto || service mosquitto stop; } >/dev/null 2>&1 || true
fi
# No skip when it is missing: the tests fail and say how to install it.

echo "== chromium (internal/console drives the web console in a real, headless browser)"
# Debian's package, never a browser downloaded at test time. The tests look
# for chromium, chromium-browser or google-chrome on PATH, or the binary
# named by MCPGATE_TEST_CHROMIUM; they skip without one, and fail under CI.
if [ -z "${MCPGATE_TEST_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 &&
  ! command -v google-chrome >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "-- installing chromium from Debian's packages"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if [ -z "${MCPGATE_TEST_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 &&
  ! command -v google-chrome >/dev/null 2>&1; then
  if [ -n "${CI:-}" ]; then
    echo "error: CI is set and no Chromium was found on PATH (chromium, chromium-browser, google-chrome), nor could it be" >&2
    echo "installed (that needs root and apt-get). Install it (apt-get install chromium) or set MCPGATE_TEST_CHROMIUM." >&2
    exit 1
  fi
  echo "warning: Chromium not found (apt-get install chromium); the console's browser tests will skip" >&2
fi
# Their screenshots of every page: internal/console/testdata/screenshots/
# (ignored by git; CI keeps it as an artefact), or $MCPGATE_SCREENSHOTS.

echo "== postgresql (internal/store runs its conformance suite against a throwaway server)"
# Debian's server binaries live in /usr/lib/postgresql/<version>/bin, off
# PATH; take the newest installed.
find_pgbin() {
  pgbin=""
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V); do
    [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ] && pgbin="$d"
  done
  if [ -z "$pgbin" ] && command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
    pgbin="$(dirname "$(command -v pg_ctl)")"
  fi
}
# PostgreSQL refuses to run as root: as root, run it as the postgres user.
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
stop_postgres() {
  if [ -n "$pgdir" ] && [ -d "$pgdir" ]; then
    as_pg "$pgbin/pg_ctl" -D "$pgdir/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$pgdir"
  fi
  pgdir=""
}
find_pgbin
if [ -z "$pgbin" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "-- installing PostgreSQL from Debian's packages"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  # The package creates and starts a system cluster on 5432; the tests use
  # their own below.
  { systemctl disable --now postgresql || service postgresql stop; } >/dev/null 2>&1 || true
  find_pgbin
fi
if [ -z "$pgbin" ]; then
  if [ -n "${MCPGATE_TEST_POSTGRES:-}" ]; then
    echo "-- PostgreSQL server binaries not found; the store tests use MCPGATE_TEST_POSTGRES as set"
  elif [ -n "${CI:-}" ]; then
    # CI must not pass by skipping (storetest.RequirePostgres fails each
    # test there too, but only after the whole run): stop now, saying why.
    echo "error: CI is set and no PostgreSQL server binaries (initdb, pg_ctl, postgres) were found under" >&2
    echo "/usr/lib/postgresql/*/bin or on PATH, nor could they be installed (that needs root and apt-get)." >&2
    echo "Install them (apt-get install postgresql), or set MCPGATE_TEST_POSTGRES to a server's DSN." >&2
    exit 1
  else
    echo "warning: PostgreSQL server binaries not found (apt-get install postgresql); its store tests will skip" >&2
  fi
else
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --user-group --no-create-home --shell /usr/sbin/nologin postgres
  fi
  # As root, under /tmp: the postgres user must reach it, and may not
  # reach root's own TMPDIR.
  if [ "$(id -u)" = 0 ]; then pgdir="$(mktemp -d /tmp/mcpgate-pg.XXXXXX)"; else pgdir="$(mktemp -d "${TMPDIR:-/tmp}/mcpgate-pg.XXXXXX")"; fi
  [ "$(id -u)" = 0 ] && chown postgres: "$pgdir"
  as_pg "$pgbin/initdb" -D "$pgdir/data" -U postgres --auth=trust --encoding=UTF8 --no-locale --no-sync >"$pgdir/initdb.log" 2>&1 ||
    { cat "$pgdir/initdb.log" >&2; echo "error: initdb failed" >&2; exit 1; }
  # A free port: try random ones until the server starts on one.
  pgport=""
  for attempt in $(seq 1 20); do
    port=$((20000 + RANDOM % 40000))
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then continue; fi # taken
    if as_pg "$pgbin/pg_ctl" -D "$pgdir/data" -l "$pgdir/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $port -k $pgdir -c max_connections=300" start >/dev/null 2>&1; then
      pgport="$port"
      break
    fi
  done
  if [ -z "$pgport" ]; then
    cat "$pgdir/server.log" >&2 || true
    echo "error: could not start PostgreSQL" >&2
    exit 1
  fi
  as_pg "$pgbin/psql" -q -h 127.0.0.1 -p "$pgport" -U postgres -d postgres -c "CREATE DATABASE mcpgate_test" >/dev/null
  export MCPGATE_TEST_POSTGRES="postgres://postgres@127.0.0.1:$pgport/mcpgate_test?sslmode=disable"
  echo "-- PostgreSQL $("$pgbin/postgres" --version | awk '{print $3}') on 127.0.0.1:$pgport (data in $pgdir, removed at exit)"
fi

echo "== gofmt, go vet"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" $unformatted
  exit 1
fi
go vet ./...

echo "== cross-build mcpgate-device (static, for the boards it runs on)"
for target in linux/amd64 linux/arm64 linux/arm/7; do
  IFS=/ read -r goos goarch goarm <<<"$target"
  echo "-- $target"
  CGO_ENABLED=0 GOOS="$goos" GOARCH="$goarch" GOARM="${goarm:-}" \
    go build -trimpath -o "$work/mcpgate-device-$goos-$goarch${goarm:+v$goarm}" ./cmd/mcpgate-device
done

echo "== go test -race"
# go test -json tells each test's output apart even when parallel tests
# interleave; scripts/testsummary prints each package's result line and the
# whole output of every failed test (every line from "=== RUN" to
# "--- FAIL", its failed subtests', panics and race reports), and writes
# everything, as go test -v would, to $log. The tests never take a fixed
# port: they run beside a gateway serving on this machine.
go build -o "$work/testsummary" ./scripts/testsummary
set +e
go test -race -count=1 -json -timeout 25m ./... 2>&1 | "$work/testsummary" -log "$log" -counts "$work/counts"
statuses=("${PIPESTATUS[@]}")
set -e
status="${statuses[0]}"
[ "$status" -ne 0 ] || status="${statuses[1]}" # the summary itself failed
read -r passed failed skipped <"$work/counts" || { passed=0 failed=0 skipped=0; }
if [ "$status" -ne 0 ]; then
  [ "$failed" -gt 0 ] || failed=1
  log_shown=1
  echo "full log: $log"
  echo "tests: $passed passed, $failed failed, $skipped skipped"
  exit "$status"
fi

echo "== fuzz (${FUZZTIME} each)"
# Every Fuzz* target in the tree, run briefly; their seed corpora already ran above.
grep -rl --include='*_test.go' '^func Fuzz' . | sort | while read -r file; do
  pkg="./$(dirname "${file#./}")"
  grep -o '^func Fuzz[A-Za-z0-9_]*' "$file" | sed 's/^func //' | while read -r target; do
    echo "-- $pkg $target"
    ok=0
    for attempt in 1 2 3; do
      if go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" "$pkg" >"$work/fuzz.log" 2>&1; then ok=1; break; fi
      # Go's fuzzer sometimes reports its own deadline, under load, as a
      # failure without any failing input (twice in a row seen here); a real
      # failure writes its input under testdata/fuzz and is never retried.
      if grep -q 'Failing input written' "$work/fuzz.log" || ! grep -q 'context deadline exceeded' "$work/fuzz.log"; then break; fi
      [ "$attempt" = 3 ] || echo "   (fuzzer hit its own deadline without a failing input; running it again)"
    done
    [ "$ok" = 1 ] || { cat "$work/fuzz.log" | tee -a "$log"; exit 1; }
    tail -n 1 "$work/fuzz.log"
  done
done
echo "tests: $passed passed, $failed failed, $skipped skipped"
