#!/usr/bin/env bash
# Starts a local Infera fleet in the foreground: `infera serve` with its embedded
# etcd and two `infera worker --engine sim` (each launching `infera sim`).
# Ctrl-C stops every process it started. Ports: INFERA_RUN_PORT (8000) for the
# API, INFERA_RUN_ETCD_PORT (2379) for the embedded etcd.
# INFERA_RUN_NATS=1 (make run-nats) also starts nats-server with JetStream on
# INFERA_RUN_NATS_PORT (4222) and carries the KV events and the requests over
# NATS (kv-aware), as Infera's production fleets do.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${INFERA_BIN:-bin/infera}
port=${INFERA_RUN_PORT:-8000}
etcd_port=${INFERA_RUN_ETCD_PORT:-2379}
workers=${INFERA_RUN_WORKERS:-2}
model=${INFERA_RUN_MODEL:-sim-model}
state=${INFERA_RUN_STATE:-.run}
nats=${INFERA_RUN_NATS:-}
nats_port=${INFERA_RUN_NATS_PORT:-4222}
rm -rf "$state/etcd" "$state/nats"
mkdir -p "$state"

# Each child in its own process group: a terminal's Ctrl-C reaches only this
# script, which then stops them in order (a shared group would signal the
# server, holding the embedded etcd, together with the workers).
set -m

server=
natsd=
workers_pids=()
# A second Ctrl-C (or TERM) while the fleet stops in order kills what is left
# at once, rather than ending this script and leaving the server running.
force() {
  trap - INT TERM EXIT
  echo "stopping the local fleet at once..." >&2
  for pid in "${workers_pids[@]}" $server $natsd; do kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true; done
  exit 130
}
stop() {
  trap force INT TERM
  trap - EXIT
  echo "stopping the local fleet (Ctrl-C again: at once)..." >&2
  # Workers first, so they drain and deregister while the server (and its
  # embedded etcd) still runs; then the server.
  for pid in "${workers_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${workers_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ -n "$server" ]; then
    kill -TERM "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  if [ -n "$natsd" ]; then
    kill -TERM "$natsd" 2>/dev/null || true
    wait "$natsd" 2>/dev/null || true
  fi
}
trap stop INT TERM EXIT

serve_args=()
worker_args=()
if [ -n "$nats" ]; then
  nats-server -a 127.0.0.1 -p "$nats_port" -js -sd "$state/nats" &
  natsd=$!
  url="nats://127.0.0.1:$nats_port"
  serve_args=(--router-policy kv-aware --tokenizer bytes --kv-event-transport nats --request-transport nats --nats-server "$url")
  worker_args=(--kv-event-transport nats --request-transport nats --nats-server "$url")
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null && break
    sleep 0.1
  done
fi

"$bin" serve --listen "127.0.0.1:$port" \
  --embedded-etcd-listen "127.0.0.1:$etcd_port" --embedded-etcd-dir "$state/etcd" \
  --log-format console "${serve_args[@]}" &
server=$!

for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.1
done

for i in $(seq 1 "$workers"); do
  "$bin" worker --engine sim --etcd-endpoints "http://127.0.0.1:$etcd_port" --log-format console "${worker_args[@]}" \
    -- --model "$model" --time-scale 1 &
  workers_pids+=($!)
done

cat >&2 <<MSG

Infera is up on http://127.0.0.1:$port with $workers simulated workers. Try:

  curl -N http://127.0.0.1:$port/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model":"$model","stream":true,"messages":[{"role":"user","content":"Hello!"}]}'

Ctrl-C stops everything.
MSG
wait -n "$server" "${workers_pids[@]}" || true
