#!/usr/bin/env bash
# Starts the SQS emulator the tests talk to (DESIGN.md §10), idempotently:
# fauxqs 1.9.2 from npm, installed once into .cache/fauxqs (git-ignored) and
# run in the background on 127.0.0.1:$FAUXQS_PORT (default 4566), with its pid
# file and log in .cache. If something already answers on the port, it is
# left alone. Stop it with: kill "$(cat .cache/fauxqs.pid)".
#
# Pinned: fauxqs 2.x needs Node 22. Known divergences from real SQS, which no
# test may rely on: DeleteMessageBatch reports a bogus receipt handle as
# deleted; a FIFO receive returns one message per group.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache"
DIR="$CACHE/fauxqs"
PORT="${FAUXQS_PORT:-4566}"
VERSION="1.9.2"

log() { echo "fauxqs: $*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

answers() {
	# Any HTTP answer will do: the emulator replies to a bare GET.
	curl -s -o /dev/null -m 2 "http://127.0.0.1:$PORT/"
}

# wait_answers PID: waits up to 30 s for an answer, failing early if PID exits.
wait_answers() {
	local i
	for ((i = 0; i < 60; i++)); do
		answers && return 0
		kill -0 "$1" 2>/dev/null || return 1
		sleep 0.5
	done
	return 1
}

install() {
	if [[ "$(node -p "require('$DIR/node_modules/fauxqs/package.json').version" 2>/dev/null)" == "$VERSION" ]]; then
		return
	fi
	command -v npm >/dev/null || die "npm is required (Debian: apt-get install -y nodejs npm)"
	log "installing fauxqs@$VERSION into $DIR"
	mkdir -p "$DIR"
	[[ -f "$DIR/package.json" ]] || echo '{"private":true}' >"$DIR/package.json"
	(cd "$DIR" && npm install --silent --no-audit --no-fund --save-exact "fauxqs@$VERSION" >/dev/null)
}

# The emulator listens on every interface; this preload binds it to loopback.
write_preload() {
	cat >"$DIR/loopback.js" <<'JS'
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number") {
    if (typeof args[1] === "function" || args[1] === undefined) {
      args.splice(1, 0, "127.0.0.1");
    } else if (typeof args[1] === "string") {
      args[1] = "127.0.0.1";
    }
  } else if (args[0] && typeof args[0] === "object" && args[0].path === undefined) {
    args[0] = { ...args[0], host: "127.0.0.1" };
  }
  return listen.apply(this, args);
};
JS
}

mkdir -p "$CACHE"
if answers; then
	log "something already answers on 127.0.0.1:$PORT; not starting another"
	exit 0
fi
install
write_preload
log "starting fauxqs $VERSION on 127.0.0.1:$PORT"
cd "$DIR"
# Backgrounding node alone (not a list) makes $! its own pid.
FAUXQS_PORT="$PORT" FAUXQS_LOGGER=false nohup node -r ./loopback.js node_modules/fauxqs/dist/cli.js \
	>"$CACHE/fauxqs.log" 2>&1 </dev/null &
echo $! >"$CACHE/fauxqs.pid"
if ! wait_answers "$!"; then
	tail -20 "$CACHE/fauxqs.log" >&2 || true
	die "fauxqs did not answer on 127.0.0.1:$PORT (log: $CACHE/fauxqs.log)"
fi
log "fauxqs ready on 127.0.0.1:$PORT"
