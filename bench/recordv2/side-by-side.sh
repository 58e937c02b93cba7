#!/usr/bin/env bash
# Record v1 against record v2 in one sitting (issue 40, part 4): runs
# dedupbench built on each, alternated, each on tables of its own, and prints
# their rows.
#
#   bench/recordv2/side-by-side.sh build          # build both binaries (below)
#   bench/recordv2/side-by-side.sh [rounds] [dedupbench flags...]
#
# e.g. bench/recordv2/side-by-side.sh 2 -quick -records 0,1000000 -purge
#
# The binaries: $V1 (default /tmp/dedupbench-v1), built from a worktree at
# 0f89898, the last v1 store, with the bench-v2 branch's cmd/dedupbench
# cherry-picked ($V1_TREE, default /work/wt/bench-v1); $V2 (default
# /tmp/dedupbench-v2), built from this checkout, which must hold the v2 store.
# The v1 side's tables are named dbv1_*, the v2 side's dbv2_* (-tables): a v2
# binary would migrate a v1 table it was pointed at, and a v1 binary fails on
# a v2 one. The kept tables (-records, -purge) stay between runs, so that
# only the first run of each side builds them. Every run's output and JSON go
# to $OUT (default /tmp/recordv2-side-by-side); the script checks that the v1
# side's store tables are v1 and the v2 side's v2. $TABLES_SUFFIX is added to
# both prefixes: kept tables are grown or cut to the size asked, so runs at
# 10,000,000 records keep tables of their own apart from runs at 1,000,000.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
V1="${V1:-/tmp/dedupbench-v1}"
V2="${V2:-/tmp/dedupbench-v2}"
V1_TREE="${V1_TREE:-/work/wt/bench-v1}"
OUT="${OUT:-/tmp/recordv2-side-by-side}"
DEFAULT_ROWS="batch-claim,inbox,floor"

if [[ "${1:-}" == build ]]; then
	(cd "$V1_TREE" && go build -o "$V1" ./cmd/dedupbench)
	(cd "$ROOT" && go build -o "$V2" ./cmd/dedupbench)
	echo "built $V1 ($(git -C "$V1_TREE" log --oneline -1)) and $V2 ($(git -C "$ROOT" log --oneline -1))"
	exit 0
fi

rounds=1
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then
	rounds="$1"
	shift
fi
args=("$@")
if [[ " ${args[*]-} " != *" -rows "* ]]; then
	args+=(-rows "$DEFAULT_ROWS")
fi
for bin in "$V1" "$V2"; do
	[[ -x "$bin" ]] || { echo "no $bin: run $0 build" >&2; exit 1; }
done
mkdir -p "$OUT"

# run SIDE BINARY ROUND: one dedupbench run, its table printed and its
# tables' shapes checked.
run() {
	local side="$1" bin="$2" round="$3"
	local base="$OUT/$side-round$round"
	echo "== $side, round $round: load average $(cut -d' ' -f1-3 /proc/loadavg)"
	"$bin" "${args[@]}" -tables "db$side${TABLES_SUFFIX:-}" -json "$base.json" >"$base.txt" 2>"$base.err" || {
		echo "$side round $round failed; see $base.err" >&2
		tail -5 "$base.err" >&2
		return 1
	}
	grep '^built ' "$base.txt" || true
	sed -n '/^ *row /,/^$/p' "$base.txt"
	local wrong
	wrong="$(jq -r --arg side "$side" '.results[] | select(.table_shape != null and .table_shape != "floor" and .table_shape != $side)
		| "\(.row) at \(.table_records): \(.table_shape)"' "$base.json")"
	if [[ -n "$wrong" ]]; then
		echo "$side side ran on tables of another shape: $wrong" >&2
		return 1
	fi
}

for round in $(seq 1 "$rounds"); do
	# Alternate which side goes first, so that neither always meets the
	# other's dirty pages or the machine's load of the moment.
	if ((round % 2)); then
		run v1 "$V1" "$round"
		run v2 "$V2" "$round"
	else
		run v2 "$V2" "$round"
		run v1 "$V1" "$round"
	fi
done

# One line per row, size and side: events/s of every round.
echo "== events/s by row, table size and side (every round)"
jq -rs '[.[] | .side as $s | .results[] | {k: "\(.row)\(if .purge_expired_records then "+purge" else "" end) @\(.table_records)", side: $s, v: .events_per_sec}]
	| group_by(.k)[] | "\(.[0].k): " + ([group_by(.side)[] | "\(.[0].side) " + ([.[].v | round | tostring] | join("/"))] | join("  "))' \
	<(for f in "$OUT"/v1-round*.json; do jq '. + {side: "v1"}' "$f"; done; for f in "$OUT"/v2-round*.json; do jq '. + {side: "v2"}' "$f"; done)
