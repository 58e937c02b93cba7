package dedupui

import (
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/dedupkit/dedup"
)

// maxForm bounds an action's posted form.
const maxForm = 64 << 10

// maxEventIDLen bounds an outbox event ID named to requeue.
const maxEventIDLen = 200

// action is one change the console makes when WithActions is given: a
// confirmation page (GET) whose form posts to the same path (POST).
type action struct {
	name, title string
	// preview reads what the action would change, from the request's
	// query, for the confirmation page.
	preview func(c *console, r *http.Request) (confirmData, error)
	// do makes the change the posted form asks for and says what it did;
	// a refusal (the record changed since) is an error of type *conflict.
	do func(c *console, r *http.Request) (done string, logged []any, err error)
}

// actions are the console's actions, each served at /<name>.
var actions = []action{
	{"release", "Release a stuck record", previewRelease, doRelease},
	{"forget", "Forget a record", previewForget, doForget},
	{"requeue", "Requeue failed outbox events", previewRequeue, doRequeue},
}

// confirmData is a confirmation page's.
type confirmData struct {
	Action, Title string
	What          []string     // what the action will do
	Fields        []hidden     // what the form posts
	Refusal       string       // why it cannot be done; no form then
	Back          template.URL // where cancelling goes
}

// hidden is a field of a confirmation form.
type hidden struct{ Name, Value string }

// conflict is an action refused because what it acts on changed since it
// was confirmed, or is not in a state the action applies to: 409.
type conflict struct{ reason string }

func (e *conflict) Error() string { return e.reason }

// confirm serves an action's confirmation page.
func (c *console) confirm(a action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !c.cfg.actions {
			c.refuse(w, http.StatusForbidden, "actions are disabled: the service mounts the console without dedupui.WithActions()")
			return
		}
		d, err := a.preview(c, r)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		d.Action, d.Title = a.name, a.title
		c.render(w, r, "confirm", a.title, d)
	}
}

// act serves an action's POST: refused (403) without WithActions or from
// another site, logged with the caller otherwise.
func (c *console) act(a action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		caller := c.cfg.caller(r)
		if caller == "" {
			caller = "unknown"
		}
		log := c.cfg.logger.With("action", a.name, "caller", caller)
		if !c.cfg.actions {
			log.WarnContext(r.Context(), "dedupui: action refused: actions are disabled")
			c.refuse(w, http.StatusForbidden, "actions are disabled: the service mounts the console without dedupui.WithActions()")
			return
		}
		if err := c.sameOrigin(r); err != nil {
			log.WarnContext(r.Context(), "dedupui: action refused: cross-site request", "err", err)
			c.refuse(w, http.StatusForbidden, err.Error())
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, badf("form: %v", err))
			return
		}
		done, logged, err := a.do(c, r)
		var cf *conflict
		var bad *badRequest
		switch {
		case errors.As(err, &bad):
			log.WarnContext(r.Context(), "dedupui: action refused: bad request", append(logged, "reason", bad.reason)...)
			c.refuse(w, http.StatusBadRequest, bad.reason)
		case errors.As(err, &cf):
			log.InfoContext(r.Context(), "dedupui: action not done", append(logged, "reason", cf.reason)...)
			c.refuse(w, http.StatusConflict, cf.reason)
		case err != nil:
			log.ErrorContext(r.Context(), "dedupui: action failed", append(logged, "err", err)...)
			c.fail(w, r, err)
		default:
			log.InfoContext(r.Context(), "dedupui: action done", append(logged, "done", done)...)
			c.render(w, r, "done", a.title, struct {
				Title, Done string
			}{a.title, done})
		}
	}
}

