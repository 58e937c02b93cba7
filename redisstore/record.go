package redisstore

import (
	"fmt"
	"strconv"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
)

// parseClaim reads the claim script's answer for one request made with
// owner: {2, now} for a record it created, else {code, previous status,
// record fields}.
func parseClaim(reply any, req dedup.ClaimRequest, owner string) (dedup.Claim, error) {
	vals, ok := reply.([]any)
	if ok && len(vals) == 2 && vals[0] == int64(2) {
		if ms, ok := vals[1].(int64); ok {
			now := time.UnixMilli(ms)
			return dedup.Claim{Status: dedup.ClaimAcquired, Record: dedup.Record{
				Key: req.Key, Status: dedup.StatusProcessing, Fingerprint: req.Fingerprint, Attempts: 1, Owner: owner,
				LeaseUntil: time.UnixMilli(ms + req.Lease.Milliseconds()), CreatedAt: now, UpdatedAt: now,
				ExpiresAt: time.UnixMilli(ms + req.TTL.Milliseconds()),
			}}, nil
		}
	}
	if !ok || len(vals) != 2+len(recordFields) {
		return dedup.Claim{}, fmt.Errorf("%w: claim reply %v", dedup.ErrMalformedRecord, reply)
	}
	code, ok := vals[0].(int64)
	if !ok || code < -1 || code > 1 {
		return dedup.Claim{}, fmt.Errorf("%w: claim code %v", dedup.ErrMalformedRecord, vals[0])
	}
	if code == -1 {
		return dedup.Claim{}, fmt.Errorf("%w: stored attempts, lease or expiry is not a number", dedup.ErrMalformedRecord)
	}
	rec, err := parseRecord(req.Key, vals[2:])
	if err != nil {
		return dedup.Claim{}, err
	}
	if code == 1 {
		prev, _ := text(vals[1])
		return dedup.Claim{Status: dedup.ClaimAcquired, Record: rec, Previous: dedup.Status(prev)}, nil
	}
	return dedup.Claim{Status: deduptype.Classify(rec, req.Fingerprint), Record: rec}, nil
}

// parseRecord reads the record fields, in recordFields' order, of key.
func parseRecord(key dedup.Key, vals []any) (dedup.Record, error) {
	if len(vals) != len(recordFields) {
		return dedup.Record{}, fmt.Errorf("%w: %d fields", dedup.ErrMalformedRecord, len(vals))
	}
	p := fieldParser{vals: vals}
	rec := dedup.Record{
		Key:          key,
		Status:       dedup.Status(p.text(0)),
		Fingerprint:  p.text(1),
		Attempts:     p.int(2),
		Owner:        p.text(3),
		LeaseUntil:   p.time(4),
		CreatedAt:    p.time(5),
		UpdatedAt:    p.time(6),
		ExpiresAt:    p.time(7),
		LastError:    p.text(8),
		FirstFailure: p.optTime(9),
		LastFailure:  p.optTime(10),
	}
	if s, ok := text(vals[11]); ok {
		rec.Result = []byte(s)
	}
	if p.err == nil && !rec.Status.Valid() {
		p.fail(0)
	}
	if p.err != nil {
		return dedup.Record{}, p.err
	}
	return rec, nil
}

// text returns a field's value; ok is false when the field is absent (nil,
// or false from a script over RESP3).
func text(v any) (s string, ok bool) {
	s, ok = v.(string)
	return s, ok
}

// fieldParser reads record fields, keeping the first error.
type fieldParser struct {
	vals []any
	err  error
}

func (p *fieldParser) fail(i int) {
	if p.err == nil {
		p.err = fmt.Errorf("%w: field %s is %v", dedup.ErrMalformedRecord, recordFields[i], p.vals[i])
	}
}

func (p *fieldParser) text(i int) string {
	s, _ := text(p.vals[i])
	return s
}

func (p *fieldParser) int(i int) int {
	return int(p.num(i))
}

// num reads an integer field, a string as stored or an integer the script
// just computed.
func (p *fieldParser) num(i int) int64 {
	switch v := p.vals[i].(type) {
	case int64:
		return v
	case string:
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
	}
	p.fail(i)
	return 0
}

func (p *fieldParser) time(i int) time.Time {
	ms := p.num(i)
	if p.err != nil {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

func (p *fieldParser) optTime(i int) time.Time {
	if v := p.vals[i]; v == nil || v == false {
		return time.Time{}
	}
	return p.time(i)
}
