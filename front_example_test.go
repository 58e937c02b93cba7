package dedup_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/dedupkit/dedup"
)

// A front end that answers its own caller (an RPC server, say) claims each
// key itself and decides every outcome: an acquired claim comes with an
// Attempt to run and settle; a duplicate finds the stored answer.
func ExampleNewFront() {
	f, err := dedup.NewFront(dedup.NewMemoryStore(),
		func(ctx context.Context, amount int) error {
			if amount <= 0 {
				return errors.New("nothing to refund")
			}
			return nil // the business effect
		})
	if err != nil {
		panic(err)
	}
	serve := func(ctx context.Context, id string, amount int) string {
		key := dedup.Key{Scope: "payments/refund", EventID: id}
		c, att, err := f.Claim(ctx, key, fmt.Sprint(amount))
		switch {
		case err != nil:
			return "unavailable: " + err.Error()
		case att == nil && c.Status == dedup.ClaimDuplicate:
			return "replayed: " + string(c.Record.Result)
		case att == nil:
			return "refused: " + c.Status.String()
		}
		defer att.End(ctx)
		if err := att.Run(ctx, amount); err != nil {
			_ = att.Fail(ctx, err) // left for a retry to run again
			return "failed: " + err.Error()
		}
		answer := fmt.Sprintf("refunded %d", amount)
		if err := att.Complete(ctx, []byte(answer)); err != nil {
			return "not recorded: " + err.Error()
		}
		return answer
	}
	ctx := context.Background()
	fmt.Println(serve(ctx, "r-1", 10))
	fmt.Println(serve(ctx, "r-1", 10)) // the client's retry
	fmt.Println(serve(ctx, "r-1", 99)) // the same key for another request
	// Output:
	// refunded 10
	// replayed: refunded 10
	// refused: conflict
}
