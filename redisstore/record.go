package redisstore

import (
	"fmt"
	"strconv"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
)

// claimReply reads the claim script's flat answer (see claimSource), one
// key's part after another.
type claimReply struct {
	vals []string
	// err is the call's error, or the first part that could not be read:
	// the parts after it cannot be found.
	err error
}

// next reads the answer to req, claimed with owner.
func (r *claimReply) next(req dedup.ClaimRequest, owner string) (dedup.Claim, error) {
	if r.err != nil {
		return dedup.Claim{}, r.err
	}
	if len(r.vals) == 0 {
		r.err = fmt.Errorf("%w: claim reply too short", dedup.ErrMalformedRecord)
		return dedup.Claim{}, r.err
	}
	switch r.vals[0] {
	case "2":
		if len(r.vals) < 2 {
			break
		}
		ms, err := strconv.ParseInt(r.vals[1], 10, 64)
		if err != nil {
			break
		}
		r.vals = r.vals[2:]
		return created(req, owner, ms+req.TTL.Milliseconds()), nil
	case "-1":
		r.vals = r.vals[1:]
		return dedup.Claim{}, fmt.Errorf("%w: stored attempts, lease or expiry is not a number", dedup.ErrMalformedRecord)
	case "0", "1":
		if len(r.vals) < 2+len(recordFields) {
			break
		}
		code, aux, fields := r.vals[0], r.vals[1], r.vals[2:2+len(recordFields)]
		r.vals = r.vals[2+len(recordFields):]
		rec, err := parseRecord(req.Key, fields, code == "0" && aux == "1")
		if err != nil {
			return dedup.Claim{}, err
		}
		if code == "1" {
			return dedup.Claim{Status: dedup.ClaimAcquired, Record: rec, Previous: dedup.Status(aux)}, nil
		}
		return dedup.Claim{Status: deduptype.Classify(rec, req.Fingerprint), Record: rec}, nil
	}
	r.err = fmt.Errorf("%w: claim reply %.100q", dedup.ErrMalformedRecord, r.vals)
	return dedup.Claim{}, r.err
}

// end returns an error if the reply holds more than its parts.
func (r *claimReply) end() error {
	if r.err == nil && len(r.vals) > 0 {
		return fmt.Errorf("%w: %d values left in the claim reply", dedup.ErrMalformedRecord, len(r.vals))
	}
	return nil
}

// parseRecord reads the record fields of key, in recordFields' order with
// "" for an absent one; hasResult says whether rs is present.
func parseRecord(key dedup.Key, vals []string, hasResult bool) (dedup.Record, error) {
	if len(vals) != len(recordFields) {
		return dedup.Record{}, fmt.Errorf("%w: %d fields", dedup.ErrMalformedRecord, len(vals))
	}
	p := fieldParser{vals: vals}
	rec := dedup.Record{
		Key:          key,
		Status:       dedup.Status(vals[0]),
		Fingerprint:  vals[1],
		Attempts:     p.int(2),
		Owner:        vals[3],
		LeaseUntil:   p.time(4),
		CreatedAt:    p.time(5),
		UpdatedAt:    p.time(6),
		ExpiresAt:    p.time(7),
		LastError:    vals[8],
		FirstFailure: p.optTime(9),
		LastFailure:  p.optTime(10),
	}
	if hasResult {
		rec.Result = []byte(vals[11])
	}
	if p.err == nil && !rec.Status.Valid() {
		p.fail(0)
	}
	if p.err != nil {
		return dedup.Record{}, p.err
	}
	return rec, nil
}

// recordOf reads the record fields of key as HMGET answers them (nil for
// an absent field).
func recordOf(key dedup.Key, vals []any) (dedup.Record, error) {
	if len(vals) != len(recordFields) {
		return dedup.Record{}, fmt.Errorf("%w: %d fields", dedup.ErrMalformedRecord, len(vals))
	}
	strs := make([]string, len(vals))
	for i, v := range vals {
		strs[i], _ = text(v)
	}
	_, hasResult := text(vals[len(vals)-1])
	return parseRecord(key, strs, hasResult)
}

// text returns a field's value; ok is false when the field is absent (nil,
// or false from a script over RESP3).
func text(v any) (s string, ok bool) {
	s, ok = v.(string)
	return s, ok
}

// fieldParser reads record fields, keeping the first error.
type fieldParser struct {
	vals []string
	err  error
}

func (p *fieldParser) fail(i int) {
	if p.err == nil {
		p.err = fmt.Errorf("%w: field %s is %.100q", dedup.ErrMalformedRecord, recordFields[i], p.vals[i])
	}
}

func (p *fieldParser) int(i int) int {
	return int(p.num(i))
}

// num reads an integer field.
func (p *fieldParser) num(i int) int64 {
	n, err := strconv.ParseInt(p.vals[i], 10, 64)
	if err != nil {
		p.fail(i)
	}
	return n
}

func (p *fieldParser) time(i int) time.Time {
	ms := p.num(i)
	if p.err != nil {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

func (p *fieldParser) optTime(i int) time.Time {
	if p.vals[i] == "" {
		return time.Time{}
	}
	return p.time(i)
}
