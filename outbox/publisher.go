package outbox

import "context"

// Publisher sends events to a broker for a [Relay]. The kafkaoutbox and
// sqsoutbox packages provide one each.
type Publisher interface {
	// Publish sends events and returns one error per event, in the same
	// order: nil once the broker acknowledged the event, an error marked
	// with dedup.Permanent when no retry can succeed (the row is failed at
	// once), ErrNotAttempted for an event left unsent so that it does not
	// overtake a failed earlier event of its key, or any other error for a
	// failure worth retrying. Events of one destination and key come in
	// publication order, and must reach the broker in that order.
	Publish(ctx context.Context, events []Event) []error
}
