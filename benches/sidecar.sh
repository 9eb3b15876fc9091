#!/usr/bin/env bash
# serve as a sidecar (`--upstream`) against nginx's TLS termination, both in front of the same
# upstream (nginx serving a small static page on loopback), with the same P-256 certificate,
# TLS 1.3, X25519, resumption off on both (`--no-resumption`; `ssl_session_cache off`,
# `ssl_session_tickets off`), the servers on one CPU and wrk on another (taskset). In one run,
# alternating ours and nginx, ROUNDS times:
#   close:      new TLS connections per second (wrk, `Connection: close`) and the proxy's CPU per
#               connection (utime + stime from /proc);
#   keep-alive: requests per second, p99 latency, the proxy's CPU per request;
#   rotating:   keep-alive with a new certificate every second (ours: the directory rotated,
#               serve follows it; nginx: the same files and `nginx -s reload` every second),
#               failed requests counted.
# The results are in BENCHMARKS.md. Installs nginx and wrk from Debian when missing.
#
#   benches/sidecar.sh                      # ROUNDS=3 DURATION=10s CONNECTIONS=32
#   ROUNDS=1 DURATION=3s benches/sidecar.sh # a quick look
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-32}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
cd "$(dirname "$0")/.."

need() { # need COMMAND PACKAGE
    command -v "$1" > /dev/null 2>&1 || [ -x "/usr/sbin/$1" ] && return
    echo "installing $2 (Debian)" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" > /dev/null
}
need nginx nginx
need wrk wrk
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

cargo build -q --release -p tls-rotation-serve --bin serve
cargo build -q --release -p examples --example rotate
SERVE=$PWD/target/release/serve
ROTATE=$PWD/target/release/examples/rotate

WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2> /dev/null || true; done
    wait 2> /dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP_PORT=$(free_port)
OURS_PORT=$(free_port)
NGINX_PORT=$(free_port)

# One P-256 certificate (rotate's leaves are P-256) signed by a CA, for both.
"$ROTATE" "$WORK/tls" --signing-ca "$WORK/ca" --name localhost --name 127.0.0.1 > /dev/null

# The upstream: a small static page.
mkdir -p "$WORK/up/html" "$WORK/nginx"
printf 'hello from the upstream\n' > "$WORK/up/html/index.html"
# nginx's workers run as another user when started by root: they must read the page.
chmod 755 "$WORK" "$WORK/up" "$WORK/up/html" && chmod 644 "$WORK/up/html/index.html"
common="worker_processes 1; daemon off; error_log stderr error;"
temp="client_body_temp_path $WORK/tmp-body; proxy_temp_path $WORK/tmp-proxy; fastcgi_temp_path $WORK/tmp-fcgi; uwsgi_temp_path $WORK/tmp-uwsgi; scgi_temp_path $WORK/tmp-scgi;"
cat > "$WORK/up/nginx.conf" << EOF
$common
pid $WORK/up/nginx.pid;
events { worker_connections 4096; }
http {
    $temp
    access_log off;
    keepalive_requests 1000000;
    server { listen 127.0.0.1:$UP_PORT; root $WORK/up/html; }
}
EOF
cat > "$WORK/nginx/nginx.conf" << EOF
$common
pid $WORK/nginx/nginx.pid;
events { worker_connections 4096; }
http {
    $temp
    access_log off;
    keepalive_requests 1000000;
    upstream app { server 127.0.0.1:$UP_PORT; keepalive 64; }
    server {
        listen 127.0.0.1:$NGINX_PORT ssl;
        ssl_certificate $WORK/tls/tls.crt;
        ssl_certificate_key $WORK/tls/tls.key;
        ssl_protocols TLSv1.3;
        ssl_ecdh_curve X25519;
        ssl_session_cache off;
        ssl_session_tickets off;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$host;
            proxy_set_header X-Forwarded-For \$remote_addr;
            proxy_set_header X-Forwarded-Proto https;
        }
    }
}
EOF
taskset -c "$SERVER_CPU" "$NGINX" -p "$WORK/up" -c "$WORK/up/nginx.conf" &
PIDS+=($!)

