#!/usr/bin/env bash
# Starts the Kinesis emulator the tests of `dedup redrive kinesis` talk to
# (DESIGN.md §10), idempotently: kinesalite 3.3.3 from npm, installed once
# into .cache/kinesalite (git-ignored) and run in memory in the background on
# 127.0.0.1:$KINESALITE_PORT (default 4569), with its pid file and log in
# .cache. If something already answers on the port, it is left alone. Stop
# it with `make stop-services`.
#
# Pinned: 3.3.3 is the last release; it runs on Node 20. Installed without
# its install scripts: they build leveldown, which only a store on disk
# (--path) needs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache"
DIR="$CACHE/kinesalite"
PORT="${KINESALITE_PORT:-4569}"
VERSION="3.3.3"
NAME="kinesalite"
# shellcheck source=npm-service.sh
source "$ROOT/scripts/npm-service.sh"

mkdir -p "$CACHE"
if answers; then
	log "something already answers on 127.0.0.1:$PORT; not starting another"
	exit 0
fi
NPM_IGNORE_SCRIPTS=1 npm_install kinesalite "$VERSION"
# Its cli.js listens on every interface; this listens on loopback only, and
# makes a stream ACTIVE at once rather than after 500 ms.
cat >"$DIR/serve.js" <<'JS'
const port = Number(process.argv[2]);
const opts = { createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0 };
const server = require("kinesalite")(opts).listen(port, "127.0.0.1", () => {
  console.log("kinesalite listening on 127.0.0.1:%d", server.address().port);
});
JS
log "starting kinesalite $VERSION on 127.0.0.1:$PORT (in memory)"
cd "$DIR"
# Backgrounding node alone (not a list) makes $! its own pid.
nohup node serve.js "$PORT" >"$CACHE/kinesalite.log" 2>&1 </dev/null &
started $!
