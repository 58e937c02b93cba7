package dedup

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"sort"
	"strconv"
	"strings"
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
	sum := sha256.Sum256(payload)
	var buf [2 * sha256.Size]byte
	hex.Encode(buf[:], sum[:])
	return string(buf[:]), nil
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
		dec := json.NewDecoder(bytes.NewReader(payload))
		dec.UseNumber()
		var doc any
		if err := dec.Decode(&doc); err != nil {
			return "", fmt.Errorf("%w: %v", ErrInvalidPayload, err)
		}
		if _, err := dec.Token(); err != io.EOF {
			return "", fmt.Errorf("%w: trailing data after the JSON value", ErrInvalidPayload)
		}
		if len(fields) > 0 {
			obj, ok := doc.(map[string]any)
			if !ok {
				return "", fmt.Errorf("%w: payload is not a JSON object", ErrInvalidPayload)
			}
			picked := make(map[string]any, len(fields))
			for _, f := range fields {
				if v, ok := obj[f]; ok {
					picked[f] = v
				}
			}
			doc = picked
		}
		h := sha256.New()
		io.WriteString(h, version)
		h.Write([]byte{0})
		if err := writeCanonical(h, doc); err != nil {
			return "", err
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	}
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

// writeCanonical writes v as JSON with object keys sorted and no whitespace.
// Numbers are written as exact rationals, so 1, 1.0 and 1e0 are equal while
// integers beyond float64 precision stay distinct. A number out of bounds is
// an error matching ErrInvalidPayload.
func writeCanonical(w io.Writer, v any) error {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		io.WriteString(w, "{")
		for i, k := range keys {
			if i > 0 {
				io.WriteString(w, ",")
			}
			writeString(w, k)
			io.WriteString(w, ":")
			if err := writeCanonical(w, v[k]); err != nil {
				return err
			}
		}
		io.WriteString(w, "}")
	case []any:
		io.WriteString(w, "[")
		for i, e := range v {
			if i > 0 {
				io.WriteString(w, ",")
			}
			if err := writeCanonical(w, e); err != nil {
				return err
			}
		}
		io.WriteString(w, "]")
	case string:
		writeString(w, v)
	case json.Number:
		if err := checkNumber(v.String()); err != nil {
			return err
		}
		r, ok := new(big.Rat).SetString(v.String())
		if !ok {
			return fmt.Errorf("%w: number %q", ErrInvalidPayload, v)
		}
		io.WriteString(w, r.RatString())
	case bool:
		if v {
			io.WriteString(w, "true")
		} else {
			io.WriteString(w, "false")
		}
	default: // nil
		io.WriteString(w, "null")
	}
	return nil
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

func writeString(w io.Writer, s string) {
	b, _ := json.Marshal(s) // marshalling a string cannot fail
	w.Write(b)
}