wait_port() { for _ in $(seq 100); do (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null && return; sleep 0.1; done; echo "nothing on port $1" >&2; exit 1; }
wait_port "$UP_PORT"

# CPU seconds used so far by a process, its threads, and its children (reaped or alive).
cpu_ticks() { # cpu_ticks PID
    local pid=$1 total=0 child
    total=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$pid/stat")
    for child in $(pgrep -P "$pid" || true); do
        total=$((total + $(awk '{print $14 + $15}' "/proc/$child/stat" 2> /dev/null || echo 0)))
    done
    echo "$total"
}
TCK=$(getconf CLK_TCK)

start_ours() {
    RUST_LOG=warn taskset -c "$SERVER_CPU" "$SERVE" --listen "127.0.0.1:$OURS_PORT" --cert-dir "$WORK/tls" \
        --poll 200ms --no-resumption --upstream "127.0.0.1:$UP_PORT" > /dev/null 2> "$WORK/ours.log" &
    SERVER_PID=$!
    wait_port "$OURS_PORT"
    PORT=$OURS_PORT
}
start_nginx() {
    taskset -c "$SERVER_CPU" "$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" 2> "$WORK/nginx.log" &
    SERVER_PID=$!
    wait_port "$NGINX_PORT"
    PORT=$NGINX_PORT
}
stop_server() { kill "$SERVER_PID" 2> /dev/null || true; wait "$SERVER_PID" 2> /dev/null || true; }

# What each server negotiates with the client's library (OpenSSL, as wrk's).
negotiated() {
    echo | openssl s_client -connect "127.0.0.1:$PORT" -servername localhost 2> /dev/null \
        | awk -F': ' '/^Server Temp Key|^New, /{printf "%s; ", $0} END{print ""}'
}

# run NAME SERVER SCENARIO: one wrk run; prints "rate p99_ms cpu_us_per_request errors".
run() {
    local server=$1 scenario=$2 header=() rotating=()
    "start_$server"
    [ "$scenario" = close ] && header=(-H "Connection: close")
    if [ "$scenario" = rotating ]; then
        "$ROTATE" "$WORK/tls" --signing-ca "$WORK/ca" --name localhost --name 127.0.0.1 --every 1s > /dev/null &
        rotating+=($!)
        if [ "$server" = nginx ]; then
            (while sleep 1; do "$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -s reload 2> /dev/null; done) &
            rotating+=($!)
        fi
    fi
    local before after out
    before=$(cpu_ticks "$SERVER_PID")
    out=$(taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNECTIONS" -d"$DURATION" --latency "${header[@]}" "https://127.0.0.1:$PORT/")
    after=$(cpu_ticks "$SERVER_PID")
    for pid in "${rotating[@]}"; do kill "$pid" 2> /dev/null || true; wait "$pid" 2> /dev/null || true; done
    stop_server
    echo "$out" > "$WORK/wrk-$server-$scenario.txt"
    echo "$out" | awk -v cpu=$((after - before)) -v tck="$TCK" '
        /Requests\/sec:/ { rate = $2 }
        /^ +[0-9]+ requests in/ { n = $1 }
        /^ +99%/ { v = $2; if (v ~ /us$/) p99 = v / 1000; else if (v ~ /ms$/) p99 = v + 0; else if (v ~ /s$/) p99 = v * 1000 }
        /Socket errors:/ { gsub(",", ""); errors += $4 + $6 + $8 + $10 }
        /Non-2xx/ { errors += $5 }
        END { printf "%.0f %.2f %.1f %d\n", rate, p99, (n ? cpu / tck / n * 1e6 : 0), errors }'
}

echo "serve vs nginx $("$NGINX" -v 2>&1 | sed 's/.*\///'), wrk -t1 -c$CONNECTIONS -d$DURATION, servers on CPU $SERVER_CPU, wrk on CPU $CLIENT_CPU, $ROUNDS rounds"
start_ours; echo "ours:  $(negotiated)"; stop_server
start_nginx; echo "nginx: $(negotiated)"; stop_server

declare -A results
for round in $(seq "$ROUNDS"); do
    for scenario in close keep-alive rotating; do
        for server in ours nginx; do
            results[$server,$scenario,$round]=$(run "$server" "$scenario")
            echo "round $round $scenario $server: ${results[$server,$scenario,$round]} (rate p99_ms cpu_us/request errors)"
        done
    done
done

echo
echo "| scenario | ours | nginx | ratio (ours/nginx) |"
echo "|---|---|---|---|"
for scenario in close keep-alive rotating; do
    for metric in 1 2 3 4; do
        name=$(echo "rate p99_ms cpu_us errors" | cut -d' ' -f$metric)
        ours="" theirs="" ratios=""
        for round in $(seq "$ROUNDS"); do
            a=$(echo "${results[ours,$scenario,$round]}" | cut -d' ' -f$metric)
            b=$(echo "${results[nginx,$scenario,$round]}" | cut -d' ' -f$metric)
            ours+="$a, " theirs+="$b, "
            ratios+=$(awk -v a="$a" -v b="$b" 'BEGIN { if (b > 0) printf "%.2f, ", a / b; else printf "-, " }')
        done
        echo "| $scenario $name | ${ours%, } | ${theirs%, } | ${ratios%, } |"
    done
done
