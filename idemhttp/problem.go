package idemhttp

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// DefaultProblemBase is the prefix of the problem types the middleware
// answers with; [WithProblemTypeBase] sets a resolvable one instead.
const DefaultProblemBase = "urn:dedupkit:idempotency:"

// ProblemContentType is the media type of error answers (RFC 9457).
const ProblemContentType = "application/problem+json"

// Problem names one kind of error answer; the problem type is the
// configured base plus the name, stable across releases.
type Problem string

// The problems the middleware answers with; docs/http.md's table gives
// the status of each.
const (
	ProblemKeyMissing      Problem = "key-missing"
	ProblemKeyMalformed    Problem = "key-malformed"
	ProblemKeyMultiple     Problem = "key-multiple"
	ProblemKeyTooLong      Problem = "key-too-long"
	ProblemKeyLowEntropy   Problem = "key-low-entropy"
	ProblemTenant          Problem = "tenant-unknown"
	ProblemBodyTooLarge    Problem = "body-too-large"
	ProblemBodyUnreadable  Problem = "body-unreadable"
	ProblemInvalidJSON     Problem = "invalid-json"
	ProblemInFlight        Problem = "in-flight"
	ProblemKeyReused       Problem = "key-reused"
	ProblemStoredMalformed Problem = "stored-response-malformed"
	ProblemStore           Problem = "store-unavailable"
	ProblemLeaseLost       Problem = "lease-lost"
	ProblemAbandoned       Problem = "request-abandoned"
	ProblemTooLarge        Problem = "response-too-large"
	ProblemTxEnded         Problem = "handler-ended-transaction"
	ProblemTxAborted       Problem = "transaction-aborted"
	ProblemUnstorable      Problem = "response-unstorable"
)

var problemTitles = map[Problem]string{
	ProblemKeyMissing:      "Idempotency-Key is missing",
	ProblemKeyMalformed:    "Idempotency-Key is not a key",
	ProblemKeyMultiple:     "Idempotency-Key is given more than once",
	ProblemKeyTooLong:      "Idempotency-Key is too long",
	ProblemKeyLowEntropy:   "Idempotency-Key is too easy to guess",
	ProblemTenant:          "The caller of the request is unknown",
	ProblemBodyTooLarge:    "Request body is too large",
	ProblemBodyUnreadable:  "Request body could not be read",
	ProblemInvalidJSON:     "Request body is not valid JSON",
	ProblemInFlight:        "A request with this Idempotency-Key is in progress",
	ProblemKeyReused:       "Idempotency-Key was used for another request",
	ProblemStoredMalformed: "The stored response for this Idempotency-Key is unreadable",
	ProblemStore:           "Idempotency store unavailable",
	ProblemLeaseLost:       "The request's claim on its Idempotency-Key was taken over",
	ProblemAbandoned:       "The request ended before the handler answered",
	ProblemTooLarge:        "Response too large to be stored for replay",
	ProblemTxEnded:         "The handler ended the transaction the middleware commits",
	ProblemTxAborted:       "The handler's transaction failed",
	ProblemUnstorable:      "Response headers cannot be stored for replay",
}

// problemDoc is an RFC 9457 problem details object.
type problemDoc struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// writeProblem answers w with problem p. A non-zero retryAfter sets
// Retry-After, rounded up to whole seconds.
func (c *config) writeProblem(w http.ResponseWriter, p Problem, status int, detail string, retryAfter time.Duration) {
	body, _ := json.Marshal(problemDoc{Type: c.problemBase + string(p), Title: problemTitles[p], Status: status, Detail: detail}) // cannot fail
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if retryAfter > 0 {
		h.Set("Retry-After", retryAfterValue(retryAfter))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func retryAfterValue(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}
