#!/usr/bin/env bash
# Router overhead, measured: the same `infera bench` load (unary and streaming,
# several closed-loop concurrency levels) against
#   (a) direct: the simulators themselves, in zero-latency mode (--time-scale 0),
#       `infera bench` spreading requests over them in turn (no proxy hop),
#   (b) nginx:  nginx round-robin proxy_pass in front of the simulators,
#   (c) infera: `infera serve` in front of the same simulators,
# all in one run, interleaved per cell, so the ratios to (a) hold on a noisy
# machine. The simulators are the ones `infera worker --engine sim` launches
# and registers with serve's embedded etcd; nginx and the direct runs use
# those same processes. Prints a markdown table (and writes it to
# $OUT/overhead.md); every process it started is stopped on exit.
#
# Needs: go, curl, jq; installs nginx (Debian package) when it is missing.
# Settings (environment):
#   LEVELS="1 16 64"  concurrency levels      DURATION=5s   measured time per cell
#   MODES="unary stream"                       WARMUP=200    requests per target first
#   INPUT_LEN=128 OUTPUT_LEN=16 (words/tokens) SIMS=2        simulators behind the proxies
#   TARGETS="direct nginx infera"              OUT=<temp dir> where JSON reports go
#   BIN=bin/infera (NO_BUILD=1 skips `go build`)  KEEP=1 keeps the temp dir and logs
set -euo pipefail
cd "$(dirname "$0")/.."

LEVELS=${LEVELS:-"1 16 64"}
MODES=${MODES:-"unary stream"}
DURATION=${DURATION:-5s}
WARMUP=${WARMUP:-200}
INPUT_LEN=${INPUT_LEN:-128}
OUTPUT_LEN=${OUTPUT_LEN:-16}
SIMS=${SIMS:-2}
TARGETS=${TARGETS:-"direct nginx infera"}
BIN=${BIN:-bin/infera}
MODEL=sim-model

log() { printf '[bench-overhead] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

for tool in curl jq; do
  command -v "$tool" >/dev/null || die "$tool is required"
done

# --- nginx, from Debian packages -------------------------------------------
NGINX=$(command -v nginx || true)
[[ -z $NGINX && -x /usr/sbin/nginx ]] && NGINX=/usr/sbin/nginx
if [[ $TARGETS == *nginx* && -z $NGINX ]]; then
  command -v apt-get >/dev/null || die "nginx is missing and apt-get is not available"
  log "installing nginx from Debian packages"
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  # Keep the package's post-install from starting a system nginx on :80.
  made_policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx-light >/dev/null 2>&1 ||
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx >/dev/null
  [[ -n $made_policy ]] && $sudo rm -f /usr/sbin/policy-rc.d
  NGINX=$(command -v nginx || echo /usr/sbin/nginx)
  [[ -x $NGINX ]] || die "nginx did not install"
fi

# --- build -------------------------------------------------------------------
if [[ -z ${NO_BUILD:-} ]]; then
  log "building $BIN"
  CGO_ENABLED=0 go build -o "$BIN" .
fi
[[ -x $BIN ]] || die "$BIN not found"

# --- processes and cleanup ---------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/infera-overhead.XXXXXX")
OUT=${OUT:-$WORK/reports}
mkdir -p "$OUT"
PIDS=()

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  # Workers first (they drain, deregister and stop their simulators), then
  # the rest, newest first; SIGKILL whatever is still there after 15 s.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill -TERM "${PIDS[$i]}" 2>/dev/null || true; done
  for _ in $(seq 1 150); do
    local alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive -eq 0 ]] && break
    sleep 0.1
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [[ -n ${KEEP:-} || $rc -ne 0 ]]; then
    log "logs and reports kept in $WORK"
  else
    rm -rf "$WORK"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# free_port prints a TCP port nothing listens on (and that we did not hand out).
declare -A USED=()
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 40000))
    [[ -n ${USED[$p]:-} ]] && continue
    if ! ss -Htln "sport = :$p" 2>/dev/null | grep -q .; then
      USED[$p]=1
      echo "$p"
      return
    fi
  done
  die "no free port"
}

