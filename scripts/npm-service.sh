# Shared by the scripts that run an npm package as a local service
# (fauxqs.sh, local-aws-sqs.sh); sourced, not run. The caller sets NAME (for
# messages), PORT, DIR (the install directory under .cache) and CACHE.

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# answers: any HTTP answer on 127.0.0.1:$PORT will do (SQS emulators reply
# to a bare GET).
answers() {
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

# npm_install PACKAGE VERSION: installs the exact version into $DIR, once;
# NPM_IGNORE_SCRIPTS=1 skips the packages' install scripts.
npm_install() {
	if [[ "$(node -p "require('$DIR/node_modules/$1/package.json').version" 2>/dev/null)" == "$2" ]]; then
		return
	fi
	command -v npm >/dev/null || die "npm is required (Debian: apt-get install -y nodejs npm)"
	log "installing $1@$2 into $DIR"
	mkdir -p "$DIR"
	[[ -f "$DIR/package.json" ]] || echo '{"private":true}' >"$DIR/package.json"
	local flags=(--silent --no-audit --no-fund --save-exact)
	[[ "${NPM_IGNORE_SCRIPTS:-}" == 1 ]] && flags+=(--ignore-scripts)
	(cd "$DIR" && npm install "${flags[@]}" "$1@$2" >/dev/null)
}

# started PID: records PID and waits for the service to answer.
started() {
	echo "$1" >"$CACHE/$NAME.pid"
	if ! wait_answers "$1"; then
		tail -20 "$CACHE/$NAME.log" >&2 || true
		die "$NAME did not answer on 127.0.0.1:$PORT (log: $CACHE/$NAME.log)"
	fi
	log "$NAME ready on 127.0.0.1:$PORT (pid $1)"
}
