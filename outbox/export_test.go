package outbox

// PassStatements returns the settings a relay pass runs under and its claim
// and read statements, for the tests that read their plans.
func PassStatements(o *Outbox) (settings, claim, read string, namespace int32) {
	return planSettings, o.sql.claim, o.sql.read, o.relays
}
