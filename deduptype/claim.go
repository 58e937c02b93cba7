package deduptype

import (
	"fmt"
	"time"
)

// ClaimRequest asks a store to claim one key.
type ClaimRequest struct {
	Key         Key
	Fingerprint string
	// Lease is how long the claim stays exclusive unless extended.
	Lease time.Duration
	// TTL is how long the record is retained after this write.
	TTL time.Duration
}

// ClaimStatus is a store's answer to a claim.
type ClaimStatus int

// The answers a claim can get, one per row of the state machine.
const (
	// ClaimAcquired: the caller owns the lease and should run the handler.
	// Claim.Record.Attempts is the number of this attempt.
	ClaimAcquired ClaimStatus = iota + 1
	// ClaimDuplicate: the event already succeeded with the same fingerprint.
	ClaimDuplicate
	// ClaimInFlight: another owner holds a live lease.
	ClaimInFlight
	// ClaimConflict: the key is recorded with another fingerprint.
	ClaimConflict
	// ClaimFinal: the event already failed for good (it was dead-lettered).
	ClaimFinal
)

var claimStatusNames = [...]string{"", "acquired", "duplicate", "in-flight", "conflict", "final"}

func (s ClaimStatus) String() string { return enumName(claimStatusNames[:], int(s), "ClaimStatus") }

// Claim is the result of claiming one key.
type Claim struct {
	Status ClaimStatus
	// Record is the record after the claim: the caller's own when acquired,
	// the existing one otherwise.
	Record Record
	// Previous is the status the key had before an acquired claim took it
	// over; empty when the key was absent or expired. A takeover from
	// StatusProcessing means the previous owner died mid-attempt.
	Previous Status
	// Locator is where the store wrote an acquired record, in a form only
	// the store reads (the PostgreSQL store: the row's ctid), or 0. The
	// wrapper hands it back in the claim's [Completion], so that a store
	// can find the record without a lookup by key; the owner check must
	// still guard the write, since the record may have moved since.
	Locator uint64
}

// Failure describes a failed attempt for a store's Fail.
type Failure struct {
	// Final moves the record to StatusFailedFinal instead of
	// StatusFailedRetryable.
	Final bool
	// Error is the failure's text, kept as Record.LastError.
	Error string
	// TTL is the retention from now.
	TTL time.Duration
}

// Classify answers a claim that the store could not acquire, from the record
// that blocked it: a different fingerprint is a conflict whatever the status,
// then the status decides.
func Classify(rec Record, fingerprint string) ClaimStatus {
	if rec.Fingerprint != fingerprint {
		return ClaimConflict
	}
	switch rec.Status {
	case StatusSucceeded:
		return ClaimDuplicate
	case StatusFailedFinal:
		return ClaimFinal
	default:
		return ClaimInFlight
	}
}

// MayTakeOver reports whether a claim with fingerprint takes over rec at now:
// the same payload, and a retryable failure or a processing claim whose
// lease has lapsed. A store's atomic claim must apply it in the same step as
// the write.
func MayTakeOver(rec Record, fingerprint string, now time.Time) bool {
	return rec.Fingerprint == fingerprint &&
		(rec.Status == StatusFailedRetryable || rec.Status == StatusProcessing && !now.Before(rec.LeaseUntil))
}

// ValidateBatch validates every key of a batch claim and checks that none
// is repeated, returning the first error.
func ValidateBatch(reqs []ClaimRequest) error {
	var seen map[Key]struct{}
	if len(reqs) > 1 {
		seen = make(map[Key]struct{}, len(reqs))
	}
	for i := range reqs {
		if err := reqs[i].Key.Validate(); err != nil {
			return err
		}
		if seen == nil {
			continue
		}
		if _, ok := seen[reqs[i].Key]; ok {
			return fmt.Errorf("key %s repeated in a batch claim", reqs[i].Key)
		}
		seen[reqs[i].Key] = struct{}{}
	}
	return nil
}
