package outbox

import (
	"errors"
	"fmt"
)

var (
	// ErrInvalidEvent is matched (errors.Is) by every *EventError.
	ErrInvalidEvent = errors.New("outbox: invalid event")
	// ErrDuplicateID is returned by Add when an event ID is already in the
	// table.
	ErrDuplicateID = errors.New("outbox: event ID already in the outbox")
	// ErrNotMigrated is returned when the outbox table does not exist: run
	// [Outbox.Migrate] first.
	ErrNotMigrated = errors.New("outbox: table does not exist (run Migrate)")
	// ErrNotAttempted is what a [Publisher] reports for an event it did not
	// try to send, because an earlier event of the same key in the batch
	// failed and sending this one would overtake it. The relay leaves the
	// row pending as it was, without counting an attempt.
	ErrNotAttempted = errors.New("outbox: not attempted: an earlier event of its key failed")
)

// EventError reports an event Add refused to write.
type EventError struct {
	// Index is the event's position in the Add call.
	Index  int
	ID     string
	Reason string
}

func (e *EventError) Error() string {
	return fmt.Sprintf("outbox: event %d (ID %q): %s", e.Index, e.ID, e.Reason)
}

// Unwrap makes every EventError match ErrInvalidEvent.
func (e *EventError) Unwrap() error { return ErrInvalidEvent }
