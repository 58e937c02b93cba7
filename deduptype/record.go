package deduptype

import "time"

// Status is the state of a record; see the state machine in the README.
type Status string

// The statuses a record moves through.
const (
	StatusProcessing      Status = "PROCESSING"
	StatusSucceeded       Status = "SUCCEEDED"
	StatusFailedRetryable Status = "FAILED_RETRYABLE"
	StatusFailedFinal     Status = "FAILED_FINAL"
)

// Valid reports whether s is one of the four statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusProcessing, StatusSucceeded, StatusFailedRetryable, StatusFailedFinal:
		return true
	}
	return false
}

// Record is what a store keeps per key.
type Record struct {
	Key         Key
	Status      Status
	Fingerprint string
	// Attempts counts handler starts for this key, crash loops included.
	Attempts int
	// Owner is the token of the claim that holds or last held the lease.
	Owner      string
	LeaseUntil time.Time
	CreatedAt  time.Time
	UpdatedAt  time.Time
	ExpiresAt  time.Time
	// LastError is the error text of the latest failed attempt.
	LastError    string
	FirstFailure time.Time
	LastFailure  time.Time
	// Result is what the handler stored on success, if anything.
	Result []byte
}
