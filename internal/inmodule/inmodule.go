// Package inmodule lends dedup's own packages the functions of the root
// package that they are built on and users do not call: the held claim
// idemhttp settles itself, and the claims in a caller's transaction that its
// transactional mode makes.
//
// Package dedup sets each variable once, in its init, before any package
// importing it runs (grpc-go's internal package works the same way). Their
// signatures name dedup's types, which this package cannot import, so a
// caller asserts the func type given in the variable's comment once, when
// its own package is initialised.
package inmodule

import (
	"context"
	"time"
)

var (
	// Hold is a func(dedup.Store, dedup.Claim, time.Duration, *slog.Logger)
	// (Held[dedup.Failure], error) that holds an acquired claim with its lease
	// by the rules a dedup.Wrapper keeps its own by.
	Hold any

	// ClaimTx is a func(*dedup.PostgresStore, context.Context, pgx.Tx,
	// dedup.ClaimRequest) (dedup.Claim, error) that claims a key inside the
	// caller's transaction, the record written as succeeded at once, and takes
	// a savepoint after an acquired claim.
	ClaimTx any

	// CompleteTx is a func(*dedup.PostgresStore, context.Context, pgx.Tx,
	// dedup.Key, string, []byte) error that stores a result on the record a
	// ClaimTx in the same transaction acquired with the owner token given.
	CompleteTx any

	// RollbackToClaimTx is a func(*dedup.PostgresStore, context.Context,
	// pgx.Tx) error that undoes what the transaction wrote after its claim,
	// keeping the claim.
	RollbackToClaimTx any
)

// Held is a claim kept while work runs, whose outcome is written fenced on
// it: F is dedup.Failure.
type Held[F any] interface {
	// Run runs fn while the lease is extended; a panic in fn comes back as
	// a *dedup.PanicError.
	Run(ctx context.Context, fn func(ctx context.Context) error) error
	// Complete records the claim as succeeded with result, kept for ttl.
	Complete(ctx context.Context, result []byte, ttl time.Duration) error
	// Fail records a failed attempt.
	Fail(ctx context.Context, f F) error
}