# wait_for CMD... retries CMD for up to 30 s.
wait_for() {
  for _ in $(seq 1 300); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

API_PORT=$(free_port)
ETCD_PORT=$(free_port)
SIM_PORTS=()
for _ in $(seq 1 "$SIMS"); do SIM_PORTS+=("$(free_port)"); done
NGINX_PORT=$(free_port)

if [[ $TARGETS == *infera* ]]; then
  log "starting infera serve on 127.0.0.1:$API_PORT (embedded etcd on 127.0.0.1:$ETCD_PORT)"
  "$BIN" serve --listen "127.0.0.1:$API_PORT" \
    --embedded-etcd-listen "127.0.0.1:$ETCD_PORT" --embedded-etcd-dir "$WORK/etcd" \
    --log-level warn >"$WORK/serve.log" 2>&1 &
  PIDS+=($!)
  wait_for curl -fsS "http://127.0.0.1:$API_PORT/health" || die "infera serve did not come up (see $WORK/serve.log)"
  for i in "${!SIM_PORTS[@]}"; do
    log "starting infera worker --engine sim (sim on 127.0.0.1:${SIM_PORTS[$i]}, --time-scale 0)"
    "$BIN" worker --engine sim --etcd-endpoints "http://127.0.0.1:$ETCD_PORT" --drain-timeout 2s --stop-grace 2s \
      -- --host 127.0.0.1 --port "${SIM_PORTS[$i]}" --model "$MODEL" --time-scale 0 --log-level warn \
      >"$WORK/worker-$i.log" 2>&1 &
    PIDS+=($!)
  done
  for i in "${!SIM_PORTS[@]}"; do
    wait_for grep -q '"worker registered"' "$WORK/worker-$i.log" || die "worker $i did not register (see $WORK/worker-$i.log)"
  done
else
  # Without serve there is no fleet to register with: run the simulators bare.
  for i in "${!SIM_PORTS[@]}"; do
    log "starting infera sim on 127.0.0.1:${SIM_PORTS[$i]} (--time-scale 0)"
    "$BIN" sim --host 127.0.0.1 --port "${SIM_PORTS[$i]}" --model "$MODEL" --time-scale 0 --log-level warn \
      >"$WORK/sim-$i.log" 2>&1 &
    PIDS+=($!)
  done
fi
for i in "${!SIM_PORTS[@]}"; do
  wait_for curl -fsS "http://127.0.0.1:${SIM_PORTS[$i]}/health" || die "sim $i is not healthy"
done

# Wait until serve routes to every simulator: its answers name each worker.
probe='{"model":"'$MODEL'","messages":[{"role":"user","content":"hello"}],"max_tokens":1}'
seen_all() {
  local seen
  seen=$(for _ in $(seq 1 $((4 * SIMS))); do
    curl -fsS -o /dev/null -D - -H 'Content-Type: application/json' -d "$probe" \
      "http://127.0.0.1:$API_PORT/v1/chat/completions" | tr -d '\r' | awk -F': ' 'tolower($1)=="x-infera-worker"{print $2}'
  done | sort -u | wc -l)
  [[ $seen -ge $SIMS ]]
}
if [[ $TARGETS == *infera* ]]; then
  wait_for seen_all || die "infera serve does not route to all $SIMS workers (see $WORK/serve.log)"
fi

if [[ $TARGETS == *nginx* ]]; then
  mkdir -p "$WORK/nginx"
  {
    [[ $(id -u) -eq 0 ]] && echo "user root;"
    cat <<CONF
worker_processes auto;
daemon off;
master_process on;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/body;
  proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fastcgi;
  uwsgi_temp_path $WORK/nginx/uwsgi;
  scgi_temp_path $WORK/nginx/scgi;
  keepalive_timeout 120s;
  keepalive_requests 1000000;
  upstream sims {
$(for p in "${SIM_PORTS[@]}"; do echo "    server 127.0.0.1:$p;"; done)
    keepalive 512;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://sims;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 300s;
    }
  }
}
CONF
  } >"$WORK/nginx/nginx.conf"
  log "starting nginx on 127.0.0.1:$NGINX_PORT (round-robin over ${SIM_PORTS[*]})"
  "$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/error.log" >"$WORK/nginx/stdout.log" 2>&1 &
  PIDS+=($!)
  wait_for curl -fsS "http://127.0.0.1:$NGINX_PORT/health" || die "nginx did not come up (see $WORK/nginx/error.log)"
