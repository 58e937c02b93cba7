package redisstore

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/dedupkit/dedup"
)

// A record kept as a Redis string is a MessagePack array of 13 values, in
// the order st fp at ow lu ca ua ea le ff lf rs sn (recordFields, then the
// settling nonce): strings as str, attempts and times (Unix ms) as
// integers, an absent value as false. The scripts read and write it with
// Redis's cmsgpack (luaRecord); the client writes only the record SET NX
// creates (packNew), whose lease end and expiry are the strings "+<ms>",
// relative to its creation, and reads only settled records (parsePacked).
// This file holds the few MessagePack types those use.
const packedLen = 13

// packNew returns the record SET NX creates for req under owner: created,
// updated, lease end and expiry are the key's, which the server sets from
// its own clock (see the record's layout).
func packNew(req dedup.ClaimRequest, owner string) []byte {
	b := make([]byte, 0, 64+len(req.Fingerprint)+len(owner))
	b = append(b, 0x90|packedLen)
	b = appendStr(b, string(dedup.StatusProcessing))
	b = appendStr(b, req.Fingerprint)
	b = append(b, 1) // attempts, a positive fixint
	b = appendStr(b, owner)
	b = appendRelative(b, req.Lease)
	b = append(b, mpFalse, mpFalse) // ca, ua
	b = appendRelative(b, req.TTL)
	return append(b, mpFalse, mpFalse, mpFalse, mpFalse, mpFalse) // le ff lf rs sn
}

// appendRelative appends d from the record's creation, "+<ms>", as a str.
func appendRelative(b []byte, d time.Duration) []byte {
	var digits [24]byte
	v := strconv.AppendInt(append(digits[:0], '+'), d.Milliseconds(), 10)
	b = append(b, 0xa0|byte(len(v)))
	return append(b, v...)
}

const (
	mpNil   = 0xc0
	mpFalse = 0xc2
)

// appendStr appends s as a MessagePack str.
func appendStr(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = append(b, 0xda)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 0xdb)
		b = binary.BigEndian.AppendUint32(b, uint32(n))
	}
	return append(b, s...)
}

// packedValue is one value of a packed record: a string, an integer, or
// absent.
type packedValue struct {
	str    string
	num    int64
	isStr  bool
	isNum  bool
	absent bool
}

// packedReader reads MessagePack values from a string.
type packedReader struct {
	s   string
	err error
}

func (r *packedReader) fail() {
	if r.err == nil {
		r.err = fmt.Errorf("%w: packed record is not the MessagePack array it should be", dedup.ErrMalformedRecord)
	}
}

// take returns the next n bytes.
func (r *packedReader) take(n int) string {
	if r.err != nil || n < 0 || n > len(r.s) {
		r.fail()
		return ""
	}
	v := r.s[:n]
	r.s = r.s[n:]
	return v
}

// uint reads a big-endian unsigned integer of size bytes.
func (r *packedReader) uint(size int) uint64 {
	var v uint64
	for _, c := range []byte(r.take(size)) {
		v = v<<8 | uint64(c)
	}
	return v
}

// arrayLen reads an array header.
func (r *packedReader) arrayLen() int {
	h := r.take(1)
	switch {
	case h == "":
		return 0
	case h[0]&0xf0 == 0x90:
		return int(h[0] & 0x0f)
	case h[0] == 0xdc:
		return int(r.uint(2))
	}
	r.fail()
	return 0
}

// value reads one value.
func (r *packedReader) value() packedValue {
	h := r.take(1)
	if h == "" {
		return packedValue{}
	}
	switch c := h[0]; {
	case c <= 0x7f:
		return packedValue{num: int64(c), isNum: true}
	case c >= 0xe0:
		return packedValue{num: int64(int8(c)), isNum: true}
	case c&0xe0 == 0xa0:
		return packedValue{str: r.take(int(c & 0x1f)), isStr: true}
	case c == 0xd9 || c == 0xc4:
		return packedValue{str: r.take(int(r.uint(1))), isStr: true}
	case c == 0xda || c == 0xc5:
		return packedValue{str: r.take(int(r.uint(2))), isStr: true}
	case c == 0xdb || c == 0xc6:
		return packedValue{str: r.take(int(r.uint(4))), isStr: true}
	case c >= 0xcc && c <= 0xcf:
		v := r.uint(1 << (c - 0xcc))
		if v > math.MaxInt64 {
			r.fail()
		}
		return packedValue{num: int64(v), isNum: true}
	case c >= 0xd0 && c <= 0xd3:
		size := 1 << (c - 0xd0)
		v := r.uint(size)
		shift := 64 - 8*size
		return packedValue{num: int64(v<<shift) >> shift, isNum: true}
	case c == mpNil || c == mpFalse:
		return packedValue{absent: true}
	}
	r.fail()
	return packedValue{}
}

// parsePacked reads the settled record of key from the packed string v. A
// record whose times are relative (one SET NX created, still in flight)
// is malformed here: only the scripts resolve those.
func parsePacked(key dedup.Key, v string) (dedup.Record, error) {
	r := packedReader{s: v}
	if n := r.arrayLen(); n != packedLen && r.err == nil {
		r.fail()
	}
	var vals [packedLen]packedValue
	for i := range vals {
		vals[i] = r.value()
	}
	if r.err == nil && r.s != "" {
		r.fail()
	}
	str := func(i int, required bool) string {
		if !vals[i].isStr && !(vals[i].absent && !required) {
			r.fail()
		}
		return vals[i].str
	}
	ms := func(i int, required bool) time.Time {
		switch {
		case vals[i].isNum:
			return time.UnixMilli(vals[i].num)
		case !vals[i].absent || required:
			r.fail()
		}
		return time.Time{}
	}
	rec := dedup.Record{
		Key:          key,
		Status:       dedup.Status(str(0, true)),
		Fingerprint:  str(1, true),
		Attempts:     int(vals[2].num),
		Owner:        str(3, false),
		LeaseUntil:   ms(4, true),
		CreatedAt:    ms(5, true),
		UpdatedAt:    ms(6, true),
		ExpiresAt:    ms(7, true),
		LastError:    str(8, false),
		FirstFailure: ms(9, false),
		LastFailure:  ms(10, false),
	}
	if !vals[2].isNum || !rec.Status.Valid() {
		r.fail()
	}
	if result := str(11, false); vals[11].isStr {
		rec.Result = []byte(result)
	}
	if r.err != nil {
		return dedup.Record{}, r.err
	}
	return rec, nil
}
