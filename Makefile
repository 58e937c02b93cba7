.PHONY: services stop-services test check fuzz

# The second SQS emulator's port (scripts/local-aws-sqs.sh); fauxqs is on 4566.
export LOCAL_AWS_SQS_PORT ?= 4567

services:
	scripts/services.sh

# Stops what scripts/services.sh started (PostgreSQL is the machine's own):
# each pid file's process, if it still is the service it names.
stop-services:
	@for svc in dynamodb:DynamoDBLocal fauxqs:fauxqs local-aws-sqs:local-aws-sqs redis:redis-server kinesalite:serve.js; do \
		name="$${svc%%:*}"; pattern="$${svc#*:}"; file=".cache/$$name.pid"; \
		[ -f "$$file" ] || continue; \
		pid="$$(cat "$$file")"; \
		if ps -p "$$pid" -o args= | grep -q -- "$$pattern"; then \
			kill "$$pid" && echo "stopped $$name (pid $$pid)"; \
		fi; \
		rm -f "$$file"; \
	done

# go test's timeout, per package. Its default, 10 minutes, is too close to
# what reliability/ takes beside another suite on two cores (7 to 9 minutes,
# more at a load average of 15): the campaigns bound their own waits, so
# this one only catches a package that hangs.
TEST_TIMEOUT ?= 30m

# Everything against fauxqs, then the SQS adapter and the SQS campaigns
# again against local-aws-sqs, a second, independent emulator: a test tuned
# to one emulator's quirks fails on the other (docs/testing.md, "Two SQS
# emulators"). The second run checks portability, not data races: the first
# ran the same code under -race, and local-aws-sqs, which scans its whole
# queue on every call, leaves the crash campaign too little CPU for -race on
# a busy two-core machine.
test: services
	go test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
	DEDUP_SQS_ENDPOINT=http://127.0.0.1:$(LOCAL_AWS_SQS_PORT) DEDUP_SQS_EMULATOR=local-aws-sqs \
		go test -count=1 -timeout $(TEST_TIMEOUT) ./adapters/sqsdedup ./reliability/sqs

# The edit-test loop: every package's tests but the crash and outage
# campaigns of reliability/ (make test runs those too, as CI does).
check: services
	go test -race -count=1 -timeout $(TEST_TIMEOUT) $$(go list ./... | grep -v /reliability)

# A short run of each fuzz target beyond its committed seed corpus. A count
# of executions, not a duration: with a duration, Go's fuzz coordinator
# (1.26) can report "context deadline exceeded" as a failure at the end of
# the window on a loaded machine (golang/go#75804, fixed in Go 1.27).
FUZZTIME ?= 30000x
fuzz:
	go test -run '^$$' -fuzz '^FuzzJSONFingerprint$$' -fuzztime $(FUZZTIME) .
	go test -run '^$$' -fuzz '^FuzzKeyValidate$$' -fuzztime $(FUZZTIME) .
	go test -run '^$$' -fuzz '^FuzzSinkInput$$' -fuzztime $(FUZZTIME) ./adapters/sqsdedup
	go test -run '^$$' -fuzz '^FuzzSnapshot$$' -fuzztime $(FUZZTIME) ./idemhttp
	go test -run '^$$' -fuzz '^FuzzKeyField$$' -fuzztime $(FUZZTIME) ./idemhttp
