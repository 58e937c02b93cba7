// Package logattr builds the log attributes whose default form a person
// cannot read in every handler.
package logattr

import (
	"log/slog"
	"time"
)

// Duration returns an attribute holding d as a Go duration string
// ("35.297s"): slog.Duration writes integer nanoseconds in JSON.
func Duration(key string, d time.Duration) slog.Attr { return slog.String(key, d.String()) }
