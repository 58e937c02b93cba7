package dedup

import (
	"fmt"
	"net/http"
	"strings"
)

// HealthChecker is what reports its readiness: a consumer, a front end, an
// idemhttp middleware, an outbox relay.
type HealthChecker interface {
	// Health returns nil while the part can do its work.
	Health() error
}

// ReadinessHandler returns a handler for a readiness probe (/readyz) over
// checks: 200 and "ok" while every check's Health returns nil, else 503
// with one line per failing check, in the order given.
func ReadinessHandler(checks ...HealthChecker) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var failing []string
		for i, c := range checks {
			if err := c.Health(); err != nil {
				failing = append(failing, fmt.Sprintf("check %d: %v", i+1, err))
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if len(failing) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, strings.Join(failing, "\n"))
			return
		}
		fmt.Fprintln(w, "ok")
	})
}
