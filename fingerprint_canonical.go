package dedup

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
)

// errNotCanonicalized makes appendCanonicalJSON hand a document to
// encoding/json, which then accepts it or says what is wrong with it.
var errNotCanonicalized = errors.New("not canonicalized on the fast path")

// canonMaxDepth is the deepest nesting the fast path follows; deeper
// documents take the encoding/json path, which has its own limit.
const canonMaxDepth = 512

// appendCanonicalJSON appends the canonical form of the JSON document data
// (see appendCanonical) reading it directly, without building a tree of Go
// values: what JSONFingerprint does for a payload it accepts. With fields,
// only those top-level members of an object are kept. It returns
// errNotCanonicalized for whatever it does not handle (any invalid
// document, a number it would have to reduce, nesting past canonMaxDepth),
// so that encoding/json decides those: the fast path only ever accepts what
// encoding/json accepts, and writes the same bytes.
func appendCanonicalJSON(dst, data []byte, fields []string) ([]byte, error) {
	p := canonParser{data: data}
	p.space()
	var err error
	if fields != nil {
		if p.pos >= len(p.data) || p.data[p.pos] != '{' {
			return nil, errNotCanonicalized
		}
		dst, err = p.object(dst, 1, fields)
	} else {
		dst, err = p.value(dst, 0)
	}
	if err != nil {
		return nil, err
	}
	if p.space(); p.pos != len(p.data) {
		return nil, errNotCanonicalized
	}
	return dst, nil
}

type canonParser struct {
	data []byte
	pos  int
}

func (p *canonParser) space() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *canonParser) value(dst []byte, depth int) ([]byte, error) {
	if p.pos >= len(p.data) {
		return nil, errNotCanonicalized
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(dst, depth+1, nil)
	case c == '[':
		return p.array(dst, depth+1)
	case c == '"':
		raw, plain, err := p.str()
		if err != nil {
			return nil, err
		}
		if plain {
			return append(dst, raw...), nil
		}
		s, err := unquote(raw)
		if err != nil {
			return nil, err
		}
		return appendString(dst, s), nil
	case c == '-' || c >= '0' && c <= '9':
		num, err := p.number()
		if err != nil {
			return nil, err
		}
		return appendNumber(dst, num)
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if len(p.data)-p.pos >= len(lit) && string(p.data[p.pos:p.pos+len(lit)]) == lit {
			p.pos += len(lit)
			return append(dst, lit...), nil
		}
	}
	return nil, errNotCanonicalized
}

// member is an object member: its key (decoded), whether the key is
// written as it was read (see str), and where its canonical value lies in
// the object's buffer.
type member struct {
	key        []byte
	plain      bool
	start, end int
}

// object reads an object and appends it with its members sorted by key, the
// last of a repeated key kept (as decoding it into a map would); with
// fields, only members named there.
func (p *canonParser) object(dst []byte, depth int, fields []string) ([]byte, error) {
	if depth > canonMaxDepth {
		return nil, errNotCanonicalized
	}
	p.pos++ // '{'
	// The members' canonical values are written past the end of dst, then
	// the object after them, which is moved down over them: dst's own
	// buffer is the scratch space (a buffer of the object's own would
	// escape, the parser being recursive). Most objects have few members,
	// which stay on the stack.
	var membersBuf [8]member
	members, vals := membersBuf[:0], dst
	base := len(dst)
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return append(dst, "{}"...), nil
	}
	for {
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return nil, errNotCanonicalized
		}
		raw, plain, err := p.str()
		if err != nil {
			return nil, err
		}
		key := raw[1 : len(raw)-1]
		if !plain {
			s, err := unquote(raw)
			if err != nil {
				return nil, err
			}
			key = []byte(s)
		}
		if p.space(); p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return nil, errNotCanonicalized
		}
		p.pos++
		p.space()
		start := len(vals)
		if vals, err = p.value(vals, depth); err != nil {
			return nil, err
		}
		if fields == nil || slices.ContainsFunc(fields, func(f string) bool { return f == string(key) }) {
			members = append(members, member{key, plain, start, len(vals)})
		}
		if p.space(); p.pos >= len(p.data) {
			return nil, errNotCanonicalized
		}
		if p.data[p.pos] == '}' {
			p.pos++
			break
		}
		if p.data[p.pos] != ',' {
			return nil, errNotCanonicalized
		}
		p.pos++
	}
	slices.SortStableFunc(members, func(a, b member) int { return bytes.Compare(a.key, b.key) })
	dst = append(vals, '{')
	obj := len(vals)
	first := true
	for i, m := range members {
		if i+1 < len(members) && bytes.Equal(members[i+1].key, m.key) {
			continue // a later copy of the key replaces it
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		if m.plain {
			dst = append(append(append(dst, '"'), m.key...), '"', ':')
		} else {
			dst = append(appendString(dst, string(m.key)), ':')
		}
		dst = append(dst, dst[m.start:m.end]...)
	}
	dst = append(dst, '}')
	return dst[:base+copy(dst[base:], dst[obj:])], nil
}

func (p *canonParser) array(dst []byte, depth int) ([]byte, error) {
	if depth > canonMaxDepth {
		return nil, errNotCanonicalized
	}
	p.pos++ // '['
	dst = append(dst, '[')
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return append(dst, ']'), nil
	}
	for i := 0; ; i++ {
		if i > 0 {
			dst = append(dst, ',')
		}
		p.space()
		var err error
		if dst, err = p.value(dst, depth); err != nil {
			return nil, err
		}
		if p.space(); p.pos >= len(p.data) {
			return nil, errNotCanonicalized
		}
		if p.data[p.pos] == ']' {
			p.pos++
			return append(dst, ']'), nil
		}
		if p.data[p.pos] != ',' {
			return nil, errNotCanonicalized
		}
		p.pos++
	}
}

// str reads a string and returns it as written, quotes included; plain
// says that it is printable ASCII that encoding/json writes back as it is
// (see appendString), so that it is its own canonical form.
func (p *canonParser) str() (raw []byte, plain bool, err error) {
	start := p.pos
	p.pos++ // '"'
	plain = true
	for ; p.pos < len(p.data); p.pos++ {
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			return p.data[start:p.pos], plain, nil
		case c == '\\':
			plain = false
			p.pos++ // the escaped byte cannot end the string
		case c < 0x20:
			return nil, false, errNotCanonicalized
		case c > 0x7e || c == '<' || c == '>' || c == '&':
			plain = false
		}
	}
	return nil, false, errNotCanonicalized
}

// unquote decodes a string literal with escapes or bytes that are not
// printable ASCII as encoding/json does (invalid UTF-8 becomes U+FFFD).
func unquote(raw []byte) (s string, err error) {
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", errNotCanonicalized
	}
	return s, nil
}

// number reads a number literal as JSON writes one.
func (p *canonParser) number() ([]byte, error) {
	start := p.pos
	if p.data[p.pos] == '-' {
		p.pos++
	}
	switch {
	case p.pos < len(p.data) && p.data[p.pos] == '0':
		p.pos++
	case p.digits() == 0:
		return nil, errNotCanonicalized
	}
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		if p.digits() == 0 {
			return nil, errNotCanonicalized
		}
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if p.digits() == 0 {
			return nil, errNotCanonicalized
		}
	}
	return p.data[start:p.pos], nil
}

func (p *canonParser) digits() int {
	n := 0
	for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
		p.pos++
		n++
	}
	return n
}
