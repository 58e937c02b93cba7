package natsdedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
)

// dlqRecheck is how often a missing dead-letter stream is looked for again.
const dlqRecheck = 10 * time.Second

// watchDLQ checks that a stream captures the dead-letter subjects of the
// consumer, at once and then every dlqRecheck until one does, or until bg
// is done.
func (r *runner) watchDLQ(bg context.Context) {
	defer r.dlqMissing.Forget() // Health speaks of a running consumer only
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-bg.Done():
			return
		case <-t.C:
		}
		if r.checkDLQ(bg) {
			return
		}
		t.Reset(dlqRecheck)
	}
}

// checkDLQ looks for a stream capturing the dead-letter subject of each
// subject the consumer reads, records and logs what it found, and reports
// whether it is done: every such stream found, or nothing to check.
func (r *runner) checkDLQ(bg context.Context) (done bool) {
	if r.cfg.dlqSubject == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(bg, dlqRecheck)
	defer cancel()
	origins, err := r.originSubjects(ctx)
	if err != nil {
		r.log.Debug("natsdedup: the dead-letter stream not checked; trying again", slog.Any("error", err))
		return false
	}
	var missing []string
	for _, o := range origins {
		subject := r.cfg.dlqSubject(o)
		if subject == "" {
			continue
		}
		_, err := r.cfg.js.StreamNameBySubject(ctx, subject)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			missing = append(missing, subject)
		case err != nil:
			r.log.Debug("natsdedup: the dead-letter stream not checked; trying again", slog.Any("error", err))
			return false
		}
	}
	if len(missing) == 0 {
		r.dlqMissing.Fixed(r.log, "natsdedup: a stream captures the dead-letter subjects now")
		return true
	}
	err = fmt.Errorf("%w: natsdedup: no stream captures the dead-letter subject %s of stream %s: "+
		"create a stream with subjects %q (or name the Sink's subjects with WithDeadLetterSubjects); "+
		"a poison message is retried meanwhile", dedup.ErrConfig, strings.Join(missing, ", "), r.info.Stream, missing)
	r.dlqMissing.Found(r.log, err)
	return false
}

// originSubjects returns the subjects the consumer reads: its filters, or
// else its stream's subjects.
func (r *runner) originSubjects(ctx context.Context) ([]string, error) {
	cc := r.info.Config
	switch {
	case len(cc.FilterSubjects) > 0:
		return cc.FilterSubjects, nil
	case cc.FilterSubject != "":
		return []string{cc.FilterSubject}, nil
	}
	s, err := r.cfg.js.Stream(ctx, r.info.Stream)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", r.info.Stream, err)
	}
	return s.CachedInfo().Config.Subjects, nil
}
