#!/usr/bin/env bash
# Router overhead, measured fairly: the same load (unary and streaming, several
# closed-loop concurrency levels, and optional fixed-rate cells) against
#   direct:   the simulators themselves, in zero-latency mode (--time-scale 0),
#             the client spreading requests over them in turn (no proxy hop),
#   nginx:    nginx round-robin proxy_pass in front of the simulators,
#   infera:   `infera serve` (round-robin) in front of the same simulators,
# plus, when listed in TARGETS, variants that run beside them on the same
# simulators and the same etcd:
#   infera-kv    serve with --router-policy kv-aware --tokenizer bytes (the
#                routing work a cache-aware router does, reported on its own)
#   infera-pd    serve in front of its own disaggregated simulators: PD_PAIRS
#                prefill + decode pairs (`infera worker --engine sim -- --pd-role
#                prefill|decode --pd-protocol PD_PROTOCOL`, vllm-nixl as the e2e
#                PD tests; the decode pulls the prefill's KV over TCP), its
#                serve and workers under their own etcd prefix (PD_PREFIX) so
#                that no other serve sees them and it sees no other worker; each
#                request is two engine exchanges (prefill leg, then decode leg).
#                There is no direct PD path (nor an nginx one): its "× direct"
#                and "box − direct" are against the same direct cell as every
#                target (one engine exchange a request), so they include the
#                prefill leg's engine and transfer work, not only the router's
#   infera-base  serve built from BASE_REF (a git ref; before/after in one run)
#   infera-gmp1, infera-gmp2   serve with GOMAXPROCS=1 / 2
#   infera-pin   serve pinned to CPU 0 (taskset)
#   infera-loop  serve with --front-door loop (the epoll front door)
#   infera-nomig serve with --migration-limit 0 (streams not tracked for continuation)
#   infera-nomig-ids  the same, its client asking for "return_token_ids" itself
#                (wrk only): the engines send the bytes a tracked stream's
#                engines send, so against `infera` only the tracking differs
#   nginx-w1     nginx with worker_processes 1 (nginx is auto)
#   direct-ids, nginx-ids   direct and nginx, their client asking for
#                "return_token_ids" itself (wrk only): the baselines with the
#                engine bytes a tracked stream's engines send (6,744 bytes a
#                16-token stream instead of 3,888), for the same-bytes
#                added-latency table below
# Every cell runs every target back to back, and the whole grid is repeated
# REPEATS times, so A and B interleave (ABAB…) and share the machine's noise.
#
# etcd runs as its own process (Debian's etcd; ETCD=embedded keeps serve's
# in-process one), so serve's CPU is the router's alone. Two load generators
# (CLIENTS): `infera bench` and `wrk` (a C client with a Lua POST script);
# fixed-rate cells (RATES) use `infera bench --rate`. Per cell it records
# requests/s, p50/p99 latency, the proxy's CPU (utime+stime from
# /proc/PID/stat; nginx: master and workers; its kernel part, stime, apart)
# per 1,000 requests, and the whole
# box's busy CPU (/proc/stat) per 1,000 requests; "box − direct" subtracts the
# same repeat's direct cell, so the load generator's and the engines' costs
# cancel and what is left is what the proxy costs the machine (kernel work
# included). Tables give medians with their spread (min–max) and the machine's
# load before and after, and the added latency at concurrency 1 (p50/p99
# minus direct's) of every infera* target beside nginx's, and, when direct-ids
# and nginx-ids run, the same with the baseline whose engines send the same
# bytes: a tracked stream (every infera* stream but infera-nomig's) and every
# *-ids target against nginx-ids − direct-ids, the rest against nginx − direct.
# A last table sets every target whose engines send token ids (tracked streams,
# *-ids targets) against nginx-ids: req/s and proxy CPU with the same bytes.
# Every process it started is stopped on exit.
#
# Needs: go, curl, jq; installs nginx and wrk (Debian packages) when missing.
# Settings (environment):
#   LEVELS="1 16 64"  concurrency levels      DURATION=5s   measured time per cell
#   MODES="unary stream"                       WARMUP=200    requests per target first
#   RATES=""  fixed rates (req/s), bench only  SIMS=2        simulators behind the proxies
#   INPUT_LEN=128 OUTPUT_LEN=16 (words/tokens) OUT=<temp dir> where JSON reports go
#   TARGETS="direct nginx infera" (and the variants above)
#   CLIENTS="bench wrk" load generators        REPEATS=3     runs of every cell (medians)
#   BIN=bin/infera (NO_BUILD=1 skips `go build`)  KEEP=1 keeps the temp dir and logs
#   BASE_REF=main~1 the ref infera-base is built from (BASE_BIN=path: a binary instead)
#   ETCD=external|embedded
#   SERVE_FLAGS="" extra `infera serve` flags (e.g. --enable-profiling --admin-listen ...)
#   SERVE_ENV="" environment of every `infera serve` (e.g. GOGC=400)
#   SIM_ARGS="--time-scale 0" the simulators' model flags (e.g. "--time-scale 1
#     --decode-ms-per-token 2": tokens paced as an engine paces them, one event per read)
#   PD_PAIRS=1 PD_PROTOCOL=vllm-nixl PD_PREFIX=/infera-pd/workers/  (infera-pd)
#   PROFILE_DIR=""  when set, every serve runs with --enable-profiling on an
#     admin port of its own, and each of its wrk cells writes the CPU profile
#     of its measured time (DURATION less one second) to
#     PROFILE_DIR/<target>-<mode>-c<conc>-r<rep>.pprof (scripts/pgo-profile.sh)
#   SYSCALLS=1  every wrk cell of a proxy (infera*, nginx*) runs once more,
#     right after its measured run, under `perf stat` on the proxy's
#     process(es) (nginx: its workers): a last table gives system calls,
#     context switches, wake-ups and CPU migrations a request, by kind
#     (medians over the repeats). A run of its own, because every traced
#     system call costs CPU: the measured cells stay as they were. Needs perf
#     and the syscalls/sched tracepoints (root, or perf_event_paranoid -1).
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
REPEATS=${REPEATS:-3}
RATES=${RATES:-}
BASE_REF=${BASE_REF:-main~1}
ETCD=${ETCD:-external}
SERVE_FLAGS=${SERVE_FLAGS:-}
SERVE_ENV=${SERVE_ENV:-}
SIM_ARGS=${SIM_ARGS:-"--time-scale 0"}
PD_PAIRS=${PD_PAIRS:-1}
PD_PROTOCOL=${PD_PROTOCOL:-vllm-nixl}
PD_PREFIX=${PD_PREFIX:-/infera-pd/workers/}
PROFILE_DIR=${PROFILE_DIR:-}
SYSCALLS=${SYSCALLS:-}
BIN=${BIN:-bin/infera}
COMMAND="SIM_ARGS=\"$SIM_ARGS\" LEVELS=\"$LEVELS\" MODES=\"$MODES\" RATES=\"$RATES\" CLIENTS=\"$CLIENTS\" REPEATS=$REPEATS DURATION=$DURATION TARGETS=\"$TARGETS\" ETCD=$ETCD bash scripts/bench-overhead.sh"
if [[ " $TARGETS " == *" infera-pd "* ]]; then
  COMMAND="PD_PAIRS=$PD_PAIRS PD_PROTOCOL=$PD_PROTOCOL $COMMAND"