fi

url_of() {
  case $1 in
    direct)
      local urls=() p
      for p in "${SIM_PORTS[@]}"; do urls+=("http://127.0.0.1:$p"); done
      (IFS=,; echo "${urls[*]}")
      ;;
    nginx) echo "http://127.0.0.1:$NGINX_PORT" ;;
    infera) echo "http://127.0.0.1:$API_PORT" ;;
  esac
}

bench() { # target mode concurrency out.json [extra flags]
  local target=$1 mode=$2 conc=$3 out=$4
  shift 4
  local stream=false
  [[ $mode == stream ]] && stream=true
  "$BIN" bench --url "$(url_of "$target")" --model "$MODEL" --workload random --seed 1 \
    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --stream="$stream" --concurrency "$conc" \
    --timeout 30s --progress=false --log-level warn --label "$target" --json "$out" "$@" >/dev/null || true
  [[ -s $out ]] || die "bench against $target wrote no report"
}

for target in $TARGETS; do
  log "warming up $target"
  bench "$target" stream 16 "$WORK/warmup-$target.json" --requests "$WARMUP"
done

for mode in $MODES; do
  for conc in $LEVELS; do
    for target in $TARGETS; do
      log "$mode, concurrency $conc, $target, $DURATION"
      bench "$target" "$mode" "$conc" "$OUT/$mode-c$conc-$target.json" --requests 0 --duration "$DURATION"
    done
  done
done

# --- table -------------------------------------------------------------------
field() { jq -r "$2" "$1"; }
{
  echo "| mode | concurrency | target | req/s | × direct | p50 ms | +p50 ms | p99 ms | +p99 ms | errors |"
  echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"
  for mode in $MODES; do
    for conc in $LEVELS; do
      base="$OUT/$mode-c$conc-direct.json"
      for target in $TARGETS; do
        f="$OUT/$mode-c$conc-$target.json"
        rps=$(field "$f" '.throughput.req_per_s')
        p50=$(field "$f" '.e2e_ms.p50')
        p99=$(field "$f" '.e2e_ms.p99')
        errs=$(field "$f" '[.errors[]] | add // 0')
        if [[ -f $base ]]; then
          brps=$(field "$base" '.throughput.req_per_s')
          bp50=$(field "$base" '.e2e_ms.p50')
          bp99=$(field "$base" '.e2e_ms.p99')
        else
          brps="" bp50="" bp99=""
        fi
        awk -v mode="$mode" -v conc="$conc" -v target="$target" -v rps="$rps" -v p50="$p50" -v p99="$p99" \
          -v errs="$errs" -v brps="$brps" -v bp50="$bp50" -v bp99="$bp99" 'BEGIN {
            ratio = (brps != "" && brps > 0) ? sprintf("%.2f", rps / brps) : "–"
            d50 = (bp50 != "") ? sprintf("%+.2f", p50 - bp50) : "–"
            d99 = (bp99 != "") ? sprintf("%+.2f", p99 - bp99) : "–"
            printf "| %s | %s | %s | %.0f | %s | %.2f | %s | %.2f | %s | %d |\n",
              mode, conc, target, rps, ratio, p50, d50, p99, d99, errs
          }'
      done
    done
  done
} >"$OUT/overhead.md"

cpus=$(nproc)
cat <<EOF

Router overhead — $(date -u +%Y-%m-%dT%H:%MZ), $(uname -m), $cpus CPUs, infera $("$BIN" version | awk '{print $2}')
random workload, $INPUT_LEN-word prompts, $OUTPUT_LEN output tokens, closed loop, $DURATION per cell;
$SIMS × \`infera sim --time-scale 0\`; direct = the bench spreads requests over them itself; latency = end-to-end (ms).

EOF
cat "$OUT/overhead.md"
[[ $OUT != "$WORK"/* || -n ${KEEP:-} ]] && log "reports: $OUT"
exit 0
