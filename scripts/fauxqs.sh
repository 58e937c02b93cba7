#!/usr/bin/env bash
# Starts the SQS emulator the tests talk to (DESIGN.md §10), idempotently:
# fauxqs 1.9.2 from npm, installed once into .cache/fauxqs (git-ignored) and
# run in the background on 127.0.0.1:$FAUXQS_PORT (default 4566), with its pid
# file and log in .cache. If something already answers on the port, it is
# left alone. Stop it with `make stop-services`.
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
NAME="fauxqs"
# shellcheck source=npm-service.sh
source "$ROOT/scripts/npm-service.sh"

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
npm_install fauxqs "$VERSION"
write_preload
log "starting fauxqs $VERSION on 127.0.0.1:$PORT"
cd "$DIR"
# Backgrounding node alone (not a list) makes $! its own pid.
FAUXQS_PORT="$PORT" FAUXQS_LOGGER=false nohup node -r ./loopback.js node_modules/fauxqs/dist/cli.js \
	>"$CACHE/fauxqs.log" 2>&1 </dev/null &
started $!
