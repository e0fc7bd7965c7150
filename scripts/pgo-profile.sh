#!/usr/bin/env bash
# Regenerates default.pgo, the CPU profile `go build` uses for profile-guided
# optimisation of the infera binary (Go's -pgo=auto reads default.pgo beside
# the main package: every `go build .`, `make build`, the image's build).
#
# The profile is `infera serve`'s own CPU under the overhead script's load:
# wrk against round-robin, kv-aware (bytes tokenizer) and PD serves, unary and
# streamed chat, at 1 and 64 connections, behind zero-latency simulators; the
# cells' profiles merged into one. Regenerate it when the request path changes
# much (a stale profile only optimises less; it never changes behaviour):
#
#   bash scripts/pgo-profile.sh            # or: make pgo
#
# Settings (environment): DURATION=10s a cell, LEVELS="1 64", MODES="unary
# stream", TARGETS="infera infera-kv infera-pd", OUT=default.pgo.
# Needs what scripts/bench-overhead.sh needs (etcd, wrk, curl, jq) and go.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
LEVELS=${LEVELS:-"1 64"}
MODES=${MODES:-"unary stream"}
TARGETS=${TARGETS:-"infera infera-kv infera-pd"}
OUT=${OUT:-default.pgo}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log() { printf '[pgo-profile] %s\n' "$*" >&2; }

# The profiled binary is built without a profile, so that the profile shows
# the code as written, not as the last profile inlined it.
log "building $work/infera without PGO"
CGO_ENABLED=0 go build -trimpath -pgo=off -o "$work/infera" .

log "profiling $TARGETS ($MODES; connections $LEVELS; $DURATION a cell)"
PROFILE_DIR=$work/prof BIN=$work/infera NO_BUILD=1 CLIENTS=wrk REPEATS=1 \
  DURATION=$DURATION LEVELS=$LEVELS MODES=$MODES TARGETS=$TARGETS OUT=$work/report \
  bash scripts/bench-overhead.sh >"$work/bench.log" 2>&1 || {
  cat "$work/bench.log" >&2
  log "error: the overhead script failed"
  exit 1
}
shopt -s nullglob
profiles=("$work"/prof/*.pprof)
[[ ${#profiles[@]} -gt 0 ]] || { log "error: no profiles written"; exit 1; }
go tool pprof -proto "${profiles[@]}" >"$work/merged.pgo" 2>/dev/null
mv "$work/merged.pgo" "$OUT"
log "wrote $OUT from ${#profiles[@]} profiles ($(wc -c <"$OUT") bytes)"
