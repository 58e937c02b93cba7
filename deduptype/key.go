package deduptype

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxIDLen is the longest event ID or scope, in bytes, that a key may hold.
const MaxIDLen = 255

// Key identifies one logical event within a scope (normally a consumer and
// handler name, optionally a tenant).
type Key struct {
	Scope   string
	EventID string
}

// String returns the key for errors (a log line has [Key.LogValue]) as
// scope/eventID, the scope quoted when it contains a '/' or starts with a quote, so that every key
// reads back one way: "billing/charge"/e1. The zero Key is "". A part
// longer than [MaxIDLen], which no valid key has, is cut and its length
// said.
func (k Key) String() string {
	scope, id := cutID(k.Scope), cutID(k.EventID)
	switch {
	case k == Key{}:
		return ""
	case strings.Contains(scope, "/") || strings.HasPrefix(scope, `"`):
		return strconv.Quote(scope) + "/" + id
	}
	return scope + "/" + id
}

// LogValue returns the key for a log line as scope/eventID, unquoted even
// when the scope holds a '/' ("order-payments/record-payment/evt_1"): a
// person reads one string, which a JSON handler need not escape, and the
// scope is the consumer's own. Errors keep [Key.String], which reads back
// one way. Parts are cut as String cuts them; the zero Key is "".
func (k Key) LogValue() slog.Value {
	if k == (Key{}) {
		return slog.StringValue("")
	}
	return slog.StringValue(cutID(k.Scope) + "/" + cutID(k.EventID))
}

// cutID returns s, or, when it is longer than any valid ID, its first 64
// bytes and its length: a log line of a refused key
// says what it began with without repeating kilobytes of it.
func cutID(s string) string {
	if len(s) <= MaxIDLen {
		return s
	}
	// A character cut in two is dropped, as invalid UTF-8 is.
	return fmt.Sprintf("%s...(%d bytes)", strings.ToValidUTF8(s[:64], ""), len(s))
}

// KeyError describes why a key was rejected. It matches [ErrInvalidKey].
type KeyError struct {
	Key    Key
	Reason string
}

func (e *KeyError) Error() string {
	return fmt.Sprintf("invalid key (scope %q, event ID %q): %s", cutID(e.Key.Scope), cutID(e.Key.EventID), e.Reason)
}

// Unwrap returns [ErrInvalidKey].
func (e *KeyError) Unwrap() error { return ErrInvalidKey }

// Validate returns a *KeyError when the scope or event ID is empty, longer
// than [MaxIDLen] bytes, not valid UTF-8, or contains control characters;
// the scope is checked first.
func (k Key) Validate() error {
	if reason := checkID(k.Scope); reason != "" {
		return &KeyError{Key: k, Reason: "scope " + reason}
	}
	if reason := checkID(k.EventID); reason != "" {
		return &KeyError{Key: k, Reason: "event ID " + reason}
	}
	return nil
}

func checkID(s string) string {
	if len(s) <= MaxIDLen && printableASCII(s) {
		return "" // the usual ID, without decoding runes
	}
	switch {
	case s == "":
		return "is empty"
	case len(s) > MaxIDLen:
		return fmt.Sprintf("is %d bytes, over %d", len(s), MaxIDLen)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Sprintf("contains control character %U", r)
		}
	}
	return ""
}

// printableASCII reports whether s is non-empty and all printable ASCII:
// valid UTF-8 without control characters.
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f {
			return false
		}
	}
	return s != ""
}
