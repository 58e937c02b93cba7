package idemhttp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
)

// A response snapshot, as kept in dedup.Record.Result, is
//
//	magic 0xD1, version 1
//	status          uint16, big-endian
//	header count    uvarint
//	per header      uvarint name length, name, uvarint value length, value
//	body            the rest
//
// Decoding checks every length and value, so a damaged record is refused,
// never replayed as a wrong answer.
const (
	snapshotMagic   = 0xD1
	snapshotVersion = 1
	maxSnapHeaders  = 64
)

// errSnapshot is wrapped by every snapshot decoding error.
var errSnapshot = errors.New("idemhttp: malformed response snapshot")

// snapshot is a stored response.
type snapshot struct {
	status int
	header http.Header // canonical names
	body   []byte
}

// encodeSnapshot encodes the status, the headers of h named in names, and
// body. It refuses what decodeSnapshot would refuse, so that no response is
// stored that cannot be replayed: more than maxSnapHeaders values, or a value
// with a control character.
func encodeSnapshot(status int, h http.Header, names []string, body []byte) ([]byte, error) {
	size := 4 + len(body)
	n := 0
	for _, name := range names {
		for _, v := range h.Values(name) {
			if !validHeaderValue(v) {
				return nil, fmt.Errorf("idemhttp: header %s has a control character in its value", http.CanonicalHeaderKey(name))
			}
			size += 2*binary.MaxVarintLen16 + len(name) + len(v)
			n++
		}
	}
	if n > maxSnapHeaders {
		return nil, fmt.Errorf("idemhttp: %d stored header values, over %d", n, maxSnapHeaders)
	}
	b := make([]byte, 0, size+binary.MaxVarintLen16)
	b = append(b, snapshotMagic, snapshotVersion)
	b = binary.BigEndian.AppendUint16(b, uint16(status))
	b = binary.AppendUvarint(b, uint64(n))
	for _, name := range names {
		canon := http.CanonicalHeaderKey(name)
		for _, v := range h.Values(name) {
			b = binary.AppendUvarint(b, uint64(len(canon)))
			b = append(b, canon...)
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return append(b, body...), nil
}

// decodeSnapshot decodes b, refusing anything encodeSnapshot cannot have
// written.
func decodeSnapshot(b []byte) (snapshot, error) {
	if len(b) < 5 || b[0] != snapshotMagic {
		return snapshot{}, fmt.Errorf("%w: no snapshot header", errSnapshot)
	}
	if b[1] != snapshotVersion {
		return snapshot{}, fmt.Errorf("%w: unknown version %d", errSnapshot, b[1])
	}
	s := snapshot{status: int(binary.BigEndian.Uint16(b[2:4]))}
	if s.status < 200 || s.status > 499 {
		return snapshot{}, fmt.Errorf("%w: status %d", errSnapshot, s.status)
	}
	b = b[4:]
	n, err := uvarint(&b, maxSnapHeaders)
	if err != nil {
		return snapshot{}, fmt.Errorf("%w: header count: %v", errSnapshot, err)
	}
	s.header = make(http.Header, n)
	for i := 0; i < n; i++ {
		name, err := field(&b)
		if err != nil || !validToken(name) || http.CanonicalHeaderKey(name) != name {
			return snapshot{}, fmt.Errorf("%w: header %d name %q", errSnapshot, i, name)
		}
		value, err := field(&b)
		if err != nil || !validHeaderValue(value) {
			return snapshot{}, fmt.Errorf("%w: header %s value", errSnapshot, name)
		}
		s.header[name] = append(s.header[name], value)
	}
	s.body = b
	return s, nil
}

// uvarint consumes a length from b, refusing one over max or over what b
// holds after it when max is negative.
func uvarint(b *[]byte, max int) (int, error) {
	v, n := binary.Uvarint(*b)
	if n <= 0 {
		return 0, errors.New("bad length")
	}
	*b = (*b)[n:]
	if max < 0 {
		max = len(*b)
	}
	if v > uint64(max) {
		return 0, errors.New("length out of range")
	}
	return int(v), nil
}

func field(b *[]byte) (string, error) {
	n, err := uvarint(b, -1)
	if err != nil {
		return "", err
	}
	s := string((*b)[:n])
	*b = (*b)[n:]
	return s, nil
}

// validHeaderValue reports whether v may be sent as a field value: no
// control characters but horizontal tab.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
