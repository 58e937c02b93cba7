package consumeropt_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/consumeropt"
)

func TestValidateNamesTheOption(t *testing.T) {
	for want, set := range map[string]func(*consumeropt.Common){
		"x: WithInFlightDelay(-1s)":  func(c *consumeropt.Common) { c.InFlightDelay = -time.Second },
		"x: WithShutdownTimeout(0s)": func(c *consumeropt.Common) { c.ShutdownTimeout = 0 },
		"x: WithMaxOutage(-1s)":      func(c *consumeropt.Common) { c.MaxOutage = -time.Second },
		"x: WithLogger(nil)":         func(c *consumeropt.Common) { c.Logger = nil },
	} {
		c := consumeropt.Defaults(time.Second)
		set(&c)
		if err := c.Validate("x: "); !errors.Is(err, deduptype.ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want ErrConfig naming %s", err, want)
		}
	}
	c := consumeropt.Defaults(0)
	if err := c.Validate(""); err != nil {
		t.Errorf("Validate of the defaults: %v", err)
	}
}

type cfg struct{ n int }

type opt func(*cfg)

func TestBuildAppliesInOrderThenValidates(t *testing.T) {
	apply := func(o opt, c *cfg) { o(c) }
	validate := func(c *cfg) error {
		if c.n < 0 {
			return errors.New("negative")
		}
		return nil
	}
	got, err := consumeropt.Build(cfg{n: 1}, []opt{func(c *cfg) { c.n = 5 }, func(c *cfg) { c.n *= 2 }}, apply, validate)
	if err != nil || got.n != 10 {
		t.Errorf("Build: %+v, %v, want n 10", got, err)
	}
	if _, err := consumeropt.Build(cfg{}, []opt{func(c *cfg) { c.n = -1 }}, apply, validate); err == nil {
		t.Error("Build of an invalid config: no error")
	}
}
