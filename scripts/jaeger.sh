#!/usr/bin/env bash
# Builds Jaeger (v2: an OpenTelemetry Collector distribution with Jaeger's
# storage and query API) from the Go module proxy into a scratch module and
# caches the binary by version under bin/jaeger/ (ignored). Prints its path.
# The OpenTelemetry e2e test (e2e/tracing_test.go) exports the router's traces
# to it over OTLP and queries the stored spans through its HTTP API; it calls
# this when the binary is absent. A cold build takes minutes on 2 cores.
set -euo pipefail
ver="${JAEGER_VERSION:-v1.75.0}"
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${JAEGER_DIR:-$root/bin/jaeger}/jaeger-$ver"
if [ -x "$out" ]; then echo "$out"; exit 0; fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
printf 'module jaegerbuild\n\ngo 1.25\n' >go.mod
go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$ver" >&2
mkdir -p "$(dirname "$out")"
go build -o "$out.tmp" github.com/jaegertracing/jaeger/cmd/jaeger >&2
mv "$out.tmp" "$out"
echo "$out"