// sameOrigin refuses a request from another site. Go's cross-origin
// protection lets a request through that carries neither Sec-Fetch-Site
// nor Origin (not a browser's, or a very old one's), so the console also
// requires one of them: every browser it supports sends both on a POST,
// and a script outside a browser must set Origin to the console's own.
func (c *console) sameOrigin(r *http.Request) error {
	if r.Header.Get("Sec-Fetch-Site") == "" && r.Header.Get("Origin") == "" {
		return errors.New("refused: an action's request must carry Sec-Fetch-Site or Origin (a browser sends them; a script sets Origin to the console's own)")
	}
	if err := c.guard.Check(r); err != nil {
		return fmt.Errorf("refused: %w", err)
	}
	return nil
}

// readRecord reads the record an action names (scope and id in values).
func (c *console) readRecord(r *http.Request, fromForm bool) (dedup.Record, error) {
	values := r.URL.Query()
	if fromForm {
		values = r.PostForm
	}
	if c.admin == nil {
		return dedup.Record{}, badf("this store cannot forget records (it does not implement dedup.Admin)")
	}
	key, err := keyParam(values)
	if err != nil {
		return dedup.Record{}, err
	}
	rec, err := c.store.Get(r.Context(), key)
	if errors.Is(err, dedup.ErrNotFound) {
		return dedup.Record{Key: key}, &conflict{reason: key.String() + " has no live record: it is claimable already"}
	}
	return rec, err
}

// releasable says why rec cannot be released, "" when it can.
func releasable(rec dedup.Record, now time.Time) string {
	switch {
	case rec.Status == dedup.StatusSucceeded:
		return rec.Key.String() + " succeeded: releasing it would run its effect again"
	case rec.Status == dedup.StatusFailedFinal:
		return rec.Key.String() + " failed for good (dead-lettered): forget it instead, once the cause is fixed"
	case rec.Status == dedup.StatusProcessing && now.Before(rec.LeaseUntil):
		return rec.Key.String() + " is held by a worker whose lease runs until " + stamp(rec.LeaseUntil) + ": it may be alive"
	}
	return ""
}

// forgettable says why rec cannot be forgotten, "" when it can.
func forgettable(rec dedup.Record) string {
	switch {
	case rec.Status == dedup.StatusSucceeded:
		return rec.Key.String() + " succeeded: forgetting it would run its effect again"
	case rec.Owner == "":
		return rec.Key.String() + " has no owner token to fence the deletion on"
	}
	return ""
}

// recordConfirm is the confirmation of an action on rec, or its refusal.
func recordConfirm(rec dedup.Record, refusal string, what ...string) confirmData {
	d := confirmData{Back: keyLink(rec.Key), Refusal: refusal}
	if refusal == "" {
		d.What = append([]string{fmt.Sprintf("%s is %s after %d attempts (last update %s).", rec.Key, rec.Status, rec.Attempts, stamp(rec.UpdatedAt))}, what...)
		d.Fields = []hidden{{"scope", rec.Key.Scope}, {"id", rec.Key.EventID}, {"owner", rec.Owner}}
	}
	return d
}

// previewRecord is the confirmation of an action on the record the query
// names: refused with refusal's reason, if it gives one, else saying what.
func previewRecord(c *console, r *http.Request, refusal func(dedup.Record) string, what func(dedup.Record) []string) (confirmData, error) {
	rec, err := c.readRecord(r, false)
	var cf *conflict
	if errors.As(err, &cf) {
		return recordConfirm(rec, cf.reason), nil
	}
	if err != nil {
		return confirmData{}, err
	}
	return recordConfirm(rec, refusal(rec), append(what(rec), "Nothing is done if the record is claimed again or settled before you confirm.")...), nil
}

// runsAfresh is what releasing or forgetting a record does.
const runsAfresh = "Its record is deleted: the event runs afresh, as attempt 1, when it is delivered again."

func previewRelease(c *console, r *http.Request) (confirmData, error) {
	return previewRecord(c, r, func(rec dedup.Record) string { return releasable(rec, time.Now()) },
		func(dedup.Record) []string { return []string{runsAfresh} })
}

