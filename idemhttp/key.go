package idemhttp

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/dedupkit/dedup"
)

// keyProblem is why a request's key was refused.
type keyProblem struct {
	problem Problem
	detail  string
}

// requestKey returns the request's idempotency key, printable ASCII. present
// is false when the header is absent; a non-nil *keyProblem refuses the
// request. Its entropy is checked later (guessable), once the replay cache
// has not answered.
func (c *config) requestKey(r *http.Request) (key string, present bool, kp *keyProblem) {
	values := r.Header[c.headerKey]
	switch {
	case len(values) == 0:
		return "", false, nil
	case len(values) > 1:
		return "", true, &keyProblem{ProblemKeyMultiple, fmt.Sprintf("%d %s fields; send exactly one", len(values), c.header)}
	// An escaped key is at most twice its length; refuse a huge field
	// before looking at it.
	case len(values[0]) > 2*dedup.MaxIDLen+64:
		return "", true, &keyProblem{ProblemKeyTooLong, fmt.Sprintf("the field is %d bytes; a key is at most %d", len(values[0]), dedup.MaxIDLen)}
	}
	key, err := parseKeyField(values[0])
	switch {
	case err != nil:
		return "", true, &keyProblem{ProblemKeyMalformed, err.Error()}
	case key == "":
		return "", true, &keyProblem{ProblemKeyMalformed, "the key is empty"}
	case len(key) > dedup.MaxIDLen:
		return "", true, &keyProblem{ProblemKeyTooLong, fmt.Sprintf("the key is %d bytes; at most %d", len(key), dedup.MaxIDLen)}
	}
	return key, true, nil
}

// guessable refuses a key too easy to guess or to repeat by accident
// (WithMinKeyEntropy). A key the replay cache holds passed it already.
func (c *config) guessable(key string) *keyProblem {
	if c.minKeyBits <= 0 {
		return nil
	}
	if bits := entropyBits(key); bits < c.minKeyBits {
		return &keyProblem{ProblemKeyLowEntropy, fmt.Sprintf("the key is too easy to guess or to repeat by accident (about %.0f bits estimated, at least %.0f required): "+
			"send a random key per operation, such as a UUID: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"", bits, c.minKeyBits)}
	}
	return nil
}

// entropyBits estimates the entropy of key: its length times the Shannon
// entropy of its character frequencies, n·log2(n) − Σ c·log2(c) over the
// count c of each character.
func entropyBits(key string) float64 {
	var (
		counts [128]uint16 // keys are printable ASCII once parsed
		seen   [128]byte   // the distinct characters, so that only they are summed
		n      int
	)
	for i := 0; i < len(key); i++ {
		c := key[i] & 0x7f
		if counts[c] == 0 {
			seen[n] = c
			n++
		}
		counts[c]++
	}
	bits := nLog2n(len(key))
	for _, c := range seen[:n] {
		bits -= nLog2n(int(counts[c]))
	}
	return bits
}

// nLog2nTable holds n·log2(n) for every count a key can hold.
var nLog2nTable = func() (t [dedup.MaxIDLen + 1]float64) {
	for n := 2; n < len(t); n++ {
		t[n] = float64(n) * math.Log2(float64(n))
	}
	return t
}()

// nLog2n returns n·log2(n), 0 for 0 and 1.
func nLog2n(n int) float64 {
	if n < len(nLog2nTable) {
		return nLog2nTable[n]
	}
	return float64(n) * math.Log2(float64(n))
}

// parseKeyField parses an Idempotency-Key field value: an RFC 8941 Item whose
// bare item is a String (sf-string, RFC 8941 §3.3.3), or a key sent without
// quotes (see parseBareKey). Parameters of a String are parsed and ignored,
// as the draft defines none.
func parseKeyField(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if v != "" && v[0] != '"' {
		return parseBareKey(v)
	}
	if v == "" {
		return "", errors.New(`the field is empty: send a key, such as "8e03978e-40d5-43e8-bc93-6894a57f9324"`)
	}
	key, rest, err := parseString(v)
	if err != nil {
		return "", err
	}
	if err := parseParams(rest); err != nil {
		return "", err
	}
	return key, nil
}

// parseBareKey accepts a key sent without the quotes of a Structured Field
// string, as clients written for other APIs send it: printable ASCII with
// no space, quote, backslash, comma or semicolon, which would make it a
// list or parameters.
func parseBareKey(v string) (string, error) {
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == ' ' || c == '\t' || c == ',' || c == ';':
			return "", fmt.Errorf("%q at byte %d: a key sent without quotes cannot hold spaces, commas or semicolons; "+
				`send it quoted, as a Structured Field string: "8e03978e-40d5-43e8-bc93-6894a57f9324"`, c, i)
		case c < 0x21 || c > 0x7e || c == '"' || c == '\\':
			return "", fmt.Errorf("character %q at byte %d is not allowed in a key (printable ASCII only); "+
				`send a key such as "8e03978e-40d5-43e8-bc93-6894a57f9324"`, c, i)
		}
	}
	return v, nil
}

