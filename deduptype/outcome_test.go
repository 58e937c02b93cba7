package deduptype_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup/deduptype"
)

// A Result reads as names in JSON, and reads back.
func TestResultMarshalsOutcomeNames(t *testing.T) {
	res := deduptype.Result{Outcome: deduptype.OutcomeDeadLettered, Key: deduptype.Key{Scope: "orders", EventID: "e-1"}, Attempts: 3}
	b, err := json.Marshal(res)
	require.NoError(t, err)
	require.Contains(t, string(b), `"Outcome":"dead-lettered"`)
	var back deduptype.Result
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, res.Outcome, back.Outcome)
	require.Error(t, json.Unmarshal([]byte(`{"Outcome":"shipped"}`), &back))
}