func previewForget(c *console, r *http.Request) (confirmData, error) {
	return previewRecord(c, r, forgettable, func(rec dedup.Record) []string {
		if rec.Status == dedup.StatusProcessing && time.Now().Before(rec.LeaseUntil) {
			return []string{runsAfresh, "A worker holds its lease until " + stamp(rec.LeaseUntil) + ": if it is alive, the event may run twice at once."}
		}
		return []string{runsAfresh}
	})
}

// doForgetIf forgets the posted record if it still carries the posted
// owner token and refusal finds nothing against it.
func doForgetIf(c *console, r *http.Request, refusal func(dedup.Record) string) (string, []any, error) {
	rec, err := c.readRecord(r, true)
	logged := []any{"key", rec.Key}
	if err != nil {
		return "", logged, err
	}
	logged = append(logged, "status", rec.Status, "attempts", rec.Attempts)
	owner := r.PostForm.Get("owner")
	if rec.Owner != owner {
		return "", logged, &conflict{reason: rec.Key.String() + " was claimed again since you confirmed: nothing done"}
	}
	if why := refusal(rec); why != "" {
		return "", logged, &conflict{reason: why + ": nothing done"}
	}
	done, err := c.admin.Forget(r.Context(), rec.Key, owner)
	if err != nil {
		return "", logged, err
	}
	if !done {
		return "", logged, &conflict{reason: rec.Key.String() + " changed since you confirmed (claimed again or settled): nothing done"}
	}
	return fmt.Sprintf("%s (was %s, %d attempts) is forgotten: the event runs afresh when it is delivered again", rec.Key, rec.Status, rec.Attempts), logged, nil
}

func doRelease(c *console, r *http.Request) (string, []any, error) {
	return doForgetIf(c, r, func(rec dedup.Record) string { return releasable(rec, time.Now()) })
}

func doForget(c *console, r *http.Request) (string, []any, error) {
	return doForgetIf(c, r, forgettable)
}

// eventIDs returns the outbox event IDs named by the id values.
func (c *console) eventIDs(ids []string) ([]string, error) {
	if c.cfg.outbox == nil {
		return nil, badf("no outbox is shown: the service mounts the console without dedupui.WithOutbox")
	}
	if len(ids) == 0 || len(ids) > c.cfg.pageSize {
		return nil, badf("name from 1 to %d events to requeue (id), not %d", c.cfg.pageSize, len(ids))
	}
	for _, id := range ids {
		if id == "" || len(id) > maxEventIDLen || strings.ContainsFunc(id, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			return nil, badf("event ID %q: want 1 to %d printable characters", id, maxEventIDLen)
		}
	}
	return ids, nil
}

func previewRequeue(c *console, r *http.Request) (confirmData, error) {
	if err := known(r.URL.Query(), "id"); err != nil {
		return confirmData{}, err
	}
	ids, err := c.eventIDs(r.URL.Query()["id"])
	if err != nil {
		return confirmData{}, err
	}
	states, err := c.cfg.outbox.States(r.Context(), c.cfg.db, ids...)
	if err != nil {
		return confirmData{}, err
	}
	d := confirmData{Back: "outbox"}
	for _, id := range ids {
		switch st := states[id]; st {
		case "failed":
			d.What = append(d.What, "Event "+id+" is made pending again, its attempts reset: the relay publishes it in its key's order.")
			d.Fields = append(d.Fields, hidden{"id", id})
		case "":
			d.What = append(d.What, "Event "+id+" does not exist: left alone.")
		default:
			d.What = append(d.What, "Event "+id+" is "+st+", not failed: left alone.")
		}
	}
	if len(d.Fields) == 0 {
		d.Refusal = "none of these events is failed"
	}
	return d, nil
}

func doRequeue(c *console, r *http.Request) (string, []any, error) {
	ids, err := c.eventIDs(r.PostForm["id"])
	logged := []any{"events", ids}
	if err != nil {
		return "", logged, err
	}
	n, err := c.cfg.outbox.Requeue(r.Context(), c.cfg.db, ids...)
	if err != nil {
		return "", logged, err
	}
	return fmt.Sprintf("%d of %d events requeued (the others were not failed any more)", n, len(ids)), logged, nil
}
