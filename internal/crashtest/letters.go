package crashtest

import "github.com/dedupkit/dedup/deduptype"

// PoisonReason reports whether reason, a dead letter's dedup-reason, is one
// a poison event's letter may carry in a crash campaign: handler-error,
// after its attempts failed, or crash-loop, when a kill cut its last
// attempt short and the next claim parked it without running it again.
func PoisonReason(reason any) bool {
	return reason == string(deduptype.ReasonHandlerError) || reason == string(deduptype.ReasonCrashLoop)
}
