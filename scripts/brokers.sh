#!/usr/bin/env bash
# Checks that the message brokers the tests talk to answer, and starts each
# one that does not with the machine's own command: RabbitMQ on
# 127.0.0.1:5672 (guest/guest) and NATS with JetStream on 127.0.0.1:4222.
# Unlike the emulators, these are the machine's services (installed from
# Debian's packages, with apt-get when missing, saying so first;
# DEDUP_NO_APT=1 stops instead), so `make stop-services` leaves them alone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NAME=brokers
# shellcheck source=lib.sh
source "$ROOT/scripts/lib.sh"

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

if rabbitmq_answers 2>/dev/null; then
	log "RabbitMQ already answers on 127.0.0.1:5672"
else
	command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server "RabbitMQ is not installed"
	log "starting RabbitMQ (rabbitmq-server -detached)"
	rabbitmq-server -detached || true
	wait_for 90 rabbitmq_answers || die "RabbitMQ does not answer on 127.0.0.1:5672"
	log "RabbitMQ ready on 127.0.0.1:5672"
fi

if nats_answers 2>/dev/null; then
	log "NATS with JetStream already answers on 127.0.0.1:4222"
else
	command -v nats-server >/dev/null || apt_install nats-server "NATS is not installed"
	log "starting NATS with JetStream"
	mkdir -p /var/lib/nats-server
	start-stop-daemon --start --oknodo --background --exec "$(command -v nats-server)" -- \
		-a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
	wait_for 30 nats_answers || die "NATS with JetStream does not answer on 127.0.0.1:4222"
	log "NATS with JetStream ready on 127.0.0.1:4222"
fi
