#!/usr/bin/env bash
# Starts the second SQS emulator the tests run against (docs/testing.md),
# idempotently: local-aws-sqs 2.0.2 from npm, installed once into
# .cache/local-aws-sqs (git-ignored) and run in the background on
# 127.0.0.1:$LOCAL_AWS_SQS_PORT (default 4567), with its pid file and log in
# .cache. If something already answers on the port, it is left alone. Stop it
# with `make stop-services`.
#
# Known divergences from real SQS, which the tests found (docs/testing.md):
# system attributes are returned only for the older AttributeNames parameter;
# FIFO queues do not hold a group back while one of its messages is in flight.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache"
NAME="local-aws-sqs"
DIR="$CACHE/local-aws-sqs"
PORT="${LOCAL_AWS_SQS_PORT:-4567}"
VERSION="2.0.2"
# shellcheck source=npm-service.sh
source "$ROOT/scripts/npm-service.sh"

mkdir -p "$CACHE"
if answers; then
	log "something already answers on 127.0.0.1:$PORT; not starting another"
	exit 0
fi
npm_install local-aws-sqs "$VERSION"
log "starting local-aws-sqs $VERSION on 127.0.0.1:$PORT"
cd "$DIR"
# Queues are made with unique names, so AWS's 60 s wait before a deleted
# queue's name can be reused is not emulated.
PORT="$PORT" nohup node -e '
require("local-aws-sqs")
	.createSqsServer({ port: Number(process.env.PORT), hostname: "127.0.0.1", emulateQueueCreationLifecycle: false })
	.catch((err) => { console.error(err); process.exit(1); });
' >"$CACHE/local-aws-sqs.log" 2>&1 </dev/null &
started $!
