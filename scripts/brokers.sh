#!/usr/bin/env bash
# Checks that the message brokers the tests talk to answer, and starts each
# one that does not with the machine's own command: RabbitMQ on
# 127.0.0.1:5672 (guest/guest) and NATS with JetStream on 127.0.0.1:4222.
# Unlike the emulators, these are the machine's services (installed from
# Debian's packages, with apt-get when missing, saying so first;
# DEDUP_NO_APT=1 stops instead), so `make stop-services` leaves them alone.
set -euo pipefail

log() { echo "brokers: $*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

install() { # PACKAGE COMMAND
	command -v "$2" >/dev/null && return
	if [[ "${DEDUP_NO_APT:-}" == 1 ]]; then
		die "$2 is not installed: install it (apt-get install $1) or unset DEDUP_NO_APT to let this script do it"
	fi
	log "$2 is not installed: installing it system-wide with apt-get install $1 (set DEDUP_NO_APT=1 to stop instead)"
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
}

# rabbitmq_answers: the AMQP 0-9-1 protocol header gets a method frame
# (Connection.Start) back.
rabbitmq_answers() {
	local first
	exec 3<>/dev/tcp/127.0.0.1/5672 || return 1
	printf 'AMQP\x00\x00\x09\x01' >&3
	first="$(timeout 2 head -c 1 <&3 | od -An -tu1 | tr -d ' ')"
	exec 3<&- 3>&-
	[[ "$first" == 1 ]]
}

# nats_answers: the server's INFO line says JetStream is on.
nats_answers() {
	local info
	exec 3<>/dev/tcp/127.0.0.1/4222 || return 1
	read -r -t 2 info <&3 || info=""
	exec 3<&- 3>&-
	[[ "$info" == INFO* && "$info" == *'"jetstream":true'* ]]
}

wait_for() { # SECONDS NAME CHECK
	local i
	for ((i = 0; i < $1 * 2; i++)); do
		if "$3" 2>/dev/null; then
			log "$2 ready"
			return 0
		fi
		sleep 0.5
	done
	die "$2 did not answer within $1 s"
}

if rabbitmq_answers 2>/dev/null; then
	log "RabbitMQ already answers on 127.0.0.1:5672"
else
	install rabbitmq-server rabbitmq-server
	log "starting RabbitMQ (rabbitmq-server -detached)"
	rabbitmq-server -detached || true
	wait_for 90 "RabbitMQ on 127.0.0.1:5672" rabbitmq_answers
fi

if nats_answers 2>/dev/null; then
	log "NATS with JetStream already answers on 127.0.0.1:4222"
else
	install nats-server nats-server
	log "starting NATS with JetStream"
	mkdir -p /var/lib/nats-server
	start-stop-daemon --start --oknodo --background --exec "$(command -v nats-server)" -- \
		-a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
	wait_for 30 "NATS with JetStream on 127.0.0.1:4222" nats_answers
fi