// parseString parses the sf-string at the start of v and returns its value
// and what follows it.
func parseString(v string) (value, rest string, err error) {
	if end := strings.IndexByte(v[1:], '"') + 1; end > 0 && plainString(v[1:end]) {
		return v[1:end], v[end+1:], nil // the usual key: nothing escaped
	}
	var b strings.Builder
	escaped := false // the value differs from v[1:i]; b holds it
	for i := 1; i < len(v); i++ {
		switch ch := v[i]; {
		case ch == '\\':
			if !escaped {
				escaped = true
				b.WriteString(v[1:i])
			}
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", "", errors.New(`a backslash in the string must escape '"' or '\'`)
			}
			b.WriteByte(v[i])
		case ch == '"':
			if !escaped {
				return v[1:i], v[i+1:], nil
			}
			return b.String(), v[i+1:], nil
		case ch < 0x20 || ch > 0x7e:
			return "", "", fmt.Errorf("character %q at byte %d is not allowed (printable ASCII only)", ch, i)
		case escaped:
			b.WriteByte(ch)
		}
	}
	return "", "", errors.New("the string has no closing quote")
}

// plainString reports whether s is printable ASCII without a backslash: an
// sf-string's content as it is written.
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '\\' {
			return false
		}
	}
	return true
}

// parseParams checks that rest is a list of RFC 8941 parameters.
func parseParams(rest string) error {
	for rest != "" {
		if rest[0] != ';' {
			return fmt.Errorf("unexpected %q after the string (a single key is expected)", rest)
		}
		rest = strings.TrimLeft(rest[1:], " ")
		n := 0
		for n < len(rest) && (isLCAlpha(rest[n]) || rest[n] == '*' || (n > 0 && (isDigit(rest[n]) || strings.IndexByte("_-.", rest[n]) >= 0))) {
			n++
		}
		if n == 0 {
			return errors.New("a parameter has no valid name")
		}
		rest = rest[n:]
		if rest == "" || rest[0] != '=' {
			continue // a bare parameter name is boolean true
		}
		var err error
		if rest, err = skipBareItem(rest[1:]); err != nil {
			return fmt.Errorf("a parameter value: %w", err)
		}
	}
	return nil
}

// skipBareItem skips one RFC 8941 bare item at the start of v.
func skipBareItem(v string) (string, error) {
	switch {
	case v == "":
		return "", errors.New("missing")
	case v[0] == '"':
		_, rest, err := parseString(v)
		return rest, err
	case v[0] == '?':
		if len(v) < 2 || (v[1] != '0' && v[1] != '1') {
			return "", errors.New("a boolean is ?0 or ?1")
		}
		return v[2:], nil
	case v[0] == ':':
		end := strings.IndexByte(v[1:], ':')
		if end < 0 || strings.Trim(v[1:1+end], "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") != "" {
			return "", errors.New("not a byte sequence")
		}
		return v[end+2:], nil
	case v[0] == '-' || isDigit(v[0]):
		n := 1
		for n < len(v) && (isDigit(v[n]) || v[n] == '.') {
			n++
		}
		if v[:n] == "-" || n > 20 {
			return "", errors.New("not a number")
		}
		return v[n:], nil
	case isLCAlpha(v[0]|0x20) || v[0] == '*':
		n := 1
		for n < len(v) && (validToken(v[n:n+1]) || v[n] == ':' || v[n] == '/') {
			n++
		}
		return v[n:], nil
	}
	return "", fmt.Errorf("unexpected %q", v)
}

func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isDigit(c byte) bool   { return c >= '0' && c <= '9' }

// validToken reports whether s is an HTTP token (RFC 9110 §5.6.2), as header
// names are.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(isDigit(c) || isLCAlpha(c|0x20) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
