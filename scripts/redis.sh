#!/usr/bin/env bash
# Starts the Redis the tests talk to (redisstore), idempotently: if something
# answers PING on 127.0.0.1:$DEDUP_REDIS_PORT (default 6379), it is left
# alone; otherwise redis-server starts there in the background, keeping
# nothing on disk, with its pid file and log in .cache/ (git-ignored).
# redis-server is installed with apt-get when missing, saying so first
# (DEDUP_NO_APT=1 stops instead): the tests also start private servers of
# their own (internal/testenv/redis.go).
# Stop it with `make stop-services`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache"
PORT="${DEDUP_REDIS_PORT:-6379}"

NAME=redis
# shellcheck source=lib.sh
source "$ROOT/scripts/lib.sh"

# answers: a PONG from 127.0.0.1:$PORT, through bash's /dev/tcp (no client needed).
answers() {
	local reply
	exec 3<>"/dev/tcp/127.0.0.1/$PORT" || return 1
	printf 'PING\r\n' >&3
	read -r -t 2 reply <&3 || reply=""
	exec 3<&- 3>&-
	[[ "$reply" == "+PONG"* ]]
}

if ! command -v redis-server >/dev/null; then
	apt_install redis-server "redis-server is not installed"
	log "installed $(redis-server --version | cut -d' ' -f1-3)"
fi

if answers 2>/dev/null; then
	log "Redis already answers on 127.0.0.1:$PORT; not starting another"
	exit 0
fi
mkdir -p "$CACHE/redis"
log "starting $(redis-server --version | cut -d' ' -f1-3) on 127.0.0.1:$PORT"
nohup redis-server --port "$PORT" --bind 127.0.0.1 --dir "$CACHE/redis" --save "" --appendonly no \
	--daemonize no >"$CACHE/redis.log" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$CACHE/redis.pid"
for ((i = 0; i < 60; i++)); do
	if answers 2>/dev/null; then
		log "Redis ready on 127.0.0.1:$PORT (pid $pid)"
		exit 0
	fi
	kill -0 "$pid" 2>/dev/null || break
	sleep 0.5
done
tail -20 "$CACHE/redis.log" >&2 || true
kill "$pid" 2>/dev/null || true
rm -f "$CACHE/redis.pid"
die "Redis did not answer on 127.0.0.1:$PORT within 30 s (log: $CACHE/redis.log)"
