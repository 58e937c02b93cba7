// Package pgident checks the PostgreSQL table names of the stores and the
// outbox, so that nothing but a name reaches their SQL text.
package pgident

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Parse splits name into at most a schema and a table, each a plain SQL
// identifier matching ^[A-Za-z_][A-Za-z0-9_]{0,62}$, or returns why it
// refuses name.
func Parse(name string) (pgx.Identifier, string) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, "want table or schema.table"
	}
	for _, p := range parts {
		if !valid(p) {
			return nil, fmt.Sprintf("%q is not an identifier matching ^[A-Za-z_][A-Za-z0-9_]{0,62}$", p)
		}
	}
	return pgx.Identifier(parts), ""
}

func valid(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i, c := range []byte(s) {
		letter := c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		if !letter && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}
