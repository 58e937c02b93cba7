package redisstore

import (
	"strings"

	"github.com/dedupkit/dedup"
)

// DefaultKeyPrefix starts every key a [Store] writes unless [WithKeyPrefix]
// gives another.
const DefaultKeyPrefix = "dedup:"

// keyEscaper makes scope and event ID safe inside a key: % starts an escape,
// a colon separates them, braces would end or start a hash tag.
var keyEscaper = strings.NewReplacer("%", "%25", ":", "%3A", "{", "%7B", "}", "%7D")

// redisKey returns the Redis key of k's record:
//
//	<prefix>{<scope>:<event ID>}
//
// with %, :, { and } escaped in scope and event ID as %25, %3A, %7B and %7D.
// The escaping is reversible and leaves exactly one colon between the two
// parts, so no two keys share a Redis key whatever their bytes. The braces
// are the Cluster hash tag: the slot depends on (scope, event ID) only, so
// records spread over a cluster's nodes evenly, and no brace from the input
// can open or close a tag of its own.
func redisKey(prefix string, k dedup.Key) string {
	var b strings.Builder
	b.Grow(len(prefix) + len(k.Scope) + len(k.EventID) + 3)
	b.WriteString(prefix)
	b.WriteByte('{')
	_, _ = keyEscaper.WriteString(&b, k.Scope)
	b.WriteByte(':')
	_, _ = keyEscaper.WriteString(&b, k.EventID)
	b.WriteByte('}')
	return b.String()
}
