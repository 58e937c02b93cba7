// Package testenv connects tests to the real services they need (PostgreSQL,
// DynamoDB Local, an SQS endpoint). Endpoints come from environment
// variables with local defaults. When a service does not answer, the test is
// skipped, except under CI=true, where it fails: CI must never pass by
// skipping.
package testenv

import (
	"os"
	"testing"
)

// Env returns the environment variable name, or def when it is unset.
func Env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Unavailable skips t because service cannot be reached, or fails it when
// running in CI.
func Unavailable(t testing.TB, service string, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is required under CI=true but unavailable: %v (run `make services`)", service, err)
	}
	t.Skipf("%s unavailable: %v (run `make services`)", service, err)
}
