.PHONY: services stop-services test

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

test: services
	go test -race -count=1 ./...
