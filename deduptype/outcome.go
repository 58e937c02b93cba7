package deduptype

import (
	"fmt"
	"time"
)

// Outcome is what the wrapper decided for one delivery.
type Outcome int

// The outcomes; each maps to exactly one transport action.
const (
	// OutcomeProcessed: the handler succeeded and it is recorded. Ack.
	OutcomeProcessed Outcome = iota + 1
	// OutcomeDuplicate: the event already succeeded or was dead-lettered
	// (then its letter exists already, and a WARN says so). Ack.
	OutcomeDuplicate
	// OutcomeInFlight: another worker holds the event's lease. Do not ack; deliver
	// again after Result.RetryAfter.
	OutcomeInFlight
	// OutcomeRetry: the handler failed and will be attempted again. Do not ack;
	// deliver again after Result.RetryAfter.
	OutcomeRetry
	// OutcomeDeadLettered: the message was parked in the dead-letter sink
	// (with ReasonRedeliveredAfterFinal: a letter moved back by hand, parked
	// again without running). Ack.
	OutcomeDeadLettered
	// OutcomeConflict: the event ID was already used for an event with another
	// fingerprint. The handler did not run; the message was dead-lettered
	// with ReasonConflict. Ack.
	OutcomeConflict
)

var outcomeNames = [...]string{"", "processed", "duplicate", "in-flight", "retry", "dead-lettered", "conflict"}

func (o Outcome) String() string { return enumName(outcomeNames[:], int(o), "Outcome") }

// MarshalText writes the outcome's name, so that a Result reads as
// "processed" rather than 1 in JSON and in logs.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText reads an outcome's name, as MarshalText writes it.
func (o *Outcome) UnmarshalText(text []byte) error {
	for i, name := range outcomeNames {
		if name == string(text) {
			*o = Outcome(i)
			return nil
		}
	}
	return fmt.Errorf("dedup: unknown outcome %q", text)
}

// enumName is the name of value v of an enumeration whose names are names,
// or "typ(v)" for a value it does not have.
func enumName(names []string, v int, typ string) string {
	if v < 0 || v >= len(names) {
		return fmt.Sprintf("%s(%d)", typ, v)
	}
	return names[v]
}

// Result is the wrapper's decision for one delivery.
type Result struct {
	Outcome Outcome
	Key     Key
	// Attempts is the event's attempt count as of this delivery.
	Attempts int
	// Reason is set for OutcomeDeadLettered and OutcomeConflict.
	Reason Reason
	// Err is the handler's error for OutcomeRetry and OutcomeDeadLettered.
	Err error
	// RetryAfter is how long to wait before the next delivery, for
	// OutcomeRetry and OutcomeInFlight.
	RetryAfter time.Duration
}

// Settled reports whether the transport may acknowledge the message: true for
// OutcomeProcessed, OutcomeDuplicate, OutcomeDeadLettered and
// OutcomeConflict.
func (r Result) Settled() bool {
	switch r.Outcome {
	case OutcomeProcessed, OutcomeDuplicate, OutcomeDeadLettered, OutcomeConflict:
		return true
	}
	return false
}

// Reason says why a message was dead-lettered.
type Reason string

// The reasons a dead letter can carry.
const (
	ReasonHandlerError   Reason = "handler-error"
	ReasonPermanent      Reason = "permanent"
	ReasonPanic          Reason = "panic"
	ReasonCrashLoop      Reason = "crash-loop"
	ReasonInvalidID      Reason = "invalid-id"
	ReasonInvalidPayload Reason = "invalid-payload"
	ReasonConflict       Reason = "fingerprint-conflict"
	// ReasonRedeliveredAfterFinal is a dead letter moved back to its origin
	// by hand (a shovel, a console) while its event's record is still
	// FAILED_FINAL: it is parked again without running, the record left as
	// it is. Release the event (dedup release, or dedup redrive, which
	// releases it) before moving its letter back.
	ReasonRedeliveredAfterFinal Reason = "redelivered-after-final"
)
