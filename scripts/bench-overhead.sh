#!/usr/bin/env bash
# Router overhead, measured: the same `infera bench` load (unary and streaming,
# several closed-loop concurrency levels) against
#   (a) direct: the simulators themselves, in zero-latency mode (--time-scale 0),
#       `infera bench` spreading requests over them in turn (no proxy hop),
#   (b) nginx:  nginx round-robin proxy_pass in front of the simulators,
#   (c) infera: `infera serve` in front of the same simulators,
# all in one run, interleaved per cell, so the ratios to (a) hold on a noisy
# machine. Two load generators (CLIENTS): `infera bench` and `wrk` (Debian's,
# a C client with a Lua POST script; installed with apt when missing), so the
# comparison does not rest on our own client's cost. For each cell it records
# the CPU seconds the proxy process(es) used (utime+stime from /proc/PID/stat,
# before and after; nginx: master and workers) per 1,000 requests, repeats
# every cell REPEATS times (interleaved) and reports medians. The simulators are the ones `infera worker --engine sim` launches
# and registers with serve's embedded etcd; nginx and the direct runs use
# those same processes. Prints a markdown table (and writes it to
# $OUT/overhead.md); every process it started is stopped on exit.
#
# Needs: go, curl, jq; installs nginx and wrk (Debian packages) when missing.
# Settings (environment):
#   LEVELS="1 16 64"  concurrency levels      DURATION=5s   measured time per cell
#   MODES="unary stream"                       WARMUP=200    requests per target first
#   INPUT_LEN=128 OUTPUT_LEN=16 (words/tokens) SIMS=2        simulators behind the proxies
#   TARGETS="direct nginx infera"              OUT=<temp dir> where JSON reports go
#   CLIENTS="bench wrk" load generators        REPEATS=1     runs of every cell (medians)
#   BIN=bin/infera (NO_BUILD=1 skips `go build`)  KEEP=1 keeps the temp dir and logs
#   SERVE_FLAGS="" extra `infera serve` flags (e.g. --enable-profiling --admin-listen ...)
#   SERVE_ENV="" environment of `infera serve` only (e.g. GOMAXPROCS=1 GOGC=400)
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
CLIENTS=${CLIENTS:-"bench wrk"}
REPEATS=${REPEATS:-1}
SERVE_FLAGS=${SERVE_FLAGS:-}
SERVE_ENV=${SERVE_ENV:-}
BIN=${BIN:-bin/infera}
COMMAND="LEVELS=\"$LEVELS\" MODES=\"$MODES\" CLIENTS=\"$CLIENTS\" REPEATS=$REPEATS DURATION=$DURATION TARGETS=\"$TARGETS\" bash scripts/bench-overhead.sh"
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

# --- wrk, from Debian packages ---------------------------------------------
WRK=$(command -v wrk || true)
if [[ $CLIENTS == *wrk* && -z $WRK ]]; then
  command -v apt-get >/dev/null || die "wrk is missing and apt-get is not available"
  log "installing wrk from Debian packages"
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq wrk >/dev/null 2>&1 || {
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq wrk >/dev/null
  }
  WRK=$(command -v wrk || true)
  [[ -x $WRK ]] || die "wrk did not install"
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
  env $SERVE_ENV "$BIN" serve --listen "127.0.0.1:$API_PORT" \
    --embedded-etcd-listen "127.0.0.1:$ETCD_PORT" --embedded-etcd-dir "$WORK/etcd" \
    --log-level warn $SERVE_FLAGS >"$WORK/serve.log" 2>&1 &
  PIDS+=($!)
  SERVE_PID=$!
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
  NGINX_PID=$!
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

# --- wrk: a Lua POST script per mode; done() writes a one-line JSON --------
# The prompt: INPUT_LEN words, as `infera bench --workload random` sends.
words=$(awk -v n="$INPUT_LEN" 'BEGIN { srand(1); for (i = 0; i < n; i++) printf "%sw%d", (i ? " " : ""), int(rand() * 5000) }')
for mode in unary stream; do
  stream=false
  [[ $mode == stream ]] && stream=true
  cat >"$WORK/post-$mode.lua" <<LUA
