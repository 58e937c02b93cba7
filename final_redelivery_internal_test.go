package dedup

import "testing"

// The release command a WARN names reads back as one word per flag value
// in a POSIX shell.
func TestReleaseCommandQuotes(t *testing.T) {
	for key, want := range map[Key]string{
		{Scope: "payments/refund", EventID: "evt_1"}:  "dedup release -scope payments/refund -id evt_1 -yes",
		{Scope: "payments", EventID: "order 7"}:       "dedup release -scope payments -id 'order 7' -yes",
		{Scope: `"odd"/scope`, EventID: "it's$HOME"}:  `dedup release -scope '"odd"/scope' -id 'it'\''s$HOME' -yes`,
		{Scope: "tenants/tenant=a", EventID: "x@y:z"}: "dedup release -scope tenants/tenant=a -id x@y:z -yes",
	} {
		if got := releaseCommand(key); got != want {
			t.Errorf("releaseCommand(%v) = %s, want %s", key, got, want)
		}
	}
}
