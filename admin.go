package dedup

import (
	"context"
	"time"
)

// Admin is implemented by a store whose records an operator can list and
// repair (the operator CLI, cmd/dedup): [PostgresStore], [DynamoDBStore]
// and [MemoryStore].
type Admin interface {
	// Stuck returns up to limit live records of scope ("" for every scope)
	// that hold their key without progress, oldest first: PROCESSING past
	// their lease (their worker died or froze), or FAILED_RETRYABLE whose
	// last update is older than olderThan (their message is not coming
	// back).
	Stuck(ctx context.Context, scope string, olderThan time.Duration, limit int) ([]Record, error)
	// Forget deletes key's record if it still carries owner, the token read
	// with Get, and is not SUCCEEDED, so that the event runs afresh when it
	// is delivered again (a redrive from the dead letters, a stuck key
	// released); it reports whether it deleted it. A record claimed again
	// since it was read, or completed, is left alone.
	Forget(ctx context.Context, key Key, owner string) (bool, error)
}

// isStuck reports whether rec is stuck as [Admin.Stuck] says, at now.
func isStuck(rec *Record, olderThan time.Duration, now time.Time) bool {
	switch rec.Status {
	case StatusProcessing:
		return rec.LeaseUntil.Before(now)
	case StatusFailedRetryable:
		return rec.UpdatedAt.Before(now.Add(-olderThan))
	}
	return false
}
