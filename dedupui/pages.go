package dedupui

import (
	"context"
	"errors"
	"html/template"
	"net/http"
	"strconv"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/outbox"
)

// indexChecker is implemented by a store whose console queries need
// indexes it may lack ([dedup.PostgresStore]).
type indexChecker interface {
	MissingConsoleIndexes(ctx context.Context) ([]string, error)
}

// missingIndexes names the indexes the store lacks for the overview, the
// charts and the lists: while any is missing, those pages run none of
// their queries, which would read the whole records table, and show a
// notice instead. A store without indexChecker lacks none.
func (c *console) missingIndexes(ctx context.Context) ([]string, error) {
	ic, ok := c.store.(indexChecker)
	if !ok {
		return nil, nil
	}
	return ic.MissingConsoleIndexes(ctx)
}

// overviewData is the overview page's.
type overviewData struct {
	Scope, OlderThan string
	Sum              dedup.Summary
	Total            dedup.ScopeCounts
	Oldest           *recordView
	Failures         chart
	Written          chart
	Missing          []string
}

func (c *console) overview(w http.ResponseWriter, r *http.Request) {
	d, err := c.overviewOf(r)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, "overview", "Overview", d)
}

// overviewOf reads the overview the request asks for; a store without
// dedup.Browser has none to read.
func (c *console) overviewOf(r *http.Request) (overviewData, error) {
	q := r.URL.Query()
	if err := known(q, "scope", "older_than"); err != nil {
		return overviewData{}, err
	}
	scope, err := scopeParam(q)
	if err != nil {
		return overviewData{}, err
	}
	older, err := olderThanParam(q)
	if err != nil || c.browse == nil {
		return overviewData{Scope: scope}, err
	}
	missing, err := c.missingIndexes(r.Context())
	if err != nil || len(missing) > 0 {
		return overviewData{Scope: scope, OlderThan: q.Get("older_than"), Missing: missing}, err
	}
	d, err := c.summary(r.Context(), scope, older)
	d.OlderThan = q.Get("older_than")
	return d, err
}

// summary reads the overview of scope.
func (c *console) summary(ctx context.Context, scope string, older time.Duration) (overviewData, error) {
	sum, err := c.browse.Summary(ctx, dedup.SummaryQuery{Scope: scope, OlderThan: older, Window: window})
	if err != nil {
		return overviewData{}, err
	}
	d := overviewData{Scope: scope, Sum: sum, Failures: failureChart(sum.Now, sum.Failures), Written: writtenChart(sum.Now, sum.Written)}
	for _, s := range sum.Scopes {
		d.Total.Processing += s.Processing
		d.Total.Retryable += s.Retryable
		d.Total.Final += s.Final
		d.Total.Stuck += s.Stuck
	}
	if sum.OldestInFlight != nil {
		v := c.recordView(*sum.OldestInFlight, sum.Now)
		d.Oldest = &v
	}
	return d, nil
}

// recordView is a record as a page shows it.
type recordView struct {
	dedup.Record
	Link        template.URL
	Now         time.Time
	ResultSize  int
	Result      string // shown with WithPayloads only
	Reason      string
	Next        string // what its next delivery will do
	Stuck       bool
	Releasable  bool // a release is offered
	Forgettable bool
}

func (c *console) recordView(rec dedup.Record, now time.Time) recordView {
	v := recordView{Record: rec, Link: keyLink(rec.Key), Now: now, ResultSize: len(rec.Result),
		Reason: dedup.FailureReason(rec.LastError), Next: nextDelivery(rec, now)}
	if c.cfg.payloads {
		v.Result = string(rec.Result)
	}
	v.Record.Result = nil
	v.Stuck = rec.Status == dedup.StatusFailedRetryable || rec.Status == dedup.StatusProcessing && !now.Before(rec.LeaseUntil)
	v.Forgettable = c.cfg.actions && c.admin != nil && rec.Status != dedup.StatusSucceeded && rec.Owner != ""
	v.Releasable = v.Forgettable && v.Stuck
	return v
}

func (c *console) record(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	err := known(q, "scope", "id")
	var key dedup.Key
	if err == nil {
		key, err = keyParam(q)
	}
	var rec dedup.Record
	if err == nil {
		rec, err = c.store.Get(r.Context(), key)
	}
	switch {
	case errors.Is(err, dedup.ErrNotFound):
		c.render(w, r, "record", key.String(), struct {
			Key     dedup.Key
			Missing bool
			Next    string
		}{key, true, nextDelivery(dedup.Record{}, time.Now())})
	case err != nil:
		c.fail(w, r, err)
	default:
		c.render(w, r, "record", key.String(), struct {
			Key     dedup.Key
			Missing bool
			Rec     recordView
		}{key, false, c.recordView(rec, time.Now())})
	}
}

