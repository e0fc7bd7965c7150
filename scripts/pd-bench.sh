#!/usr/bin/env bash
# PD vs mixed with the simulator's timing model (docs/performance.md):
#   scripts/pd-bench.sh [BIN]
# For each workload (long prompt / short output, short prompt / long
# output) it runs `infera bench` against `infera serve` with two simulated
# engines: two mixed workers, then one prefill + one decode worker
# (vllm-nixl, KV over transport TCP on loopback). It prints each report's
# summary and the decode's KV-transfer time per request.
set -euo pipefail
BIN=${1:-./infera}
BIN=$(realpath "$BIN")
REQUESTS=${REQUESTS:-100}
CONC=${CONC:-8}
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run() { # mode workload-name input-len output-len
  local mode=$1 name=$2 in=$3 out=$4
  local listen etcd
  listen=$(free_port) etcd=$(free_port)
  "$BIN" serve --listen "127.0.0.1:$listen" --embedded-etcd-listen "127.0.0.1:$etcd" \
    --embedded-etcd-dir "$tmp/etcd-$mode-$name" --log-level warn >"$tmp/serve.log" 2>&1 &
  pids+=($!)
  local roles=(mixed mixed)
  [ "$mode" = pd ] && roles=(prefill decode)
  local ports=()
  for r in "${roles[@]}"; do
    local port pd=()
    port=$(free_port)
    ports+=("$port")
    [ "$r" != mixed ] && pd=(--pd-role "$r" --pd-protocol vllm-nixl)
    "$BIN" worker --engine sim --etcd-endpoints "http://127.0.0.1:$etcd" --disaggregation-allow-tcp --log-level warn \
      -- --model sim-model --host 127.0.0.1 --port "$port" --max-model-len 16384 "${pd[@]}" >"$tmp/worker-$r-$port.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 100); do
    n=$(curl -s "http://127.0.0.1:$listen/v1/workers" | grep -o '"worker_id"' | wc -l || true)
    [ "$n" -ge 2 ] && break
    sleep 0.2
  done
  "$BIN" bench --url "http://127.0.0.1:$listen" --model sim-model --workload random --input-len "$in" --output-len "$out" \
    --concurrency "$CONC" --requests "$REQUESTS" --ignore-eos --progress=false --log-level warn \
    --json "$tmp/$mode-$name.json" --label "$mode-$name" >"$tmp/bench-$mode-$name.txt" 2>&1 || echo "bench failed"
  echo "== $mode $name (input $in words, output $out tokens, concurrency $CONC, $REQUESTS requests)"
  cat "$tmp/bench-$mode-$name.txt"
  if [ "$mode" = pd ]; then
    curl -s "http://127.0.0.1:${ports[1]}/metrics" | grep '^infera_sim_kv_transfer' || true
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}

run mixed long-prompt 500 8
run pd long-prompt 500 8
run mixed long-output 16 256
run pd long-output 16 256
