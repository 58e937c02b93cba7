package deduptest

import (
	"strings"
	"testing"

	"github.com/dedupkit/dedup"
	"github.com/stretchr/testify/require"
)

func testInvalidKeysRejected(t *testing.T, s dedup.Store) {
	scope := newScope(t)
	valid := key(scope, "valid")
	cases := []struct {
		name string
		key  dedup.Key
		// neighbour is a valid key a lenient store might have written
		// instead (truncated or stripped); it must stay absent.
		neighbour dedup.Key
	}{
		{"empty ID", key(scope, ""), key(scope, "valid")},
		{"ID of 256 bytes", key(scope, strings.Repeat("x", dedup.MaxIDLen+1)), key(scope, strings.Repeat("x", dedup.MaxIDLen))},
		{"ID with newline", key(scope, "evt\n1"), key(scope, "evt1")},
		{"ID with NUL", key(scope, "evt\x001"), key(scope, "evt1")},
		{"ID not UTF-8", key(scope, "evt\xff1"), key(scope, "evt1")},
		{"empty scope", key("", "evt-1"), key(scope, "evt-1")},
		{"scope of 256 bytes", key(scope+strings.Repeat("s", dedup.MaxIDLen+1-len(scope)), "evt-1"),
			key(scope+strings.Repeat("s", dedup.MaxIDLen-len(scope)), "evt-1")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			requireInvalid := func(err error, op string) {
				t.Helper()
				require.ErrorIs(t, err, dedup.ErrInvalidKey, op)
				var ke *dedup.KeyError
				require.ErrorAs(t, err, &ke, op)
				require.Equal(t, c.key, ke.Key, op)
			}
			ctx := ctxFor(t)
			_, err := s.Claim(ctx, request(c.key, "fp"))
			requireInvalid(err, "claim")
			_, err = s.ClaimBatch(ctx, []dedup.ClaimRequest{request(valid, "fp"), request(c.key, "fp")})
			requireInvalid(err, "batch, invalid last")
			_, err = s.ClaimBatch(ctx, []dedup.ClaimRequest{request(c.key, "fp"), request(valid, "fp")})
			requireInvalid(err, "batch, invalid first")

			requireNotFound(t, s, valid)
			requireNotFound(t, s, c.neighbour)
		})
	}
}

func testMaxLengthKeyAccepted(t *testing.T, s dedup.Store) {
	scope := newScope(t)
	longScope := scope + strings.Repeat("s", dedup.MaxIDLen-len(scope))
	keys := []dedup.Key{
		key(scope, strings.Repeat("e", dedup.MaxIDLen)),
		key(scope, strings.Repeat("é", dedup.MaxIDLen/2)+"e"), // 255 bytes, 128 characters
		key(longScope, "evt-1"),
		key(longScope, strings.Repeat("e", dedup.MaxIDLen)),
	}
	require.Len(t, longScope, dedup.MaxIDLen)
	require.Len(t, keys[1].EventID, dedup.MaxIDLen)
	for _, k := range keys {
		acquire(t, s, request(k, "fp"))
		require.Equal(t, k, get(t, s, k).Key)
	}

	batchKey := key(longScope, strings.Repeat("f", dedup.MaxIDLen))
	claims := claimBatch(t, s, []dedup.ClaimRequest{request(batchKey, "fp")})
	require.Equal(t, dedup.ClaimAcquired, claims[0].Status)
	require.Equal(t, batchKey, get(t, s, batchKey).Key)
}
