package redisstore

import (
	"strings"

	"github.com/dedupkit/dedup"
)

// DefaultKeyPrefix starts every key a [Store] writes unless [WithKeyPrefix]
// gives another.
const DefaultKeyPrefix = "dedup:"

// escapes holds, for each byte that key parts escape, its escape: % starts
// an escape, a colon separates scope and event ID, braces would end or
// start a hash tag.
var escapes = [256]string{'%': "%25", ':': "%3A", '{': "%7B", '}': "%7D"}

// escapedLen returns the length of s escaped.
func escapedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if escapes[s[i]] != "" {
			n += 2 // an escape is 3 bytes for 1
		}
	}
	return n
}

// writeEscaped writes s escaped to b.
func writeEscaped(b *strings.Builder, s string) {
	last := 0
	for i := 0; i < len(s); i++ {
		if e := escapes[s[i]]; e != "" {
			b.WriteString(s[last:i])
			b.WriteString(e)
			last = i + 1
		}
	}
	b.WriteString(s[last:])
}

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
	b.Grow(len(prefix) + escapedLen(k.Scope) + escapedLen(k.EventID) + 3)
	b.WriteString(prefix)
	b.WriteByte('{')
	writeEscaped(&b, k.Scope)
	b.WriteByte(':')
	writeEscaped(&b, k.EventID)
	b.WriteByte('}')
	return b.String()
}
