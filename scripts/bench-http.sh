#!/usr/bin/env bash
# Measures idemhttp's rows against the bare handler, each row run between
# two runs of the bare handler by the same test binary, so that a drift of
# the machine between rows does not pass for a difference of the code
# (BENCHMARKS.md, "HTTP Idempotency-Key middleware"). Give one or more
# test binaries (go test -c -o NAME ./idemhttp) to alternate them, for
# example the build before a change and after it:
#
#	scripts/bench-http.sh /tmp/before.test /tmp/after.test
#
# Each line: round, binary, row, ratio to the mean of its two bare runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../idemhttp"
rows="${ROWS:-memory/new memory/replay memory/replay-nocache redis/new redis/replay redis/replay-nocache}"
rounds="${ROUNDS:-3}"
rps() {
	"$1" -test.run '^$' -test.bench "BenchmarkIdempotency/$2\$" -test.benchtime "${3}x" -test.count 1 2>&1 |
		awk '/^Benchmark/ { for (i = 1; i <= NF; i++) if ($(i + 1) == "req/s") print $i }'
}
for ((r = 1; r <= rounds; r++)); do
	for row in $rows; do
		n=60000
		case $row in */new | *-nocache) n=30000 ;; esac
		for bin in "$@"; do
			b1=$(rps "$bin" bare 60000)
			x=$(rps "$bin" "$row" "$n")
			b2=$(rps "$bin" bare 60000)
			awk -v r="$r" -v bin="$bin" -v row="$row" -v x="$x" -v b1="$b1" -v b2="$b2" \
				'BEGIN { printf "%s %s %-24s %.3f (row %d req/s, bare %d and %d)\n", r, bin, row, x / ((b1 + b2) / 2), x, b1, b2 }'
		done
	done
done