fi
MODEL=sim-model

log() { printf '[bench-overhead] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
if [[ -n $PROFILE_DIR ]]; then
  [[ $DURATION =~ ^([0-9]+)s$ ]] || die "PROFILE_DIR needs DURATION in whole seconds (e.g. 10s), not $DURATION"
  PROFILE_SECONDS=$((BASH_REMATCH[1] > 2 ? BASH_REMATCH[1] - 1 : 1))
  mkdir -p "$PROFILE_DIR"
fi

for tool in curl jq; do
  command -v "$tool" >/dev/null || die "$tool is required"
done

# --- SYSCALLS=1: the events perf stat counts on the proxy --------------------
# Per request: every system call (raw_syscalls), each kind a proxy makes per
# request (Go: read/write/epoll_pwait/futex; nginx: recvfrom/writev/
# epoll_wait/getsockopt), the reads that found nothing (EAGAIN: -11) and the
# polls that brought no event (0), connects (new upstream connections), and
# the scheduler's side: context switches, CPU migrations and the wake-ups the
# proxy's threads made (sched_wakeup counts in the waker: a write that wakes
# the reader on the other end counts too).
SC_KINDS="read recvfrom write writev epoll_pwait epoll_wait futex getsockopt connect"
SC_EVENTS=(-e raw_syscalls:sys_enter -e context-switches -e cpu-migrations -e sched:sched_wakeup)
for s in $SC_KINDS; do SC_EVENTS+=(-e "syscalls:sys_enter_$s"); done
SC_EVENTS+=(-e syscalls:sys_exit_read --filter 'ret == -11' -e syscalls:sys_exit_recvfrom --filter 'ret == -11'
  -e syscalls:sys_exit_epoll_pwait --filter 'ret == 0' -e syscalls:sys_exit_epoll_wait --filter 'ret == 0')
if [[ -n $SYSCALLS ]]; then
  command -v perf >/dev/null || die "SYSCALLS=1 needs perf"
  [[ $CLIENTS == *wrk* ]] || die "SYSCALLS=1 counts the wrk cells: CLIENTS must include wrk"
  perf stat -x, -o /dev/null "${SC_EVENTS[@]}" -- true 2>/dev/null ||
    die "perf stat cannot count the syscalls/sched tracepoints (root, or kernel.perf_event_paranoid=-1)"
fi

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
if [[ $TARGETS == *-ids* && $CLIENTS == *bench* ]]; then
  die "*-ids targets need CLIENTS=wrk (infera bench sends one body to every target)"
fi
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
BASE_BIN=${BASE_BIN:-}
if [[ -n $BASE_BIN ]]; then
  [[ -x $BASE_BIN ]] || die "BASE_BIN $BASE_BIN is not an executable"
  BASE_DESC="$BASE_BIN ($("$BASE_BIN" version 2>/dev/null | awk '{print $2}'))"
elif [[ " $TARGETS " == *" infera-base "* ]]; then
  BASE_BIN=$(dirname "$BIN")/infera-base
  log "building $BASE_BIN from $BASE_REF"
  base_tree=$(mktemp -d "${TMPDIR:-/tmp}/infera-base.XXXXXX")
  git worktree add -q --detach "$base_tree" "$BASE_REF" || die "cannot check out $BASE_REF"
  base_out=$BASE_BIN
  [[ $base_out == /* ]] || base_out=$PWD/$base_out # BIN may be absolute
  (cd "$base_tree" && CGO_ENABLED=0 go build -o "$base_out" .) || die "cannot build $BASE_REF"
  git worktree remove --force "$base_tree"
  BASE_DESC="$BASE_REF = $(git rev-parse --short "$BASE_REF")"
fi

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
    # Below the ephemeral range (32768+ on Linux), where other programs' outgoing
    # connections and :0 listeners take ports between our check and our bind.
    p=$((20000 + RANDOM % 12000))
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

is_serve() { [[ $1 == infera* ]]; }
is_nginx() { [[ $1 == nginx* ]]; }
is_direct() { [[ $1 == direct || $1 == direct-ids ]]; } # the simulators themselves, no proxy
needs_fleet=""
for t in $TARGETS; do is_serve "$t" && needs_fleet=1; done

ETCD_PORT=$(free_port)
ETCD_URL="http://127.0.0.1:$ETCD_PORT"
SIM_PORTS=()
for _ in $(seq 1 "$SIMS"); do SIM_PORTS+=("$(free_port)"); done
declare -A PORT=() PID_OF=() ADMIN_PORT=()

if [[ -n $needs_fleet && $ETCD == external ]]; then
  command -v etcd >/dev/null || die "etcd is missing (apt-get install etcd-server, or ETCD=embedded)"
  log "starting etcd on $ETCD_URL (its own process)"
  etcd --name bench --data-dir "$WORK/etcd" --listen-client-urls "$ETCD_URL" --advertise-client-urls "$ETCD_URL" \
    --listen-peer-urls "http://127.0.0.1:$(free_port)" --log-level warn >"$WORK/etcd.log" 2>&1 &
  PIDS+=($!)
  wait_for curl -fsS "$ETCD_URL/health" || die "etcd did not come up (see $WORK/etcd.log)"
fi

# start_serve TARGET: one `infera serve` per infera* target, all on the same
# etcd (with ETCD=embedded the first one runs it in-process).
start_serve() {
  local t=$1 port bin=$BIN env=() flags=() pin=()
  port=$(free_port)
  case $t in
    infera-kv) flags=(--router-policy kv-aware --tokenizer bytes) ;;
    infera-pd) flags=(--etcd-prefix "$PD_PREFIX") ;;
    infera-base) bin=$BASE_BIN ;;
    infera-gmp1) env=(GOMAXPROCS=1) ;;
    infera-gmp2) env=(GOMAXPROCS=2) ;;
    infera-pin) pin=(taskset -c 0) ;;
    infera-loop) flags=(--front-door loop) ;;
    infera-nomig | infera-nomig-ids) env=(INFERA_MIGRATION_LIMIT=0) ;;
  esac
  if [[ -n $PROFILE_DIR ]]; then
    ADMIN_PORT[$t]=$(free_port)
    flags+=(--enable-profiling --admin-listen "127.0.0.1:${ADMIN_PORT[$t]}")
  fi
  if [[ $ETCD == external || -n ${EMBEDDED_UP:-} ]]; then
    flags+=(--etcd-endpoints "$ETCD_URL")
  else
    flags+=(--embedded-etcd-listen "127.0.0.1:$ETCD_PORT" --embedded-etcd-dir "$WORK/etcd")
    EMBEDDED_UP=1
  fi
  log "starting $t: infera serve on 127.0.0.1:$port ${env[*]} ${pin[*]} ${flags[*]}"
  env $SERVE_ENV "${env[@]}" "${pin[@]}" "$bin" serve --listen "127.0.0.1:$port" \
    --log-level warn "${flags[@]}" $SERVE_FLAGS >"$WORK/serve-$t.log" 2>&1 &
  PIDS+=($!)
  PID_OF[$t]=$!
  PORT[$t]=$port
  wait_for curl -fsS "http://127.0.0.1:$port/health" || die "$t did not come up (see $WORK/serve-$t.log)"
}
for t in $TARGETS; do
  if is_serve "$t"; then start_serve "$t"; fi
done

if [[ -n $needs_fleet ]]; then
  for i in "${!SIM_PORTS[@]}"; do
    log "starting infera worker --engine sim (sim on 127.0.0.1:${SIM_PORTS[$i]}, $SIM_ARGS)"
    "$BIN" worker --engine sim --etcd-endpoints "$ETCD_URL" --drain-timeout 2s --stop-grace 2s \
      -- --host 127.0.0.1 --port "${SIM_PORTS[$i]}" --model "$MODEL" $SIM_ARGS --log-level warn \
      >"$WORK/worker-$i.log" 2>&1 &
    PIDS+=($!)
  done
  for i in "${!SIM_PORTS[@]}"; do
    wait_for grep -q '"worker registered"' "$WORK/worker-$i.log" || die "worker $i did not register (see $WORK/worker-$i.log)"
  done
else
  # Without serve there is no fleet to register with: run the simulators bare.
  for i in "${!SIM_PORTS[@]}"; do
    log "starting infera sim on 127.0.0.1:${SIM_PORTS[$i]} ($SIM_ARGS)"
    "$BIN" sim --host 127.0.0.1 --port "${SIM_PORTS[$i]}" --model "$MODEL" $SIM_ARGS --log-level warn \
      >"$WORK/sim-$i.log" 2>&1 &
    PIDS+=($!)
  done
fi
for i in "${!SIM_PORTS[@]}"; do
  wait_for curl -fsS "http://127.0.0.1:${SIM_PORTS[$i]}/health" || die "sim $i is not healthy"
done

# infera-pd's own fleet: PD_PAIRS prefill and decode workers under PD_PREFIX.
if [[ " $TARGETS " == *" infera-pd "* ]]; then
  for i in $(seq 1 "$PD_PAIRS"); do
    for role in prefill decode; do
      p=$(free_port)
      log "starting infera worker --engine sim (PD $role $i on 127.0.0.1:$p, $PD_PROTOCOL, $SIM_ARGS)"
      "$BIN" worker --engine sim --etcd-endpoints "$ETCD_URL" --etcd-prefix "$PD_PREFIX" \
        --advertise-host 127.0.0.1 --disaggregation-allow-tcp --drain-timeout 2s --stop-grace 2s \
        -- --host 127.0.0.1 --port "$p" --model "$MODEL" $SIM_ARGS --pd-role "$role" --pd-protocol "$PD_PROTOCOL" \
        --log-level warn >"$WORK/worker-pd-$role-$i.log" 2>&1 &
      PIDS+=($!)
    done
  done
  for i in $(seq 1 "$PD_PAIRS"); do
    for role in prefill decode; do
      wait_for grep -q '"worker registered"' "$WORK/worker-pd-$role-$i.log" ||
        die "PD $role worker $i did not register (see $WORK/worker-pd-$role-$i.log)"
    done
  done
fi

# Wait until every serve routes to every simulator: its answers name each
# worker (prompts differ, so that kv-aware spreads them too); infera-pd's name
# each of its prefill workers and each of its decode workers.
seen_all() { # port [want header]
  local seen i want=${2:-$SIMS} header=${3:-x-infera-worker}
  seen=$(for i in $(seq 1 $((4 * want))); do
    curl -fsS -o /dev/null -D - -H 'Content-Type: application/json' \
      -d '{"model":"'$MODEL'","messages":[{"role":"user","content":"hello '$i$RANDOM'"}],"max_tokens":1}' \
      "http://127.0.0.1:$1/v1/chat/completions" | tr -d '\r' | awk -F': ' -v h="$header" 'tolower($1)==h{print $2}'
  done | sort -u | wc -l)
  [[ $seen -ge $want ]]
}
for t in $TARGETS; do
  if [[ $t == infera-pd ]]; then
    for h in x-infera-prefill-worker x-infera-worker; do
      wait_for seen_all "${PORT[$t]}" "$PD_PAIRS" "$h" ||
        die "$t does not route to all $PD_PAIRS PD pairs ($h; see $WORK/serve-$t.log)"
    done
  elif is_serve "$t"; then
    wait_for seen_all "${PORT[$t]}" || die "$t does not route to all $SIMS workers (see $WORK/serve-$t.log)"
  fi
done

# start_nginx TARGET: nginx (worker_processes auto) or nginx-w1 (1).
start_nginx() {
  local t=$1 port workers=auto dir=$WORK/$1
  port=$(free_port)
  [[ $t == nginx-w1 ]] && workers=1
  mkdir -p "$dir"
  {
    [[ $(id -u) -eq 0 ]] && echo "user root;"
    cat <<CONF
worker_processes $workers;
daemon off;
master_process on;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fastcgi;
  uwsgi_temp_path $dir/uwsgi;
  scgi_temp_path $dir/scgi;
  keepalive_timeout 120s;
  keepalive_requests 1000000;
  upstream sims {
$(for p in "${SIM_PORTS[@]}"; do echo "    server 127.0.0.1:$p;"; done)
    keepalive 512;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$port;
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
  } >"$dir/nginx.conf"
  log "starting $t on 127.0.0.1:$port (worker_processes $workers, round-robin over ${SIM_PORTS[*]})"
  "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" >"$dir/stdout.log" 2>&1 &
  PIDS+=($!)
  PID_OF[$t]=$!
  PORT[$t]=$port
  wait_for curl -fsS "http://127.0.0.1:$port/health" || die "$t did not come up (see $dir/error.log)"
}
for t in $TARGETS; do
  if is_nginx "$t"; then start_nginx "$t"; fi
done

url_of() {
  if is_direct "$1"; then
    local urls=() p
    for p in "${SIM_PORTS[@]}"; do urls+=("http://127.0.0.1:$p"); done
    (IFS=,; echo "${urls[*]}")
  else
    echo "http://127.0.0.1:${PORT[$1]}"
  fi
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
for script in unary stream unary-ids stream-ids; do
  stream=false ids=""
  [[ $script == stream* ]] && stream=true
  [[ $script == *-ids ]] && ids='"return_token_ids":true,'
  cat >"$WORK/post-$script.lua" <<LUA
wrk.method = "POST"
wrk.path = "/v1/chat/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{$ids"model":"$MODEL","messages":[{"role":"user","content":"$words"}],"max_tokens":$OUTPUT_LEN,"stream":$stream}'
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

# wrk_run target mode conc tag: one wrk per URL (direct: one per simulator,
# the connections split between them, results summed/averaged).
wrk_run() {
  local target=$1 mode=$2 conc=$3 tag=$4
  local urls=() i
  if is_direct "$target"; then
    for p in "${SIM_PORTS[@]}"; do urls+=("http://127.0.0.1:$p"); done
    [[ $conc -lt ${#urls[@]} ]] && urls=("${urls[@]:0:$conc}")
  else
    urls=("$(url_of "$target")")
  fi
  local n=${#urls[@]} pids=()
  for i in "${!urls[@]}"; do
    local c=$((conc / n))
    [[ $i -lt $((conc % n)) ]] && c=$((c + 1))
    local script=$mode
    [[ $target == *-ids ]] && script=$mode-ids
    wrk_one "${urls[$i]}" "$script" "$c" "$WORK/$tag-$i.json" &
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

# proc_ticks target: utime+stime and stime alone (clock ticks) of the proxy
# process(es): the kernel's part (reads, writes, epoll, loopback delivery)
# apart from the process's own code, which is where two proxies that make the
# same system calls differ.
TICKS=$(getconf CLK_TCK)
proc_ticks() {
  if is_direct "$1"; then echo 0 0; return; fi
  local pids=("${PID_OF[$1]}")
  is_nginx "$1" && pids+=($(pgrep -P "${PID_OF[$1]}" || true))
  local total=0 sys=0 p rest
  for p in "${pids[@]}"; do
    [[ -r /proc/$p/stat ]] || continue
    rest=$(sed 's/^.*) //' "/proc/$p/stat")
    # after "comm) ": field 3 is state, so utime/stime (14, 15) are 12, 13 here
    read -r u k <<<"$(awk '{print $12, $13}' <<<"$rest")"
    total=$((total + u + k))
    sys=$((sys + k))
  done
  echo "$total $sys"
}
# box_ticks: the whole machine's busy clock ticks (/proc/stat: user nice
# system irq softirq steal; not idle or iowait).
box_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }

# syscall_run target mode conc rep: the cell once more, perf stat counting on
# the proxy's process(es) (nginx: its workers, where the requests are served)
# while wrk runs; one row of per-request counts into $SC_RESULTS.
SC_RESULTS=$OUT/syscalls.tsv
syscall_run() {
  local target=$1 mode=$2 conc=$3 rep=$4 pids f line sp
  pids=${PID_OF[$1]}
  is_nginx "$target" && pids=$(pgrep -P "${PID_OF[$target]}" | paste -sd, -)
  f="$WORK/perf-$mode-c$conc-$target-r$rep.csv"
  log "run $rep/$REPEATS: wrk, $mode, $conc, $target, $DURATION, under perf stat (SYSCALLS=1)"
  perf stat -x, -o "$f" "${SC_EVENTS[@]}" -p "$pids" 2>"$f.log" &
  sp=$!
  sleep 0.5 # perf attaches before the first request
  line=$(wrk_run "$target" "$mode" "$conc" "wrk-sc-$mode-c$conc-$target-r$rep")
  kill -INT "$sp"
  wait "$sp" || true
  [[ -s $f ]] || die "perf stat wrote nothing for $target (see $f.log)"
  # requests, then one count per event (enter_X as X, exit_X as X_empty: the filtered ones)
  awk -F, -v req="${line%%$'\t'*}" -v cell="wrk\t$mode\t$conc\t$rep\t$target" '
    $1 ~ /^[0-9]/ { n = $3; sub(/^raw_syscalls:sys_enter$/, "all", n); sub(/^syscalls:sys_enter_/, "", n)
      if (sub(/^syscalls:sys_exit_/, "", n)) n = n "_empty"; sub(/^sched:sched_/, "", n); c[n] += $1 }
    END { printf "%s\t%d", cell, req; for (k in c) printf "\t%s=%s", k, c[k]; print "" }' "$f" >>"$SC_RESULTS"
}

for target in $TARGETS; do
  log "warming up $target"
  bench "$target" stream 16 "$WORK/warmup-$target.json" --requests "$WARMUP"
done

# Cells: closed loop at each level (every client), fixed rate (bench only).
CELLS=()
for mode in $MODES; do
  for conc in $LEVELS; do for client in $CLIENTS; do CELLS+=("$client $mode $conc"); done; done
  for rate in $RATES; do CELLS+=("bench $mode r$rate"); done
done

LOAD_BEFORE=$(cat /proc/loadavg)
RESULTS=$OUT/results.tsv
printf 'client\tmode\tconc\trep\ttarget\trequests\treq_s\tp50_ms\tp99_ms\terrors\tcpu_s\tbox_s\tsys_s\n' >"$RESULTS"
for rep in $(seq 1 "$REPEATS"); do
  for cell in "${CELLS[@]}"; do
    read -r client mode conc <<<"$cell"
    for target in $TARGETS; do
      log "run $rep/$REPEATS: $client, $mode, $conc, $target, $DURATION"
      read -r t0 k0 <<<"$(proc_ticks "$target")"
      b0=$(box_ticks)
      if [[ $client == bench ]]; then
        f="$OUT/$mode-$conc-$target-r$rep.json"
        if [[ $conc == r* ]]; then
          bench "$target" "$mode" 1 "$f" --requests 0 --duration "$DURATION" --rate "${conc#r}"
        else
          bench "$target" "$mode" "$conc" "$f" --requests 0 --duration "$DURATION"
        fi
        line=$(jq -r '[.requests, .throughput.req_per_s, .e2e_ms.p50, .e2e_ms.p99, ([.errors[]] | add // 0)] | @tsv' "$f")
      else
        prof=""
        if [[ -n $PROFILE_DIR && -n ${ADMIN_PORT[$target]:-} ]]; then
          curl -fsS -o "$PROFILE_DIR/$target-$mode-c$conc-r$rep.pprof" \
            "http://127.0.0.1:${ADMIN_PORT[$target]}/debug/pprof/profile?seconds=$PROFILE_SECONDS" &
          prof=$!
        fi
        line=$(wrk_run "$target" "$mode" "$conc" "wrk-$mode-c$conc-$target-r$rep")
        if [[ -n $prof ]]; then wait "$prof" || die "no CPU profile from $target (see $WORK/serve-$target.log)"; fi
      fi
      read -r t1 k1 <<<"$(proc_ticks "$target")"
      b1=$(box_ticks)
      if [[ -n $SYSCALLS && $client == wrk ]] && ! is_direct "$target"; then
        syscall_run "$target" "$mode" "$conc" "$rep"
      fi
      cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$TICKS" 'BEGIN { printf "%.3f", (b - a) / hz }')
      box=$(awk -v a="$b0" -v b="$b1" -v hz="$TICKS" 'BEGIN { printf "%.3f", (b - a) / hz }')
      sys=$(awk -v a="$k0" -v b="$k1" -v hz="$TICKS" 'BEGIN { printf "%.3f", (b - a) / hz }')
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$client" "$mode" "$conc" "$rep" "$target" "$line" "$cpu" "$box" "$sys" >>"$RESULTS"
    done
  done
done
LOAD_AFTER=$(cat /proc/loadavg)

# --- tables: medians (min–max) over the repeats; ratios within a repeat ------
# awk functions both tables from results.tsv use: sortv (a space-separated
# list into a, ascending) and med (its median).
stats_awk='
function sortv(s, a,   n, i, j, t) {
  n = split(s, a, " ")
  for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
  return n
}
function med(s,   a, n) { n = sortv(s, a); if (!n) return ""; return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
'
# Ratios (× direct, × nginx) are taken per repeat, then their median: the two
# runs of a ratio ran back to back. box − direct: the box's CPU per 1,000
# requests minus the same repeat's direct cell.
awk -F'\t' -v targets="$TARGETS" "$stats_awk"'
function spread(s, fmt,   a, n) { n = sortv(s, a); if (!n) return "–"; return sprintf(fmt " (" fmt "–" fmt ")", med(s), a[1], a[n]) }
NR > 1 {
  cell = $1 SUBSEP $2 SUBSEP $3; k = cell SUBSEP $5; r = cell SUBSEP $4
  if (!(cell in seen)) { seen[cell] = 1; order[++nc] = cell }
  if (!((r) in repseen)) { repseen[r] = 1; reps[cell] = reps[cell] " " $4 }
  rps[k] = rps[k] " " $7; p50[k] = p50[k] " " $8; p99[k] = p99[k] " " $9
  if ($6 > 0) { cpu[k] = cpu[k] " " ($11 * 1000 / $6); box[k] = box[k] " " ($12 * 1000 / $6); sys[k] = sys[k] " " ($13 * 1000 / $6) }
  err[k] += $10
  R[r SUBSEP $5] = $7; B[r SUBSEP $5] = ($6 > 0 ? $12 * 1000 / $6 : 0)
}
END {
  nt = split(targets, T, " ")
  print "| client | mode | conc | target | req/s (min–max) | × direct | × nginx | p50 ms | p99 ms | proxy CPU s / 1k req (min–max) | box CPU s / 1k req | box − direct | errors | of proxy CPU, kernel s / 1k req |"
  print "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for (c = 1; c <= nc; c++) {
    cell = order[c]; split(cell, parts, SUBSEP)
    nr = split(reps[cell], RP, " ")
    for (t = 1; t <= nt; t++) {
      k = cell SUBSEP T[t]
      if (!(k in rps)) continue
      xd = ""; xg = ""; bd = ""
      for (i = 1; i <= nr; i++) {
        r = cell SUBSEP RP[i]
        if (!((r SUBSEP T[t]) in R)) continue
        if ((r SUBSEP "direct") in R && R[r SUBSEP "direct"] > 0) { xd = xd " " (R[r SUBSEP T[t]] / R[r SUBSEP "direct"]); bd = bd " " (B[r SUBSEP T[t]] - B[r SUBSEP "direct"]) }
        if ((r SUBSEP "nginx") in R && R[r SUBSEP "nginx"] > 0) xg = xg " " (R[r SUBSEP T[t]] / R[r SUBSEP "nginx"])
      }
      printf "| %s | %s | %s | %s | %s | %s | %s | %.2f | %.2f | %s | %s | %s | %d | %s |\n", parts[1], parts[2], parts[3], T[t],
        spread(rps[k], "%.0f"), (xd != "" ? spread(xd, "%.2f") : "–"), (xg != "" ? spread(xg, "%.2f") : "–"),
        med(p50[k]), med(p99[k]),
        (T[t] ~ /^direct/ ? "–" : spread(cpu[k], "%.4f")), spread(box[k], "%.4f"),
        (T[t] == "direct" || bd == "" ? "–" : spread(bd, "%.4f")), err[k],
        (T[t] ~ /^direct/ ? "–" : spread(sys[k], "%.4f"))
    }
  }
}' "$RESULTS" >"$OUT/overhead.md"

# --- verdict: each infera* target against nginx, per cell -------------------
awk -F'|' '
function num(s) { sub(/ *\(.*/, "", s); gsub(/ /, "", s); return s }
{ for (i = 2; i <= 5; i++) gsub(/ /, "", $i) }
$5 ~ /^infera/ { k = $2 " " $3 " " $4 " " $5; cell[k] = $2 " " $3 " " $4; keys[++n] = k; xg[k] = num($8); xd[k] = num($7); c[k] = num($11); b[k] = num($13); p50[k] = $9; p99[k] = $10; ks[k] = num($15) }
$5 == "nginx" { g = $2 " " $3 " " $4; gc[g] = num($11); gb[g] = num($13); gp50[g] = $9; gp99[g] = $10; gk[g] = num($15) }
END {
  if (!n) exit
  print ""
  print "| cell | target | req/s × nginx | req/s × direct | proxy CPU / 1k: target / nginx (ratio) | of it user / kernel: target; nginx | box − direct / 1k: target / nginx | p50 ms target / nginx | p99 ms target / nginx |"
  print "|---|---|---:|---:|---:|---:|---:|---:|---:|"
  for (i = 1; i <= n; i++) { k = keys[i]; g = cell[k]; split(k, kk, " ")
    printf "| %s | %s | %s | %s | %s / %s (%s) | %.4f / %s; %.4f / %s | %s / %s | %s / %s | %s / %s |\n", g, kk[4], xg[k], xd[k], c[k], gc[g],
      (gc[g] > 0 ? sprintf("%.2f", c[k] / gc[g]) : "–"), c[k] - ks[k], ks[k], gc[g] - gk[g], gk[g], b[k], gb[g], p50[k], gp50[g], p99[k], gp99[g] }
}' "$OUT/overhead.md" >"$OUT/verdict.md"

# --- the same against the baseline whose engines send the same bytes ---------
# A tracked stream (every infera* stream but infera-nomig's) and every *-ids
# target ask the engines for token ids: their engines send more bytes (6,744
# against 3,888 a 16-token stream) and work more for it. nginx-ids is nginx
# with its client asking for the same ids, so against it only the proxy
# differs. Per cell: req/s × nginx-ids (per repeat, medians), proxy CPU a
# request against nginx-ids' (medians), and the user / kernel split.
awk -F'\t' -v targets="$TARGETS" "$stats_awk"'
function spread(s, fmt,   a, n) { n = sortv(s, a); if (!n) return "–"; return sprintf(fmt " (" fmt "–" fmt ")", med(s), a[1], a[n]) }
NR > 1 && $3 !~ /^r/ {
  cell = $1 SUBSEP $2 SUBSEP $3; k = cell SUBSEP $5; r = cell SUBSEP $4
  if (!(cell in seen)) { seen[cell] = 1; order[++nc] = cell }
  if (!(r in repseen)) { repseen[r] = 1; reps[cell] = reps[cell] " " $4 }
  if ($6 > 0) { cpu[k] = cpu[k] " " ($11 * 1000 / $6); sys[k] = sys[k] " " ($13 * 1000 / $6) }
  R[r SUBSEP $5] = $7; ran[$5] = 1
}
END {
  if (!("nginx-ids" in ran)) exit
  nt = split(targets, T, " "); rows = 0
  for (c = 1; c <= nc; c++) {
    cell = order[c]; split(cell, parts, SUBSEP); g = cell SUBSEP "nginx-ids"
    if (!(g in cpu)) continue
    nr = split(reps[cell], RP, " ")
    for (t = 1; t <= nt; t++) {
      if (T[t] !~ /^infera/) continue
      if (!(T[t] ~ /-ids$/ || (parts[2] == "stream" && T[t] !~ /^infera-nomig/))) continue
      k = cell SUBSEP T[t]
      if (!(k in cpu)) continue
      xg = ""
      for (i = 1; i <= nr; i++) { r = cell SUBSEP RP[i]
        if ((r SUBSEP T[t]) in R && (r SUBSEP "nginx-ids") in R && R[r SUBSEP "nginx-ids"] > 0) xg = xg " " (R[r SUBSEP T[t]] / R[r SUBSEP "nginx-ids"]) }
      if (!rows++) {
        print ""
        print "Against the same engine bytes (targets whose engines send token ids, against nginx-ids; medians, min–max):"
        print ""
        print "| cell | target | req/s × nginx-ids | proxy CPU / 1k: target / nginx-ids (ratio) | of it user / kernel: target; nginx-ids |"
        print "|---|---|---:|---:|---:|"
      }
      c1 = med(cpu[k]); g1 = med(cpu[g]); s1 = med(sys[k]); gs = med(sys[g])
      printf "| %s %s %s | %s | %s | %.4f / %.4f (%s) | %.4f / %.4f; %.4f / %.4f |\n", parts[1], parts[2], parts[3], T[t],
        (xg != "" ? spread(xg, "%.2f") : "–"), c1, g1, (g1 > 0 ? sprintf("%.2f", c1 / g1) : "–"), c1 - s1, s1, g1 - gs, gs
    }
  }
}' "$RESULTS" >>"$OUT/verdict.md"

# --- added latency at concurrency 1 (acceptance: every infera* ≤ nginx) -----
# Per repeat, a target's p50/p99 minus the same repeat's baseline cell;
# medians (min–max) over the repeats. The first table takes direct and nginx
# for every target; the second (when direct-ids and nginx-ids ran) the pair
# whose engines send the target's bytes: ids for a tracked stream (an infera*
# stream, infera-nomig's excepted) and for every *-ids target.
awk -F'\t' -v targets="$TARGETS" "$stats_awk"'
function spread(s,   a, n) { n = sortv(s, a); if (!n) return "–"; return sprintf("%+.3f (%+.3f–%+.3f)", med(s), a[1], a[n]) }
# added(cell, t, base): space-separated per-repeat "+p50" into A50, "+p99" into
# A99 (globals) of t against base in cell; false when no repeat has both.
function added(cell, t, base,   nr, RP, i, r) {
  A50 = ""; A99 = ""; nr = split(reps[cell], RP, " ")
  for (i = 1; i <= nr; i++) { r = cell SUBSEP RP[i]
    if ((r SUBSEP t) in P50 && (r SUBSEP base) in P50) { A50 = A50 " " (P50[r SUBSEP t] - P50[r SUBSEP base]); A99 = A99 " " (P99[r SUBSEP t] - P99[r SUBSEP base]) } }
  return A50 != ""
}
# row(cell, t, direct, nginx, label): one table row, t and nginx both against direct.
function row(cell, t, dt, ng, label,   parts, a50, a99, g50, g99, ok) {
  if (!added(cell, t, dt)) return
  a50 = A50; a99 = A99; g50 = ""; g99 = ""
  if (added(cell, ng, dt)) { g50 = A50; g99 = A99 }
  ok = (g50 == "" ? "–" : ((med(a50) <= med(g50) ? "yes" : "no") ", " (med(a99) <= med(g99) ? "yes" : "no")))
  split(cell, parts, SUBSEP)
  printf "| %s | %s | %s |%s %s | %s | %s | %s | %s |\n", parts[1], parts[2], t, label, spread(a50), spread(a99), spread(g50), spread(g99), ok
}
NR > 1 && $3 == "1" {
  cell = $1 SUBSEP $2; r = cell SUBSEP $4
  if (!(cell in seen)) { seen[cell] = 1; order[++nc] = cell }
  if (!(r in repseen)) { repseen[r] = 1; reps[cell] = reps[cell] " " $4 }
  P50[r SUBSEP $5] = $8; P99[r SUBSEP $5] = $9; ran[$5] = 1
}
END {
  if (!nc) exit
  nt = split(targets, T, " ")
  print ""
  print "Added latency at concurrency 1 (ms, target − direct of the same repeat; medians, min–max):"
  print ""
  print "| client | mode | target | +p50 ms | +p99 ms | nginx +p50 ms | nginx +p99 ms | ≤ nginx (p50, p99) |"
  print "|---|---|---|---:|---:|---:|---:|---|"
  for (c = 1; c <= nc; c++)
    for (t = 1; t <= nt; t++) if (T[t] ~ /^infera/) row(order[c], T[t], "direct", "nginx", "")
  if (!("direct-ids" in ran && "nginx-ids" in ran)) exit
  print ""
  print "Added latency at concurrency 1 with the same engine bytes (ms; engine bytes ids: target − direct-ids against"
  print "nginx-ids − direct-ids, plain: target − direct against nginx − direct; same repeat; medians, min–max):"
  print ""
  print "| client | mode | target | engine bytes | +p50 ms | +p99 ms | nginx same bytes +p50 ms | +p99 ms | ≤ nginx (p50, p99) |"
  print "|---|---|---|---|---:|---:|---:|---:|---|"
  for (c = 1; c <= nc; c++) {
    split(order[c], parts, SUBSEP)
    for (t = 1; t <= nt; t++) {
      if (T[t] !~ /^infera/) continue
      if (T[t] ~ /-ids$/ || (parts[2] == "stream" && T[t] !~ /^infera-nomig/)) row(order[c], T[t], "direct-ids", "nginx-ids", " ids |")
      else row(order[c], T[t], "direct", "nginx", " plain |")
    }
  }
}' "$RESULTS" >>"$OUT/verdict.md"

# --- SYSCALLS=1: system calls a request, by kind ------------------------------
# Medians over the repeats of each kind's count a request (the runs under perf
# stat, not the measured ones). read / write: Go's read and write, nginx's
# recvfrom and writev; "found nothing": reads that returned EAGAIN; polls:
# epoll_pwait (Go) or epoll_wait (nginx), of them the ones that brought no
# event; other: every other system call.
if [[ -n $SYSCALLS && -s $SC_RESULTS ]]; then
  awk -F'\t' "$stats_awk"'
  function get(name,   i, kv) { for (i = 7; i <= NF; i++) { split($i, kv, "="); if (kv[1] == name) return kv[2] + 0 } return 0 }
  function add(k, name, v) { if (!((k, name) in V)) V[k, name] = ""; V[k, name] = V[k, name] " " v }
  $6 > 0 {
    k = $2 " " $3 SUBSEP $5; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
    r = $6; rd = get("read") + get("recvfrom"); wr = get("write") + get("writev"); po = get("epoll_pwait") + get("epoll_wait")
    add(k, "all", get("all") / r); add(k, "read", rd / r); add(k, "eagain", (get("read_empty") + get("recvfrom_empty")) / r)
    add(k, "write", wr / r); add(k, "poll", po / r); add(k, "pollempty", (get("epoll_pwait_empty") + get("epoll_wait_empty")) / r)
    add(k, "futex", get("futex") / r); add(k, "getsockopt", get("getsockopt") / r); add(k, "connect", get("connect") / r)
    add(k, "other", (get("all") - rd - wr - po - get("futex") - get("getsockopt") - get("connect")) / r)
    add(k, "cs", get("context-switches") / r); add(k, "wake", get("wakeup") / r); add(k, "mig", get("cpu-migrations") / r)
  }
  END {
    print ""
    print "System calls a request (SYSCALLS=1: each wrk cell once more under perf stat, on the proxy'"'"'s process(es); medians over the repeats):"
    print ""
    print "| cell | target | all | read (found nothing) | write | epoll (brought nothing) | futex | getsockopt | connect | other | context switches | wake-ups made | CPU migrations |"
    print "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= n; i++) { k = order[i]; split(k, kk, SUBSEP)
      printf "| wrk %s | %s | %.2f | %.2f (%.2f) | %.2f | %.2f (%.2f) | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", kk[1], kk[2],
        med(V[k, "all"]), med(V[k, "read"]), med(V[k, "eagain"]), med(V[k, "write"]), med(V[k, "poll"]), med(V[k, "pollempty"]),
        med(V[k, "futex"]), med(V[k, "getsockopt"]), med(V[k, "connect"]), med(V[k, "other"]), med(V[k, "cs"]), med(V[k, "wake"]), med(V[k, "mig"]) }
  }' "$SC_RESULTS" >>"$OUT/verdict.md"
