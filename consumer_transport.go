package dedup

import "time"

// Messages returns how w reads its messages: the Messages given to [Wrap]
// or [WrapTx]. A transport adapter checks it against what it consumes.
func (w *Wrapper[M]) Messages() Messages[M] { return w.msgs }

// CheckCallLease returns an error matching [ErrConfig] when lease, the
// redelivery deadline a transport adapter passes with [CallLease] (the SQS
// visibility timeout), named by name, would be the lease of w's deliveries
// (w has no [WithLease]) and is longer than w's TTL, as [WithTTL] is
// refused under the lease. An adapter calls it once it learns the deadline.
func (w *Wrapper[M]) CheckCallLease(lease time.Duration, name string) error {
	if w.cfg.lease > 0 {
		return nil // the lease is WithLease's, which Wrap checked
	}
	return w.cfg.refuseTTLUnder(lease, name)
}
