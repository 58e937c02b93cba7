package dedup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"github.com/dedupkit/dedup/internal/hexsha"
)

// ErrInvalidPayload means a payload could not be read to compute its
// fingerprint (for example, a JSON fingerprint over a payload that is not
// JSON). Such a message is dead-lettered with [ReasonInvalidPayload].
var ErrInvalidPayload = errors.New("dedup: invalid payload")

// FingerprintFunc computes the fingerprint of a payload: a string that is
// equal for two deliveries of the same event and different when the same
// event ID is reused for a different event.
type FingerprintFunc func(payload []byte) (string, error)

// SHA256Fingerprint returns the default fingerprint: the hex SHA-256 of the
// payload bytes. It never fails.
func SHA256Fingerprint() FingerprintFunc { return sha256Fingerprint }

func sha256Fingerprint(payload []byte) (string, error) {
	return hexsha.String(payload), nil
}

// JSONFingerprint returns a fingerprint over the canonical JSON of the named
// top-level fields of a JSON object payload, prefixed with a policy version.
// Key order and whitespace do not change it; values do. With no fields, the
// whole document is used. Bump version when the meaning of the fields changes.
// A number of more than 800 digits or with an exponent past ±400 makes the
// payload invalid ([ErrInvalidPayload]): its exact value would cost seconds
// and megabytes to compute.
func JSONFingerprint(version string, fields ...string) FingerprintFunc {
	fields = append([]string(nil), fields...)
	return func(payload []byte) (string, error) {
		// Room for the canonical form twice: an object is written after
		// its members' values, then moved over them (canonParser.object).
		buf := make([]byte, 0, len(version)+1+2*len(payload)+16)
		buf = append(append(buf, version...), 0)
		out, err := appendCanonicalJSON(buf, payload, fields)
		if err != nil {
			if out, err = decodeCanonical(buf, payload, fields); err != nil {
				return "", err
			}
		}
		return hexsha.String(out), nil
	}
}

// decodeCanonical is appendCanonicalJSON through encoding/json: the
// documents the fast path leaves to it are accepted or refused here.
func decodeCanonical(buf, payload []byte, fields []string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidPayload, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after the JSON value", ErrInvalidPayload)
	}
	if len(fields) > 0 {
		obj, ok := doc.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%w: payload is not a JSON object", ErrInvalidPayload)
		}
		picked := make(map[string]any, len(fields))
		for _, f := range fields {
			if v, ok := obj[f]; ok {
				picked[f] = v
			}
		}
		doc = picked
	}
	return appendCanonical(buf, doc)
}

// Bounds of the numbers a JSON fingerprint accepts. Each number is made an
// exact rational, whose size grows with its exponent: 1e999999 alone takes
// 100 ms and a megabyte. These bounds hold every float64 (at most 17
// significant digits, exponents -324 to 308), written shortest or in full
// (at most 767 significant digits), and integers of up to 800 digits; a
// number past them makes the payload invalid.
const (
	maxNumberDigits   = 800
	maxNumberExponent = 400
)

// appendCanonical appends v as JSON with object keys sorted and no
// whitespace. Numbers are written as exact rationals, so 1, 1.0 and 1e0 are
// equal while integers beyond float64 precision stay distinct. A number out
// of bounds is an error matching ErrInvalidPayload.
func appendCanonical(buf []byte, v any) ([]byte, error) {
	var err error
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		buf = append(buf, '{')
		for i, k := range keys {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = append(appendString(buf, k), ':')
			if buf, err = appendCanonical(buf, v[k]); err != nil {
				return nil, err
			}
		}
		buf = append(buf, '}')
	case []any:
		buf = append(buf, '[')
		for i, e := range v {
			if i > 0 {
				buf = append(buf, ',')
			}
			if buf, err = appendCanonical(buf, e); err != nil {
				return nil, err
			}
		}
		buf = append(buf, ']')
	case string:
		buf = appendString(buf, v)
	case json.Number:
		return appendNumber(buf, []byte(v))
	case bool:
		buf = strconv.AppendBool(buf, v)
	default: // nil
		buf = append(buf, "null"...)
	}
	return buf, nil
}

// appendNumber appends num, a JSON number literal, as an exact rational in
// lowest terms. An integer of up to 18 digits is that already, -0 aside.
func appendNumber(buf, num []byte) ([]byte, error) {
	digits := bytes.TrimPrefix(num, []byte("-"))
	integer := len(digits) > 0 && len(digits) <= 18
	for i := 0; integer && i < len(digits); i++ {
		integer = digits[i] >= '0' && digits[i] <= '9'
	}
	switch {
	case integer && string(digits) == "0":
		return append(buf, '0'), nil
	case integer:
		return append(buf, num...), nil
	}
	if err := checkNumber(string(num)); err != nil {
		return nil, err
	}
	r, ok := new(big.Rat).SetString(string(num))
	if !ok {
		return nil, fmt.Errorf("%w: number %q", ErrInvalidPayload, num)
	}
	return append(buf, r.RatString()...), nil
}

// checkNumber refuses a JSON number literal with more than maxNumberDigits
// digits before its exponent or an exponent beyond ±maxNumberExponent.
func checkNumber(num string) error {
	mant, exp, _ := strings.Cut(strings.ToLower(num), "e")
	digits := len(mant) - strings.Count(mant, "-") - strings.Count(mant, ".")
	exp = strings.TrimLeft(strings.TrimLeft(exp, "+-"), "0")
	if e, err := strconv.Atoi(exp); digits > maxNumberDigits || len(exp) > 4 || (err == nil && e > maxNumberExponent) {
		return fmt.Errorf("%w: number %.24q is out of bounds (at most %d digits, exponent within ±%d)",
			ErrInvalidPayload, num, maxNumberDigits, maxNumberExponent)
	}
	return nil
}

// appendString appends s as encoding/json writes it: quoted, with HTML
// characters, control characters and invalid UTF-8 escaped. Most strings
// need none of that and are copied as they are.
func appendString(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // marshalling a string cannot fail
			return append(buf, b...)
		}
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"')
}