fi

cpus=$(nproc)
cat <<SUMMARY

Router overhead — $(date -u +%Y-%m-%dT%H:%MZ), $(uname -m), $cpus CPUs, infera $("$BIN" version | awk '{print $2}')${BASE_DESC:+, infera-base $BASE_DESC}
command: $COMMAND
load (1/5/15 min, /proc/loadavg): before $LOAD_BEFORE; after $LOAD_AFTER
etcd: $ETCD; random workload, $INPUT_LEN-word prompts, $OUTPUT_LEN output tokens, $DURATION per cell, $REPEATS interleaved repeat(s),
medians (min–max); conc r<N>: \`infera bench --rate N\` (open loop); $SIMS × \`infera sim $SIM_ARGS\`;
direct = the client spreads requests over them itself (wrk: one wrk per simulator, connections split, req/s summed,
latency averaged); latency = end-to-end (ms); proxy CPU = utime+stime of the proxy (nginx: master + workers),
its kernel part = stime (the user part in the verdict is the medians' difference);
box CPU = the machine's busy time (/proc/stat); box − direct = that minus the same repeat's direct cell.
SUMMARY
if [[ " $TARGETS " == *" infera-pd "* ]]; then
  cat <<PD
infera-pd: serve in front of its own $PD_PAIRS prefill + decode pair(s) of \`infera sim --pd-role … --pd-protocol $PD_PROTOCOL\`
(etcd prefix $PD_PREFIX, two engine exchanges a request); there is no direct or nginx PD path, so its × direct,
× nginx and box − direct compare with the same one-exchange cells as every target (the prefill leg's engine
and KV-transfer work included); its proxy CPU is the router's alone.
PD
fi
echo
cat "$OUT/overhead.md"
cat "$OUT/verdict.md"
[[ $OUT != "$WORK"/* || -n ${KEEP:-} ]] && log "reports: $OUT"
exit 0