// listData is a list page's.
type listData struct {
	List                     string
	Scope, Reason, OlderThan string
	Records                  []recordView
	Next                     template.URL // the next page, "" on the last
	First                    template.URL // the first page, "" on it
	Unsupported              bool
	Missing                  []string // the indexes the list needs and lacks
}

// list serves the page of one list.
func (c *console) list(which dedup.BrowseList) http.HandlerFunc {
	name, title, names := "failed", "Failed for good", []string{"scope", "reason", "after"}
	if which == dedup.ListStuck {
		name, title, names = "stuck", "Stuck records", append(names, "older_than")
	}
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		d := listData{List: name, Scope: q.Get("scope"), Reason: q.Get("reason"), OlderThan: q.Get("older_than")}
		bq, err := browseQuery(q, which, c.cfg.pageSize, names)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		if c.browse == nil {
			d.Unsupported = true
			c.renderAs(w, r, "list", name, title, d)
			return
		}
		if d.Missing, err = c.missingIndexes(r.Context()); err != nil {
			c.fail(w, r, err)
			return
		}
		if len(d.Missing) > 0 {
			c.renderAs(w, r, "list", name, title, d)
			return
		}
		recs, err := c.browse.Browse(r.Context(), bq)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		now := time.Now()
		for _, rec := range recs {
			d.Records = append(d.Records, c.recordView(rec, now))
		}
		if len(recs) == bq.Limit {
			d.Next = query(name, "scope", d.Scope, "reason", d.Reason, "older_than", d.OlderThan, "after", encodeCursor(dedup.CursorOf(recs[len(recs)-1])))
		}
		if bq.After != nil {
			d.First = query(name, "scope", d.Scope, "reason", d.Reason, "older_than", d.OlderThan)
		}
		c.renderAs(w, r, "list", name, title, d)
	}
}

// outboxData is the outbox page's.
type outboxData struct {
	Backlog       []outbox.DestinationBacklog
	Pending       int64
	OldestPending time.Duration
	Failed        []outbox.FailedEvent
	MoreFailed    bool
	Published     chart
}

func (c *console) outboxPage(w http.ResponseWriter, r *http.Request) {
	if err := known(r.URL.Query()); err != nil {
		c.fail(w, r, err)
		return
	}
	if c.cfg.outbox == nil {
		c.render(w, r, "outbox", "Outbox", nil)
		return
	}
	ctx, o, db := r.Context(), c.cfg.outbox, c.cfg.db
	var d outboxData
	var err error
	if d.Backlog, err = o.Backlog(ctx, db); err != nil {
		c.fail(w, r, err)
		return
	}
	for _, b := range d.Backlog {
		d.Pending += b.Pending
		d.OldestPending = max(d.OldestPending, b.OldestPending)
	}
	if d.Failed, err = o.Failed(ctx, db, c.cfg.pageSize+1); err != nil {
		c.fail(w, r, err)
		return
	}
	if len(d.Failed) > c.cfg.pageSize {
		d.Failed, d.MoreFailed = d.Failed[:c.cfg.pageSize], true
	}
	published, err := o.Published(ctx, db, window)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d.Published = publishedChart(time.Now(), published)
	c.render(w, r, "outbox", "Outbox", d)
}

// nextDelivery says what the next delivery of rec's event, with the same
// payload, will do at now, by the core's own rule (deduptype.MayTakeOver,
// then deduptype.Classify); a zero rec is no record.
func nextDelivery(rec dedup.Record, now time.Time) string {
	switch {
	case rec.Status == "":
		return "runs the handler as attempt 1: the key has no live record"
	case deduptype.MayTakeOver(rec, rec.Fingerprint, now):
		return "takes the record over and runs the handler as attempt " + strconv.Itoa(rec.Attempts+1) +
			" (or dead-letters the event, if that is past the consumer's maximum attempts)"
	}
	switch deduptype.Classify(rec, rec.Fingerprint) {
	case dedup.ClaimDuplicate:
		return "is a duplicate: acknowledged without running the handler (the stored result is its answer)"
	case dedup.ClaimFinal:
		return "is a delivery of an event already dead-lettered: acknowledged without running the handler"
	default:
		return "is in flight: another worker holds the lease until " + stamp(rec.LeaseUntil) + ", so it is retried later, not run twice"
	}
}
