package idemhttp

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/inmodule"
)

// The root package's functions the middleware is built on, which users do
// not call (see internal/inmodule).
var (
	holdClaim = inmodule.Hold.(func(dedup.Store, dedup.Claim, time.Duration, *slog.Logger) (inmodule.Held[dedup.Failure], error))

	claimTx           = inmodule.ClaimTx.(func(*dedup.PostgresStore, context.Context, pgx.Tx, dedup.ClaimRequest) (dedup.Claim, error))
	completeTx        = inmodule.CompleteTx.(func(*dedup.PostgresStore, context.Context, pgx.Tx, dedup.Key, string, []byte) error)
	rollbackToClaimTx = inmodule.RollbackToClaimTx.(func(*dedup.PostgresStore, context.Context, pgx.Tx) error)
)
