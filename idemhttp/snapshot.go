package idemhttp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unsafe"
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

// snapshot is a stored response. Its header names and values are cut
// from one string, so that decoding allocates once whatever their number.
type snapshot struct {
	status int
	n      int                       // header values
	text   string                    // the names and values
	ends   [2 * maxSnapHeaders]int32 // in text, where each name and value ends
	body   []byte
}

// writeReplay answers w with s, marked as a replay.
func (s *snapshot) writeReplay(w http.ResponseWriter) {
	writeReplay(w, s.status, s.text, s.ends[:2*s.n], s.body)
}

// writeHeader sets s's headers in h, as writeHeaderFields does.
func (s *snapshot) writeHeader(h http.Header, extra int) []string {
	return writeHeaderFields(h, s.text, s.ends[:2*s.n], extra)
}

// A stored response's header names and values are cut from one string,
// text: field i (2k for the k-th name, 2k+1 for its value) ends at ends[i].
// The functions below take text and ends apart, not in a struct, so that a
// snapshot decoded on the stack stays there: only text leaks into the
// header.

// field returns the i-th name or value of text cut at ends.
func field(text string, ends []int32, i int) string {
	from := int32(0)
	if i > 0 {
		from = ends[i-1]
	}
	return text[from:ends[i]]
}

// writeReplay answers w with the stored response of status, headers text
// cut at ends, and body, marked as a replay.
func writeReplay(w http.ResponseWriter, status int, text string, ends []int32, body []byte) {
	writeReplayHeader(w.Header(), status, text, ends, len(body))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeReplayHeader sets in h the headers a replay answers with: the
// stored ones, the replay mark and, where a body is allowed, its length.
// The values share one allocation.
func writeReplayHeader(h http.Header, status int, text string, ends []int32, bodyLen int) {
	n := len(ends) / 2
	vals := writeHeaderFields(h, text, ends, 2)
	vals = append(vals, "true")
	h[ReplayHeader] = vals[n : n+1 : n+1]
	if bodyAllowed(status) {
		vals = append(vals, strconv.Itoa(bodyLen))
		h["Content-Length"] = vals[n+1 : n+2 : n+2]
	}
}

// writeHeaderFields sets the headers of text cut at ends in h, in place of
// any h held under their names, and returns the array their values share,
// with room for extra more.
func writeHeaderFields(h http.Header, text string, ends []int32, extra int) []string {
	n := len(ends) / 2
	vals := make([]string, n, n+extra)
	for k := range n {
		name := field(text, ends, 2*k)
		vals[k] = field(text, ends, 2*k+1)
		if seenBefore(text, ends, k, name) {
			h[name] = append(h[name], vals[k])
		} else {
			h[name] = vals[k : k+1 : k+1]
		}
	}
	return vals
}

// seenBefore reports whether a header before the k-th has name.
func seenBefore(text string, ends []int32, k int, name string) bool {
	for j := 0; j < k; j++ {
		if field(text, ends, 2*j) == name {
			return true
		}
	}
	return false
}

// encodeSnapshot encodes the status, the headers of h named in names
// (canonical names, as WithStoredHeaders keeps them), and body. It refuses what decodeSnapshot would refuse, so that no response is
// stored that cannot be replayed: more than maxSnapHeaders values, or a value
// with a control character.
func encodeSnapshot(status int, h http.Header, names []string, body []byte) ([]byte, error) {
	// Each name is looked up once, its values kept for the second pass.
	var stack [16][]string
	values := stack[:0]
	if len(names) > len(stack) {
		values = make([][]string, 0, len(names))
	}
	size := 4 + len(body)
	n := 0
	for _, name := range names {
		values = append(values, h[name])
		for _, v := range values[len(values)-1] {
			if !validHeaderValue(v) {
				return nil, fmt.Errorf("idemhttp: header %s has a control character in its value", name)
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
	for i, name := range names {
		for _, v := range values[i] {
			b = binary.AppendUvarint(b, uint64(len(name)))
			b = append(b, name...)
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return append(b, body...), nil
}

// decodeSnapshot decodes b into s, refusing anything encodeSnapshot cannot
// have written.
func decodeSnapshot(b []byte, s *snapshot) error {
	var p snapshotParts
	if err := p.parse(b); err != nil {
		return err
	}
	if err := p.validate(); err != nil {
		return err
	}
	p.split(s)
	return nil
}

// snapshotParts is an encoded snapshot taken apart without a copy: its
// status, where each header name and value lies in it, and its body. Its
// lengths are checked, its names and values only by validate.
type snapshotParts struct {
	status int
	n      int                                        // header values
	spans  [2 * maxSnapHeaders]struct{ from, to int } // in enc, each name and value
	text   int                                        // the names' and values' length together
	enc    []byte
	body   []byte
}

// field returns the i-th name or value (2k for the k-th name, 2k+1 for its
// value).
func (p *snapshotParts) field(i int) []byte { return p.enc[p.spans[i].from:p.spans[i].to] }

// validate refuses the header names and values encodeSnapshot cannot have
// written.
func (p *snapshotParts) validate() error {
	for k := 0; k < p.n; k++ {
		// Views of the encoding, which does not change while they are read.
		name, value := p.field(2*k), p.field(2*k+1)
		nameStr := unsafe.String(unsafe.SliceData(name), len(name))
		if !validToken(nameStr) || http.CanonicalHeaderKey(nameStr) != nameStr {
			return fmt.Errorf("%w: header %d name %q", errSnapshot, k, name)
		}
		if !validHeaderValue(unsafe.String(unsafe.SliceData(value), len(value))) {
			return fmt.Errorf("%w: header %s value", errSnapshot, name)
		}
	}
	return nil
}

// split copies p's header names and values into one string of s's, and
// sets the rest of s to share p's encoding.
func (p *snapshotParts) split(s *snapshot) {
	var buf strings.Builder
	buf.Grow(p.text)
	for i := 0; i < 2*p.n; i++ {
		buf.Write(p.field(i))
		s.ends[i] = int32(buf.Len())
	}
	s.status, s.n, s.text, s.body = p.status, p.n, buf.String(), p.body
}

// parse takes b apart into p.
func (p *snapshotParts) parse(b []byte) error {
	if len(b) < 5 || b[0] != snapshotMagic {
		return fmt.Errorf("%w: no snapshot header", errSnapshot)
	}
	if b[1] != snapshotVersion {
		return fmt.Errorf("%w: unknown version %d", errSnapshot, b[1])
	}
	p.status = int(binary.BigEndian.Uint16(b[2:4]))
	if p.status < 200 || p.status > 499 {
		return fmt.Errorf("%w: status %d", errSnapshot, p.status)
	}
	rest := b[4:]
	n, err := uvarint(&rest, maxSnapHeaders)
	if err != nil {
		return fmt.Errorf("%w: header count: %v", errSnapshot, err)
	}
	p.n, p.text, p.enc = n, 0, b
	for i := 0; i < 2*n; i++ {
		l, err := uvarint(&rest, -1)
		if err != nil {
			return fmt.Errorf("%w: header %d: %v", errSnapshot, i/2, err)
		}
		from := len(b) - len(rest)
		p.spans[i].from, p.spans[i].to = from, from+l
		p.text += l
		rest = rest[l:]
	}
	p.body = rest
	return nil
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