wrk.method = "POST"
wrk.path = "/v1/chat/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"$MODEL","messages":[{"role":"user","content":"$words"}],"max_tokens":$OUTPUT_LEN,"stream":$stream}'
local out = os.getenv("WRK_JSON")
function done(summary, latency, requests)
  local e = summary.errors
  local f = io.open(out, "w")
  f:write(string.format('{"requests":%d,"duration_us":%d,"errors":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99)))
  f:close()
end
LUA
done

wrk_one() { # url mode conc out.json
  WRK_JSON=$4 "$WRK" -t1 -c"$3" -d"$DURATION" --timeout 30s -s "$WORK/post-$2.lua" "$1" >/dev/null 2>&1 || true
  [[ -s $4 ]] || die "wrk against $1 wrote no report"
}

# wrk_run target mode conc out.tsv-line: one wrk per URL (direct: one per
# simulator, the connections split between them, results summed/averaged).
wrk_run() {
  local target=$1 mode=$2 conc=$3 tag=$4
  local urls=() i
  if [[ $target == direct ]]; then
    for p in "${SIM_PORTS[@]}"; do urls+=("http://127.0.0.1:$p"); done
    [[ $conc -lt ${#urls[@]} ]] && urls=("${urls[@]:0:$conc}")
  else
    urls=("$(url_of "$target")")
  fi
  local n=${#urls[@]} pids=()
  for i in "${!urls[@]}"; do
    local c=$((conc / n))
    [[ $i -lt $((conc % n)) ]] && c=$((c + 1))
    wrk_one "${urls[$i]}" "$mode" "$c" "$WORK/$tag-$i.json" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  # requests, req/s, p50 ms, p99 ms, errors
  jq -s -r '[ (map(.requests) | add),
              (map(.requests / (.duration_us / 1e6)) | add),
              (map(.p50_us) | add / length / 1000),
              (map(.p99_us) | add / length / 1000),
              (map(.errors) | add) ] | @tsv' "$WORK/$tag"-*.json
  rm -f "$WORK/$tag"-*.json
}

# cpu_ticks target: utime+stime (clock ticks) of the proxy process(es).
TICKS=$(getconf CLK_TCK)
cpu_ticks() {
  local pids=()
  case $1 in
    infera) pids=("$SERVE_PID") ;;
    nginx) pids=("$NGINX_PID" $(pgrep -P "$NGINX_PID" || true)) ;;
    *) echo 0; return ;;
  esac
  local total=0 p rest
  for p in "${pids[@]}"; do
    [[ -r /proc/$p/stat ]] || continue
    rest=$(sed 's/^.*) //' "/proc/$p/stat")
    # after "comm) ": field 3 is state, so utime/stime (14, 15) are 12, 13 here
    total=$((total + $(awk '{print $12 + $13}' <<<"$rest")))
  done
  echo "$total"
}

for target in $TARGETS; do
  log "warming up $target"
  bench "$target" stream 16 "$WORK/warmup-$target.json" --requests "$WARMUP"
done

LOAD_BEFORE=$(cat /proc/loadavg)
RESULTS=$OUT/results.tsv
printf 'client\tmode\tconc\trep\ttarget\trequests\treq_s\tp50_ms\tp99_ms\terrors\tcpu_s\n' >"$RESULTS"
for rep in $(seq 1 "$REPEATS"); do
  for mode in $MODES; do
    for conc in $LEVELS; do
      for client in $CLIENTS; do
        for target in $TARGETS; do
          log "run $rep/$REPEATS: $client, $mode, concurrency $conc, $target, $DURATION"
          t0=$(cpu_ticks "$target")
          if [[ $client == bench ]]; then
            f="$OUT/$mode-c$conc-$target-r$rep.json"
            bench "$target" "$mode" "$conc" "$f" --requests 0 --duration "$DURATION"
            line=$(jq -r '[.requests, .throughput.req_per_s, .e2e_ms.p50, .e2e_ms.p99, ([.errors[]] | add // 0)] | @tsv' "$f")
          else
            line=$(wrk_run "$target" "$mode" "$conc" "wrk-$mode-c$conc-$target-r$rep")
          fi
          t1=$(cpu_ticks "$target")
          cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$TICKS" 'BEGIN { printf "%.3f", (b - a) / hz }')
          printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$client" "$mode" "$conc" "$rep" "$target" "$line" "$cpu" >>"$RESULTS"
        done
      done
    done
  done
done
LOAD_AFTER=$(cat /proc/loadavg)

# --- table: medians over the repeats; ratios within the same client/cell ----
awk -F'\t' -v modes="$MODES" -v levels="$LEVELS" -v clients="$CLIENTS" -v targets="$TARGETS" '
function median(key,   n, i, j, t, a) {
  n = split(vals[key], a, " ")
  for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
NR > 1 {
  k = $1 SUBSEP $2 SUBSEP $3 SUBSEP $5
  vals[k, "rps"] = vals[k, "rps"] " " $7
  vals[k, "p50"] = vals[k, "p50"] " " $8
  vals[k, "p99"] = vals[k, "p99"] " " $9
  vals[k, "cpu"] = vals[k, "cpu"] " " ($6 > 0 ? $11 * 1000 / $6 : 0)
  err[k] += $10
}
END {
  nm = split(modes, M, " "); nl = split(levels, L, " "); nc = split(clients, C, " "); nt = split(targets, T, " ")
  print "| client | mode | conc | target | req/s | × direct | × nginx | p50 ms | +p50 ms | p99 ms | +p99 ms | CPU s / 1k req | errors |"
  print "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for (c = 1; c <= nc; c++) for (m = 1; m <= nm; m++) for (l = 1; l <= nl; l++) {
    d = C[c] SUBSEP M[m] SUBSEP L[l] SUBSEP "direct"; g = C[c] SUBSEP M[m] SUBSEP L[l] SUBSEP "nginx"
    drps = ((d, "rps") in vals) ? median(d SUBSEP "rps") : ""
    grps = ((g, "rps") in vals) ? median(g SUBSEP "rps") : ""
    dp50 = ((d, "p50") in vals) ? median(d SUBSEP "p50") : ""
    dp99 = ((d, "p99") in vals) ? median(d SUBSEP "p99") : ""
    for (t = 1; t <= nt; t++) {
      k = C[c] SUBSEP M[m] SUBSEP L[l] SUBSEP T[t]
      if (!((k, "rps") in vals)) continue
      rps = median(k SUBSEP "rps"); p50 = median(k SUBSEP "p50"); p99 = median(k SUBSEP "p99"); cpu = median(k SUBSEP "cpu")
      printf "| %s | %s | %s | %s | %.0f | %s | %s | %.2f | %s | %.2f | %s | %s | %d |\n", C[c], M[m], L[l], T[t], rps,
        (drps > 0 ? sprintf("%.2f", rps / drps) : "–"), (grps > 0 ? sprintf("%.2f", rps / grps) : "–"),
        p50, (dp50 != "" ? sprintf("%+.2f", p50 - dp50) : "–"), p99, (dp99 != "" ? sprintf("%+.2f", p99 - dp99) : "–"),
        (T[t] == "direct" ? "–" : sprintf("%.3f", cpu)), err[k]
    }
  }
}' "$RESULTS" >"$OUT/overhead.md"

# --- verdict: infera against nginx (and direct at 64), per client/cell ------
awk -F'|' '
{ gsub(/ /, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $4); gsub(/ /, "", $5) }
$5 == "infera" { k = $2 " " $3 " c" $4; ir[k] = $6 + 0; ix[k] = $8; id[k] = $7; ip50[k] = $10; ip99[k] = $12; icpu[k] = $13 + 0; conc[k] = $4; keys[++n] = k }
$5 == "nginx"  { k = $2 " " $3 " c" $4; gp50[k] = $10; gp99[k] = $12; gcpu[k] = $13 + 0 }
END {
  if (!n) exit
  print ""
  print "| cell | infera × nginx req/s | infera × direct | +p50 ms infera / nginx | +p99 ms infera / nginx | CPU/1k infera / nginx |"
  print "|---|---:|---:|---:|---:|---:|"
  for (i = 1; i <= n; i++) { k = keys[i]
    printf "| %s | %s | %s | %s / %s | %s / %s | %.3f / %.3f |\n", k, ix[k], id[k], ip50[k], gp50[k], ip99[k], gp99[k], icpu[k], gcpu[k] }
}' "$OUT/overhead.md" >"$OUT/verdict.md"

cpus=$(nproc)
cat <<EOF

Router overhead — $(date -u +%Y-%m-%dT%H:%MZ), $(uname -m), $cpus CPUs, infera $("$BIN" version | awk '{print $2}')
command: $COMMAND
load (1/5/15 min, /proc/loadavg): before $LOAD_BEFORE; after $LOAD_AFTER
random workload, $INPUT_LEN-word prompts, $OUTPUT_LEN output tokens, closed loop, $DURATION per cell, median of $REPEATS run(s);
$SIMS × \`infera sim --time-scale 0\`; direct = the client spreads requests over them itself
(wrk: one wrk per simulator, connections split, req/s summed, latency averaged); latency = end-to-end (ms);
CPU = utime+stime of the proxy (nginx: master + workers) per 1,000 requests; × nginx / × direct: same client, same cell.

EOF
cat "$OUT/overhead.md"
cat "$OUT/verdict.md"
[[ $OUT != "$WORK"/* || -n ${KEEP:-} ]] && log "reports: $OUT"
exit 0
