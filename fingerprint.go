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
		writeCanonical(h, doc)
		return hex.EncodeToString(h.Sum(nil)), nil
	}
}

// writeCanonical writes v as JSON with object keys sorted and no whitespace.
// Numbers are written as exact rationals, so 1, 1.0 and 1e0 are equal while
// integers beyond float64 precision stay distinct.
func writeCanonical(w io.Writer, v any) {
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
			writeCanonical(w, v[k])
		}
		io.WriteString(w, "}")
	case []any:
		io.WriteString(w, "[")
		for i, e := range v {
			if i > 0 {
				io.WriteString(w, ",")
			}
			writeCanonical(w, e)
		}
		io.WriteString(w, "]")
	case string:
		writeString(w, v)
	case json.Number:
		if r, ok := new(big.Rat).SetString(v.String()); ok {
			io.WriteString(w, r.RatString())
		} else {
			io.WriteString(w, v.String())
		}
	case bool:
		if v {
			io.WriteString(w, "true")
		} else {
			io.WriteString(w, "false")
		}
	default: // nil
		io.WriteString(w, "null")
	}
}

func writeString(w io.Writer, s string) {
	b, _ := json.Marshal(s) // marshalling a string cannot fail
	w.Write(b)
}
