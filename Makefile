.PHONY: services stop-services test fuzz

services:
	scripts/services.sh

# Stops what scripts/services.sh started (PostgreSQL is the machine's own).
stop-services:
	@if [ -f .cache/dynamodb.pid ]; then \
		pid="$$(cat .cache/dynamodb.pid)"; \
		if ps -p "$$pid" -o args= | grep -q DynamoDBLocal; then \
			kill "$$pid" && echo "stopped DynamoDB Local (pid $$pid)"; \
		fi; \
		rm -f .cache/dynamodb.pid; \
	fi
	@if [ -f .cache/fauxqs.pid ]; then \
		pid="$$(cat .cache/fauxqs.pid)"; \
		if ps -p "$$pid" -o args= | grep -q fauxqs; then \
			kill "$$pid" && echo "stopped fauxqs (pid $$pid)"; \
		fi; \
		rm -f .cache/fauxqs.pid; \
	fi

test: services
	go test -race -count=1 ./...

# A short run of each fuzz target beyond its committed seed corpus.
FUZZTIME ?= 10s
fuzz:
	go test -run '^$$' -fuzz '^FuzzJSONFingerprint$$' -fuzztime $(FUZZTIME) .
	go test -run '^$$' -fuzz '^FuzzKeyValidate$$' -fuzztime $(FUZZTIME) .
	go test -run '^$$' -fuzz '^FuzzSinkInput$$' -fuzztime $(FUZZTIME) ./adapters/sqsdedup
	go test -run '^$$' -fuzz '^FuzzSnapshot$$' -fuzztime $(FUZZTIME) ./idemhttp
	go test -run '^$$' -fuzz '^FuzzKeyField$$' -fuzztime $(FUZZTIME) ./idemhttp
